"""Fuzzing the file readers that take untrusted bytes: the packed-weight cache, safetensors and
GGUF. Generated inputs are mutations of valid files (byte flips, truncations, inserted junk,
rewritten headers); each reader may only raise its documented error type, and every region it
hands out lies inside the file. Each example runs under an alarm, so a hang fails the test.

CI runs VKGRAPH_FUZZ_EXAMPLES (default 200) inputs per reader; ``make fuzz`` runs 10,000."""

from __future__ import annotations

import json
import os
import signal
import struct
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vkgraph.cache.format import PAGE, PackedWeightFile, write_file
from vkgraph.errors import CacheFormatError
from vkgraph.models.gguf_file import GGUFError, GGUFFile
from vkgraph.models.safetensors import (
    SafetensorsError,
    SafetensorsFile,
    write_safetensors,
)

EXAMPLES = int(os.environ.get("VKGRAPH_FUZZ_EXAMPLES", "200"))
HANG_S = 10  # far above any single input's parse time (milliseconds)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Hang(Exception):
    pass


@contextmanager
def no_hang():
    def alarm(*_):
        raise Hang(f"parsing one input took more than {HANG_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def mutate(data, raw: bytes) -> bytes:
    """1-4 random edits of ``raw``: flip a byte, truncate, insert junk, overwrite a run, or
    write a little-endian integer (a length, count or offset) at a random place."""
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        kind = data.draw(st.sampled_from(["flip", "truncate", "junk", "overwrite", "int"]), label="kind")
        i = data.draw(st.integers(0, max(len(out) - 1, 0)), label="at")
        if kind == "flip" and out:
            out[i] ^= data.draw(st.integers(1, 255))
        elif kind == "truncate":
            out = out[:i]
        elif kind == "junk":
            out[i:i] = data.draw(st.binary(max_size=64))
        elif kind == "overwrite":
            chunk = data.draw(st.binary(min_size=1, max_size=32))
            out[i:i + len(chunk)] = chunk
        else:
            value = data.draw(st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1])
                              | st.integers(0, 2**64 - 1))
            out[i:i + 8] = struct.pack("<Q", value)
    return bytes(out)


# --- packed-weight cache --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_bytes(tmp_path_factory):
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("fuzz") / "valid.vkpw"
    write_file(path, {"driver": "fuzz"}, [(f"w{i}|src|packer", "linear_4x4", rng.integers(0, 255, n, np.uint8).tobytes())
                                          for i, n in enumerate([10, PAGE, 3 * PAGE + 5])])
    return path.read_bytes()


@FUZZ
@given(data=st.data())
def test_packed_cache_reader(tmp_path, cache_bytes, data):
    raw = mutate(data, cache_bytes)
    path = tmp_path / "fuzz.vkpw"
    path.write_bytes(raw)
    with no_hang():
        try:
            f = PackedWeightFile(path)
        except CacheFormatError:
            event("CacheFormatError")
            return
        event("accepted")
        try:
            for e in f.entries.values():
                assert PAGE <= e.offset and e.offset + e.nbytes <= len(raw)
                f.intact(e)  # checksum over the region: must stay inside the file
        finally:
            f.close()


# --- safetensors ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def safetensors_bytes(tmp_path_factory):
    rng = np.random.default_rng(8)
    path = tmp_path_factory.mktemp("fuzz") / "valid.safetensors"
    write_safetensors(path, {"a": rng.standard_normal((3, 5)).astype(np.float32),
                             "b": rng.integers(0, 9, 7).astype(np.int32),
                             "c": rng.standard_normal(4).astype(np.float16)}, {"format": "pt"})
    return path.read_bytes()


def header_strategy():
    """Headers that are valid JSON with wrong contents: odd dtypes, shapes, offsets."""
    entry = st.fixed_dictionaries({
        "dtype": st.sampled_from(["F32", "F16", "I32", "BF16", "U8", "F64", "X9", ""]) | st.integers(),
        "shape": st.lists(st.integers(-2, 2**40), max_size=4) | st.text(max_size=3),
        "data_offsets": st.lists(st.integers(-2, 2**62), min_size=0, max_size=3) | st.none(),
    })
    return st.dictionaries(st.text(max_size=8), entry | st.integers() | st.text(max_size=4), max_size=4)


@FUZZ
@given(data=st.data())
def test_safetensors_reader(tmp_path, safetensors_bytes, data):
    if data.draw(st.booleans(), label="rewrite header"):
        header = json.dumps(data.draw(header_strategy(), label="header")).encode()
        raw = struct.pack("<Q", len(header)) + header + data.draw(st.binary(max_size=256), label="body")
    else:
        raw = mutate(data, safetensors_bytes)
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(raw)
    with no_hang():
        try:
            with SafetensorsFile(path) as f:
                for name in list(f.tensors):
                    info = f.info(name)
                    arr = f.array(name)
                    assert arr.nbytes == info.nbytes and info.offset + info.nbytes <= len(raw)
                    arr.reshape(-1).view(np.uint8).sum()  # touch every byte
            event("accepted")
        except SafetensorsError:
            event("SafetensorsError")


# --- GGUF -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory):
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(9)
    path = tmp_path_factory.mktemp("fuzz") / "valid.gguf"
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


@FUZZ
@given(data=st.data())
def test_gguf_reader(tmp_path, gguf_bytes, data):
    raw = mutate(data, gguf_bytes)
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(raw)
    with no_hang():
        try:
            with GGUFFile(path) as f:
                for t in f.tensors.values():
                    assert 0 <= t.offset and t.offset + t.data.nbytes <= len(raw)
                    np.asarray(t.data).reshape(-1).view(np.uint8).sum()  # touch every byte
            event("accepted")
        except GGUFError:
            event("GGUFError")
