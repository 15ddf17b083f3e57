"""Soak: load, execute and unload ``synthetic:64`` many times in one process. RSS must not grow,
every Vulkan object must be destroyed each cycle, and the packed-weight cache file (written by the
first cycle, read zero-copy by every other one) must keep its size.

CI runs VKGRAPH_SOAK_CYCLES (default 20) cycles; ``make soak`` runs 100."""

import ctypes
import gc
import os

import pytest

from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph
from vkgraph.models import outputs_match, synthetic
from vkgraph.models.safetensors import SafetensorsFile
from vkgraph.runtime import live_objects

CYCLES = max(2, int(os.environ.get("VKGRAPH_SOAK_CYCLES", "20")))


def rss_nbytes() -> int:
    """Resident memory once the collector ran and malloc gave its free pages back: what is still
    held, not what the allocator keeps cached."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_load_execute_unload_cycles(device, compiler, tmp_path):
    spec = synthetic.SyntheticSpec.for_size(64)
    ids = synthetic.sample_ids(spec)
    cache = tmp_path / "soak.vkpw"
    live, allocated = live_objects(), device.allocated_nbytes
    rss, cache_size = [], None
    with SafetensorsFile(synthetic.weights_path(spec)) as st:
        expect = synthetic.reference(st, spec, ids)
        for cycle in range(CYCLES):
            # even cycles use the packed-weight cache (cold once, then warm), odd ones pack
            cfg = GraphConfig().replace(cache__packed_weights_path=str(cache) if cycle % 2 == 0 else "")
            with ComputeGraph(cfg, device=device, compiler=compiler) as g:
                synthetic.build(g, st, spec)
                report = g.run_prepack()
                got = g.execute({"ids": ids})["logits"]
            assert outputs_match(got, expect), cycle
            assert live_objects() == live and device.allocated_nbytes == allocated, cycle
            if cycle % 2 == 0:
                assert report.cache_hits == (0 if cycle == 0 else report.nodes), cycle
                cache_size = cache_size or cache.stat().st_size
                assert cache.stat().st_size == cache_size, cycle
            rss.append(rss_nbytes())
    # The baseline is the end of cycle 2: by then both paths (packing, and the cache) ran once.
    growth = rss[-1] / rss[1] - 1
    print(f"soak: {CYCLES} cycles, RSS after cycle 2 {rss[1] / 2**20:.1f} MiB, after cycle {CYCLES} "
          f"{rss[-1] / 2**20:.1f} MiB ({growth:+.2%}), max {max(rss) / 2**20:.1f} MiB; "
          f"per cycle: {[round(r / 2**20) for r in rss]}")
    assert growth <= 0.05
