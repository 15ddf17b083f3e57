"""Where vkgraph's files are: its package data (shaders, configs, simulator profiles), the user
cache directory, and atomic file writes."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ENV_CACHE_DIR = "VKGRAPH_CACHE_DIR"


def _data_dir(name: str) -> Path:
    """``vkgraph/<name>`` in an installed wheel, else ``<checkout>/<name>``: the repository keeps
    glsl/, configs/ and profiles/ at its top level, and pyproject.toml maps them into the package
    when a wheel is built (an editable install reads the checkout's)."""
    installed, checkout = PACKAGE_DIR / name, PACKAGE_DIR.parent / name
    return installed if installed.is_dir() or not checkout.is_dir() else checkout


GLSL_DIR = _data_dir("glsl")  # one shader per kernel, and shared headers
CONFIG_DIR = _data_dir("configs")  # default.toml (every key and its default) and starting points
PROFILE_DIR = _data_dir("profiles")  # simulator profiles
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"


#: Vulkan ICDs vkgraph installs itself (``make install``: SwiftShader in the virtual environment),
#: by renderer name. The loader sees them next to the system's ICDs.
BUNDLED_ICDS = {"swiftshader": Path(sys.prefix) / "swiftshader" / "vk_swiftshader_icd.json"}


def bundled_icds() -> dict[str, Path]:
    """The bundled ICDs that are installed, by renderer name."""
    return {name: path for name, path in BUNDLED_ICDS.items() if path.is_file()}


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
