"""Using the packed-weight cache in a load: keys, device identity, opening (a bad or foreign file
is a warning and gets rebuilt), and saving (merged with what other processes added, under a file
lock, rebuilt to a temporary file and renamed over the old one)."""

from __future__ import annotations

import fcntl
import hashlib
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..errors import CacheFormatError
from .format import PackedWeightFile, write_file

if TYPE_CHECKING:
    from ..graph.compute_graph import ComputeGraph
    from ..graph.nodes import PrepackNode


def device_identity(graph: ComputeGraph) -> dict:
    p = graph.device.physical
    return {"vendor_id": p.vendor_id, "device_id": p.device_id, "driver": p.driver,
            "driver_version": p.driver_version, "pipeline_cache_uuid": p.pipeline_cache_uuid.hex()}


def node_key(graph: ComputeGraph, node: PrepackNode) -> str:
    """Tensor name, source identity, packer (name, parameters, shader hash) and packed shape."""
    src = graph.values[node.src]
    dst = graph.values[node.dst]
    ident = getattr(src.source, "identity", None)
    if ident is None:  # in-memory data: identify it by content
        ident = "blake2b:" + hashlib.blake2b(src.source.read(), digest_size=16).hexdigest()
    shader = "none"
    if node.packer.shader is not None:
        memo = graph._shader_hashes
        sk = (node.packer.shader, tuple(sorted(node.packer.defines.items())))
        if sk not in memo:
            spirv = graph.compiler.compile_named(node.packer.shader, node.packer.defines)
            memo[sk] = hashlib.sha256(spirv).hexdigest()[:16]
        shader = memo[sk]
    defines = ",".join(f"{k}={v}" for k, v in sorted(node.packer.defines.items()))
    return (f"{src.name}|{ident}|{src.shape}|{src.dtype}|{node.packer.name}[{defines}]|{shader}|"
            f"{dst.layout}|{dst.shape}|{dst.nbytes}")


def open_cache(path: Path, identity: dict) -> PackedWeightFile | None:
    """The cache at ``path`` if it is valid and was built for this device; None (with a warning
    naming the reason, unless the file simply does not exist yet) otherwise."""
    if not path.exists():
        return None
    try:
        f = PackedWeightFile(path)
    except CacheFormatError as exc:
        warnings.warn(f"packed-weight cache rejected, it will be rebuilt: {exc}", stacklevel=3)
        return None
    if f.identity != identity:
        warnings.warn(f"packed-weight cache rejected, it will be rebuilt: {path} was built for another device or "
                      f"driver ({f.identity.get('driver')!r}, device {f.identity.get('device_id')})", stacklevel=3)
        f.close()
        return None
    return f


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` + ".lock" (several processes may share one cache file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def save(path: Path, identity: dict, new: dict[str, tuple[str, np.ndarray | memoryview]]) -> int:
    """Rebuild the file with ``new`` entries ({key: (layout, bytes)}) plus every valid entry
    already in it (possibly added by another process since this one opened it). Returns the
    new file size."""
    with locked(path):
        # Writers hold the lock while their temporary file exists: any left now belongs to a
        # process that died mid-write (SIGKILL, power loss). Its data never replaced the file.
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        current = open_cache(path, identity)
        try:
            regions: dict[str, tuple[str, np.ndarray | memoryview]] = {}
            if current is not None:
                for key, e in current.entries.items():
                    if key not in new and current.intact(e):  # damaged regions are dropped
                        regions[key] = (e.layout, current.region(e))
            regions.update(new)
            return write_file(path, identity, ((k, lay, data) for k, (lay, data) in regions.items()))
        finally:
            if current is not None:
                current.close()
