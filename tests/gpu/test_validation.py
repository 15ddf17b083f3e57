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


def test_child_processes_validate_and_report_on_stderr(device, tmp_path):
    """Children of the GPU suite inherit VKGRAPH_VALIDATION=1, and what the layer reports in them
    reaches their stderr, where the parent finds it."""
    import subprocess
    import sys

    from vkgraph.runtime import reported_messages

    script = ("from vkgraph.runtime import Device\nfrom vkgraph.runtime._vk import vk\n"
              "with Device() as dev:\n"
              "    assert dev.validation\n"
              "    info = vk.VkBufferCreateInfo(size=64, usage=0, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)\n"
              "    vk.vkDestroyBuffer(dev.handle, vk.vkCreateBuffer(dev.handle, info, None), None)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert any("usage" in m for m in reported_messages(p.stderr) if m.startswith("vulkan [error]")), p.stderr[-2000:]
