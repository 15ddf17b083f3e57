"""Descriptor set layouts, descriptor pools and descriptor sets for compute shaders."""

from __future__ import annotations

import enum
from collections import Counter
from typing import TYPE_CHECKING, Mapping, Sequence

from ..errors import VulkanError
from ._vk import call, check, ffi, lib, vk
from .device import Device
from .handle import VkObject
from .memory import Buffer, TexelView

if TYPE_CHECKING:
    from .image import Image3D


class DescriptorType(enum.IntEnum):
    """VkDescriptorType values vkgraph binds (spec values)."""

    COMBINED_IMAGE_SAMPLER = 1
    STORAGE_IMAGE = 3
    UNIFORM_TEXEL_BUFFER = 4
    UNIFORM_BUFFER = 6
    STORAGE_BUFFER = 7


class DescriptorSetLayout(VkObject):
    """Binding ``i`` has type ``bindings[i]``, visible to the compute stage."""

    def __init__(self, device: Device, bindings: Sequence[DescriptorType]):
        self.device = device
        self.bindings = tuple(DescriptorType(b) for b in bindings)
        entries = [
            vk.VkDescriptorSetLayoutBinding(
                binding=i, descriptorType=int(t), descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT
            )
            for i, t in enumerate(self.bindings)
        ]
        info = vk.VkDescriptorSetLayoutCreateInfo(pBindings=entries or None, bindingCount=len(entries))
        dev = device.handle
        self.handle = handle = call(vk.vkCreateDescriptorSetLayout, dev, info, None)
        self._own(device, lambda: vk.vkDestroyDescriptorSetLayout(dev, handle, None))


class DescriptorPool(VkObject):
    """A VkDescriptorPool. Sets are freed all at once by ``reset()`` or ``destroy()``.

    It keeps count of what its sets took and refuses a set beyond ``max_sets`` or the declared
    descriptor counts itself, as strict drivers (SwiftShader) do with
    VK_ERROR_OUT_OF_POOL_MEMORY and lenient ones (lavapipe) may not: a pool sized too small
    fails on every device."""

    def __init__(self, device: Device, max_sets: int, descriptor_counts: Mapping[DescriptorType, int]):
        if max_sets <= 0:
            raise ValueError(f"a descriptor pool needs max_sets > 0, got {max_sets}")
        self.device = device
        self.max_sets = max_sets
        self.capacity = Counter({DescriptorType(t): n for t, n in descriptor_counts.items() if n > 0})
        self.used: Counter[DescriptorType] = Counter()
        self.sets = 0
        sizes = [
            vk.VkDescriptorPoolSize(type=int(t), descriptorCount=n) for t, n in descriptor_counts.items() if n > 0
        ]
        info = vk.VkDescriptorPoolCreateInfo(maxSets=max_sets, pPoolSizes=sizes or None, poolSizeCount=len(sizes))
        dev = device.handle
        self.handle = handle = call(vk.vkCreateDescriptorPool, dev, info, None)
        self._own(device, lambda: vk.vkDestroyDescriptorPool(dev, handle, None))

    @classmethod
    def for_layouts(cls, device: Device, layouts: Sequence[DescriptorSetLayout]) -> DescriptorPool:
        """A pool exactly big enough for one set of each of ``layouts``."""
        counts = Counter(t for layout in layouts for t in layout.bindings)
        return cls(device, max(1, len(layouts)), counts)

    def allocate(self, layout: DescriptorSetLayout) -> DescriptorSet:
        need = Counter(layout.bindings)
        short = [f"{n} {t.name} (has {self.capacity[t] - self.used[t]} of {self.capacity[t]} left)"
                 for t, n in need.items() if self.used[t] + n > self.capacity[t]]
        if self.sets >= self.max_sets or short:
            why = ", ".join(short) if short else f"all {self.max_sets} sets are taken"
            raise VulkanError("vkAllocateDescriptorSets", "VK_ERROR_OUT_OF_POOL_MEMORY",
                              f"descriptor pool too small: a set needs {why}")
        layouts = ffi.new("VkDescriptorSetLayout[1]", [layout.handle])  # alive until the call returns
        info = ffi.new("VkDescriptorSetAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "descriptorPool": self.handle,
            "descriptorSetCount": 1, "pSetLayouts": layouts})
        out = ffi.new("VkDescriptorSet*")
        check(lib.vkAllocateDescriptorSets(self.device.handle, info, out), "vkAllocateDescriptorSets",
              f"pool of {self.max_sets} sets")
        self.used += need
        self.sets += 1
        return DescriptorSet(self, layout, out[0])

    def reset(self) -> None:
        """Free every set allocated from this pool (none may be in use by pending work)."""
        call(vk.vkResetDescriptorPool, self.device.handle, self.handle, 0)
        self.used.clear()
        self.sets = 0


class DescriptorSet:
    """A descriptor set; owned by its pool (not a separate Vulkan object to destroy)."""

    def __init__(self, pool: DescriptorPool, layout: DescriptorSetLayout, handle):
        self.pool = pool
        self.layout = layout
        self.handle = handle

    def bind(self, resources: Mapping[int, Buffer | tuple[Buffer, int, int] | Image3D | TexelView]) -> None:
        """Buffers (whole or ``(buffer, offset, nbytes)`` windows), storage images and texel
        views, by binding, in one vkUpdateDescriptorSets (its structs made by ``ffi.new``: a
        packing node binds a set each, see _vk.check).

        Buffer ranges are explicit (the binding cannot pass VK_WHOLE_SIZE) and checked against
        ``maxStorageBufferRange`` / ``maxUniformBufferRange``."""
        from .image import Image3D

        writes = ffi.new("VkWriteDescriptorSet[]", len(resources))
        keep = []  # the infos and handle arrays the writes point at, alive until the update returns
        for w, (binding, r) in zip(writes, resources.items()):
            if binding >= len(self.layout.bindings):
                raise ValueError(f"binding {binding} is not in the layout ({len(self.layout.bindings)} bindings)")
            dtype = self.layout.bindings[binding]
            w.sType, w.dstSet, w.dstBinding, w.descriptorCount = (
                vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, self.handle, binding, 1)
            w.descriptorType = int(dtype)
            if isinstance(r, TexelView):
                if dtype is not DescriptorType.UNIFORM_TEXEL_BUFFER:
                    raise ValueError(f"binding {binding} is not a uniform texel buffer in the layout")
                keep.append(ffi.new("VkBufferView[1]", [r.handle]))
                w.pTexelBufferView = keep[-1]
            elif isinstance(r, Image3D):
                if dtype is not DescriptorType.STORAGE_IMAGE:
                    raise ValueError(f"binding {binding} is not a storage image in this layout")
                keep.append(ffi.new("VkDescriptorImageInfo*", {"imageView": r.view,
                                                               "imageLayout": vk.VK_IMAGE_LAYOUT_GENERAL}))
                w.pImageInfo = keep[-1]
            else:
                buf, offset, nbytes = r if isinstance(r, tuple) else (r, 0, r.nbytes)
                self._check_buffer_range(binding, dtype, buf, offset, nbytes)
                keep.append(ffi.new("VkDescriptorBufferInfo*", {"buffer": buf.handle, "offset": offset,
                                                                "range": nbytes}))
                w.pBufferInfo = keep[-1]
        if resources:
            lib.vkUpdateDescriptorSets(self.pool.device.handle, len(resources), writes, 0, ffi.NULL)

    def bind_buffers(self, buffers: Mapping[int, Buffer | tuple[Buffer, int, int]]) -> None:
        """Point bindings at buffers: ``{binding: buffer}`` or ``{binding: (buffer, offset, nbytes)}``."""
        self.bind(buffers)

    def _check_buffer_range(self, binding: int, dtype: DescriptorType, buf: Buffer, offset: int, nbytes: int) -> None:
        if dtype not in (DescriptorType.STORAGE_BUFFER, DescriptorType.UNIFORM_BUFFER):
            raise ValueError(f"binding {binding} is a {dtype.name}, not a buffer")
        limits = self.pool.device.limits
        most = limits["maxStorageBufferRange" if dtype is DescriptorType.STORAGE_BUFFER else "maxUniformBufferRange"]
        if nbytes > most:
            raise ValueError(
                f"binding {binding}: {buf!r} range of {nbytes} bytes exceeds the device's {most}-byte "
                f"limit for a {dtype.name.lower()}; split the tensor or use texture storage"
            )
        if offset < 0 or nbytes <= 0 or offset + nbytes > buf.nbytes:
            raise ValueError(f"binding {binding}: range [{offset}, {offset + nbytes}) is outside {buf!r}")
