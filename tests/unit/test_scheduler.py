import pytest

from vkgraph.config import GraphConfig
from vkgraph.graph.nodes import grid_groups
from vkgraph.graph.scheduler import (
    UNPOPULATED_DEVICES,
    PrepackThresholds,
    batches,
    execute_cut_points,
    plan_prepack,
    populates,
    prepack_cut_points,
    reduce_peak_memory,
)

MiB = 1 << 20


def th(initial_nbytes=100, nbytes=100, initial_nodes=1000, nodes=1000):
    return PrepackThresholds(initial_nbytes, nbytes, initial_nodes, nodes)


def test_cut_when_bytes_in_cmd_exceed_threshold():
    # bytes in cmd before node i: 0, 60, 120 -> cut before 2; then 50, 100 (not > 100), 160 -> cut before 5
    sizes = [60, 60, 50, 50, 60, 10, 10]
    assert prepack_cut_points(sizes, th()) == [2, 5]


def test_equal_to_threshold_does_not_cut():
    # before node 2: exactly 100 bytes in the cmd (not > 100); before node 3: 101 -> cut
    assert prepack_cut_points([50, 50, 1, 1, 1], th()) == [3]


def test_initial_threshold_applies_until_first_cut():
    sizes = [30] * 10
    # initial 40: bytes before node 2 are 60 > 40 -> cut; steady 100: 30,60,90,120 -> cut before 6; then 30,60,90 ... last node never
    assert prepack_cut_points(sizes, th(initial_nbytes=40)) == [2, 6]


def test_node_threshold():
    sizes = [1] * 12
    # initial_nodes 2: cut when 3 nodes are in the cmd (before node 3); steady 4: before 3+5=8
    assert prepack_cut_points(sizes, th(initial_nodes=2, nodes=4)) == [3, 8]


def test_first_and_last_are_never_cut_before():
    # Huge first node: the cut comes before node 1, never before node 0.
    assert prepack_cut_points([10_000, 1, 1], th()) == [1]
    # Everything exceeds, but the last node stays with the one before it.
    assert prepack_cut_points([500, 500], th()) == []
    assert prepack_cut_points([500, 500, 500], th()) == [1]


def test_one_node_and_no_nodes():
    assert prepack_cut_points([123456789], th()) == []
    assert prepack_cut_points([], th()) == []


def test_node_larger_than_every_threshold_gets_its_own_command_buffer():
    sizes = [10, 10, 5000, 10, 10, 10]
    cuts = prepack_cut_points(sizes, th(initial_nbytes=15))
    assert cuts == [2, 3]
    assert [list(b) for b in batches(len(sizes), cuts)] == [[0, 1], [2], [3, 4, 5]]


def test_zero_means_default():
    t = PrepackThresholds.from_config(GraphConfig())
    assert t == PrepackThresholds(10 * MiB, 10 * MiB, 64, 256)
    sizes = [4 * MiB] * 8
    # default 10 MiB: 4, 8, 12 MiB in cmd before node 3 -> cut; again before node 6
    assert prepack_cut_points(sizes, t) == [3, 6]
    t = PrepackThresholds.from_config(GraphConfig().replace(prepack__threshold_nbytes=MiB))
    assert t.nbytes == MiB and t.initial_nbytes == 10 * MiB


def test_batches_cover_every_node_once():
    sizes = [7, 300, 2, 2, 90, 90, 90, 1, 400, 5]
    cuts = prepack_cut_points(sizes, th(initial_nbytes=5, nodes=2))
    flat = [i for b in batches(len(sizes), cuts) for i in b]
    assert flat == list(range(len(sizes)))


@pytest.mark.parametrize(
    "mode,total,expected",
    [(False, 10**12, False), (True, 1, True), ("auto", 2 << 30, True), ("auto", 1 << 30, False)],
)
def test_reduce_peak_memory_modes(mode, total, expected):
    cfg = GraphConfig().replace(prepack__reduce_peak_memory=mode)
    assert reduce_peak_memory(cfg, total) is expected


@pytest.mark.parametrize("choice", ["auto", True, False])
def test_a_devices_staged_loads_populate_unless_it_is_listed_or_told_not_to(choice):
    """prepack.populate_destinations: "auto" populates the packing shaders' memory in staged loads
    except on the devices of UNPOPULATED_DEVICES; true and false hold everywhere. Only staged
    loads populate at all."""
    cfg = GraphConfig().replace(prepack__populate_destinations=choice)
    listed = next(iter(UNPOPULATED_DEVICES))
    others = [("lavapipe", 8, listed[2]), ("swiftshader", 4, listed[2]),
              ("lavapipe", 16, "AuthenticAMD family 25 model 17"), ("lavapipe", 16, ""), ("nvidia", 0, "")]
    assert populates(cfg, *listed) is (choice is True)
    assert all(populates(cfg, *d) is (choice in ("auto", True)) for d in others)
    for populate in (True, False):
        plans = [plan_prepack(m, [64], 16, cfg, populate=populate) for m in ("staged", "reduce-peak", "legacy")]
        assert [p.populates_destinations for p in plans] == [populate, False, False]


def test_execute_cut_points():
    cfg = GraphConfig()  # 64 then every 128
    assert execute_cut_points(10, cfg) == []
    assert execute_cut_points(64, cfg) == []
    assert execute_cut_points(65, cfg) == [64]
    assert execute_cut_points(400, cfg) == [64, 192, 320]
    small = cfg.replace(execute__initial_threshold_node_count=2, execute__threshold_node_count=3)
    assert execute_cut_points(10, small) == [2, 5, 8]
    # max_cmds: 4 command buffers at most -> the steady count grows to fit
    capped = small.replace(execute__max_cmds=2)
    assert execute_cut_points(10, capped) == [2]
    assert len(batches(10, execute_cut_points(10, small.replace(execute__max_cmds=3)))) == 3
    assert execute_cut_points(10, small.replace(execute__max_cmds=1)) == []


@pytest.mark.parametrize("work,local,most", [(0, 8, 100), (17, 8, 65535), (30, 8, 2), (1000, 8, 7), (64, 8, 8)])
def test_grid_groups_give_each_item_one_invocation(work, local, most):
    """An invocation per work item (tile kernels without a grid-stride loop): at most ``most``
    workgroups in x, the last row of workgroups needed."""
    x, y, z = grid_groups(work, local, most)
    assert z == 1 and 1 <= x <= most
    assert x * y * local >= work and (y == 1 or (y - 1) * x * local < work)
