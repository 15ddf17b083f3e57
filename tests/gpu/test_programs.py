"""ExecuTorch programs exported with VulkanPartitioner (tests/data/programs, made by
scripts/export_programs.py) run against the eager PyTorch outputs saved next to them."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from vkgraph.config import GraphConfig
from vkgraph.pte import load_program

from .conftest import assert_no_vulkan_messages, child_env, hit_path

PROGRAMS = Path(__file__).resolve().parents[1] / "data" / "programs"
FP32 = ["mlp", "encoder", "convnet", "elementwise", "tiny_llama", "vision", "elementwise2", "rope", "resample",
        "qembed_sdpa", "rope_interleaved", "dynamic_mlp", "batched_cnn", "pools_convs",
        "cpu_kernels"]  # qembed_sdpa: its 4-bit tables dequantize exactly
#: linears quantized by torchao and by PT2E quantizers; quant_mlp's and pc8_mlp's eager outputs
#: quantize activations to int8 dynamically (vkgraph runs them in float32, as ET-VK's reference
#: does), hence the looser tolerance
QUANT = ["quant_mlp", "q4w_mlp", "q8w_mlp", "int8wo_mlp", "qcs4w_mlp", "int8pack_mlp", "pc8_mlp", "q8ta_mlp", "qconv"]


def fixture(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    with np.load(PROGRAMS / f"{name}.npz") as d:
        count = lambda p: sum(k.startswith(p) for k in d.files)  # noqa: E731
        return [d[f"input_{i}"] for i in range(count("input_"))], [d[f"output_{i}"] for i in range(count("output_"))]


def load(name: str, device, **cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "asks for texture3d storage": every exported delegate does
        return load_program(PROGRAMS / f"{name}.pte", GraphConfig().replace(**cfg), device=device)


def assert_close(got: list[np.ndarray], refs: list[np.ndarray], tol: float = 1e-3) -> None:
    assert len(got) == len(refs)
    for k, (y, ref) in enumerate(zip(got, refs)):
        assert y.shape == ref.shape and y.dtype == ref.dtype, f"output_{k}: {y.shape} {y.dtype} vs {ref.shape} {ref.dtype}"
        err = np.abs(y.astype(np.float64) - ref).max()
        assert err <= tol * max(1.0, np.abs(ref).max()), f"output_{k}: max |error| {err}"


@pytest.mark.parametrize("name", FP32)
def test_program_matches_pytorch(device, name):
    inputs, refs = fixture(name)
    with load(name, device) as prog:
        assert [s.shape for s in prog.inputs] == [x.shape for x in inputs]
        assert prog.report.nodes > 0 and prog.report.total_constant_nbytes > 0
        assert_close(prog.run(*inputs), refs)
        assert_close(prog.run(*inputs), refs)  # the recorded command buffers run again


@pytest.mark.parametrize("storage", ["", "buffer", "texture3d"])
@pytest.mark.parametrize("name", ["encoder", "convnet", "tiny_llama"])
def test_tensors_are_held_in_the_storage_the_program_asks_for(device, name, storage):
    """graph.storage "" (the default) holds each tensor in the storage and layout the program
    asks for wherever vkgraph has a texture kernel for the op computing it, "texture3d" asks
    textures for every tensor, "buffer" keeps them all in buffers: the same results."""
    inputs, refs = fixture(name)
    with load(name, device, graph__storage=storage) as prog:
        assert_close(prog.run(*inputs), refs)
        held = [(lw, i, prog_g.values[lw.refs[i]]) for prog_g, lw in prog.graphs for i in lw.asked_textures]
        textures = [(lw, i, t) for lw, i, t in held if t.storage == "texture3d"]
        if storage == "buffer":
            assert not held and not any(t.storage == "texture3d" for g, _ in prog.graphs for t in g.values
                                        if hasattr(t, "storage"))
        else:
            assert len(textures) >= len(held) // 2 > 0
            assert all(t.layout == lw.texture_layout(i) for lw, i, t in textures)


def test_a_program_with_dynamic_shapes_runs_at_their_upper_bounds(device):
    """dynamic_mlp was exported with a dynamic batch dim up to 8: it runs at 8 (the test above),
    and a smaller batch is refused with an error that says why."""
    with load("dynamic_mlp", device) as prog:
        assert prog.inputs[0].dynamic and prog.inputs[0].shape == (8, 32)
        with pytest.raises(ValueError, match=r"input_0 must be \(8, 32\) float32, got \(3, 32\) float32 \(the program "
                                             r"was exported with dynamic shapes; vkgraph runs it at their upper bounds"):
            prog.run(np.zeros((3, 32), np.float32))


def test_ops_without_texture_kernels_are_named_once(device):
    """What vkgraph cannot hold in the textures a program asks for is said once per program."""
    with pytest.warns(UserWarning, match=r"resample.pte: 3 of 4 tensors that the program asks to hold in textures are "
                                         r"in buffers \(ops vkgraph runs on buffers only: "
                                         r"aten.upsample_bilinear2d.vec \(3\)\)") as seen:
        load_program(PROGRAMS / "resample.pte", GraphConfig(), device=device).close()
    assert len(seen) == 1


@pytest.mark.parametrize("name", QUANT)
def test_quantized_program_matches_pytorch(device, name):
    inputs, refs = fixture(name)
    with load(name, device) as prog:
        assert_close(prog.run(*inputs), refs, tol=3e-2)
        if name in ("quant_mlp", "q4w_mlp"):  # the int4 weights stay packed: uint8 bytes, not float32
            assert prog.report.total_constant_nbytes < 64 * 128 * 4


def test_legacy_and_staged_loads_agree(device):
    inputs, refs = fixture("encoder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vkgraph.pte.program import Program

        with Program(PROGRAMS / "encoder.pte", GraphConfig().replace(prepack__host_packing="never"), device,
                     legacy=True) as prog:
            assert prog.report.mode == "legacy"
            legacy = prog.run(*inputs)
    with load("encoder", device, prepack__threshold_nbytes=4096, prepack__initial_threshold_nbytes=4096,
              prepack__host_packing="never") as prog:  # batches of packing shaders on every device
        assert prog.report.mode == "staged" and len(prog.report.spans) > 1
        staged = prog.run(*inputs)
    np.testing.assert_array_equal(legacy[0], staged[0])
    assert_close(staged, refs)


def test_wrong_inputs_name_the_input(device):
    inputs, _ = fixture("elementwise")
    with load("elementwise", device) as prog:
        with pytest.raises(ValueError, match=r"input_1 must be \(5, 8\) float32, got \(5, 7\) float32"):
            prog.run(inputs[0], inputs[1][:, :7])
        with pytest.raises(ValueError, match=r"input_0 must be \(5, 8\) float32, got \(5, 8\) float64"):
            prog.run(inputs[0].astype(np.float64), inputs[1])
        with pytest.raises(ValueError, match="takes 2 inputs"):
            prog.run(inputs[0])


def test_cli_runs_a_program_with_inputs_and_saves_outputs(tmp_path):
    out = tmp_path / "out.npz"
    proc = subprocess.run([sys.executable, "-m", "vkgraph", "run", "--model", str(PROGRAMS / "tiny_llama.pte"),
                           "--inputs", str(PROGRAMS / "tiny_llama.npz"), "--save", str(out), "--json"],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_no_vulkan_messages(proc.stderr)
    summary = json.loads(proc.stdout)
    assert summary["outputs"][0]["shape"] == [1, 16, 96] and summary["load"]["mode"] == "staged"
    _, refs = fixture("tiny_llama")
    with np.load(out) as d:
        assert_close([d["output_0"]], refs)


def test_cli_lists_ops_and_refuses_unsupported_programs(tmp_path):
    from tests.unit.test_pte import unsupported_program

    run = lambda *a: subprocess.run([sys.executable, "-m", "vkgraph", "run", "--model", *a],  # noqa: E731
                                    capture_output=True, text=True, env=child_env(), timeout=300)
    bad = str(unsupported_program(tmp_path))
    listed = run(bad, "--list-ops")
    assert listed.returncode == 1
    assert "aten.relx.default" in listed.stdout and " NO" in listed.stdout
    refused = run(bad)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "(aten.relx.default): the op is not supported" in refused.stderr
    ok = run(str(PROGRAMS / "convnet.pte"), "--list-ops")
    assert ok.returncode == 0 and "aten::mean.out" in ok.stdout


@pytest.mark.parametrize("name", ["convnet", "tiny_llama", "quant_mlp"])
def test_bench_load_takes_a_program(device, name):
    """`vkgraph bench load --model X.pte`: every delegate's weights in one graph, loaded in the
    mode asked for, then checked against the program loaded on its own."""
    from vkgraph.tools.bench import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        staged = load_model(str(PROGRAMS / f"{name}.pte"), "staged")
        legacy = load_model(str(PROGRAMS / f"{name}.pte"), "legacy")
    with load(name, device) as prog:
        expect = prog.report.total_constant_nbytes
    for r in (staged, legacy):
        assert r.output_ok and r.max_abs_error < 1e-5
        assert r.report.total_constant_nbytes == expect
    assert (staged.report.mode, legacy.report.mode) == ("staged", "legacy") and legacy.report.submits == 1


def test_simulate_sees_the_program_load(device):
    """The simulator's nodes are the prepack nodes a real load of the program packs."""
    from vkgraph.tools.simulate import model_nodes
    from vkgraph.tools.bench import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nodes = model_nodes(str(PROGRAMS / "encoder.pte"))
        report = load_model(str(PROGRAMS / "encoder.pte"), "staged", verify=False).report
    assert len(nodes) == report.nodes and sum(n.src_nbytes for n in nodes) == report.total_constant_nbytes


def test_kv_cache_keeps_its_contents_between_runs(device):
    """kv_decoder (update_cache + custom_sdpa, fused into sdpa_with_kv_cache): the second call
    writes at position 4 and attends over the first call's keys too."""
    with np.load(PROGRAMS / "kv_decoder.npz") as d:
        calls = [([d[f"{p}input_0"], d[f"{p}input_1"]], [d[f"{p}output_0"]]) for p in ("", "call1.")]
    with load("kv_decoder", device) as prog:
        for inputs, refs in calls:
            assert_close(prog.run(*inputs), refs)
    with load("kv_decoder", device) as prog:  # a new load starts from empty caches
        inputs, refs = calls[1]
        fresh = prog.run(*inputs)[0]
        assert np.abs(fresh - refs[0]).max() > 1e-2  # without the first call's keys the answer differs


@pytest.mark.parametrize("gpu", ["this", "discrete"])
def test_page_aligned_weights_are_imported_in_place(device, tmp_path, monkeypatch, gpu):
    """Exported with segment_alignment=4096, identity-packed weights (biases, norms, KV caches)
    start on pages: their file pages become the tensors' device memory, nothing is staged for
    them. The KV caches are written in place on every run, and the file never changes. A
    discrete GPU gets copies in its own memory instead (it would read host pages across the bus
    on every dispatch), with the same results."""
    import hashlib
    import shutil

    if gpu == "discrete":
        monkeypatch.setattr(device.physical, "type", "discrete-gpu")

    for name in ("paged_mlp", "paged_kv_decoder"):
        path = tmp_path / f"{name}.pte"
        shutil.copy(PROGRAMS / f"{name}.pte", path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        with np.load(PROGRAMS / f"{name}.npz") as d:
            calls = [([d[k] for k in sorted(d.files) if k.startswith(f"{p}input_")],
                      [d[k] for k in sorted(d.files) if k.startswith(f"{p}output_")]) for p in ("", "call1.")
                     if f"{p}input_0" in d.files]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = load_program(path, GraphConfig(), device=device)
        with prog:
            in_place = [n for n, how in prog.report.tensor_paths.items() if how == "in-place"]
            assert prog.report.zero_copy_tensors == len(in_place)
            assert len(in_place) >= 2 if hit_path(device) == "zero-copy" else not in_place  # a discrete GPU: copies
            for inputs, refs in calls:
                assert_close(prog.run(*inputs), refs)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{name}: the program file changed"
    with load("mlp", device) as prog:  # ExecuTorch's default 128-byte alignment: packed as usual
        assert prog.report.zero_copy_tensors == 0


def test_tensors_asked_in_2d_textures_are_kept_in_buffers_and_said(device, monkeypatch):
    """vkgraph has no 2-D texture kernels: such tensors are computed in buffers, counted in the
    program's one storage warning, and the program runs as before."""
    import dataclasses

    from vkgraph.pte.reader import PteFile, VkValue

    read = PteFile.vkgraph

    def as_2d(self, delegate):
        info = read(self, delegate)
        info.values = [VkValue(v.kind, dataclasses.replace(v.value, storage="texture2d")) if v.kind == "tensor" and
                       v.value.storage == "texture3d" else v for v in info.values]
        return info

    monkeypatch.setattr(PteFile, "vkgraph", as_2d)
    inputs, refs = fixture("mlp")
    with pytest.warns(UserWarning, match=r"mlp.pte: 11 of 11 tensors that the program asks to hold in textures are in "
                                         r"buffers \(ops vkgraph runs on buffers only: aten.linear.default \(4\)"):
        prog = load_program(PROGRAMS / "mlp.pte", GraphConfig(), device=device)
    with prog:
        assert not any(getattr(t, "storage", "") == "texture3d" for g, _ in prog.graphs for t in g.values)
        assert_close(prog.run(*inputs), refs)
