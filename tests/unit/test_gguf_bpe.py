import struct

import numpy as np
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


def _reference(path):
    """The ``gguf`` package's reading of a file: metadata (its own GGUF.* header fields left out)
    and per tensor (offset, data)."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, {t.name: (int(t.data_offset), t.data) for t in r.tensors}


def _same_as_gguf_package(path, nested=()):
    """``nested``: keys of arrays of arrays, which the package's reader flattens into one list."""
    meta, tensors = _reference(path)
    with GGUFFile(path) as f:
        for key in nested:
            assert [v for inner in f.metadata[key] for v in inner] == meta[key]
            meta[key] = f.metadata[key]
        assert f.metadata == meta
        assert {k: type(v) for k, v in f.metadata.items()} == {k: type(v) for k, v in meta.items()}
        assert list(f.tensors) == list(tensors)
        for name, (offset, data) in tensors.items():
            t = f.tensors[name]
            assert (t.offset, t.data.shape, t.data.dtype) == (offset, data.shape, data.dtype), name
            assert np.array_equal(t.data, data), name


def test_reader_matches_the_gguf_package(smollm2_path):
    _same_as_gguf_package(smollm2_path)


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_reader_reads_every_value_type_as_the_gguf_package(tmp_path, endian):
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(3)
    path = tmp_path / f"{endian}.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian[endian])
    w.add_custom_alignment(64)
    for i, add in enumerate([w.add_uint8, w.add_int8, w.add_uint16, w.add_int16, w.add_uint32, w.add_int32,
                             w.add_uint64, w.add_int64]):
        add(f"int.{i}", 7 * i + 1 if add.__name__.startswith("add_u") else -5 * i - 1)
    w.add_float32("f32", 0.1)
    w.add_float64("f64", -2.5e-300)
    w.add_bool("yes", True)
    w.add_bool("no", False)
    w.add_string("name", "naïve ☃")
    w.add_array("words", ["", "Ġthe", "<|im_end|>", "é"])
    w.add_array("floats", rng.standard_normal(5).astype(np.float32).tolist())
    w.add_array("ints", [-3, 0, 2**31 - 1])
    w.add_array("nested", [[1, 2], [3]])
    for name, shape, kind in [("a.weight", (3, 64), "Q4_0"), ("b.weight", (2, 32), "Q4_1"),
                              ("c.weight", (4, 96), "Q8_0"), ("norm", (7,), None), ("m", (2, 3, 5), None)]:
        x = rng.standard_normal(shape).astype(np.float32)
        if kind:
            qt = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, quantize(x, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, x)  # the writer swaps the bytes for a big-endian file
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _same_as_gguf_package(path, nested=["nested"])
    with GGUFFile(path) as f:
        assert f.get("nested") == [[1, 2], [3]] and f.get("name") == "naïve ☃" and f.get("yes") is True
        assert f.tensors["m"].shape == (2, 3, 5) and f.tensors["c.weight"].quant == "q8_0"
        assert f.get("general.alignment") == 64 and f.tensors["norm"].offset % 64 == 0
        if endian == "BIG":  # read, but its weights are not uploaded as they lie
            for use in (f.source, f.array):
                with pytest.raises(GGUFError, match=f"{path}: tensor 'norm': the file is big-endian"):
                    use("norm")
        else:
            m = np.asarray(f.source("m").read()).view(np.float32).reshape(2, 3, 5)
            np.testing.assert_array_equal(f.array("m"), m)


@pytest.mark.parametrize("data,reason", [(b"", "not a readable GGUF"), (b"GGUF" + b"\0" * 8, "not a readable GGUF"),
                                         (b"NOPE" + struct.pack("<I", 3) + b"\0" * 16, "not a readable GGUF"),
                                         # found by fuzzing: an array of 2**60 elements (the gguf package
                                         # would loop over it, allocating, for ever)
                                         (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a"
                                          + struct.pack("<IIQ", 9, 0, 2**60) + b"\0" * 16,
                                          r"not a readable GGUF file \(value 0 of 1152921504606846976 elements"),
                                         (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t"
                                          + struct.pack("<I", 9) + b"\0" * 16, r"not a readable GGUF file \(tensor 0 has 9 dimensions"),
                                         (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), r"not a readable GGUF file \(version 1;"),
                                         # a string array counted past the file's end, and one of bad UTF-8
                                         (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a"
                                          + struct.pack("<IIQ", 9, 8, 10**6) + b"\0" * 16,
                                          r"not a readable GGUF file \(value 0 of 1000000 elements"),
                                         (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a"
                                          + struct.pack("<IIQ", 9, 8, 1) + struct.pack("<Q", 2) + b"\xff\xfe" + b"\0" * 8,
                                          r"value 0 element 0 is not UTF-8"),
                                         # found by fuzzing: an empty tensor (a dimension 0) whose other
                                         # dimension numpy cannot hold
                                         (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t"
                                          + struct.pack("<IQQIQ", 2, 0, 2**62, 0, 0) + b"\0" * 32,
                                          r"tensor 't' \(F32\) has shape \(4611686018427387904, 0\)")])
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
