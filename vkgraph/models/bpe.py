"""Byte-level BPE (GPT-2 style) tokenizer from GGUF metadata (``tokenizer.ggml.*``), and chat
templates rendered from ``tokenizer.chat_template``.

Encoding: control tokens (``<|im_start|>`` ...) are matched verbatim first; the rest is split by
the pre-tokenizer's regexes (llama.cpp semantics: each regex splits every piece into its matches
and the gaps between them), mapped byte by byte to GPT-2's printable alphabet, and merged by
merge rank.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import regex

from ..errors import TokenizerError

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: Pre-tokenizer regexes by ``tokenizer.ggml.pre`` (as llama.cpp groups them).
PRE_TOKENIZERS = {
    "default": [GPT2_SPLIT],
    "gpt2": [GPT2_SPLIT],
    "smollm": [r"\p{N}", GPT2_SPLIT],
    "starcoder": [r"\p{N}", GPT2_SPLIT],
    "refact": [r"\p{N}", GPT2_SPLIT],
}
CONTROL, USER_DEFINED = 3, 4


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def _split(pieces: list[str], pattern: regex.Pattern) -> list[str]:
    out = []
    for piece in pieces:
        last = 0
        for m in pattern.finditer(piece):
            if m.start() > last:
                out.append(piece[last:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            last = m.end()
        if last < len(piece):
            out.append(piece[last:])
    return out


class BPETokenizer:
    def __init__(self, metadata: dict[str, Any], source: str = "GGUF metadata"):
        try:
            model = metadata["tokenizer.ggml.model"]
            if model != "gpt2":
                raise TokenizerError(f"{source}: tokenizer.ggml.model {model!r} is not supported (gpt2)")
            self.tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
            merges: list[str] = list(metadata["tokenizer.ggml.merges"])
            types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(self.tokens))
        except KeyError as exc:
            raise TokenizerError(f"{source}: missing {exc}") from None
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise TokenizerError(f"{source}: pre-tokenizer {pre!r} is not supported ({', '.join(PRE_TOKENIZERS)})")
        self.patterns = [regex.compile(p) for p in PRE_TOKENIZERS[pre]]
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.special = sorted((t for t, ty in zip(self.tokens, types) if ty in (CONTROL, USER_DEFINED)), key=len, reverse=True)
        self._special_re = regex.compile("|".join(regex.escape(t) for t in self.special)) if self.special else None
        self.bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        self._decoder = {c: b for b, c in byte_alphabet().items()}
        self._cache: dict[str, list[int]] = {}

    def _bpe(self, word: str) -> list[int]:
        if word in self._cache:
            return self._cache[word]
        parts = list(word)
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: self.ranks.get((parts[i], parts[i + 1]), 1 << 30))
            if (parts[best], parts[best + 1]) not in self.ranks:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        try:
            ids = [self.vocab[p] for p in parts]
        except KeyError as exc:
            raise TokenizerError(f"piece {exc} is not in the vocabulary") from None
        self._cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids (no BOS/EOS added; control tokens in the text are honoured)."""
        alphabet = byte_alphabet()
        ids: list[int] = []
        chunks = [(text, False)]
        if self._special_re is not None:
            chunks, last = [], 0
            for m in self._special_re.finditer(text):
                chunks += [(text[last:m.start()], False), (m.group(), True)]
                last = m.end()
            chunks.append((text[last:], False))
        for chunk, special in chunks:
            if special:
                ids.append(self.vocab[chunk])
                continue
            pieces = [chunk] if chunk else []
            for pattern in self.patterns:
                pieces = _split(pieces, pattern)
            for piece in pieces:
                ids += self._bpe("".join(alphabet[b] for b in piece.encode("utf-8")))
        return ids

    def decode_bytes(self, ids: list[int]) -> bytes:
        out = bytearray()
        for i in ids:
            tok = self.tokens[i]
            if tok in self.special:
                out += tok.encode("utf-8")
            else:
                out += bytes(self._decoder.get(c, ord(c) & 0xFF) for c in tok)
        return bytes(out)

    def decode(self, ids: list[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def render_chat(template: str, messages: list[dict[str, str]], *, bos: str = "", eos: str = "") -> str:
    """The prompt for ``messages`` from a Jinja chat template (sandboxed, as Hugging Face renders it)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token=bos, eos_token=eos)
    except TemplateError as exc:
        raise TokenizerError(f"chat template: {exc}") from None
