"""Shader modules, pipeline layouts, compute pipelines (push and specialization constants) and
the VkPipelineCache with load/save."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..paths import atomic_write, user_cache_dir
from ._vk import call, error_for, ffi, lib, pinned, vk
from .descriptor import DescriptorSetLayout
from .device import Device
from .handle import VkObject

SPIRV_MAGIC = 0x07230203


class ShaderModule(VkObject):
    """A VkShaderModule from SPIR-V words."""

    def __init__(self, device: Device, spirv: bytes, name: str = ""):
        if len(spirv) < 20 or len(spirv) % 4 or struct.unpack_from("<I", spirv)[0] != SPIRV_MAGIC:
            raise ValueError(f"shader {name or '(unnamed)'}: not SPIR-V ({len(spirv)} bytes)")
        self.device = device
        self.name = name
        info = vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv)
        dev = device.handle
        self.handle = handle = call(vk.vkCreateShaderModule, dev, info, None, detail=f"shader {name}")
        self._own(device, lambda: vk.vkDestroyShaderModule(dev, handle, None))


class PipelineLayout(VkObject):
    """Descriptor set layouts plus one push-constant range for the compute stage."""

    def __init__(self, device: Device, set_layouts: Sequence[DescriptorSetLayout], push_constant_nbytes: int = 0):
        most = device.limits["maxPushConstantsSize"]
        if push_constant_nbytes % 4 or not 0 <= push_constant_nbytes <= most:
            raise ValueError(f"push constants of {push_constant_nbytes} bytes: must be a multiple of 4 and <= {most}")
        self.device = device
        self.set_layouts = tuple(set_layouts)
        self.push_constant_nbytes = push_constant_nbytes
        ranges = []
        if push_constant_nbytes:
            ranges.append(vk.VkPushConstantRange(
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push_constant_nbytes
            ))
        layouts = [s.handle for s in set_layouts]
        info = vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=len(layouts), pSetLayouts=layouts or None,
            pushConstantRangeCount=len(ranges), pPushConstantRanges=ranges or None,
        )
        dev = device.handle
        self.handle = handle = call(vk.vkCreatePipelineLayout, dev, info, None)
        self._own(device, lambda: vk.vkDestroyPipelineLayout(dev, handle, None))


def _pack_specialization(constants: Mapping[int, int | float | bool]) -> tuple[list[tuple[int, int, int]], bytes]:
    """(map entries as (constant_id, offset, size), data): bool -> VkBool32, float -> float32,
    int -> int32 (uint32 above 2**31 - 1)."""
    entries, data = [], bytearray()
    for constant_id, value in sorted(constants.items()):
        if isinstance(value, (bool, np.bool_)):
            raw = struct.pack("<I", 1 if value else 0)
        elif isinstance(value, (float, np.floating)):
            raw = struct.pack("<f", float(value))
        elif isinstance(value, (int, np.integer)):
            v = int(value)
            if not -(2**31) <= v < 2**32:
                raise ValueError(f"specialization constant {constant_id} = {v} does not fit in 32 bits")
            raw = struct.pack("<i" if v < 2**31 else "<I", v)
        else:
            raise TypeError(f"specialization constant {constant_id}: {type(value).__name__} is not bool, int or float")
        entries.append((constant_id, len(data), len(raw)))
        data += raw
    return entries, bytes(data)


class ComputePipeline(VkObject):
    """A compute pipeline. ``specialization`` maps constant_id -> value (e.g. the workgroup size
    through ``local_size_x_id``)."""

    def __init__(
        self,
        device: Device,
        layout: PipelineLayout,
        shader: ShaderModule,
        specialization: Mapping[int, int | float | bool] | None = None,
        *,
        cache: PipelineCache | None = None,
        entry_point: str = "main",
    ):
        self.device = device
        self.layout = layout
        self.specialization = dict(specialization or {})
        entries, data = _pack_specialization(self.specialization)
        # Every struct below stays referenced by a local until vkCreateComputePipelines returns:
        # the stage struct is copied by value into the create-info, and the entry-point string
        # and specialization data it points to live only as long as these Python objects.
        map_entries = [vk.VkSpecializationMapEntry(constantID=i, offset=o, size=s) for i, o, s in entries]
        dev = device.handle
        with pinned(data) as spec_data:
            spec_info = (
                vk.VkSpecializationInfo(mapEntryCount=len(map_entries), pMapEntries=map_entries,
                                        dataSize=len(data), pData=spec_data)
                if entries else None
            )
            stage = vk.VkPipelineShaderStageCreateInfo(
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=shader.handle, pName=entry_point,
                pSpecializationInfo=spec_info,
            )
            info = vk.VkComputePipelineCreateInfo(stage=stage, layout=layout.handle)
            handles = call(
                vk.vkCreateComputePipelines, dev, cache.handle if cache else None, 1, [info], None,
                detail=f"shader {shader.name}",
            )
        self.handle = handle = handles[0]
        self._own(device, lambda: vk.vkDestroyPipeline(dev, handle, None))


def default_cache_path(device: Device) -> Path:
    """The pipeline cache file of a device and driver in the user cache directory (config
    ``cache.pipeline_cache_path = ""``)."""
    p = device.physical
    return user_cache_dir() / "pipelines" / f"{p.vendor_id:04x}-{p.device_id:04x}-{p.pipeline_cache_uuid.hex()}.bin"


class PipelineCache(VkObject):
    """A VkPipelineCache, optionally seeded from bytes or a file written by :meth:`save`.

    Data from another device or driver (checked against the header's vendor ID, device ID and
    pipelineCacheUUID) or a damaged file is ignored with a warning: the cache starts empty.
    """

    HEADER = struct.Struct("<IIII16s")  # VkPipelineCacheHeaderVersionOne

    def __init__(self, device: Device, initial_data: bytes = b"", *, source: str = "pipeline cache data"):
        self.device = device
        reason = self._foreign_reason(initial_data) if initial_data else None
        if reason:
            warnings.warn(f"{source}: ignored ({reason}); starting with an empty pipeline cache", stacklevel=2)
            initial_data = b""
        elif initial_data and len(initial_data) == self.HEADER.unpack_from(initial_data)[0]:
            # A header and no pipelines (what a driver that keeps none writes, as SwiftShader):
            # nothing to seed. SwiftShader would keep the bytes after a header of its own, so the
            # file would grow by a header on every save and load.
            initial_data = b""
        dev = device.handle
        with pinned(initial_data) as keep:
            info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(initial_data), pInitialData=keep)
            self.handle = handle = call(vk.vkCreatePipelineCache, dev, info, None)
        self._own(device, lambda: vk.vkDestroyPipelineCache(dev, handle, None))

    def _foreign_reason(self, data: bytes) -> str | None:
        if len(data) < self.HEADER.size:
            return f"{len(data)} bytes is shorter than a pipeline cache header"
        header_size, version, vendor, device_id, uuid = self.HEADER.unpack_from(data)
        phys = self.device.physical
        if version != 1 or header_size < self.HEADER.size or header_size > len(data):
            return f"unknown header (version {version}, size {header_size})"
        if (vendor, device_id, uuid) != (phys.vendor_id, phys.device_id, phys.pipeline_cache_uuid):
            return f"written for another device or driver (vendor {vendor:#x}, device {device_id:#x})"
        return None

    @classmethod
    def load(cls, device: Device, path: str | Path) -> PipelineCache:
        """A cache seeded from ``path`` if it exists and fits this device; empty otherwise."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        return cls(device, data, source=str(path))

    def data(self) -> bytes:
        """The cache contents (vkGetPipelineCacheData; the binding has no wrapper for it)."""
        size = ffi.new("size_t*")
        self._check(lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, ffi.NULL))
        buf = ffi.new("char[]", size[0])
        self._check(lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, buf))
        return ffi.buffer(buf, size[0])[:]

    @staticmethod
    def _check(result: int) -> None:
        if result != 0:
            raise error_for("vkGetPipelineCacheData", vk.exception_codes[result]())

    def save(self, path: str | Path) -> int:
        """Write the cache to ``path`` atomically; returns the number of bytes written."""
        data = self.data()
        atomic_write(Path(path), data)
        return len(data)
