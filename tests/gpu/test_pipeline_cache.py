import struct
import warnings

import numpy as np
import pytest

from vkgraph.runtime import PipelineCache
from vkgraph.tools.smoke import axpby


def test_save_load_round_trip(device, compiler, tmp_path):
    path = tmp_path / "pipelines.bin"
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100, dtype=np.float32)
    with PipelineCache(device) as cache:
        axpby(device, x, x.copy(), 1.0, compiler=compiler, pipeline_cache=cache)
        saved = cache.save(path)
        data = cache.data()
    assert saved == len(data) == path.stat().st_size
    header_size, version, vendor, dev_id, uuid = struct.unpack_from("<IIII16s", data)
    assert (version, vendor, dev_id, uuid) == (1, device.physical.vendor_id, device.physical.device_id,
                                               device.physical.pipeline_cache_uuid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matching file loads without complaint
        with PipelineCache.load(device, path) as loaded:
            assert loaded.data() == data
            res = axpby(device, x, x.copy(), 1.0, compiler=compiler, pipeline_cache=loaded)
            np.testing.assert_allclose(res.y, 2 * x, rtol=1e-6)
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left no temporary file


def test_missing_file_starts_empty(device, tmp_path):
    with PipelineCache.load(device, tmp_path / "absent.bin") as cache:
        assert len(cache.data()) >= 16


def _foreign(data: bytes) -> bytes:
    header_size, version, vendor, dev_id, uuid = struct.unpack_from("<IIII16s", data)
    return struct.pack("<IIII16s", header_size, version, vendor ^ 0xFFFF, dev_id, uuid) + data[32:]


@pytest.mark.parametrize("damage", ["foreign", "truncated", "garbage"])
def test_unusable_file_is_ignored_with_a_warning(device, tmp_path, damage):
    with PipelineCache(device) as cache:
        good = cache.data()
    path = tmp_path / "pipelines.bin"
    path.write_bytes({"foreign": _foreign(good), "truncated": good[:10], "garbage": b"\x07" * 64}[damage])
    with pytest.warns(UserWarning, match=f"{path}: ignored"):
        cache = PipelineCache.load(device, path)
    with cache:
        assert cache.data()[:32] == good[:32]  # empty cache, this device's header


def test_repeated_save_and_load_keeps_the_file_size(device, compiler, tmp_path):
    """Each process loads the file, compiles and saves: the file must not grow (SwiftShader keeps
    no pipelines and returns a header followed by whatever it was seeded with)."""
    path = tmp_path / "pipelines.bin"
    x = np.random.default_rng(1).standard_normal(64, dtype=np.float32)
    sizes = []
    for _ in range(3):
        with PipelineCache.load(device, path) as cache:
            axpby(device, x, x.copy(), 1.0, compiler=compiler, pipeline_cache=cache)
            sizes.append(cache.save(path))
    assert sizes[1] == sizes[2] and sizes[0] == sizes[1], sizes
