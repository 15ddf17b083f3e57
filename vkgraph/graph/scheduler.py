"""The submission policy (ARCHITECTURE.md §4), pure Python: when prepack and execute submit,
how much staging each prepack mode holds, and which mode a load runs in.

No Vulkan here: the graph asks this module *when* to submit and does the submitting itself, and
the load simulator replays the same decisions, so both agree on every cut point and on peak
staging.

Prepack rule (as ET-VK's ``ComputeGraph::prepack``): before encoding node ``i`` -- never the first
node nor the last -- submit the current command buffer if the staging bytes already in it exceed
the byte threshold, or the nodes already in it exceed the node threshold. The initial thresholds
apply until the first cut, the steady ones after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..config import GraphConfig

MODES = ("legacy", "staged", "reduce-peak")
#: Most bytes of a load's weights whose memory blocks are advised as huge pages on CPU renderers
#: (PrepackPlan.direct_huge_pages, PrepackPlan.populated_huge_pages): on this project's VMs huge
#: pages loaded 86-92 MiB of weights faster (SmolLM2, MiniLM) and 244 MiB or more slower
#: (synthetic:256 and :512).
HUGE_PAGES_UP_TO_NBYTES = 128 << 20
#: CPU renderers whose staged loads leave the pages of a packing shader's buffers to its first
#: stores (PrepackPlan.populates_destinations, with ``prepack.populate_destinations = "auto"``),
#: as (renderer, SIMD lanes, host_cpu()). There a shader's page fault costs less than populating
#: (a pass of the CPU over the pages, on the cores the packing threads run on): the profile
#: measured there packs faster into fresh pages than into populated ones and prices the faults
#: at 17.9 GB/s (profiles/lavapipe-xeon.toml), and a load's GPU time fell with populating off
#: (synthetic:512 0.693 -> 0.551 s, its CPU time 0.542 -> 0.257). Staged first loads on that host
#: (lavapipe at 512 bits, 2026-11-29, fresh processes alternating, medians), populated against
#: not: synthetic:512 0.741 -> 0.566 s, 0.768 -> 0.600 and 0.703 -> 0.582 in three runs (copy
#: floor 0.28), synthetic:256 0.366 -> 0.310, MiniLM 0.087 -> 0.075 and 0.077 -> 0.069.
#: SwiftShader on that host packs faster into populated pages (synthetic:512 0.523 against
#: 0.553 s), as both renderers do on the Zen 4 host (lavapipe at 512 bits 0.542 against 0.645).
UNPOPULATED_DEVICES = frozenset({("lavapipe", 16, "GenuineIntel family 6 model 207")})


def populates(cfg: GraphConfig, renderer: str, simd_width: int, host: str) -> bool:
    """Whether staged loads on this CPU renderer populate the packing shaders' buffers
    (``prepack.populate_destinations``; "auto": unless the device is in UNPOPULATED_DEVICES)."""
    choice = cfg.prepack.populate_destinations
    if choice == "auto":
        return (renderer, simd_width, host) not in UNPOPULATED_DEVICES
    return bool(choice)


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class PrepackThresholds:
    initial_nbytes: int
    nbytes: int
    initial_nodes: int
    nodes: int

    @classmethod
    def from_config(cls, cfg: GraphConfig) -> PrepackThresholds:
        """The thresholds in force (0 in the config means the default)."""
        p = cfg.resolved.prepack
        return cls(initial_nbytes=p.initial_threshold_nbytes, nbytes=p.threshold_nbytes,
                   initial_nodes=p.initial_threshold_nodes, nodes=p.threshold_nodes)


class PrepackCutter:
    """The prepack rule, one node at a time: call :meth:`cut_before` before encoding node ``i``
    and :meth:`add` after encoding it."""

    def __init__(self, thresholds: PrepackThresholds, node_count: int):
        self.thresholds = thresholds
        self.node_count = node_count
        self.nbytes_in_cmd = 0
        self.nodes_in_cmd = 0
        self.cuts = 0

    def cut_before(self, i: int) -> bool:
        """Whether to submit the current command buffer before encoding node ``i`` (and if so,
        start counting a new one)."""
        if i == 0 or i == self.node_count - 1:
            return False
        t = self.thresholds
        first = self.cuts == 0
        limit_nbytes = t.initial_nbytes if first else t.nbytes
        limit_nodes = t.initial_nodes if first else t.nodes
        if self.nbytes_in_cmd > limit_nbytes or self.nodes_in_cmd > limit_nodes:
            self.cuts += 1
            self.nbytes_in_cmd = 0
            self.nodes_in_cmd = 0
            return True
        return False

    def add(self, staging_nbytes: int) -> None:
        self.nbytes_in_cmd += staging_nbytes
        self.nodes_in_cmd += 1


def prepack_cut_points(staging_nbytes: Sequence[int], thresholds: PrepackThresholds) -> list[int]:
    """Indices ``i`` before which a command buffer is submitted, for nodes staging these bytes."""
    cutter = PrepackCutter(thresholds, len(staging_nbytes))
    cuts = []
    for i, nbytes in enumerate(staging_nbytes):
        if cutter.cut_before(i):
            cuts.append(i)
        cutter.add(nbytes)
    return cuts


def batches(count: int, cut_points: Sequence[int]) -> list[range]:
    """The node ranges of each command buffer, given the cut points."""
    edges = [0, *cut_points, count]
    return [range(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def reduce_peak_memory(cfg: GraphConfig, total_constant_nbytes: int) -> bool:
    """Whether the load runs in reduce-peak mode (``true``; ``"auto"`` above the limit)."""
    mode = cfg.prepack.reduce_peak_memory
    if mode == "auto":
        return total_constant_nbytes > cfg.resolved.prepack.auto_reduce_above_nbytes
    return bool(mode)


def run_prepack_mode(cfg: GraphConfig, total_constant_nbytes: int) -> str:
    """The mode ``run_prepack()`` starts in: "reduce-peak" or "staged"."""
    return "reduce-peak" if reduce_peak_memory(cfg, total_constant_nbytes) else "staged"


@dataclass(frozen=True)
class PrepackPlan:
    """How one prepack runs: its command buffers and the staging it holds.

    - legacy: one command buffer; all its staging is alive at once.
    - staged: cut by the thresholds; staging is a ring of ``staging_ring_nbytes`` (at most what
      the load stages), reused as batches finish.
    - reduce-peak: cut by the thresholds; one batch of staging, reused after waiting for each batch.
    """

    mode: str
    batches: list[range]  # node index ranges, one per command buffer
    batch_nbytes: list[int]  # staging each batch reserves (every node's bytes aligned)
    staging_capacity: int
    direct_nbytes: int = 0  # device memory of the weights the CPU writes itself (packers.packs_on_host)
    packed_nbytes: int = 0  # buffer memory of the weights the GPU writes (packing shaders, copies)
    populate: bool = True  # a staged load populates the packing shaders' buffers (populates())

    @property
    def waits_each_batch(self) -> bool:
        return self.mode == "reduce-peak"

    @property
    def staging_huge_pages(self) -> bool:
        """Whether the staging is advised as huge pages (on CPU renderers): a ring (staged,
        reduce-peak), whose first touch took MiniLM's default loads 0.076 s against 0.069 s
        advised (medians of 6 fresh processes, lavapipe; SwiftShader 0.113 against 0.106 s); not
        legacy's staging of everything at once: advised, synthetic:512's 494 MiB of it made its
        legacy loads bimodal on this VM (0.59..2.76 s in six fresh processes)."""
        return self.mode != "legacy"

    @property
    def direct_huge_pages(self) -> bool:
        """Whether the memory blocks of the weights the CPU writes itself are advised as huge
        pages (on CPU renderers): up to HUGE_PAGES_UP_TO_NBYTES of them in the load. A huge page's
        first touch faults and zeroes 2 MiB at once instead of 4 KiB, but where free 2 MiB blocks go
        back to a VM's host (a balloon's free page reporting, as on this project's VMs), the host
        backs each anew at its first touch. Host-packed first loads in fresh processes, the same
        minutes (Zen 4 host, medians of 4, huge pages against 4 KiB): SwiftShader MiniLM (86 MiB)
        0.041 against 0.064 s, synthetic:256 0.251 against 0.195, synthetic:512 0.990 against 0.335
        (floor 0.294); lavapipe MiniLM 0.052 against 0.079, synthetic:512 0.993 against 0.411."""
        return self.direct_nbytes <= HUGE_PAGES_UP_TO_NBYTES

    @property
    def populated_huge_pages(self) -> bool:
        """Whether the memory blocks the plan populates (populates_destinations) are advised as
        huge pages too (on CPU renderers): where all of the load's weights, those the CPU writes
        and those the GPU writes, fit in HUGE_PAGES_UP_TO_NBYTES. Populating 2 MiB pages made
        MiniLM's staged first loads 0.093 -> 0.083 s on SwiftShader, 0.083 -> 0.073 on lavapipe
        (86 MiB; Zen 4 host, medians of 8 fresh processes, alternating); synthetic:256's (252 MiB)
        0.316 -> 0.800 and 0.303 -> 0.736 (the huge pages' first touch, as above)."""
        return self.populates_destinations and self.direct_nbytes + self.packed_nbytes <= HUGE_PAGES_UP_TO_NBYTES

    @property
    def writes_after_submit(self) -> bool:
        """Whether the CPU writes a batch's weights that it packs itself (packers.packs_on_host)
        after submitting the batch, while the GPU packs the rest of it: staged and reduce-peak.
        Before that the GPU waited for them: MiniLM's first batch holds its 45.5 MiB embedding
        table, written before the first submit (staged first loads, Zen 4 host, medians of 8
        fresh processes, alternating: 0.093 -> 0.081 s on SwiftShader, 0.083 -> 0.071 on lavapipe).
        Legacy encodes everything before its one submit."""
        return self.mode != "legacy"

    @property
    def populates_destinations(self) -> bool:
        """Whether the device memory a packing shader writes gets its pages when its batch is
        given memory (on CPU renderers, runtime.memory.populate_pages): on the CPU, while the
        GPU packs the batch before, instead of a page fault in a worker thread at each 4 KiB page
        the shader first stores to (synthetic:512's staged first loads on a Zen 4 host, lavapipe at
        512 bits, medians: 0.645 -> 0.542 s, the packing's GPU time 0.601 -> 0.443 s). Staged only:
        legacy and reduce-peak would make them with nothing to overlap (legacy loads of
        synthetic:512 in a trial: 0.433 -> 0.620 s); and not where ``populate`` is off
        (populates(): UNPOPULATED_DEVICES)."""
        return self.mode == "staged" and self.populate


def plan_prepack(mode: str, staging_nbytes: Sequence[int], alignment: int, cfg: GraphConfig,
                 direct_nbytes: int = 0, packed_nbytes: int = 0, populate: bool = True) -> PrepackPlan:
    """The plan of a prepack in ``mode`` of nodes staging these bytes (each node's staging
    starts at a multiple of ``alignment``), writing ``direct_nbytes`` of weights from the CPU and
    ``packed_nbytes`` of buffers from the GPU; ``populate``: populates() for the device."""
    if mode not in MODES:
        raise ValueError(f"prepack mode must be one of {', '.join(MODES)}, not {mode!r}")
    cuts = [] if mode == "legacy" else prepack_cut_points(staging_nbytes, PrepackThresholds.from_config(cfg))
    plan = batches(len(staging_nbytes), cuts)
    batch_nbytes = [sum(align_up(staging_nbytes[i], alignment) for i in b) for b in plan]
    total = sum(batch_nbytes)
    if mode == "legacy":
        capacity = total
    elif mode == "reduce-peak":
        capacity = max(batch_nbytes, default=0)
    else:
        capacity = min(cfg.resolved.prepack.staging_ring_nbytes, total)
    return PrepackPlan(mode, plan, batch_nbytes, capacity, direct_nbytes, packed_nbytes, populate)


def execute_cut_points(node_count: int, cfg: GraphConfig) -> list[int]:
    """Indices before which ``execute()`` starts a new command buffer: after the initial count,
    then every steady count. With ``max_cmds`` set, the steady count grows until the command
    buffers fit (ET-VK does the same)."""
    e = cfg.resolved.execute
    initial, steady, max_cmds = e.initial_threshold_node_count, e.threshold_node_count, e.max_cmds
    if node_count <= initial:
        return []
    if max_cmds == 1:
        return []
    rest = node_count - initial
    if max_cmds and 1 + math.ceil(rest / steady) > max_cmds:
        steady = math.ceil(rest / (max_cmds - 1))
    return list(range(initial, node_count, steady))
