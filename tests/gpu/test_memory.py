import numpy as np
import pytest

from vkgraph.errors import OutOfDeviceMemoryError
from vkgraph.runtime import Buffer, CommandPool, Fence, MemoryKind, OneShot, allocate_block, live_objects


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint16, np.float64])
@pytest.mark.parametrize("count", [1, 3, 4097])
def test_mapped_round_trip(device, dtype, count):
    rng = np.random.default_rng(count)
    data = (rng.standard_normal(count) * 100).astype(dtype)
    with Buffer(device, data.nbytes, MemoryKind.UPLOAD) as buf:
        buf.write(data)
        np.testing.assert_array_equal(buf.read(dtype), data)
        view = buf.view(dtype)
        view[0] = data[-1]
        assert buf.read(dtype)[0] == data[-1]


def test_copy_round_trip_through_device_memory(device):
    """upload -> device-local -> readback with copy commands: the discrete-GPU path."""
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size=1_000_001, dtype=np.uint8)
    with (
        Buffer(device, data.nbytes, MemoryKind.UPLOAD) as up,
        Buffer(device, data.nbytes, MemoryKind.DEVICE) as mid,
        Buffer(device, data.nbytes + 16, MemoryKind.READBACK) as down,
        CommandPool(device) as pool,
        Fence(device) as fence,
    ):
        up.write(data)
        (cmd,) = pool.allocate()
        cmd.begin()
        cmd.copy_buffer(up, mid)
        cmd.compute_barrier()
        cmd.fill_buffer(down, 0xDEADBEEF, 16)
        cmd.compute_barrier()
        cmd.copy_buffer(mid, down, dst_offset=16)
        cmd.host_read_barrier()
        cmd.end()
        device.submit([cmd], fence)
        fence.wait()
        out = down.read()
        np.testing.assert_array_equal(out[16:], data)
        assert out[:16].view(np.uint32).tolist() == [0xDEADBEEF] * 4


def test_device_buffer_accounting(device):
    before = device.allocated_nbytes
    with Buffer(device, 1 << 20) as b:
        assert device.allocated_nbytes == before + b.alloc_nbytes
        assert device.peak_allocated_nbytes >= device.allocated_nbytes
    assert device.allocated_nbytes == before


def test_zero_size_is_rejected(device):
    with pytest.raises(ValueError, match="'w'.*size must be positive"):
        Buffer(device, 0, name="w")


def test_view_out_of_range(device):
    with Buffer(device, 64, MemoryKind.UPLOAD) as b:
        with pytest.raises(ValueError, match="outside"):
            b.view(np.float32, 17)
        with pytest.raises(ValueError, match="outside"):
            b.write(np.zeros(65, np.uint8))


def test_destroyed_buffer_cannot_be_read(device):
    b = Buffer(device, 64, MemoryKind.UPLOAD)
    b.destroy()
    b.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        b.read()


@pytest.mark.parametrize("nbytes", [1 << 40, "heap+1"])
def test_out_of_device_memory_names_the_buffer_and_leaks_nothing(device, nbytes):
    if nbytes == "heap+1":
        nbytes = max(h.size for h in device.physical.memory_heaps) + 1
    before, allocated = live_objects(), device.allocated_nbytes
    with pytest.raises(OutOfDeviceMemoryError) as err:
        Buffer(device, nbytes, name="huge.weight")
    assert isinstance(err.value, MemoryError)
    assert "huge.weight" in str(err.value) and str(nbytes) in str(err.value)
    assert err.value.call in ("vkCreateBuffer", "vkAllocateMemory")
    assert err.value.result == "VK_ERROR_OUT_OF_DEVICE_MEMORY"
    assert live_objects() == before and device.allocated_nbytes == allocated


@pytest.mark.parametrize("advice", [{}, {"huge_pages": True}, {"populate": True}])
def test_memory_block_holds_buffers_at_aligned_offsets(device, advice):
    """One allocation, the buffers at non-overlapping aligned offsets in it, each reading back
    its own bytes (through copies on a device whose memory the host cannot see); the block is
    counted once and destroys its buffers with it. Advised as huge pages, populated or neither,
    alike."""
    sizes = [(1000, "a"), (4, "b"), (65537, "c"), (3 << 20, "d")]
    rng = np.random.default_rng(21)
    data = [rng.integers(0, 256, n, dtype=np.uint8) for n, _ in sizes]
    before, allocated = live_objects(), device.allocated_nbytes
    block, bufs = allocate_block(device, sizes, **advice)
    try:
        assert device.allocated_nbytes == allocated + block.nbytes
        assert len({b.memory for b in bufs}) == 1 and [b.name for b in bufs] == ["a", "b", "c", "d"]
        ends = [0] + [b.offset + b.nbytes for b in bufs]
        assert all(b.offset >= end for b, end in zip(bufs, ends)) and ends[-1] <= block.nbytes
        for b, d in zip(bufs, data):
            with Buffer(device, d.nbytes, MemoryKind.UPLOAD) as up, OneShot(device) as cmd:
                up.write(d)
                cmd.copy_buffer(up, b, d.nbytes)
        for b, d in zip(bufs, data):
            with Buffer(device, d.nbytes, MemoryKind.READBACK) as down:
                with OneShot(device) as cmd:
                    cmd.copy_buffer(b, down, d.nbytes)
                    cmd.host_read_barrier()
                np.testing.assert_array_equal(down.read(), d)
                if b.host_visible:
                    np.testing.assert_array_equal(b.read(), d)
        bufs[1].destroy()
        assert block.in_use and device.allocated_nbytes == allocated + block.nbytes
    finally:
        block.destroy()
    assert not any(b.alive for b in bufs)
    assert live_objects() == before and device.allocated_nbytes == allocated


def _resident_pages(view: np.ndarray) -> np.ndarray:
    """mincore() of the whole pages inside ``view``: 1 for each page in memory."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = -(-view.ctypes.data // page) * page
    count = (view.ctypes.data + view.nbytes - start) // page
    vec = np.zeros(count, np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(count * page), vec.ctypes.data_as(ctypes.c_void_p)) == 0
    return vec & 1


def test_a_populated_block_of_a_cpu_renderer_has_its_pages_before_anything_writes_them(device):
    """populate=True (staged loads' blocks of packed weights: graph/scheduler.py) makes every page
    of a CPU renderer's block present at allocation, so a packing shader stores into present pages.
    Its memory then works as any: written through the mapping, read back."""
    if not device.is_cpu:
        pytest.skip("a CPU renderer's device memory is the process's; a GPU's is not populated")
    # above glibc's largest mmap threshold (32 MiB): fresh pages, none present unless populated
    block, (buf,) = allocate_block(device, [(48 << 20, "w")], populate=True)
    with block:
        view = buf.view()
        assert _resident_pages(view).all()
        data = np.random.default_rng(5).integers(0, 256, view.nbytes, dtype=np.uint8)
        buf.write(data)
        np.testing.assert_array_equal(buf.read(), data)


def test_memory_block_budget_names_the_buffer_that_does_not_fit(device):
    before, allocated = live_objects(), device.allocated_nbytes
    device.max_memory_nbytes = allocated + (3 << 20)
    try:
        with pytest.raises(OutOfDeviceMemoryError, match=r"buffer 'w2' of 2097152 bytes does not fit: \d+ bytes are "
                                                         r"allocated and \d+ more are placed before it in its memory "
                                                         r"block, the budget"):
            allocate_block(device, [(1 << 20, "w0"), (1 << 20, "w1"), (2 << 20, "w2"), (4, "w3")])
    finally:
        device.max_memory_nbytes = 0
    assert live_objects() == before and device.allocated_nbytes == allocated
