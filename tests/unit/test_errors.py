import pytest

from vkgraph import errors
from vkgraph.runtime import _vk

needs_binding = pytest.mark.skipif(isinstance(_vk.vk, _vk._MissingLoader), reason="libvulkan.so.1 not loadable")


@needs_binding
@pytest.mark.parametrize(
    "cls,result,expected",
    [
        ("VkErrorOutOfDeviceMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY", errors.OutOfDeviceMemoryError),
        ("VkErrorOutOfHostMemory", "VK_ERROR_OUT_OF_HOST_MEMORY", errors.OutOfHostMemoryError),
        ("VkErrorDeviceLost", "VK_ERROR_DEVICE_LOST", errors.DeviceLostError),
        ("VkTimeout", "VK_TIMEOUT", errors.FenceTimeoutError),
        ("VkErrorLayerNotPresent", "VK_ERROR_LAYER_NOT_PRESENT", errors.FeatureNotPresentError),
        ("VkErrorExtensionNotPresent", "VK_ERROR_EXTENSION_NOT_PRESENT", errors.FeatureNotPresentError),
        ("VkErrorFragmentedPool", "VK_ERROR_FRAGMENTED_POOL", errors.VulkanError),
        ("VkNotReady", "VK_NOT_READY", errors.VulkanError),
        ("VkSuboptimalKhr", "VK_SUBOPTIMAL_KHR", errors.VulkanError),
    ],
)
def test_call_maps_binding_exceptions(cls, result, expected):
    def vkSomething(a, b):
        assert (a, b) == (1, 2)
        raise getattr(_vk.vk, cls)

    with pytest.raises(expected) as err:
        _vk.call(vkSomething, 1, 2, detail="while testing")
    e = err.value
    assert type(e) is expected
    assert (e.call, e.result) == ("vkSomething", result)
    assert str(e) == f"vkSomething failed: {result} (while testing)"
    assert isinstance(e, errors.VkGraphError)
    # a call reporting a missing feature is both a failed call and a missing feature
    assert isinstance(e, errors.UnsupportedFeatureError) == (expected is errors.FeatureNotPresentError)


@needs_binding
def test_every_binding_error_becomes_a_vulkan_error():
    for code, cls in _vk.vk.exception_codes.items():
        err = _vk.error_for("vkX", cls())
        assert isinstance(err, errors.VulkanError), cls
        assert err.result.startswith("VK_"), cls


@needs_binding
def test_missing_procedure_is_unsupported():
    def vkGetDeviceProcAddr():
        raise _vk.vk.ProcedureNotFoundError()

    with pytest.raises(errors.UnsupportedFeatureError, match="vkGetDeviceProcAddr failed: procedure not found"):
        _vk.call(vkGetDeviceProcAddr)


def test_call_passes_results_through():
    assert _vk.call(lambda a: a * 2, 21) == 42


def test_error_tree():
    # vkgraph's own checks of what a device lacks are not failed Vulkan calls
    assert not issubclass(errors.UnsupportedFeatureError, errors.VulkanError)
    e = errors.UnsupportedFeatureError("maxImageDimension3D", "tensor 'x' needs a 9000-texel texture")
    assert str(e) == "tensor 'x' needs a 9000-texel texture" and e.feature == "maxImageDimension3D"
    for cls in (errors.SafetensorsError, errors.GGUFError, errors.TokenizerError, errors.ConfigError):
        assert issubclass(cls, errors.VkGraphError) and issubclass(cls, ValueError)
    assert issubclass(errors.ModelNotFoundError, FileNotFoundError)
    assert issubclass(errors.OutOfDeviceMemoryError, MemoryError)
    assert issubclass(errors.FenceTimeoutError, TimeoutError)
    assert issubclass(errors.ConfigError, ValueError)
    e = errors.ConfigError("configs/x.toml", "prepack.threshold_nbytes", "must be >= 0, got -1")
    assert str(e) == "configs/x.toml: prepack.threshold_nbytes: must be >= 0, got -1"
    s = errors.ShaderCompileError("k.glsl", "ERROR: 0:3: 'x' : undeclared identifier\n", 2)
    assert "k.glsl" in str(s) and "undeclared identifier" in str(s) and s.returncode == 2


def test_missing_loader_fails_clearly():
    stub = _vk._MissingLoader("libvulkan.so.1: cannot open shared object file")
    with pytest.raises(errors.DeviceNotFoundError, match="install the system package libvulkan1"):
        stub.vkCreateInstance


def test_results_the_binding_cannot_raise_are_named():
    """The binding's table lacks some codes (it lists VK_ERROR_OUT_OF_POOL_MEMORY as +1000069000):
    it raises KeyError(code) for them, which becomes a VulkanError naming the call and the result."""

    def vkAllocateDescriptorSets():
        raise KeyError(-1000069000)

    with pytest.raises(errors.VulkanError, match="vkAllocateDescriptorSets failed: VK_ERROR_OUT_OF_POOL_MEMORY"):
        _vk.call(vkAllocateDescriptorSets)

    def vkOther():
        raise KeyError(-1234567)

    with pytest.raises(errors.VulkanError, match=r"vkOther failed: VkResult -1234567 \(while testing\)"):
        _vk.call(vkOther, detail="while testing")


@pytest.mark.parametrize("result,expected,name", [
    (-2, errors.OutOfDeviceMemoryError, "VK_ERROR_OUT_OF_DEVICE_MEMORY"),
    (-4, errors.DeviceLostError, "VK_ERROR_DEVICE_LOST"),
    (2, errors.FenceTimeoutError, "VK_TIMEOUT"),
    (-1000069000, errors.VulkanError, "VK_ERROR_OUT_OF_POOL_MEMORY"),
    (-1234567, errors.VulkanError, "VkResult -1234567"),
])
def test_check_names_a_raw_calls_result_as_call_does(result, expected, name):
    """_vk.check, for the hot paths that call the loader through cffi directly: VK_SUCCESS passes,
    any other VkResult raises the error call() raises for it, naming the call, the result and the
    detail."""
    _vk.check(0, "vkCreateBufferView")
    with pytest.raises(expected, match=f"vkCreateBufferView failed: {name} \\(texel view\\)") as err:
        _vk.check(result, "vkCreateBufferView", "texel view")
    assert type(err.value) is expected
