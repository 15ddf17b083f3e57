"""How a load uses the packed-weight cache (ARCHITECTURE.md §3, §5): keys (by content, with
the fingerprints of unchanged files remembered), device identity, lookup (every region a load
uses is checksummed first), giving hit tensors their memory from the
file (zero-copy where the device imports host memory), and saving what a load packed (merged
with what other processes added, under a file lock, rebuilt to a temporary file and renamed over
the old one). A bad or foreign file is a warning and gets rebuilt."""

from __future__ import annotations

import fcntl
import json
import os
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterator

import numpy as np

from ..errors import (
    CacheFormatError,
    DeviceLostError,
    FenceTimeoutError,
    VkGraphError,
    VulkanError,
)
from ..graph.values import ByteSource
from ..paths import atomic_write, user_cache_dir
from ..runtime import Device, ImportedBuffer
from .format import PAGE, Entry, PackedWeightFile, align_page, write_file

if TYPE_CHECKING:
    from ..graph.compute_graph import ComputeGraph
    from ..graph.nodes import PrepackNode


#: Per device, whether it imports file-backed pages as device memory (probed once, and
#: remembered per device and driver in <cache dir>/file-imports.json).
FILE_IMPORTS: weakref.WeakKeyDictionary[Device, bool] = weakref.WeakKeyDictionary()


def _probe_file_imports(device: Device, pages: memoryview) -> Exception | None:
    """Import one page of a cache file on a throwaway device of the same GPU: None if it took
    it, else the error. Never on the load's own device: NVIDIA's driver (580.159) refused a
    read-only file mapping with VK_ERROR_OUT_OF_DEVICE_MEMORY, and that VkDevice then failed
    every later allocation, 15 KB ones too (a second VkDevice was unaffected)."""
    try:
        with Device(device.prefer, validation=device.validation) as probe:
            ImportedBuffer(probe, pages, PAGE, name="file import probe").destroy()
    except (VulkanError, ValueError) as exc:
        if fatal_import_error(exc):
            raise
        return exc
    return None


def imports_file_pages(dev: Device, page: memoryview, what: str) -> bool:
    """Whether ``dev`` takes file-backed pages (``page``: one page of a file mapping) as device
    memory: only where its memory is the host's (a discrete GPU would read them across the bus
    on every dispatch: it gets copies in its own memory), it needs VK_EXT_external_memory_host,
    and drivers may still refuse file-backed pages (Mesa and IREE probe for it), so one page is
    imported once per device and driver to find out; the answer is remembered in the user cache
    dir. ``what`` names what is copied instead."""
    align = dev.physical.min_imported_host_pointer_alignment
    if not (dev.unified_memory and dev.has_external_memory_host and align and PAGE % align == 0):
        return False
    if dev not in FILE_IMPORTS:
        path, known, ident = _remembered_imports(dev)
        if isinstance(known.get(ident), bool):
            FILE_IMPORTS[dev] = known[ident]
        else:
            refused = _probe_file_imports(dev, page)
            if refused is None:
                FILE_IMPORTS[dev] = True
            else:
                refused_file_pages(dev, refused, what)  # says so, once
            known[ident] = FILE_IMPORTS[dev]
            try:
                atomic_write(path, json.dumps(known).encode())
            except OSError:
                pass  # probed again by the next process
    return FILE_IMPORTS[dev]


def refused_file_pages(dev: Device, exc: Exception, what: str) -> None:
    """An import failed for another reason than the budget or a lost device: this device does
    not take file-backed pages (said once), and ``what`` is copied into device memory."""
    if FILE_IMPORTS.get(dev) is not False:
        warnings.warn(f"{dev.name} refuses to import file-backed pages as device memory ({exc}): {what} are "
                      "copied into device memory instead", stacklevel=6)
    FILE_IMPORTS[dev] = False


def _remembered_imports(device: Device) -> tuple[Path, dict, str]:
    path = user_cache_dir() / "file-imports.json"
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    return path, known, json.dumps(device_identity(device), sort_keys=True)


def fatal_import_error(exc: Exception) -> bool:
    """A failed import that is not the driver refusing file-backed pages, and fails the load: the
    device budget, a lost device, a timeout. (NVIDIA's driver refuses such pages with
    VK_ERROR_OUT_OF_DEVICE_MEMORY: from the driver, that answer to an import is a refusal, and
    the copy that follows needs memory of its own.)"""
    return isinstance(exc, (DeviceLostError, FenceTimeoutError)) or getattr(exc, "budget", False)


def device_identity(device: Device) -> dict:
    p = device.physical
    return {"vendor_id": p.vendor_id, "device_id": p.device_id, "driver": p.driver,
            "driver_version": p.driver_version, "pipeline_cache_uuid": p.pipeline_cache_uuid.hex()}


class SourceFingerprints:
    """Fingerprints of file-backed sources remembered next to the cache file
    (``<cache>.sources.json``: {file: {"stat": [...], "tensors": {"offset:nbytes": fingerprint}}}),
    so a warm load does not read the weights again. They count only while the file's stat
    signature is the one they were taken with: device, inode, size, mtime and ctime. The kernel
    sets ctime on every write and rename; cp -p, tar, rsync and reproducible wheels restore
    mtimes, not ctimes, so a replaced or rewritten file is fingerprinted again."""

    def __init__(self, cache_path: Path):
        self.path = cache_path.with_name(cache_path.name + ".sources.json")
        try:
            self.files = json.loads(self.path.read_text())
            if not isinstance(self.files, dict):
                raise ValueError("not an object")
        except (OSError, ValueError):
            self.files = {}  # none yet, unreadable or damaged: fingerprint again
        self.changed = False
        self._stats: dict[str, list[int]] = {}

    def _stat(self, file: str) -> list[int]:
        if file not in self._stats:
            st = os.stat(file)
            self._stats[file] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        return self._stats[file]

    def get(self, source: ByteSource) -> str:
        origin = getattr(source, "origin", None)
        if origin is None:
            return source.fingerprint()
        file, offset = origin
        stat = self._stat(file)  # before reading: a change while hashing gives the file a new ctime
        known = self.files.get(file)
        if not isinstance(known, dict) or known.get("stat") != stat or not isinstance(known.get("tensors"), dict):
            known = self.files[file] = {"stat": stat, "tensors": {}}
        where = f"{offset}:{source.nbytes}"
        if not isinstance(known["tensors"].get(where), str):
            known["tensors"][where] = source.fingerprint()
            self.changed = True
        return known["tensors"][where]

    def save(self) -> None:
        """Keep new fingerprints for the next load (best effort: without them it hashes again)."""
        if self.changed:
            try:
                atomic_write(self.path, json.dumps(self.files).encode())
            except OSError:
                pass
            self.changed = False


class PackedWeightCache:
    """The cache file at ``path`` as one graph's loads use it. The file stays open (its pages
    may be the device memory of hit tensors) until :meth:`close`, after those buffers are gone."""

    def __init__(self, graph: ComputeGraph, path: str | Path):
        self.graph = graph
        self.path = Path(path)
        self.identity = device_identity(graph.device)
        self.file: PackedWeightFile | None = None
        self.keys: dict[int, str] = {}  # prepack node index -> key, for the nodes the cache can hold
        self.fingerprints = SourceFingerprints(self.path)

    def key(self, node: PrepackNode) -> str:
        """Tensor name, the source's content fingerprint, packer (name, parameters, shader hash)
        and packed shape."""
        g = self.graph
        src, dst = g.values[node.src], g.values[node.dst]
        ident = self.fingerprints.get(src.source)
        p = node.packer
        shader = "none" if p.shader is None else g.kernels.shader_hash(p.shader, p.defines)
        defines = ",".join(f"{k}={v}" for k, v in sorted(p.defines.items()))
        return (f"{src.name}|{ident}|{src.shape}|{src.dtype}|{p.name}[{defines}]|{shader}|"
                f"{dst.layout}|{dst.shape}|{dst.nbytes}")

    def lookup(self, skip: Collection[int] = ()) -> dict[int, Entry]:
        """{prepack node index: entry} for the nodes the file holds, every region checked;
        ``skip``: nodes that need no cache (their weights are imported in place)."""
        g = self.graph
        self.file = open_cache(self.path, self.identity)
        self.keys, hits = {}, {}
        for i, node in enumerate(g.prepack_nodes):
            if g.values[node.dst].storage != "buffer" or i in skip:
                continue  # textures are not cached
            key = self.keys[i] = self.key(node)
            entry = self.file.entries.get(key) if self.file else None
            if entry is not None and entry.nbytes == g.values[node.dst].nbytes:
                hits[i] = entry
        self.fingerprints.save()
        if not hits:
            return hits
        # Check every region this load will use; xxh3 releases the GIL, so use the cores.
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            intact = list(pool.map(self.file.intact, hits.values()))
        bad = [e.key for e, ok in zip(hits.values(), intact) if not ok]
        if bad:  # never hand the device damaged weights: pack everything, rebuild the file
            warnings.warn(f"packed-weight cache rejected, it will be rebuilt: {self.path}: region checksum mismatch "
                          f"for {bad[0].split('|', 1)[0]!r}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else ""),
                          stacklevel=4)
            self.close()
            return {}
        return hits

    def load(self, node: PrepackNode, entry: Entry) -> str:
        """Give a hit's tensor its memory; returns the path taken: "zero-copy" (the file's pages
        imported as device memory) or "copy"."""
        g = self.graph
        dst = g.values[node.dst]
        if self._imports_file_pages():
            padded = memoryview(self.file.mapping)[entry.offset:entry.offset + align_page(entry.nbytes)]
            try:
                g.memory.adopt(dst, self._import(padded, dst.nbytes, dst.name))
                return "zero-copy"
            except (VulkanError, ValueError) as exc:
                if fatal_import_error(exc):
                    raise
                self._refused(exc)
        g.memory.upload(dst, np.frombuffer(self.file.region(entry), np.uint8))
        return "copy"

    def _import(self, pages: memoryview, nbytes: int, name: str) -> ImportedBuffer:
        return ImportedBuffer(self.graph.device, pages, nbytes, name=name)

    def _imports_file_pages(self) -> bool:
        return imports_file_pages(self.graph.device, memoryview(self.file.mapping)[:PAGE], "packed-weight cache hits")

    def _refused(self, exc: Exception) -> None:
        refused_file_pages(self.graph.device, exc, "packed-weight cache hits")

    def save(self, hits: dict[int, Entry]) -> float:
        """Write what the load packed (the keyed nodes that were not hits) to the file, once;
        nothing when everything came from the cache. Returns the seconds it took.

        A save that fails (a full disk, a path that is not a directory, no memory to read the
        weights back) is a warning naming the path and the reason: the load stands, the file is
        as it was (the new one is written aside and renamed over it only when complete), and the
        next load packs again. Only a lost device or a fence timeout propagates."""
        t0 = time.perf_counter()
        g = self.graph
        try:
            new = {key: (g.values[g.prepack_nodes[i].dst].layout, g.read_tensor(g.prepack_nodes[i].dst))
                   for i, key in self.keys.items() if i not in hits}
            if new or (self.file is None and self.path.exists()):
                save(self.path, self.identity, new)
        except (DeviceLostError, FenceTimeoutError):
            raise
        except (OSError, MemoryError, ValueError, VkGraphError) as exc:
            warnings.warn(f"packed-weight cache not saved: {self.path}: {exc}; the model is loaded, and the "
                          "next load packs its weights again", stacklevel=5)
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def open_cache(path: Path, identity: dict) -> PackedWeightFile | None:
    """The cache at ``path`` if it is valid and was built for this device; None (with a warning
    naming the reason, unless the file simply does not exist yet) otherwise."""
    if not path.exists():
        return None
    try:
        f = PackedWeightFile(path)
    except CacheFormatError as exc:
        warnings.warn(f"packed-weight cache rejected, it will be rebuilt: {exc}", stacklevel=5)
        return None
    if f.identity != identity:
        warnings.warn(f"packed-weight cache rejected, it will be rebuilt: {path} was built for another device or "
                      f"driver ({f.identity.get('driver')!r}, device {f.identity.get('device_id')})", stacklevel=5)
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
