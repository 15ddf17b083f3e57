"""The run model (tools/simulate_run.py): prefill and decode priced dispatch by dispatch from
the same graph a session records, with the profile's [execute] rates."""

import dataclasses
import re

import pytest

from vkgraph import ops
from vkgraph.errors import ConfigError
from vkgraph.graph.compute_graph import ComputeGraph
from vkgraph.tools.simulate import load_profile
from vkgraph.tools.simulate_run import (ExecuteRates, binding_nbytes, device_facts, dispatch_seconds, first_use_seconds,
                                        simulate_decode, waves_factor)

PROFILE = load_profile("lavapipe")
RATES = ExecuteRates(host_s=1e-4, dispatch_s=2e-5, stream_gbps=4.0, weight_gbps={"fp32": 8.0, "q4_0": 2.0},
                     linear_dispatch_s=6e-5, gmacs={"q4_0": 20.0}, linear_row_s=1e-7)


def test_a_linear_streams_its_weight_per_tile_and_other_kernels_their_bytes():
    """Hand-worked: a 32-token quantized linear on a CPU renderer reads its weight once per tile
    of LINEAR_TOKENS_CPU tokens and pays the multiply-adds of the tiles' further tokens."""
    import numpy as np

    profile = dataclasses.replace(PROFILE, execute=RATES)
    g = ComputeGraph.recording(facts=device_facts(profile))
    raw = np.zeros((64, 18 * 8), np.uint8)  # 64 rows of 256 weights in Q4_0 blocks: only the shape matters
    x = g.add_input((32, 256), np.float32, "x")
    y = ops.linear(g, x, g.add_tensorref(raw, "w", quant="q4_0"))
    z = ops.add(g, y, y)
    lin, add = g.execute_nodes
    passes = -(-32 // ops.LINEAR_TOKENS_CPU)
    wbytes = g.values[lin.args[2]].nbytes
    assert lin.weight_passes == passes and lin.linear_shape == (32, 64, 256)
    assert dispatch_seconds(g, lin, RATES) == pytest.approx(
        6e-5 + passes * (64 * 1e-7 + wbytes / 2e9) + (32 - passes) * 64 * 256 / 20e9)
    assert dispatch_seconds(g, add, RATES) == pytest.approx(2e-5 + 3 * g.values[z].nbytes / 4e9)


def test_a_linear_on_a_cpu_renderer_is_priced_in_whole_waves_of_simd_batches():
    """Hand-worked: on a 2-thread CPU renderer in workgroups of CPU_LOCAL (8) a one-token
    quantized linear of 600 rows takes 40 rows an invocation (ops._gemv_rows: a workgroup for
    each thread, in multiples of 4 rows): 15 invocations, 2 batches, which the 2 threads run in
    one wave, so it costs 16 invocations' time; 1024 rows take 64, 16 invocations exactly; 49152
    rows GEMV_ROWS_CPU (128): 384 invocations, 48 batches in 24 waves. On a GPU (threads 0)
    nothing is scaled."""
    import numpy as np

    threaded = dataclasses.replace(RATES, threads=2)
    profile = dataclasses.replace(PROFILE, execute=threaded, simd_width=8)  # lavapipe at 256 bits
    g = ComputeGraph.recording(facts=device_facts(profile))
    x = g.add_input((1, 256), np.float32, "x")
    for rows in (600, 1024, 49152):
        ops.linear(g, x, g.add_tensorref(np.zeros((rows, 8 * 18), np.uint8), f"w{rows}", quant="q4_0"))
    n600, n1024, head = g.execute_nodes
    assert (ops.GEMV_ROWS_CPU, ops.CPU_LOCAL) == (128, 8)
    assert [(n.defines["ROWS"], n.invocations) for n in (n600, n1024, head)] == [(40, 15), (64, 16), (128, 384)]
    assert waves_factor(n600, 2) == pytest.approx(16 / 15)
    assert waves_factor(n1024, 2) == 1.0 and waves_factor(head, 2) == 1.0
    assert waves_factor(n600, 0) == 1.0
    wbytes = g.values[n600.args[2]].nbytes
    assert dispatch_seconds(g, n600, threaded) == pytest.approx(6e-5 + 16 / 15 * (600 * 1e-7 + wbytes / 2e9))
    assert dispatch_seconds(g, n600, RATES) == pytest.approx(6e-5 + 600 * 1e-7 + wbytes / 2e9)


def test_a_partial_waves_idle_batches_are_paid_by_the_profiles_share_of_them():
    """Hand-worked: lavapipe at 512 bits (workgroups of 16) runs SmolLM2's one-token 576-row
    linear as 36 invocations of 16 rows, 3 batches in 2 waves on 2 threads: waves_factor 64/36.
    A linear's rows and bytes pay wave_share of that excess (0 on a host where a lone thread
    streams the last batch as fast as two: the invocations it has), a tile's multiply-adds all
    of it."""
    import numpy as np

    profile = dataclasses.replace(PROFILE, simd_width=16, renderer="lavapipe")
    g = ComputeGraph.recording(facts=device_facts(dataclasses.replace(profile, execute=RATES)))
    x1 = g.add_input((1, 576), np.float32, "x1")
    x48 = g.add_input((48, 576), np.float32, "x48")
    w = g.add_tensorref(np.zeros((576, 18 * 18), np.uint8), "w", quant="q4_0")
    ops.linear(g, x1, w)
    ops.linear(g, x48, w)
    gemv, tiles = g.execute_nodes
    f = waves_factor(gemv, 2)
    assert gemv.invocations == 36 and f == pytest.approx(64 / 36)
    wbytes = g.values[gemv.args[2]].nbytes
    for share in (0.0, 0.5, 1.0):
        rates = dataclasses.replace(RATES, threads=2, wave_share=share)
        assert dispatch_seconds(g, gemv, rates) == pytest.approx(
            6e-5 + (1 + share * (f - 1)) * (576 * 1e-7 + wbytes / 2e9))
        ft, passes = waves_factor(tiles, 2), tiles.weight_passes
        m, rows, k = tiles.linear_shape
        assert dispatch_seconds(g, tiles, rates) == pytest.approx(
            6e-5 + (1 + share * (ft - 1)) * passes * (rows * 1e-7 + wbytes / 2e9) + ft * (m - passes) * rows * k / 20e9)


def test_gated_linears_and_one_token_attention_have_rates_of_their_own():
    """Hand-worked: a gated linear (two weights, one dispatch) costs gated_step (one token) or
    gated_tiles (a batch) times a plain linear of both weights' rows and bytes; attention of one
    query token costs step_key_ns per row and key (a decoded token: no other query reuses the
    keys it fetches), a batch's attention_key_ns; without step_key_ns both the batch's."""
    import numpy as np

    rates = dataclasses.replace(RATES, gated_step=1.5, gated_tiles=0.75, attention_key_s=1e-8, step_key_s=3e-8)
    g = ComputeGraph.recording(facts=device_facts(dataclasses.replace(PROFILE, execute=rates)))
    x1, x8 = g.add_input((1, 256), np.float32, "x1"), g.add_input((8, 256), np.float32, "x8")
    wg, wu = (g.add_tensorref(np.zeros((64, 8 * 18), np.uint8), n, quant="q4_0") for n in ("g", "u"))
    ops.gated_linear(g, x1, wg, wu)
    ops.gated_linear(g, x8, wg, wu)
    q1, q8 = g.add_input((1, 4 * 8), np.float32, "q1"), g.add_input((8, 4 * 8), np.float32, "q8")
    k, v = (g.add_tensor((16, 4 * 8), np.float32, n) for n in "kv")
    step = g.add_input((2,), np.uint32, "step")
    for q in (q1, q8):
        ops.sdpa(g, q, k, v, heads=4, causal=True, step=step)
    one, batch, attn1, attn8 = g.execute_nodes
    assert one.weights == batch.weights == 2 and one.linear_shape == (1, 128, 256)
    plain = dataclasses.replace(rates, gated_step=1.0, gated_tiles=1.0)
    for node, factor in ((one, 1.5), (batch, 0.75)):
        assert dispatch_seconds(g, node, rates) - 6e-5 == pytest.approx(
            factor * (dispatch_seconds(g, node, plain) - 6e-5))
    assert one.linear_shape[1] * 1e-7 + 2 * binding_nbytes(g, one.args[2]) / 2e9 == pytest.approx(
        dispatch_seconds(g, one, plain) - 6e-5)
    for node, per_key in ((attn1, 3e-8), (attn8, 1e-8)):
        assert dispatch_seconds(g, node, rates, 10) - dispatch_seconds(g, node, rates) == pytest.approx(
            node.key_rows * 10 * per_key)
    no_step = dataclasses.replace(rates, step_key_s=0.0)
    assert dispatch_seconds(g, attn1, no_step, 10) - dispatch_seconds(g, attn1, no_step) == pytest.approx(4 * 10 * 1e-8)


def test_decode_prediction_follows_the_session():
    """Prefill as the session runs the prompt on the profile's renderer (llama.prefill_schedule:
    batches of 64 and 32, the last padded, then tokens alone), then a step per token; a
    shape-only spec needs no weights."""
    pred = simulate_decode("llama-3.2-1b:q4_0", PROFILE, 120)
    assert pred.prefill_chunk == 64 and pred.step.dispatches == 16 * 6 + 2  # 16 layers, embedding, head
    # 120 tokens: two batches of 64, the second (reported) seeing 64 more keys per token than the first
    assert pred.prefill_batches == [64, 64]
    first = pred.time_to_first_token_s - pred.prefill.seconds
    assert 0 < first < pred.prefill.seconds
    assert pred.decode_tok_s == pytest.approx(32 / (32 * pred.step.seconds + pred.first_use_s[1]))
    assert pred.prefill_tok_s == pytest.approx(120 / pred.time_to_first_token_s)
    assert simulate_decode("llama-3.2-1b:q4_0", PROFILE, 90).prefill_batches == [64, 32]
    assert max(pred.step.by_kind, key=lambda k: pred.step.by_kind[k][0]) == "linear_quant"
    short = simulate_decode("llama-3.2-1b:q4_0", PROFILE, 3)  # steps at positions 0..2: fewer keys than decoding's
    assert short.prefill_chunk == 0 and short.prefill_batches == [1] * 3
    assert 0 < short.time_to_first_token_s - short.first_use_s[0] < 3 * short.step.seconds
    # SwiftShader: a batch of 32 and 5 steps at positions 32..36, each step priced as the decode's
    ss = simulate_decode("llama-3.2-1b:q4_0", load_profile("swiftshader"), 37, 1)
    assert ss.prefill_chunk == 32 and ss.prefill_batches == [32] + [1] * 5
    alone = ss.time_to_first_token_s - ss.prefill.seconds - ss.first_use_s[0]
    one = simulate_decode("llama-3.2-1b:q4_0", load_profile("swiftshader"), 34, 1).step  # 35 keys: the 5's mean
    assert alone == pytest.approx(5 * one.seconds)


def test_attention_is_priced_by_the_keys_its_queries_see():
    """Hand-worked: attention costs attention_key_ns per query row (a head of a token) and key it
    sees, in whole waves on a CPU renderer: 9 heads of one token are 2 SIMD batches of 8, one
    wave on 2 threads, priced as 16 rows (at 16 lanes, lavapipe at 512 bits: one batch, one wave
    of two batches' time, 32 rows); so a longer context decodes and prefills slower."""
    import numpy as np

    rates = dataclasses.replace(RATES, threads=2, attention_key_s=1e-8)
    for simd, rows in ((8, 16), (16, 32)):
        profile = dataclasses.replace(PROFILE, execute=rates, simd_width=simd)
        g = ComputeGraph.recording(facts=device_facts(profile))
        q = g.add_input((1, 9 * 8), np.float32, "q")
        k, v = (g.add_tensor((16, 3 * 8), np.float32, n) for n in "kv")
        ops.sdpa(g, q, k, v, heads=9, kv_heads=3, causal=True, step=g.add_input((2,), np.uint32, "step"))
        (attn,) = g.execute_nodes
        assert attn.key_rows == 9 and attn.invocations == 9 and attn.spec[0] == simd
        assert dispatch_seconds(g, attn, rates, 10) - dispatch_seconds(g, attn, rates) == pytest.approx(rows * 10 * 1e-8)
    near, far = (simulate_decode("llama-3.2-1b:q4_0", PROFILE, n) for n in (64, 400))
    assert far.decode_tok_s < near.decode_tok_s and far.prefill_tok_s < near.prefill_tok_s
    assert far.step.by_kind["sdpa_rows"][0] > near.step.by_kind["sdpa_rows"][0]


def test_a_fresh_process_pays_each_pipelines_first_dispatch_once():
    """Hand-worked: two linears of one shape share a pipeline, so an entry point of them and an
    addition first costs one linear's first dispatch and one other's; an entry point using only
    pipelines the process has run costs none. A fresh process's prompt pays its batches'
    pipelines, its first decoded token the steps' that are left."""
    import numpy as np

    rates = dataclasses.replace(RATES, first_linear_s=2e-3, first_dispatch_s=5e-4)
    g = ComputeGraph.recording(facts=device_facts(dataclasses.replace(PROFILE, execute=rates)))
    x = g.add_input((1, 256), np.float32, "x")
    y = [ops.linear(g, x, g.add_tensorref(np.zeros((64, 8 * 18), np.uint8), f"w{i}", quant="q4_0")) for i in range(2)]
    ops.add(g, *y)
    used: set = set()
    assert first_use_seconds(g, "", rates, used) == pytest.approx(2e-3 + 5e-4)
    assert len(used) == 2 and first_use_seconds(g, "", rates, used) == 0.0
    fresh, steady = (simulate_decode("llama-3.2-1b:q4_0", dataclasses.replace(PROFILE, execute=dataclasses.replace(
        PROFILE.execute, first_linear_s=first, first_dispatch_s=first / 4)), 64) for first in (2e-3, 0.0))
    prompt, step = fresh.first_use_s
    assert steady.first_use_s == (0.0, 0.0) and steady.decode_tok_s == pytest.approx(1 / steady.step.seconds)
    assert prompt > 4 * 2e-3 and 0 < step < prompt  # the steps' one-token linears are pipelines of their own
    assert fresh.time_to_first_token_s == pytest.approx(steady.time_to_first_token_s + prompt)
    assert 32 / fresh.decode_tok_s == pytest.approx(32 / steady.decode_tok_s + step)


def test_decode_prediction_refuses_what_it_cannot_model(tmp_path):
    with pytest.raises(ValueError, match="--decode models a llama decoder .* not 'synthetic:8'"):
        simulate_decode("synthetic:8", PROFILE)
    with pytest.raises(ConfigError, match="execute: missing"):
        simulate_decode("llama-3.2-1b:q4_0", load_profile("mobile-flagship-estimate"))
    with pytest.raises(ValueError, match="--prompt-tokens and --new-tokens must be >= 1, got 0 and 32"):
        simulate_decode("llama-3.2-1b:q4_0", PROFILE, 0)
    with pytest.raises(ValueError, match="500 \\+ 32 tokens exceed the 512-token context"):
        simulate_decode("llama-3.2-1b:q4_0", PROFILE, 500)
    text = (load_profile.__globals__["PROFILE_DIR"] / "lavapipe.toml").read_text()
    p = tmp_path / "p.toml"
    p.write_text(re.sub(r"(?m)^stream_gbps = .*$", "stream_gbps = 0", text))
    with pytest.raises(ConfigError, match="execute.stream_gbps: must be > 0"):
        load_profile(p)
    p.write_text(re.sub(r"(?m)^attention_key_ns = .*$", "attention_key_ns = -1", text))
    with pytest.raises(ConfigError, match=r"execute.attention_key_ns: must be >= 0 \(0: not modelled\), got -1"):
        load_profile(p)
    p.write_text(re.sub(r"(?m)^first_linear_us = .*$", "first_linear_us = -2", text))
    with pytest.raises(ConfigError, match=r"execute.first_linear_us: must be >= 0 \(0: not modelled\), got -2"):
        load_profile(p)
    for key, value, message in (("wave_share", "1.5", "must be within 0..1, got 1.5"),
                                ("gated_step", "0", "must be > 0, got 0"),
                                ("step_key_ns", "-3", r"must be >= 0 \(0: not modelled\), got -3")):
        p.write_text(re.sub(r"(?m)^\[execute\].*$", lambda m: f"{m.group(0)}\n{key} = {value}", text))
        with pytest.raises(ConfigError, match=f"execute.{key}: {message}"):
            load_profile(p)
    p.write_text(re.sub(r"(?m)^host_us = .*$", "", text))
    with pytest.raises(ConfigError, match="execute.host_us: missing"):
        load_profile(p)


def test_cpu_kernels_fill_the_renderers_vectors():
    """Workgroups of a CPU renderer's SIMD width where it is wider than CPU_LOCAL (lavapipe at
    512 bits: 16), and linears too small to fill SMALL_LINEAR_GROUPS of them take half the rows
    per invocation (SmolLM2's one-token 576-row linear: 36 invocations of 16 rows, not 18 of
    LINEAR_ROWS_CPU's 32); a 64-token prompt's tiles and the output head keep theirs. In
    workgroups of CPU_LOCAL (8 lanes, or SwiftShader's 4 twice) one-token linears fill one
    wave of the profile's 2 threads: 576 rows in 16 invocations of 36, the head 128 rows."""
    import numpy as np

    assert PROFILE.execute.threads == 2
    for renderer, simd, local, gemv_rows, head_rows in (("lavapipe", 8, 8, 36, 128), ("lavapipe", 16, 16, 16, 32),
                                                        ("swiftshader", 4, 8, 36, 128)):
        g = ComputeGraph.recording(facts=device_facts(dataclasses.replace(PROFILE, simd_width=simd,
                                                                          renderer=renderer)))
        x1, x64 = g.add_input((1, 576), np.float32, "x1"), g.add_input((64, 576), np.float32, "x64")
        w = g.add_tensorref(np.zeros((576, 18 * 20), np.uint8), "w", quant="q4_1")
        head = g.add_tensorref(np.zeros((49152, 18 * 20), np.uint8), "head", quant="q4_1")
        ops.linear(g, x1, w)
        ops.linear(g, x64, w)
        ops.linear(g, x1, head)
        gemv, tiles, out = g.execute_nodes
        assert {n.spec[0] for n in g.execute_nodes} == {local}
        assert gemv.defines["ROWS"] == gemv_rows and gemv.invocations == 576 // gemv_rows
        assert tiles.defines["ROWS"] == ops.LINEAR_TILE_ROWS.get(renderer, ops.LINEAR_TILE_ROWS_CPU)
        assert out.defines["ROWS"] == head_rows


def test_a_batch_attends_with_the_heads_that_share_a_key_value_head_in_one_invocation():
    """In a batched prompt an invocation takes the query heads of one key/value head (SmolLM2: 9
    heads over 3, so 3 invocations a token, each fetching a key once for 3 heads), priced per
    invocation row and key; one token keeps an invocation per head."""
    import numpy as np

    for t, group in ((32, 3), (1, 1)):
        g = ComputeGraph.recording(facts=device_facts(PROFILE))
        q = g.add_input((t, 9 * 64), np.float32, "q")
        k, v = (g.add_tensor((64, 3 * 64), np.float32, n) for n in "kv")
        ops.sdpa(g, q, k, v, heads=9, kv_heads=3, causal=True, step=g.add_input((2,), np.uint32, "step"))
        (attn,) = g.execute_nodes
        assert attn.defines["GROUP"] == group and attn.key_rows == 9 // group and attn.invocations == t * 9 // group
