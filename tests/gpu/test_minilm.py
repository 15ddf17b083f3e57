import json

import numpy as np
import pytest

from vkgraph import cli
from vkgraph.models import minilm
from vkgraph.models.safetensors import SafetensorsFile

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("legacy", [False, True])
def test_embeddings_match_transformers(device, minilm_dir, minilm_golden, legacy):
    """Batched (padded) texts on the device vs Hugging Face transformers, one text at a time."""
    texts = list(minilm_golden["embeddings"])
    res = minilm.embed(texts, path=minilm_dir, legacy=legacy, device=device)
    expect = np.array([minilm_golden["embeddings"][t] for t in texts], np.float32)
    np.testing.assert_allclose(res.vectors, expect, atol=2e-6)
    assert res.report.mode == ("legacy" if legacy else "staged")
    np.testing.assert_allclose(np.linalg.norm(res.vectors, axis=1), 1, rtol=1e-6)


def test_numpy_reference_agrees(minilm_dir, minilm_golden):
    texts = list(minilm_golden["embeddings"])[:3]
    cfg = minilm.BertConfig.from_file(minilm_dir / "config.json")
    inputs, seq = minilm.encode_inputs(minilm.WordPieceTokenizer(minilm_dir / "tokenizer.json"), texts, 256)
    with SafetensorsFile(minilm_dir / "model.safetensors") as st:
        ref = minilm.reference(st, cfg, inputs, len(texts), seq)
    expect = np.array([minilm_golden["embeddings"][t] for t in texts])
    np.testing.assert_allclose(ref, expect, atol=1e-6)


def test_run_json(device, minilm_dir, capsys):
    assert cli.main(["run", "--model", "minilm", "--text", "A cat.", "--text", "A kitten.", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    emb = np.array(out["embeddings"])
    assert emb.shape == (2, 384)
    assert out["cosine"][0][1] == pytest.approx(float(emb[0] @ emb[1]), abs=1e-6)
    assert out["load"]["submits"] >= 1 and out["load"]["mode"] == "staged"
    assert out["device"] == out["load"]["device"] == device.name


def test_missing_model_dir(tmp_path):
    with pytest.raises(minilm.ModelNotFoundError, match="missing config.json, model.safetensors, tokenizer.json"):
        minilm.model_dir(tmp_path)


def test_bench_embed_runs_both_forwards_on_the_same_sentences(device, minilm_dir, capsys):
    assert cli.main(["bench", "embed", "--batch", "1", "--batch", "4", "--repeat", "1", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["batch"] for r in rows] == [1, 4] and all(r["device"] == device.name for r in rows)
    assert rows[1]["seq"] >= rows[0]["seq"] > 2  # [CLS] ... [SEP], padded to the batch's longest
    for r in rows:  # the device and numpy embedded the same sentences alike
        assert r["max_abs_difference"] < 1e-5
        assert r["vkgraph_sentences_s"] > 0 and r["numpy_sentences_s"] > 0


@pytest.mark.parametrize("argv,message", [(["--batch", "0"], "must be >= 1"),
                                          (["--model", "synthetic:8"], "runs BERT encoders")])
def test_bench_embed_bad_arguments(argv, message, capsys):
    assert cli.main(["bench", "embed", *argv]) == 1
    assert message in capsys.readouterr().err
