"""Two processes loading the same model with the same packed-weight cache at once."""

import json
import subprocess
import sys

import pytest

from .conftest import assert_no_vulkan_messages, child_env

SCRIPT = r"""
import json, sys
import numpy as np
from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph

rng = np.random.default_rng(0)
ws = [rng.standard_normal((64, 128)).astype(np.float32) for _ in range(12)]
x = rng.standard_normal((2, 128)).astype(np.float32)
cfg = GraphConfig().replace(cache__packed_weights_path=sys.argv[1])
with ComputeGraph(cfg) as g:
    xin = g.add_input(x.shape, np.float32, "x")
    h = xin
    outs = [ops.linear(g, xin, g.add_tensorref(w, f"w{i}")) for i, w in enumerate(ws)]
    for i, o in enumerate(outs):
        g.set_output(o, f"y{i}")
    r = g.run_prepack()
    got = g.execute({"x": x})
    ok = all(np.allclose(got[f"y{i}"], x @ w.T, rtol=1e-5, atol=1e-4) for i, w in enumerate(ws))
print(json.dumps({"ok": ok, "hits": r.cache_hits, "misses": r.cache_misses}))
"""


@pytest.mark.slow
def test_two_processes_at_once(device, tmp_path):
    path = tmp_path / "shared.vkpw"
    env = child_env()
    for round_ in range(2):  # first both cold (racing to write), then both warm
        procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            assert_no_vulkan_messages(err)
            results.append(json.loads(out.strip().splitlines()[-1]))
        assert all(r["ok"] for r in results), results
        if round_ == 1:
            assert all(r["hits"] == 12 and r["misses"] == 0 for r in results), results
    from vkgraph.cache.format import PackedWeightFile

    f = PackedWeightFile(path)
    assert len(f.entries) == 12 and f.verify() == []
    f.close()


@pytest.mark.slow
def test_file_size_stable_across_twenty_processes(device, tmp_path):
    path = tmp_path / "cycles.vkpw"
    env = child_env()
    # 20 loads, each in a fresh process, run back to back by one driver process.
    driver = (
        "import subprocess, sys, os, json\n"
        f"script = {SCRIPT!r}\n"
        "sizes = []\n"
        "for _ in range(20):\n"
        "    out = subprocess.run([sys.executable, '-c', script, sys.argv[1]], capture_output=True, text=True, check=True)\n"
        "    sys.stderr.write(out.stderr)\n"
        "    r = json.loads(out.stdout.strip().splitlines()[-1])\n"
        "    assert r['ok'], r\n"
        "    sizes.append(os.path.getsize(sys.argv[1]))\n"
        "print(json.dumps(sizes))\n"
    )
    out = subprocess.run([sys.executable, "-c", driver, str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert_no_vulkan_messages(out.stderr, "one of 20 processes")
    sizes = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(sizes) == 20 and len(set(sizes)) == 1, sizes
