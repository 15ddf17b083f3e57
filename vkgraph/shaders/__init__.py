"""GLSL -> SPIR-V: glslangValidator via subprocess, with a content-hashed disk cache."""

from .compiler import SpirvCompiler, default_compiler

__all__ = ["SpirvCompiler", "default_compiler"]
