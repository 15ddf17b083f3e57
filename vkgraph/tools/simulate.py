"""A discrete-event model of a load (``vkgraph simulate``). Pure Python, no Vulkan.

A model's prepack nodes come from its own builder run on a recording graph (no device, nothing
allocated), so the simulator sees exactly what a load packs. It plans command buffers with the
same :func:`~vkgraph.graph.scheduler.plan_prepack` as ``run_prepack()`` (cut points and the staging
each mode holds), models the staging ring with the same reserve/retire rule as
:class:`~vkgraph.graph.staging.StagingRing`, and runs the CPU and the GPU queue as two timelines:

- CPU per batch: reserve staging (waiting for the oldest batches' fences when the ring is full),
  encode each node (reading its bytes from the file mapping, then a fixed cost per packing
  dispatch, a row window its own, plus copying them into staging), the batch's own work
  (``[cpu] submit_us``: its memory block, command buffer, fence, submit), then write the weights
  the CPU packs itself (graph.packers.packs_on_host) straight into device memory
  (Profile.host_pack_bandwidth; in legacy mode before the submit:
  scheduler.PrepackPlan.writes_after_submit).
- GPU per batch: starts when submitted and the queue is free; each node costs a dispatch overhead
  plus its packed bytes over the packer kind's bandwidth (``[gpu.populated_pack_gbps]`` where the
  plan populated its memory before: PrepackPlan.populates_destinations; else ``[gpu.pack_gbps]``,
  the shader's first stores faulting the pages in).
- On the first load of a process every node also pays the first touch of its device memory where
  that memory is the process's own (``[gpu] fresh_device_gbps``: lavapipe's device memory is the
  process heap, so a fresh process faults it in): the GPU for what it packs, the CPU for what it
  writes straight (at ``[cpu] fresh_direct_gbps`` where the profile has it: SwiftShader's first
  loads pay little for those; no faster than ``[cpu] fresh_copy_gbps`` where the plan leaves
  those blocks on 4 KiB pages: scheduler.PrepackPlan.direct_huge_pages); where the plan
  populates the packing shaders' buffers (scheduler.PrepackPlan.populates_destinations) on a
  CPU renderer, the CPU for those too, as it gives a batch memory (``[cpu] populate_gbps``,
  ``populate_huge_gbps`` where the plan advises them as huge pages:
  PrepackPlan.populated_huge_pages); a settled load pays ``[cpu] settled_populate_share`` of that.
- While both encode and pack at once, each runs at its profile rate (``[contention]``) of its
  speed alone: below 1 where the GPU is the CPU's own cores (lavapipe's packing, SwiftShader's
  both), 1 for separate hardware.
- Reduce-peak mode waits for every batch (plus fence latency); legacy is one batch.

A profile (TOML, see profiles/) holds the device's parameters.
"""

from __future__ import annotations

import tomllib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import GraphConfig
from ..errors import ConfigError
from ..graph.allocation import BLOCK_NBYTES
from ..graph.compute_graph import ComputeGraph
from ..graph.packers import get_packer, packs_on_host
from ..graph.scheduler import align_up, plan_prepack, populates, run_prepack_mode
from ..models.registry import open_model
from ..paths import PROFILE_DIR
from .simulate_run import ExecuteRates, parse_execute

GB = 1e9


@dataclass(frozen=True)
class SimNode:
    """One prepack node as the simulator sees it."""

    name: str
    packer: str  # "identity", "linear_4x4", "q4_0", ...
    src_nbytes: int
    packed_nbytes: int
    #: packing dispatches: row windows where a binding or texel buffer of the device's takes less
    #: than the whole weight (PrepackNode.windows)
    dispatches: int = 1
    texture: bool = False  # packed into an image, not a buffer

    @property
    def shader(self) -> bool:
        return get_packer(self.packer).shader is not None


@dataclass(frozen=True)
class Profile:
    name: str
    host_visible_device_local: bool
    staging_alignment: int
    copy_gbps: float  # CPU copy into already-touched memory
    fresh_copy_gbps: float  # CPU copy into freshly allocated pages (first touch)
    encode_node_s: float  # CPU cost per packing dispatch (a row window each) besides copying: binding, recording
    #: CPU cost per command buffer besides its nodes: its memory block, recording, timestamps,
    #: fence and submit; and the wait from its end to the CPU running on (calibrate.batch_costs)
    submit_s: float
    fence_latency_s: float
    dispatch_s: float  # GPU cost per packing dispatch besides its bytes
    pack_gbps: dict[str, float]  # GPU packing bandwidth per packer kind ("default" for the rest)
    source: str = ""
    source_read_gbps: float = 0.0  # first read of weights through a file mapping (page faults); 0: free
    #: speed of CPU encoding and of GPU packing, relative to each alone, while both run: below 1
    #: where the "GPU" shares the CPU's cores (lavapipe, SwiftShader); 1.0 for separate hardware
    cpu_rate: float = 1.0
    gpu_rate: float = 1.0
    #: a CPU renderer (lavapipe, SwiftShader): with ``prepack.host_packing = "cpu-renderer"`` the
    #: CPU packs weights whose packer has a host form (graph.packers.packs_on_host)
    cpu_renderer: bool = False
    host_pack_gbps: dict[str, float] = field(default_factory=dict)  # the CPU packing into fresh pages, per packer
    #: a host form's CPU cost per weight besides its bytes, per packer (calibrate.host_pack_node_costs:
    #: its host_pack_gbps is then the rate of the bytes alone); empty: none
    host_pack_node_s: dict[str, float] = field(default_factory=dict)
    #: the GPU's first touch of device memory new to the process (a fresh process's first load),
    #: per packed byte, on top of packing into memory the process held; 0: free
    fresh_device_gbps: float = 0.0
    renderer: str = ""  # the device's short name ("lavapipe", "swiftshader"): which kernels ops choose
    simd_width: int = 0  # a CPU renderer's vector width in invocations (Device.simd_width): its kernels' workgroups
    max_texel_buffer_elements: int = 65536
    #: a CPU renderer's host processor (host_cpu()); "": not recorded
    host_cpu: str = ""
    #: the run model's rates (``[execute]``, tools/simulate_run.py); None: the profile has none
    execute: ExecuteRates | None = None
    path: str = ""
    #: CPU cost per node the CPU writes straight into device memory, besides its bytes (no
    #: staging, no recording); None: encode_node_s
    encode_direct_s: float | None = None
    #: the CPU copying into a fresh memory block of the kind the weights it writes get (huge
    #: pages on CPU renderers): a process's first load; None: fresh_copy_gbps
    direct_copy_gbps: float | None = None
    #: such weights' bytes in a process's later loads, read from a file mapping and written into
    #: the blocks the allocator hands out then; None: direct_copy_gbps
    settled_direct_gbps: float | None = None
    #: the CPU making fresh pages of a packing shader's buffers at once (runtime.memory.populate_pages,
    #: a process's first load); None: fresh_copy_gbps (as fast on a Zen 4 host: 2.0 and 2.03 GB/s)
    populate_gbps: float | None = None
    #: the same on huge pages (scheduler.PrepackPlan.populated_huge_pages); None: populate_gbps
    populate_huge_gbps: float | None = None
    #: the host forms of packers with a shader (linear_4x4, transposed: fp32 weights of 8 MiB)
    #: writing into 4 KiB pages, as every load (first or settled) of more than
    #: HUGE_PAGES_UP_TO_NBYTES of CPU-written weights does (PrepackPlan.direct_huge_pages off); None:
    #: [cpu.host_pack_gbps], no faster than fresh_copy_gbps in a first load
    host_pack_4k_gbps: float | None = None
    #: what a settled load (the third of a process on) pays of a first load's populating, per
    #: byte: about 1 where device memory is mapped anew for every load (SwiftShader), less where a
    #: load gets pages the last one freed (lavapipe); None: nothing
    settled_populate_share: float | None = None
    #: GPU packing bandwidth per packer kind into memory whose pages the CPU made before
    #: (scheduler.PrepackPlan.populates_destinations: staged loads on CPU renderers), where
    #: pack_gbps is the shader's own first stores faulting them in; empty: pack_gbps
    populated_pack_gbps: dict[str, float] = field(default_factory=dict)
    #: what a fresh process's first load pays on top of a settled one, per byte, for the weights
    #: the CPU writes straight into device memory (0: free); None: fresh_device_gbps, as the
    #: memory the GPU packs into
    fresh_direct_gbps: float | None = None

    def populate_bandwidth(self, huge_pages: bool = False) -> float:
        """Populating a packing shader's buffers: on huge pages where the plan advises them
        (PrepackPlan.populated_huge_pages) and the profile has that rate."""
        rate = self.populate_huge_gbps if huge_pages and self.populate_huge_gbps else self.populate_gbps
        return (rate or self.fresh_copy_gbps) * GB

    def staging_touch_gbps(self, huge_pages: bool) -> float:
        """The CPU's first touch of staging: at the rate into a fresh huge-page block where the
        plan advises it (scheduler.PrepackPlan.staging_huge_pages) and the device is a CPU
        renderer, like the blocks of the weights the CPU writes."""
        advised = huge_pages and self.cpu_renderer and self.direct_copy_gbps
        return self.direct_copy_gbps if advised else self.fresh_copy_gbps

    @property
    def fresh_direct_rate(self) -> float:
        return self.fresh_device_gbps if self.fresh_direct_gbps is None else self.fresh_direct_gbps

    @property
    def direct_node_s(self) -> float:
        return self.encode_node_s if self.encode_direct_s is None else self.encode_direct_s

    def pack_bandwidth(self, packer: str, populated: bool = False) -> float:
        """A packing shader's bandwidth; ``populated``: into memory the plan populated (the
        profile's ``[gpu.populated_pack_gbps]`` where it has them)."""
        rates = self.populated_pack_gbps if populated and self.populated_pack_gbps else self.pack_gbps
        return rates.get(packer, rates["default"]) * GB

    def host_pack_bandwidth(self, packer: str, nbytes: int, first_load: bool, huge_pages: bool = True) -> float:
        """The CPU writing a weight of ``nbytes`` straight into device memory: a copy for packers
        without a shader (identity, GGML blocks), the packer's host form for the rest (into fresh
        pages). A copy goes into a fresh memory block on a process's first load, and into what
        the allocator hands out then on later ones (on lavapipe pages the previous load freed),
        unless the weight is larger than a shared block (graph.allocation.BLOCK_NBYTES): a block
        of its own is mapped anew by every load. A first load is never priced faster than a later
        one: on SwiftShader a fresh block took copies faster (8.3 GB/s) than the blocks of later
        loads (4.2 GB/s), while SmolLM2's first loads there took as long as its later ones. A
        packer with a rate of its own in ``[cpu.host_pack_gbps]`` is priced at it, a copy or not
        (``q4_1_planes``...: the CPU splits GGML blocks into planes). Where a CPU renderer's plan
        leaves them on 4 KiB pages (not ``huge_pages``: PrepackPlan.direct_huge_pages), a host form
        of a packer with a shader at ``host_pack_4k_gbps`` where the profile has it, and anything
        else in a first load no faster than ``fresh_copy_gbps`` (their first touch)."""
        if self.cpu_renderer and not huge_pages:
            if self.host_pack_4k_gbps and get_packer(packer).shader is not None:
                return self.host_pack_4k_gbps * GB
            if first_load:
                return min(self.host_pack_bandwidth(packer, nbytes, first_load), self.fresh_copy_gbps * GB)
        if packer in self.host_pack_gbps:
            return self.host_pack_gbps[packer] * GB
        if get_packer(packer).shader is None:
            fresh = self.direct_copy_gbps or self.fresh_copy_gbps
            later = self.settled_direct_gbps or fresh
            return (min(fresh, later) if first_load or nbytes > BLOCK_NBYTES else later) * GB
        return self.host_pack_gbps.get(packer, self.host_pack_gbps.get("default", self.fresh_copy_gbps)) * GB


def shipped_profile(renderer: str, device_name: str | None = None, host: str | None = None) -> Path | None:
    """The profile vkgraph ships for a device of ``renderer``: one measured on a device of that
    exact name (``[device] name``: lavapipe's names its SIMD width, 256 or 512 bits, which moves
    its rates 2-4x), else profiles/<renderer>.toml; None where neither is shipped. Of several of
    that name, the one measured on the processor ``host`` (a CPU renderer's: host_cpu()), else one
    that records none: the 512-bit profile of one AMD EPYC put SmolLM2's prompt at 2.6x the speed
    lavapipe measured at 512 bits on another (README, "Predicting prefill and decode")."""
    if not renderer:
        return None
    if device_name is not None:
        named = []
        for p in sorted(PROFILE_DIR.glob("*.toml")):
            try:
                dev = tomllib.loads(p.read_text()).get("device", {})
            except tomllib.TOMLDecodeError:
                continue  # a broken file is named when it is loaded, not here
            if dev.get("renderer") == renderer and dev.get("name") == device_name:
                cpu = str(dev.get("host_cpu", ""))
                named.append((0 if host and cpu == host else 1 if not cpu else 2, p))
        if named:
            return min(named)[1]
    p = PROFILE_DIR / f"{renderer}.toml"
    return p if p.is_file() else None


def load_profile(path: str | Path) -> Profile:
    """A profile from TOML: a path, or a name in profiles/ (``lavapipe``)."""
    p = Path(path)
    if not p.suffix and not p.exists():
        p = PROFILE_DIR / f"{path}.toml"
    try:
        d = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(str(p), "(file)", "no such profile") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), "(syntax)", str(exc)) from None
    try:
        dev, cpu, gpu = d["device"], d["cpu"], d["gpu"]
        pack = {k: float(v) for k, v in gpu["pack_gbps"].items()}
        if "default" not in pack:
            raise KeyError("gpu.pack_gbps.default")
        populated = {k: float(v) for k, v in gpu.get("populated_pack_gbps", {}).items()}
        if populated and "default" not in populated:
            raise KeyError("gpu.populated_pack_gbps.default")
        prof = Profile(
            name=str(dev["name"]), host_visible_device_local=bool(dev["host_visible_device_local"]),
            staging_alignment=int(dev.get("staging_alignment", 16)),
            copy_gbps=float(cpu["copy_gbps"]), fresh_copy_gbps=float(cpu["fresh_copy_gbps"]),
            encode_node_s=float(cpu["encode_node_us"]) * 1e-6, submit_s=float(cpu["submit_us"]) * 1e-6,
            fence_latency_s=float(gpu["fence_latency_us"]) * 1e-6, dispatch_s=float(gpu["dispatch_us"]) * 1e-6,
            pack_gbps=pack, source=str(d.get("source", "")), source_read_gbps=float(cpu.get("source_read_gbps", 0.0)),
            cpu_rate=float(d.get("contention", {}).get("cpu_rate", 1.0)),
            gpu_rate=float(d.get("contention", {}).get("gpu_rate", 1.0)),
            cpu_renderer=bool(dev.get("cpu_renderer", False)),
            host_pack_gbps={k: float(v) for k, v in cpu.get("host_pack_gbps", {}).items()},
            host_pack_node_s={k: float(v) * 1e-6 for k, v in cpu.get("host_pack_node_us", {}).items()},
            fresh_device_gbps=float(gpu.get("fresh_device_gbps", 0.0)),
            renderer=str(dev.get("renderer", "")), simd_width=int(dev.get("simd_width", 0)),
            max_texel_buffer_elements=int(dev.get("max_texel_buffer_elements", 65536)),
            host_cpu=str(dev.get("host_cpu", "")),
            execute=parse_execute(str(p), d.get("execute", {})), path=str(p),
            encode_direct_s=float(cpu["encode_direct_us"]) * 1e-6 if "encode_direct_us" in cpu else None,
            direct_copy_gbps=float(cpu["direct_copy_gbps"]) if "direct_copy_gbps" in cpu else None,
            settled_direct_gbps=float(cpu["settled_direct_gbps"]) if "settled_direct_gbps" in cpu else None,
            populate_gbps=float(cpu["populate_gbps"]) if "populate_gbps" in cpu else None,
            populate_huge_gbps=float(cpu["populate_huge_gbps"]) if "populate_huge_gbps" in cpu else None,
            host_pack_4k_gbps=float(cpu["host_pack_4k_gbps"]) if "host_pack_4k_gbps" in cpu else None,
            settled_populate_share=float(cpu["settled_populate_share"]) if "settled_populate_share" in cpu else None,
            populated_pack_gbps=populated,
            fresh_direct_gbps=float(cpu["fresh_direct_gbps"]) if "fresh_direct_gbps" in cpu else None,
        )
    except KeyError as exc:
        raise ConfigError(str(p), str(exc).strip("'"), "missing") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(p), "(values)", str(exc)) from None
    for key, v in (("cpu.copy_gbps", prof.copy_gbps), ("cpu.fresh_copy_gbps", prof.fresh_copy_gbps),
                   *((("cpu.direct_copy_gbps", prof.direct_copy_gbps),) if prof.direct_copy_gbps is not None else ()),
                   *((("cpu.settled_direct_gbps", prof.settled_direct_gbps),) if prof.settled_direct_gbps is not None else ()),
                   *((("cpu.populate_gbps", prof.populate_gbps),) if prof.populate_gbps is not None else ()),
                   *((("cpu.populate_huge_gbps", prof.populate_huge_gbps),) if prof.populate_huge_gbps is not None else ()),
                   *((("cpu.host_pack_4k_gbps", prof.host_pack_4k_gbps),) if prof.host_pack_4k_gbps is not None else ()),
                   *((f"gpu.pack_gbps.{k}", v) for k, v in pack.items()),
                   *((f"gpu.populated_pack_gbps.{k}", v) for k, v in populated.items()),
                   *((f"cpu.host_pack_gbps.{k}", v) for k, v in prof.host_pack_gbps.items())):
        if v <= 0:
            raise ConfigError(str(p), key, f"must be > 0, got {v}")
    for k, v in prof.host_pack_node_s.items():
        if v < 0:
            raise ConfigError(str(p), f"cpu.host_pack_node_us.{k}", f"must be >= 0, got {v * 1e6:g}")
    if prof.settled_populate_share is not None and prof.settled_populate_share < 0:
        raise ConfigError(str(p), "cpu.settled_populate_share", f"must be >= 0, got {prof.settled_populate_share}")
    if prof.fresh_device_gbps < 0:
        raise ConfigError(str(p), "gpu.fresh_device_gbps", f"must be >= 0 (0: free), got {prof.fresh_device_gbps}")
    if prof.fresh_direct_gbps is not None and prof.fresh_direct_gbps < 0:
        raise ConfigError(str(p), "cpu.fresh_direct_gbps", f"must be >= 0 (0: free), got {prof.fresh_direct_gbps}")
    if prof.encode_direct_s is not None and prof.encode_direct_s < 0:
        raise ConfigError(str(p), "cpu.encode_direct_us", f"must be >= 0, got {prof.encode_direct_s * 1e6}")
    for key, v in (("contention.cpu_rate", prof.cpu_rate), ("contention.gpu_rate", prof.gpu_rate)):
        if not 0 < v <= 1:
            raise ConfigError(str(p), key, f"must be in (0, 1], got {v}")
    return prof


# --- a model's prepack nodes ----------------------------------------------------------------------


def model_nodes(model: str, profile: Profile | None = None, config: GraphConfig | None = None) -> list[SimNode]:
    """The prepack nodes of any model the registry knows (``synthetic:<MB>``, ``minilm``,
    ``smollm2``, a BERT directory or ``.gguf`` file, a shape-only ``llama-3-8b:q4_0``...), in
    load order: its builder run on a recording graph, with the facts of ``profile``'s device
    where given (its kernels choose the packers: GGML blocks in planes on CPU renderers) and
    ``config``'s graph options (``graph.fp32_linear_layout``)."""
    from .simulate_run import device_facts

    with open_model(model, shapes_only=True) as m:
        g = ComputeGraph.recording(config, device_facts(profile) if profile else None)
        m.build(g)
    return [SimNode(g.values[n.src].name, n.packer.name, g.values[n.src].nbytes, g.values[n.dst].nbytes,
                    len(n.windows(g)), g.values[n.dst].storage != "buffer")
            for n in g.prepack_nodes]


# --- the simulation ----------------------------------------------------------------------------


class RingModel:
    """StagingRing's reserve/retire rule on numbers: regions per batch, reused only after the batch
    that read them finished; reserving waits (oldest first) while the new region would overlap. A
    batch larger than the ring waits for the previous such batch (whose own buffer is then freed)."""

    def __init__(self, capacity: int, alignment: int):
        self.alignment = alignment
        self.capacity = align_up(max(capacity, alignment), alignment)
        self.head = 0
        self.live: deque[tuple[int, int, int]] = deque()  # (start, end, batch)
        self.own_peak = 0
        self.own_batch: int | None = None  # the last batch larger than the ring (own buffer)
        self.region_nbytes: dict[int, int] = {}  # batch -> bytes of its region or own buffer

    def reserve(self, nbytes: int, batch: int) -> list[int]:
        """Batches to wait for before the region is free; records the region."""
        nbytes = align_up(max(nbytes, 1), self.alignment)
        self.region_nbytes[batch] = nbytes
        if nbytes > self.capacity:  # its own buffer, once the previous oversized batch's is freed
            self.own_peak = max(self.own_peak, nbytes)
            waits = [] if self.own_batch is None else [self.own_batch]
            self.own_batch = batch
            return waits
        waits = []
        while True:
            start = self.head if self.head + nbytes <= self.capacity else 0
            end = start + nbytes
            if not any(s < end and start < e for s, e, _ in self.live):
                break
            waits.append(self.live.popleft()[2])
        self.live.append((start, end, batch))
        self.head = end
        return waits


@dataclass
class BatchTimeline:
    index: int
    nodes: int
    staging_nbytes: int
    cpu_start_s: float
    cpu_end_s: float
    gpu_start_s: float
    gpu_end_s: float
    #: the CPU's writes of the batch's weights after the submit (PrepackPlan.writes_after_submit)
    #: ended; cpu_end_s where it has none
    writes_end_s: float = 0.0


@dataclass
class Simulation:
    mode: str
    load_s: float
    cpu_encode_s: float
    fence_wait_s: float
    gpu_s: float
    submits: int
    peak_staging_nbytes: int  # high-water mark of staging bytes in flight (as StagingRing measures it)
    staging_allocated_nbytes: int  # ring plus the largest oversized batch
    peak_device_nbytes: int
    total_constant_nbytes: int
    packing_dispatches: int
    batches: list[BatchTimeline] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "batches"}
        d["timeline"] = [b.__dict__ for b in self.batches]
        return d


def simulate(nodes: list[SimNode], cfg: GraphConfig, profile: Profile, mode: str | None = None,
             first_load: bool = False) -> Simulation:
    """Predict a load of ``nodes`` (mode: "legacy", "staged", "reduce-peak"; default from ``cfg``):
    a settled load (the process reuses memory it held), or with ``first_load`` the first load of a
    fresh process (the GPU faults in the device memory it packs into, or the CPU populates it)."""
    total = sum(n.src_nbytes for n in nodes)
    mode = mode or run_prepack_mode(cfg, total)

    direct = [packs_on_host(get_packer(n.packer), profile.host_visible_device_local, profile.cpu_renderer,
                            profile.renderer, cfg.prepack.host_packing) for n in nodes]
    sizes = [0 if d else n.src_nbytes for n, d in zip(nodes, direct)]
    prepack = plan_prepack(mode, sizes, profile.staging_alignment, cfg,
                           sum(n.packed_nbytes for n, d in zip(nodes, direct) if d),
                           sum(n.packed_nbytes for n, d in zip(nodes, direct) if not d and not n.texture),
                           populates(cfg, profile.renderer, profile.simd_width, profile.host_cpu))
    plan, batch_nbytes = prepack.batches, prepack.batch_nbytes
    ring = RingModel(prepack.staging_capacity, profile.staging_alignment) if sum(batch_nbytes) else None
    touched = 0  # staging bytes already first-touched (the ring reuses them)
    # The plan populates what the packing shaders write (staged loads on a CPU renderer, but those
    # of scheduler.UNPOPULATED_DEVICES): the CPU makes those pages, all of a first load's and
    # settled_populate_share of a later one's, and the shaders store into them.
    populated = prepack.populates_destinations and profile.cpu_renderer
    populate_share = 1.0 if first_load else profile.settled_populate_share or 0.0

    # What each batch costs alone: CPU seconds to encode and submit it (and to write its weights
    # the CPU packs itself after the submit), GPU seconds to pack it, and the earlier batches
    # whose staging it must wait for.
    cpu_work, cpu_after, gpu_work, waits = [], [], [], []
    dispatches = 0
    populate_rate = profile.populate_bandwidth(prepack.populated_huge_pages)
    for b, rng in enumerate(plan):
        waits.append(ring.reserve(batch_nbytes[b], b) if ring is not None and batch_nbytes[b] else [])
        c = g = after = 0.0
        for i in rng:
            n = nodes[i]
            read_s = n.src_nbytes / (profile.source_read_gbps * GB) if profile.source_read_gbps > 0 else 0.0  # file pages' first read
            fresh_rate = profile.fresh_direct_rate if direct[i] else profile.fresh_device_gbps
            fresh_s = n.packed_nbytes / (fresh_rate * GB) if first_load and fresh_rate > 0 else 0.0
            if direct[i]:  # a copy or a host form, into fresh pages; the CPU faults them in
                rate = profile.host_pack_bandwidth(n.packer, n.packed_nbytes, first_load, prepack.direct_huge_pages)
                w = read_s + profile.direct_node_s + profile.host_pack_node_s.get(n.packer, 0.0) + n.src_nbytes / rate + fresh_s
                if prepack.writes_after_submit:
                    after += w
                else:
                    c += w
                continue
            c += read_s + profile.encode_node_s * n.dispatches  # a window each: descriptor set, texel view
            fresh = max(0, min(n.src_nbytes, (ring.capacity if ring else 0) - touched))
            touched += fresh
            c += fresh / (profile.staging_touch_gbps(prepack.staging_huge_pages) * GB) + (n.src_nbytes - fresh) / (profile.copy_gbps * GB)
            into_populated = populated and not n.texture  # its buffer's pages made as the batch gets memory
            if into_populated:
                c, fresh_s = c + populate_share * n.packed_nbytes / populate_rate, 0.0
            if n.shader:
                rate = profile.pack_bandwidth(n.packer, into_populated)
                g += n.dispatches * profile.dispatch_s + n.packed_nbytes / rate
                dispatches += n.dispatches
            else:
                g += n.src_nbytes / profile.pack_bandwidth("identity")
            g += fresh_s
        cpu_work.append(c + profile.submit_s)
        cpu_after.append(after)
        gpu_work.append(g)

    out = _run_timelines(cpu_work, cpu_after, gpu_work, waits, [len(r) for r in plan],
                         [sum(sizes[i] for i in r) for r in plan], profile, prepack.waits_each_batch)
    end = max([out[-1].writes_end_s, out[-1].gpu_end_s + profile.fence_latency_s]) if out else 0.0
    encode = sum(b.writes_end_s - b.cpu_start_s for b in out)
    allocated = ring.capacity + ring.own_peak if ring else 0
    in_flight = _in_flight_peak(ring.region_nbytes, out) if ring else 0
    return Simulation(mode, end, encode, end - encode, sum(x.gpu_end_s - x.gpu_start_s for x in out), len(plan),
                      in_flight, allocated, sum(n.packed_nbytes for n in nodes) + allocated, total, dispatches, out)


def _in_flight_peak(region_nbytes: dict[int, int], out: list[BatchTimeline]) -> int:
    """Most staging bytes in flight: when batch ``b`` reserves its region (as it starts), the
    regions of earlier batches the GPU has not finished, plus its own."""
    return max((sum(n for k, n in region_nbytes.items() if k == b or (k < b and out[k].gpu_end_s > out[b].cpu_start_s))
                for b in region_nbytes), default=0)


def _run_timelines(cpu_work: list[float], cpu_after: list[float], gpu_work: list[float], waits: list[list[int]],
                   nodes: list[int], staged: list[int], profile: Profile, wait_each: bool) -> list[BatchTimeline]:
    """The CPU and the GPU queue as two timelines in one clock. The CPU, batch by batch, waits
    for the fences of the batches whose staging it reuses (``waits``), encodes and submits the
    batch (``cpu_work`` seconds alone), writes the batch's weights it packs itself (``cpu_after``
    seconds alone), and with ``wait_each`` (reduce-peak) waits for its fence. The GPU packs
    submitted batches in order (``gpu_work`` seconds alone). While both run they share the
    device's processors: the CPU progresses at ``profile.cpu_rate`` and the GPU at
    ``profile.gpu_rate`` of their speed alone (1.0: separate hardware)."""
    n = len(cpu_work)
    done: dict[int, float] = {}  # batch -> when the GPU finished it
    out = [BatchTimeline(b, nodes[b], staged[b], 0.0, 0.0, 0.0, 0.0) for b in range(n)]
    t = 0.0
    cpu_b, cpu_left = 0, None  # batch the CPU is at; seconds of it left (None: waiting for fences)
    writing = False  # the CPU is at cpu_b's writes after its submit
    queue: deque[int] = deque()
    gpu_b, gpu_left = None, 0.0

    def fences_for(b: int) -> list[int]:
        return waits[b] + ([b - 1] if wait_each and b > 0 else [])

    while len(done) < n or cpu_b < n:
        ready = None  # when the CPU may start its next batch, once every fence it needs has signalled
        if cpu_left is None and cpu_b < n and all(w in done for w in fences_for(cpu_b)):
            ready = max((done[w] + profile.fence_latency_s for w in fences_for(cpu_b)), default=t)
            if ready <= t:
                cpu_left, ready = cpu_work[cpu_b], None
                out[cpu_b].cpu_start_s = t
        if gpu_b is None and queue:
            gpu_b = queue.popleft()
            gpu_left = gpu_work[gpu_b]
            out[gpu_b].gpu_start_s = t
        cpu_on, gpu_on = cpu_left is not None, gpu_b is not None
        rc = profile.cpu_rate if gpu_on else 1.0
        rg = profile.gpu_rate if cpu_on else 1.0
        steps = []
        if cpu_on:
            steps.append(cpu_left / rc)
        if gpu_on:
            steps.append(gpu_left / rg)
        if ready is not None:
            steps.append(ready - t)
        dt = min(steps)
        t += dt
        if cpu_on:
            cpu_left -= dt * rc
            if cpu_left <= 1e-12:
                if not writing:  # submitted
                    out[cpu_b].cpu_end_s = t
                    queue.append(cpu_b)
                if not writing and cpu_after[cpu_b] > 0:
                    writing, cpu_left = True, cpu_after[cpu_b]
                else:
                    out[cpu_b].writes_end_s = t
                    writing, cpu_b, cpu_left = False, cpu_b + 1, None
        if gpu_on:
            gpu_left -= dt * rg
            if gpu_left <= 1e-12:
                out[gpu_b].gpu_end_s = done[gpu_b] = t
                gpu_b = None
    return out
