import struct
import time

import numpy as np
import pytest

from vkgraph.errors import CommandBufferStateError, FenceTimeoutError
from vkgraph.runtime import (
    Buffer,
    CommandBufferState,
    CommandPool,
    DescriptorSetLayout,
    DescriptorType,
    Fence,
    MemoryKind,
    PipelineLayout,
    Semaphore,
    Stage,
    TimestampQueryPool,
)
from vkgraph.tools.smoke import axpby

S = CommandBufferState


def _fill_cmd(pool, buf, value):
    (cmd,) = pool.allocate()
    cmd.begin()
    cmd.fill_buffer(buf, value)
    cmd.host_read_barrier()
    cmd.end()
    return cmd


def test_state_machine(device):
    with CommandPool(device) as pool, Buffer(device, 64, MemoryKind.READBACK) as buf, Fence(device) as fence:
        (cmd,) = pool.allocate()
        assert cmd.state is S.INITIAL
        with pytest.raises(CommandBufferStateError, match="initial"):
            cmd.dispatch(1)
        with pytest.raises(CommandBufferStateError, match="submit"):
            device.submit([cmd])
        with pytest.raises(CommandBufferStateError, match="end recording"):
            cmd.end()
        cmd.begin()
        assert cmd.state is S.RECORDING
        with pytest.raises(CommandBufferStateError, match="begin recording"):
            cmd.begin()
        cmd.fill_buffer(buf, 7)
        cmd.host_read_barrier()
        cmd.end()
        assert cmd.state is S.EXECUTABLE
        device.submit([cmd], fence)
        cmd.wait()
        assert cmd.state is S.EXECUTABLE
        assert buf.read(np.uint32).tolist() == [7] * 16
        # Resubmitting a recorded buffer replays it.
        buf.write(np.zeros(16, np.uint32))
        fence.reset()
        device.submit([cmd], fence)
        fence.wait()
        assert cmd.state is S.EXECUTABLE
        assert buf.read(np.uint32).tolist() == [7] * 16
        cmd.reset()
        assert cmd.state is S.INITIAL


def test_one_time_buffer_becomes_invalid(device):
    with CommandPool(device) as pool, Buffer(device, 16, MemoryKind.READBACK) as buf, Fence(device) as fence:
        (cmd,) = pool.allocate()
        cmd.begin(one_time=True)
        cmd.fill_buffer(buf, 1)
        cmd.end()
        device.submit([cmd], fence)
        fence.wait()
        assert cmd.state is S.INVALID
        with pytest.raises(CommandBufferStateError, match="invalid"):
            device.submit([cmd])
        cmd.begin()  # re-recording is allowed
        cmd.end()


def test_pending_buffer_cannot_be_rerecorded(device):
    """A submission that waits on a semaphore stays pending until the host signals it."""
    with (
        CommandPool(device) as pool,
        Buffer(device, 16, MemoryKind.READBACK) as buf,
        Fence(device) as fence,
        Semaphore(device, timeline=True) as gate,
    ):
        cmd = _fill_cmd(pool, buf, 3)
        device.submit([cmd], fence, wait=[(gate, 1)])
        assert cmd.state is S.PENDING
        with pytest.raises(CommandBufferStateError, match="pending"):
            cmd.begin()
        with pytest.raises(CommandBufferStateError, match="pending"):
            cmd.reset()
        assert not fence.is_signaled()
        gate.signal(1)
        fence.wait()
        assert cmd.state is S.EXECUTABLE
        assert buf.read(np.uint32).tolist() == [3] * 4


def test_fence_timeout_raises(device):
    with Fence(device) as fence:
        t0 = time.perf_counter()
        with pytest.raises(FenceTimeoutError) as err:
            fence.wait(0.05)
        assert time.perf_counter() - t0 < 5
        assert isinstance(err.value, TimeoutError)
        assert err.value.call == "vkWaitForFences" and err.value.result == "VK_TIMEOUT"
        assert "0.05 s" in str(err.value)
    with Fence(device, signaled=True) as fence:
        assert fence.is_signaled()
        fence.wait(0)
        fence.reset()
        assert not fence.is_signaled()


def test_timeline_semaphore_host_and_gpu(device):
    if not device.has_timeline_semaphore:
        pytest.skip("no timeline semaphores on this device")
    with (
        Semaphore(device, timeline=True, initial_value=5) as sem,
        CommandPool(device) as pool,
        Buffer(device, 16, MemoryKind.READBACK) as buf,
    ):
        assert sem.value == 5
        sem.signal(6)
        sem.wait(6, timeout_s=1)
        with pytest.raises(FenceTimeoutError, match="value 7"):
            sem.wait(7, timeout_s=0.05)
        cmd = _fill_cmd(pool, buf, 9)
        device.submit([cmd], signal=[(sem, 7)])
        sem.wait(7)
        device.wait_idle()
        assert cmd.state is S.EXECUTABLE
        assert buf.read(np.uint32).tolist() == [9] * 4


def test_binary_semaphore_orders_submissions(device):
    with (
        Semaphore(device) as sem,
        CommandPool(device) as pool,
        Buffer(device, 16, MemoryKind.READBACK) as buf,
        Fence(device) as fence,
    ):
        first, second = _fill_cmd(pool, buf, 1), _fill_cmd(pool, buf, 2)
        device.submit([first], signal=[(sem, 0)])
        device.submit([second], fence, wait=[(sem, 0)])
        fence.wait()
        device.wait_idle()
        assert buf.read(np.uint32).tolist() == [2] * 4
        with pytest.raises(ValueError, match="timeline"):
            sem.value


def test_push_constants_beyond_layout_raise(device):
    with (
        DescriptorSetLayout(device, [DescriptorType.STORAGE_BUFFER]) as dsl,
        PipelineLayout(device, [dsl], push_constant_nbytes=16) as layout,
        CommandPool(device) as pool,
    ):
        (cmd,) = pool.allocate()
        cmd.begin()
        with pytest.raises(ValueError, match="exceed"):
            cmd.push_constants(layout, struct.pack("<8I", *range(8)))
        with pytest.raises(ValueError, match="multiples of 4"):
            cmd.push_constants(layout, b"abc")
        cmd.end()


def test_timestamps_measure_a_dispatch(device, compiler):
    if not device.physical.timestamps_supported:
        pytest.skip("no timestamps on this device")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1 << 20, dtype=np.float32)
    res = axpby(device, x, x.copy(), 2.0, compiler=compiler)
    assert res.gpu_ns is not None and res.gpu_ns > 0
    np.testing.assert_allclose(res.y, 3 * x, rtol=1e-6)
    with TimestampQueryPool(device, 4) as qp:
        with pytest.raises(ValueError, match="outside"):
            qp.results_ns(2, 3)
        with CommandPool(device) as pool, Fence(device) as fence:
            (cmd,) = pool.allocate()
            cmd.begin()
            cmd.reset_query_pool(qp)
            for i in range(4):
                cmd.write_timestamp(qp, i, Stage.BOTTOM_OF_PIPE)
            cmd.end()
            device.submit([cmd], fence)
            fence.wait()
        ts = qp.results_ns()
        assert ts == sorted(ts)


def test_descriptor_pool_refuses_what_it_was_not_sized_for(device):
    """As strict drivers do (SwiftShader: VK_ERROR_OUT_OF_POOL_MEMORY), on every device."""
    from vkgraph.errors import VulkanError
    from vkgraph.runtime import DescriptorPool, DescriptorSetLayout, DescriptorType

    with DescriptorSetLayout(device, [DescriptorType.STORAGE_BUFFER, DescriptorType.STORAGE_IMAGE]) as both, \
            DescriptorSetLayout(device, [DescriptorType.STORAGE_BUFFER] * 2) as buffers, \
            DescriptorSetLayout(device, [DescriptorType.STORAGE_BUFFER]) as one, \
            DescriptorSetLayout(device, []) as empty, \
            DescriptorPool(device, 2, {DescriptorType.STORAGE_BUFFER: 3}) as pool:
        with pytest.raises(VulkanError, match="OUT_OF_POOL_MEMORY.*1 STORAGE_IMAGE .has 0 of 0 left"):
            pool.allocate(both)
        pool.allocate(buffers)
        with pytest.raises(VulkanError, match="OUT_OF_POOL_MEMORY.*2 STORAGE_BUFFER .has 1 of 3 left"):
            pool.allocate(buffers)
        pool.reset()
        pool.allocate(buffers)
        pool.allocate(one)
        with pytest.raises(VulkanError, match="all 2 sets are taken"):
            pool.allocate(empty)
