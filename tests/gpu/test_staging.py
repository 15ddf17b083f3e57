"""StagingRing: regions reused only after their batch's fence signalled, oldest first; batches
larger than the ring get a buffer of their own, one at a time. Fences are fakes here, so each
test decides when a batch has finished."""

import numpy as np
import pytest

from vkgraph.graph.staging import StagingRing


class FakeFence:
    def __init__(self, log=None, name=""):
        self.signaled, self.log, self.name = False, log, name

    def is_signaled(self):
        return self.signaled

    def wait(self, timeout_s):
        if self.log is not None:
            self.log.append(self.name)
        self.signaled = True


@pytest.fixture
def ring(device):
    r = StagingRing(device, 1024, 16)
    yield r
    r.destroy()


def submit(ring, region, fence):
    ring.attach(region, fence)
    return fence


def test_regions_follow_each_other_and_wrap_around_once_the_oldest_is_done(ring):
    a = ring.reserve(400)
    b = ring.reserve(400)
    assert (a.buffer, a.offset, b.offset) == (ring.buffer, 0, 400)
    fa, fb = submit(ring, a, FakeFence()), submit(ring, b, FakeFence())
    fa.signaled = True
    c = ring.reserve(400)  # does not fit after b: wraps to the start, where a has finished
    assert c.offset == 0 and ring.waits == [] and not fb.signaled


def test_a_full_ring_waits_for_its_oldest_batches_in_order(ring):
    log = []
    regions = [ring.reserve(300) for _ in range(3)]  # 304 bytes each after alignment: 912 of 1024
    for i, r in enumerate(regions):
        submit(ring, r, FakeFence(log, f"batch{i}"))
    big = ring.reserve(600)  # 608 aligned, wraps to 0: overlaps batches 0 and 1 (0..608), not 2 (608..912)
    assert big.offset == 0 and log == ["batch0", "batch1"] and len(ring.waits) == 2


def test_staging_writes_at_aligned_offsets_inside_the_region(ring):
    region = ring.reserve(100)
    first = region.write(np.arange(5, dtype=np.uint8), 16)
    second = region.write(np.arange(7, dtype=np.uint8), 16)
    assert (first, second) == (region.offset, region.offset + 16)
    assert ring.buffer.read(np.uint8, 7, second).tolist() == list(range(7))
    with pytest.raises(AssertionError, match="overflows"):
        region.write(np.zeros(200, np.uint8), 16)


def test_batches_larger_than_the_ring_take_turns_with_their_own_buffers(ring):
    log = []
    first = ring.reserve(3000)
    assert first.buffer is not ring.buffer and ring.allocated_peak_nbytes == 1024 + first.buffer.nbytes
    submit(ring, first, FakeFence(log, "first"))
    second = ring.reserve(2000)  # waits for the first oversized batch and frees its buffer first
    assert log == ["first"] and not first.buffer.alive
    assert ring.allocated_peak_nbytes == 1024 + first.buffer.nbytes  # never both at once
    assert ring.in_flight_peak_nbytes == 3008  # one oversized region in flight at a time
    submit(ring, second, FakeFence(log, "second"))


def test_in_flight_is_the_high_water_mark_of_unfinished_regions(ring):
    """Bytes in flight: regions whose batch is unsubmitted or whose fence has not signalled when
    the next region is reserved; not the ring's size."""
    fences = []
    for nbytes in (200, 300):
        fences.append(submit(ring, ring.reserve(nbytes), FakeFence()))
    assert ring.in_flight_peak_nbytes == 208 + 304 == ring.in_flight_nbytes()
    fences[0].signaled = True
    assert ring.in_flight_nbytes() == 304
    submit(ring, ring.reserve(100), FakeFence())  # 304 + 112: below the high-water mark
    assert ring.in_flight_peak_nbytes == 512
    fences[1].signaled = True
    submit(ring, ring.reserve(400), FakeFence())  # 112 + 400
    assert ring.in_flight_peak_nbytes == 512 and ring.in_flight_nbytes() == 512
    submit(ring, ring.reserve(16), FakeFence())
    assert ring.in_flight_peak_nbytes == 528 and ring.allocated_peak_nbytes == 1024


def test_regions_never_submitted_are_never_reused(ring):
    ring.reserve(600)
    with pytest.raises(AssertionError, match="never submitted"):
        ring.reserve(600)  # would have to reuse the first region, whose batch was never submitted
