"""BERT's WordPiece tokenizer, configured from a Hugging Face ``tokenizer.json``.

Normalizer (BertNormalizer): clean control characters, space out CJK characters, lowercase and
strip accents (when configured); pre-tokenizer (BertPreTokenizer): split on whitespace and make
every punctuation character its own word; model: greedy longest-match-first WordPiece with the
``##`` continuation prefix; post-processor: ``[CLS] ... [SEP]``.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from ..errors import TokenizerError



def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class WordPieceTokenizer:
    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            spec = json.loads(Path(path).read_text(encoding="utf-8"))
            model = spec["model"]
            if model.get("type") != "WordPiece":
                raise TokenizerError(f"{path}: model type {model.get('type')!r} is not WordPiece")
            self.vocab: dict[str, int] = model["vocab"]
            self.unk = model.get("unk_token", "[UNK]")
            self.prefix = model.get("continuing_subword_prefix", "##")
            self.max_chars = model.get("max_input_chars_per_word", 100)
            norm = spec.get("normalizer") or {}
            self.lowercase = norm.get("lowercase", True)
            strip = norm.get("strip_accents")
            self.strip_accents = self.lowercase if strip is None else strip
            self.clean_text = norm.get("clean_text", True)
            self.chinese = norm.get("handle_chinese_chars", True)
            self.cls_id, self.sep_id, self.unk_id = self.vocab["[CLS]"], self.vocab["[SEP]"], self.vocab[self.unk]
            self.pad_id = (spec.get("padding") or {}).get("pad_id", self.vocab.get("[PAD]", 0))
        except (OSError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"{path}: cannot read tokenizer ({exc})") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise TokenizerError(f"{path}: tokenizer lacks {exc}") from None

    def normalize(self, text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if self.clean_text:
                if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch) in ("Cc", "Cf") and ch not in "\t\n\r"):
                    continue
                if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
                    ch = " "
            if self.chinese and _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = "".join(out)
        if self.lowercase:
            text = text.lower()
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        return text

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        words, cur = [], []
        for ch in text:
            if ch.isspace():
                if cur:
                    words.append("".join(cur))
                    cur = []
            elif _is_punctuation(ch):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(ch)
            else:
                cur.append(ch)
        if cur:
            words.append("".join(cur))
        return words

    def word_ids(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk_id]
            start = end
        return ids

    def encode(self, text: str, max_length: int = 256) -> list[int]:
        """Token ids with [CLS] and [SEP], truncated to ``max_length``."""
        ids = [i for w in self.pre_tokenize(self.normalize(text)) for i in self.word_ids(w)]
        return [self.cls_id, *ids[: max(0, max_length - 2)], self.sep_id]
