import struct

import numpy as np
import pytest

from vkgraph.cache.format import FOOTER, PAGE, PackedWeightFile, write_file
from vkgraph.errors import CacheFormatError

IDENT = {"device": "test", "driver": "x 1.0"}


def make(tmp_path, n=3, seed=0):
    rng = np.random.default_rng(seed)
    regions = [(f"layers.{i}.w|linear_4x4", "linear_4x4", rng.integers(0, 255, 1000 + 4097 * i, dtype=np.uint8).tobytes())
               for i in range(n)]
    path = tmp_path / "w.vkpw"
    size = write_file(path, IDENT, regions)
    return path, regions, size


def test_round_trip(tmp_path):
    path, regions, size = make(tmp_path)
    assert path.stat().st_size == size
    f = PackedWeightFile(path)
    assert f.identity == IDENT and len(f.entries) == 3
    for key, layout, data in regions:
        e = f.entries[key]
        assert e.offset % PAGE == 0 and e.layout == layout and bytes(f.region(e)) == data
    assert f.verify() == []
    f.close()
    assert not list(tmp_path.glob(".*tmp"))


def test_empty_file_round_trip(tmp_path):
    path = tmp_path / "empty.vkpw"
    write_file(path, IDENT, [])
    assert PackedWeightFile(path).entries == {}


def unalign_index(path):
    """Rewrite a valid file with its index right after the last region's bytes instead of at the
    next page: valid-looking, every offset and checksum right (as another writer might make it)."""
    from vkgraph.cache.format import MAGIC, VERSION, checksum

    f = PackedWeightFile(path)
    end = max(e.offset + e.nbytes for e in f.entries.values())
    index_start, count = FOOTER.unpack_from(f.mapping, f.size - FOOTER.size)[:2]
    index = bytes(f.mapping[index_start:f.size - FOOTER.size])
    raw = bytes(f.mapping[:end])
    f.close()
    assert end % PAGE  # the test needs a last region that does not end on a page
    path.write_bytes(raw + index + FOOTER.pack(end, count, checksum(index), MAGIC, VERSION, 0))


def corrupt(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage,reason", [
    (lambda p, s: corrupt(p, 0, b"XXXX"), "bad magic"),
    (lambda p, s: corrupt(p, 4, struct.pack("<I", 99)), "version 99"),
    (lambda p, s: corrupt(p, 8, struct.pack("<I", 100000)), "does not fit the header"),
    (lambda p, s: p.write_bytes(p.read_bytes()[: s - 7]), "bad footer"),
    (lambda p, s: p.write_bytes(p.read_bytes()[:100]), "too short"),
    (lambda p, s: corrupt(p, s - FOOTER.size, struct.pack("<Q", s * 2)), "index offset"),
    (lambda p, s: corrupt(p, s - FOOTER.size + 8, struct.pack("<I", 2**31)), "index entries cannot fit"),
    (lambda p, s: corrupt(p, s - FOOTER.size - 3, b"\xff"), "index checksum mismatch"),
    (lambda p, s: unalign_index(p), "index offset .* is not page-aligned"),
])
def test_corruption_is_rejected_with_the_reason(tmp_path, damage, reason):
    path, _, size = make(tmp_path)
    damage(path, size)
    with pytest.raises(CacheFormatError, match=f"{path}: .*{reason}"):
        PackedWeightFile(path)


def test_region_checksum_mismatch_found_by_verify(tmp_path):
    path, regions, _ = make(tmp_path)
    f = PackedWeightFile(path)
    off = f.entries[regions[1][0]].offset
    f.close()
    corrupt(path, off + 10, b"\x00\x01\x02")
    assert PackedWeightFile(path).verify() == [regions[1][0]]


def test_entries_out_of_range_or_overlapping_are_rejected(tmp_path):
    from vkgraph.cache import format as fmt

    def build(entries):
        # hand-made index over a 3-page data area
        index = bytearray()
        for key, off, n in entries:
            k = key.encode()
            index += struct.pack("<I", len(k)) + k + fmt.ENTRY_FIXED.pack(off, n) + struct.pack("<I", 1) + b"L" + struct.pack("<Q", 0)
        ident = b"{}"
        raw = bytearray(fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, len(ident)) + ident)
        raw += bytes(4 * PAGE - len(raw))
        start = len(raw)
        raw += index + fmt.FOOTER.pack(start, len(entries), fmt.checksum(bytes(index)), fmt.MAGIC, fmt.VERSION, 0)
        p = tmp_path / "hand.vkpw"
        p.write_bytes(bytes(raw))
        return p

    with pytest.raises(CacheFormatError, match="overlap"):
        PackedWeightFile(build([("a", PAGE, 2 * PAGE), ("b", 2 * PAGE, 10)]))
    with pytest.raises(CacheFormatError, match="out of range"):
        PackedWeightFile(build([("a", PAGE, 10 * PAGE)]))
    with pytest.raises(CacheFormatError, match="out of range"):
        PackedWeightFile(build([("a", PAGE + 1, 10)]))
    with pytest.raises(CacheFormatError, match="appears twice"):
        PackedWeightFile(build([("a", PAGE, 10), ("a", 2 * PAGE, 10)]))


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    path, regions, _ = make(d, n=3, seed=7)
    return path.read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_files_only_raise_cache_format_error(tmp_path, valid_file, data):
    """Byte flips, truncations and splices of a valid file: either a consistent file or a
    CacheFormatError; never another exception, never a region outside the file."""
    raw = bytearray(valid_file)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "junk", "footer"]))
        if kind == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        elif kind == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        elif kind == "junk":
            i = data.draw(st.integers(0, len(raw)))
            raw[i:i] = data.draw(st.binary(max_size=64))
        elif len(raw) >= 32:
            raw[-32:] = data.draw(st.binary(min_size=32, max_size=32))
    path = tmp_path / "fuzz.vkpw"
    path.write_bytes(bytes(raw))
    try:
        f = PackedWeightFile(path)
    except CacheFormatError:
        return
    for e in f.entries.values():
        assert PAGE <= e.offset and e.offset + e.nbytes <= len(raw)
    f.close()
