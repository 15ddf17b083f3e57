"""Valid files the fuzzers start from (shared by the hypothesis tests and the atheris harness)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vkgraph.cache.format import PAGE, PackedWeightFile, write_file
from vkgraph.errors import CacheFormatError, GGUFError, PteFormatError, SafetensorsError
from vkgraph.models.gguf_file import GGUFFile
from vkgraph.models.safetensors import SafetensorsFile, write_safetensors
from vkgraph.pte.reader import PteFile

PROGRAMS = Path(__file__).resolve().parents[1] / "data" / "programs"


def cache_file(d: Path) -> bytes:
    rng = np.random.default_rng(7)
    path = d / "valid.vkpw"
    write_file(path, {"driver": "fuzz"}, [(f"w{i}|src|packer", "linear_4x4", rng.integers(0, 255, n, np.uint8).tobytes())
                                          for i, n in enumerate([10, PAGE, 3 * PAGE + 5])])
    return path.read_bytes()


def safetensors_file(d: Path) -> bytes:
    rng = np.random.default_rng(8)
    path = d / "valid.safetensors"
    write_safetensors(path, {"a": rng.standard_normal((3, 5)).astype(np.float32),
                             "b": rng.integers(0, 9, 7).astype(np.int32),
                             "c": rng.standard_normal(4).astype(np.float16)}, {"format": "pt"})
    return path.read_bytes()


def gguf_file(d: Path) -> bytes:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(9)
    path = d / "valid.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_string("general.name", "fuzz")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
    w.add_tensor("norm.weight", rng.standard_normal(32).astype(np.float32))
    w.add_tensor("q8.weight", quantize(rng.standard_normal((2, 64)).astype(np.float32),
                                       gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def read_cache(path: Path, size: int) -> bool:
    """Parse a cache file and checksum every region; False when rejected with CacheFormatError."""
    try:
        f = PackedWeightFile(path)
    except CacheFormatError:
        return False
    try:
        for e in f.entries.values():
            assert PAGE <= e.offset and e.offset + e.nbytes <= size
            f.intact(e)
    finally:
        f.close()
    return True


def read_safetensors(path: Path, size: int) -> bool:
    try:
        with SafetensorsFile(path) as f:
            for name in list(f.tensors):
                info = f.info(name)
                arr = f.array(name)
                assert arr.nbytes == info.nbytes and info.offset + info.nbytes <= size
                arr.reshape(-1).view(np.uint8).sum()  # touch every byte
    except SafetensorsError:
        return False
    return True


def read_gguf(path: Path, size: int) -> bool:
    try:
        with GGUFFile(path) as f:
            for t in f.tensors.values():
                assert 0 <= t.offset and t.offset + t.data.nbytes <= size
                np.asarray(t.data).reshape(-1).view(np.uint8).sum()  # touch every byte
    except GGUFError:
        return False
    return True


def pte_file(d: Path) -> bytes:
    """An exported program with two delegates and a CPU kernel between them."""
    return (PROGRAMS / "convnet.pte").read_bytes()


def read_pte(path: Path, size: int) -> bool:
    """Parse the program and every delegate's VkGraph; every constant region lies in the file."""
    try:
        with PteFile(path) as f:
            for plan in f.plans:
                for v in plan.values:
                    if v.kind == "tensor" and v.value.data is not None:
                        off, n = v.value.data
                        assert 0 <= off and off + n <= size
                for d in plan.delegates:
                    assert 0 <= d.offset and d.offset + d.nbytes <= size
                    if d.id == "VulkanBackend":
                        for off, n in f.vkgraph(d).constants:
                            assert 0 <= off and off + n <= size
                            np.frombuffer(f.mapping, np.uint8, n, off).sum()  # touch every byte
    except PteFormatError:
        return False
    return True


#: reader name: (seed builder, file suffix, read function; only the documented error is caught)
READERS = {
    "cache": (cache_file, ".vkpw", read_cache),
    "safetensors": (safetensors_file, ".safetensors", read_safetensors),
    "gguf": (gguf_file, ".gguf", read_gguf),
    "pte": (pte_file, ".pte", read_pte),
}
