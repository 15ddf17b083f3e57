"""The one place that imports the ``vulkan`` binding, and the wrapper every call goes through.

The binding raises bare exception *classes* with no message for every non-``VK_SUCCESS``
result (status codes such as ``VK_TIMEOUT`` and ``VK_NOT_READY`` included). :func:`call` turns
them into the vkgraph error tree, naming the Vulkan call and the ``VkResult``.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import (
    DeviceLostError,
    DeviceNotFoundError,
    FeatureNotPresentError,
    FenceTimeoutError,
    OutOfDeviceMemoryError,
    OutOfHostMemoryError,
    VulkanError,
)


class _MissingLoader:
    """Stands in for the binding when ``libvulkan.so.1`` cannot be loaded, so that importing
    vkgraph still works (config, scheduler, readers) and only Vulkan use fails, clearly."""

    def __init__(self, reason: str):
        self._reason = reason

    def __getattr__(self, name: str) -> Any:
        raise DeviceNotFoundError(
            f"the Vulkan loader cannot be loaded ({self._reason}); "
            "install the system package libvulkan1 (and an ICD such as mesa-vulkan-drivers)"
        )


try:
    import vulkan as vk
    from vulkan import ffi, lib

    _BINDING_ERRORS: tuple[type[BaseException], ...] = (vk.VkError, vk.VkException)
    _PROC_ERRORS: tuple[type[BaseException], ...] = (
        vk.ProcedureNotFoundError,
        vk.ExtensionNotSupportedError,
    )
except OSError as exc:  # the binding dlopen()s libvulkan.so.1 at import time
    vk = ffi = lib = _MissingLoader(str(exc))  # type: ignore[assignment]
    _BINDING_ERRORS = _PROC_ERRORS = ()

_ERROR_CLASS = {
    "VK_ERROR_OUT_OF_DEVICE_MEMORY": OutOfDeviceMemoryError,
    "VK_ERROR_OUT_OF_HOST_MEMORY": OutOfHostMemoryError,
    "VK_ERROR_DEVICE_LOST": DeviceLostError,
    "VK_TIMEOUT": FenceTimeoutError,
    "VK_ERROR_LAYER_NOT_PRESENT": FeatureNotPresentError,
    "VK_ERROR_EXTENSION_NOT_PRESENT": FeatureNotPresentError,
    "VK_ERROR_FEATURE_NOT_PRESENT": FeatureNotPresentError,
    "VK_ERROR_INCOMPATIBLE_DRIVER": FeatureNotPresentError,
    "VK_ERROR_FORMAT_NOT_SUPPORTED": FeatureNotPresentError,
}


#: VkResult codes the binding has no exception class for (its table lists some extension codes
#: with the wrong sign): it raises KeyError(code) for them.
_UNLISTED_RESULTS = {
    -1000069000: "VK_ERROR_OUT_OF_POOL_MEMORY",
    -1000072003: "VK_ERROR_INVALID_EXTERNAL_HANDLE",
    -1000161000: "VK_ERROR_FRAGMENTATION",
    -1000257000: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS",
    -1000011001: "VK_ERROR_VALIDATION_FAILED_EXT",
    -1000174001: "VK_ERROR_NOT_PERMITTED_KHR",
    -1000158000: "VK_ERROR_INVALID_DRM_FORMAT_MODIFIER_PLANE_LAYOUT_EXT",
}


def _result_names() -> dict[int, str]:
    """VkResult code -> name, for :func:`check` (status codes and errors only: other enums share
    the numbers)."""
    if not _BINDING_ERRORS:
        return {}
    names = {code: name for name, code in vars(vk).items()
             if isinstance(code, int) and name.startswith("VK_ERROR_") and code < 0}
    names.update({getattr(vk, n): n for n in ("VK_NOT_READY", "VK_TIMEOUT", "VK_EVENT_SET", "VK_EVENT_RESET",
                                              "VK_INCOMPLETE") if isinstance(getattr(vk, n, None), int)})
    return {**names, **_UNLISTED_RESULTS}


_RESULT_NAMES = _result_names()


def check(result: int, call_name: str, detail: str = "") -> None:
    """Raise the vkgraph error for a ``VkResult`` other than VK_SUCCESS, as :func:`call` does for
    the binding's functions. For the hot paths that call ``lib`` directly with structs made by
    ``ffi.new`` (a weight's buffer; a packing node's descriptor set, texel view and recording):
    the binding's wrappers cost about 3 us a call and 20 us a struct, most of a node's encoding."""
    if result:
        name = _RESULT_NAMES.get(result, f"VkResult {result}")
        raise _ERROR_CLASS.get(name, VulkanError)(call_name, name, detail)


def result_name(exc_class: type) -> str:
    """``VkErrorOutOfDeviceMemory`` -> ``VK_ERROR_OUT_OF_DEVICE_MEMORY``."""
    words = re.findall(r"[A-Z][a-z0-9]*", exc_class.__name__)
    return "_".join(w.upper() for w in words)


def error_for(call_name: str, exc: BaseException, detail: str = "") -> VulkanError:
    """The vkgraph error for a binding exception raised by ``call_name``."""
    if _PROC_ERRORS and isinstance(exc, _PROC_ERRORS):
        return FeatureNotPresentError(call_name, "procedure not found", detail)
    name = result_name(type(exc))
    return _ERROR_CLASS.get(name, VulkanError)(call_name, name, detail)


def call(fn: Callable[..., Any], *args: Any, detail: str = "") -> Any:
    """Call a binding function; raise a :class:`VulkanError` subclass naming it on failure."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        return fn(*args)
    except _BINDING_ERRORS + _PROC_ERRORS as exc:
        raise error_for(name, exc, detail) from None
    except KeyError as exc:  # a result code missing from the binding's table
        code = exc.args[0] if exc.args else None
        if not isinstance(code, int):
            raise
        raise VulkanError(name, _UNLISTED_RESULTS.get(code, f"VkResult {code}"), detail) from None



@contextmanager
def pinned(data: Any) -> Iterator[Any]:
    """``ffi.from_buffer(data)`` (None for empty data) for the length of a call, released after
    it. A cffi buffer left in a frame that ends up in a reference cycle (an exception's traceback
    and a frame holding the exception) crashes CPython's garbage collector when it collects the
    cycle (cffi 2.1.1; a plain memoryview does not): release it before leaving."""
    buf = ffi.from_buffer(data) if len(data) else None
    try:
        yield buf
    finally:
        if buf is not None:
            ffi.release(buf)
