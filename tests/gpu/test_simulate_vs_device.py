"""The simulator and run_prepack() agree exactly on what is decided, not measured: submits,
bytes per submit and staging allocated; and on the measured high-water mark of staging in flight
wherever the plan decides it (one batch in flight at a time)."""

import dataclasses

import pytest

from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph
from vkgraph.models import synthetic
from vkgraph.models.safetensors import SafetensorsFile
from vkgraph.tools.simulate import load_profile, model_nodes, simulate


@pytest.mark.parametrize("mode,ring", [("legacy", 1 << 20), ("staged", 1 << 20), ("reduce-peak", 1 << 20),
                                       ("staged", 128 << 10)])  # the last: every batch larger than the ring
def test_plan_and_peak_staging_match_the_device(device, compiler, tmp_path, mode, ring):
    spec = synthetic.SyntheticSpec.for_size(8)
    cfg = GraphConfig().replace(prepack__threshold_nbytes=256 << 10, prepack__initial_threshold_nbytes=64 << 10,
                                prepack__staging_ring_nbytes=ring, prepack__reduce_peak_memory=(mode == "reduce-peak"),
                                prepack__host_packing="never")  # staging and packing shaders on every device
    with SafetensorsFile(synthetic.weights_path(spec, tmp_path)) as st, ComputeGraph(cfg, device=device, compiler=compiler) as g:
        synthetic.build(g, st, spec)
        report = g.prepack() if mode == "legacy" else g.run_prepack()
    # Whether identity weights are written in place (no staging) follows the device's memory.
    profile = dataclasses.replace(load_profile("lavapipe"), host_visible_device_local=device.host_visible_device_local,
                                  staging_alignment=g.staging_alignment)
    sim = simulate(model_nodes("synthetic:8"), cfg, profile, mode)
    assert sim.submits == report.submits
    assert [b.staging_nbytes for b in sim.batches] == report.bytes_per_submit
    assert sim.staging_allocated_nbytes == report.staging_allocated_nbytes
    regions = [-(-n // g.staging_alignment) * g.staging_alignment for n in report.bytes_per_submit if n]
    if mode == "staged" and ring > max(regions):  # how many batches overlap depends on the speeds
        for peak in (sim.peak_staging_nbytes, report.peak_staging_nbytes):
            assert max(regions) <= peak <= ring
    else:  # legacy: one batch; reduce-peak waits for each; batches larger than the ring take turns
        assert sim.peak_staging_nbytes == report.peak_staging_nbytes == max(regions)
    assert sim.packing_dispatches == report.packing_dispatches


def test_staged_batches_one_after_another(device, compiler, tmp_path, monkeypatch):
    """calibrate.contention's loads with nothing overlapping (prepack.Staged.wait_each): the
    staged plan, each batch waited for before the next is encoded, so one batch's staging is in
    flight at a time; the default overlaps them again."""
    from vkgraph.graph import prepack

    waited = []
    wait = prepack.PrepackRun.wait
    monkeypatch.setattr(prepack.PrepackRun, "wait", lambda run, b: (waited.append(b), wait(run, b))[1])
    spec = synthetic.SyntheticSpec.for_size(8)
    cfg = GraphConfig().replace(prepack__threshold_nbytes=256 << 10, prepack__initial_threshold_nbytes=64 << 10,
                                prepack__staging_ring_nbytes=1 << 20, prepack__reduce_peak_memory=False,
                                prepack__host_packing="never")
    reports = {}
    for alone in (True, False):
        prepack.Staged.wait_each = alone
        try:
            with SafetensorsFile(synthetic.weights_path(spec, tmp_path)) as st, \
                    ComputeGraph(cfg, device=device, compiler=compiler) as g:
                synthetic.build(g, st, spec)
                reports[alone] = g.run_prepack()
        finally:
            prepack.Staged.wait_each = False
        if alone:  # each batch waited for, in order, before the next one; staged loads wait for none
            assert waited == list(range(reports[True].submits))
            waited.clear()
    alone, staged = reports[True], reports[False]
    assert waited == [] and alone.mode == staged.mode == "staged" and alone.bytes_per_submit == staged.bytes_per_submit
    regions = [-(-n // g.staging_alignment) * g.staging_alignment for n in alone.bytes_per_submit if n]
    assert len(regions) > 2 and alone.peak_staging_nbytes == max(regions) <= staged.peak_staging_nbytes
    assert prepack.Staged.wait_each is False


def test_packing_dispatches_follow_the_devices_windows(device, compiler):
    """MiniLM's weights in the windows the device's bindings and texel buffers take (SwiftShader's
    texel buffers hold 1 MiB): the simulator counts the dispatches run_prepack records."""
    from vkgraph.models.registry import open_model

    profile = dataclasses.replace(load_profile("lavapipe"), renderer=device.renderer, cpu_renderer=device.is_cpu,
                                  host_visible_device_local=device.host_visible_device_local,
                                  max_texel_buffer_elements=device.limits["maxTexelBufferElements"])
    cfg = GraphConfig().replace(prepack__host_packing="never")  # the packing shaders, in windows where needed
    with open_model("minilm") as m, ComputeGraph(cfg, device=device, compiler=compiler) as g:
        m.build(g)
        report = g.run_prepack()
    nodes = model_nodes("minilm", profile)
    assert simulate(nodes, cfg, dataclasses.replace(profile, staging_alignment=g.staging_alignment),
                    "staged").packing_dispatches == report.packing_dispatches
    if device.limits["maxTexelBufferElements"] * 16 < max(n.src_nbytes for n in nodes):
        assert report.packing_dispatches > sum(n.shader for n in nodes)  # some weights took several windows


def test_calibration_gives_sane_positive_parameters(device, tmp_path):
    import math

    from vkgraph.tools.calibrate import calibrate, profile_toml

    profile, raw = calibrate(device, size_mb=2)
    values = [profile.copy_gbps, profile.fresh_copy_gbps, profile.encode_node_s,
              profile.dispatch_s, *profile.pack_gbps.values()]
    assert all(math.isfinite(v) and v > 0 for v in values), raw
    assert math.isfinite(profile.source_read_gbps) and profile.source_read_gbps >= 0  # 0: no measurable cost
    assert profile.submit_s > 0 and profile.fence_latency_s >= 0  # a command buffer's memory, recording, submit
    assert profile.encode_node_s < 0.1 and profile.copy_gbps < 1000  # seconds per node, GB/s: plausible magnitudes
    assert 0 < profile.cpu_rate <= 1 and 0 < profile.gpu_rate <= 1, raw
    assert math.isfinite(profile.fresh_device_gbps) and profile.fresh_device_gbps >= 0  # 0: first loads pay nothing
    if device.is_cpu:  # a staged load populates what its packing shaders write, small ones huge pages (scheduler.py)
        assert all(math.isfinite(v) and v > 0 for v in (profile.populate_gbps, profile.populate_huge_gbps)), raw
        assert set(profile.populated_pack_gbps) == {"default", "linear_4x4"}, raw  # and packs into that memory
        assert all(math.isfinite(v) and v > 0 for v in profile.populated_pack_gbps.values()), raw
        assert math.isfinite(profile.settled_populate_share) and profile.settled_populate_share >= 0, raw
        assert math.isfinite(profile.fresh_direct_gbps) and profile.fresh_direct_gbps >= 0, raw  # weights it writes
    else:
        assert profile.fresh_direct_gbps is None, raw
        assert profile.populate_gbps is None and profile.populate_huge_gbps is None, raw
        assert profile.settled_populate_share is None, raw
        assert profile.populated_pack_gbps == {}, raw
    e = profile.execute
    assert e.host_s >= 0 and e.dispatch_s > 0 and e.stream_gbps > 0, raw
    assert set(e.weight_gbps) == {"fp32", "q4_0", "q4_1", "q8_0"} and all(v > 0 for v in e.weight_gbps.values()), raw
    assert e.linear_dispatch_s >= e.dispatch_s and all(v > 0 for v in e.gmacs.values()), raw
    assert 0 < e.attention_key_s < 1e-5, raw  # seconds per query row and key: attention costs something
    assert 0 <= e.first_linear_s < 1 and 0 <= e.first_dispatch_s < 1, raw  # a first dispatch: under a second
    assert 0 <= e.wave_share <= 1 and 0 < e.step_key_s < 1e-5, raw
    assert 0 < e.gated_step < 10 and 0 < e.gated_tiles < 10, raw  # two weights cost about twice one's rows
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(profile))
    again = load_profile(path)  # the written profile loads and simulates
    assert again.pack_gbps == pytest.approx(profile.pack_gbps, rel=1e-3)
    assert again.populated_pack_gbps == pytest.approx(profile.populated_pack_gbps, rel=1e-3)
    assert (again.cpu_rate, again.gpu_rate) == pytest.approx((profile.cpu_rate, profile.gpu_rate), rel=1e-2)
    assert again.execute.weight_gbps == pytest.approx(e.weight_gbps, rel=1e-3) and again.renderer == device.renderer
    assert again.execute.attention_key_s == pytest.approx(e.attention_key_s, rel=1e-3)
    assert again.execute.step_key_s == pytest.approx(e.step_key_s, rel=1e-3)
    assert [getattr(again.execute, k) for k in ("wave_share", "gated_step", "gated_tiles")] == pytest.approx(
        [getattr(e, k) for k in ("wave_share", "gated_step", "gated_tiles")], rel=1e-2, abs=1e-3)
    for rate in ("populate_gbps", "populate_huge_gbps", "settled_populate_share", "fresh_direct_gbps"):
        v = getattr(profile, rate)
        assert getattr(again, rate) == (None if v is None else pytest.approx(v, rel=1e-3))
    assert (again.execute.first_linear_s, again.execute.first_dispatch_s) == pytest.approx(
        (e.first_linear_s, e.first_dispatch_s), rel=1e-3, abs=1e-8)
    assert simulate(model_nodes("synthetic:8"), GraphConfig(), again).load_s > 0


@pytest.mark.slow
def test_validate_compares_settled_loads(device, tmp_path, monkeypatch):
    from vkgraph.tools.calibrate import VALIDATE_MODES, validate

    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    # the lavapipe profile's policy on any device: its packing shaders (packers.HOST_PACKING_RENDERERS)
    monkeypatch.setenv("VKGRAPH_PREPACK_HOST_PACKING", "never")
    with pytest.raises(ValueError, match="--loads must be > 2"):
        validate("lavapipe", ("synthetic:4",), loads=2)
    rows = validate("lavapipe", ("synthetic:4",), loads=3)
    assert [r["mode"] for r in rows] == list(VALIDATE_MODES)
    for r in rows:
        assert r["measured_min_s"] <= r["measured_load_s"] <= r["measured_max_s"] and r["second_load_s"] > 0
        assert r["staging_error"] == pytest.approx(r["simulated_peak_staging"] / r["measured_peak_staging"] - 1)
        if r["mode"] != "staged":  # one batch in flight at a time: decided by the plan
            assert r["staging_error"] == 0
        assert r["load_error"] == pytest.approx(r["simulated_load_s"] / r["measured_load_s"] - 1)
        assert r["fresh_error"] == pytest.approx(r["simulated_fresh_s"] / r["fresh_load_s"] - 1)
        assert r["simulated_fresh_s"] >= r["simulated_load_s"]
        assert "simulated_fresh_now" not in r
    # --rates-now: the profile's load rates measured again before every round (here: fixed ones,
    # a third of the profile's, then a sixth), each round's loads simulated with its own rates
    from vkgraph.tools import calibrate
    from vkgraph.tools.bench import config_for

    slow = [{"copy_gbps": 1.0, "fresh_copy_gbps": 0.5, "pack_gbps": {"default": 0.4, "identity": 1.0}},
            {"copy_gbps": 0.5, "fresh_copy_gbps": 0.25, "pack_gbps": {"default": 0.2, "identity": 0.5}}]
    measured = iter(slow)
    monkeypatch.setattr(calibrate, "load_rates", lambda dev, dispatch_s: next(measured))
    rows = validate("lavapipe", ("synthetic:4",), repeat=2, loads=3, rates_now=True)
    assert next(measured, None) is None  # once a round
    now = [dataclasses.replace(load_profile("lavapipe"), **rates) for rates in slow]
    nodes = model_nodes("synthetic:4", now[0])

    def paired(sims: list[float], lo: float, hi: float) -> tuple[float, float]:
        """The median of the rounds' errors, the two rounds' loads (lo, hi) in either order."""
        return ((sims[0] / lo + sims[1] / hi) / 2 - 1, (sims[0] / hi + sims[1] / lo) / 2 - 1)

    for r in rows:
        cfg = config_for(r["mode"], None)
        first = [simulate(nodes, cfg, p, r["mode"], first_load=True).load_s for p in now]
        assert r["simulated_fresh_now"] == pytest.approx(sum(first) / 2) and min(first) > r["simulated_fresh_s"]
        assert any(r["fresh_error_now"] == pytest.approx(e) for e in paired(first, r["fresh_min_s"], r["fresh_max_s"]))
        settled = [simulate(nodes, cfg, p, r["mode"]).load_s for p in now]  # a settled load a round (loads=3)
        assert r["simulated_load_now"] == pytest.approx(sum(settled) / 2)
        assert any(r["load_error_now"] == pytest.approx(e)
                   for e in paired(settled, r["measured_min_s"], r["measured_max_s"]))
