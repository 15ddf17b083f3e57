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


def _add_graph(device, compiler, **cfg):
    from vkgraph import ops
    from vkgraph.config import GraphConfig
    from vkgraph.graph import ComputeGraph

    g = ComputeGraph(GraphConfig().replace(**cfg), device=device, compiler=compiler)
    a, b = g.add_input((4, 8), np.float32, "a"), g.add_input((4, 8), np.float32, "b")
    g.set_output(ops.add(g, a, b), "out")
    g.prepare()
    return g


def test_graphs_share_the_device_cache_unless_configured(device, compiler, tmp_path):
    """With ``cache.pipeline_cache_path = ""`` every graph's pipelines go through the device's
    VkPipelineCache (SwiftShader keeps compiled pipelines in it: a graph of the same kernels
    compiles none), which outlives the graphs; a configured file gets a cache of its own, destroyed
    with the graph."""
    with _add_graph(device, compiler) as g1, _add_graph(device, compiler) as g2:
        assert g1.kernels._cache() is g2.kernels._cache() is device.pipeline_cache
        x = np.random.default_rng(2).standard_normal((2, 4, 8), dtype=np.float32)
        g2.run_prepack()
        np.testing.assert_array_equal(g2.execute({"a": x[0], "b": x[1]})["out"], x[0] + x[1])
    assert device.pipeline_cache.alive
    path = tmp_path / "own.bin"
    with _add_graph(device, compiler, cache__pipeline_cache_path=str(path)) as g:
        own = g.kernels._cache()
        assert own is not device.pipeline_cache and own.alive
    assert not own.alive and device.pipeline_cache.alive
