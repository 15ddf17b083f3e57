"""A model of running a llama decoder (``vkgraph simulate --decode``): prefill and decode
speed from the same dispatches a session records, priced by a profile's ``[execute]`` rates.
Pure Python, no Vulkan.

The graph is the one :class:`~vkgraph.models.llama.LlamaSession` builds (the one-token step and
the ``prefill`` entry point), recorded against the profile's device facts (a CPU renderer gets
the CPU kernels, the texel reads its limits allow), so the model sees the kernels a run
dispatches. One execute of an entry point costs:

- ``host_us``: submitting, waiting for the fence, inputs in and outputs out;
- a linear: ``linear_dispatch_us``, plus per pass over its weight (``weight_passes``: one
  per tile of tokens) ``linear_row_ns`` per row and its bytes at ``weight_gbps`` of its format
  (one-token linears of four shapes, fitted), plus the multiply-adds of a tile's further tokens
  at ``gmacs`` (a 32-token one). The row term was lavapipe's: a one-token q4_1 linear of
  1024 x 1024 took 197 us, one of 1536 x 576 (less bytes) 269 us, while each block's scale cost
  four fetches; since it is one (the planes' word views) the fit puts it at 0. On a CPU renderer
  (``threads``: its worker threads) a linear's workgroups run as whole SIMD batches, a batch
  per thread at a time, so its tiles' multiply-adds are scaled by the waves of batches it takes
  against the invocations it has (waves_factor), its rows and bytes by ``wave_share`` of that
  factor's excess over 1: SmolLM2's 576-row one-token linears are (lavapipe at 512 bits) 36
  invocations of 16 rows, 3 batches of 16, 2 waves on 2 threads (1.78x), yet on a Zen 4 host
  they took as long as 512 rows in 2 batches: a lone thread streams the last batch's weights
  about as fast as two (wave_share 0 there, SwiftShader 0.4). A gated linear (two weights, one
  dispatch) costs ``gated_step`` (one token) or ``gated_tiles`` times a plain one of both
  weights' rows and bytes (SwiftShader's tiles 0.74x; its one-token gated linear ran 1.3-1.6x,
  so it now runs two linears there: ops.GATED_GEMV_RENDERERS);
- any other kernel: ``dispatch_us`` plus its bindings' bytes (or ``moved_nbytes``) at
  ``stream_gbps``; attention besides ``attention_key_ns`` for each row of its kernel (a head of
  a token; in a batch the heads sharing a key/value head, which fetch each key once: SmolLM2's 3)
  and key it sees, ``step_key_ns`` where it has one query token (a decoded token: a batch's
  tokens share the keys they fetch, a token alone does not), scaled by its waves on a CPU
  renderer (SmolLM2's 9 heads of one token on lavapipe at 512 bits: one SIMD batch of 16, a
  wave on 2 threads, priced as 32 rows). A decoded token at
  position p sees p + 1 keys, a prefill batch of T tokens from p0 (causal) T * p0 + T (T + 1) / 2
  in all: a step costs more the longer the context, so decode is priced at the mean position of
  the tokens it decodes, and each prefill batch at its own;
- and, as bench decode runs in a fresh process, the first dispatch of each pipeline there
  (``first_linear_us`` for a linear's, ``first_dispatch_us`` for any other's, beyond its work):
  lavapipe's first run of a pipeline cost 1-4 ms for a linear, 0.2-1 ms for others (SmolLM2's
  first 64-token batch: 9 pipelines, 12-15 ms of its 210-220), a cost the prompt's first batch
  of each size and the first decoded token pay.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..ggml import FORMATS
from ..graph.compute_graph import ComputeGraph, DeviceFacts
from ..graph.nodes import DispatchNode

if TYPE_CHECKING:
    from .simulate import Profile

GB = 1e9

QTYPE_FORMAT = {f.qtype: name for name, f in FORMATS.items()}


@dataclass(frozen=True)
class ExecuteRates:
    """A profile's ``[execute]`` section (measured by ``vkgraph simulate --calibrate``)."""

    host_s: float  # one execute besides its dispatches
    dispatch_s: float  # one dispatch besides its work
    stream_gbps: float  # bytes a memory-bound kernel moves
    weight_gbps: dict[str, float] = field(default_factory=dict)  # a linear's weight streamed, per format (fp32, q4_0, ...)
    linear_dispatch_s: float = 0.0  # one linear's dispatch besides streaming its weight
    gmacs: dict[str, float] = field(default_factory=dict)  # a linear's multiply-adds, per format; none: not modelled
    linear_row_s: float = 0.0  # each weight row a linear's pass computes
    #: a CPU renderer's worker threads (its workgroups run a SIMD batch per thread at a time); 0: a GPU
    threads: int = 0
    attention_key_s: float = 0.0  # attention's work per query row and key it sees (0: not modelled)
    #: a pipeline's first dispatch in a process, beyond its work: a linear's and any other kernel's
    #: (0: not modelled)
    first_linear_s: float = 0.0
    first_dispatch_s: float = 0.0
    #: the share of a partial wave's idle SIMD batches a linear's rows and weight bytes pay (1:
    #: whole waves, as its tiles' multiply-adds; 0: the invocations it has, as a stream bound by
    #: memory, not by the lanes)
    wave_share: float = 1.0
    #: attention's work per row and key when its kernel has one query token (a decoded token:
    #: no other token's query reuses a key it fetches); 0: attention_key_s
    step_key_s: float = 0.0
    #: a gated linear's work (two weights in one dispatch) against a plain linear of both
    #: weights' rows and bytes: one token, tiles of tokens
    gated_step: float = 1.0
    gated_tiles: float = 1.0


def parse_execute(path: str, d: dict) -> ExecuteRates | None:
    if not d:
        return None
    try:
        rates = ExecuteRates(float(d["host_us"]) * 1e-6, float(d["dispatch_us"]) * 1e-6, float(d["stream_gbps"]),
                             {k: float(v) for k, v in d["weight_gbps"].items()}, float(d["linear_dispatch_us"]) * 1e-6,
                             {k: float(v) for k, v in d.get("gmacs", {}).items()}, float(d["linear_row_ns"]) * 1e-9,
                             int(d.get("threads", 0)), float(d.get("attention_key_ns", 0.0)) * 1e-9,
                             float(d.get("first_linear_us", 0.0)) * 1e-6, float(d.get("first_dispatch_us", 0.0)) * 1e-6,
                             float(d.get("wave_share", 1.0)), float(d.get("step_key_ns", 0.0)) * 1e-9,
                             float(d.get("gated_step", 1.0)), float(d.get("gated_tiles", 1.0)))
    except KeyError as exc:
        raise ConfigError(path, f"execute.{str(exc).strip(chr(39))}", "missing") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(path, "execute", str(exc)) from None
    for key, v in (("execute.stream_gbps", rates.stream_gbps),
                   *((f"execute.weight_gbps.{k}", v) for k, v in rates.weight_gbps.items()),
                   *((f"execute.gmacs.{k}", v) for k, v in rates.gmacs.items())):
        if v <= 0:
            raise ConfigError(path, key, f"must be > 0, got {v}")
    for key, v in (("attention_key_ns", rates.attention_key_s), ("first_linear_us", rates.first_linear_s),
                   ("first_dispatch_us", rates.first_dispatch_s), ("step_key_ns", rates.step_key_s)):
        if v < 0:
            raise ConfigError(path, f"execute.{key}", f"must be >= 0 (0: not modelled), got {d[key]}")
    if not 0 <= rates.wave_share <= 1:
        raise ConfigError(path, "execute.wave_share", f"must be within 0..1, got {d['wave_share']}")
    for key, v in (("gated_step", rates.gated_step), ("gated_tiles", rates.gated_tiles)):
        if v <= 0:
            raise ConfigError(path, f"execute.{key}", f"must be > 0, got {d[key]}")
    return rates


def device_facts(profile: Profile) -> DeviceFacts:
    """What the graph's builder asks of a device, from the profile."""
    base = DeviceFacts()
    return DeviceFacts(profile.name, profile.host_visible_device_local, profile.cpu_renderer, profile.renderer,
                       profile.simd_width, base.limits | {"maxTexelBufferElements": profile.max_texel_buffer_elements,
                                      "minTexelBufferOffsetAlignment": profile.staging_alignment},
                       cpu_threads=profile.execute.threads if profile.execute else 0)


def weight_format(node: DispatchNode) -> str:
    qtype = node.defines.get("QTYPE")
    return "fp32" if qtype is None else QTYPE_FORMAT[int(qtype)]


def binding_nbytes(g: ComputeGraph, arg) -> int:
    return arg[2] if isinstance(arg, tuple) else g.values[arg].nbytes


def waves_factor(node: DispatchNode, threads: int) -> float:
    """On a CPU renderer of ``threads`` worker threads: the invocations a dispatch (a linear's,
    attention's) costs, in whole waves of SIMD batches (a workgroup each, one per thread at a
    time), over the invocations it has (DispatchNode.invocations, set by the op); 1.0 on a GPU
    (``threads`` 0) or where not given."""
    if threads <= 0 or node.invocations <= 0:
        return 1.0
    local = int(node.spec.get(0, 1))
    batches = -(-node.invocations // local)
    return -(-batches // threads) * threads * local / node.invocations


def linear_terms(g: ComputeGraph, node: DispatchNode, threads: int = 0,
                 wave_share: float = 1.0) -> tuple[float, float, float]:
    """What a linear's dispatch is priced by: (weight rows and weight bytes streamed over its
    passes, multiply-adds of its tiles' further tokens), on a CPU renderer of ``threads`` scaled
    by its waves_factor: the multiply-adds wholly, the rows and bytes by ``wave_share`` of the
    factor's excess over 1. Calibration fits the rates to these."""
    m, rows, k = node.linear_shape
    f = waves_factor(node, threads)
    fs = 1 + wave_share * (f - 1)
    return (fs * node.weight_passes * rows, fs * node.weight_passes * node.weights * binding_nbytes(g, node.args[2]),
            f * (m - node.weight_passes) * rows * k)


def one_token(node: DispatchNode) -> bool:
    """Whether a linear's or attention's dispatch computes one query token (a decode step)."""
    if node.weight_passes:
        return node.linear_shape[0] == 1
    return node.invocations == node.key_rows


def dispatch_seconds(g: ComputeGraph, node: DispatchNode, rates: ExecuteRates, keys_seen: float = 0.0) -> float:
    """One dispatch alone on the device (see the module's docstring); ``keys_seen``: the keys its
    query tokens see in all, for attention."""
    if node.weight_passes:
        fmt = weight_format(node)
        if fmt not in rates.weight_gbps:
            raise ConfigError("profile", f"execute.weight_gbps.{fmt}", "missing")
        rows, nbytes, macs = linear_terms(g, node, rates.threads, rates.wave_share)
        work = rows * rates.linear_row_s + nbytes / (rates.weight_gbps[fmt] * GB)
        if fmt in rates.gmacs:  # the tiles' further tokens
            work += macs / (rates.gmacs[fmt] * 1e9)
        if node.weights == 2:
            work *= rates.gated_step if one_token(node) else rates.gated_tiles
        return rates.linear_dispatch_s + work
    moved = node.moved_nbytes if node.moved_nbytes >= 0 else sum(binding_nbytes(g, a) for a in node.args)
    per_key = rates.step_key_s if rates.step_key_s and one_token(node) else rates.attention_key_s
    keys = node.key_rows * keys_seen * per_key * waves_factor(node, rates.threads)
    return rates.dispatch_s + moved / (rates.stream_gbps * GB) + keys


@dataclass
class EntryPrediction:
    seconds: float  # one execute
    dispatches: int
    by_kind: dict[str, tuple[float, int]]  # {op kind: (seconds, dispatches)}, largest first


def predict_entry(g: ComputeGraph, entry: str, rates: ExecuteRates, keys_seen: float = 0.0) -> EntryPrediction:
    """One execute of ``entry`` whose query tokens see ``keys_seen`` keys in all."""
    per: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for node in g.execute_nodes:
        if node.entry == entry:
            s = dispatch_seconds(g, node, rates, keys_seen)
            per[node.shader][0] += s  # the op kind, as bench decode --profile shows it
            per[node.shader][1] += 1
    by_kind = {k: (s, n) for k, (s, n) in sorted(per.items(), key=lambda kv: -kv[1][0])}
    total = sum(s for s, _ in by_kind.values())
    return EntryPrediction(rates.host_s + total, sum(n for _, n in by_kind.values()), by_kind)


def first_use_seconds(g: ComputeGraph, entry: str, rates: ExecuteRates, used: set) -> float:
    """What the first execute of ``entry`` in a process costs beyond a later one: the first
    dispatch of each pipeline not in ``used`` (the pipelines the process has run; this adds
    the entry's)."""
    seconds = 0.0
    for node in (n for n in g.execute_nodes if n.entry == entry):
        key = node.kernel_key(g)
        if key not in used:
            used.add(key)
            seconds += rates.first_linear_s if node.weight_passes else rates.first_dispatch_s
    return seconds


@dataclass
class DecodePrediction:
    model: str
    profile: str
    prompt_tokens: int
    new_tokens: int
    prefill_chunk: int  # the largest batch (0: token by token)
    prefill_batches: list[int]  # the prompt's batches, in order, a 1 a token alone (llama.prefill_schedule)
    prefill_tok_s: float
    decode_tok_s: float
    time_to_first_token_s: float
    step: EntryPrediction  # one decoded token, at the mean position of the decoded ones
    prefill: EntryPrediction  # the prompt's last batch
    #: the first dispatches of pipelines in the prompt's batches and in the steps (first_use_seconds)
    first_use_s: tuple[float, float] = (0.0, 0.0)


def simulate_decode(model: str, profile: Profile, prompt_tokens: int = 64, new_tokens: int = 32) -> DecodePrediction:
    """Predicted ``vkgraph bench decode --model M --prompt-tokens N --new-tokens K``: the prompt
    as a session on the profile's renderer runs it (llama.prefill_schedule: batches, a shorter
    last one padded and costing a whole one of its size, then tokens alone through the one-token
    entry), then a step per new token at positions N..N+K-1."""
    from ..models.llama import (DEFAULT_CONTEXT, DEFAULT_PREFILL, GGUFFile, LlamaConfig, PublishedShapes, build,
                                prefill_entry, prefill_schedule, prefill_sizes, step_tokens)
    from ..models.registry import resolve

    if profile.execute is None:
        raise ConfigError(profile.path, "execute", "missing: this profile has no run rates (measure them with "
                                                   "vkgraph simulate --calibrate)")
    if prompt_tokens < 1 or new_tokens < 1:
        raise ValueError(f"--prompt-tokens and --new-tokens must be >= 1, got {prompt_tokens} and {new_tokens}")
    ref = resolve(model)
    if ref.kind not in ("llama", "shape"):
        raise ValueError(f"--decode models a llama decoder (smollm2, a .gguf file or a shape-only spec such as "
                         f"llama-3.2-1b:q4_0), not {model!r}")
    g = ComputeGraph.recording(facts=device_facts(profile))
    if ref.kind == "shape":
        base, dtype = model.lower().split(":")
        shapes = PublishedShapes(base, dtype)
        context = shapes.config.context(DEFAULT_CONTEXT)
        chunk = min(DEFAULT_PREFILL, context)
        build(g, shapes, shapes.config, context, chunk)
    else:
        with GGUFFile(ref.path) as f:
            cfg = LlamaConfig.from_gguf(f)
            context = cfg.context(DEFAULT_CONTEXT)
            chunk = min(DEFAULT_PREFILL, context)
            build(g, f, cfg, context, chunk)
    if prompt_tokens + new_tokens > context:  # as bench decode refuses them
        raise ValueError(f"{prompt_tokens} + {new_tokens} tokens exceed the {context}-token context")
    rates = profile.execute
    step = predict_entry(g, "", rates, prompt_tokens + (new_tokens - 1) / 2 + 1)  # priced linearly in the keys
    sizes = prefill_sizes(chunk)
    plan = prefill_schedule(prompt_tokens, sizes, step_tokens(profile.renderer))
    batches = [n for n in plan if n > 1]
    used: set = set()  # a fresh process: every pipeline's first dispatch is still to come
    ttft, p0 = 0.0, 0
    for size in batches:  # causal: a batch of c tokens from p0 sees c * p0 + c (c + 1) / 2 keys
        last = predict_entry(g, prefill_entry(size, sizes), rates, size * p0 + size * (size + 1) / 2)
        ttft += last.seconds
        p0 += size
    alone = len(plan) - len(batches)  # then steps at positions p0..: keys p0 + 1.., priced linearly in them
    if alone:
        ttft += alone * predict_entry(g, "", rates, p0 + (alone + 1) / 2).seconds
    prefill = last if batches else predict_entry(g, "prefill", rates, chunk * (chunk + 1) / 2)
    first = sum(first_use_seconds(g, prefill_entry(size, sizes), rates, used) for size in dict.fromkeys(batches))
    first += first_use_seconds(g, "", rates, used) if alone else 0.0
    ttft += first
    first_step = first_use_seconds(g, "", rates, used)
    return DecodePrediction(model, profile.name, prompt_tokens, new_tokens, max(batches, default=0), plan,
                            prompt_tokens / ttft, new_tokens / (new_tokens * step.seconds + first_step), ttft, step,
                            prefill, (first, first_step))
