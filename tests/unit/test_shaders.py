import shutil
import struct
import subprocess

import pytest

from vkgraph.errors import ShaderCompileError
from vkgraph.paths import GLSL_DIR
from vkgraph.shaders import SpirvCompiler

pytestmark = pytest.mark.skipif(shutil.which("glslangValidator") is None, reason="glslang-tools not installed")

GOOD = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float v[]; };
void main() { v[0] = SCALE; }
"""

INCLUDING = """
#version 450
#extension GL_GOOGLE_include_directive : require
#include "consts.h"
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float v[]; };
void main() { v[0] = K; }
"""


def is_spirv(data):
    return len(data) % 4 == 0 and struct.unpack_from("<I", data)[0] == 0x07230203


@pytest.fixture
def compiler(tmp_path):
    return SpirvCompiler(tmp_path / "cache", include_dirs=(tmp_path / "inc", GLSL_DIR))


def test_every_repo_shader_compiles(compiler):
    shaders = sorted(GLSL_DIR.glob("*.glsl"))
    assert shaders
    for path in shaders:
        assert is_spirv(compiler.compile_file(path)), path


def test_second_compile_hits_the_cache_without_running_glslang(compiler, monkeypatch):
    first = compiler.compile_source(GOOD, defines={"SCALE": 2.0})
    assert is_spirv(first) and (compiler.hits, compiler.misses) == (0, 1)

    def no_subprocess(*a, **k):
        raise AssertionError("glslangValidator ran on a cache hit")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert compiler.compile_source(GOOD, defines={"SCALE": 2.0}) == first
    assert (compiler.hits, compiler.misses) == (1, 1)
    # A fresh compiler over the same directory (a new process) hits too.
    again = SpirvCompiler(compiler.cache_dir, include_dirs=compiler.include_dirs)
    assert again.compile_source(GOOD, defines={"SCALE": 2.0}) == first and again.hits == 1
    assert not list(compiler.cache_dir.rglob("*.tmp"))


def test_defines_change_the_key_and_the_code(compiler):
    a = compiler.compile_source(GOOD, defines={"SCALE": 2.0})
    b = compiler.compile_source(GOOD, defines={"SCALE": 3.0})
    assert a != b and compiler.misses == 2


def test_changed_include_is_a_miss(compiler, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "consts.h").write_text("#define K 1.0\n")
    a = compiler.compile_source(INCLUDING)
    (inc / "consts.h").write_text("#define K 2.0\n")
    b = compiler.compile_source(INCLUDING)
    assert a != b and (compiler.hits, compiler.misses) == (0, 2)
    assert compiler.compile_source(INCLUDING) == b and compiler.hits == 1


def test_broken_shader_raises_with_glslang_message(compiler):
    src = GOOD.replace("v[0] = SCALE;", "v[0] = undefined_thing;")
    with pytest.raises(ShaderCompileError) as err:
        compiler.compile_source(src, name="broken.comp", defines={"SCALE": 1.0})
    e = err.value
    assert e.shader == "broken.comp" and e.returncode != 0
    assert "undefined_thing" in e.stderr and "ERROR" in e.stderr
    assert "broken.comp" in str(e)
    assert not list(compiler.cache_dir.rglob("*.spv"))  # nothing cached


def test_corrupt_cache_entry_is_recompiled(compiler):
    good = compiler.compile_source(GOOD, defines={"SCALE": 1.0})
    (entry,) = compiler.cache_dir.rglob("*.spv")
    entry.write_bytes(b"\0" * 7)
    assert compiler.compile_source(GOOD, defines={"SCALE": 1.0}) == good
    assert compiler.misses == 2 and entry.read_bytes() == good


def test_missing_compiler_names_the_package(tmp_path):
    c = SpirvCompiler(tmp_path, glslang="no-such-glslangValidator")
    with pytest.raises(ShaderCompileError, match="install the system package glslang-tools"):
        c.compile_source(GOOD)


def test_unknown_shader_name(compiler):
    with pytest.raises(ShaderCompileError, match="no shader named 'nope'"):
        compiler.compile_named("nope")


def test_bad_define_name(compiler):
    with pytest.raises(ShaderCompileError, match="invalid macro name"):
        compiler.compile_source(GOOD, defines={"A B": 1})
