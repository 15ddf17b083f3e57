"""The packed-weight cache: cold loads write it, warm loads skip staging and packing (zero-copy
where the device imports host memory), and a bad or foreign file is rebuilt with a warning."""

import warnings

import numpy as np
import pytest

from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph

from .conftest import hit_path

PACKERS = ["linear_4x4", "identity", "transposed", "q8_0"]


def weights(seed, count=8):
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        w = rng.standard_normal((int(rng.integers(4, 40)), 32 * int(rng.integers(1, 4)))).astype(np.float32)
        packer = PACKERS[i % len(PACKERS)]
        if packer == "q8_0":
            w = quantize(w, gguf.GGMLQuantizationType.Q8_0)
        out.append((f"layer.{i}", w, packer))
    return out


def load(device, compiler, path, model, legacy=False, **cfg):
    # packing shaders on every device (a miss packs on the GPU), unless cfg names prepack.host_packing
    g = ComputeGraph(GraphConfig().replace(cache__packed_weights_path=str(path), **{"prepack__host_packing": "never", **cfg}),
                     device=device, compiler=compiler)
    refs = []
    for name, w, packer in model:
        ref = g.add_tensorref(w, name, quant="q8_0" if packer == "q8_0" else "")
        refs.append(g.prepack_tensor(ref, packer))
    x = g.add_input((2, 32), np.float32, "x")
    w0 = [r for r, (_, w, p) in zip(refs, model) if p == "linear_4x4" and w.shape[1] == 32]
    if w0:
        g.set_output(ops.linear(g, x, w0[0]), "y")
    report = g.prepack() if legacy else g.run_prepack()
    return g, refs, report


@pytest.mark.parametrize("legacy", [False, True])
def test_cold_then_warm(device, compiler, tmp_path, legacy):
    path = tmp_path / "w.vkpw"
    model = weights(1)
    g, refs, cold = load(device, compiler, path, model, legacy)
    with g:
        packed = [bytes(g.read_tensor(r)) for r in refs]
    assert cold.cache_hits == 0 and cold.cache_misses == len(model) and cold.packing_dispatches > 0
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    g, refs, warm = load(device, compiler, path, model, legacy)
    with g:
        assert [bytes(g.read_tensor(r)) for r in refs] == packed  # byte-identical to the cold load
        assert warm.cache_hits == len(model) and warm.cache_misses == 0
        assert warm.packing_dispatches == 0 and warm.submits == 0
        assert set(warm.tensor_paths.values()) == {hit_path(device)}
        assert warm.zero_copy_tensors == (len(model) if hit_path(device) == "zero-copy" else 0)
        if "y" in g.outputs:
            x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
            w = next(w for _, w, p in model if p == "linear_4x4" and w.shape[1] == 32)
            np.testing.assert_allclose(g.execute({"x": x})["y"], x @ w.T, rtol=1e-5, atol=1e-5)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (size, mtime)  # nothing new: nothing written


def test_file_size_stable_over_cycles(device, compiler, tmp_path):
    path = tmp_path / "w.vkpw"
    model = weights(2, count=4)
    sizes = set()
    for _ in range(20):
        g, _, report = load(device, compiler, path, model)
        g.destroy()
        sizes.add(path.stat().st_size)
    assert len(sizes) == 1 and report.cache_hits == 4


def test_two_models_share_one_file(device, compiler, tmp_path):
    path = tmp_path / "shared.vkpw"
    a, b = weights(3, count=3), [(f"other.{n}", w, p) for n, w, p in weights(4, count=3)]
    for model in (a, b):
        g, _, r = load(device, compiler, path, model)
        g.destroy()
        assert r.cache_misses == 3
    for model in (a, b):
        g, _, r = load(device, compiler, path, model)
        g.destroy()
        assert r.cache_hits == 3 and r.cache_misses == 0


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip-index", "foreign"])
def test_bad_file_is_rebuilt_with_a_warning(device, compiler, tmp_path, damage):
    import json

    path = tmp_path / "w.vkpw"
    model = weights(5, count=4)
    g, refs, _ = load(device, compiler, path, model)
    with g:
        packed = [bytes(g.read_tensor(r)) for r in refs]
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "garbage":
        raw[:64] = b"\x13" * 64
    elif damage == "flip-index":
        raw[-40] ^= 0xFF
    else:
        ident = json.dumps({"driver": "someone else's GPU", "device_id": 7}).encode()
        raw[8:12] = len(ident).to_bytes(4, "little")
        raw[12:12 + 200] = (ident + b" " * 200)[:200]
        raw[12 + len(ident):4096] = bytes(4096 - 12 - len(ident))
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="packed-weight cache rejected, it will be rebuilt"):
        g, refs, report = load(device, compiler, path, model)
    with g:
        assert report.cache_hits == 0 and report.cache_misses == 4
        assert [bytes(g.read_tensor(r)) for r in refs] == packed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is good again
        g, _, report = load(device, compiler, path, model)
        g.destroy()
    assert report.cache_hits == 4


def test_changed_weights_file_misses(device, compiler, tmp_path):
    """A weights file rewritten with other weights misses (keys cover the content)."""
    import os

    from vkgraph.models.safetensors import SafetensorsFile, write_safetensors

    weights_file, path = tmp_path / "m.safetensors", tmp_path / "w.vkpw"
    rng = np.random.default_rng(9)

    def load_file():
        with SafetensorsFile(weights_file) as st:
            g = ComputeGraph(GraphConfig().replace(cache__packed_weights_path=str(path)), device=device, compiler=compiler)
            info = st.info("w")
            ref = g.prepack_tensor(g.add_tensorref(st.source("w"), "w", shape=info.shape, dtype=info.dtype), "linear_4x4")
            report = g.run_prepack()
            packed = bytes(g.read_tensor(ref))
            g.destroy()
        return report, packed

    first = rng.standard_normal((8, 32)).astype(np.float32)
    write_safetensors(weights_file, {"w": first})
    assert load_file()[0].cache_misses == 1
    assert load_file()[0].cache_hits == 1
    second = rng.standard_normal((8, 32)).astype(np.float32)
    write_safetensors(weights_file, {"w": second})
    st_ = weights_file.stat()
    os.utime(weights_file, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000))
    report, packed = load_file()
    assert report.cache_misses == 1 and report.cache_hits == 0
    assert packed == load_file()[1]  # and the new entry serves the next load


def test_damaged_region_is_never_used(device, compiler, tmp_path):
    """A flipped byte inside a packed region (index intact): the warm load notices, packs from
    the source, gives correct results, and the rebuilt file is good."""
    from vkgraph.cache.format import PackedWeightFile

    path = tmp_path / "w.vkpw"
    model = weights(6, count=4)
    g, refs, _ = load(device, compiler, path, model)
    with g:
        packed = [bytes(g.read_tensor(r)) for r in refs]
    f = PackedWeightFile(path)
    victim = next(iter(f.entries.values()))
    f.close()
    raw = bytearray(path.read_bytes())
    raw[victim.offset + 3] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="region checksum mismatch"):
        g, refs, report = load(device, compiler, path, model)
    with g:
        assert report.cache_hits == 0 and [bytes(g.read_tensor(r)) for r in refs] == packed
    f = PackedWeightFile(path)
    assert f.verify() == [] and len(f.entries) == 4
    f.close()


# --- a cache that cannot be written costs the cache, never the load ---------------------------------


def check_model_runs(g, model):
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    w = next(w for _, w, p in model if p == "linear_4x4" and w.shape[1] == 32)
    np.testing.assert_allclose(g.execute({"x": x})["y"], x @ w.T, rtol=1e-5, atol=1e-5)


def test_cache_path_through_a_file_warns_and_keeps_the_load(device, compiler, tmp_path):
    (tmp_path / "plain").write_text("not a directory")
    path = tmp_path / "plain" / "w.vkpw"
    model = weights(1)
    with pytest.warns(UserWarning, match=rf"packed-weight cache not saved: {path}: .*(File exists|Not a directory)"):
        g, refs, report = load(device, compiler, path, model)
    with g:
        assert report.cache_misses == len(model) and g.prepacked
        check_model_runs(g, model)


@pytest.mark.parametrize("older_file", [False, True])
def test_full_disk_warns_keeps_the_load_and_leaves_no_partial_file(device, compiler, tmp_path, monkeypatch, older_file):
    import errno

    import vkgraph.cache.format as fmt

    path = tmp_path / "w.vkpw"
    model = weights(2)
    if older_file:  # a complete file of another model is already there
        g, _, _ = load(device, compiler, path, [(f"other.{n}", w, p) for n, w, p in weights(3, count=2)])
        g.destroy()
        before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fmt.os, "fsync", full)
    with pytest.warns(UserWarning, match=rf"packed-weight cache not saved: {path}: .*No space left on device"):
        g, _, report = load(device, compiler, path, model)
    with g:
        check_model_runs(g, model)
    assert not list(tmp_path.glob(".w.vkpw.*"))  # no temporary file left behind
    if older_file:
        assert path.read_bytes() == before  # the older file is untouched, and still whole
    else:
        assert not path.exists()


def test_auto_mode_keeps_the_load_when_the_save_runs_out_of_memory(device, compiler, tmp_path, monkeypatch):
    """The save reads packed tensors back (a staging buffer on a discrete GPU): running out of
    memory there is a failed save, not a reason to retry the load in reduce-peak mode."""
    from vkgraph.errors import OutOfDeviceMemoryError

    def no_memory(self, ref):
        raise OutOfDeviceMemoryError("vkAllocateMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY", "read-back buffer")

    monkeypatch.setattr(ComputeGraph, "read_tensor", no_memory)
    model = weights(3)
    with pytest.warns(UserWarning, match="packed-weight cache not saved: .*VK_ERROR_OUT_OF_DEVICE_MEMORY"):
        g, _, report = load(device, compiler, tmp_path / "w.vkpw", model, prepack__reduce_peak_memory="auto")
    with g:
        assert report.mode == "staged" and not report.retried_after
        check_model_runs(g, model)


def test_failing_cache_hit_frees_the_whole_run(device, compiler, tmp_path):
    """A hit that cannot get its memory (here: past the device budget) fails the load and frees
    everything the load made, the staging ring and pools included."""
    from vkgraph.errors import OutOfDeviceMemoryError
    from vkgraph.runtime import live_objects

    path = tmp_path / "w.vkpw"
    model = weights(2, count=4)
    g, _, _ = load(device, compiler, path, model)
    g.destroy()
    model = model + [("new.miss", np.ones((8, 32), np.float32), "linear_4x4")]  # a miss: the run needs staging
    budget = device.allocated_nbytes + 2048  # the miss's staging fits, a hit's imported page does not
    cfg = GraphConfig().replace(cache__packed_weights_path=str(path), device__max_memory_nbytes=budget)
    with ComputeGraph(cfg, device=device, compiler=compiler) as g:
        for name, w, packer in model:
            g.prepack_tensor(g.add_tensorref(w, name, quant="q8_0" if packer == "q8_0" else ""), packer)
        g.prepare()
        live, allocated = live_objects(), device.allocated_nbytes
        with pytest.raises(OutOfDeviceMemoryError, match="budget"):
            g.run_prepack()
        assert live_objects() == live and device.allocated_nbytes == allocated


def test_unaligned_index_is_rebuilt_with_a_warning(device, compiler, tmp_path):
    """A valid-looking file whose index does not start on a page (another writer's): the last
    region's page cannot be imported whole, so the file is rejected and rebuilt."""
    from tests.unit.test_cache_format import unalign_index

    path = tmp_path / "w.vkpw"
    model = weights(3, count=4)
    g, refs, _ = load(device, compiler, path, model)
    with g:
        packed = [bytes(g.read_tensor(r)) for r in refs]
    unalign_index(path)
    with pytest.warns(UserWarning, match="rebuilt: .*index offset .* is not page-aligned"):
        g, refs, report = load(device, compiler, path, model)
    with g:
        assert report.cache_hits == 0 and [bytes(g.read_tensor(r)) for r in refs] == packed
        check_model_runs(g, model)


def test_device_refusing_file_pages_gets_copies(device, compiler, tmp_path, monkeypatch):
    """Drivers may refuse to import file-backed pages as host memory (Mesa and IREE probe for
    it): the warm load warns once and copies the cached weights instead."""
    import weakref

    from vkgraph.cache import packed_cache
    from vkgraph.errors import VulkanError

    path = tmp_path / "w.vkpw"
    model = weights(1)
    g, refs, _ = load(device, compiler, path, model)
    with g:
        packed = [bytes(g.read_tensor(r)) for r in refs]

    def refuse(*args, **kwargs):
        raise VulkanError("vkAllocateMemory", "VK_ERROR_INVALID_EXTERNAL_HANDLE", "file-backed pages")

    monkeypatch.setattr(packed_cache, "ImportedBuffer", refuse)
    if not device.unified_memory:  # a discrete GPU never tries: pretend its memory is the host's
        monkeypatch.setattr(device.physical, "type", "integrated-gpu")
    monkeypatch.setattr(packed_cache, "FILE_IMPORTS", weakref.WeakKeyDictionary())  # this test's own probe,
    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(tmp_path / "memo"))  # remembered only here
    with pytest.warns(UserWarning, match="refuses to import file-backed pages.*INVALID_EXTERNAL_HANDLE") as seen:
        g, refs, report = load(device, compiler, path, model)
    assert len([w for w in seen if "file-backed" in str(w.message)]) == 1  # once, not per tensor
    with g:
        assert report.cache_hits == len(model) and report.zero_copy_tensors == 0 and report.packing_dispatches == 0
        assert set(report.tensor_paths.values()) == {"copy"}
        assert [bytes(g.read_tensor(r)) for r in refs] == packed
        check_model_runs(g, model)


def test_discrete_gpu_copies_hits_into_its_own_memory(device, compiler, tmp_path, monkeypatch):
    """A discrete GPU would read imported host pages across the bus on every dispatch (an H100
    decoded SmolLM2 at less than half the speed from them): its hits are copied into its own
    memory, with no warning (nothing was refused) and no probe."""
    from vkgraph.cache import packed_cache

    path = tmp_path / "w.vkpw"
    model = weights(1)
    g, refs, _ = load(device, compiler, path, model)
    with g:
        packed = [bytes(g.read_tensor(r)) for r in refs]
    monkeypatch.setattr(device.physical, "type", "discrete-gpu")
    monkeypatch.setattr(packed_cache, "_probe_file_imports", None)  # never called
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g, refs, report = load(device, compiler, path, model)
    with g:
        assert not device.unified_memory and hit_path(device) == "copy"
        assert report.cache_hits == len(model) and report.zero_copy_tensors == 0 and report.packing_dispatches == 0
        assert set(report.tensor_paths.values()) == {"copy"}
        assert [bytes(g.read_tensor(r)) for r in refs] == packed
        check_model_runs(g, model)


def test_weights_replaced_with_the_same_size_and_mtime_miss(device, compiler, tmp_path):
    """Reproducible wheels give every file one mtime, and cp -p, tar and rsync restore mtimes:
    a weights file replaced by another of the same size and mtime must not be served the first
    file's packed weights. Keys cover content, so a copy of the file elsewhere hits."""
    import os
    import shutil

    from vkgraph.models.safetensors import SafetensorsFile, write_safetensors

    rng = np.random.default_rng(10)
    weights_file, cache = tmp_path / "m.safetensors", tmp_path / "w.vkpw"

    def load_file(f):
        with SafetensorsFile(f) as st, ComputeGraph(GraphConfig().replace(cache__packed_weights_path=str(cache)),
                                                    device=device, compiler=compiler) as g:
            refs = []
            for name in ("small", "big"):
                info = st.info(name)
                refs.append(g.prepack_tensor(g.add_tensorref(st.source(name), name, shape=info.shape, dtype=info.dtype),
                                             "linear_4x4"))
            report = g.run_prepack()
            return report, [bytes(g.read_tensor(r)) for r in refs]

    first = {"small": rng.standard_normal((8, 32)).astype(np.float32),
             "big": rng.standard_normal((1024, 512)).astype(np.float32)}  # 2 MiB
    write_safetensors(weights_file, first)
    stamp = weights_file.stat()
    cold, packed = load_file(weights_file)
    assert cold.cache_misses == 2
    second = {k: v.copy() for k, v in first.items()}
    second["small"][3, 5] += 1.0  # one weight of a small tensor
    second["big"] = -second["big"]  # every weight of a big one (a re-quantized model)
    write_safetensors(weights_file, second)
    os.utime(weights_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert weights_file.stat().st_size == stamp.st_size and weights_file.stat().st_mtime_ns == stamp.st_mtime_ns
    report, got = load_file(weights_file)
    assert report.cache_hits == 0 and report.cache_misses == 2 and got != packed
    copied = tmp_path / "elsewhere" / "m.safetensors"
    copied.parent.mkdir()
    shutil.copy2(weights_file, copied)
    report, again = load_file(copied)
    assert report.cache_hits == 2 and again == got


def test_fingerprints_are_remembered_while_the_file_is_unchanged(device, compiler, tmp_path, monkeypatch):
    """A warm load does not read the weights to fingerprint them again; any write to the file
    (here: the same bytes, so the same fingerprints) makes the next load read them."""
    from vkgraph.graph.values import ArraySource
    from vkgraph.models.safetensors import SafetensorsFile, write_safetensors

    weights_file, cache = tmp_path / "m.safetensors", tmp_path / "w.vkpw"
    tensors = {f"w{i}": np.random.default_rng(i).standard_normal((64, 32)).astype(np.float32) for i in range(3)}
    write_safetensors(weights_file, tensors)
    reads = []
    real = ArraySource.fingerprint
    monkeypatch.setattr(ArraySource, "fingerprint", lambda self: reads.append(1) or real(self))

    def warm_load():
        reads.clear()
        with SafetensorsFile(weights_file) as st, ComputeGraph(GraphConfig().replace(cache__packed_weights_path=str(cache)),
                                                               device=device, compiler=compiler) as g:
            for name in tensors:
                info = st.info(name)
                g.prepack_tensor(g.add_tensorref(st.source(name), name, shape=info.shape, dtype=info.dtype), "linear_4x4")
            return g.run_prepack(), len(reads)

    assert warm_load()[1] == 3  # cold: fingerprinted, remembered
    report, read = warm_load()
    assert report.cache_hits == 3 and read == 0
    weights_file.write_bytes(weights_file.read_bytes())  # rewritten: new ctime
    report, read = warm_load()
    assert report.cache_hits == 3 and read == 3
