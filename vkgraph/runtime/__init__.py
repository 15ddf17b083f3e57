"""Layer 1: thin, owned wrappers over Vulkan objects. Only this package imports the binding."""

from .command import Access, CommandBuffer, CommandBufferState, CommandPool, Stage
from .descriptor import DescriptorPool, DescriptorSet, DescriptorSetLayout, DescriptorType
from .device import Device, select_physical_device
from .handle import VkObject, collected_objects, live_objects
from .image import Image3D, storage_image_supported
from .instance import DebugMessage, Instance, PhysicalDevice, debug_messages, loader_version, reported_messages
from .memory import (
    BlockBuffer,
    Buffer,
    BufferUsage,
    ImportedBuffer,
    MemoryBlock,
    MemoryKind,
    TexelView,
    allocate_block,
    select_memory_type,
)
from .pipeline import ComputePipeline, PipelineCache, PipelineLayout, ShaderModule
from .query import TimestampQueryPool, host_clock_offset_ns
from .submit import OneShot, submit_and_wait
from .sync import DEFAULT_TIMEOUT_S, Fence, Semaphore

__all__ = [
    "Access",
    "BlockBuffer",
    "Buffer",
    "BufferUsage",
    "CommandBuffer",
    "CommandBufferState",
    "CommandPool",
    "ComputePipeline",
    "DEFAULT_TIMEOUT_S",
    "DebugMessage",
    "DescriptorPool",
    "DescriptorSet",
    "DescriptorSetLayout",
    "DescriptorType",
    "Device",
    "Fence",
    "Image3D",
    "ImportedBuffer",
    "Instance",
    "MemoryBlock",
    "MemoryKind",
    "OneShot",
    "PhysicalDevice",
    "PipelineCache",
    "PipelineLayout",
    "Semaphore",
    "TexelView",
    "ShaderModule",
    "Stage",
    "TimestampQueryPool",
    "VkObject",
    "allocate_block",
    "collected_objects",
    "debug_messages",
    "host_clock_offset_ns",
    "live_objects",
    "loader_version",
    "reported_messages",
    "select_memory_type",
    "select_physical_device",
    "storage_image_supported",
    "submit_and_wait",
]
