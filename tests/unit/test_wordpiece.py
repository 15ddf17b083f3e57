import pytest

from vkgraph.errors import TokenizerError
from vkgraph.models.wordpiece import WordPieceTokenizer


def test_ids_match_hugging_face_tokenizers(minilm_dir, minilm_golden):
    tok = WordPieceTokenizer(minilm_dir / "tokenizer.json")
    for text, ids in minilm_golden["tokens"].items():
        assert tok.encode(text) == ids, text


def test_truncation_keeps_cls_and_sep(minilm_dir):
    tok = WordPieceTokenizer(minilm_dir / "tokenizer.json")
    ids = tok.encode("word " * 1000, max_length=16)
    assert len(ids) == 16 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id


def test_bad_tokenizer_files(tmp_path):
    p = tmp_path / "tokenizer.json"
    p.write_text('{"model": {"type": "BPE", "vocab": {}}}')
    with pytest.raises(TokenizerError, match="model type 'BPE' is not WordPiece"):
        WordPieceTokenizer(p)
    p.write_text('{"model": {"type": "WordPiece", "vocab": {"a": 0}}}')
    with pytest.raises(TokenizerError, match="lacks '\\[CLS\\]'"):
        WordPieceTokenizer(p)
    with pytest.raises(TokenizerError, match="cannot read"):
        WordPieceTokenizer(tmp_path / "missing.json")
