"""How a prompt is cut into prefill batches (models/llama.py), which the run model prices alike."""

import pytest

from vkgraph.models.llama import PREFILL_MIN, prefill_entry, prefill_schedule, prefill_sizes


def test_sizes_are_the_prefill_and_its_half():
    assert prefill_sizes(64) == [64, 32] and prefill_sizes(8) == [8, 4]
    assert prefill_sizes(PREFILL_MIN) == [PREFILL_MIN] and prefill_sizes(0) == []
    assert [prefill_entry(n, [64, 32]) for n in (64, 32)] == ["prefill", "prefill32"]


@pytest.mark.parametrize("tokens,batches", [
    (3, []),                     # fewer than PREFILL_MIN: token by token
    (4, [32]), (32, [32]),       # at most half: one half batch
    (33, [64]), (64, [64]),      # more than half: one whole batch (fewer dispatches than two halves)
    (96, [64, 32]), (97, [64, 64]),
    (400, [64] * 6 + [32]),
])
def test_schedule(tokens, batches):
    plan = prefill_schedule(tokens, [64, 32])
    assert plan == batches
    assert not plan or sum(plan) - plan[-1] < tokens <= sum(plan)  # only the last batch is padded


def test_schedule_without_prefill_entries():
    assert prefill_schedule(100, []) == [] and prefill_schedule(100, [16]) == [16] * 7
