import json

import pytest

from vkgraph import cli
from vkgraph.config import load_config
from vkgraph.tune import Point, best_within, pareto


def test_pareto_and_budget():
    pts = [Point({"a": i}, load_s=t, peak_nbytes=m) for i, (t, m) in enumerate([(1.0, 100), (2.0, 50), (1.5, 120), (3.0, 40)])]
    front = pareto(pts)
    assert [p.prepack["a"] for p in front] == [0, 1, 3]  # (1.5, 120) is beaten by (1.0, 100)
    assert best_within(pts, 60).prepack["a"] == 1 and best_within(pts, 10) is None


@pytest.mark.slow
def test_tune_tiny_model_writes_a_valid_config(device, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "tuned.toml"
    assert cli.main(["tune", "--model", "synthetic:4", "--quick", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    best = result["points"][result["best"]]
    cfg = load_config(out, env={})
    assert cfg.prepack.threshold_nbytes == best["threshold_nbytes"]
    assert cfg.prepack.reduce_peak_memory == best["reduce_peak_memory"]
    assert "Tuned by `vkgraph tune --model synthetic:4`" in out.read_text()
    assert result["pareto"] and result["default"] is not None
