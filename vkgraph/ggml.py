"""GGML block formats that vkgraph reads from GGUF files and packs on the device: the one table of
their sizes. Each block holds 32 weights; packed, it is a record of a scale word followed by
32-bit quant words (glsl/quant_blocks.h), and the shaders pick the format by ``QTYPE``. Q4_1's
20-byte blocks are word-aligned already: packed, they are the file's bytes (``verbatim``)."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_WEIGHTS = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str  # the packer and layout name: "q4_0"
    ggml_type: str  # the GGUF tensor type: "Q4_0"
    block_nbytes: int  # one block in the file
    words: int  # packed 32-bit quant words per block
    scales: int  # packed scale words per block
    qtype: int  # the shaders' QTYPE define
    verbatim: bool = False  # packed record = the file's block (a copy packs it)

    @property
    def packed_block_nbytes(self) -> int:
        return (self.words + self.scales) * 4


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("q4_0", "Q4_0", 18, 4, 1, 0),
    BlockFormat("q4_1", "Q4_1", 20, 4, 1, 1, verbatim=True),
    BlockFormat("q8_0", "Q8_0", 34, 8, 1, 2),
)}
BY_GGML_TYPE: dict[str, BlockFormat] = {f.ggml_type: f for f in FORMATS.values()}
