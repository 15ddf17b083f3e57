"""3-D storage images (ET-VK's texture storage): RGBA32F texels, device-local memory, one view.

vkgraph keeps every storage image in ``VK_IMAGE_LAYOUT_GENERAL`` (the layout storage images
need); a new image is moved there from ``UNDEFINED`` by the first command buffer that uses it
(:meth:`CommandBuffer.prepare_image`).
"""

from __future__ import annotations

from ..errors import UnsupportedFeatureError
from ._vk import call, vk
from .device import Device
from .handle import VkObject
from .memory import MemoryKind, select_memory_type

RGBA32F = 109  # VK_FORMAT_R32G32B32A32_SFLOAT
_STORAGE_IMAGE_FEATURE = 0x2  # VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT
LAYOUT_UNDEFINED, LAYOUT_GENERAL = 0, 1


def storage_image_supported(device: Device) -> bool:
    props = call(vk.vkGetPhysicalDeviceFormatProperties, device.physical.handle, RGBA32F)
    return bool(props.optimalTilingFeatures & _STORAGE_IMAGE_FEATURE)


class Image3D(VkObject):
    """A 3-D RGBA32F storage image of ``extent`` = (width, height, depth) texels."""

    def __init__(self, device: Device, extent: tuple[int, int, int], *, name: str = ""):
        w, h, d = (int(e) for e in extent)
        what = f"image {name!r}" if name else "image"
        most = device.limits["maxImageDimension3D"]
        if min(w, h, d) < 1 or max(w, h, d) > most:
            raise UnsupportedFeatureError("maxImageDimension3D",
                                          f"{what}: extent {(w, h, d)} outside 1..{most} (maxImageDimension3D)")
        if not storage_image_supported(device):
            raise UnsupportedFeatureError("VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT",
                                          f"{device.name} cannot use R32G32B32A32_SFLOAT as a storage image")
        self.device = device
        self.extent = (w, h, d)
        self.name = name
        self.layout = LAYOUT_UNDEFINED
        dev = device.handle
        info = vk.VkImageCreateInfo(
            imageType=vk.VK_IMAGE_TYPE_3D, format=RGBA32F, extent=vk.VkExtent3D(width=w, height=h, depth=d),
            mipLevels=1, arrayLayers=1, samples=vk.VK_SAMPLE_COUNT_1_BIT, tiling=vk.VK_IMAGE_TILING_OPTIMAL,
            usage=vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE, initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED,
        )
        handle = call(vk.vkCreateImage, dev, info, None, detail=what)
        memory = view = None
        try:
            req = call(vk.vkGetImageMemoryRequirements, dev, handle)
            mtype = select_memory_type(device.physical, req.memoryTypeBits, MemoryKind.DEVICE)
            device.reserve_memory(req.size, what)
            alloc = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mtype.index)
            memory = call(vk.vkAllocateMemory, dev, alloc, None, detail=what)
            call(vk.vkBindImageMemory, dev, handle, memory, 0)
            view_info = vk.VkImageViewCreateInfo(
                image=handle, viewType=vk.VK_IMAGE_VIEW_TYPE_3D, format=RGBA32F,
                subresourceRange=vk.VkImageSubresourceRange(
                    aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1, baseArrayLayer=0, layerCount=1),
            )
            view = call(vk.vkCreateImageView, dev, view_info, None, detail=what)
        except BaseException:
            if view is not None:
                vk.vkDestroyImageView(dev, view, None)
            vk.vkDestroyImage(dev, handle, None)
            if memory is not None:
                vk.vkFreeMemory(dev, memory, None)
            raise
        self.handle, self.memory, self.view = handle, memory, view
        self.alloc_nbytes = req.size
        device.account_memory(req.size)
        nbytes = req.size

        def release(dev=dev, handle=handle, memory=memory, view=view) -> None:
            device.account_memory(-nbytes)
            vk.vkDestroyImageView(dev, view, None)
            vk.vkDestroyImage(dev, handle, None)
            vk.vkFreeMemory(dev, memory, None)

        self._own(device, release)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Image3D{label} {self.extent}{'' if self.alive else ' destroyed'}>"
