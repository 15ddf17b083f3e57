"""Device-memory budget (with the reduce-peak retry), fence timeouts and device loss."""

import re

import numpy as np
import pytest

from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.errors import (
    DeviceLostError,
    FenceTimeoutError,
    OutOfDeviceMemoryError,
    VkGraphError,
)
from vkgraph.graph import ComputeGraph
from vkgraph.runtime import Fence, _vk, live_objects

from .conftest import assert_no_vulkan_messages

KiB = 1024
# 12 linear weights of 64 x 1000 fp32 (256000 bytes staged and packed each), batches of 3
# weights, a 1 MiB staging ring: staged mode needs the ring on top of the weights, reduce-peak one batch.
LAYERS, N, K = 12, 64, 1000
RING = 1024 * KiB
# the weights packed by shaders from staging on every device (host_packing: the CPU would write them)
SMALL = dict(prepack__threshold_nbytes=500 * KiB, prepack__initial_threshold_nbytes=500 * KiB,
             prepack__staging_ring_nbytes=RING, prepack__host_packing="never")


def weights():
    rng = np.random.default_rng(11)
    return [rng.standard_normal((N, K)).astype(np.float32) for _ in range(LAYERS)]


def build(g, ws):
    """x -> linear_0 -> ... -> linear_11 (each [N, K] weight applied to the first K of x)."""
    x = g.add_input((2, K), np.float32, "x")
    outs = [ops.linear(g, x, g.add_tensorref(w, f"layer{i}.weight")) for i, w in enumerate(ws)]
    y = outs[0]
    for o in outs[1:]:
        y = ops.add(g, y, o)
    g.set_output(y, "y")


def inputs():
    return np.random.default_rng(13).standard_normal((2, K)).astype(np.float32)


def reference(ws, x):
    return sum(x @ w.T for w in ws)


def graph(device, compiler, **cfg):
    return ComputeGraph(GraphConfig().replace(**{**SMALL, **cfg}), device=device, compiler=compiler)


def peak_device(device, compiler, mode):
    """Device bytes a load in ``mode`` needs on top of what the device held before it."""
    with graph(device, compiler, prepack__reduce_peak_memory=(mode == "reduce-peak")) as g:
        build(g, weights())
        g.prepare()
        base = device.allocated_nbytes
        report = g.run_prepack()
        return base, report.peak_device_nbytes


def test_budget_refuses_naming_tensor_bytes_and_budget_and_frees_everything(device, compiler):
    base, staged_peak = peak_device(device, compiler, "staged")
    budget = base + RING + 4 * 256000  # the ring and four weights fit, not twelve
    with graph(device, compiler, device__max_memory_nbytes=budget) as g:
        build(g, weights())
        g.prepare()
        live, allocated = live_objects(), device.allocated_nbytes
        with pytest.raises(OutOfDeviceMemoryError) as err:
            g.run_prepack()
        # the tensor, its bytes, the budget
        assert re.search(rf"buffer 'layer\d+\.weight:linear_4x4' of 256000 bytes does not fit: \d+ bytes are "
                         rf"allocated( and \d+ more are placed before it in its memory block)?, the budget "
                         rf"\(device.max_memory_nbytes\) is {budget}", str(err.value)), err.value
        assert device.allocated_nbytes == allocated and live_objects() == live  # nothing leaked
        with pytest.raises(VkGraphError, match="unusable.*OutOfDeviceMemoryError"):
            g.execute({"x": inputs()})
    assert device.max_memory_nbytes == 0  # the shared device's budget is restored


@pytest.mark.parametrize("reduce", [False, "auto"])
def test_auto_retries_in_reduce_peak_when_staged_does_not_fit(device, compiler, reduce):
    base, staged_peak = peak_device(device, compiler, "staged")
    _, reduce_peak = peak_device(device, compiler, "reduce-peak")
    assert reduce_peak < staged_peak
    budget = base + reduce_peak  # weights + one batch of staging fit, weights + the ring do not
    ws = weights()
    with graph(device, compiler, device__max_memory_nbytes=budget, prepack__reduce_peak_memory=reduce) as g:
        build(g, ws)
        g.prepare()
        live, allocated = live_objects(), device.allocated_nbytes
        if not reduce:
            with pytest.raises(OutOfDeviceMemoryError, match="budget"):
                g.run_prepack()
            assert device.allocated_nbytes == allocated and live_objects() == live
            return
        report = g.run_prepack()
        assert report.mode == "reduce-peak" and "(device.max_memory_nbytes)" in report.retried_after
        assert base + report.peak_device_nbytes <= budget
        x = inputs()
        np.testing.assert_allclose(g.execute({"x": x})["y"], reference(ws, x), rtol=1e-4, atol=1e-3)


def test_config_budget_on_an_own_device(tmp_path):
    """A graph that opens its own device gives it the budget from the config."""
    cfg = GraphConfig().replace(device__max_memory_nbytes=192 * KiB, prepack__host_packing="never")
    with ComputeGraph(cfg) as g:
        assert g.device.max_memory_nbytes == 192 * KiB
        g.prepack_tensor(g.add_tensorref(np.random.default_rng(14).standard_normal((128, 256)).astype(np.float32), "big"), "linear_4x4")
        # its 128 KiB of staging fit, its 128 KiB packed copy does not
        with pytest.raises(OutOfDeviceMemoryError, match=r"'big.*' of 131072 bytes does not fit.*budget "
                                                          r"\(device.max_memory_nbytes\) is 196608"):
            g.run_prepack()


# --- fence timeouts and device loss -------------------------------------------------------------


@pytest.fixture
def fence_times_out(monkeypatch):
    """The next fence wait times out as a hung GPU's would (the status query says "not ready")."""
    real_wait, real_signaled = Fence.wait, Fence.is_signaled
    armed = [True]

    def wait(self, timeout_s=1.0):
        if armed[0]:
            armed[0] = False
            raise FenceTimeoutError("vkWaitForFences", "VK_TIMEOUT", f"fence not signalled after {timeout_s:g} s")
        return real_wait(self, timeout_s)

    def is_signaled(self):
        return False if armed[0] else real_signaled(self)

    monkeypatch.setattr(Fence, "wait", wait)
    monkeypatch.setattr(Fence, "is_signaled", is_signaled)
    return armed


@pytest.fixture
def device_lost_on_submit(monkeypatch):
    """The next vkQueueSubmit returns VK_ERROR_DEVICE_LOST, through the binding's own exception."""
    real = _vk.vk.vkQueueSubmit
    armed = [True]

    def vkQueueSubmit(*args):
        if armed[0]:
            armed[0] = False
            raise _vk.vk.VkErrorDeviceLost()
        return real(*args)

    monkeypatch.setattr(_vk.vk, "vkQueueSubmit", vkQueueSubmit)
    return armed


@pytest.mark.parametrize("mode", ["legacy", "staged", "reduce-peak"])
def test_fence_timeout_during_prepack_makes_the_graph_unusable(device, compiler, fence_times_out, mode):
    with graph(device, compiler, prepack__reduce_peak_memory=(mode == "reduce-peak"),
               device__fence_timeout_ms=50) as g:
        build(g, weights())
        with pytest.raises(FenceTimeoutError, match="not signalled after 0.05 s"):
            g.prepack() if mode == "legacy" else g.run_prepack()
        assert not fence_times_out[0]
        for again in (g.run_prepack, lambda: g.execute({"x": inputs()})):
            with pytest.raises(VkGraphError, match="unusable: an earlier prepack failed.*FenceTimeoutError"):
                again()
    # leaving the block waited for the device and freed what the GPU might still have used


def test_fence_timeout_during_execute_makes_the_graph_unusable(device, compiler, monkeypatch):
    ws = weights()
    with graph(device, compiler, device__fence_timeout_ms=50) as g:
        build(g, ws)
        g.run_prepack()
        x = inputs()
        # the first execute waits while lavapipe makes its kernels' code (from a cold Mesa shader
        # cache, longer than the 50 ms the hang below is reported against)
        limit, g.fence_timeout_s = g.fence_timeout_s, 300.0
        np.testing.assert_allclose(g.execute({"x": x})["y"], reference(ws, x), rtol=1e-4, atol=1e-3)
        g.fence_timeout_s = limit

        def hung(self, timeout_s=1.0):
            raise FenceTimeoutError("vkWaitForFences", "VK_TIMEOUT", f"fence not signalled after {timeout_s:g} s")

        with monkeypatch.context() as m:
            m.setattr(Fence, "wait", hung)
            with pytest.raises(FenceTimeoutError, match="not signalled after 0.05 s"):
                g.execute({"x": x})
        with pytest.raises(VkGraphError, match="unusable: an earlier execute failed.*FenceTimeoutError"):
            g.execute({"x": x})


@pytest.mark.parametrize("where", ["prepack", "execute"])
def test_device_lost_makes_the_graph_unusable(device, compiler, device_lost_on_submit, where):
    ws = weights()
    with graph(device, compiler) as g:
        build(g, ws)
        x = inputs()
        if where == "execute":
            device_lost_on_submit[0] = False
            g.run_prepack()
            device_lost_on_submit[0] = True
        with pytest.raises(DeviceLostError, match="vkQueueSubmit failed: VK_ERROR_DEVICE_LOST"):
            g.run_prepack() if where == "prepack" else g.execute({"x": x})
        with pytest.raises(VkGraphError, match=f"unusable: an earlier {where} failed.*DeviceLostError"):
            g.execute({"x": x})


def test_auto_retry_rereads_file_backed_weights(device, compiler):
    """Weights read from a memory-mapped safetensors file are released after packing (their pages
    dropped) and read again from the file by the reduce-peak retry."""
    from vkgraph.models import outputs_match, synthetic
    from vkgraph.models.safetensors import SafetensorsFile

    spec = synthetic.SyntheticSpec.for_size(4)
    ids = synthetic.sample_ids(spec)
    small = dict(prepack__threshold_nbytes=256 * KiB, prepack__initial_threshold_nbytes=256 * KiB)
    with SafetensorsFile(synthetic.weights_path(spec)) as st:
        peaks = {}
        for reduce in (False, True):
            with graph(device, compiler, **small, prepack__reduce_peak_memory=reduce) as g:
                synthetic.build(g, st, spec)
                g.prepare()
                base = device.allocated_nbytes
                peaks[reduce] = g.run_prepack().peak_device_nbytes
        assert peaks[True] < peaks[False]
        with graph(device, compiler, **small, prepack__reduce_peak_memory="auto",
                   device__max_memory_nbytes=base + peaks[True]) as g:
            synthetic.build(g, st, spec)
            report = g.run_prepack()
            assert report.mode == "reduce-peak" and report.retried_after
            assert outputs_match(g.execute({"ids": ids})["logits"], synthetic.reference(st, spec, ids))


# --- bad input ------------------------------------------------------------------------------------


def test_model_file_missing_a_tensor(device, compiler, tmp_path):
    from vkgraph.errors import MissingTensorError
    from vkgraph.models import synthetic
    from vkgraph.models.safetensors import SafetensorsFile, write_safetensors

    spec = synthetic.SyntheticSpec.for_size(4)
    with SafetensorsFile(synthetic.weights_path(spec)) as st:
        kept = {n: st.array(n) for n in st.tensors if n != "layers.1.feed_forward.w2.weight"}
    path = tmp_path / "partial.safetensors"
    write_safetensors(path, kept)
    with SafetensorsFile(path) as st, graph(device, compiler) as g:
        live = live_objects()
        with pytest.raises(MissingTensorError, match=rf"{path}: no tensor named 'layers.1.feed_forward.w2.weight'"):
            synthetic.build(g, st, spec)
        assert live_objects() == live


def test_device_lacking_a_feature(device, monkeypatch):
    """What vkgraph needs but a device may lack is refused by name, before any Vulkan call."""
    from vkgraph.errors import UnsupportedFeatureError
    from vkgraph.runtime import ImportedBuffer, image

    monkeypatch.setattr(device, "has_external_memory_host", False)
    with pytest.raises(UnsupportedFeatureError, match="cannot import host memory .VK_EXT_external_memory_host."):
        ImportedBuffer(device, memoryview(bytearray(4096)), 4096)
    monkeypatch.setattr(image, "storage_image_supported", lambda dev: False)
    with pytest.raises(UnsupportedFeatureError, match="cannot use R32G32B32A32_SFLOAT as a storage image"):
        image.Image3D(device, (4, 4, 4))


def test_failed_upload_frees_its_buffer(device, compiler):
    """TensorMemory.upload (cache hits copied into device memory) frees the buffer it made when
    writing into it fails."""
    from vkgraph.graph.values import Tensor

    with graph(device, compiler) as g:
        t = Tensor("w", (4, 4), np.dtype(np.float32), constant=True)
        live, allocated = live_objects(), device.allocated_nbytes
        with pytest.raises(ValueError, match="outside"):
            g.memory.upload(t, np.ones(32, np.float32))  # 128 bytes into a 64-byte tensor
        assert live_objects() == live and device.allocated_nbytes == allocated and t.buffer is None
        g.memory.upload(t, np.arange(16, dtype=np.float32))
        np.testing.assert_array_equal(g.memory.read(t).view(np.float32), np.arange(16, dtype=np.float32))


GC_CYCLE_SCRIPT = """
import gc, mmap, sys
from vkgraph.errors import OutOfDeviceMemoryError
from vkgraph.runtime import Device, ImportedBuffer

with open(sys.argv[1], "wb") as f:
    f.write(b"x" * 8192)
dev = Device(max_memory_nbytes=1)  # every allocation is past the budget
if not dev.has_external_memory_host:
    print("no import"); sys.exit(0)
fh = open(sys.argv[1], "rb")
mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)

def helper(exc):
    raise exc  # a frame holding the exception: its traceback is now a reference cycle

for _ in range(3):
    try:
        try:
            ImportedBuffer(dev, memoryview(mm)[:4096], 4096)
        except OutOfDeviceMemoryError as exc:
            helper(exc)
    except OutOfDeviceMemoryError:
        pass
gc.collect()
dev.destroy()
print("ok")
"""


def test_failed_import_caught_in_a_reference_cycle_is_collected(device, tmp_path):
    """A failed ImportedBuffer releases its pin on the host pages at once: the garbage collector
    crashed (SIGSEGV) collecting a cffi buffer that an exception's traceback cycle still held."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", GC_CYCLE_SCRIPT, str(tmp_path / "pages")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() in ("ok", "no import"), (p.returncode, p.stderr[-2000:])
    assert_no_vulkan_messages(p.stderr)
