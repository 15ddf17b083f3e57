"""``synthetic:<MB>``: a Llama-shaped model of deterministic random fp32 weights.

Weights: token embedding, per layer q/k/v/o, gate/up/down and two RMSNorm weights, a final norm
and an untied output projection, written once to a safetensors file in the user cache dir and
read back through a memory map. The forward pass uses linear/rms_norm/silu/mul/add (attention's
token mixing is replaced by ``o(q + k + v)``: this model exercises loading, not language).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ops
from ..graph.compute_graph import ComputeGraph
from ..graph.values import ByteSource, ValueRef, shape_only_source
from ..paths import user_cache_dir
from .safetensors import SafetensorsFile, TensorInfo, write_safetensors

MiB = 1 << 20
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class SyntheticSpec:
    megabytes: int
    dim: int
    hidden: int
    vocab: int
    layers: int
    tokens: int = 8
    eps: float = 1e-5

    @classmethod
    def for_size(cls, megabytes: int) -> SyntheticSpec:
        if megabytes < 1:
            raise ValueError(f"synthetic model size must be >= 1 MB, got {megabytes}")
        dim, vocab = (128, 1024) if megabytes < 16 else (256, 4096) if megabytes < 64 else (512, 8192)
        hidden = dim * 11 // 4 // 32 * 32
        layer = (4 * dim * dim + 3 * dim * hidden + 2 * dim) * 4
        fixed = (2 * vocab * dim + dim) * 4
        layers = max(1, round((megabytes * MiB - fixed) / layer))
        return cls(megabytes, dim, hidden, vocab, layers)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        d, f = self.dim, self.hidden
        s: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (self.vocab, d)}
        for i in range(self.layers):
            p = f"layers.{i}."
            s.update({p + "attention_norm.weight": (d,), p + "attention.wq.weight": (d, d),
                      p + "attention.wk.weight": (d, d), p + "attention.wv.weight": (d, d),
                      p + "attention.wo.weight": (d, d), p + "ffn_norm.weight": (d,),
                      p + "feed_forward.w1.weight": (f, d), p + "feed_forward.w3.weight": (f, d),
                      p + "feed_forward.w2.weight": (d, f)})
        s.update({"norm.weight": (d,), "output.weight": (self.vocab, d)})
        return s

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(s)) * 4 for s in self.shapes().values())


def parse_model_name(model: str) -> int | None:
    """The size of ``synthetic:<MB>``, or None for another model name."""
    m = re.fullmatch(r"synthetic:(\d+)", model)
    return int(m.group(1)) if m else None


def generate(spec: SyntheticSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.megabytes)
    out = {}
    for name, shape in spec.shapes().items():
        if len(shape) == 1:  # norm weights around 1
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        else:
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(1 / np.sqrt(shape[-1]))
    return out


def weights_path(spec: SyntheticSpec, cache_dir: str | Path | None = None) -> Path:
    """The safetensors file for ``spec``, generated on first use."""
    base = Path(cache_dir) if cache_dir else user_cache_dir() / "models"
    path = base / f"synthetic-{spec.megabytes}mb-v{FORMAT_VERSION}.safetensors"
    if not path.exists():
        write_safetensors(path, generate(spec), {"vkgraph": f"synthetic:{spec.megabytes}", "version": FORMAT_VERSION})
    return path


class SpecWeights:
    """The weights of ``spec`` by shape only, without generating them (a recording graph's)."""

    def __init__(self, spec: SyntheticSpec):
        self._shapes = spec.shapes()

    def info(self, name: str) -> TensorInfo:
        shape = self._shapes[name]
        return TensorInfo(name, np.dtype(np.float32), shape, 0, int(np.prod(shape)) * 4)

    def source(self, name: str) -> ByteSource:
        return shape_only_source(name, self.info(name).nbytes)


def build(g: ComputeGraph, st: SafetensorsFile | SpecWeights, spec: SyntheticSpec) -> tuple[ValueRef, ValueRef]:
    """Add the forward graph; returns (ids input, logits output)."""

    def w(name: str) -> ValueRef:
        info = st.info(name)
        return g.add_tensorref(st.source(name), name, shape=info.shape, dtype=info.dtype)

    ids = g.add_input((spec.tokens,), np.int32, "ids")
    h = ops.embedding(g, ids, w("tok_embeddings.weight"))
    for i in range(spec.layers):
        p = f"layers.{i}."
        n = ops.rms_norm(g, h, w(p + "attention_norm.weight"), spec.eps)
        q = ops.linear(g, n, w(p + "attention.wq.weight"))
        k = ops.linear(g, n, w(p + "attention.wk.weight"))
        v = ops.linear(g, n, w(p + "attention.wv.weight"))
        h = ops.add(g, h, ops.linear(g, ops.add(g, ops.add(g, q, k), v), w(p + "attention.wo.weight")))
        n = ops.rms_norm(g, h, w(p + "ffn_norm.weight"), spec.eps)
        gate = ops.silu(g, ops.linear(g, n, w(p + "feed_forward.w1.weight")))
        up = ops.linear(g, n, w(p + "feed_forward.w3.weight"))
        h = ops.add(g, h, ops.linear(g, ops.mul(g, gate, up), w(p + "feed_forward.w2.weight")))
    logits = ops.linear(g, ops.rms_norm(g, h, w("norm.weight"), spec.eps), w("output.weight"))
    g.set_output(logits, "logits")
    return ids, logits


def reference(st: SafetensorsFile, spec: SyntheticSpec, ids: np.ndarray) -> np.ndarray:
    """The same forward pass in numpy (float64)."""

    def a(name: str) -> np.ndarray:
        return st.array(name).astype(np.float64)

    def rms(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + spec.eps) * weight

    h = a("tok_embeddings.weight")[ids]
    for i in range(spec.layers):
        p = f"layers.{i}."
        n = rms(h, a(p + "attention_norm.weight"))
        qkv = n @ a(p + "attention.wq.weight").T + n @ a(p + "attention.wk.weight").T + n @ a(p + "attention.wv.weight").T
        h = h + qkv @ a(p + "attention.wo.weight").T
        n = rms(h, a(p + "ffn_norm.weight"))
        gate = n @ a(p + "feed_forward.w1.weight").T
        up = n @ a(p + "feed_forward.w3.weight").T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ a(p + "feed_forward.w2.weight").T
    return rms(h, a("norm.weight")) @ a("output.weight").T


def sample_ids(spec: SyntheticSpec) -> np.ndarray:
    return np.random.default_rng(7).integers(0, spec.vocab, size=spec.tokens, dtype=np.int32)

