"""Fuzzing the file readers that take untrusted bytes: the packed-weight cache, safetensors,
GGUF and ExecuTorch programs (.pte with their ET-VK delegates). Generated inputs are mutations of valid files (byte flips, truncations, inserted junk,
rewritten headers); each reader may only raise its documented error type, and every region it
hands out lies inside the file. Each example runs under an alarm, so a hang fails the test.

CI runs VKGRAPH_FUZZ_EXAMPLES (default 200) inputs per reader; ``make fuzz`` runs 10,000, and
then ``atheris_readers.py`` (coverage-guided, libFuzzer) when atheris installs."""

from __future__ import annotations

import json
import os
import signal
import struct
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .seeds import READERS

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


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    return {name: build(d) for name, (build, _, _) in READERS.items()}


def check(tmp_path, name: str, raw: bytes) -> None:
    _, suffix, read = READERS[name]
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(raw)
    with no_hang():
        event("accepted" if read(path, len(raw)) else "rejected with the documented error")


@FUZZ
@given(data=st.data())
def test_packed_cache_reader(tmp_path, valid, data):
    check(tmp_path, "cache", mutate(data, valid["cache"]))


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
def test_safetensors_reader(tmp_path, valid, data):
    if data.draw(st.booleans(), label="rewrite header"):
        header = json.dumps(data.draw(header_strategy(), label="header")).encode()
        raw = struct.pack("<Q", len(header)) + header + data.draw(st.binary(max_size=256), label="body")
    else:
        raw = mutate(data, valid["safetensors"])
    check(tmp_path, "safetensors", raw)


@FUZZ
@given(data=st.data())
def test_gguf_reader(tmp_path, valid, data):
    check(tmp_path, "gguf", mutate(data, valid["gguf"]))


@FUZZ
@given(data=st.data())
def test_pte_reader(tmp_path, valid, data):
    check(tmp_path, "pte", mutate(data, valid["pte"]))
