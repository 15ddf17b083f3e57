"""The logical device: physical-device selection, one compute queue, submission, teardown."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import (
    DeviceNotFoundError,
    OutOfDeviceMemoryError,
    UnsupportedFeatureError,
)
from ._vk import call, vk
from .handle import VkObject
from .instance import (
    EXT_EXTERNAL_MEMORY_HOST,
    EXT_TIMELINE_SEMAPHORE,
    VK_API_1_1,
    VK_API_1_2,
    Instance,
    PhysicalDevice,
    _new_struct,
    host_cpu,
    version_str,
)

if TYPE_CHECKING:
    from .command import CommandBuffer
    from .sync import Fence, Semaphore

ENV_DEVICE = "VKGRAPH_DEVICE"
ENV_VALIDATION = "VKGRAPH_VALIDATION"
ENV_SYNC_VALIDATION = "VKGRAPH_SYNC_VALIDATION"  # with validation on: add synchronization validation


def is_icd_path(prefer: str) -> bool:
    """``device.prefer`` names an ICD json file rather than a device-name substring."""
    return prefer.endswith(".json") or os.sep in prefer


def select_physical_device(devices: Sequence[PhysicalDevice], prefer: str | None) -> PhysicalDevice:
    """The first device whose renderer (``lavapipe``, ``swiftshader``) is ``prefer`` or whose name
    contains it (case-insensitive); without a preference, the first device of the system's ICDs,
    then of the ICDs vkgraph installed."""
    if not devices:
        raise DeviceNotFoundError("no Vulkan device found (is an ICD such as mesa-vulkan-drivers installed?)")
    if not prefer or is_icd_path(prefer):
        return min(devices, key=lambda d: d.renderer in d.instance.bundled_renderers)
    want = prefer.lower()
    for d in devices:
        if want == d.renderer or want in d.name.lower():
            return d
    names = ", ".join(f"{d.name!r} ({d.renderer})" for d in devices)
    raise DeviceNotFoundError(f"no Vulkan device matches {prefer!r}; available: {names}")


def preferred_device() -> str | None:
    """The device preference commands use: ``$VKGRAPH_DEVICE`` (which ``--device`` sets)."""
    return os.environ.get(ENV_DEVICE) or None


def instance_for(prefer: str | None, validation: bool = False) -> Instance:
    """An instance whose loader sees the ICD ``prefer`` names, alone, or else every ICD."""
    icd = prefer if prefer and is_icd_path(prefer) else None
    return Instance(validation, sync_validation=_env_flag(ENV_SYNC_VALIDATION), icd=icd)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def host_cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Device(VkObject):
    """A logical device with one compute queue; owns its instance and every object made on it.

    ``prefer`` is a substring of the device name or the path of an ICD json file
    (``device.prefer``; default: ``$VKGRAPH_DEVICE``, then the first device). ``validation``
    enables the Khronos validation layer (default: ``$VKGRAPH_VALIDATION``).

    ``destroy()`` waits for the device to go idle, destroys every child still alive (newest
    first), then the device and the instance.
    """

    def __init__(self, prefer: str | None = None, *, validation: bool | None = None, max_memory_nbytes: int = 0):
        #: Allocations that would bring :attr:`allocated_nbytes` above this raise
        #: OutOfDeviceMemoryError before Vulkan is called, as a device this small would (0: no budget).
        self.max_memory_nbytes = int(max_memory_nbytes)
        prefer = prefer if prefer is not None else preferred_device()
        self.prefer = prefer  # how it was chosen (another Device(device.prefer) opens the same one)
        validation = _env_flag(ENV_VALIDATION) if validation is None else validation
        self.instance = instance_for(prefer, validation)
        try:
            self._create(select_physical_device(self.instance.physical_devices(), prefer))
        except BaseException:
            self.instance.destroy()
            raise

    def _create(self, physical: PhysicalDevice) -> None:
        if physical.api_version < VK_API_1_1:
            raise UnsupportedFeatureError(
                "Vulkan 1.1", f"{physical.name} supports Vulkan {version_str(physical.api_version)}; vkgraph needs 1.1")
        if physical.compute_queue_family is None:
            raise UnsupportedFeatureError("VK_QUEUE_COMPUTE_BIT", f"{physical.name} has no compute queue")
        self.physical = physical
        self.queue_family_index = physical.compute_queue_family

        extensions: list[str] = []
        self.has_external_memory_host = EXT_EXTERNAL_MEMORY_HOST in physical.extensions
        if self.has_external_memory_host:
            extensions.append(EXT_EXTERNAL_MEMORY_HOST)
        self.has_timeline_semaphore = physical.supports_timeline_semaphore
        timeline = None
        if self.has_timeline_semaphore:
            if physical.api_version < VK_API_1_2:
                extensions.append(EXT_TIMELINE_SEMAPHORE)
            timeline = _new_struct(
                "VkPhysicalDeviceTimelineSemaphoreFeatures",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES,
            )
            timeline.timelineSemaphore = 1
        if "VK_KHR_portability_subset" in physical.extensions:
            extensions.append("VK_KHR_portability_subset")  # required when present (VUID-VkDeviceCreateInfo-pProperties-04451)

        #: shaders may use 64-bit integers (PhysicalDevice.supports_int64: the feature enabled)
        self.has_int64 = physical.supports_int64
        features = vk.VkPhysicalDeviceFeatures(shaderInt64=int(self.has_int64))
        queue_info = vk.VkDeviceQueueCreateInfo(
            queueFamilyIndex=self.queue_family_index, queueCount=1, pQueuePriorities=[1.0]
        )
        create_info = vk.VkDeviceCreateInfo(
            pNext=timeline,
            pQueueCreateInfos=[queue_info],
            ppEnabledExtensionNames=extensions,
            pEnabledFeatures=features,
        )
        handle = call(vk.vkCreateDevice, physical.handle, create_info, None)
        self.handle = handle
        self.extensions = tuple(extensions)
        self.queue = call(vk.vkGetDeviceQueue, handle, self.queue_family_index, 0)
        self.allocated_nbytes = 0
        self.peak_allocated_nbytes = 0
        #: host perf_counter_ns - device timestamp ns (runtime.query.host_clock_offset_ns), once known
        self.clock_offset_ns: float | None = None
        self._unfenced_pending: list[CommandBuffer] = []
        self._ext_fns: dict[str, Any] = {}

        def release(handle=handle) -> None:
            vk.vkDestroyDevice(handle, None)

        # The instance is not a child: it is destroyed after the device, in destroy().
        self._own(None, release)
        from .pipeline import PipelineCache, default_cache_path  # pipeline.py imports this module

        #: the VkPipelineCache every graph on this device shares (config cache.pipeline_cache_path
        #: ""), seeded from its file: a driver that keeps compiled pipelines in it compiles each one
        #: once per device, not once per graph (SwiftShader: a second SmolLM2 session's pipelines
        #: 2.04 -> 0.56 s)
        try:
            self.pipeline_cache = PipelineCache.load(self, default_cache_path(self))
        except OSError:  # an unreadable cache directory: start empty
            self.pipeline_cache = PipelineCache(self)

    # --- facts -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.physical.name

    @property
    def limits(self) -> dict[str, Any]:
        return self.physical.limits

    @property
    def host_visible_device_local(self) -> bool:
        return self.physical.host_visible_device_local

    @property
    def renderer(self) -> str:
        """The implementation's short name: "lavapipe", "swiftshader", else the driver's name."""
        return self.physical.renderer

    @property
    def is_cpu(self) -> bool:
        """A software renderer (lavapipe, SwiftShader): shaders run on the host's cores."""
        return self.physical.type == "cpu"

    @property
    def simd_width(self) -> int:
        """Invocations a CPU renderer runs as one vector (its subgroup size); 0 on a GPU."""
        return self.physical.subgroup_size if self.is_cpu else 0

    @property
    def host_cpu(self) -> str:
        """The processor a CPU renderer runs on, as its profile records it (instance.host_cpu:
        "AuthenticAMD family 25 model 17"); "" on a GPU."""
        return host_cpu() if self.is_cpu else ""

    @property
    def cpu_threads(self) -> int:
        """Worker threads a CPU renderer runs its workgroups on, a SIMD batch each at a time:
        lavapipe's ``LP_NUM_THREADS`` where set (0: none, the queue's own thread: 1), else one per
        CPU this process may run on, as lavapipe and SwiftShader start them; 0 on a GPU."""
        if not self.is_cpu:
            return 0
        if self.renderer == "lavapipe" and os.environ.get("LP_NUM_THREADS", "").strip().isdigit():
            return max(1, int(os.environ["LP_NUM_THREADS"]))
        return host_cores()

    @property
    def unified_memory(self) -> bool:
        """Device-local memory is the host's own memory (integrated GPUs, CPU renderers), so host
        pages imported as device memory are read at memory speed. A discrete GPU would read them
        across the bus on every dispatch (SmolLM2 decode on an H100 with NVIDIA 580.159: 169-179
        tok/s with packed weights in device memory, 75-81 with them imported from host pages)."""
        return self.physical.type in ("integrated-gpu", "cpu")

    @property
    def validation(self) -> bool:
        return self.instance.validation

    def extension_function(self, name: str) -> Any:
        """A device-level extension function (``vkGetDeviceProcAddr``), looked up once."""
        fn = self._ext_fns.get(name)
        if fn is None:
            fn = self._ext_fns[name] = call(vk.vkGetDeviceProcAddr, self.handle, name)
        return fn

    # --- work ------------------------------------------------------------------------------

    def submit(
        self,
        command_buffers: Sequence[CommandBuffer],
        fence: Fence | None = None,
        *,
        wait: Sequence[tuple[Semaphore, int]] = (),
        signal: Sequence[tuple[Semaphore, int]] = (),
    ) -> None:
        """Submit executable command buffers to the compute queue.

        ``wait``/``signal`` are ``(semaphore, value)`` pairs; the value is used by timeline
        semaphores and ignored for binary ones. Waits happen before compute shaders and copies.
        """
        for cb in command_buffers:
            cb.check_submittable()
        handles = [cb.handle for cb in command_buffers]
        wait_sems = [s.handle for s, _ in wait]
        signal_sems = [s.handle for s, _ in signal]
        timeline_info = None
        if any(s.timeline for s, _ in (*wait, *signal)):
            timeline_info = vk.VkTimelineSemaphoreSubmitInfo(
                waitSemaphoreValueCount=len(wait),
                pWaitSemaphoreValues=[v for _, v in wait] or None,
                signalSemaphoreValueCount=len(signal),
                pSignalSemaphoreValues=[v for _, v in signal] or None,
            )
        stage = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        submit_info = vk.VkSubmitInfo(
            pNext=timeline_info,
            waitSemaphoreCount=len(wait_sems),
            pWaitSemaphores=wait_sems or None,
            pWaitDstStageMask=[stage] * len(wait_sems) or None,
            commandBufferCount=len(handles),
            pCommandBuffers=handles or None,
            signalSemaphoreCount=len(signal_sems),
            pSignalSemaphores=signal_sems or None,
        )
        call(vk.vkQueueSubmit, self.queue, 1, [submit_info], fence.handle if fence else None)
        for cb in command_buffers:
            cb.mark_submitted(fence)
        if fence is None:
            self._unfenced_pending.extend(command_buffers)

    def wait_idle(self) -> None:
        """Wait until the device has finished all submitted work."""
        call(vk.vkDeviceWaitIdle, self.handle)
        for cb in self._unfenced_pending:
            cb.mark_completed()
        self._unfenced_pending.clear()

    # --- memory accounting -------------------------------------------------------------------

    def reserve_memory(self, nbytes: int, what: str, pending: int = 0) -> None:
        """Refuse an allocation of ``nbytes`` that would exceed :attr:`max_memory_nbytes`, with
        ``pending`` bytes placed before it in the same allocation (a memory block's buffers)."""
        budget = self.max_memory_nbytes
        if budget and self.allocated_nbytes + pending + nbytes > budget:
            before = f" and {pending} more are placed before it in its memory block" if pending else ""
            exc = OutOfDeviceMemoryError(
                "vkAllocateMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY",
                f"{what} does not fit: {self.allocated_nbytes} bytes are allocated{before}, the budget "
                f"(device.max_memory_nbytes) is {budget}, the allocation needs {nbytes}",
            )
            exc.budget = True
            raise exc

    def account_memory(self, nbytes: int) -> None:
        """Count an allocation (negative: a free) in :attr:`allocated_nbytes` and its peak."""
        self.allocated_nbytes += nbytes
        self.peak_allocated_nbytes = max(self.peak_allocated_nbytes, self.allocated_nbytes)

    # --- teardown ----------------------------------------------------------------------------

    def destroy(self) -> None:
        """Wait for idle, destroy every live child (newest first), the device, the instance."""
        if self.alive:
            try:
                call(vk.vkDeviceWaitIdle, self.handle)
            finally:
                super().destroy()
        self.instance.destroy()

    def __repr__(self) -> str:
        state = "" if self.alive else " destroyed"
        return f"<Device {self.name!r}{state}>"

