"""The packers' host forms (what fast-load's CPU renderers pack with, prepack.host_packing) against
numpy references, whole and split over threads."""
import time

import numpy as np
import pytest

from vkgraph.ggml import FORMATS
from vkgraph.graph import packers
from vkgraph.graph.values import ArraySource, TensorRef


def ref_linear_4x4(w):
    n, k = w.shape
    n4, k4 = -(-n // 4), -(-k // 4)
    padded = np.zeros((n4 * 4, k4 * 4), w.dtype)
    padded[:n, :k] = w
    return padded.reshape(n4, 4, k4, 4).transpose(0, 2, 3, 1)  # [n4][k4][kk][nn]


REFERENCE = {"linear_4x4": ref_linear_4x4, "transposed": lambda w: w.T, "identity": lambda w: w}


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("packer", list(REFERENCE))
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (17, 33), (64, 130), (257, 96)])
def test_host_forms_match_numpy_whole_and_split(monkeypatch, packer, shape, split):
    """Split (every size, three slices of uneven length on the pool's threads), a host form
    writes exactly what it writes in one piece: numpy's reference, the padding zero."""
    if split:
        monkeypatch.setattr(packers, "HOST_SPLIT_MIN_NBYTES", 0)
        monkeypatch.setattr(packers, "host_cores", lambda: 3)
    w = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    src = TensorRef("w", shape, w.dtype, ArraySource(w))
    p = packers.get_packer(packer)
    out = np.full(p.packed_nbytes(src), 0xAB, np.uint8)  # not zero: the padding must be written
    p.pack_host(src, w.reshape(-1).view(np.uint8), out)
    np.testing.assert_array_equal(out.view(np.float32), REFERENCE[packer](w).reshape(-1))


def test_a_failing_slice_raises_after_all_slices_ran(monkeypatch):
    monkeypatch.setattr(packers, "host_cores", lambda: 4)
    done = []

    def part(lo, hi):
        if lo == 0:
            raise ValueError("slice 0")
        time.sleep(0.05)  # still writing when slice 0 has failed
        done.append((lo, hi))
    with pytest.raises(ValueError, match="slice 0"):
        packers.host_split(8, packers.HOST_SPLIT_MIN_NBYTES, part)
    assert sorted(done) == [(2, 4), (4, 6), (6, 8)]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("blocks", [1, 7, 33])
def test_ggml_planes_match_the_blocks_taken_apart(fmt, blocks):
    """GGML blocks in planes (what CPU renderers' kernels read): every block's quants one after
    another, then every head zero-extended to a 32-bit word, padded with zeros to whole 16-byte
    texels; random blocks, the destination not zero to begin with."""
    f = FORMATS[fmt]
    raw = np.random.default_rng(blocks).integers(0, 256, (blocks, f.block_nbytes), np.uint8)
    src = TensorRef("w", raw.shape, raw.dtype, ArraySource(raw), quant=fmt)
    p = packers.get_packer(f"{fmt}_planes")
    out = np.full(p.packed_nbytes(src), 0xAB, np.uint8)
    p.pack_host(src, raw.reshape(-1), out)
    head = f.head_nbytes
    words = np.zeros((blocks, 4), np.uint8)
    words[:, :head] = raw[:, :head]
    ref = np.concatenate([raw[:, head:].reshape(-1), words.reshape(-1)])
    assert out.nbytes == -(-ref.nbytes // 16) * 16
    np.testing.assert_array_equal(out[:ref.nbytes], ref)
    assert not out[ref.nbytes:].any()
