import struct

import pytest

from vkgraph.errors import GGUFError, MissingTensorError, TokenizerError
from vkgraph.models.bpe import BPETokenizer, render_chat
from vkgraph.models.gguf_file import GGUFFile


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with GGUFFile(smollm2_path) as f:
        yield f


def test_tokenizer_matches_hugging_face(smollm2, smollm2_golden):
    tok = BPETokenizer(smollm2.metadata)
    for text, ids in smollm2_golden["tokens"].items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text


def test_chat_template_renders_like_transformers(smollm2, smollm2_golden):
    prompt = render_chat(smollm2.get("tokenizer.chat_template"),
                         [{"role": "user", "content": "What is the capital of France?"}])
    assert prompt == smollm2_golden["chat_prompt"]


def test_reader_facts(smollm2):
    kinds = {}
    for t in smollm2.tensors.values():
        kinds[t.ggml_type] = kinds.get(t.ggml_type, 0) + 1
    assert kinds == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    emb = smollm2.tensor("token_embd.weight")
    assert emb.shape == (49152, 576) and emb.quant == "q8_0" and emb.data.shape == (49152, 612)
    assert smollm2.array("blk.0.attn_k.weight").shape == (192, 576)
    with pytest.raises(MissingTensorError, match="no tensor named 'nope'"):
        smollm2.tensor("nope")


@pytest.mark.parametrize("data,reason", [(b"", "not a readable GGUF"), (b"GGUF" + b"\0" * 8, "not a readable GGUF"),
                                         (b"NOPE" + struct.pack("<I", 3) + b"\0" * 16, "not a readable GGUF"),
                                         # found by fuzzing: an array of 2**60 elements (the gguf package
                                         # would loop over it, allocating, for ever)
                                         (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a"
                                          + struct.pack("<IIQ", 9, 0, 2**60) + b"\0" * 16,
                                          r"not a readable GGUF file \(value 0 of 1152921504606846976 elements"),
                                         (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t"
                                          + struct.pack("<I", 9) + b"\0" * 16, r"not a readable GGUF file \(tensor 0 has 9 dimensions")])
def test_bad_files_name_the_file(tmp_path, data, reason):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFError, match=f"{p}: {reason}"):
        GGUFFile(p)


def test_truncated_model_is_rejected(tmp_path, smollm2_path):
    p = tmp_path / "truncated.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(5_000_000))
    with pytest.raises(GGUFError, match=str(p)):
        GGUFFile(p)


def test_unsupported_tokenizer():
    with pytest.raises(TokenizerError, match="'llama' is not supported"):
        BPETokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [], "tokenizer.ggml.merges": []})
    with pytest.raises(TokenizerError, match="pre-tokenizer 'qwen9'"):
        BPETokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [], "tokenizer.ggml.merges": [],
                      "tokenizer.ggml.pre": "qwen9"})
