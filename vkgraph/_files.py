"""Where vkgraph keeps its caches, and atomic file writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENV_CACHE_DIR = "VKGRAPH_CACHE_DIR"


def user_cache_dir() -> Path:
    """``$VKGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/vkgraph``, else ``~/.cache/vkgraph``."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vkgraph"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never
    a partial write: a temporary file in the same directory, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
