"""The vkgraph error tree (DESIGN.md §9).

Every failure vkgraph raises is a :class:`VkGraphError`. Vulkan call failures carry the name of
the call and of the ``VkResult``; out-of-memory errors are also :class:`MemoryError` and fence
timeouts also :class:`TimeoutError`, so generic handlers keep working.
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
    "DeviceNotFoundError",
    "CommandBufferStateError",
    "ShaderCompileError",
    "ConfigError",
    "PrepackMismatchError",
    "CacheFormatError",
    "MissingTensorError",
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
        super().__init__(f"{msg} ({detail})" if detail else msg)


class OutOfDeviceMemoryError(VulkanError, MemoryError):
    """``VK_ERROR_OUT_OF_DEVICE_MEMORY``, or an allocation beyond a configured budget."""


class OutOfHostMemoryError(VulkanError, MemoryError):
    """``VK_ERROR_OUT_OF_HOST_MEMORY``."""


class DeviceLostError(VulkanError):
    """``VK_ERROR_DEVICE_LOST``: the device (and everything on it) is unusable."""


class FenceTimeoutError(VulkanError, TimeoutError):
    """A fence (or semaphore) wait ran past its timeout. The GPU work may still be running."""


class UnsupportedFeatureError(VulkanError):
    """The device, driver or loader lacks a layer, extension, feature or function vkgraph needs."""


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
