"""Fences and semaphores. Every wait has a timeout and raises :class:`FenceTimeoutError` past it."""

from __future__ import annotations

from ..errors import FenceTimeoutError, UnsupportedFeatureError
from ._vk import call, lib, vk
from .device import Device
from .handle import VkObject

#: Default wait limit. Long enough for any sane load on a software renderer, short enough that
#: a hung GPU surfaces as an error rather than a frozen process.
DEFAULT_TIMEOUT_S = 300.0

_VK_SUCCESS = 0
_VK_NOT_READY = 1


def _timeout_ns(timeout_s: float) -> int:
    if timeout_s < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout_s}")
    return min(int(timeout_s * 1e9), 2**64 - 1)


class Fence(VkObject):
    """A VkFence: signalled by the GPU when a submission completes."""

    def __init__(self, device: Device, signaled: bool = False):
        self.device = device
        self.resets = 0  # lets command buffers tell that a submission they were in completed
        info = vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT if signaled else 0)
        dev = device.handle
        self.handle = handle = call(vk.vkCreateFence, dev, info, None)
        self._own(device, lambda: vk.vkDestroyFence(dev, handle, None))

    def is_signaled(self) -> bool:
        self._check_alive()
        # Called through `lib` because the binding raises for VK_NOT_READY, a normal answer here.
        result = lib.vkGetFenceStatus(self.device.handle, self.handle)
        if result == _VK_SUCCESS:
            return True
        if result == _VK_NOT_READY:
            return False
        return call(vk.vkGetFenceStatus, self.device.handle, self.handle)  # raises the error

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Block until signalled; :class:`FenceTimeoutError` after ``timeout_s`` seconds."""
        self._check_alive()
        call(
            vk.vkWaitForFences, self.device.handle, 1, [self.handle], vk.VK_TRUE, _timeout_ns(timeout_s),
            detail=f"fence not signalled after {timeout_s:g} s",
        )

    def reset(self) -> None:
        self._check_alive()
        call(vk.vkResetFences, self.device.handle, 1, [self.handle])
        self.resets += 1


class Semaphore(VkObject):
    """A binary VkSemaphore, or a timeline one (``timeline=True``, Vulkan 1.2 /
    VK_KHR_timeline_semaphore) whose counter can also be read, signalled and waited on by the host."""

    def __init__(self, device: Device, *, timeline: bool = False, initial_value: int = 0):
        if timeline and not device.has_timeline_semaphore:
            raise UnsupportedFeatureError("timelineSemaphore", f"{device.name} does not support timeline semaphores")
        self.device = device
        self.timeline = timeline
        type_info = None
        if timeline:
            type_info = vk.VkSemaphoreTypeCreateInfo(
                semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=initial_value
            )
        info = vk.VkSemaphoreCreateInfo(pNext=type_info)
        dev = device.handle
        self.handle = handle = call(vk.vkCreateSemaphore, dev, info, None)
        self._own(device, lambda: vk.vkDestroySemaphore(dev, handle, None))

    def _require_timeline(self) -> None:
        self._check_alive()
        if not self.timeline:
            raise ValueError("host value/signal/wait need a timeline semaphore")

    @property
    def value(self) -> int:
        self._require_timeline()
        return int(call(vk.vkGetSemaphoreCounterValue, self.device.handle, self.handle))

    def signal(self, value: int) -> None:
        self._require_timeline()
        info = vk.VkSemaphoreSignalInfo(semaphore=self.handle, value=value)
        call(vk.vkSignalSemaphore, self.device.handle, info)

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Block until the counter reaches ``value``; :class:`FenceTimeoutError` past the limit."""
        self._require_timeline()
        info = vk.VkSemaphoreWaitInfo(semaphoreCount=1, pSemaphores=[self.handle], pValues=[value])
        try:
            call(vk.vkWaitSemaphores, self.device.handle, info, _timeout_ns(timeout_s))
        except FenceTimeoutError as exc:
            raise FenceTimeoutError(exc.call, exc.result, f"semaphore value {value} not reached "
                                    f"after {timeout_s:g} s") from None
