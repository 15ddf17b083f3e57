"""A non-editable install works outside the checkout: the wheel carries every module, shader,
config and profile, and `vkgraph run` from a fresh venv loads and checks a model."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = {"glsl": "vkgraph/glsl", "configs": "vkgraph/configs", "profiles": "vkgraph/profiles"}

pytestmark = pytest.mark.slow


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built from a copy of the sources (a build/ left in the checkout is not used)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src)
    for name in ("vkgraph", *DATA):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", src, "-w", out])
    (path,) = out.glob("vkgraph-*.whl")
    return path


def test_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(p.relative_to(REPO)) for p in (REPO / "vkgraph").rglob("*.py")}
    for src, dst in DATA.items():
        expected |= {f"{dst}/{p.name}" for p in (REPO / src).iterdir() if p.is_file()}
    assert expected <= names, sorted(expected - names)


def test_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    if os.environ.get("VKGRAPH_REQUIRE_DEVICE") != "1":
        from vkgraph.errors import DeviceNotFoundError
        from vkgraph.runtime import Device

        try:
            Device(validation=False).destroy()
        except DeviceNotFoundError as exc:
            pytest.skip(f"no Vulkan device: {exc}")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["VKGRAPH_CACHE_DIR"] = str(tmp_path / "cache")
    where = run([venv / "bin" / "python", "-c", "import vkgraph.paths as p; print(p.PACKAGE_DIR, p.GLSL_DIR)"],
                cwd=tmp_path, env=env).split()
    assert all(Path(w).is_relative_to(venv) for w in where), where  # the installed copy, not the checkout
    out = run([venv / "bin" / "vkgraph", "run", "--model", "synthetic:64"], cwd=tmp_path, env=env)
    assert "forward pass vs numpy" in out and "-> OK" in out, out
    program = REPO / "tests" / "data" / "programs" / "mlp.pte"  # the .pte readers are in the wheel too
    out = run([venv / "bin" / "vkgraph", "run", "--model", program, "--inputs", program.with_suffix(".npz")],
              cwd=tmp_path, env=env)
    assert "output_0: (4, 10) float32" in out, out
