"""The packed-weight cache file (ARCHITECTURE.md §5).

::

    [header, 4096 bytes: magic "VKPW" | version u32 | identity length u32 | identity JSON]
    [packed regions, each starting at a multiple of 4096]
    [index, at a multiple of 4096: entry_count x (key_len u32 | key | offset u64 | nbytes u64 | layout_len u32 | layout | checksum u64)]
    [footer, 32 bytes: index_start u64 | entry_count u32 | index checksum u64 | magic "VKPW" | version u32 | pad u32]

Checksums are xxh3-64 (fast enough to check every region a warm load uses). A reader trusts nothing: every length, offset and count is checked
against the file before it is used, regions may not overlap, and any failure is a
:class:`CacheFormatError` naming the file and the reason.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import xxhash

from ..errors import CacheFormatError

MAGIC = b"VKPW"
VERSION = 1
PAGE = 4096
HEADER = struct.Struct("<4sII")
FOOTER = struct.Struct("<QIQ4sII")
ENTRY_FIXED = struct.Struct("<QQ")  # offset, nbytes (after the key)
MAX_KEY = 4096
MAX_LAYOUT = 256
MAX_IDENTITY = PAGE - HEADER.size


def checksum(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def align_page(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


@dataclass(frozen=True)
class Entry:
    key: str
    offset: int
    nbytes: int
    layout: str
    checksum: int


class PackedWeightFile:
    """A validated, read-only, memory-mapped cache file. ``identity`` is the device/driver the
    file was built for; ``entries`` maps keys to regions."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise CacheFormatError(f"{path}: cannot open ({exc.strerror})") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < PAGE + FOOTER.size:
                raise CacheFormatError(f"{path}: {size} bytes is too short for a packed-weight cache")
            # Private and writable (vkgraph never writes it): NVIDIA's driver refuses to import a
            # read-only file mapping as device memory; until written, its pages are the file's.
            self.mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.size = size
        try:
            self.identity, self.entries = self._parse()
        except BaseException:
            self.mapping.close()
            raise

    def _fail(self, why: str) -> CacheFormatError:
        return CacheFormatError(f"{self.path}: {why}")

    def _parse(self) -> tuple[dict[str, Any], dict[str, Entry]]:
        mm, size = self.mapping, self.size
        magic, version, id_len = HEADER.unpack_from(mm, 0)
        if magic != MAGIC:
            raise self._fail(f"bad magic {magic!r} (not a vkgraph packed-weight cache)")
        if version != VERSION:
            raise self._fail(f"version {version}, this vkgraph reads version {VERSION}")
        if id_len > MAX_IDENTITY:
            raise self._fail(f"identity of {id_len} bytes does not fit the header")
        try:
            identity = json.loads(bytes(mm[HEADER.size:HEADER.size + id_len]))
            if not isinstance(identity, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._fail(f"unreadable identity ({exc})") from None

        index_start, count, index_sum, fmagic, fversion, _pad = FOOTER.unpack_from(mm, size - FOOTER.size)
        if fmagic != MAGIC or fversion != VERSION:
            raise self._fail("bad footer (truncated or incompletely written file)")
        index_end = size - FOOTER.size
        if not PAGE <= index_start <= index_end:
            raise self._fail(f"index offset {index_start} is outside the file")
        if index_start % PAGE:  # every region's last page must lie in the file, to import it whole
            raise self._fail(f"index offset {index_start} is not page-aligned")
        if count > (index_end - index_start) // (4 + ENTRY_FIXED.size + 4 + 8):
            raise self._fail(f"{count} index entries cannot fit {index_end - index_start} bytes")
        if checksum(mm[index_start:index_end]) != index_sum:
            raise self._fail("index checksum mismatch")

        entries: dict[str, Entry] = {}
        pos = index_start

        def take(n: int) -> bytes:
            nonlocal pos
            if pos + n > index_end:
                raise self._fail("index entry runs past the index")
            out = mm[pos:pos + n]
            pos += n
            return out

        for _ in range(count):
            (key_len,) = struct.unpack("<I", take(4))
            if key_len > MAX_KEY:
                raise self._fail(f"key of {key_len} bytes is absurd")
            key = take(key_len).decode("utf-8", "replace")
            offset, nbytes = ENTRY_FIXED.unpack(take(ENTRY_FIXED.size))
            (layout_len,) = struct.unpack("<I", take(4))
            if layout_len > MAX_LAYOUT:
                raise self._fail(f"layout name of {layout_len} bytes is absurd")
            layout = take(layout_len).decode("utf-8", "replace")
            (region_sum,) = struct.unpack("<Q", take(8))
            if offset % PAGE or offset < PAGE or nbytes == 0 or offset + nbytes > index_start:
                raise self._fail(f"entry {key!r}: region [{offset}, {offset + nbytes}) is out of range")
            if key in entries:
                raise self._fail(f"entry {key!r} appears twice")
            entries[key] = Entry(key, offset, nbytes, layout, region_sum)
        if pos != index_end:
            raise self._fail("index has trailing bytes")
        spans = sorted((e.offset, e.offset + e.nbytes, e.key) for e in entries.values())
        for (a0, a1, ak), (b0, b1, bk) in zip(spans, spans[1:]):
            if b0 < a1:
                raise self._fail(f"regions of {ak!r} and {bk!r} overlap")
        return identity, entries

    def region(self, entry: Entry) -> memoryview:
        return memoryview(self.mapping)[entry.offset:entry.offset + entry.nbytes]

    def intact(self, entry: Entry) -> bool:
        """Whether the region's bytes match its checksum (reads them)."""
        return checksum(self.region(entry)) == entry.checksum

    def verify(self) -> list[str]:
        """Keys whose region checksum does not match (reads every region)."""
        return [e.key for e in self.entries.values() if not self.intact(e)]

    def close(self) -> None:
        try:
            self.mapping.close()
        except BufferError:
            pass  # imported device memory or views still use the pages; they go with them


def write_file(path: Path, identity: dict[str, Any], regions: Iterable[tuple[str, str, bytes | memoryview]]) -> int:
    """Write a complete cache file to a temporary name and rename it over ``path`` (readers that
    have the old file mapped keep it). ``regions``: (key, layout, packed bytes). Returns the size."""
    ident = json.dumps(identity, sort_keys=True).encode()
    if len(ident) > MAX_IDENTITY:
        raise ValueError("device identity too long for the header")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    index = bytearray()
    count = 0
    try:
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, len(ident)) + ident)
            pos = align_page(f.tell())
            for key, layout, data in regions:
                f.seek(pos)
                f.write(data)
                k, lay = key.encode(), layout.encode()
                index += struct.pack("<I", len(k)) + k + ENTRY_FIXED.pack(pos, len(data))
                index += struct.pack("<I", len(lay)) + lay + struct.pack("<Q", checksum(data))
                pos = align_page(pos + len(data))
                count += 1
            f.seek(pos)
            f.write(index)
            f.write(FOOTER.pack(pos, count, checksum(index), MAGIC, VERSION, 0))
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
        return size
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
