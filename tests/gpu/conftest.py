"""GPU test fixtures: one validated device per session; every test fails on any validation
warning or error, and on any Vulkan object it left alive or never destroyed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vkgraph.errors import DeviceNotFoundError
from vkgraph.runtime import Device, collected_objects, debug_messages, live_objects, reported_messages


@pytest.fixture(scope="session", autouse=True)
def validation_everywhere():
    """Every device the GPU suite makes has the validation layer on: the session's, those the CLI
    opens in this process (configs read VKGRAPH_VALIDATION), and those of child processes, which
    inherit it (and VKGRAPH_SYNC_VALIDATION under `make test-validation`) and print what the
    layer reports on stderr: check it with :func:`assert_no_vulkan_messages`."""
    before = os.environ.get("VKGRAPH_VALIDATION")
    os.environ["VKGRAPH_VALIDATION"] = "1"
    yield
    if before is None:
        del os.environ["VKGRAPH_VALIDATION"]
    else:
        os.environ["VKGRAPH_VALIDATION"] = before


def child_env() -> dict[str, str]:
    """The environment of a child Python that imports this checkout's vkgraph (ahead of what
    PYTHONPATH already holds: an install may rely on it for the dependencies)."""
    repo = str(Path(__file__).resolve().parents[2])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))


def hit_path(device) -> str:
    """How a packed-cache hit or a page-aligned program weight gets its memory on ``device``:
    "zero-copy" (the file's pages imported) where its memory is the host's and it imports host
    memory (lavapipe, SwiftShader), else "copy" (a discrete GPU reads its own memory)."""
    return "zero-copy" if device.unified_memory and device.has_external_memory_host else "copy"


def assert_no_vulkan_messages(stderr: str, what: str = "child process") -> None:
    reported = reported_messages(stderr)
    assert not reported, f"{what}: the validation layer or loader reported:\n" + "\n".join(reported[:20])


@pytest.fixture(scope="session")
def device():
    """The device under test (``$VKGRAPH_DEVICE`` or the first one), validation layer on.

    Skips only when there is no Vulkan device at all, unless ``VKGRAPH_REQUIRE_DEVICE=1``
    (set by ``make test``), which turns that into a failure.
    """
    try:
        dev = Device(validation=True)
    except DeviceNotFoundError as exc:
        if os.environ.get("VKGRAPH_REQUIRE_DEVICE") == "1":
            pytest.fail(f"VKGRAPH_REQUIRE_DEVICE=1 but {exc}")
        pytest.skip(f"no Vulkan device: {exc}")
    yield dev
    dev.destroy()


def _grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}


@pytest.fixture(autouse=True)
def vulkan_hygiene(device):
    start = len(debug_messages())
    live_before, collected_before = live_objects(), collected_objects()
    yield
    messages = [m for m in debug_messages()[start:] if m.severity in ("error", "warning")]
    leaked = _grown(live_before, live_objects())
    collected = _grown(collected_before, collected_objects())
    problems = [f"validation: {m}" for m in messages]
    if leaked:
        problems.append(f"Vulkan objects still alive after the test: {leaked}")
    if collected:
        problems.append(f"Vulkan objects never destroyed (freed by the garbage collector): {collected}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def compiler(tmp_path_factory):
    """A SPIR-V compiler with a cache of its own (the user's cache stays untouched)."""
    from vkgraph.shaders import SpirvCompiler

    return SpirvCompiler(tmp_path_factory.mktemp("spirv-cache"))
