"""GGML block formats that vkgraph reads from GGUF files: the one table of their sizes. Each block
holds 32 weights. The shaders read the file's blocks as they are (glsl/quant_blocks.h: a block
that is not word-aligned is spliced from the words around it) and pick the format by ``QTYPE``,
so a quantized weight is packed by a copy."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_WEIGHTS = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str  # the packer and layout name: "q4_0"
    ggml_type: str  # the GGUF tensor type: "Q4_0"
    block_nbytes: int  # one block in the file
    qtype: int  # the shaders' QTYPE define
    head_nbytes: int  # its scale d (and Q4_1's minimum m), before the quants


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("q4_0", "Q4_0", 18, 0, 2),
    BlockFormat("q4_1", "Q4_1", 20, 1, 4),
    BlockFormat("q8_0", "Q8_0", 34, 2, 2),
)}
BY_GGML_TYPE: dict[str, BlockFormat] = {f.ggml_type: f for f in FORMATS.values()}
