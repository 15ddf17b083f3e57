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
