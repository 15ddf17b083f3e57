"""The validation layer is really on, and its messages really reach the test fixture."""

from vkgraph.runtime import debug_messages
from vkgraph.runtime._vk import vk


def test_validation_layer_reports_invalid_usage(device):
    assert device.validation
    start = len(debug_messages())
    # Invalid on purpose: a buffer with no usage flags (VUID-VkBufferCreateInfo-usage-requiredbitmask).
    info = vk.VkBufferCreateInfo(size=64, usage=0, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
    handle = vk.vkCreateBuffer(device.handle, info, None)
    vk.vkDestroyBuffer(device.handle, handle, None)
    new = debug_messages()[start:]
    assert any(m.severity == "error" and "usage" in m.text for m in new), new
    del debug_messages()[start:]  # consumed: this test expected them


def test_sync_validation_reports_a_missing_barrier(device, monkeypatch):
    """With VKGRAPH_SYNC_VALIDATION=1 (``make test-validation``) the layer checks hazards."""
    from vkgraph.runtime import Buffer, CommandPool, Device, Fence

    monkeypatch.setenv("VKGRAPH_SYNC_VALIDATION", "1")
    start = len(debug_messages())
    with Device(validation=True) as dev:
        assert dev.instance.sync_validation
        with Buffer(dev, 256) as a, Buffer(dev, 256) as b, CommandPool(dev) as pool, Fence(dev) as fence:
            (cmd,) = pool.allocate()
            cmd.begin(one_time=True)
            cmd.fill_buffer(a, 7)
            cmd.copy_buffer(a, b)  # reads what the fill wrote, with no barrier between: a hazard
            cmd.end()
            dev.submit([cmd], fence)
            fence.wait()
    new = debug_messages()[start:]
    assert any("SYNC-HAZARD-READ-AFTER-WRITE" in m.text for m in new), new
    del debug_messages()[start:]  # consumed: this test expected them
