import numpy as np
import pytest

from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph
from vkgraph.models import outputs_match, synthetic
from vkgraph.models.safetensors import SafetensorsFile


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    spec = synthetic.SyntheticSpec.for_size(8)
    return spec, synthetic.weights_path(spec, tmp_path_factory.mktemp("models"))


def load(device, compiler, path, spec, mode, **cfg):
    cfg = GraphConfig().replace(prepack__threshold_nbytes=256 << 10, prepack__initial_threshold_nbytes=64 << 10,
                                prepack__staging_ring_nbytes=1 << 20,
                                prepack__reduce_peak_memory=(mode == "reduce-peak"),
                                **{"prepack__host_packing": "never", **cfg})  # batches of packing shaders everywhere
    st = SafetensorsFile(path)
    g = ComputeGraph(cfg, device=device, compiler=compiler)
    synthetic.build(g, st, spec)
    report = g.prepack() if mode == "legacy" else g.run_prepack()
    return g, st, report


def test_weights_file_is_deterministic(small_model, tmp_path):
    spec, path = small_model
    again = synthetic.weights_path(spec, tmp_path)
    assert again.read_bytes() == path.read_bytes()
    with SafetensorsFile(path) as st:
        assert set(st.tensors) == set(spec.shapes())


def test_forward_matches_numpy_and_modes_pack_identically(device, compiler, small_model):
    spec, path = small_model
    ids = synthetic.sample_ids(spec)
    packed = {}
    for mode in ("legacy", "staged", "reduce-peak"):
        g, st, report = load(device, compiler, path, spec, mode)
        try:
            assert report.mode == mode and report.total_constant_nbytes == spec.nbytes
            if mode != "legacy":
                assert report.submits > 3
            logits = g.execute({"ids": ids})["logits"]
            if mode == "legacy":
                expect = synthetic.reference(st, spec, ids)
            assert logits.shape == (spec.tokens, spec.vocab)
            assert outputs_match(logits, expect), np.abs(logits - expect).max()
            packed[mode] = [bytes(g.read_tensor(n.dst)) for n in g.prepack_nodes]
        finally:
            g.destroy()
            st.close()
    assert packed["legacy"] == packed["staged"] == packed["reduce-peak"]
