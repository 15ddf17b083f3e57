import json

import numpy as np
import pytest

from vkgraph import cli, ops
from vkgraph.models.llama import LlamaSession
from vkgraph.tools.simulate import shipped_profile

pytestmark = pytest.mark.slow


def test_greedy_generation_matches_transformers(device, smollm2_path, smollm2_golden):
    case = smollm2_golden["generations"]["chat"]
    with LlamaSession(smollm2_path, device=device, max_context=64) as s:
        # the GGML blocks (210 Q4_1 tensors, a layer's q, k and v stacked as one: 150; the Q8_0
        # embedding) copied as they are: nothing packed by a shader; written straight into
        # device memory where it is host-visible
        assert s.report.packing_dispatches == 0
        assert s.report.direct_writes == (214 if device.host_visible_device_local else 0)
        # the prompt (37 tokens) as the renderer prices it (llama.STEP_TOKENS): lavapipe one batch
        # of 64; SwiftShader, where a padded token costs what a real one does, 32 and 5 steps
        plan = s.batches_for(len(s.prompt_ids("What is the capital of France?", chat=True)))
        assert plan == {"lavapipe": [64], "swiftshader": [32] + [1] * 5}.get(device.renderer, [64])
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


@pytest.mark.parametrize("tokens,plan", [(13, [8, 8]), (11, [8, 4]), (11, [8, 1, 1, 1])])
def test_batched_prefill_matches_token_by_token(device, smollm2_path, tokens, plan):
    """The prefill entry points (batches of 8, and of 4 for a remainder; the last batch padded),
    and a batch followed by tokens alone, give the logits of feeding the prompt token by token,
    and leave the caches so that decoding goes on the same."""
    with LlamaSession(smollm2_path, device=device, max_context=32, prefill=8) as s:
        ids = s.tokenizer.encode("The capital of France is Paris, and the capital of Italy is Rome.")[:tokens]
        assert len(ids) == tokens
        batched = s.prefill(ids, plan=plan)
        after_batched = s.step(int(np.argmax(batched)), len(ids))
        stepped = [s.step(tok, pos) for pos, tok in enumerate(ids)][-1]
        after_stepped = s.step(int(np.argmax(stepped)), len(ids))
        for bad in ([8], [8, 8, 4], [8, 2, 1], []):
            with pytest.raises(ValueError, match="does not run 11 tokens"):
                s.prefill(ids[:11], plan=bad)
    np.testing.assert_allclose(batched, stepped, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(after_batched, after_stepped, rtol=1e-4, atol=1e-4)


def test_int8_prefill_moves_logits_as_numpys_int8_model_does(device, smollm2_path):
    """configs/fast-prefill.toml (graph.int8_activations): on CPU renderers the prompt's Q4
    linears multiply int8 activations (each op checked exactly in test_quant). Which values round
    which way differs between any two computations (float32 and float64 put a value either side of
    a half), so the prompt's logits move from float32's (fed token by token) about as far as numpy's
    int8 model (reference_logits(int8=True)) moves them: between a quarter and four times as far
    (float32 activations would not move them at all); the same top 8 (the 8th and 9th 0.6 apart)."""
    from vkgraph import load_config
    from vkgraph.models.llama import reference_logits
    from vkgraph.paths import CONFIG_DIR

    if not device.is_cpu:
        pytest.skip("int8 activations are CPU renderers' tiles")
    with LlamaSession(smollm2_path, load_config(CONFIG_DIR / "fast-prefill.toml"), device=device, max_context=64) as s:
        ids = s.prompt_ids("What is the capital of France?", chat=True)
        assert any(nd.shader == "q8_pairs" for nd in s.graph.execute_nodes)
        batched = s.prefill(ids, plan=[64])
        stepped = [s.step(tok, pos) for pos, tok in enumerate(ids)][-1]
        ref = reference_logits(s.file, s.config, ids, int8=True)[-1]
    rms = lambda v: np.sqrt(np.mean(np.square(v, dtype=np.float64)))  # noqa: E731
    assert 0.25 < rms(batched - stepped) / rms(ref - stepped) < 4
    assert set(np.argsort(-batched)[:8]) == set(np.argsort(-stepped)[:8]) == set(np.argsort(-ref)[:8])


def test_context_overflow_is_clear(device, smollm2_path):
    with LlamaSession(smollm2_path, device=device, max_context=8, prefill=0) as s:  # no batched entry points: less to compile
        with pytest.raises(ValueError, match="exceed the 8-token context"):
            s.generate("one two three four five six", 5)


def test_bench_decode_reports_rates_and_the_gpu_profile(device, smollm2_path, capsys):
    assert cli.main(["bench", "decode", "--prompt-tokens", "5", "--new-tokens", "2", "--repeat", "0"]) == 1
    assert "--new-tokens and --repeat must be >= 1, got 5, 2 and 0" in capsys.readouterr().err
    assert cli.main(["bench", "decode", "--prompt-tokens", "20", "--new-tokens", "2", "--profile", "--json",
                     "--repeat", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompt_tokens"] == 20 and r["new_tokens"] == 2 and r["device"] == device.name and r["repeat"] == 2
    assert r["int8_activations"] is False  # the default: float32 activations
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["time_to_first_token_s"] > 0
    assert r["session_s"] > 0  # the session made before the first prompt: not in its time
    # the rate is the faster round's, the time to the first token the first round's: never faster
    assert r["prefill_tok_s"] >= 20 / r["time_to_first_token_s"]
    # every dispatch of a decode step is in the profile, under its op kind
    # per layer: 4 linears (q, k and v one over their stacked weights; gate and up one with the
    # silu(gate) * up, or with the CPU kernels on a renderer outside GATED_GEMV_RENDERERS two and
    # silu_mul; the RMS norms and residual adds fused in), rope_kv (RoPE of q and k, both cache
    # writes), attention; then the embedding and the output head (the final norm fused in)
    split = int(ops.CPU_KERNELS and device.is_cpu and device.renderer not in ops.GATED_GEMV_RENDERERS)
    assert sum(n for _, n in r["profile"].values()) == r["dispatches_per_token"] == 30 * (6 + 2 * split) + 2
    assert "norm_rows" not in r["profile"] and "rms_norm" not in r["profile"]
    # the prompt's one batch (20 tokens: cheaper padded to 32 than as steps on both renderers);
    # its last layer after attention runs the last token alone
    assert r["prefill_batches"] == [32] and r["prefill_profile"]["linear_quant"][1] == 121 + split
    assert r["profile"]["linear_quant"][1] == 121 + 30 * split and all(sec > 0 for sec, _ in r["profile"].values())
    times = [sec for sec, _ in r["profile"].values()]
    assert times == sorted(times, reverse=True)  # top ops first


def test_run_model_records_what_a_session_dispatches_and_validates(device, smollm2_path, capsys, monkeypatch):
    """The run model's graph is the session's: as many dispatches per decoded token; --validate
    --decode puts it next to bench decode in a fresh process, and with --rates-now next to a
    prediction from [execute] rates measured again before the process (here: lavapipe.toml's, in
    place of a calibration's minute or two)."""
    import dataclasses

    from vkgraph.tools import calibrate
    from vkgraph.tools.simulate import load_profile
    from vkgraph.tools.simulate_run import simulate_decode

    pred = simulate_decode("smollm2", load_profile("lavapipe"), 5)
    assert pred.step.dispatches == 30 * 6 + 2 and pred.prefill.by_kind["linear_quant"][1] == 121
    if shipped_profile(device.renderer) is None:
        pytest.skip(f"no profile is shipped for {device.renderer}: --validate needs one")
    rates = load_profile("lavapipe").execute
    monkeypatch.setattr(calibrate, "execute_rates_now", lambda: rates)
    assert cli.main(["simulate", "--validate", "--decode", "--repeat", "1", "--prompt-tokens", "5",
                     "--new-tokens", "2", "--json", "--rates-now"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == device.name and r["model"] == "smollm2"
    now = simulate_decode("smollm2", dataclasses.replace(load_profile(r["profile"]), execute=rates), 5, 2)
    for key in ("prefill_tok_s", "decode_tok_s", "time_to_first_token_s"):
        v = r[key]
        assert v["min"] <= v["measured"] <= v["max"] and v["error"] == pytest.approx(v["simulated"] / v["measured"] - 1)
        assert v["simulated_now"] == pytest.approx(getattr(now, key))
        assert v["error_now"] == pytest.approx(v["simulated_now"] / v["measured"] - 1)
    assert cli.main(["simulate", "--rates-now"]) == 1
    assert "--rates-now goes with --validate" in capsys.readouterr().err
