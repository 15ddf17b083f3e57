"""Command pools and command buffers with an explicit state (Vulkan's command buffer lifecycle).

A command buffer moves INITIAL -> RECORDING (``begin``) -> EXECUTABLE (``end``) -> PENDING
(``Device.submit``) -> EXECUTABLE again once its fence signalled (INVALID instead for a
one-time-submit buffer, which must be re-recorded). Using it in any other state raises
:class:`CommandBufferStateError` instead of handing the driver undefined behaviour.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import CommandBufferStateError
from ._vk import call, ffi, lib, pinned, vk
from .device import Device
from .handle import VkObject
from .sync import DEFAULT_TIMEOUT_S, Fence

from .image import LAYOUT_GENERAL

if TYPE_CHECKING:
    from .descriptor import DescriptorSet
    from .image import Image3D
    from .memory import Buffer
    from .pipeline import ComputePipeline, PipelineLayout
    from .query import TimestampQueryPool


class Stage(enum.IntFlag):
    """VkPipelineStageFlagBits that compute work uses (spec values)."""

    TOP_OF_PIPE = 0x1
    COMPUTE = 0x800
    TRANSFER = 0x1000
    BOTTOM_OF_PIPE = 0x2000
    HOST = 0x4000


class Access(enum.IntFlag):
    """VkAccessFlagBits that compute work uses (spec values)."""

    NONE = 0
    SHADER_READ = 0x20
    SHADER_WRITE = 0x40
    TRANSFER_READ = 0x800
    TRANSFER_WRITE = 0x1000
    HOST_READ = 0x2000
    HOST_WRITE = 0x4000


class CommandBufferState(enum.Enum):
    INITIAL = "initial"
    RECORDING = "recording"
    EXECUTABLE = "executable"
    PENDING = "pending"
    INVALID = "invalid"


class CommandPool(VkObject):
    """A VkCommandPool on the device's compute queue family. Its buffers can be reset one by one."""

    def __init__(self, device: Device, *, transient: bool = False):
        self.device = device
        flags = vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT
        if transient:
            flags |= vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT
        info = vk.VkCommandPoolCreateInfo(flags=flags, queueFamilyIndex=device.queue_family_index)
        dev = device.handle
        self.handle = handle = call(vk.vkCreateCommandPool, dev, info, None)
        self._own(device, lambda: vk.vkDestroyCommandPool(dev, handle, None))

    def allocate(self, count: int = 1) -> list[CommandBuffer]:
        """``count`` new primary command buffers in the INITIAL state."""
        info = vk.VkCommandBufferAllocateInfo(
            commandPool=self.handle, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=count
        )
        handles = call(vk.vkAllocateCommandBuffers, self.device.handle, info)
        return [CommandBuffer(self, handles[i]) for i in range(count)]


class CommandBuffer(VkObject):
    """A primary VkCommandBuffer. Allocate through :meth:`CommandPool.allocate`."""

    def __init__(self, pool: CommandPool, handle: Any):
        self.pool = pool
        self.device = pool.device
        self.handle = handle
        self._state = CommandBufferState.INITIAL
        self._one_time = False
        self._fence: Fence | None = None
        self._fence_resets = 0
        dev, pool_handle = self.device.handle, pool.handle
        self._own(pool, lambda: vk.vkFreeCommandBuffers(dev, pool_handle, 1, [handle]))

    # --- state -------------------------------------------------------------------------------

    @property
    def state(self) -> CommandBufferState:
        if self._state is CommandBufferState.PENDING and self._fence is not None:
            fence = self._fence
            # A fence can only be reset after it signalled, so a reset since our submit also
            # means this submission completed.
            if fence.resets > self._fence_resets or (fence.alive and fence.is_signaled()):
                self.mark_completed()
        return self._state

    def _require(self, *states: CommandBufferState, action: str) -> None:
        state = self.state
        if state not in states:
            allowed = " or ".join(s.value for s in states)
            raise CommandBufferStateError(f"cannot {action}: command buffer is {state.value}, needs {allowed}")

    # Device.submit() and Device.wait_idle() move the state with these three.

    def check_submittable(self) -> None:
        self._require(CommandBufferState.EXECUTABLE, action="submit")

    def mark_submitted(self, fence: Fence | None) -> None:
        self._state = CommandBufferState.PENDING
        self._fence = fence
        self._fence_resets = fence.resets if fence is not None else 0

    def mark_completed(self) -> None:
        self._state = CommandBufferState.INVALID if self._one_time else CommandBufferState.EXECUTABLE
        self._fence = None

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait for the submission of this buffer to complete (it must have had a fence)."""
        if self.state is not CommandBufferState.PENDING:
            return
        if self._fence is None:
            raise CommandBufferStateError("submitted without a fence: use Device.wait_idle()")
        self._fence.wait(timeout_s)
        self.mark_completed()

    # --- lifecycle ---------------------------------------------------------------------------

    def begin(self, *, one_time: bool = False) -> None:
        """Start recording (implicitly resetting an executable or invalid buffer)."""
        self._require(
            CommandBufferState.INITIAL, CommandBufferState.EXECUTABLE, CommandBufferState.INVALID,
            action="begin recording",
        )
        flags = vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT if one_time else 0
        call(vk.vkBeginCommandBuffer, self.handle, vk.VkCommandBufferBeginInfo(flags=flags))
        self._one_time = one_time
        self._state = CommandBufferState.RECORDING

    def end(self) -> None:
        self._require(CommandBufferState.RECORDING, action="end recording")
        call(vk.vkEndCommandBuffer, self.handle)
        self._state = CommandBufferState.EXECUTABLE

    def reset(self) -> None:
        self._require(
            CommandBufferState.INITIAL, CommandBufferState.RECORDING, CommandBufferState.EXECUTABLE,
            CommandBufferState.INVALID, action="reset",
        )
        call(vk.vkResetCommandBuffer, self.handle, 0)
        self._state = CommandBufferState.INITIAL

    def destroy(self) -> None:
        # Freeing a pending command buffer is invalid (VUID-vkFreeCommandBuffers-pCommandBuffers-00047).
        if self.alive and self._state is CommandBufferState.PENDING:
            if self._fence is not None and self._fence.alive:
                self.wait()
            else:
                self.device.wait_idle()
        self._state = CommandBufferState.INVALID
        super().destroy()

    # --- recording ---------------------------------------------------------------------------

    def _recording(self) -> Any:
        if self._state is not CommandBufferState.RECORDING:
            raise CommandBufferStateError(f"cannot record: command buffer is {self._state.value}, needs recording")
        return self.handle

    # The commands a dispatch records call lib directly (a packing node records one each: the
    # binding's wrappers cost about 3 us a call, _vk.check).
    def bind_pipeline(self, pipeline: ComputePipeline) -> None:
        lib.vkCmdBindPipeline(self._recording(), vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)

    def bind_descriptor_sets(self, layout: PipelineLayout, sets: Sequence[DescriptorSet], first: int = 0) -> None:
        handles = ffi.new("VkDescriptorSet[]", [s.handle for s in sets])
        lib.vkCmdBindDescriptorSets(
            self._recording(), vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout.handle, first,
            len(sets), handles, 0, ffi.NULL,
        )

    def push_constants(self, layout: PipelineLayout, data: bytes | np.ndarray, offset: int = 0) -> None:
        raw = bytes(np.ascontiguousarray(data).view(np.uint8)) if isinstance(data, np.ndarray) else bytes(data)
        if len(raw) % 4 or offset % 4:
            raise ValueError(f"push constants: offset {offset} and size {len(raw)} must be multiples of 4")
        if offset + len(raw) > layout.push_constant_nbytes:
            raise ValueError(
                f"push constants: {offset + len(raw)} bytes exceed the layout's {layout.push_constant_nbytes}"
            )
        with pinned(raw) as payload:
            lib.vkCmdPushConstants(
                self._recording(), layout.handle, vk.VK_SHADER_STAGE_COMPUTE_BIT, offset, len(raw),
                ffi.NULL if payload is None else payload,
            )

    def dispatch(self, x: int, y: int = 1, z: int = 1) -> None:
        limit = self.device.limits["maxComputeWorkGroupCount"]
        for axis, n, most in zip("xyz", (x, y, z), limit):
            if not 0 < n <= most:
                raise ValueError(f"dispatch: {n} workgroups along {axis}; the device allows 1..{most}")
        lib.vkCmdDispatch(self._recording(), x, y, z)

    def dispatch_no_groups(self) -> None:
        """vkCmdDispatch(0, 0, 0): no workgroup runs (valid: the spec allows zero), but the driver
        resolves the bound pipeline with the bound descriptors as for a real dispatch (lavapipe
        compiles a pipeline's machine code there, not at vkCreateComputePipelines)."""
        vk.vkCmdDispatch(self._recording(), 0, 0, 0)

    def copy_buffer(
        self, src: Buffer, dst: Buffer, nbytes: int | None = None, src_offset: int = 0, dst_offset: int = 0
    ) -> None:
        nbytes = min(src.nbytes - src_offset, dst.nbytes - dst_offset) if nbytes is None else nbytes
        if nbytes <= 0 or src_offset + nbytes > src.nbytes or dst_offset + nbytes > dst.nbytes:
            raise ValueError(f"copy of {nbytes} bytes from {src!r}+{src_offset} to {dst!r}+{dst_offset} is out of range")
        region = vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)
        vk.vkCmdCopyBuffer(self._recording(), src.handle, dst.handle, 1, [region])

    def fill_buffer(self, dst: Buffer, value: int = 0, nbytes: int | None = None, offset: int = 0) -> None:
        nbytes = dst.nbytes - offset if nbytes is None else nbytes
        if nbytes % 4 or offset % 4:  # VUID-vkCmdFillBuffer-size-00028, -dstOffset-00025
            raise ValueError(f"fill_buffer: offset {offset} and size {nbytes} must be multiples of 4")
        vk.vkCmdFillBuffer(self._recording(), dst.handle, offset, nbytes, value)

    def memory_barrier(self, src_stage: Stage, src_access: Access, dst_stage: Stage, dst_access: Access) -> None:
        """A global memory barrier (enough for buffers on a single queue)."""
        barrier = vk.VkMemoryBarrier(srcAccessMask=int(src_access), dstAccessMask=int(dst_access))
        vk.vkCmdPipelineBarrier(self._recording(), int(src_stage), int(dst_stage), 0, 1, [barrier], 0, None, 0, None)

    def compute_barrier(self) -> None:
        """Make compute-shader writes visible to following compute shaders and copies."""
        self.memory_barrier(
            Stage.COMPUTE | Stage.TRANSFER, Access.SHADER_WRITE | Access.TRANSFER_WRITE,
            Stage.COMPUTE | Stage.TRANSFER, Access.SHADER_READ | Access.SHADER_WRITE | Access.TRANSFER_READ,
        )

    def host_read_barrier(self) -> None:
        """Make shader and transfer writes visible to the host after the fence signals."""
        self.memory_barrier(
            Stage.COMPUTE | Stage.TRANSFER, Access.SHADER_WRITE | Access.TRANSFER_WRITE, Stage.HOST, Access.HOST_READ
        )

    def _image_barrier(self, image: Image3D, old: int, new: int, src_stage: Stage, src_access: Access,
                       dst_stage: Stage, dst_access: Access) -> None:
        barrier = vk.VkImageMemoryBarrier(
            srcAccessMask=int(src_access), dstAccessMask=int(dst_access), oldLayout=old, newLayout=new,
            srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
            image=image.handle,
            subresourceRange=vk.VkImageSubresourceRange(
                aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1, baseArrayLayer=0, layerCount=1),
        )
        vk.vkCmdPipelineBarrier(self._recording(), int(src_stage), int(dst_stage), 0, 0, None, 0, None, 1, [barrier])

    def prepare_image(self, image: Image3D) -> None:
        """Move a new image from UNDEFINED to GENERAL, the layout vkgraph keeps storage images
        in (no-op for an image already there). Contents of an UNDEFINED image are discarded."""
        if image.layout == LAYOUT_GENERAL:
            return
        self._image_barrier(image, vk.VK_IMAGE_LAYOUT_UNDEFINED, vk.VK_IMAGE_LAYOUT_GENERAL, Stage.TOP_OF_PIPE,
                            Access.NONE, Stage.COMPUTE | Stage.TRANSFER, Access.SHADER_READ | Access.SHADER_WRITE)
        image.layout = LAYOUT_GENERAL

    def copy_image_to_buffer(self, image: Image3D, dst: Buffer, dst_offset: int = 0) -> None:
        """All texels of ``image`` (RGBA32F, x fastest, then y, then z) into ``dst``."""
        w, h, d = image.extent
        if dst_offset + w * h * d * 16 > dst.nbytes:
            raise ValueError(f"{image!r} ({w * h * d * 16} bytes of texels) does not fit {dst!r} at {dst_offset}")
        region = vk.VkBufferImageCopy(
            bufferOffset=dst_offset, bufferRowLength=0, bufferImageHeight=0,
            imageSubresource=vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0,
                                                         baseArrayLayer=0, layerCount=1),
            imageOffset=vk.VkOffset3D(x=0, y=0, z=0), imageExtent=vk.VkExtent3D(width=w, height=h, depth=d),
        )
        # Copies want TRANSFER_SRC_OPTIMAL; go there and back to GENERAL around the copy.
        src_optimal = vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL
        self._image_barrier(image, vk.VK_IMAGE_LAYOUT_GENERAL, src_optimal, Stage.COMPUTE | Stage.TRANSFER,
                            Access.SHADER_WRITE | Access.TRANSFER_WRITE, Stage.TRANSFER, Access.TRANSFER_READ)
        vk.vkCmdCopyImageToBuffer(self._recording(), image.handle, src_optimal, dst.handle, 1, [region])
        self._image_barrier(image, src_optimal, vk.VK_IMAGE_LAYOUT_GENERAL, Stage.TRANSFER, Access.TRANSFER_READ,
                            Stage.COMPUTE | Stage.TRANSFER, Access.SHADER_READ | Access.SHADER_WRITE)

    def reset_query_pool(self, pool: TimestampQueryPool, first: int = 0, count: int | None = None) -> None:
        count = pool.count - first if count is None else count
        vk.vkCmdResetQueryPool(self._recording(), pool.handle, first, count)

    def write_timestamp(self, pool: TimestampQueryPool, query: int, stage: Stage = Stage.BOTTOM_OF_PIPE) -> None:
        if not 0 <= query < pool.count:
            raise ValueError(f"timestamp query {query} is outside the pool's {pool.count}")
        vk.vkCmdWriteTimestamp(self._recording(), int(stage), pool.handle, query)

    def __repr__(self) -> str:
        return f"<CommandBuffer {self._state.value}>"
