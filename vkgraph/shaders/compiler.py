"""GLSL -> SPIR-V with ``glslangValidator``, through a content-addressed disk cache.

The cache key is sha256 of: the source, every file it includes (recursively, by content), the
defines, the target environment and the compiler's version string. Entries are written
atomically and checked (SPIR-V magic, word size) when read; a damaged entry is recompiled.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from ..errors import ShaderCompileError
from ..paths import GLSL_DIR, atomic_write, user_cache_dir

SPIRV_MAGIC = 0x07230203
COMPILE_TIMEOUT_S = 120
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_DEFINE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_versions: dict[str, str] = {}


def _is_spirv(data: bytes) -> bool:
    return len(data) >= 20 and len(data) % 4 == 0 and struct.unpack_from("<I", data)[0] == SPIRV_MAGIC


class SpirvCompiler:
    """Compiles compute shaders; ``hits``/``misses`` count cache outcomes.

    ``cache_dir=None`` uses ``<user cache dir>/spirv``; ``include_dirs`` are searched after the
    including file's own directory.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        *,
        include_dirs: tuple[str | Path, ...] = (GLSL_DIR,),
        glslang: str = "glslangValidator",
        target_env: str = "vulkan1.1",
    ):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else user_cache_dir() / "spirv"
        self.include_dirs = tuple(Path(d) for d in include_dirs)
        self.glslang = glslang
        self.target_env = target_env
        self.hits = 0
        self.misses = 0

    # --- public -----------------------------------------------------------------------------

    def compile_named(self, name: str, defines: Mapping[str, object] | None = None) -> bytes:
        """Compile ``glsl/<name>.glsl``."""
        path = GLSL_DIR / f"{name}.glsl"
        if not path.is_file():
            raise ShaderCompileError(name, f"no shader named {name!r} (looked for {path})")
        return self.compile_file(path, defines)

    def compile_file(self, path: str | Path, defines: Mapping[str, object] | None = None) -> bytes:
        path = Path(path)
        try:
            source = path.read_text()
        except OSError as exc:
            raise ShaderCompileError(str(path), f"cannot read shader source: {exc}") from None
        return self._compile(source, path.name, path.parent, defines or {})

    def compile_source(self, source: str, name: str = "inline.comp", defines: Mapping[str, object] | None = None) -> bytes:
        """Compile GLSL text (includes resolve against ``include_dirs``)."""
        return self._compile(source, name, None, defines or {})

    def cache_key(self, source: str, base_dir: Path | None, defines: Mapping[str, object]) -> str:
        h = hashlib.sha256()
        for part in (b"vkgraph-spirv-1", self.compiler_version().encode(), self.target_env.encode(), source.encode()):
            h.update(len(part).to_bytes(8, "little") + part)
        for include, content in self._includes(source, base_dir):
            h.update(include.encode() + b"\0" + hashlib.sha256(content).digest())
        for k, v in sorted(self._defines(defines)):
            h.update(f"-D{k}={v}\0".encode())
        return h.hexdigest()

    def compiler_version(self) -> str:
        exe = shutil.which(self.glslang)
        if exe is None:
            raise ShaderCompileError(
                "(compiler)", f"{self.glslang} not found on PATH; install the system package glslang-tools"
            )
        if exe not in _versions:
            out = self._run([exe, "--version"], "(compiler)")
            _versions[exe] = out.stdout.strip()
        return _versions[exe]

    # --- internals --------------------------------------------------------------------------

    @staticmethod
    def _defines(defines: Mapping[str, object]) -> list[tuple[str, str]]:
        out = []
        for k, v in defines.items():
            if not _DEFINE_NAME.match(k):
                raise ShaderCompileError("(defines)", f"invalid macro name {k!r}")
            value = ("1" if v else "0") if isinstance(v, bool) else str(v)
            if any(c.isspace() for c in value):
                raise ShaderCompileError("(defines)", f"macro {k} value {value!r} contains whitespace")
            out.append((k, value))
        return out

    def _resolve(self, include: str, base_dir: Path | None) -> Path | None:
        for d in ((base_dir,) if base_dir else ()) + self.include_dirs:
            p = d / include
            if p.is_file():
                return p
        return None

    def _includes(self, source: str, base_dir: Path | None) -> list[tuple[str, bytes]]:
        """Every include reachable from ``source``, in first-seen order, with its content."""
        seen: dict[str, bytes] = {}
        stack = [(source, base_dir)]
        while stack:
            text, where = stack.pop()
            for inc in _INCLUDE.findall(text):
                path = self._resolve(inc, where)
                key = str(path) if path else f"missing:{inc}"
                if key in seen:
                    continue
                seen[key] = path.read_bytes() if path else b""
                if path:
                    stack.append((seen[key].decode(errors="replace"), path.parent))
        return list(seen.items())

    def _run(self, cmd: list[str], shader: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ShaderCompileError(shader, f"{cmd[0]} did not finish in {COMPILE_TIMEOUT_S} s") from None
        except OSError as exc:
            raise ShaderCompileError(shader, f"cannot run {cmd[0]}: {exc}") from None

    def _compile(self, source: str, name: str, base_dir: Path | None, defines: Mapping[str, object]) -> bytes:
        key = self.cache_key(source, base_dir, defines)
        entry = self.cache_dir / key[:2] / f"{key}.spv"
        try:
            cached = entry.read_bytes()
        except OSError:
            cached = b""
        if _is_spirv(cached):
            self.hits += 1
            return cached
        self.misses += 1
        spirv = self._invoke(source, name, base_dir, defines)
        atomic_write(entry, spirv)
        return spirv

    def _invoke(self, source: str, name: str, base_dir: Path | None, defines: Mapping[str, object]) -> bytes:
        exe = shutil.which(self.glslang)
        assert exe is not None  # compiler_version() already checked
        with tempfile.TemporaryDirectory(prefix="vkgraph-glsl-") as tmp:
            src = Path(tmp) / Path(name).name
            src.write_text(source)
            out = Path(tmp) / "out.spv"
            cmd = [exe, "-V", "-S", "comp", "--target-env", self.target_env, "-o", str(out)]
            for d in ((base_dir,) if base_dir else ()) + self.include_dirs:
                cmd.append(f"-I{d}")
            cmd += [f"-D{k}={v}" for k, v in self._defines(defines)]
            cmd.append(str(src))
            proc = self._run(cmd, name)
            # glslangValidator prints its diagnostics on stdout; keep both streams.
            message = "\n".join(s for s in (proc.stdout.strip(), proc.stderr.strip()) if s)
            message = message.replace(str(src), name)
            if proc.returncode != 0:
                raise ShaderCompileError(name, message, proc.returncode)
            spirv = out.read_bytes() if out.is_file() else b""
            if not _is_spirv(spirv):
                raise ShaderCompileError(name, f"{self.glslang} exited 0 but wrote no valid SPIR-V\n{message}")
            return spirv


_default: SpirvCompiler | None = None


def default_compiler() -> SpirvCompiler:
    """The process-wide compiler using the user cache directory."""
    global _default
    if _default is None:
        _default = SpirvCompiler()
    return _default

