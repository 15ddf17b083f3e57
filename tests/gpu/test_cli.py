import json
import os

import pytest

from vkgraph import cli
from vkgraph.config import load_config
from vkgraph.paths import CONFIG_DIR

from .conftest import hit_path


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("mode", ["legacy", "staged", "reduce-peak"])
def test_bench_load_json(device, cache_dir, capsys, monkeypatch, mode):
    monkeypatch.setenv("VKGRAPH_PREPACK_HOST_PACKING", "never")  # staging and packing shaders on every device
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", mode, "--json",
                     "--config", str(CONFIG_DIR / "low-memory.toml")]) == 0
    out = json.loads(capsys.readouterr().out)
    keys = ["model", "device", "mode", "total_constant_nbytes", "load_s", "cpu_encode_s", "populate_s", "fence_wait_s", "gpu_s",
            "submits",
            "peak_staging_nbytes", "staging_allocated_nbytes", "peak_device_nbytes", "peak_rss_delta_nbytes", "packing_dispatches", "overlap", "output_ok",
            "rss_anon_delta_nbytes", "cache_hits", "cache_misses", "zero_copy_tensors", "cache_save_s"]
    assert list(out) == keys
    assert out["mode"] == mode and out["output_ok"] is True and out["model"] == "synthetic:4"
    assert out["device"] == device.name
    assert out["submits"] == 1 if mode == "legacy" else out["submits"] > 1
    assert out["peak_device_nbytes"] >= out["total_constant_nbytes"] + out["staging_allocated_nbytes"] > 0
    assert 0 < out["peak_staging_nbytes"] <= out["staging_allocated_nbytes"]
    assert out["packing_dispatches"] > 0 and out["load_s"] > 0
    assert 0 <= out["populate_s"] <= out["cpu_encode_s"]


def test_bench_load_copy_floor_copies_the_constants_a_load_packs(device, cache_dir, capsys):
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--json"]) == 0
    load = json.loads(capsys.readouterr().out)
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", "copy-floor", "--json"]) == 0
    floor = json.loads(capsys.readouterr().out)
    assert floor["mode"] == "copy-floor" and floor["model"] == "synthetic:4" and floor["load_s"] > 0
    assert floor["total_constant_nbytes"] == load["total_constant_nbytes"]


@pytest.mark.parametrize("mode", ["legacy", "staged"])
def test_bench_load_profile_times_every_packer(device, cache_dir, capsys, monkeypatch, mode):
    """--profile: GPU time per packer from a timestamp after every prepack node with GPU work;
    every such node is counted once, under its packer (nodes the CPU writes straight into device
    memory do none). The packing shaders on every device (prepack.host_packing from the
    environment: SwiftShader's default has the CPU pack these weights)."""
    monkeypatch.setenv("VKGRAPH_PREPACK_HOST_PACKING", "never")
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", mode, "--json", "--profile"]) == 0
    out = json.loads(capsys.readouterr().out)
    from vkgraph.graph import ComputeGraph
    from vkgraph.models.registry import open_model

    with open_model("synthetic:4") as m, ComputeGraph(load_config(), device=device) as g:
        m.build(g)
        want = {}
        for node in g.prepack_nodes:
            if not node.direct:
                want[node.packer.name] = want.get(node.packer.name, 0) + 1
    assert want  # the linear weights are packed by a shader
    assert {k: n for k, (sec, n) in out["packer_gpu_s"].items()} == want
    assert all(sec >= 0 for sec, _ in out["packer_gpu_s"].values())
    assert sum(sec for sec, _ in out["packer_gpu_s"].values()) <= out["gpu_s"] * 1.01 + 1e-6
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", mode, "--profile"]) == 0
    text = capsys.readouterr().out
    assert "GPU time per packer" in text and "| linear_4x4 |" in text


@pytest.mark.parametrize("check", ["every", "last"])
def test_bench_load_several_loads(device, cache_dir, capsys, check):
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", "staged", "--json", "--loads", "3",
                     "--check", check]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["load_index"] for x in lines] == [0, 1, 2]
    assert [x["output_ok"] for x in lines] == ([True] * 3 if check == "every" else [None, None, True])
    assert len({x["staging_allocated_nbytes"] for x in lines}) == 1 and all(x["load_s"] > 0 for x in lines)


def test_run_prints_the_report_and_writes_a_trace(device, cache_dir, capsys, tmp_path):
    trace = tmp_path / "trace.json"
    assert cli.main(["run", "--model", "synthetic:4", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "submits" in out and "peak staging" in out and "-> OK" in out
    assert json.loads(trace.read_text())["traceEvents"]


def test_unknown_model_and_bad_config_are_clear(device, cache_dir, capsys, tmp_path):
    assert cli.main(["run", "--model", "gpt5"]) == 1
    assert "unknown model 'gpt5'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[prepack]\nthreshold_nbytes = -4\n")
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--config", str(bad)]) == 1
    assert f"{bad}: prepack.threshold_nbytes: must be >= 0, got -4" in capsys.readouterr().err


def test_bench_cache_modes_and_cache_commands(device, cache_dir, capsys, monkeypatch):
    monkeypatch.setenv("VKGRAPH_PREPACK_HOST_PACKING", "never")  # a cold load packs on the GPU everywhere
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", "warm-cache", "--json"]) == 1
    assert "run --mode cold-cache first" in capsys.readouterr().err
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", "cold-cache", "--json"]) == 0
    cold = json.loads(capsys.readouterr().out)
    assert cold["cache_misses"] > 0 and cold["cache_hits"] == 0 and cold["packing_dispatches"] > 0
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--mode", "warm-cache", "--json"]) == 0
    warm = json.loads(capsys.readouterr().out)
    assert warm["mode"] == "warm-cache" and warm["output_ok"] is True
    assert warm["cache_hits"] == cold["cache_misses"] and warm["packing_dispatches"] == 0
    assert warm["zero_copy_tensors"] == (warm["cache_hits"] if hit_path(device) == "zero-copy" else 0)
    path = cache_dir / "packed" / "synthetic_4.vkpw"
    assert cli.main(["cache", "info", str(path)]) == 0
    assert f"{warm['cache_hits']} entries" in capsys.readouterr().out
    assert cli.main(["cache", "verify", str(path)]) == 0
    raw = bytearray(path.read_bytes())
    raw[4096 + 100] ^= 0xFF  # inside the first region
    path.write_bytes(bytes(raw))
    assert cli.main(["cache", "verify", str(path)]) == 1
    assert "1 with a checksum mismatch" in capsys.readouterr().out
    assert cli.main(["cache", "clear", str(path)]) == 0 and not path.exists()
    assert cli.main(["cache", "info", str(path)]) == 1
    assert "cannot open" in capsys.readouterr().err


def test_bench_load_plot(device, cache_dir, tmp_path, capsys):
    png = tmp_path / "load.png"
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert cli.main(["simulate", "--model", "synthetic:4", "--plot", str(tmp_path / "sim.png")]) == 0
    assert (tmp_path / "sim.png").read_bytes()[:4] == b"\x89PNG"


def test_device_option_picks_the_device_for_the_command_only(device, cache_dir, capsys, monkeypatch):
    monkeypatch.delenv("VKGRAPH_DEVICE", raising=False)
    renderer = device.physical.renderer
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--json", "--device", renderer]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == device.name
    assert "VKGRAPH_DEVICE" not in os.environ  # restored after the command
    assert cli.main(["info", "--json", "--device", renderer]) == 0
    selected = [d for d in json.loads(capsys.readouterr().out)["devices"] if d["selected"]]
    assert [d["name"] for d in selected] == [device.name]
    assert cli.main(["bench", "load", "--model", "synthetic:4", "--device", "no-such-gpu"]) == 1
    assert "no Vulkan device matches 'no-such-gpu'; available: " in capsys.readouterr().err


def test_validate_warns_of_a_profile_measured_under_another_name(device, tmp_path, capsys):
    """A profile of the device's renderer but another device name (lavapipe at another SIMD
    width, say), or measured with another host processor, is used, with a warning naming both: a
    CPU renderer's rates are its host's."""
    import argparse
    import re

    from vkgraph.cli.simulate import _validate_profile
    from vkgraph.runtime.instance import host_cpu
    from vkgraph.tools.simulate import load_profile, shipped_profile

    host = host_cpu() if device.is_cpu else ""
    shipped = shipped_profile(device.renderer, device.name, host)
    if shipped is None:
        pytest.skip(f"no profile is shipped for {device.renderer}")
    text = shipped.read_text()
    other = tmp_path / "other.toml"
    other.write_text(text.replace('name = "', 'name = "elsewhere: ', 1))
    assert _validate_profile(argparse.Namespace(device=None, profile=str(other))) == str(other)
    err = capsys.readouterr().err
    assert "warning:" in err and "elsewhere: " in err and repr(device.name) in err
    # the device's own profile: the one of its name (and this host's processor) where one is
    # shipped, else its renderer's
    assert _validate_profile(argparse.Namespace(device=None, profile=None)) == shipped.stem
    own = load_profile(shipped)
    elsewhere = bool(own.host_cpu and host and own.host_cpu != host)
    assert ("warning:" in capsys.readouterr().err) == (own.name != device.name or elsewhere)
    if host:  # this device's name, another processor
        cpu = tmp_path / "cpu.toml"
        mine = re.sub(r'^name = ".*"$', f'name = "{device.name}"', re.sub(r"^host_cpu = .*\n", "", text, flags=re.M),
                      count=1, flags=re.M)
        cpu.write_text(mine.replace("[device]\n", '[device]\nhost_cpu = "Elsewhere family 1 model 2"\n', 1))
        assert _validate_profile(argparse.Namespace(device=None, profile=str(cpu))) == str(cpu)
        err = capsys.readouterr().err
        assert "warning:" in err and "Elsewhere family 1 model 2" in err and host in err


def test_validate_without_a_profile_for_the_device_says_to_calibrate_one(device, tmp_path, monkeypatch, capsys):
    """A device none is shipped for (NVIDIA's driver, say) gets a clear error naming it and the
    way to measure its profile, not a missing file named after its driver."""
    monkeypatch.setattr("vkgraph.tools.simulate.PROFILE_DIR", tmp_path)  # as if none were shipped for this device
    for extra in ([], ["--decode"]):
        assert cli.main(["simulate", "--validate", "--models", "synthetic:4", *extra]) == 1
        err = capsys.readouterr().err
        assert f"--profile: no profile is shipped for {device.name!r} (renderer {device.renderer!r})" in err
        assert "vkgraph simulate --calibrate --out <file>" in err


def test_validate_refuses_a_profile_of_another_device(device, capsys):
    """--validate prices loads with the profile of the device it measures (by default
    profiles/<renderer>.toml); one calibrated elsewhere is refused before anything is measured."""
    other = "swiftshader" if device.renderer == "lavapipe" else "lavapipe"
    for extra in ([], ["--decode"]):
        assert cli.main(["simulate", "--validate", "--profile", other, "--models", "synthetic:4", *extra]) == 1
        err = capsys.readouterr().err
        assert f"{other}: [device]: the profile is of" in err and repr(device.name) in err
