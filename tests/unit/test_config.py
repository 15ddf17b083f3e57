import re
from pathlib import Path

import pytest

from vkgraph.config import DEFAULTS, GraphConfig, load_config, parse_nbytes, schema
from vkgraph.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MiB = 1 << 20


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_every_shipped_config_loads():
    files = sorted(CONFIGS.glob("*.toml"))
    assert {f.name for f in files} >= {"default.toml", "low-memory.toml", "fast-load.toml", "fast-prefill.toml"}
    for f in files:
        cfg = load_config(f, env={})
        assert cfg.source == str(f)
    low = load_config(CONFIGS / "low-memory.toml", env={})
    assert low.prepack.reduce_peak_memory is True and low.prepack.threshold_nbytes == 4 * MiB
    assert load_config(CONFIGS / "fast-prefill.toml", env={}).graph.int8_activations is True
    assert GraphConfig().graph.int8_activations is False
    assert load_config(CONFIGS / "fast-load.toml", env={}).graph.fp32_linear_layout == "rows"
    assert GraphConfig().graph.fp32_linear_layout == "blocks"


def test_default_toml_documents_every_key_with_its_default():
    text = (CONFIGS / "default.toml").read_text()
    cfg = load_config(CONFIGS / "default.toml", env={})
    for dotted in schema():
        key = dotted.split(".")[1]
        assert re.search(rf"^{key} = ", text, re.M), dotted
        assert cfg.effective(dotted) == GraphConfig().effective(dotted), dotted


def test_zero_means_default():
    cfg = GraphConfig()
    assert cfg.prepack.threshold_nbytes == 0
    assert cfg.effective("prepack.threshold_nbytes") == DEFAULTS["prepack.threshold_nbytes"] == 10 * MiB
    assert cfg.effective("execute.threshold_node_count") == 128
    assert cfg.replace(prepack__threshold_nbytes=5).effective("prepack.threshold_nbytes") == 5
    assert cfg.effective("prepack.reduce_peak_memory") is False


@pytest.mark.parametrize(
    "text,bytes_",
    [("1024", 1024), ('"10 MiB"', 10 * MiB), ('"512KiB"', 512 << 10), ('"1.5 GiB"', 3 << 29), ('"10 MB"', 10**7)],
)
def test_sizes(tmp_path, text, bytes_):
    cfg = load_config(write(tmp_path, f"[prepack]\nthreshold_nbytes = {text}\n"), env={})
    assert cfg.prepack.threshold_nbytes == bytes_


@pytest.mark.parametrize(
    "text,key,reason",
    [
        ("[prepack]\nthreshold_bytes = 1\n", "prepack.threshold_bytes", "unknown key; prepack keys are: threshold_nbytes"),
        ("[prepak]\nthreshold_nbytes = 1\n", "prepak", "unknown group; groups are: prepack, execute, graph, device, cache"),
        ("[prepack]\nthreshold_nbytes = -1\n", "prepack.threshold_nbytes", "must be >= 0, got -1"),
        ("[prepack]\nthreshold_nbytes = true\n", "prepack.threshold_nbytes", "must be a byte count"),
        ('[prepack]\nthreshold_nbytes = "lots"\n', "prepack.threshold_nbytes", "cannot read 'lots' as a size"),
        ("[prepack]\nthreshold_nodes = 1.5\n", "prepack.threshold_nodes", "must be an integer, got 1.5"),
        ("[execute]\nmax_cmds = -3\n", "execute.max_cmds", "must be >= 0, got -3"),
        ('[prepack]\nreduce_peak_memory = "sometimes"\n', "prepack.reduce_peak_memory", 'must be true, false or "auto"'),
        ("[prepack]\npopulate_destinations = 1\n", "prepack.populate_destinations", 'must be true, false or "auto"'),
        ('[device]\nvalidation = "yes"\n', "device.validation", "must be true or false"),
        ("[device]\nprefer = 3\n", "device.prefer", "must be a string, got 3"),
        ('[graph]\nstorage = "texture2d"\n', "graph.storage", "must be one of '', 'buffer', 'texture3d'"),
        ("prepack = 3\n", "prepack", "must be a table"),
        ("[prepack\n", "(syntax)", ""),
    ],
)
def test_bad_files_name_file_key_and_reason(tmp_path, text, key, reason):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    e = err.value
    assert (e.file, e.key) == (str(path), key)
    assert reason in e.reason
    assert str(e).startswith(f"{path}: {key}: ")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.toml: \(file\): no such config file"):
        load_config(tmp_path / "nope.toml", env={})


def test_precedence_arguments_over_env_over_file(tmp_path):
    path = write(tmp_path, '[prepack]\nthreshold_nbytes = "1 MiB"\nthreshold_nodes = 7\n[device]\nprefer = "file"\n')
    env = {"VKGRAPH_PREPACK_THRESHOLD_NBYTES": "2 MiB", "VKGRAPH_DEVICE": "llvmpipe", "VKGRAPH_VALIDATION": "1"}
    cfg = load_config(path, env=env)
    assert cfg.prepack.threshold_nbytes == 2 * MiB  # env beats file
    assert cfg.prepack.threshold_nodes == 7  # file beats default
    assert cfg.device.prefer == "llvmpipe" and cfg.device.validation is True
    cfg = load_config(path, env=env, overrides={"prepack.threshold_nbytes": 3 * MiB})
    assert cfg.prepack.threshold_nbytes == 3 * MiB  # argument beats env
    # The full variable name wins over the short alias.
    cfg = load_config(None, env={"VKGRAPH_DEVICE": "a", "VKGRAPH_DEVICE_PREFER": "b"})
    assert cfg.device.prefer == "b"


def test_bad_env_names_the_variable():
    with pytest.raises(ConfigError) as err:
        load_config(None, env={"VKGRAPH_EXECUTE_MAX_CMDS": "many"})
    assert (err.value.file, err.value.key) == ("environment", "VKGRAPH_EXECUTE_MAX_CMDS")
    cfg = load_config(None, env={"VKGRAPH_EXECUTE_MAX_CMDS": "4", "VKGRAPH_PREPACK_REDUCE_PEAK_MEMORY": "auto"})
    assert cfg.execute.max_cmds == 4 and cfg.prepack.reduce_peak_memory == "auto"


def test_replace_validates():
    cfg = GraphConfig().replace(**{"prepack.reduce_peak_memory": "auto"})
    assert cfg.prepack.reduce_peak_memory == "auto"
    with pytest.raises(ConfigError, match="argument: prepack.staging_ring_nbytes: must be >= 0"):
        cfg.replace(prepack__staging_ring_nbytes=-5)
    with pytest.raises(AttributeError):
        cfg.prepack.threshold_nbytes = 3  # frozen


def test_parse_nbytes():
    assert parse_nbytes("0") == 0 and parse_nbytes(" 2 gib ") == 2 << 30
    for bad in (-1, "1 TiB", 1.5, None):
        with pytest.raises(ValueError):
            parse_nbytes(bad)
