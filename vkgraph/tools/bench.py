"""Load benchmark and the main job: one model load per call, with the numbers it produced."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..config import GraphConfig, load_config
from ..graph.compute_graph import ComputeGraph, DeviceFacts
from ..graph.report import LoadReport
from ..models import outputs_match
from ..models.registry import SAMPLE_PROMPT, Model, open_model, resolve
from ..paths import DEFAULT_CONFIG, user_cache_dir
from ..runtime import reported_messages

MODES = ("legacy", "staged", "reduce-peak", "cold-cache", "warm-cache")
FLOOR = "copy-floor"  # bench load's measurement of what a load is compared with (copy_floor)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class PeakRss:
    """Peak resident memory over a span minus resident memory at its start (Linux: VmHWM,
    reset through /proc/self/clear_refs), and the growth of anonymous resident memory (RssAnon:
    not file-backed pages)."""

    def __enter__(self) -> PeakRss:
        self.anon_before = _status_kib("RssAnon")
        self.before = _status_kib("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to now
        except OSError:
            pass  # the HWM then covers the whole process lifetime
        return self

    def __exit__(self, *exc) -> None:
        self.delta = _status_kib("VmHWM") - self.before
        self.anon_delta = _status_kib("RssAnon") - self.anon_before


def terminal_progress(label: str, unit: str = "nodes") -> Callable[[int, int], None] | None:
    """A one-line progress bar on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def cache_file_for(model: str) -> Path:
    """Where `bench load --mode cold-cache|warm-cache` keeps the packed-weight cache of ``model``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(model).name)
    return user_cache_dir() / "packed" / f"{safe}.vkpw"


def config_for(mode: str, path: str | None, model: str = "") -> GraphConfig:
    """The config for a benchmark mode: cold-cache and warm-cache are staged loads with the
    packed-weight cache (cold-cache starts by deleting it, warm-cache needs it to exist)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    cfg = load_config(path or DEFAULT_CONFIG)
    cfg = cfg.replace(prepack__reduce_peak_memory=(mode == "reduce-peak"))
    if mode in ("cold-cache", "warm-cache"):
        cache = Path(cfg.cache.packed_weights_path) if cfg.cache.packed_weights_path else cache_file_for(model)
        if mode == "cold-cache":
            cache.unlink(missing_ok=True)
        elif not cache.exists():
            raise ValueError(f"{cache}: no packed-weight cache yet; run --mode cold-cache first")
        cfg = cfg.replace(cache__packed_weights_path=str(cache))
    return cfg


@dataclass
class LoadResult:
    model: str
    report: LoadReport
    peak_rss_delta_nbytes: int
    rss_anon_delta_nbytes: int
    output_ok: bool | None  # None: not checked (``verify=False``)
    max_abs_error: float | None


def _measured_load(model: Model, cfg: GraphConfig, mode: str, verify: bool, trace: str | None,
                   progress: bool) -> LoadResult:
    """Build, prepare (pipelines outside the timing), prepack in ``mode`` with peak RSS measured,
    then run the model's check unless ``verify`` is false.

    The heap is collected right before the timed part (as ``timeit`` keeps the collector out of
    its timings): a load allocates about 20,000 Python objects, so without it every few loads a
    full collection of the whole process (the tokenizer, the model's tensor tables, ...) lands
    inside one load and costs it what the caller's heap costs to walk, not what vkgraph does
    (smollm2: about 0.13 s on top of a 0.25 s staged load, every third load)."""
    name = model.ref.name
    with ComputeGraph(cfg) as g:
        model.build(g)
        g.prepare()
        gc.collect()
        show = terminal_progress("prepack") if progress else None
        with PeakRss() as rss:
            if report_mode(mode) == "legacy":
                g.encode_prepack()
                report = g.prepack()
            else:
                report = g.run_prepack(show)
        if trace:
            report.write_trace(trace)
        if not verify:
            return LoadResult(name, report, rss.delta, rss.anon_delta, None, None)
        got, expect = model.check(g)
    return LoadResult(name, report, rss.delta, rss.anon_delta, outputs_match(got, expect),
                      float(np.max(np.abs(got - expect))))


def report_mode(mode: str) -> str:
    return "legacy" if mode == "legacy" else "staged"


def load_model(model: str, mode: str, config_path: str | None = None, *, trace: str | None = None,
               progress: bool = False, verify: bool = True) -> LoadResult:
    """One measured load of a model the registry knows; ``verify=False`` skips running the
    model and its reference."""
    resolve(model)
    cfg = config_for(mode, config_path, model)
    with open_model(model) as m:
        return _measured_load(m, cfg, mode, verify, trace, progress)


def bench_json(r: LoadResult, mode: str = "") -> dict[str, Any]:
    rep = r.report
    return {
        "model": r.model, "device": rep.device, "mode": mode or rep.mode, "total_constant_nbytes": rep.total_constant_nbytes,
        "load_s": rep.load_s, "cpu_encode_s": rep.cpu_encode_s, "populate_s": rep.populate_s,
        "fence_wait_s": rep.fence_wait_s,
        "gpu_s": rep.gpu_s, "submits": rep.submits, "peak_staging_nbytes": rep.peak_staging_nbytes,
        "staging_allocated_nbytes": rep.staging_allocated_nbytes, "peak_device_nbytes": rep.peak_device_nbytes,
        "peak_rss_delta_nbytes": r.peak_rss_delta_nbytes, "packing_dispatches": rep.packing_dispatches,
        "overlap": rep.overlap, "output_ok": r.output_ok, "rss_anon_delta_nbytes": r.rss_anon_delta_nbytes,
        "cache_hits": rep.cache_hits, "cache_misses": rep.cache_misses, "zero_copy_tensors": rep.zero_copy_tensors,
        "cache_save_s": rep.cache_save_s, "packer_gpu_s": rep.packer_gpu_s,
    }


#: loads of a process before its loads settle: the first pays first-touch page faults on memory
#: the process never had; the second pays them again for most of its packed weights, because the
#: first load's frees raised glibc's dynamic mmap threshold, so the second load's allocations move
#: from fresh mappings into the heap, which must grow. From the third load on, loads reuse the
#: pages the previous one freed (benchmarks/page_faults.py, staged synthetic:1024: 1065, 746, 13
#: and 12 MiB faulted in four loads; with the thresholds fixed from the start at what the first
#: load's frees set, MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864, synthetic:256
#: faulted 288, 13, 12, 12 MiB: the second load was already settled).
SETTLING_LOADS = 2


def copy_floor(model: str) -> dict[str, Any]:
    """The floor a load of ``model`` is measured against: the bytes of all its constants read
    from their sources (the same file mappings a load reads) into freshly allocated memory (a
    load's first touch of device memory), by numpy, with nothing packed. Run it in a fresh
    process (``vkgraph bench load --mode copy-floor``) to compare with a load's first run."""
    resolve(model)
    with open_model(model) as m:
        g = ComputeGraph.recording(facts=DeviceFacts())
        m.build(g)
        refs = [g.values[n.src] for n in g.prepack_nodes]
        gc.collect()
        t0 = time.perf_counter()
        kept = []  # one allocation per tensor, as a load's device memory, all alive: fresh pages each
        for r in refs:
            kept.append(np.empty(r.nbytes, np.uint8))
            kept[-1][:] = r.source.read()
        seconds = time.perf_counter() - t0
    return {"model": m.ref.name, "mode": FLOOR, "total_constant_nbytes": sum(r.nbytes for r in refs), "load_s": seconds}


def python_in_subprocess(args: list[str], tree: Path | None = None) -> str:
    """Run ``python args...`` (this interpreter) in a fresh process and return its stdout;
    RuntimeError with the child's stderr when it fails, or when the validation layer
    (``VKGRAPH_VALIDATION=1``, inherited) or the loader reported a warning or an error in it.
    ``tree``: a vkgraph source tree the child runs in and imports from (another version's)."""
    env = None if tree is None else dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, check=False)
    what = " ".join(args) + (f" in {tree}" if tree is not None else "")
    if proc.returncode:
        raise RuntimeError(f"{what} failed: {proc.stderr.strip()[-2000:]}")
    reported = reported_messages(proc.stderr)
    if reported:
        raise RuntimeError(f"{what}: Vulkan reported {len(reported)} message(s):\n" + "\n".join(reported[:20]))
    return proc.stdout


def load_in_subprocess(model: str, mode: str, config: str | None = None, loads: int = 1,
                       check: str = "every") -> list[dict[str, Any]]:
    """``vkgraph bench load --json`` in a fresh process (``loads`` loads in it, ``check``: "every"
    load verified, or only the "last"): one result per load (errors: python_in_subprocess)."""
    args = ["-m", "vkgraph", "bench", "load", "--model", model, "--mode", mode, "--json", "--loads", str(loads),
            "--check", check] + (["--config", config] if config else [])
    return [json.loads(line) for line in python_in_subprocess(args).splitlines() if line.startswith("{")]


@dataclass
class DecodeResult:
    """``vkgraph bench decode``: a prompt (as ``prefill_batches``: LlamaSession.batches_for, batches
    of at most ``prefill_chunk`` tokens, a 1 a token alone; 0: token by token), then greedy
    decoding."""

    model: str
    device: str
    prompt_tokens: int
    new_tokens: int
    prefill_chunk: int
    prefill_batches: list[int]
    #: rounds of prompt and decoding in the session; the rates are the best round's
    repeat: int
    prefill_tok_s: float
    decode_tok_s: float
    time_to_first_token_s: float  # the session's first prompt, whatever repeat is
    dispatches_per_token: int
    #: {op kind: (GPU seconds per decoded token, dispatches per token)}, largest first (--profile)
    profile: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: {op kind: (GPU seconds, dispatches)} of the prompt's last prefill batch, largest first (--profile)
    prefill_profile: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: whether the prompt's batches multiplied int8 activations (config graph.int8_activations)
    int8_activations: bool = False
    #: the session made, before its first prompt: the file opened, the tokenizer, the graph
    #: built, its pipelines made, the weights loaded and the command buffers recorded
    session_s: float = 0.0


def decode_bench(model: str, prompt_tokens: int, new_tokens: int, config_path: str | None = None, *,
                 profile: bool = False, prefill_chunk: int | None = None, repeat: int = 1) -> DecodeResult:
    """Load a llama model (``smollm2`` or a .gguf), feed a prompt of ``prompt_tokens`` tokens (the
    sample prompt repeated) in batches of ``prefill_chunk`` (default: the session's; 0: token by
    token), then decode ``new_tokens`` greedily; ``repeat`` times in the session (each round
    from position 0 again), the rates of the fastest prompt and the fastest decoding (a noisy
    host's figures), the time to the first token of the first. With ``profile`` the GPU time of
    each decode step per op kind (timestamps after every dispatch) is averaged, and the prompt's
    last batch (of the last round) profiled."""
    from ..models.llama import DEFAULT_PREFILL, LlamaSession

    ref = resolve(model)
    if ref.kind != "llama":
        raise ValueError(f"bench decode runs llama models (smollm2 or a .gguf file), not {model!r}")
    if prompt_tokens < 1 or new_tokens < 1 or repeat < 1:
        raise ValueError(f"--prompt-tokens, --new-tokens and --repeat must be >= 1, got {prompt_tokens}, "
                         f"{new_tokens} and {repeat}")
    chunk = DEFAULT_PREFILL if prefill_chunk is None else prefill_chunk
    if chunk < 0:
        raise ValueError(f"--prefill-chunk must be >= 0, got {chunk}")
    cfg = config_for("staged", config_path, model)
    t = time.perf_counter()
    with LlamaSession(ref.path, cfg, profile=profile, prefill=chunk) as s:
        session_s = time.perf_counter() - t
        if prompt_tokens + new_tokens > s.max_context:
            raise ValueError(f"{prompt_tokens} + {new_tokens} tokens exceed the {s.max_context}-token context")
        sample = s.tokenizer.encode(SAMPLE_PROMPT)
        ids = (sample * (prompt_tokens // len(sample) + 1))[:prompt_tokens]
        plan = s.batches_for(prompt_tokens)
        batched = max((n for n in plan if n > 1), default=0)
        per_kind: dict[str, list] = {}
        prompts, decodes = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            logits = s.prefill(ids)
            token = int(np.argmax(logits))
            prompts.append(time.perf_counter() - t0)
            prefill_prof = s.graph.execute_profile() if profile and plan[-1] > 1 else {}
            t1 = time.perf_counter()
            for i in range(new_tokens):
                logits = s.step(token, prompt_tokens + i)
                token = int(np.argmax(logits))
                if profile:
                    for kind, (sec, n) in s.graph.execute_profile().items():
                        acc = per_kind.setdefault(kind, [0.0, n])
                        acc[0] += sec
            decodes.append(time.perf_counter() - t1)
        steps = new_tokens * repeat
        prof = {k: (v[0] / steps, v[1]) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1][0])}
        per_token = sum(1 for n in s.graph.execute_nodes if n.entry == "")
        return DecodeResult(model, s.report.device, prompt_tokens, new_tokens, batched, plan, repeat,
                            prompt_tokens / min(prompts), new_tokens / min(decodes), prompts[0], per_token, prof,
                            prefill_prof, any(n.shader == "q8_pairs" for n in s.graph.execute_nodes), session_s)


@dataclass
class EmbedResult:
    """``vkgraph bench embed``: sentences per second of a BERT encoder at one batch size, on the
    device (execute: upload, dispatches, readback) and in numpy (float32) in the same process."""

    model: str
    device: str
    batch: int
    seq: int
    repeat: int
    vkgraph_sentences_s: float
    numpy_sentences_s: float
    max_abs_difference: float  # between the two's embeddings


def embed_bench(model: str, batches: list[int], repeat: int = 5, config_path: str | None = None) -> list[EmbedResult]:
    """For each batch size: build and prepack the encoder for ``batch`` sentences (the sample
    sentences cycled, padded to the longest), execute it once to warm up, then take the median
    of ``repeat`` executes; the same for a float32 numpy forward of the same weights."""
    from ..models import minilm
    from ..models.registry import SAMPLE_TEXTS
    from ..models.safetensors import SafetensorsFile
    from ..models.wordpiece import WordPieceTokenizer

    if repeat < 1 or not batches or min(batches) < 1:  # before the model: the arguments are wrong either way
        raise ValueError(f"--repeat and every --batch must be >= 1, got {repeat} and {batches}")
    ref = resolve(model)
    if ref.kind != "bert":
        raise ValueError(f"bench embed runs BERT encoders (minilm or a checkpoint directory), not {model!r}")
    bert = minilm.BertConfig.from_file(ref.path / "config.json")
    tok = WordPieceTokenizer(ref.path / "tokenizer.json")
    cfg = config_for("staged", config_path, model)

    def median_s(fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
        out = fn()  # warm-up
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)), out

    results = []
    with SafetensorsFile(ref.path / "model.safetensors") as st:
        cpu = minilm.NumpyEncoder(st, bert, np.float32)
        for batch in batches:
            texts = [SAMPLE_TEXTS[i % len(SAMPLE_TEXTS)] for i in range(batch)]
            inputs, seq = minilm.encode_inputs(tok, texts, minilm.MAX_SEQ_LENGTH)
            with ComputeGraph(cfg) as g:
                minilm.build(g, st, bert, batch, seq)
                g.prepare()
                g.run_prepack()
                dev_s, got = median_s(lambda: g.execute(inputs)["embeddings"])
                device = g.device.name
            cpu_s, expect = median_s(lambda: cpu(inputs, batch, seq))
            results.append(EmbedResult(ref.name, device, batch, seq, repeat, batch / dev_s, batch / cpu_s,
                                       float(np.max(np.abs(got - expect)))))
    return results
