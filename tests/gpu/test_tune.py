import itertools
import json

import pytest

from vkgraph import cli
from vkgraph.config import load_config
from vkgraph.tools.bench import load_model
from vkgraph.tools.tune import (DEFAULT, Confirmation, Point, beats, best_within, config_text, dominates,
                                faster_beyond_noise, pareto, pooled, rank_p_value)


def test_pareto_and_budget():
    pts = [Point({"a": i}, load_s=t, peak_nbytes=m) for i, (t, m) in enumerate([(1.0, 100), (2.0, 50), (1.5, 120), (3.0, 40)])]
    front = pareto(pts)
    assert [p.prepack["a"] for p in front] == [0, 1, 3]  # (1.5, 120) is beaten by (1.0, 100)
    assert best_within(pts, 60).prepack["a"] == 1 and best_within(pts, 10) is None


def test_pareto_front_is_noise_aware():
    default = Point(dict(DEFAULT), load_s=1.0, peak_nbytes=30, times=[0.9, 1.0, 1.1], peaks=[30, 30, 30])
    overlapping = Point({"a": 1}, load_s=0.95, peak_nbytes=30, times=[0.85, 0.95, 1.05], peaks=[30, 30, 30])
    faster = Point({"a": 2}, load_s=0.7, peak_nbytes=31, times=[0.6, 0.7, 0.8], peaks=[29, 31, 32])
    smaller = Point({"a": 3}, load_s=1.05, peak_nbytes=16, times=[0.95, 1.05, 1.2], peaks=[16, 16, 17])
    bigger = Point({"a": 4}, load_s=0.7, peak_nbytes=96, times=[0.6, 0.7, 0.8], peaks=[96, 96, 96])
    assert not dominates(overlapping, default) and not dominates(default, overlapping)  # within the noise
    assert dominates(faster, default)  # every run faster, peaks overlap
    assert dominates(smaller, default)  # less memory beyond the noise, times overlap
    assert not dominates(bigger, default) and not dominates(default, bigger)  # a trade-off
    assert pareto([default, overlapping, bigger]) == [bigger, overlapping, default]
    assert default not in pareto([default, faster, smaller])


def test_rank_p_value_matches_counting_every_split():
    rng = __import__("random").Random(7)
    for n, m in [(1, 1), (2, 3), (3, 3), (4, 5), (5, 5)]:
        a, b = [rng.random() for _ in range(n)], [rng.random() + 0.2 for _ in range(m)]
        pooled_runs = a + b
        u = sum(x < y for x in a for y in b)
        splits = list(itertools.combinations(range(n + m), n))
        at_least = sum(sum(pooled_runs[i] < pooled_runs[j] for i in s for j in range(n + m) if j not in s) >= u
                       for s in splits)
        assert rank_p_value(a, b) == pytest.approx(at_least / len(splits))


def test_more_runs_tell_overlapping_configs_apart():
    fast, slow = [1.0, 1.1, 1.2, 1.3, 1.6], [1.4, 1.5, 1.7, 1.8, 1.9]  # spreads overlap
    assert faster_beyond_noise(fast, slow) and not faster_beyond_noise(slow, fast)
    assert not faster_beyond_noise([1.0, 1.6], [1.4, 1.5])  # 2 runs each: every run must be faster
    assert faster_beyond_noise([1.0, 1.1], [1.2, 1.3]) and faster_beyond_noise([1.0], [1.2])
    assert not faster_beyond_noise([1.0, 1.5, 1.2], [1.4, 1.6, 1.7])  # 3 and 3 overlapping: p = 0.1
    default = Point(dict(DEFAULT), load_s=1.2, times=fast, peaks=[30] * 5)
    smaller = Point({"a": 1}, load_s=1.7, times=slow, peaks=[16] * 5)
    # smaller but slower beyond the noise: a trade-off, both on the front
    assert not dominates(smaller, default) and not dominates(default, smaller)
    assert pareto([default, smaller]) == [default, smaller]


def test_pooled_adds_the_confirmation_runs():
    a = Point({"a": 1}, load_s=1.0, peak_nbytes=10, times=[1.0], peaks=[10], rss_peaks=[5], first_times=[2.0])
    b = Point({"a": 2}, load_s=2.0, peak_nbytes=20, times=[2.0], peaks=[20], rss_peaks=[6], first_times=[3.0])
    again = Point({"a": 2}, load_s=1.5, times=[1.4, 1.6, 1.8], peaks=[20] * 3, rss_peaks=[6] * 3, first_times=[3.0] * 3)
    out = pooled([a, b], Confirmation([again], again, again))
    assert [p.times for p in out] == [[1.0], [2.0, 1.4, 1.6, 1.8]] and out[1].load_s == pytest.approx(1.7)
    assert out[1].runs == 4 and len(out[1].first_times) == 4 and b.times == [2.0]  # the sweep's point is untouched


def test_beats_needs_a_margin_beyond_the_noise():
    default = Point(dict(DEFAULT), load_s=1.0, times=[0.9, 1.0, 1.1])
    assert beats(Point({}, load_s=0.7, times=[0.6, 0.7, 0.8]), default)
    assert not beats(Point({}, load_s=0.7, times=[0.6, 0.7, 0.95]), default)  # one run inside default's spread
    assert not beats(Point({}, load_s=0.7), default)  # never measured


@pytest.mark.slow
def test_tune_tiny_model_writes_a_valid_config(device, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    out, png = tmp_path / "tuned.toml", tmp_path / "tune.png"
    assert cli.main(["tune", "--model", "synthetic:4", "--quick", "--confirm", "2", "--out", str(out),
                     "--plot", str(png), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    best = result["points"][result["best"]]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    conf = result["confirmation"]
    assert conf[-1]["threshold_nbytes"] == DEFAULT["threshold_nbytes"] and all(c["runs"] == 2 for c in conf)
    cfg = load_config(out, env={})
    assert cfg.prepack.threshold_nbytes == best["threshold_nbytes"]
    assert cfg.prepack.reduce_peak_memory == best["reduce_peak_memory"]
    assert "Tuned by `vkgraph tune --model synthetic:4` on " in out.read_text()
    assert f", device {device.name}." in out.read_text().splitlines()[0]
    assert result["pareto"] and result["default"] is not None
    assert all(p["first_load_s"] > 0 and p["min_s"] <= p["load_s"] <= p["max_s"] for p in result["points"])
    # the confirmed configs' runs are pooled with the sweep's: 1 + 2
    confirmed = [{k: c[k] for k in DEFAULT} for c in conf]
    assert all(p["runs"] == (3 if {k: p[k] for k in DEFAULT} in confirmed else 1) for p in result["points"])
    # each point's peak device memory is what a load with its config measures here, in this process
    for p in result["points"]:
        prepack = {k: p[k] for k in DEFAULT}
        path = tmp_path / "point.toml"
        path.write_text(config_text(prepack))
        mode = "reduce-peak" if prepack["reduce_peak_memory"] else "staged"
        report = load_model("synthetic:4", mode, str(path), verify=False).report
        assert report.peak_device_nbytes == p["peak_nbytes"], prepack
