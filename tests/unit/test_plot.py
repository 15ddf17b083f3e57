import pytest

from vkgraph.config import GraphConfig
from vkgraph.tools.plot import Span, plot_timeline, staging_in_use
from vkgraph.tools.simulate import load_profile, model_nodes, simulate


def test_staging_in_use_steps():
    spans = [Span(0, 0.0, 1.0, 1.0, 3.0, 100), Span(1, 1.0, 2.0, 3.0, 4.0, 50)]
    assert staging_in_use(spans) == [(0.0, 0), (0.0, 100), (1.0, 150), (3.0, 50), (4.0, 0)]


def test_simulated_timeline_png(tmp_path):
    pytest.importorskip("matplotlib")
    sim = simulate(model_nodes("synthetic:16"), GraphConfig(), load_profile("lavapipe"))
    spans = [Span(b.index, b.cpu_start_s, b.cpu_end_s, b.gpu_start_s, b.gpu_end_s, b.staging_nbytes) for b in sim.batches]
    path = tmp_path / "t.png"
    plot_timeline(spans, [(0.01, 0.02)], "synthetic:16", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    steps = staging_in_use(spans)
    assert max(b for _, b in steps) <= sim.peak_staging_nbytes * 2 and steps[-1][1] == 0
