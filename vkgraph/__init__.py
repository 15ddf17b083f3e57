"""vkgraph: a Python re-creation of the ExecuTorch Vulkan backend's graph runtime, built around
how models load (prepacking constant weights in staged command-buffer submissions)."""

from .config import GraphConfig, load_config
from .errors import (
    CacheFormatError,
    CommandBufferStateError,
    ConfigError,
    DeviceLostError,
    DeviceNotFoundError,
    FenceTimeoutError,
    OutOfDeviceMemoryError,
    OutOfHostMemoryError,
    PrepackMismatchError,
    ShaderCompileError,
    UnsupportedFeatureError,
    VkGraphError,
    VulkanError,
)

__version__ = "0.1.0"

__all__ = [
    "CacheFormatError",
    "CommandBufferStateError",
    "ConfigError",
    "DeviceLostError",
    "DeviceNotFoundError",
    "FenceTimeoutError",
    "GraphConfig",
    "OutOfDeviceMemoryError",
    "OutOfHostMemoryError",
    "PrepackMismatchError",
    "ShaderCompileError",
    "UnsupportedFeatureError",
    "VkGraphError",
    "VulkanError",
    "__version__",
    "load_config",
]
