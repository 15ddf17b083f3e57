"""GGML block formats that vkgraph reads from GGUF files: the one table of their sizes. Each block
holds 32 weights. The shaders read the file's blocks as they are (glsl/quant_blocks.h: a block
that is not word-aligned is spliced from the words around it) and pick the format by ``QTYPE``,
so a quantized weight is packed by a copy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_WEIGHTS = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str  # the packer and layout name: "q4_0"
    ggml_type: str  # the GGUF tensor type: "Q4_0"
    type_id: int  # its number in a GGUF tensor info (ggml_type's value in GGML's enum)
    block_nbytes: int  # one block in the file
    qtype: int  # the shaders' QTYPE define
    head_nbytes: int  # its scale d (and Q4_1's minimum m), before the quants


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("q4_0", "Q4_0", 2, 18, 0, 2),
    BlockFormat("q4_1", "Q4_1", 3, 20, 1, 4),
    BlockFormat("q8_0", "Q8_0", 8, 34, 2, 2),
)}
BY_GGML_TYPE: dict[str, BlockFormat] = {f.ggml_type: f for f in FORMATS.values()}
BY_TYPE_ID: dict[int, BlockFormat] = {f.type_id: f for f in FORMATS.values()}

#: the formats whose linears can multiply int8 activations (config graph.int8_activations): a
#: 4-bit quant times an int8 stays within 16 bits over a block (glsl/q8_pairs.glsl)
INT8_ACTIVATION_FORMATS = ("q4_0", "q4_1")


def int8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` [..., K] (K a multiple of 32) in llama.cpp's int8 scheme for activations, as a CPU
    renderer's tiles of Q4 weights multiply it (config graph.int8_activations; glsl/q8_pairs.glsl):
    each block of 32 values scaled by d = max|x| / 127 and rounded half to even. Returns the
    integers [..., K / 32, 32] (int32) and each block's d [..., K / 32, 1], in float32 as the
    shader computes them."""
    xb = np.asarray(x, np.float32).reshape(*np.shape(x)[:-1], -1, BLOCK_WEIGHTS)
    amax = np.abs(xb).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return np.rint(xb * inv).astype(np.int32), amax / np.float32(127)


def int8_activations(x: np.ndarray) -> np.ndarray:
    """``x`` as the tiles multiply it: :func:`int8_blocks`' integers times their d (float32)."""
    q, d = int8_blocks(x)
    return (q.astype(np.float32) * d).reshape(np.shape(x))
