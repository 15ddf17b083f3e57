# `make demo` and `make test` install what they need first: system packages (apt-get, as root),
# a virtual environment in .venv and the package in editable mode.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test deps install clean

demo: install
	$(BIN)/vkgraph info
	$(BIN)/vkgraph run

# The packages installed above include lavapipe, so a missing device is a failure, not a skip.
test: install
	VKGRAPH_REQUIRE_DEVICE=1 $(BIN)/python -m pytest

deps:
	@scripts/install-system-deps.sh $(PYTHON)

install: deps $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
