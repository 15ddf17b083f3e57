"""Memory planning (graph/allocation.py): which intermediates share memory, and where they go."""

import numpy as np
import pytest

from vkgraph import ops
from vkgraph.graph.allocation import place_shared, shared_lifetimes
from vkgraph.graph.compute_graph import ComputeGraph


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("seed", range(20))
def test_placed_buffers_live_together_never_overlap(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    align = int(rng.choice([4, 16, 64, 256]))
    needs = [(int(rng.integers(1, 5000)), align) for _ in range(n)]
    lifetimes = []
    for _ in range(n):
        first = int(rng.integers(0, 30))
        lifetimes.append((first, first + int(rng.integers(0, 8))))
    offsets = place_shared(needs, lifetimes)
    for i in range(n):
        assert offsets[i] % align == 0
        for j in range(i):
            if overlaps((lifetimes[i][0], lifetimes[i][1] + 1), (lifetimes[j][0], lifetimes[j][1] + 1)):
                assert not overlaps((offsets[i], offsets[i] + needs[i][0]), (offsets[j], offsets[j] + needs[j][0])), (i, j)
    # never more than everything side by side (aligned)
    assert max(o + s for o, (s, _) in zip(offsets, needs)) <= sum(-(-s // align) * align for s, _ in needs)


def test_a_chain_reuses_the_memory_of_tensors_already_read():
    # a -> b -> c -> d: a is read last by node 1, so c (nodes 1..2) cannot take its place, d can
    needs = [(100, 4)] * 4
    offsets = place_shared(needs, [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert offsets[0] == offsets[2] != offsets[1] == offsets[3]


def test_shared_lifetimes_leave_out_io_state_weights_and_entry_crossers():
    g = ComputeGraph.recording()
    x = g.add_input((4, 8), np.float32, "x")
    w = g.add_tensorref(np.ones(8, np.float32), "w")
    state = g.add_tensor((4, 8), np.float32, "state", state=True)
    h1 = ops.mul(g, x, w)                 # node 0
    h2 = ops.add(g, h1, state)            # node 1
    h3 = ops.relu(g, h2)                  # node 2
    y = ops.add(g, h3, h1)                # node 3
    g.set_output(y, "y")
    with g.entry("other"):
        z = ops.relu(g, h3)               # node 4: h3 is bound by both entry points
        alone = ops.relu(g, z)            # node 5: read by no later dispatch
        g.set_output(ops.relu(g, alone), "z")
    shared = shared_lifetimes(g)
    assert shared.get(h1) == (0, 3) and shared.get(h2) == (1, 2)
    assert h3 not in shared and x not in shared and y not in shared and state not in shared
    assert shared.get(z) == (4, 5) and shared.get(alone) == (5, 6)
    assert set(shared) == {h1, h2, z, alone}


def test_a_view_keeps_its_root_alive():
    g = ComputeGraph.recording()
    x = g.add_input((4, 8), np.float32, "x")
    h = ops.relu(g, x)                    # node 0
    v = g.add_view(h, (32,))
    a = ops.relu(g, x)                    # node 1
    b = ops.add(g, g.add_view(a, (32,)), v)  # node 2: reads h through its view
    g.set_output(b, "y")
    shared = shared_lifetimes(g)
    assert shared[h] == (0, 2) and shared[a] == (1, 2) and v not in shared
