import json

import pytest

from vkgraph import cli
from vkgraph.bench import CONFIG_DIR


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("mode", ["legacy", "staged", "reduce-peak"])
def test_bench_load_json(device, cache_dir, capsys, mode):
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", mode, "--json",
                     "--config", str(CONFIG_DIR / "low-memory.toml")]) == 0
    out = json.loads(capsys.readouterr().out)
    keys = ["model", "mode", "total_constant_nbytes", "load_s", "cpu_encode_s", "fence_wait_s", "gpu_s", "submits",
            "peak_staging_nbytes", "peak_rss_delta_nbytes", "packing_dispatches", "overlap", "output_ok"]
    assert list(out) == keys
    assert out["mode"] == mode and out["output_ok"] is True and out["model"] == "synthetic:4"
    assert out["submits"] == 1 if mode == "legacy" else out["submits"] > 1
    assert out["packing_dispatches"] > 0 and out["load_s"] > 0


def test_run_prints_the_report_and_writes_a_trace(device, cache_dir, capsys, tmp_path):
    trace = tmp_path / "trace.json"
    assert cli.main(["run", "--model", "synthetic:4", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "submits" in out and "peak staging" in out and "-> OK" in out
    assert json.loads(trace.read_text())["traceEvents"]


def test_unknown_model_and_bad_config_are_clear(device, cache_dir, capsys, tmp_path):
    assert cli.main(["run", "--model", "gpt5"]) == 1
    assert "unknown model 'gpt5'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[prepack]\nthreshold_nbytes = -4\n")
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--config", str(bad)]) == 1
    assert f"{bad}: prepack.threshold_nbytes: must be >= 0, got -4" in capsys.readouterr().err
