"""vkgraph: a Python re-creation of the ExecuTorch Vulkan backend's graph runtime, built around
how models load (prepacking constant weights in staged command-buffer submissions)."""

from . import ops
from .config import GraphConfig, load_config
from .errors import (
    CacheFormatError,
    CommandBufferStateError,
    ConfigError,
    DeviceLostError,
    DeviceNotFoundError,
    FeatureNotPresentError,
    FenceTimeoutError,
    GGUFError,
    MissingTensorError,
    ModelNotFoundError,
    OutOfDeviceMemoryError,
    OutOfHostMemoryError,
    PrepackMismatchError,
    PteFormatError,
    SafetensorsError,
    ShaderCompileError,
    TokenizerError,
    UnsupportedFeatureError,
    UnsupportedOpError,
    VkGraphError,
    VulkanError,
)
from .graph import ComputeGraph, LoadReport
from .pte import Program, load_program

__version__ = "0.1.0"

__all__ = [
    "CacheFormatError",
    "CommandBufferStateError",
    "ComputeGraph",
    "ConfigError",
    "DeviceLostError",
    "DeviceNotFoundError",
    "FeatureNotPresentError",
    "FenceTimeoutError",
    "GGUFError",
    "GraphConfig",
    "LoadReport",
    "MissingTensorError",
    "ModelNotFoundError",
    "OutOfDeviceMemoryError",
    "OutOfHostMemoryError",
    "PrepackMismatchError",
    "Program",
    "PteFormatError",
    "SafetensorsError",
    "ShaderCompileError",
    "TokenizerError",
    "UnsupportedFeatureError",
    "UnsupportedOpError",
    "VkGraphError",
    "VulkanError",
    "__version__",
    "load_config",
    "load_program",
    "ops",
]
