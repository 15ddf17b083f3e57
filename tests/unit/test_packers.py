"""The packers' host forms (what fast-load's CPU renderers pack with, prepack.host_packing) against
numpy references, whole and split over threads."""
import time

import numpy as np
import pytest

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
