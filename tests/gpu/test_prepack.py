import json
import time

import numpy as np
import pytest

from vkgraph.config import GraphConfig
from vkgraph.errors import PrepackMismatchError, VkGraphError
from vkgraph.graph import ComputeGraph, LazySource
from vkgraph.graph.scheduler import PrepackThresholds, batches, prepack_cut_points

KiB = 1024


def ref_transposed(w):
    return np.ascontiguousarray(w.T)


def ref_linear_4x4(w):
    n, k = w.shape
    n4, k4 = -(-n // 4), -(-k // 4)
    padded = np.zeros((n4 * 4, k4 * 4), w.dtype)
    padded[:n, :k] = w
    # block (n4, k4) at [n4][k4], inside it element (kk, nn) at kk*4 + nn
    return padded.reshape(n4, 4, k4, 4).transpose(0, 2, 3, 1).copy()


REFERENCE = {"identity": lambda w: w, "transposed": ref_transposed, "linear_4x4": ref_linear_4x4}


def graph(device, compiler, **cfg):
    """A graph whose packers with a host form pack in their shaders on every device (the tests here
    are of the packing shaders and the staged pipeline), unless ``cfg`` names prepack.host_packing."""
    return ComputeGraph(GraphConfig().replace(**{"prepack__host_packing": "never", **cfg}), device=device,
                        compiler=compiler)


@pytest.mark.parametrize("host_packing", ["auto", "never", "cpu-renderer"])
@pytest.mark.parametrize("packer", ["identity", "transposed", "linear_4x4"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (4, 4), (17, 33), (9, 36), (64, 130)])
def test_packers_match_numpy(device, compiler, packer, shape, host_packing):
    """The packing shaders, and on CPU renderers with prepack.host_packing = "cpu-renderer" (with
    "auto", the default, on SwiftShader: packers.HOST_PACKING_RENDERERS) the packers' host forms
    writing straight into device memory: the same bytes as numpy's. linear_4x4 reads a source
    whose rows are whole texels (K a multiple of 4) as texels."""
    rng = np.random.default_rng(sum(shape))
    w = rng.standard_normal(shape).astype(np.float32)
    with graph(device, compiler, prepack__host_packing=host_packing) as g:
        dst = g.prepack_tensor(g.add_tensorref(w, "w"), packer)
        assert g.values[dst].buffer is None  # memory is bound lazily, at its packing dispatch
        report = g.run_prepack()
        got = g.read_tensor(dst)
    cpu_packs = {"auto": device.renderer == "swiftshader", "never": False, "cpu-renderer": True}[host_packing]
    on_host = device.host_visible_device_local and (packer == "identity" or (cpu_packs and device.is_cpu))
    assert g.prepack_nodes[0].direct == on_host
    assert (report.direct_writes, report.packing_dispatches) == ((1, 0) if on_host else (0, int(packer != "identity")))
    if packer != "identity" and not on_host:
        assert g.prepack_nodes[0].dispatch_kinds(g) == [packer == "linear_4x4" and shape[1] % 4 == 0]
    np.testing.assert_array_equal(got, REFERENCE[packer](w).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("store64", [0, 1])
@pytest.mark.parametrize("shape", [(3, 5), (9, 36), (64, 130), (130, 64)])
def test_linear_4x4_stores_in_either_form(device, compiler, monkeypatch, store64, shape):
    """linear_4x4's packing shader writes each block as four 16-byte vectors or, STORE64, two
    32-byte vectors of 64-bit words (lavapipe at 512 bits picks it: Linear4x4Packer.device_defines):
    the same bytes as numpy's in either form (STORE64 only on devices with shaderInt64)."""
    from vkgraph.graph import packers

    if store64 and not device.has_int64:
        pytest.skip(f"{device.physical.name} has no shaderInt64")
    monkeypatch.setattr(packers.Linear4x4Packer, "device_defines", lambda self, dev: {"STORE64": store64})
    w = np.random.default_rng(len(shape) + shape[0]).standard_normal(shape).astype(np.float32)
    with graph(device, compiler) as g:
        dst = g.prepack_tensor(g.add_tensorref(w, "w"), "linear_4x4")
        g.run_prepack()
        got = g.read_tensor(dst)
        stores = {dict(key[4]).get("STORE64") for key in g.kernels._kernels if key[0] == "pack_linear_4x4"}
    assert stores == {store64}
    np.testing.assert_array_equal(got, ref_linear_4x4(w).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("host_packing", ["never", "cpu-renderer"])
@pytest.mark.parametrize("most", [1 << 20, 16 * KiB])
def test_a_loads_weights_get_huge_pages_only_up_to_a_loads_limit(device, compiler, monkeypatch, most, host_packing):
    """scheduler.PrepackPlan.direct_huge_pages and populated_huge_pages: the memory blocks of the
    weights the CPU writes itself, and those a staged load populates for its packing shaders, are
    advised as huge pages while the load's weights stay within HUGE_PAGES_UP_TO_NBYTES (here
    1 MiB or 16 KiB, against 3 x 8 KiB), on 4 KiB pages beyond it (the advice acts on CPU
    renderers only; populating as prepack.populate_destinations = true). The weights are right
    either way."""
    import vkgraph.graph.allocation as allocation
    import vkgraph.graph.scheduler as scheduler

    monkeypatch.setattr(scheduler, "HUGE_PAGES_UP_TO_NBYTES", most)
    advised = []

    def spy(*args, **kwargs):
        advised.append((kwargs.get("huge_pages", False), kwargs.get("populate", False)))
        return allocate_block(*args, **kwargs)

    allocate_block = allocation.allocate_block
    monkeypatch.setattr(allocation, "allocate_block", spy)
    rng = np.random.default_rng(most)
    ws = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(3)]
    with graph(device, compiler, prepack__host_packing=host_packing, prepack__populate_destinations=True) as g:
        dsts = [g.prepack_tensor(g.add_tensorref(w, f"w{i}"), "linear_4x4") for i, w in enumerate(ws)]
        report = g.run_prepack()
        for w, dst in zip(ws, dsts):
            np.testing.assert_array_equal(g.read_tensor(dst), ref_linear_4x4(w).reshape(-1).view(np.uint8))
    direct = device.host_visible_device_local and device.is_cpu and host_packing != "never"
    assert report.direct_writes == (3 if direct else 0)
    assert advised and all(populate != direct for _, populate in advised)
    assert all(huge == (most > 3 * 8 * KiB) for huge, _ in advised)


@pytest.mark.parametrize("populate", ["auto", True, False])
@pytest.mark.parametrize("mode", ["staged", "legacy", "reduce-peak"])
def test_the_report_counts_the_time_spent_populating(device, compiler, monkeypatch, mode, populate):
    """LoadReport.populate_s: the seconds of cpu_encode_s that made the pages of the memory
    blocks a staged load on a CPU renderer populates for its packing shaders (each block's
    MemoryBlock.populate_s; none in other modes, on a GPU, or where prepack.populate_destinations
    says not to: "auto" as scheduler.populates has it for this device and host). The weights are
    right."""
    from vkgraph.graph.scheduler import populates as device_populates
    from vkgraph.runtime.instance import host_cpu
    import vkgraph.runtime.memory as memory

    calls = []
    populate_pages = memory.populate_pages

    def slow_populate(mapping):
        calls.append(len(mapping))
        time.sleep(0.01)  # a measurable time per block
        populate_pages(mapping)

    monkeypatch.setattr(memory, "populate_pages", slow_populate)
    rng = np.random.default_rng(7)
    ws = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(3)]
    with graph(device, compiler, prepack__initial_threshold_nbytes=8 * KiB, prepack__threshold_nbytes=8 * KiB,
               prepack__reduce_peak_memory=mode == "reduce-peak", prepack__populate_destinations=populate) as g:
        dsts = [g.prepack_tensor(g.add_tensorref(w, f"w{i}"), "linear_4x4") for i, w in enumerate(ws)]
        report = g.run_prepack() if mode != "legacy" else (g.encode_prepack(), g.prepack())[1]
        for w, dst in zip(ws, dsts):
            np.testing.assert_array_equal(g.read_tensor(dst), ref_linear_4x4(w).reshape(-1).view(np.uint8))
    assert report.mode == mode
    told = device_populates(g.config, device.renderer, device.simd_width, host_cpu() if device.is_cpu else "")
    populates = mode == "staged" and told and device.is_cpu and device.host_visible_device_local
    assert len(calls) == (report.submits if populates else 0)  # a block a batch
    assert (report.populate_s >= 0.01 * len(calls)) if populates else report.populate_s == 0
    assert report.populate_s <= report.cpu_encode_s
    assert report.to_dict()["populate_s"] == report.populate_s


def test_a_batch_s_cpu_written_weights_are_written_after_its_submit(device, compiler, monkeypatch):
    """scheduler.PrepackPlan.writes_after_submit: a staged load submits each batch before the
    CPU writes the weights of it that it packs itself (an identity weight on host-visible device
    memory), so the GPU packs the rest meanwhile; legacy writes them before its one submit. Where
    device memory is not host-visible every weight is staged, in order. Every weight is right."""
    import vkgraph.graph.nodes as nodes

    events = []
    encode = nodes.PrepackNode.encode

    def spy_encode(self, graph, *args):
        events.append(("write" if self.direct else "stage", graph.values[self.src].name))
        return encode(self, graph, *args)

    submit = device.submit

    def spy_submit(*args, **kwargs):
        events.append(("submit", ""))
        return submit(*args, **kwargs)

    monkeypatch.setattr(nodes.PrepackNode, "encode", spy_encode)
    monkeypatch.setattr(device, "submit", spy_submit)
    rng = np.random.default_rng(11)
    ws = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(4)]
    packers = ["identity", "linear_4x4", "identity", "linear_4x4"]
    for legacy in (False, True):
        events.clear()
        with graph(device, compiler, prepack__threshold_nodes=1, prepack__initial_threshold_nodes=1) as g:
            dsts = [g.prepack_tensor(g.add_tensorref(w, f"w{i}"), p) for i, (w, p) in enumerate(zip(ws, packers))]
            if legacy:
                g.encode_prepack()
                g.prepack()
            else:
                g.run_prepack()
            load = list(events)
            for w, p, dst in zip(ws, packers, dsts):
                np.testing.assert_array_equal(g.read_tensor(dst), REFERENCE[p](w).reshape(-1).view(np.uint8))
        # batches w0 w1 | w2 w3 (a cut once the command buffer holds more than one node)
        if not device.host_visible_device_local:  # the identity weights are staged and copied too
            staged = [("stage", "w0"), ("stage", "w1"), ("stage", "w2"), ("stage", "w3")]
            assert load == (staged + [("submit", "")] if legacy else
                            staged[:2] + [("submit", "")] + staged[2:] + [("submit", "")])
        elif legacy:
            assert load == [("write", "w0"), ("stage", "w1"), ("write", "w2"), ("stage", "w3"), ("submit", "")]
        else:
            assert load == [("stage", "w1"), ("submit", ""), ("write", "w0"), ("stage", "w3"), ("submit", ""),
                            ("write", "w2")]


def test_sources_beyond_a_texel_buffer_pack_in_windows_read_as_texels(device, compiler, monkeypatch):
    """Where a device's texel buffers are smaller than a storage binding (SwiftShader's hold
    1 MiB of RGBA32UI), a linear_4x4 source beyond one packs in row windows that each fit one,
    every window read as texels; rows too long for one fall back to storage-buffer windows."""
    align = device.limits["minTexelBufferOffsetAlignment"]
    monkeypatch.setitem(device.limits, "maxTexelBufferElements", 256 * align // 16)  # 256 alignments
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 8 * align)).astype(np.float32)  # a texel buffer holds 8 rows
    long = rng.standard_normal((4, 80 * align)).astype(np.float32)  # a row beyond one
    with graph(device, compiler) as g:
        refs = [g.prepack_tensor(g.add_tensorref(a, f"w{i}"), "linear_4x4") for i, a in enumerate((w, long))]
        report = g.run_prepack()
        kinds = [n.dispatch_kinds(g) for n in g.prepack_nodes]
        assert len(kinds[0]) == report.packing_dispatches - 1 > 1 and all(kinds[0]) and kinds[1] == [False]
        for ref, a in zip(refs, (w, long)):
            np.testing.assert_array_equal(g.read_tensor(ref), ref_linear_4x4(a).reshape(-1).view(np.uint8))


def make_model(g, rng, count=40):
    refs = []
    for i in range(count):
        shape = (int(rng.integers(1, 70)), int(rng.integers(1, 70)))
        w = rng.standard_normal(shape).astype(np.float32)
        packer = ["identity", "transposed", "linear_4x4"][i % 3]
        refs.append((g.prepack_tensor(g.add_tensorref(w, f"w{i}"), packer), packer, w))
    return refs


SMALL = dict(prepack__threshold_nbytes=8 * KiB, prepack__initial_threshold_nbytes=2 * KiB,
             prepack__threshold_nodes=6, prepack__initial_threshold_nodes=3,
             prepack__staging_ring_nbytes=24 * KiB)


@pytest.mark.parametrize("mode", ["legacy", "staged", "reduce-peak"])
def test_modes_pack_identical_bytes(device, compiler, mode):
    cfg = dict(SMALL, prepack__reduce_peak_memory=(mode == "reduce-peak"))
    with graph(device, compiler, **cfg) as g:
        refs = make_model(g, np.random.default_rng(42))
        sizes = [n.staging_nbytes(g) for n in g.prepack_nodes]
        report = g.prepack() if mode == "legacy" else g.run_prepack()
        assert report.mode == mode
        for dst, packer, w in refs:
            np.testing.assert_array_equal(g.read_tensor(dst), REFERENCE[packer](w).reshape(-1).view(np.uint8))
        cuts = prepack_cut_points(sizes, PrepackThresholds.from_config(g.config))
        plan = batches(len(sizes), cuts)
        # a batch's weights share memory blocks: one for those the CPU writes and one for the
        # others (however they alternate), none shared with another batch
        batches_ = [range(len(sizes))] if mode == "legacy" else plan
        memories = [{g.values[g.prepack_nodes[i].dst].buffer.memory for i in batch} for batch in batches_]
        kinds = [len({g.prepack_nodes[i].direct for i in batch}) for batch in batches_]
        assert [len(m) for m in memories] == kinds and len(set.union(*memories)) == sum(kinds)
    if mode == "legacy":
        assert report.submits == 1
        assert report.peak_staging_nbytes >= report.total_staged_nbytes  # everything staged at once
    else:
        assert report.submits == len(plan) > 5
        assert report.bytes_per_submit == [sum(sizes[i] for i in b) for b in plan]
        if mode == "staged":
            assert report.peak_staging_nbytes <= 24 * KiB
        else:
            assert report.peak_staging_nbytes <= max(report.bytes_per_submit) + len(refs) * g.staging_alignment
    assert sum(report.bytes_per_submit) == report.total_staged_nbytes
    assert report.packing_dispatches == sum(1 for _, p, _ in refs if p != "identity")
    identity_nodes = sum(1 for _, p, _ in refs if p == "identity")
    assert report.direct_writes == (identity_nodes if device.host_visible_device_local else 0)
    assert report.load_s > 0 and report.cpu_encode_s > 0
    if device.physical.timestamps_supported:
        assert report.gpu_s > 0 and all(s.gpu_end_s >= s.gpu_start_s for s in report.spans)


def test_batch_larger_than_ring_gets_its_own_staging(device, compiler):
    rng = np.random.default_rng(0)
    with graph(device, compiler, prepack__staging_ring_nbytes=16 * KiB, prepack__threshold_nbytes=KiB,
               prepack__initial_threshold_nbytes=KiB) as g:
        small = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
        bigs = [rng.standard_normal((128, 100 + i)).astype(np.float32) for i in range(3)]  # 50 KiB each > ring
        refs = [g.prepack_tensor(g.add_tensorref(w, f"s{i}"), "transposed") for i, w in enumerate(small)]
        big_refs = [g.prepack_tensor(g.add_tensorref(b, f"big{i}"), "linear_4x4") for i, b in enumerate(bigs)]
        refs.append(g.prepack_tensor(g.add_tensorref(small[0], "tail"), "transposed"))
        report = g.run_prepack()
        for ref, b in zip(big_refs, bigs):
            np.testing.assert_array_equal(g.read_tensor(ref), ref_linear_4x4(b).reshape(-1).view(np.uint8))
        np.testing.assert_array_equal(g.read_tensor(refs[-1]), small[0].T.reshape(-1).view(np.uint8))
    # one oversized batch at a time: the ring plus the largest batch, never two of them
    assert max(b.nbytes for b in bigs) <= report.staging_allocated_nbytes - 16 * KiB <= max(report.bytes_per_submit) + g.staging_alignment
    assert max(b.nbytes for b in bigs) <= report.peak_staging_nbytes <= report.staging_allocated_nbytes


def test_sources_are_released_after_their_last_reader(device, compiler):
    rng = np.random.default_rng(1)
    with graph(device, compiler) as g:
        w = g.add_tensorref(rng.standard_normal((8, 8)).astype(np.float32), "w")
        a, b = g.prepack_tensor(w, "identity"), g.prepack_tensor(w, "transposed")  # two readers
        g.run_prepack()
        src = g.values[w].source
        with pytest.raises(ValueError, match="released"):
            src.read()
        np.testing.assert_array_equal(g.read_tensor(a).view(np.float32).reshape(8, 8).T, g.read_tensor(b).view(np.float32).reshape(8, 8))


@pytest.mark.parametrize(
    "shape,dtype,packer,lazy_nbytes,message",
    [
        ((4, 4, 4), np.float32, "transposed", None, "needs a 2-D source, got dims (4, 4, 4)"),
        ((8, 8), np.float16, "linear_4x4", None, "needs 4-byte elements, got float16"),
        ((8, 8), np.float32, "identity", 100, "its source holds 100 bytes but shape (8, 8)"),
    ],
)
def test_mismatch_is_rejected_before_gpu_work(device, compiler, shape, dtype, packer, lazy_nbytes, message):
    with graph(device, compiler) as g:
        if lazy_nbytes is None:
            src = g.add_tensorref(np.ones(shape, dtype), "layers.3.w")
        else:
            src = g.add_tensorref(LazySource(lazy_nbytes, lambda: np.zeros(lazy_nbytes, np.uint8)),
                                  "layers.3.w", shape=shape, dtype=dtype)
        before = device.allocated_nbytes
        with pytest.raises(PrepackMismatchError, match="'layers.3.w'.*" + message.replace("(", r"\(").replace(")", r"\)")):
            g.prepack_tensor(src, packer)
        assert device.allocated_nbytes == before and not g.prepack_nodes


def test_destination_mismatch_names_tensor():
    from vkgraph.graph.packers import PACKERS
    from vkgraph.graph.values import ArraySource, Tensor, TensorRef

    src = TensorRef("emb", (6, 10), np.dtype(np.float32), ArraySource(np.zeros((6, 10), np.float32)))
    with pytest.raises(PrepackMismatchError, match=r"'emb'.*destination dims \(6, 10\) != \(10, 6\)"):
        PACKERS["transposed"].validate(src, Tensor("d", (6, 10), np.dtype(np.float32)))
    with pytest.raises(PrepackMismatchError, match=r"'emb'.*element size 4 B .* != 2 B"):
        PACKERS["identity"].validate(src, Tensor("d", (6, 10), np.dtype(np.float16), nbytes=240))
    with pytest.raises(PrepackMismatchError, match=r"'emb'.*destination holds 200 bytes, packer 'identity' writes 240"):
        PACKERS["identity"].validate(src, Tensor("d", (6, 10), np.dtype(np.float32), nbytes=200))


@pytest.mark.parametrize("bad_packer", ["linear_4x4", "identity"])  # identity: written after its batch's submit
@pytest.mark.parametrize("mode", ["legacy", "staged"])
def test_failure_mid_prepack_frees_everything(device, compiler, mode, bad_packer):
    def boom():
        raise OSError("disk went away")

    base = device.allocated_nbytes
    with graph(device, compiler, prepack__threshold_nbytes=64, prepack__initial_threshold_nbytes=64) as g:
        for i in range(5):
            g.prepack_tensor(g.add_tensorref(np.ones((8, 8), np.float32), f"ok{i}"), "transposed")
        g.prepack_tensor(g.add_tensorref(LazySource(256, boom), "bad", shape=(8, 8), dtype=np.float32), bad_packer)
        g.prepack_tensor(g.add_tensorref(np.ones((8, 8), np.float32), "last"), "identity")
        with pytest.raises(OSError, match="disk went away"):
            g.prepack() if mode == "legacy" else g.run_prepack()
        assert device.allocated_nbytes == base
        with pytest.raises(VkGraphError, match="unusable.*disk went away"):
            g.run_prepack()


def test_trace_has_cpu_and_gpu_tracks(device, compiler, tmp_path):
    with graph(device, compiler, **SMALL) as g:
        make_model(g, np.random.default_rng(3), count=12)
        report = g.run_prepack()
    path = tmp_path / "trace.json"
    report.write_trace(path)
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans if e["cat"] == "cpu"} == {1}
    assert len([e for e in spans if e["cat"] == "cpu"]) == report.submits
    # the weights the CPU writes after a batch's submit (make_model's identity ones on host-visible memory)
    writes = [e for e in spans if e["cat"] == "write"]
    assert {e["tid"] for e in writes} <= {1} and len(writes) == sum(len(s.cpu_intervals) > 1 for s in report.spans)
    assert bool(writes) == (device.host_visible_device_local and report.direct_writes > 0)
    if device.physical.timestamps_supported:
        assert len([e for e in spans if e["cat"] == "gpu" and e["tid"] == 2]) == report.submits
    assert trace["otherData"]["submits"] == report.submits
    assert "overlap" in report.to_dict() and "CPU/GPU overlap" in report.format_table()


@pytest.mark.parametrize("limit,mode", [(1 << 30, "staged"), (1024, "reduce-peak")])
def test_auto_mode_reduces_peak_only_for_large_models(device, compiler, limit, mode):
    with graph(device, compiler, prepack__reduce_peak_memory="auto", prepack__auto_reduce_above_nbytes=limit,
               prepack__threshold_nbytes=KiB, prepack__initial_threshold_nbytes=KiB) as g:
        refs = make_model(g, np.random.default_rng(5), count=9)
        report = g.run_prepack()
        assert report.mode == mode and report.submits > 1
        for dst, packer, w in refs:
            np.testing.assert_array_equal(g.read_tensor(dst), REFERENCE[packer](w).reshape(-1).view(np.uint8))
        with pytest.raises(VkGraphError, match="already prepacked"):
            g.run_prepack()
        with pytest.raises(VkGraphError, match="already prepacked"):
            g.encode_prepack()


def test_conv2d_packer_layout(device, compiler):
    w = np.random.default_rng(8).standard_normal((6, 3, 2, 5)).astype(np.float32)
    with graph(device, compiler) as g:
        dst = g.prepack_tensor(g.add_tensorref(w, "conv.w"), "conv2d_c4")
        g.run_prepack()
        got = g.read_tensor(dst).view(np.float32).reshape(2, 2, 5, 3, 4)
    padded = np.zeros((8, 3, 2, 5), np.float32)
    padded[:6] = w
    np.testing.assert_array_equal(got, padded.reshape(2, 4, 3, 2, 5).transpose(0, 3, 4, 2, 1))


def test_cpu_encodes_the_next_batch_while_the_gpu_packs_and_staging_waits_for_fences(device, compiler, monkeypatch):
    """Staged mode's two promises, asserted on the order of a real load's calls: the CPU submits
    batch k and encodes batch k+1 without waiting for k (so the GPU packs k meanwhile), and no
    staging region is handed out again before the fence of every batch that used it has
    signalled. (Not whether a fence is still unsignalled when the next batch is encoded: that is
    timing; SwiftShader under synchronization validation sometimes packs a batch before the
    validated CPU side reaches the next.)"""
    from vkgraph.graph.prepack import PrepackRun
    from vkgraph.graph.staging import StagingRing

    events, batch_of, attached, reused = [], {}, [], []
    real = {"encode": PrepackRun.encode, "submit": PrepackRun.submit, "wait_fence": PrepackRun._wait_fence,
            "ring_wait": StagingRing._wait, "attach": StagingRing.attach, "reserve": StagingRing.reserve}

    def encode(self, b):
        events.append(("encode", b))
        real["encode"](self, b)

    def submit(self, b):
        real["submit"](self, b)
        batch_of[id(self.fences[b])] = b
        events.append(("submit", b))

    def wait_fence(self, fence):  # every wait the code asks for, whether the fence has signalled or not
        events.append(("wait", batch_of[id(fence)]))
        real["wait_fence"](self, fence)

    def ring_wait(self, fence):
        events.append(("wait", batch_of[id(fence)]))
        real["ring_wait"](self, fence)

    def attach(self, region, fence):
        attached.append((region.buffer, region.offset, region.offset + region.nbytes, fence))
        real["attach"](self, region, fence)

    def reserve(self, nbytes):
        region = real["reserve"](self, nbytes)
        for buf, s, e, fence in attached:
            if buf is region.buffer and s < region.offset + region.nbytes and region.offset < e:
                reused.append(fence.is_signaled())
        return region

    for name, fn in [("encode", encode), ("submit", submit), ("_wait_fence", wait_fence)]:
        monkeypatch.setattr(PrepackRun, name, fn)
    for name, fn in [("_wait", ring_wait), ("attach", attach), ("reserve", reserve)]:
        monkeypatch.setattr(StagingRing, name, fn)
    rng = np.random.default_rng(12)
    ws = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(24)]  # 256 KiB each
    with graph(device, compiler, prepack__threshold_nbytes=256 * KiB, prepack__initial_threshold_nbytes=256 * KiB,
               prepack__staging_ring_nbytes=1024 * KiB) as g:
        refs = [g.prepack_tensor(g.add_tensorref(w, f"w{i}"), "linear_4x4") for i, w in enumerate(ws)]
        report = g.run_prepack()
        for ref, w in zip(refs, ws):
            np.testing.assert_array_equal(g.read_tensor(ref), ref_linear_4x4(w).reshape(-1).view(np.uint8))
    assert report.submits == 12  # batches of two weights: the ring holds two batches' staging
    last_submit = events.index(("submit", 11))
    ring_waits = []
    for i, (kind, b) in enumerate(events):
        if kind == "encode" and b > 0:
            assert events[i - 1] == ("submit", b - 1)  # batch b-1 went to the GPU right before
        if kind == "wait" and i < last_submit:  # a wait while batches are still being encoded:
            encoding = max(e[1] for e in events[:i] if e[0] == "encode")
            assert b <= encoding - 2, events  # for staging two batches back, never the batch just submitted
            ring_waits.append(b)
    assert ring_waits == list(range(10)), events  # encoding batch b waited for batch b-2's staging
    assert reused and all(reused)  # the ring was reused, and only behind signalled fences
