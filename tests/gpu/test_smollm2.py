import json

import numpy as np
import pytest

from vkgraph import cli
from vkgraph.models.llama import LlamaSession

pytestmark = pytest.mark.slow


def test_greedy_generation_matches_transformers(device, smollm2_path, smollm2_golden):
    case = smollm2_golden["generations"]["chat"]
    with LlamaSession(smollm2_path, device=device, max_context=64) as s:
        assert s.report.packing_dispatches == 211  # 210 Q4_1 + 1 Q8_0 tensors packed on the device
        gen = s.generate("What is the capital of France?", 12, chat=True)
    assert gen.tokens == case["greedy"]
    assert gen.text == case["text"]
    assert list(np.argsort(-gen.first_logits)[:20]) == case["first_logits_top"]
    np.testing.assert_allclose(gen.first_logits[:64], case["first_logits_head"], atol=5e-4)


def test_run_json_plain_prompt(device, smollm2_path, smollm2_golden, capsys):
    case = smollm2_golden["generations"]["plain"]
    assert cli.main(["run", "--model", "smollm2", "--prompt", case["prompt"], "--max-new-tokens", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == case["greedy"][:6]
    assert len(out["first_logits"]) == 49152 and out["tokens_per_s"] > 0
    assert out["load"]["submits"] > 1 and set(out) == {"device", "tokens", "text", "first_logits", "load", "tokens_per_s"}
    assert out["device"] == out["load"]["device"] == device.name


def test_context_overflow_is_clear(device, smollm2_path):
    with LlamaSession(smollm2_path, device=device, max_context=8) as s:
        with pytest.raises(ValueError, match="exceed the 8-token context"):
            s.generate("one two three four five six", 5)


def test_bench_decode_reports_rates_and_the_gpu_profile(device, smollm2_path, capsys):
    assert cli.main(["bench", "decode", "--prompt-tokens", "3", "--new-tokens", "2", "--profile", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompt_tokens"] == 3 and r["new_tokens"] == 2 and r["device"] == device.name
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["time_to_first_token_s"] > 0
    # every dispatch of a decode step is in the profile, under its op kind
    assert sum(n for _, n in r["profile"].values()) == r["dispatches_per_token"] == 543
    assert r["profile"]["linear_quant"][1] == 211 and all(sec > 0 for sec, _ in r["profile"].values())
    times = [sec for sec, _ in r["profile"].values()]
    assert times == sorted(times, reverse=True)  # top ops first
