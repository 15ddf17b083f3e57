"""How a prompt is cut into prefill batches and one-token steps (models/llama.py), which the run
model prices alike."""

import pytest

from vkgraph.models.llama import (PREFILL_MIN, STEP_TOKENS, STEP_TOKENS_GPU, prefill_entry, prefill_schedule,
                                  prefill_sizes, step_tokens)


def test_sizes_are_the_prefill_and_its_half():
    assert prefill_sizes(64) == [64, 32] and prefill_sizes(8) == [8, 4]
    assert prefill_sizes(PREFILL_MIN) == [PREFILL_MIN] and prefill_sizes(2) == [2] and prefill_sizes(0) == []
    assert [prefill_entry(n, [64, 32]) for n in (64, 32)] == ["prefill", "prefill32"]


def test_step_prices_by_renderer():
    assert step_tokens("lavapipe") == STEP_TOKENS["lavapipe"] == 10 and step_tokens("swiftshader") == 2
    assert step_tokens("") == step_tokens("NVIDIA H200") == STEP_TOKENS_GPU


@pytest.mark.parametrize("tokens,lavapipe,swiftshader", [
    (1, [1], [1]),
    (3, [1] * 3, [1] * 3),                       # lavapipe: 3 steps (30) against a batch of 32 (41)
    (5, [32], [1] * 5),                          # 50 against 41; SwiftShader 10 against 33
    (20, [32], [32]),                            # SwiftShader: 40 steps' worth against 33
    (33, [32, 1], [32, 1]),
    (34, [32, 1, 1], [32, 1, 1]),                # lavapipe: 61 against 73 for a batch of 64
    (37, [64], [32] + [1] * 5),                  # the chat demo's prompt: 73 against 91; 65 against 43
    (64, [64], [64]),
    (96, [64, 32], [64, 32]), (97, [64, 32, 1], [64, 32, 1]),  # lavapipe: 124 against 146 for two of 64
    (400, [64] * 6 + [32], [64] * 6 + [1] * 16),
])
def test_schedule_is_the_cheapest_plan(tokens, lavapipe, swiftshader):
    for renderer, want in (("lavapipe", lavapipe), ("swiftshader", swiftshader)):
        step = step_tokens(renderer)
        plan = prefill_schedule(tokens, [64, 32], step)
        assert plan == want, renderer
        batches = [n for n in plan if n > 1]
        assert plan == batches + [1] * (len(plan) - len(batches)) and batches == sorted(batches, reverse=True)
        assert sum(plan) - plan[-1] < tokens <= sum(plan)  # only the last batch is padded
        price = lambda p: sum(step if n == 1 else step - 1 + n for n in p)  # noqa: E731
        assert all(price(plan) <= price(other) for other in ([64] * -(-tokens // 64), [1] * tokens))


def test_gpus_batch_all_but_a_token():
    assert prefill_schedule(1, [64, 32], STEP_TOKENS_GPU) == [1]
    assert prefill_schedule(2, [64, 32], STEP_TOKENS_GPU) == [32]
    assert prefill_schedule(37, [64, 32], STEP_TOKENS_GPU) == [64]


def test_schedule_without_prefill_entries():
    assert prefill_schedule(5, [], 10) == [1] * 5 and prefill_schedule(100, [16], 10) == [16] * 7
    assert prefill_schedule(0, [64, 32], 10) == []


def test_plans_as_bench_prints_them():
    from vkgraph.cli.bench import batch_counts

    assert batch_counts([64, 64, 32, 1, 1]) == "2 of 64, 1 of 32, then 2 one-token steps"
    assert batch_counts([64]) == "1 of 64" and batch_counts([1, 1, 1]) == "3 one-token steps"
    assert batch_counts([32, 1]) == "1 of 32, then 1 one-token step"
