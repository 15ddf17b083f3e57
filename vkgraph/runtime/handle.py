"""Ownership of Vulkan handles and the live-object counter.

Every wrapper that owns a Vulkan handle derives from :class:`VkObject`. It creates the handle,
then calls :meth:`VkObject._own` with a ``release`` closure over the *raw* handles (never over
``self``), which becomes a ``weakref.finalize`` backstop. ``destroy()`` runs that finalizer:
idempotent, and safe at interpreter exit (finalizers run in reverse creation order there, so
children go before their device).

A parent (a device, a command pool) keeps weak references to its children and destroys the
live ones in reverse creation order before itself. A child's release is skipped when its parent
is already gone: destroying the parent freed it (``vkDestroyCommandPool`` frees its command
buffers) or would have made freeing it invalid.
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from typing import Callable

from ..errors import VkGraphError

_live: Counter[str] = Counter()
_collected: Counter[str] = Counter()
_child_keys = itertools.count()


def live_objects() -> dict[str, int]:
    """Live Vulkan-owning wrappers by class name (only non-zero counts)."""
    return {kind: n for kind, n in _live.items() if n}


def collected_objects() -> dict[str, int]:
    """Wrappers freed by the garbage-collector backstop instead of ``destroy()``, by class name:
    objects someone forgot to destroy (a leak until the collector happened to run)."""
    return {kind: n for kind, n in _collected.items() if n}


def _release(
    kind: str, release: Callable[[], None], parent: weakref.finalize | None, explicit: bool = False
) -> None:
    _live[kind] -= 1
    if not explicit:
        _collected[kind] += 1
    if parent is None or parent.alive:
        release()


class VkObject:
    """Base of every wrapper that owns a Vulkan handle."""

    _finalizer: weakref.finalize | None = None
    _children: dict[int, weakref.ref] | None = None

    def _own(self, parent: VkObject | None, release: Callable[[], None]) -> None:
        """Start owning: count this object and register its release (raw handles only)."""
        kind = type(self).__name__
        parent_fin = parent._finalizer if parent is not None else None
        self._finalizer = weakref.finalize(self, _release, kind, release, parent_fin)
        _live[kind] += 1
        if parent is not None:
            if parent._children is None:
                parent._children = {}
            children = parent._children
            key = next(_child_keys)
            children[key] = weakref.ref(self, lambda _ref: children.pop(key, None))

    @property
    def alive(self) -> bool:
        """False once destroyed (or never created)."""
        return self._finalizer is not None and self._finalizer.alive

    def _check_alive(self) -> None:
        """Raise instead of handing the driver a destroyed handle (undefined behaviour)."""
        if not self.alive:
            raise VkGraphError(f"{type(self).__name__} is destroyed")

    def destroy(self) -> None:
        """Destroy the children still alive (newest first), then this object. Idempotent."""
        if not self.alive:
            return
        if self._children:
            for ref in reversed(list(self._children.values())):
                child = ref()
                if child is not None:
                    child.destroy()
        detached = self._finalizer.detach()  # type: ignore[union-attr]
        if detached is not None:
            _obj, fn, args, _kwargs = detached
            fn(*args, explicit=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
