"""VkInstance, the debug messenger that records every message, and physical-device facts."""

from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import DeviceNotFoundError, UnsupportedFeatureError, VulkanError
from ..paths import bundled_icds, user_cache_dir
from ._vk import call, ffi, lib, vk
from .handle import VkObject

log = logging.getLogger("vkgraph.vulkan")

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
EXT_DEBUG_UTILS = "VK_EXT_debug_utils"
EXT_EXTERNAL_MEMORY_HOST = "VK_EXT_external_memory_host"
EXT_TIMELINE_SEMAPHORE = "VK_KHR_timeline_semaphore"

#: Device extensions worth knowing about for this runtime (shown by ``vkgraph info``).
RELEVANT_EXTENSIONS = (
    EXT_EXTERNAL_MEMORY_HOST,
    EXT_TIMELINE_SEMAPHORE,
    "VK_KHR_8bit_storage",
    "VK_KHR_16bit_storage",
    "VK_KHR_shader_float16_int8",
    "VK_KHR_shader_integer_dot_product",
    "VK_KHR_maintenance4",
    "VK_EXT_memory_budget",
    "VK_KHR_portability_subset",
)


def make_version(major: int, minor: int, patch: int = 0) -> int:
    return (major << 22) | (minor << 12) | patch


def version_str(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def loader_version() -> str:
    """The Vulkan loader's version, e.g. "1.3.239"."""
    return version_str(call(vk.vkEnumerateInstanceVersion))


VK_API_1_1 = make_version(1, 1)
VK_API_1_2 = make_version(1, 2)
VK_API_1_3 = make_version(1, 3)


# --- debug messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class DebugMessage:
    """One message from the validation layer or the loader."""

    severity: str  # "error" | "warning" | "info" | "verbose"
    types: tuple[str, ...]  # of "general", "validation", "performance"
    id_name: str
    text: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.id_name}: {self.text}"


# VkDebugUtilsMessageSeverityFlagBitsEXT / VkDebugUtilsMessageTypeFlagBitsEXT (spec values).
_SEVERITIES = {0x1000: "error", 0x100: "warning", 0x10: "info", 0x1: "verbose"}
_MESSAGE_TYPES = ((0x1, "general"), (0x2, "validation"), (0x4, "performance"))
_SEVERITY_BITS = {name: bit for bit, name in _SEVERITIES.items()}

_messages: list[DebugMessage] = []


def debug_messages() -> list[DebugMessage]:
    """Every message recorded so far in this process, from every instance (a live list)."""
    return _messages


#: Warnings and errors are also logged (logger "vkgraph.vulkan") as "vulkan [severity] id: text":
#: a process without a logging setup prints them on stderr, where its parent can find them.
_REPORTED = re.compile(r"^vulkan \[(error|warning)\] ", re.MULTILINE)


def reported_messages(output: str) -> list[str]:
    """The validation-layer or loader warnings and errors in a child process's output."""
    return [line for line in output.splitlines() if _REPORTED.match(line)]


def _debug_callback(severity: int, types: int, data: Any, _user: Any) -> int:
    # Runs inside a Vulkan call; it must not raise. The binding keeps one Python callback per
    # process for PFN_vkDebugUtilsMessengerCallbackEXT, so every instance shares this one.
    try:
        text = ffi.string(data.pMessage).decode("utf-8", "replace") if data.pMessage else ""
        id_name = ffi.string(data.pMessageIdName).decode("utf-8", "replace") if data.pMessageIdName else ""
        kinds = tuple(name for bit, name in _MESSAGE_TYPES if types & bit)
        msg = DebugMessage(_SEVERITIES.get(severity, "verbose"), kinds, id_name, text)
        _messages.append(msg)
        level = {"error": logging.ERROR, "warning": logging.WARNING}.get(msg.severity, logging.DEBUG)
        log.log(level, "vulkan %s", msg)
    except Exception:  # pragma: no cover - never let an exception cross the C boundary
        log.exception("vkgraph debug callback failed")
    return 0  # VK_FALSE: do not abort the call


def _severity_mask(min_severity: str) -> int:
    order = ["verbose", "info", "warning", "error"]
    if min_severity not in order:
        raise ValueError(f"debug severity must be one of {order}, not {min_severity!r}")
    return sum(_SEVERITY_BITS[s] for s in order[order.index(min_severity):])


# --- instance --------------------------------------------------------------------------------


def instance_layers() -> set[str]:
    return {p.layerName for p in call(vk.vkEnumerateInstanceLayerProperties)}


def instance_extensions(layer: str | None = None) -> set[str]:
    """Instance extensions of the loader and drivers, or those a layer provides."""
    return {p.extensionName for p in call(vk.vkEnumerateInstanceExtensionProperties, layer)}


EXT_VALIDATION_FEATURES = "VK_EXT_validation_features"
SYNC_VALIDATION = 4  # VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT


DRIVER_FILES_ENV = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")  # the second for loaders before 1.3.207


@contextmanager
def _loader_icds(icd_json: str | None) -> Iterator[list[str]]:
    """The ICDs the loader sees while an instance is created: ``icd_json`` alone when given;
    else the system's plus the ones vkgraph installed (``paths.bundled_icds``, through
    VK_ADD_DRIVER_FILES), unless VK_DRIVER_FILES or VK_ICD_FILENAMES already say which ICDs to
    use. Yields the renderer names of the bundled ICDs added."""
    added: list[str] = []
    changes: dict[str, str] = {}
    if icd_json is not None:
        path = Path(icd_json)
        if not path.is_file():
            raise DeviceNotFoundError(f"ICD file {icd_json} does not exist")
        changes = {k: str(path.resolve()) for k in DRIVER_FILES_ENV}
    elif not any(os.environ.get(k) for k in DRIVER_FILES_ENV):
        bundled = bundled_icds()
        if bundled:
            added = list(bundled)
            files = [os.environ["VK_ADD_DRIVER_FILES"]] if os.environ.get("VK_ADD_DRIVER_FILES") else []
            changes = {"VK_ADD_DRIVER_FILES": os.pathsep.join(files + [str(p) for p in bundled.values()])}
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield added
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: lavapipe's vector width where the host's AVX-512 units are 512 bits wide and the user set
#: none (Mesa reads LP_NATIVE_VECTOR_WIDTH once, when the process first enumerates a lavapipe
#: device; Mesa 22.3 defaults to 256 bits): on this project's VM (AMD EPYC, family 26, 2 cores) a
#: kernel of nothing but multiply-adds ran 57 -> 108 G/s and SmolLM2's 64-token prefill 185-201 ->
#: 147-151 ms, logits identical (README, "Decode speed"). Its shaders then go to a Mesa shader
#: cache of their own (MESA_SHADER_CACHE_DIR, unless the user set one): Mesa 22.3 served 256-bit
#: entries of the default cache to a 512-bit process, which ran at the old speed.
LAVAPIPE_VECTOR_BITS = 512
#: Mesa 22.3's width where LP_NATIVE_VECTOR_WIDTH is unset (on AVX2 and AVX-512 hosts alike),
#: whose shaders stay in Mesa's default cache; any other, vkgraph's or the user's, gets one of its own
MESA_VECTOR_BITS = 256
#: processors ("vendor family") whose AVX-512 runs in two 256-bit halves, where lavapipe keeps
#: Mesa's 256 bits: on a Zen 4 (AMD family 25 model 17, 2 cores) 512 bits took the prompt no
#: faster and decoded and packed slower (six pairs of fresh `bench decode` processes: prefill 312
#: against 308 tok/s, decode 36.6 against 41.2; synthetic:256's packing 0.175 against 0.131 s)
HALF_WIDTH_AVX512 = {("AuthenticAMD", "25")}


def cpu_fields(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The fields of ``cpuinfo``'s first processor ("vendor_id", "cpu family", "flags"...); empty
    where the file cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def host_cpu(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This machine's processor as a CPU renderer's profile records it (``[device] host_cpu``):
    vendor, family and model of ``cpuinfo``'s first processor ("AuthenticAMD family 25 model
    17"); "" where that cannot be read."""
    fields = cpu_fields(cpuinfo)
    if not all(k in fields for k in ("vendor_id", "cpu family", "model")):
        return ""
    return f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']}"


def _wide_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this host has AVX-512 at full width (not on HALF_WIDTH_AVX512's processors)."""
    fields = cpu_fields(cpuinfo)
    return ("avx512f" in fields.get("flags", "").split()
            and (fields.get("vendor_id"), fields.get("cpu family")) not in HALF_WIDTH_AVX512)


def configure_lavapipe() -> None:
    """Set lavapipe's vector width (LAVAPIPE_VECTOR_BITS, on hosts with full-width AVX-512) in this
    process's environment, before the first instance is created, and give a width other than
    Mesa's default (vkgraph's or the user's) a shader cache directory of its own; a width or cache
    the user set stays as set."""
    if "LP_NATIVE_VECTOR_WIDTH" not in os.environ and _wide_avx512():
        os.environ["LP_NATIVE_VECTOR_WIDTH"] = str(LAVAPIPE_VECTOR_BITS)
    width = os.environ.get("LP_NATIVE_VECTOR_WIDTH", "").strip()
    if not width.isdigit() or int(width) == MESA_VECTOR_BITS:
        return
    if not any(k in os.environ for k in ("MESA_SHADER_CACHE_DIR", "MESA_GLSL_CACHE_DIR", "MESA_SHADER_CACHE_DISABLE")):
        cache = user_cache_dir() / f"mesa-lavapipe-{int(width)}"
        # Mesa 22.3 makes the last directory of the path alone: on a fresh machine (no ~/.cache
        # yet) it printed "Failed to create ... for shader cache" and compiled every shader again
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # Mesa then says it cannot cache, and runs without
        os.environ["MESA_SHADER_CACHE_DIR"] = str(cache)


class Instance(VkObject):
    """A VkInstance, with the Khronos validation layer when asked and a debug messenger that
    records every message of at least ``debug_severity`` (see :func:`debug_messages`).
    ``sync_validation`` adds the layer's synchronization validation (hazards between commands,
    submits and the host); best-practices checks stay off."""

    def __init__(
        self,
        validation: bool = False,
        *,
        sync_validation: bool = False,
        icd: str | None = None,
        debug_severity: str = "warning",
        app_name: str = "vkgraph",
    ):
        self.icd = icd
        configure_lavapipe()
        with _loader_icds(icd) as added:
            #: renderers whose ICD vkgraph added to the system's (their devices come last by default)
            self.bundled_renderers = added
            self._create(validation, sync_validation, debug_severity, app_name, icd)

    def _create(self, validation: bool, sync_validation: bool, debug_severity: str, app_name: str,
                icd: str | None) -> None:
        loader_version = call(vk.vkEnumerateInstanceVersion)
        if loader_version < VK_API_1_1:
            raise UnsupportedFeatureError(
                "Vulkan 1.1", f"the Vulkan loader is {version_str(loader_version)}; vkgraph needs 1.1 or newer")
        self.api_version = min(loader_version, VK_API_1_3)
        self.validation = validation
        self.sync_validation = validation and sync_validation

        layers: list[str] = []
        if validation:
            if VALIDATION_LAYER not in instance_layers():
                raise UnsupportedFeatureError(
                    VALIDATION_LAYER, f"{VALIDATION_LAYER} is not installed (Debian package vulkan-validationlayers)")
            layers.append(VALIDATION_LAYER)
        extensions: list[str] = []
        has_debug_utils = EXT_DEBUG_UTILS in instance_extensions() or validation
        if has_debug_utils:
            extensions.append(EXT_DEBUG_UTILS)
        features = None
        if self.sync_validation:
            if EXT_VALIDATION_FEATURES not in instance_extensions(VALIDATION_LAYER):
                raise UnsupportedFeatureError(EXT_VALIDATION_FEATURES,
                                              f"{VALIDATION_LAYER} lacks {EXT_VALIDATION_FEATURES} (sync validation)")
            extensions.append(EXT_VALIDATION_FEATURES)
            enabled = [SYNC_VALIDATION]

        # Everything a create-info points to stays referenced by these locals until the calls
        # below return: the binding does not keep pointees alive for us.
        app_info = vk.VkApplicationInfo(
            pApplicationName=app_name,
            applicationVersion=1,
            pEngineName="vkgraph",
            engineVersion=1,
            apiVersion=self.api_version,
        )
        messenger_info = None
        if has_debug_utils:
            messenger_info = vk.VkDebugUtilsMessengerCreateInfoEXT(
                messageSeverity=_severity_mask(debug_severity),
                messageType=sum(bit for bit, _ in _MESSAGE_TYPES),
                pfnUserCallback=_debug_callback,
            )
        if self.sync_validation:
            features = vk.VkValidationFeaturesEXT(pNext=messenger_info, pEnabledValidationFeatures=enabled)
        create_info = vk.VkInstanceCreateInfo(
            # Chained so that vkCreateInstance/vkDestroyInstance themselves are covered.
            pNext=features if features is not None else messenger_info,
            pApplicationInfo=app_info,
            ppEnabledLayerNames=layers,
            ppEnabledExtensionNames=extensions,
        )
        try:
            handle = call(vk.vkCreateInstance, create_info, None)
        except UnsupportedFeatureError as exc:
            if exc.result == "VK_ERROR_INCOMPATIBLE_DRIVER":
                where = f" from {icd}" if icd else ""
                raise DeviceNotFoundError(f"no usable Vulkan driver (ICD){where}") from None
            raise
        except VulkanError as exc:
            if exc.result == "VK_ERROR_INITIALIZATION_FAILED":
                raise DeviceNotFoundError(f"the Vulkan loader found no driver ({exc})") from None
            raise
        self.handle = handle

        messenger = None
        destroy_messenger = None
        if messenger_info is not None:
            create_messenger = call(vk.vkGetInstanceProcAddr, handle, "vkCreateDebugUtilsMessengerEXT")
            destroy_messenger = call(vk.vkGetInstanceProcAddr, handle, "vkDestroyDebugUtilsMessengerEXT")
            messenger = call(create_messenger, handle, messenger_info, None)

        def release(handle=handle, messenger=messenger, destroy_messenger=destroy_messenger) -> None:
            if messenger is not None:
                destroy_messenger(handle, messenger, None)
            vk.vkDestroyInstance(handle, None)

        self._own(None, release)

    def physical_devices(self) -> list[PhysicalDevice]:
        try:
            handles = call(vk.vkEnumeratePhysicalDevices, self.handle)
        except VulkanError as exc:
            where = f" from ICD file {self.icd}" if self.icd else ""
            raise DeviceNotFoundError(f"no usable Vulkan device{where} ({exc})") from None
        return [PhysicalDevice(self, h) for h in handles]


# --- physical devices ------------------------------------------------------------------------

_DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}

_MEMORY_FLAG_NAMES = (
    (0x1, "DEVICE_LOCAL"),
    (0x2, "HOST_VISIBLE"),
    (0x4, "HOST_COHERENT"),
    (0x8, "HOST_CACHED"),
    (0x10, "LAZILY_ALLOCATED"),
    (0x20, "PROTECTED"),
)
MEMORY_DEVICE_LOCAL, MEMORY_HOST_VISIBLE, MEMORY_HOST_COHERENT, MEMORY_HOST_CACHED = 0x1, 0x2, 0x4, 0x8


def memory_flag_names(flags: int) -> list[str]:
    return [name for bit, name in _MEMORY_FLAG_NAMES if flags & bit]


@dataclass(frozen=True)
class MemoryType:
    index: int
    flags: int
    heap: int


@dataclass(frozen=True)
class MemoryHeap:
    index: int
    size: int
    device_local: bool


def _chain(*structs: Any) -> None:
    """Link ``ffi.new`` structs through pNext, in order."""
    for a, b in zip(structs, structs[1:]):
        a.pNext = b


def _new_struct(ctype: str, stype: int) -> Any:
    s = ffi.new(ctype + "*")
    s.sType = stype
    return s


class PhysicalDevice:
    """What vkgraph needs to know about one physical device; creates nothing."""

    def __init__(self, instance: Instance, handle: Any):
        self.instance = instance
        self.handle = handle
        self.extensions: set[str] = {
            p.extensionName for p in call(vk.vkEnumerateDeviceExtensionProperties, handle, None)
        }
        props = call(vk.vkGetPhysicalDeviceProperties, handle)
        self.name: str = props.deviceName
        self.type: str = _DEVICE_TYPES.get(props.deviceType, "other")
        self.vendor_id: int = props.vendorID
        self.device_id: int = props.deviceID
        self.driver_version: int = props.driverVersion
        self.api_version: int = min(props.apiVersion, instance.api_version)
        self.pipeline_cache_uuid: bytes = bytes(props._pipelineCacheUUID)
        lim = props.limits
        self.timestamp_period_ns: float = lim.timestampPeriod
        self.limits: dict[str, Any] = {
            "maxStorageBufferRange": lim.maxStorageBufferRange,
            "maxUniformBufferRange": lim.maxUniformBufferRange,
            "maxPushConstantsSize": lim.maxPushConstantsSize,
            "maxComputeSharedMemorySize": lim.maxComputeSharedMemorySize,
            "maxComputeWorkGroupCount": list(lim.maxComputeWorkGroupCount),
            "maxComputeWorkGroupSize": list(lim.maxComputeWorkGroupSize),
            "maxComputeWorkGroupInvocations": lim.maxComputeWorkGroupInvocations,
            "maxMemoryAllocationCount": lim.maxMemoryAllocationCount,
            "maxBoundDescriptorSets": lim.maxBoundDescriptorSets,
            "minStorageBufferOffsetAlignment": lim.minStorageBufferOffsetAlignment,
            "nonCoherentAtomSize": lim.nonCoherentAtomSize,
            "maxImageDimension3D": lim.maxImageDimension3D,
            "maxTexelBufferElements": lim.maxTexelBufferElements,
            "minTexelBufferOffsetAlignment": lim.minTexelBufferOffsetAlignment,
            "timestampPeriod": lim.timestampPeriod,
        }
        self.driver_name = ""
        self.driver_info = ""
        self.min_imported_host_pointer_alignment = 0
        self._read_properties2()

        fams = call(vk.vkGetPhysicalDeviceQueueFamilyProperties, handle)
        compute = [i for i, f in enumerate(fams) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        self.compute_queue_family: int | None = compute[0] if compute else None
        self.timestamp_valid_bits: int = fams[compute[0]].timestampValidBits if compute else 0

        mem = call(vk.vkGetPhysicalDeviceMemoryProperties, handle)
        self.memory_heaps = [
            MemoryHeap(i, mem.memoryHeaps[i].size, bool(mem.memoryHeaps[i].flags & 0x1))
            for i in range(mem.memoryHeapCount)
        ]
        self.memory_types = [
            MemoryType(i, mem.memoryTypes[i].propertyFlags, mem.memoryTypes[i].heapIndex)
            for i in range(mem.memoryTypeCount)
        ]
        self.host_visible_memory_type = self._host_visible_device_local_type()

        self.supports_timeline_semaphore = self._timeline_semaphore_feature()
        #: shaders may use 64-bit integers (Device enables the feature where it is present)
        self.supports_int64 = bool(call(vk.vkGetPhysicalDeviceFeatures, handle).shaderInt64)

    def _read_properties2(self) -> None:
        chain = []
        driver = None
        if self.api_version >= VK_API_1_2 or "VK_KHR_driver_properties" in self.extensions:
            driver = _new_struct(
                "VkPhysicalDeviceDriverProperties",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
            )
            chain.append(driver)
        host = None
        if EXT_EXTERNAL_MEMORY_HOST in self.extensions:
            host = _new_struct(
                "VkPhysicalDeviceExternalMemoryHostPropertiesEXT",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT,
            )
            chain.append(host)
        maint3 = _new_struct(
            "VkPhysicalDeviceMaintenance3Properties",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
        )
        chain.append(maint3)
        subgroup = _new_struct(
            "VkPhysicalDeviceSubgroupProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
        chain.append(subgroup)
        props2 = _new_struct("VkPhysicalDeviceProperties2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2)
        _chain(props2, *chain)
        call(lib.vkGetPhysicalDeviceProperties2, self.handle, props2)
        if driver is not None:
            self.driver_name = ffi.string(driver.driverName).decode()
            self.driver_info = ffi.string(driver.driverInfo).decode()
        if host is not None:
            self.min_imported_host_pointer_alignment = host.minImportedHostPointerAlignment
        #: invocations a subgroup runs together: a CPU renderer's SIMD width (lavapipe 8 at 256
        #: bits, 16 at 512; SwiftShader 4)
        self.subgroup_size: int = subgroup.subgroupSize
        self.limits["maxMemoryAllocationSize"] = maint3.maxMemoryAllocationSize
        self.limits["minImportedHostPointerAlignment"] = self.min_imported_host_pointer_alignment

    def _timeline_semaphore_feature(self) -> bool:
        if self.api_version < VK_API_1_2 and EXT_TIMELINE_SEMAPHORE not in self.extensions:
            return False
        tl = _new_struct(
            "VkPhysicalDeviceTimelineSemaphoreFeatures",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES,
        )
        f2 = _new_struct("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2)
        _chain(f2, tl)
        call(lib.vkGetPhysicalDeviceFeatures2, self.handle, f2)
        return bool(tl.timelineSemaphore)

    def _host_visible_device_local_type(self) -> int | None:
        """The memory type that makes device-local memory host-visible, if any.

        Counted only on the largest device-local heap: a small BAR window on a discrete GPU
        (a 256 MiB DEVICE_LOCAL|HOST_VISIBLE heap) does not make weights mappable.
        """
        local = [h for h in self.memory_heaps if h.device_local]
        if not local:
            return None
        big = max(local, key=lambda h: h.size).index
        want = MEMORY_DEVICE_LOCAL | MEMORY_HOST_VISIBLE | MEMORY_HOST_COHERENT
        for t in self.memory_types:
            if t.heap == big and t.flags & want == want:
                return t.index
        return None

    @property
    def host_visible_device_local(self) -> bool:
        """Whether weights in device-local memory can be written by the CPU directly."""
        return self.host_visible_memory_type is not None

    @property
    def renderer(self) -> str:
        """The implementation's short name: "lavapipe", "swiftshader", else the driver's name."""
        if self.driver_name == "llvmpipe" or self.name.startswith("llvmpipe"):
            return "lavapipe"
        if self.name.startswith("SwiftShader"):
            return "swiftshader"
        return self.driver_name or self.name

    @property
    def driver(self) -> str:
        if self.driver_name:
            return f"{self.driver_name} {self.driver_info}".strip()
        return f"driver version {self.driver_version:#x}"

    @property
    def timestamps_supported(self) -> bool:
        return self.timestamp_valid_bits > 0 and self.timestamp_period_ns > 0

    def info(self) -> dict[str, Any]:
        """The ``vkgraph info --json`` entry for this device."""
        return {
            "name": self.name,
            "renderer": self.renderer,
            "type": self.type,
            "driver": self.driver,
            "api_version": version_str(self.api_version),
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "host_visible_device_local": self.host_visible_device_local,
            "subgroup_size": self.subgroup_size,
            "extensions": sorted(e for e in RELEVANT_EXTENSIONS if e in self.extensions),
            "limits": dict(self.limits),
            "memory_types": [
                {"index": t.index, "heap": t.heap, "flags": memory_flag_names(t.flags)}
                for t in self.memory_types
            ],
            "memory_heaps": [
                {"index": h.index, "size": h.size, "device_local": h.device_local}
                for h in self.memory_heaps
            ],
            "timestamps": self.timestamps_supported,
            "timeline_semaphore": self.supports_timeline_semaphore,
        }
