"""benchmarks/policy_ab.py's variants: constants of vkgraph.ops, literal values, clear errors."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from policy_ab import main, parse_variant  # noqa: E402


def test_variants_name_ops_constants_with_literal_values():
    assert parse_variant("default") == {}
    assert parse_variant("LINEAR_TILE_ROWS_CPU=8; CPU_KERNELS=False;LINEAR_TILE_ROWS={'swiftshader': 2}") == {
        "LINEAR_TILE_ROWS_CPU": 8, "CPU_KERNELS": False, "LINEAR_TILE_ROWS": {"swiftshader": 2}}


@pytest.mark.parametrize("text, says", [
    ("NO_SUCH_CONSTANT=1", "'NO_SUCH_CONSTANT=1' is not NAME=VALUE of a constant of vkgraph.ops"),
    ("linear=1", "'linear=1' is not NAME=VALUE"),  # a function, not a constant
    ("CPU_LOCAL", "'CPU_LOCAL' is not NAME=VALUE"),
    ("CPU_LOCAL=eight", "CPU_LOCAL: 'eight' is not a Python literal"),
])
def test_a_bad_variant_says_what_is_wrong(text, says):
    with pytest.raises(SystemExit) as exc:
        parse_variant(text)
    assert says in str(exc.value)


def test_a_bad_config_file_is_named_before_any_session(tmp_path, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text('[graph]\nint8_activations = "yes"\n')
    for path, says in ((bad, "graph.int8_activations: must be true or false"),
                       (tmp_path / "none.toml", "no such config")):
        monkeypatch.setattr(sys, "argv", ["policy_ab.py", "--config", str(path), "default"])
        with pytest.raises(SystemExit) as exc:
            main()
        assert str(exc.value).startswith(f"policy_ab: {path}: ") and says in str(exc.value)
