"""A process killed with SIGKILL while it writes the packed-weight cache leaves a file that the
next load either uses (complete) or rejects and rebuilds; results are always correct."""

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from vkgraph.cache.format import PackedWeightFile

from .conftest import assert_no_vulkan_messages, child_env
from .test_cache_processes import SCRIPT

# Runs before SCRIPT in the child: dies by SIGKILL at the kill point given as argv[2].
KILL_HOOK = r"""
import os, signal, sys
import vkgraph.cache.format as fmt

point = sys.argv.pop(2)
def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point.startswith("bytes:"):  # after this many bytes of the temporary file are written
    limit, written, real_open = int(point[6:]), [0], open

    class Dying:
        def __init__(self, f):
            self.f = f
        def write(self, data):
            data = bytes(data)
            if written[0] + len(data) >= limit:
                self.f.write(data[: limit - written[0]])
                self.f.flush()
                die()
            written[0] += len(data)
            return self.f.write(data)
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    fmt.open = lambda *a, **k: Dying(real_open(*a, **k))
elif point == "fsync":
    os.fsync = lambda fd: die()
elif point == "replace":
    os.replace = lambda a, b: die()
elif point == "after-replace":
    real_replace = os.replace
    os.replace = lambda a, b: (real_replace(a, b), die())
"""
SEEDED = SCRIPT.replace("np.random.default_rng(0)", "np.random.default_rng(int(sys.argv[2]))")
KILL_POINTS = int(os.environ.get("VKGRAPH_KILL_POINTS", "8"))


def run(path, seed, kill=None):
    env = child_env()
    code = KILL_HOOK + SEEDED if kill else SEEDED
    args = [sys.executable, "-c", code, str(path)] + ([kill] if kill else []) + [str(seed)]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert_no_vulkan_messages(p.stderr)
    if kill:
        assert p.returncode == -signal.SIGKILL, (kill, p.returncode, p.stderr[-2000:])
        return None
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def entries(path):
    f = PackedWeightFile(path)
    try:
        assert f.verify() == []
        return len(f.entries)
    finally:
        f.close()


@pytest.mark.slow
def test_sigkill_while_writing_the_cache(device, tmp_path):
    path = tmp_path / "model.vkpw"
    run(path, 0)
    size = path.stat().st_size  # a complete 12-entry file: the range of byte kill points
    rnd = random.Random(1234)
    points = ["fsync", "replace", "after-replace", "bytes:0"]
    points += [f"bytes:{rnd.randrange(1, size)}" for _ in range(max(0, KILL_POINTS - len(points)))]
    for i, point in enumerate(points[:KILL_POINTS]):
        rewrite = i % 2 == 1  # the killed process rewrites a complete file, or writes the first one
        path.unlink(missing_ok=True)
        if rewrite:
            run(path, 0)  # 12 entries
        run(path, 1, kill=point)  # seed 1: 12 new weights, so the file is (re)written, and it dies
        if path.exists():  # the old complete file, or the new complete one: never a torn one
            assert entries(path) in ({12, 24} if rewrite else {12}), point
        else:
            assert not rewrite and point != "after-replace", point
        r = run(path, 1)
        assert r["ok"], point
        # used when the killed writer got its file in place, else packed and the file rebuilt
        assert (r["hits"], r["misses"]) == ((12, 0) if point == "after-replace" else (0, 12)), (point, r)
        assert entries(path) == (24 if rewrite else 12), point
        if rewrite:
            assert run(path, 0) == {"ok": True, "hits": 12, "misses": 0}, point  # older entries survived
        assert not list(tmp_path.glob(".model.vkpw.*.tmp")), point  # the dead writer's file is gone
