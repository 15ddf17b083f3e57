import dataclasses

import pytest

from vkgraph.config import GraphConfig
from vkgraph.errors import ConfigError
from vkgraph.ggml import FORMATS
from vkgraph.graph.allocation import BLOCK_NBYTES
from vkgraph.graph.scheduler import HUGE_PAGES_UP_TO_NBYTES, plan_prepack
from vkgraph.tools.simulate import SimNode, load_profile, model_nodes, simulate

KiB = 1024
PROFILE = load_profile("lavapipe")


def nodes_of(sizes, packer="linear_4x4"):
    return [SimNode(f"n{i}", packer, s, s) for i, s in enumerate(sizes)]


SIZES = [100, 5000, 7000, 300, 12000, 1, 1, 9000, 4000, 64, 20000, 2]


@pytest.mark.parametrize("cfg,expected", [
    # 10 MiB and 64 nodes: nothing to cut
    (GraphConfig(), [range(12)]),
    # 2 KiB until the first cut, 8 KiB after: cut before node i when the bytes already in the
    # command buffer exceed the threshold (never before the last node), worked out by hand:
    # 5100 > 2048 before node 2; 19300 > 8192 before 5; 9002 before 8; the last batch keeps node 11
    (GraphConfig().replace(prepack__threshold_nbytes=8 * KiB, prepack__initial_threshold_nbytes=2 * KiB),
     [range(0, 2), range(2, 5), range(5, 8), range(8, 12)]),
    # nodes: more than 1 before the first cut, more than 3 after
    (GraphConfig().replace(prepack__threshold_nodes=3, prepack__initial_threshold_nodes=1),
     [range(0, 2), range(2, 6), range(6, 10), range(10, 12)]),
])
def test_batches_follow_the_threshold_rule(cfg, expected):
    """The simulated batches against the rule worked out by hand (the device's batches are
    compared in tests/gpu/test_simulate_vs_device.py)."""
    sim = simulate(nodes_of(SIZES), cfg, PROFILE, "staged")
    assert [b.nodes for b in sim.batches] == [len(r) for r in expected]
    assert [b.staging_nbytes for b in sim.batches] == [sum(SIZES[i] for i in r) for r in expected]


def test_modes_and_memory():
    nodes = model_nodes("synthetic:64")
    cfg = GraphConfig()
    legacy, staged, reduce = (simulate(nodes, cfg, PROFILE, m) for m in ("legacy", "staged", "reduce-peak"))
    assert legacy.submits == 1 and staged.submits == reduce.submits > 1
    staged_bytes = sum(n.src_nbytes for n in nodes if n.shader)
    assert legacy.peak_staging_nbytes >= staged_bytes  # all staging at once
    assert staged.peak_staging_nbytes <= cfg.effective("prepack.staging_ring_nbytes")
    assert reduce.peak_staging_nbytes <= staged.peak_staging_nbytes
    assert staged.load_s < legacy.load_s
    for s in (legacy, staged, reduce):
        assert s.load_s >= max(s.cpu_encode_s, max(b.gpu_end_s for b in s.batches))
        assert all(b.gpu_start_s >= b.cpu_end_s for b in s.batches)  # the GPU starts after the submit


def test_batches_larger_than_the_ring_take_turns():
    """Each batch larger than the ring gets staging of its own, allocated only once the previous
    one's buffer is free: peak staging is the ring plus the largest batch, however fast the CPU."""
    cfg = GraphConfig().replace(prepack__threshold_nbytes=64 * KiB, prepack__initial_threshold_nbytes=64 * KiB,
                                prepack__staging_ring_nbytes=32 * KiB)
    sim = simulate(nodes_of([48 * KiB] * 6), cfg, PROFILE, "staged")
    assert sim.submits == 3 and all(b.staging_nbytes == 96 * KiB for b in sim.batches)
    assert sim.staging_allocated_nbytes == 32 * KiB + 96 * KiB and sim.peak_staging_nbytes == 96 * KiB
    for prev, b in zip(sim.batches, sim.batches[1:]):
        assert b.cpu_start_s >= prev.gpu_end_s + PROFILE.fence_latency_s


def test_faster_device_loads_faster():
    nodes = model_nodes("synthetic:64")
    fast = dataclasses.replace(PROFILE, pack_gbps={k: v * 10 for k, v in PROFILE.pack_gbps.items()})
    assert simulate(nodes, GraphConfig(), fast).load_s < simulate(nodes, GraphConfig(), PROFILE).load_s


def test_shape_only_llama_specs():
    """Published configs go through the real llama builder on a recording graph."""
    nodes = model_nodes("llama-3.2-1b:q4_0")
    # embedding, 16 layers of 7 weights (q, k and v stacked as one), output norm, and the key mask
    # and RoPE table the builder packs
    assert len(nodes) == 1 + 16 * 7 + 1 + 2 and {"kv_mask", "rope_table.64.500000"} <= {n.name for n in nodes}
    params = sum(n.src_nbytes for n in nodes if n.packer == "q4_0") / 18 * 32
    assert 0.9e9 < params < 1.1e9  # the 1B model's matrices besides the embedding
    eight = {n.name: n for n in model_nodes("llama-3-8b:q4_0")}
    assert eight["blk.0.attn_norm.weight"].src_nbytes == 4096 * 4  # norms stay fp32
    assert eight["output.weight"].packer == "q4_0"  # Llama 3 8B does not tie its output to the embedding
    with pytest.raises(ValueError, match="unknown model 'gpt-9'"):
        model_nodes("gpt-9")
    with pytest.raises(ValueError, match="unknown model 'llama-3-8b:fp16'"):
        model_nodes("llama-3-8b:fp16")  # vkgraph has no fp16 weights: nothing it could load


def test_bad_profiles(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('[device]\nname = "x"\nhost_visible_device_local = true\n[cpu]\ncopy_gbps = 1\n')
    with pytest.raises(ConfigError, match="p.toml: .*missing"):
        load_profile(p)
    import re

    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    text = re.sub(r"(?m)^copy_gbps = .*$", "copy_gbps = -1", text)
    p.write_text(text)
    with pytest.raises(ConfigError, match="cpu.copy_gbps: must be > 0"):
        load_profile(p)
    with pytest.raises(ConfigError, match="no such profile"):
        load_profile(tmp_path / "none.toml")


def test_shipped_profile_is_the_one_of_the_device_name(tmp_path, monkeypatch):
    """A device gets the shipped profile measured on a device of its exact name (lavapipe at 256
    or 512 bits), else its renderer's; a renderer none is shipped for gets None."""
    from vkgraph.tools import simulate as sim

    def write(stem, renderer, name):
        (tmp_path / f"{stem}.toml").write_text(f'[device]\nname = "{name}"\nrenderer = "{renderer}"\n')

    write("lavapipe", "lavapipe", "llvmpipe (LLVM 15.0.6, 512 bits)")
    write("lavapipe-256", "lavapipe", "llvmpipe (LLVM 15.0.6, 256 bits)")
    write("other", "swiftshader", "llvmpipe (LLVM 15.0.6, 128 bits)")  # the name, but another renderer
    (tmp_path / "broken.toml").write_text("[device\n")
    monkeypatch.setattr(sim, "PROFILE_DIR", tmp_path)
    assert sim.shipped_profile("lavapipe", "llvmpipe (LLVM 15.0.6, 256 bits)") == tmp_path / "lavapipe-256.toml"
    assert sim.shipped_profile("lavapipe", "llvmpipe (LLVM 15.0.6, 512 bits)") == tmp_path / "lavapipe.toml"
    assert sim.shipped_profile("lavapipe", "llvmpipe (LLVM 15.0.6, 128 bits)") == tmp_path / "lavapipe.toml"
    assert sim.shipped_profile("lavapipe") == tmp_path / "lavapipe.toml"
    assert sim.shipped_profile("nvidia", "NVIDIA H100") is None and sim.shipped_profile("", "x") is None


def test_shipped_profile_of_several_of_a_name_is_the_one_of_this_processor(tmp_path, monkeypatch):
    """Of shipped profiles of the same device name, a host gets the one measured on its processor
    ([device] host_cpu), else the one that records none; the processor is read from
    /proc/cpuinfo's first block."""
    from vkgraph.tools import simulate as sim

    name = "llvmpipe (LLVM 15.0.6, 512 bits)"

    def write(stem, cpu=None):
        line = f'host_cpu = "{cpu}"\n' if cpu else ""
        (tmp_path / f"{stem}.toml").write_text(f'[device]\nname = "{name}"\nrenderer = "lavapipe"\n{line}')

    write("a-zen4", "AuthenticAMD family 25 model 17")
    write("lavapipe")
    write("b-zen5", "AuthenticAMD family 26 model 2")
    monkeypatch.setattr(sim, "PROFILE_DIR", tmp_path)
    assert sim.shipped_profile("lavapipe", name, "AuthenticAMD family 25 model 17") == tmp_path / "a-zen4.toml"
    assert sim.shipped_profile("lavapipe", name, "AuthenticAMD family 26 model 2") == tmp_path / "b-zen5.toml"
    for other in ("GenuineIntel family 6 model 143", "", None):
        assert sim.shipped_profile("lavapipe", name, other) == tmp_path / "lavapipe.toml"
    (tmp_path / "lavapipe.toml").unlink()  # none without a processor: one of another processor
    assert sim.shipped_profile("lavapipe", name, "GenuineIntel family 6 model 143") == tmp_path / "a-zen4.toml"

    from vkgraph.runtime.instance import host_cpu

    info = tmp_path / "cpuinfo"  # the first processor's block is the one read
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\n"
                    "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n")
    assert host_cpu(str(info)) == "AuthenticAMD family 25 model 17"
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\n")  # no vendor, family, model (Arm)
    assert host_cpu(str(info)) == "" and host_cpu(str(tmp_path / "none")) == ""


def test_every_shipped_profile_loads_and_names_its_device():
    """profiles/*.toml all load, and no two name the same device of the same renderer and the same
    host processor (which one a device got would then depend on the files' order)."""
    from vkgraph.tools.simulate import PROFILE_DIR

    seen = {}
    for p in sorted(PROFILE_DIR.glob("*.toml")):
        prof = load_profile(p)
        key = (prof.renderer, prof.name, prof.host_cpu)
        assert key not in seen, f"{p.name} and {seen.get(key)} both describe {key}"
        seen[key] = p.name
    for bits in (256, 512):
        assert ("lavapipe", f"llvmpipe (LLVM 15.0.6, {bits} bits)", "") in seen


def test_contention_slows_only_overlapping_work():
    """Shared processors (rates < 1) slow a staged load, where CPU encoding and GPU packing
    overlap, and leave a legacy load, where they take turns, as it was; a reduce-peak load takes
    turns too, but for the weights the CPU writes after each submit (PrepackPlan.writes_after_submit)."""
    nodes = model_nodes("synthetic:64")
    packed_only = nodes_of([1 << 20] * 8)
    cfg = GraphConfig().replace(prepack__threshold_nbytes=2 << 20, prepack__initial_threshold_nbytes=2 << 20)
    alone = dataclasses.replace(PROFILE, cpu_rate=1.0, gpu_rate=1.0)
    shared = dataclasses.replace(PROFILE, cpu_rate=0.5, gpu_rate=0.6)
    for mode, load in (("legacy", nodes), ("reduce-peak", packed_only)):
        a, s = simulate(load, cfg, alone, mode), simulate(load, cfg, shared, mode)
        assert s.submits > (mode == "reduce-peak")
        assert s.load_s == pytest.approx(a.load_s) and s.cpu_encode_s == pytest.approx(a.cpu_encode_s)
    a, s = simulate(nodes, cfg, alone, "reduce-peak"), simulate(nodes, cfg, shared, "reduce-peak")
    assert s.load_s > a.load_s
    a, s = simulate(nodes, cfg, alone, "staged"), simulate(nodes, cfg, shared, "staged")
    assert s.load_s > a.load_s and s.cpu_encode_s > a.cpu_encode_s and s.gpu_s > a.gpu_s
    # rates adding up to at least 1: never slower than the CPU and the GPU taking turns
    assert s.load_s <= a.cpu_encode_s + a.gpu_s + s.submits * PROFILE.fence_latency_s
    assert all(b.gpu_start_s >= b.cpu_end_s for b in s.batches)


def test_staged_timeline_without_contention_is_max_of_cpu_and_gpu():
    """With separate hardware, one batch's GPU work starts at its submit and batches queue."""
    nodes = nodes_of([4096] * 6)
    cfg = GraphConfig().replace(prepack__threshold_nodes=1, prepack__initial_threshold_nodes=1)
    p = dataclasses.replace(PROFILE, cpu_rate=1.0, gpu_rate=1.0)
    s = simulate(nodes, cfg, p, "staged")
    for prev, b in zip(s.batches, s.batches[1:]):
        assert b.gpu_start_s == pytest.approx(max(b.cpu_end_s, prev.gpu_end_s))
        assert b.cpu_start_s == pytest.approx(prev.cpu_end_s)  # the ring never fills here


def test_bad_contention_rate(tmp_path):
    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    p = tmp_path / "p.toml"
    p.write_text(text.split("[contention]")[0] + "[contention]\ncpu_rate = 1.5\n")
    with pytest.raises(ConfigError, match="contention.cpu_rate: must be in"):
        load_profile(p)


def test_a_host_forms_cost_a_weight_round_trips_and_is_checked(tmp_path):
    from vkgraph.tools.calibrate import profile_toml

    p = tmp_path / "p.toml"
    p.write_text(profile_toml(dataclasses.replace(PROFILE, host_pack_node_s={"linear_4x4": 184e-6})))
    assert load_profile(p).host_pack_node_s == {"linear_4x4": pytest.approx(184e-6)}
    p.write_text(profile_toml(dataclasses.replace(PROFILE, host_pack_node_s={"linear_4x4": -1e-6})))
    with pytest.raises(ConfigError, match="cpu.host_pack_node_us.linear_4x4: must be >= 0"):
        load_profile(p)


def test_host_packing_moves_packing_to_the_cpu_on_cpu_renderers_only():
    """prepack.host_packing = "cpu-renderer" (graph.packers.packs_on_host): on a CPU renderer the
    CPU writes host-form weights straight into device memory: no staging, no dispatch, each
    node's bytes at the profile's host-pack bandwidth; elsewhere nothing changes. The default,
    "auto", does so on SwiftShader (packers.HOST_PACKING_RENDERERS) and on no other device."""
    nodes = nodes_of([4096] * 5) + nodes_of([64], packer="conv2d_c4")  # conv2d_c4: no host form
    cfg = GraphConfig().replace(prepack__host_packing="cpu-renderer")
    # separate hardware: the writes after the submit overlap the conv2d packing (no contention to price)
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, host_pack_gbps={"linear_4x4": 2.0}, source_read_gbps=0.0,
                              cpu_rate=1.0, gpu_rate=1.0)
    host = simulate(nodes, cfg, cpu, "staged")
    assert host.packing_dispatches == 1 and sum(b.staging_nbytes for b in host.batches) == 64
    assert host.cpu_encode_s == pytest.approx(5 * cpu.direct_node_s + cpu.encode_node_s + 5 * 4096 / 2e9
                                              + 64 / (cpu.staging_touch_gbps(True) * 1e9)
                                              + host.submits * cpu.submit_s, rel=1e-6)
    per_weight = simulate(nodes, cfg, dataclasses.replace(cpu, host_pack_node_s={"linear_4x4": 1e-3}), "staged")
    assert per_weight.cpu_encode_s == pytest.approx(host.cpu_encode_s + 5e-3)  # [cpu.host_pack_node_us], each weight
    ss = dataclasses.replace(cpu, renderer="swiftshader")
    auto = simulate(nodes, GraphConfig(), ss, "staged")  # the default, "auto": HOST_PACKING_RENDERERS
    assert (auto.packing_dispatches, auto.cpu_encode_s) == (host.packing_dispatches, pytest.approx(host.cpu_encode_s))
    never = GraphConfig().replace(prepack__host_packing="never")
    for p, c in ((dataclasses.replace(cpu, cpu_renderer=False), cfg), (dataclasses.replace(ss, cpu_renderer=False), cfg),
                 (dataclasses.replace(cpu, renderer="lavapipe"), GraphConfig()), (ss, never)):
        shaders = simulate(nodes, c, p, "staged")  # a GPU (twice), lavapipe by default, SwiftShader with "never"
        assert shaders.packing_dispatches == 6 and sum(b.staging_nbytes for b in shaders.batches) == 5 * 4096 + 64


def test_a_first_load_writing_more_than_the_huge_page_limit_touches_4k_pages():
    """PrepackPlan.direct_huge_pages: the weights the CPU writes itself get huge pages up to
    HUGE_PAGES_UP_TO_NBYTES in a load; beyond it a first load on a CPU renderer writes them no
    faster than its first touch of 4 KiB pages (``fresh_copy_gbps``). Settled loads, and smaller
    first loads, at the host-form rate."""
    most = HUGE_PAGES_UP_TO_NBYTES
    assert [plan_prepack("staged", [64], 16, GraphConfig(), n).direct_huge_pages
            for n in (0, most, most + 1)] == [True, True, False]
    cfg = GraphConfig().replace(prepack__host_packing="cpu-renderer")
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, host_pack_gbps={"linear_4x4": 8.0}, fresh_copy_gbps=2.0,
                              fresh_device_gbps=0.0, source_read_gbps=0.0)

    def encode_s(total, first_load):
        return simulate(nodes_of([total // 4] * 4), cfg, cpu, "staged", first_load=first_load).cpu_encode_s

    small, large = most // 2, 2 * most
    assert encode_s(small, True) == pytest.approx(encode_s(small, False))
    assert encode_s(large, True) - encode_s(large, False) == pytest.approx(large / 2e9 - large / 8e9)
    # with the profile's host_pack_4k_gbps: a host form into 4 KiB pages at that rate in every
    # load; a copy (identity) as before; weights on huge pages at the host-form rate
    cpu = dataclasses.replace(cpu, host_pack_4k_gbps=4.0, host_pack_gbps={"linear_4x4": 8.0, "identity": 8.0})
    for first_load in (True, False):
        assert encode_s(large, first_load) - encode_s(small, first_load) == pytest.approx(large / 4e9 - small / 8e9)
    identity = [simulate(nodes_of([large // 4] * 4, "identity"), cfg, cpu, "staged", first_load=True).cpu_encode_s,
                simulate(nodes_of([large // 4] * 4, "identity"), cfg, cpu, "staged").cpu_encode_s]
    assert identity[0] - identity[1] == pytest.approx(large / 2e9 - large / 8e9)


def test_a_staging_ring_is_first_touched_as_huge_pages_on_cpu_renderers():
    """A staging ring (staged, reduce-peak) is advised as huge pages on CPU renderers
    (graph/prepack.py): its first touch is priced at the rate into a fresh huge-page block;
    legacy's staging, and staging elsewhere, at the rate into fresh pages."""
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, fresh_copy_gbps=2.0, direct_copy_gbps=6.0)
    assert [plan_prepack(m, [64], 16, GraphConfig()).staging_huge_pages for m in ("staged", "reduce-peak", "legacy")] \
        == [True, True, False]
    assert cpu.staging_touch_gbps(True) == 6.0 and cpu.staging_touch_gbps(False) == 2.0
    assert dataclasses.replace(cpu, cpu_renderer=False).staging_touch_gbps(True) == 2.0
    assert dataclasses.replace(cpu, direct_copy_gbps=None).staging_touch_gbps(True) == 2.0
    nodes = nodes_of([1 << 20])
    for mode, gbps in (("staged", 6.0), ("legacy", 2.0)):
        faster = simulate(nodes, GraphConfig(), cpu, mode)
        slower = simulate(nodes, GraphConfig(), dataclasses.replace(cpu, cpu_renderer=False), mode)
        assert slower.cpu_encode_s - faster.cpu_encode_s == pytest.approx((1 << 20) * (1 / 2e9 - 1 / (gbps * 1e9)))


def test_direct_writes_cost_their_own_per_node_encode():
    """A node the CPU writes straight into device memory costs ``encode_direct_us`` besides its
    bytes (no staging, no recording), the others ``encode_node_us``; a profile without the key
    prices both alike."""
    nodes = nodes_of([4096] * 4, packer="identity") + nodes_of([4096] * 2)
    prof = dataclasses.replace(PROFILE, host_visible_device_local=True, source_read_gbps=0.0, encode_direct_s=None)
    split = dataclasses.replace(prof, encode_direct_s=prof.encode_node_s / 4)
    same, cheap = (simulate(nodes, GraphConfig(), p, "legacy") for p in (prof, split))
    assert same.cpu_encode_s - cheap.cpu_encode_s == pytest.approx(4 * 0.75 * prof.encode_node_s, rel=1e-6)
    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    assert load_profile("lavapipe").encode_direct_s == pytest.approx(
        float(text.split("encode_direct_us = ")[1].split()[0]) * 1e-6)


def test_each_packing_window_and_each_command_buffer_costs_the_cpu():
    """A weight packed in row windows (a device whose texel buffers hold less than it:
    PrepackNode.windows) records a dispatch per window, each with its descriptor set and texel
    view: ``encode_node_us`` per window. Each command buffer costs ``submit_us`` besides its
    nodes, so a reduce-peak load of the same weights in more command buffers costs the CPU more."""
    # staging's first touch as fast as a copy: fewer bytes in a batch touch less of it
    prof = dataclasses.replace(PROFILE, source_read_gbps=0.0, cpu_rate=1.0, gpu_rate=1.0,
                               fresh_copy_gbps=PROFILE.copy_gbps, direct_copy_gbps=PROFILE.copy_gbps)
    one, three = (simulate([SimNode("w", "linear_4x4", 4096, 4096, dispatches=d)], GraphConfig(), prof, "legacy")
                  for d in (1, 3))
    assert three.cpu_encode_s - one.cpu_encode_s == pytest.approx(2 * prof.encode_node_s, rel=1e-6)
    assert three.packing_dispatches == 3
    nodes = nodes_of([4096] * 12)
    cfg = GraphConfig().replace(prepack__reduce_peak_memory=True)
    few, many = (simulate(nodes, cfg.replace(prepack__threshold_nodes=n, prepack__initial_threshold_nodes=n), prof,
                          "reduce-peak") for n in (12, 1))
    assert (few.submits, many.submits) == (1, 6)
    assert many.cpu_encode_s - few.cpu_encode_s == pytest.approx(5 * prof.submit_s, rel=1e-6)
    assert many.load_s - few.load_s == pytest.approx(5 * (prof.submit_s + prof.fence_latency_s), rel=1e-6)


def test_first_load_adds_the_first_touch_of_device_memory():
    """A fresh process's first load: each node also pays its packed bytes at
    ``fresh_device_gbps`` (0: free, the settled load), on the GPU for a node it packs, on the CPU
    for one the CPU writes straight into device memory; a legacy load's GPU is one batch, so the
    difference is exactly that."""
    nodes = nodes_of([4096] * 3 + [8192])
    fresh = dataclasses.replace(PROFILE, fresh_device_gbps=0.5)
    settled = simulate(nodes, GraphConfig(), fresh, "legacy")
    first = simulate(nodes, GraphConfig(), fresh, "legacy", first_load=True)
    assert first.gpu_s - settled.gpu_s == pytest.approx((3 * 4096 + 8192) / 0.5e9)
    assert first.load_s - settled.load_s == pytest.approx(first.gpu_s - settled.gpu_s)
    direct = nodes_of([1 << 20] * 2, packer="q4_1")  # GGML blocks: the CPU copies them, at one rate here
    host = dataclasses.replace(fresh, host_visible_device_local=True, cpu_renderer=True, direct_copy_gbps=5.0,
                               settled_direct_gbps=5.0)
    settled = simulate(direct, GraphConfig(), host, "legacy")
    first = simulate(direct, GraphConfig(), host, "legacy", first_load=True)
    assert first.gpu_s == settled.gpu_s == 0
    assert first.cpu_encode_s - settled.cpu_encode_s == pytest.approx(2 * (1 << 20) / 0.5e9)
    # at a rate of their own where the profile has one (0: free, as SwiftShader's), the GPU's nodes still at theirs
    for rate, extra in ((2.0, 2 * (1 << 20) / 2e9), (0.0, 0.0)):
        own = dataclasses.replace(host, fresh_direct_gbps=rate)
        assert (simulate(direct, GraphConfig(), own, "legacy", first_load=True).cpu_encode_s
                - simulate(direct, GraphConfig(), own, "legacy").cpu_encode_s) == pytest.approx(extra, abs=1e-12)
        assert (simulate(nodes, GraphConfig(), own, "legacy", first_load=True).gpu_s
                - simulate(nodes, GraphConfig(), own, "legacy").gpu_s) == pytest.approx((3 * 4096 + 8192) / 0.5e9)
    # a GPU's (a CPU renderer's staged first loads populate: the next test)
    free = dataclasses.replace(PROFILE, fresh_device_gbps=0.0, cpu_renderer=False)
    assert simulate(nodes, GraphConfig(), free, "staged", first_load=True).load_s == pytest.approx(
        simulate(nodes, GraphConfig(), free, "staged").load_s)


def test_a_staged_first_load_on_a_cpu_renderer_populates_the_packing_shaders_memory_on_the_cpu():
    """Staged loads populate the memory packing shaders write as each batch gets it
    (scheduler.PrepackPlan.populates_destinations; on CPU renderers): on a first load the CPU
    pays those bytes at ``populate_gbps`` (fresh_copy_gbps where the profile has none) and the
    GPU packs without first touches; legacy and reduce-peak, a GPU, a texture, settled loads as
    before."""
    assert [plan_prepack(m, [64], 16, GraphConfig()).populates_destinations
            for m in ("staged", "reduce-peak", "legacy")] == [True, False, False]
    nodes = nodes_of([4096] * 3 + [8192])
    packed = 3 * 4096 + 8192
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, fresh_device_gbps=0.5, populate_gbps=0.25,
                              cpu_rate=1.0, gpu_rate=1.0)
    settled = simulate(nodes, GraphConfig(), cpu, "staged")
    first = simulate(nodes, GraphConfig(), cpu, "staged", first_load=True)
    assert first.gpu_s == pytest.approx(settled.gpu_s)
    assert first.cpu_encode_s - settled.cpu_encode_s == pytest.approx(packed / 0.25e9)
    unmeasured = simulate(nodes, GraphConfig(), dataclasses.replace(cpu, populate_gbps=None), "staged", first_load=True)
    assert unmeasured.cpu_encode_s - settled.cpu_encode_s == pytest.approx(packed / (cpu.fresh_copy_gbps * 1e9))
    for p, mode, ns in ((cpu, "legacy", nodes), (cpu, "reduce-peak", nodes),
                        (dataclasses.replace(cpu, cpu_renderer=False), "staged", nodes),
                        (cpu, "staged", [dataclasses.replace(n, texture=True) for n in nodes])):
        before, after = simulate(ns, GraphConfig(), p, mode), simulate(ns, GraphConfig(), p, mode, first_load=True)
        assert after.gpu_s - before.gpu_s == pytest.approx(packed / 0.5e9)
        assert after.cpu_encode_s == pytest.approx(before.cpu_encode_s)


def test_a_device_that_does_not_populate_is_priced_with_the_shaders_first_stores():
    """scheduler.populates: a staged first load on a device of UNPOPULATED_DEVICES (the profile's
    renderer, SIMD width and host_cpu), or with ``prepack.populate_destinations = false``, leaves
    the pages to the packing shaders: the CPU pays nothing for them, the GPU packs at
    ``pack_gbps`` and faults them in at ``fresh_device_gbps``, as in a reduce-peak load."""
    from vkgraph.graph.scheduler import UNPOPULATED_DEVICES

    renderer, lanes, host = next(iter(UNPOPULATED_DEVICES))
    nodes = nodes_of([4096] * 3 + [8192])
    packed = 3 * 4096 + 8192
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, fresh_device_gbps=0.5, populate_gbps=0.25, cpu_rate=1.0,
                              gpu_rate=1.0, pack_gbps={**PROFILE.pack_gbps, "linear_4x4": 1.0},
                              populated_pack_gbps={"default": 4.0}, renderer=renderer, simd_width=lanes)
    settled = simulate(nodes, GraphConfig(), cpu, "staged")
    listed = dataclasses.replace(cpu, host_cpu=host)
    told = GraphConfig().replace(prepack__populate_destinations=False)
    for p, cfg in ((listed, GraphConfig()), (cpu, told)):
        first = simulate(nodes, cfg, p, "staged", first_load=True)
        assert first.cpu_encode_s == pytest.approx(simulate(nodes, cfg, p, "staged").cpu_encode_s)
        assert first.gpu_s - settled.gpu_s == pytest.approx(packed / 1e9 - packed / 4e9 + packed / 0.5e9)
    # the same device told to populate, and another host's, populate as before
    for p, cfg in ((listed, GraphConfig().replace(prepack__populate_destinations=True)), (cpu, GraphConfig())):
        first = simulate(nodes, cfg, p, "staged", first_load=True)
        assert first.cpu_encode_s - settled.cpu_encode_s == pytest.approx(packed / 0.25e9)
        assert first.gpu_s == pytest.approx(settled.gpu_s)


def test_packing_into_populated_memory_is_priced_at_its_own_rate():
    """``[gpu.populated_pack_gbps]``: a packing shader stores into pages made before wherever the
    plan populates them (staged loads on CPU renderers, first and later loads alike), while
    ``[gpu.pack_gbps]`` was measured with the shader's first stores faulting them in: legacy and
    reduce-peak loads, a GPU, textures, and profiles without the populated rates keep it."""
    nodes = nodes_of([4096] * 3 + [8192])
    packed = 3 * 4096 + 8192
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, fresh_device_gbps=0.0, dispatch_s=0.0, cpu_rate=1.0,
                              gpu_rate=1.0, pack_gbps={**PROFILE.pack_gbps, "linear_4x4": 1.0},
                              populated_pack_gbps={"default": 2.0, "linear_4x4": 4.0})
    for first_load in (False, True):
        assert simulate(nodes, GraphConfig(), cpu, "staged", first_load=first_load).gpu_s == pytest.approx(packed / 4e9)
    conv = [dataclasses.replace(n, packer="conv2d_c4") for n in nodes]  # no rate of its own: the default
    assert simulate(conv, GraphConfig(), cpu, "staged").gpu_s == pytest.approx(packed / 2e9)
    for p, mode, ns in ((cpu, "legacy", nodes), (cpu, "reduce-peak", nodes),
                        (dataclasses.replace(cpu, cpu_renderer=False), "staged", nodes),
                        (cpu, "staged", [dataclasses.replace(n, texture=True) for n in nodes]),
                        (dataclasses.replace(cpu, populated_pack_gbps={}), "staged", nodes)):
        assert simulate(ns, GraphConfig(), p, mode).gpu_s == pytest.approx(packed / 1e9), (mode, p.cpu_renderer)


def test_a_settled_staged_load_pays_its_share_of_populating():
    """``[cpu] settled_populate_share``: a settled staged load on a CPU renderer populates its
    packing shaders' memory too, at that share of a first load's cost (SwiftShader maps device
    memory anew for every load: about 1); nothing without it, nor in other modes or on a GPU."""
    nodes = nodes_of([4096] * 3 + [8192])
    packed = 3 * 4096 + 8192
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, populate_gbps=0.25, cpu_rate=1.0, gpu_rate=1.0)
    none = simulate(nodes, GraphConfig(), cpu, "staged")
    share = simulate(nodes, GraphConfig(), dataclasses.replace(cpu, settled_populate_share=0.5), "staged")
    assert share.cpu_encode_s - none.cpu_encode_s == pytest.approx(0.5 * packed / 0.25e9)
    assert share.gpu_s == pytest.approx(none.gpu_s)
    first = simulate(nodes, GraphConfig(), dataclasses.replace(cpu, settled_populate_share=0.5), "staged", first_load=True)
    assert first.cpu_encode_s - none.cpu_encode_s == pytest.approx(packed / 0.25e9)  # a first load pays all of it
    for p, mode in ((cpu, "legacy"), (cpu, "reduce-peak"), (dataclasses.replace(cpu, cpu_renderer=False), "staged")):
        with_share = dataclasses.replace(p, settled_populate_share=0.5)
        assert simulate(nodes, GraphConfig(), with_share, mode).cpu_encode_s == pytest.approx(
            simulate(nodes, GraphConfig(), p, mode).cpu_encode_s)


def test_populated_pack_rates_are_read_and_checked(tmp_path):
    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    assert load_profile("lavapipe").populated_pack_gbps == {}  # measured before populating: pack_gbps for all
    p = tmp_path / "p.toml"
    p.write_text(text + "\n[gpu.populated_pack_gbps]\ndefault = 2.5\nlinear_4x4 = 3.0\n")
    assert load_profile(p).populated_pack_gbps == {"default": 2.5, "linear_4x4": 3.0}
    p.write_text(text + "\n[gpu.populated_pack_gbps]\nlinear_4x4 = 3.0\n")
    with pytest.raises(ConfigError, match="gpu.populated_pack_gbps.default: missing"):
        load_profile(p)
    p.write_text(text + "\n[gpu.populated_pack_gbps]\ndefault = 0\n")
    with pytest.raises(ConfigError, match="gpu.populated_pack_gbps.default: must be > 0"):
        load_profile(p)


def test_a_staged_first_load_of_at_most_the_huge_page_limit_populates_huge_pages():
    """PrepackPlan.populated_huge_pages: where a staged load's weights, the CPU's and the GPU's
    together, fit in HUGE_PAGES_UP_TO_NBYTES, the blocks it populates are advised as huge pages
    too, priced at ``populate_huge_gbps`` (populate_gbps where the profile has none); beyond, or
    not populating, at ``populate_gbps``."""
    most = HUGE_PAGES_UP_TO_NBYTES
    assert [plan_prepack("staged", [64], 16, GraphConfig(), d, p).populated_huge_pages
            for d, p in ((0, most), (most // 2, most // 2), (1, most), (0, most + 1))] == [True, True, False, False]
    assert not plan_prepack("reduce-peak", [64], 16, GraphConfig(), 0, 64).populated_huge_pages
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, populate_gbps=0.25, populate_huge_gbps=1.0,
                              cpu_rate=1.0, gpu_rate=1.0)

    def populate_s(total, profile):
        nodes = nodes_of([total // 4] * 4)
        return (simulate(nodes, GraphConfig(), profile, "staged", first_load=True).cpu_encode_s
                - simulate(nodes, GraphConfig(), profile, "staged").cpu_encode_s)

    small, large = most // 2, 2 * most
    assert populate_s(small, cpu) == pytest.approx(small / 1e9)
    assert populate_s(large, cpu) == pytest.approx(large / 0.25e9)
    assert populate_s(small, dataclasses.replace(cpu, populate_huge_gbps=None)) == pytest.approx(small / 0.25e9)


def test_a_batch_s_cpu_written_weights_are_written_after_its_submit():
    """PrepackPlan.writes_after_submit: staged and reduce-peak loads submit a batch, then write its
    weights the CPU packs itself while the GPU packs the rest; legacy writes them before its
    submit."""
    assert [plan_prepack(m, [64], 16, GraphConfig()).writes_after_submit
            for m in ("staged", "reduce-peak", "legacy")] == [True, True, False]
    nodes = nodes_of([8 << 20]) + nodes_of([1 << 20] * 4)
    cfg = GraphConfig().replace(prepack__host_packing="cpu-renderer", prepack__initial_threshold_nbytes=1,
                                prepack__threshold_nbytes=1)
    cpu = dataclasses.replace(PROFILE, cpu_renderer=True, host_pack_gbps={"linear_4x4": 2.0}, cpu_rate=1.0,
                              gpu_rate=1.0, source_read_gbps=0.0)
    nodes[1:] = [dataclasses.replace(n, packer="conv2d_c4") for n in nodes[1:]]  # no host form: the GPU packs them
    for mode in ("staged", "reduce-peak"):
        s = simulate(nodes, cfg, cpu, mode)
        first = s.batches[0]
        assert first.writes_end_s - first.cpu_end_s == pytest.approx(cpu.direct_node_s + (8 << 20) / 2e9)
        assert first.gpu_start_s == pytest.approx(first.cpu_end_s)  # the GPU packs while the CPU writes
        assert s.batches[1].cpu_start_s >= first.writes_end_s
        assert all(b.writes_end_s == b.cpu_end_s for b in s.batches[1:])
    legacy = simulate(nodes, cfg, cpu, "legacy")
    (only,) = legacy.batches
    assert only.writes_end_s == only.cpu_end_s and only.gpu_start_s >= only.cpu_end_s
    assert only.cpu_end_s - only.cpu_start_s > cpu.direct_node_s + (8 << 20) / 2e9


def test_bad_fresh_device_rate(tmp_path):
    import re

    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    p = tmp_path / "p.toml"
    p.write_text(re.sub(r"(?m)^fresh_device_gbps = .*$", "fresh_device_gbps = -2", text))
    with pytest.raises(ConfigError, match="gpu.fresh_device_gbps: must be >= 0"):
        load_profile(p)


def test_fresh_direct_rate_is_read_and_checked(tmp_path):
    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    p = tmp_path / "p.toml"
    p.write_text(text)
    assert load_profile(p).fresh_direct_gbps is None  # fresh_device_gbps then
    p.write_text(text.replace("\nsubmit_us = ", "\nfresh_direct_gbps = 0\nsubmit_us = "))
    assert load_profile(p).fresh_direct_gbps == 0.0 and load_profile(p).fresh_direct_rate == 0.0
    p.write_text(text.replace("\nsubmit_us = ", "\nfresh_direct_gbps = -1\nsubmit_us = "))
    with pytest.raises(ConfigError, match="cpu.fresh_direct_gbps: must be >= 0"):
        load_profile(p)


def test_populate_rate_is_read_and_checked(tmp_path):
    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    p = tmp_path / "p.toml"
    p.write_text(text.replace("\nsubmit_us = ", "\npopulate_gbps = 3.5\nsubmit_us = "))
    assert load_profile(p).populate_gbps == 3.5
    p.write_text(text.replace("\nsubmit_us = ", "\npopulate_gbps = 0\nsubmit_us = "))
    with pytest.raises(ConfigError, match="cpu.populate_gbps: must be > 0"):
        load_profile(p)
    p.write_text(text.replace("\nsubmit_us = ", "\npopulate_huge_gbps = 6.5\nsubmit_us = "))
    assert load_profile(p).populate_huge_gbps == 6.5
    p.write_text(text.replace("\nsubmit_us = ", "\npopulate_huge_gbps = -1\nsubmit_us = "))
    with pytest.raises(ConfigError, match="cpu.populate_huge_gbps: must be > 0"):
        load_profile(p)
    p.write_text(text.replace("\nsubmit_us = ", "\nsettled_populate_share = 0.4\nsubmit_us = "))
    assert load_profile(p).settled_populate_share == 0.4
    p.write_text(text.replace("\nsubmit_us = ", "\nsettled_populate_share = -0.1\nsubmit_us = "))
    with pytest.raises(ConfigError, match="cpu.settled_populate_share: must be >= 0"):
        load_profile(p)


def test_weights_copied_straight_into_device_memory_touch_fresh_pages_on_first_loads():
    """Identity and GGML-block weights (packers without a shader) are written by the CPU into
    host-visible device memory, ``encode_direct_us`` each plus their bytes: on a process's first
    load at the rate into a fresh memory block (``direct_copy_gbps``), on later loads at the rate
    calibrated for them (``settled_direct_gbps``), except a weight larger than a shared block: its
    own block is mapped anew by every load."""
    small = nodes_of([1 << 20] * 2, packer="identity") + nodes_of([1 << 20], packer="q4_1")
    big = nodes_of([BLOCK_NBYTES + 4], packer="identity")
    p = dataclasses.replace(PROFILE, host_visible_device_local=True, source_read_gbps=0.0, fresh_device_gbps=0.0,
                            direct_copy_gbps=4.0, settled_direct_gbps=10.0, encode_direct_s=20e-6)
    for nodes, settled_gbps in ((small, 10.0), (big, 4.0)):
        nbytes = sum(n.src_nbytes for n in nodes)
        settled = simulate(nodes, GraphConfig(), p, "legacy")
        first = simulate(nodes, GraphConfig(), p, "legacy", first_load=True)
        assert settled.packing_dispatches == first.packing_dispatches == 0
        assert first.cpu_encode_s == pytest.approx(len(nodes) * 20e-6 + nbytes / 4e9 + p.submit_s)
        assert settled.cpu_encode_s == pytest.approx(len(nodes) * 20e-6 + nbytes / (settled_gbps * 1e9) + p.submit_s)


def test_output_into_a_closed_pipe_stops_quietly():
    """`vkgraph simulate ... | head -1`: once the reader has gone, the command stops with
    128 + SIGPIPE and no error message."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "vkgraph", "simulate", "--model", "synthetic:64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the first line
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == ""


def test_calibration_rounds_take_each_rate_s_median():
    """calibrate --rounds N: each rate (fields, per-packer and per-format tables, [execute]) is
    the median over the rounds; names, counts and flags come from the first."""
    from vkgraph.tools.calibrate import _median_of

    base = load_profile("lavapipe")
    rounds = [dataclasses.replace(base, copy_gbps=c, pack_gbps={**base.pack_gbps, "linear_4x4": c},
                                  execute=dataclasses.replace(base.execute, host_s=c * 1e-6, threads=t))
              for c, t in ((3.0, 2), (1.0, 5), (2.0, 7))]
    got = _median_of(rounds)
    assert (got.copy_gbps, got.pack_gbps["linear_4x4"], got.execute.host_s) == (2.0, 2.0, 2e-6)
    assert got.execute.threads == 2 and got.name == base.name and got.pack_gbps["identity"] == base.pack_gbps["identity"]


def test_a_cpu_renderers_profile_prices_ggml_blocks_in_planes():
    """With a CPU renderer's profile the builder packs GGML weights into planes (the packers its
    kernels read, ops._planes), the tied embedding too (the output head reads it), which the CPU
    writes at their own rates (``[cpu.host_pack_gbps] q4_1_planes``...); without a profile, the
    file's blocks."""
    gpu = model_nodes("llama-3.2-1b:q4_1")
    cpu = model_nodes("llama-3.2-1b:q4_1", PROFILE)
    assert {n.packer for n in gpu} == {"q4_1", "q8_0", "identity"}
    assert {n.packer for n in cpu} == {"q4_1_planes", "q8_0_planes", "identity"}
    planes = [n for n in cpu if n.packer.endswith("_planes")]
    # each layer's five linears (q, k and v stacked) in q4_1; the tied embedding in q8_0
    assert [n.packer for n in planes].count("q4_1_planes") == 16 * 5 and len(planes) == 16 * 5 + 1
    for n in planes:  # 4 bytes of head a block, whole texels
        f = FORMATS[n.packer.removesuffix("_planes")]
        blocks = n.src_nbytes // f.block_nbytes
        assert n.packed_nbytes == -(-blocks * (f.block_nbytes - f.head_nbytes + 4) // 16) * 16
    q41 = [n for n in planes if n.packer == "q4_1_planes"]
    slow = dataclasses.replace(PROFILE, host_pack_gbps={**PROFILE.host_pack_gbps, "q4_1_planes": 0.5})
    extra = sum(n.src_nbytes for n in q41) * (1 / 0.5e9 - 1 / (PROFILE.host_pack_gbps["q4_1_planes"] * 1e9))
    assert simulate(cpu, GraphConfig(), slow).load_s - simulate(cpu, GraphConfig(), PROFILE).load_s == \
        pytest.approx(extra, rel=1e-6)
