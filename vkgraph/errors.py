"""The one vkgraph error tree (ARCHITECTURE.md §6).

Every failure vkgraph raises is a :class:`VkGraphError`. Vulkan call failures carry the name of
the call and of the ``VkResult``; out-of-memory errors are also :class:`MemoryError` and fence
timeouts also :class:`TimeoutError`, so generic handlers keep working. Errors about files and
inputs name the file, tensor or key, and are also :class:`ValueError` (or
:class:`FileNotFoundError`, :class:`KeyError`) where that is what they are.
"""

from __future__ import annotations

__all__ = [
    "VkGraphError",
    "VulkanError",
    "OutOfDeviceMemoryError",
    "OutOfHostMemoryError",
    "DeviceLostError",
    "FenceTimeoutError",
    "UnsupportedFeatureError",
    "FeatureNotPresentError",
    "DeviceNotFoundError",
    "CommandBufferStateError",
    "ShaderCompileError",
    "ConfigError",
    "PrepackMismatchError",
    "CacheFormatError",
    "MissingTensorError",
    "ModelNotFoundError",
    "SafetensorsError",
    "GGUFError",
    "TokenizerError",
]


class VkGraphError(Exception):
    """Root of every error vkgraph raises."""


class VulkanError(VkGraphError):
    """A Vulkan call returned a failure code.

    ``call`` is the Vulkan function (``"vkCreateBuffer"``), ``result`` the ``VkResult`` name
    (``"VK_ERROR_OUT_OF_DEVICE_MEMORY"``).
    """

    def __init__(self, call: str, result: str, detail: str = ""):
        self.call = call
        self.result = result
        self.detail = detail
        msg = f"{call} failed: {result}"
        # Not super(): in FeatureNotPresentError the next class is UnsupportedFeatureError.
        Exception.__init__(self, f"{msg} ({detail})" if detail else msg)


class OutOfDeviceMemoryError(VulkanError, MemoryError):
    """``VK_ERROR_OUT_OF_DEVICE_MEMORY``, or an allocation beyond a configured budget: then
    ``budget`` is true (refused by ``device.max_memory_nbytes`` before Vulkan was called)."""

    budget = False


class OutOfHostMemoryError(VulkanError, MemoryError):
    """``VK_ERROR_OUT_OF_HOST_MEMORY``."""


class DeviceLostError(VulkanError):
    """``VK_ERROR_DEVICE_LOST``: the device (and everything on it) is unusable."""


class FenceTimeoutError(VulkanError, TimeoutError):
    """A fence (or semaphore) wait ran past its timeout. The GPU work may still be running."""


class UnsupportedFeatureError(VkGraphError):
    """The device, driver or loader lacks something vkgraph needs: a layer, an extension, a
    feature, a limit large enough. ``feature`` names it; the message says what needed it."""

    def __init__(self, feature: str, detail: str):
        self.feature = feature
        self.detail = detail
        super().__init__(detail)


class FeatureNotPresentError(VulkanError, UnsupportedFeatureError):
    """A Vulkan call reported a missing layer, extension, feature, format or function (both a
    failed call and a missing feature)."""

    def __init__(self, call: str, result: str, detail: str = ""):
        VulkanError.__init__(self, call, result, detail)
        self.feature = result


class DeviceNotFoundError(VkGraphError):
    """No Vulkan device exists, or none matches the requested name or ICD file."""


class CommandBufferStateError(VkGraphError):
    """A command buffer was used in a state that does not allow it (e.g. recording while pending)."""


class ShaderCompileError(VkGraphError):
    """``glslangValidator`` failed (or is missing). ``stderr`` holds its message."""

    def __init__(self, shader: str, stderr: str, returncode: int | None = None):
        self.shader = shader
        self.stderr = stderr
        self.returncode = returncode
        super().__init__(f"cannot compile shader {shader}:\n{stderr.strip()}")


class ConfigError(VkGraphError, ValueError):
    """A config file or value is invalid. Names the file, the key and the reason."""

    def __init__(self, file: str | None, key: str, reason: str):
        self.file = file
        self.key = key
        self.reason = reason
        where = f"{file}: " if file else ""
        super().__init__(f"{where}{key}: {reason}")


class PrepackMismatchError(VkGraphError, ValueError):
    """A prepack node's source and destination disagree (dims, element size, byte count)."""


class MissingTensorError(VkGraphError, KeyError):
    """A weights file has no tensor of the name a model needs; names the file and the tensor."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CacheFormatError(VkGraphError):
    """A cache file is corrupt, truncated, foreign or of another version."""


class ModelNotFoundError(VkGraphError, FileNotFoundError):
    """A model's files are not where they were looked for."""


class SafetensorsError(VkGraphError, ValueError):
    """A safetensors file is malformed; the message names the file and what is wrong."""


class GGUFError(VkGraphError, ValueError):
    """A GGUF file is malformed or uses something unsupported; names the file and the reason."""


class TokenizerError(VkGraphError, ValueError):
    """A tokenizer file or its metadata cannot be used; names the source and the reason."""


class PteFormatError(VkGraphError, ValueError):
    """An ExecuTorch program (.pte) or a delegate blob in it is malformed, truncated or of a
    version vkgraph does not read; names the file and what is wrong."""


class UnsupportedOpError(VkGraphError, NotImplementedError):
    """A program uses an op (or an op's argument) vkgraph does not implement; names the file,
    the delegate or kernel call, the node and the op. Raised while building, before any GPU work."""
