"""GLSL -> SPIR-V: glslangValidator via subprocess, with a content-hashed disk cache."""

from .compiler import GLSL_DIR, SpirvCompiler, compile_shader, default_compiler

__all__ = ["GLSL_DIR", "SpirvCompiler", "compile_shader", "default_compiler"]
