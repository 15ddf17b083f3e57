"""GGML block formats that vkgraph reads from GGUF files and packs on the device: the one table of
their sizes. Each block holds 32 weights; packed, it is a record of float scales followed by
32-bit quant words (glsl/quant_blocks.h), and the shaders pick the format by ``QTYPE``."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_WEIGHTS = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str  # the packer and layout name: "q4_0"
    ggml_type: str  # the GGUF tensor type: "Q4_0"
    block_nbytes: int  # one block in the file
    words: int  # packed 32-bit quant words per block
    scales: int  # packed float scales per block (q4_1: scale and minimum)
    qtype: int  # the shaders' QTYPE define

    @property
    def packed_block_nbytes(self) -> int:
        return (self.words + self.scales) * 4


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("q4_0", "Q4_0", 18, 4, 1, 0),
    BlockFormat("q4_1", "Q4_1", 20, 4, 2, 1),
    BlockFormat("q8_0", "Q8_0", 34, 8, 1, 2),
)}
BY_GGML_TYPE: dict[str, BlockFormat] = {f.ggml_type: f for f in FORMATS.values()}
