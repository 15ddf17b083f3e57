"""Compute pipelines of a graph: one per (shader, binding types, push-constant size,
specialization constants, defines), created through the device's VkPipelineCache file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..runtime import (
    ComputePipeline,
    DescriptorSetLayout,
    DescriptorType,
    Device,
    PipelineCache,
    PipelineLayout,
    ShaderModule,
)
from ..runtime.pipeline import default_cache_path
from ..shaders import SpirvCompiler


def kernel_key(shader: str, types: Sequence[DescriptorType], push_nbytes: int,
               spec: Mapping[int, Any], defines: Mapping[str, object]) -> tuple:
    """What makes a pipeline: dispatches with the same key share one."""
    return (shader, tuple(types), push_nbytes, tuple(sorted(spec.items())), tuple(sorted(defines.items())))


@dataclass
class Kernel:
    """A compute pipeline and its layouts, shared by every node that uses the same shader."""

    set_layout: DescriptorSetLayout
    layout: PipelineLayout
    module: ShaderModule
    pipeline: ComputePipeline


class KernelCache:
    """The pipelines one graph uses. ``pipeline_cache_path`` is ``cache.pipeline_cache_path``;
    "" means the device's VkPipelineCache (``Device.pipeline_cache``), saved to one file per
    device and driver in the user cache directory."""

    def __init__(self, device: Device, compiler: SpirvCompiler, pipeline_cache_path: str = ""):
        self.device = device
        self.compiler = compiler
        self._path = pipeline_cache_path
        self._kernels: dict[tuple, Kernel] = {}
        self._pipeline_cache: PipelineCache | None = None
        self._pipeline_cache_data = b""
        self._shader_hashes: dict[tuple, str] = {}

    def get(self, shader: str, bindings: int | Sequence[DescriptorType], push_nbytes: int,
            spec: Mapping[int, Any] | None = None, defines: Mapping[str, object] | None = None) -> Kernel:
        """The pipeline for ``shader`` with these binding types (an int: that many storage
        buffers), push-constant size, specialization constants and defines; made once."""
        spec = dict(spec or {})
        defines = dict(defines or {})
        types = (DescriptorType.STORAGE_BUFFER,) * bindings if isinstance(bindings, int) else tuple(bindings)
        key = kernel_key(shader, types, push_nbytes, spec, defines)
        k = self._kernels.get(key)
        if k is None:
            spirv = self.compiler.compile_named(shader, defines)
            set_layout = DescriptorSetLayout(self.device, list(types))
            layout = PipelineLayout(self.device, [set_layout], push_nbytes)
            module = ShaderModule(self.device, spirv, shader)
            pipeline = ComputePipeline(self.device, layout, module, spec, cache=self._cache())
            k = self._kernels[key] = Kernel(set_layout, layout, module, pipeline)
        return k

    def shader_hash(self, shader: str, defines: Mapping[str, object]) -> str:
        """A short hash of the SPIR-V of ``shader`` with ``defines`` (packed-weight cache keys)."""
        key = (shader, tuple(sorted(defines.items())))
        if key not in self._shader_hashes:
            spirv = self.compiler.compile_named(shader, defines)
            self._shader_hashes[key] = hashlib.sha256(spirv).hexdigest()[:16]
        return self._shader_hashes[key]

    def pipeline_cache_path(self) -> Path:
        """The configured file, else one file per device/driver in the cache directory."""
        return Path(self._path) if self._path else default_cache_path(self.device)

    def _cache(self) -> PipelineCache:
        """The VkPipelineCache every pipeline goes through: the device's (``Device.pipeline_cache``,
        shared by its graphs), or one loaded from the configured file on first use."""
        if self._pipeline_cache is None:
            self._pipeline_cache = (PipelineCache.load(self.device, self._path) if self._path
                                    else self.device.pipeline_cache)
            self._pipeline_cache_data = self._pipeline_cache.data()
        return self._pipeline_cache

    def save(self) -> None:
        """Write the pipeline cache when it gained pipelines (for the next process)."""
        if self._pipeline_cache is not None:
            data = self._pipeline_cache.data()
            if data != self._pipeline_cache_data:
                self._pipeline_cache.save(self.pipeline_cache_path())
                self._pipeline_cache_data = data

    def destroy(self) -> None:
        """Destroy every pipeline; save the pipeline cache first (an unwritable cache directory
        does not break teardown)."""
        for k in self._kernels.values():
            for obj in (k.pipeline, k.module, k.layout, k.set_layout):
                obj.destroy()
        self._kernels.clear()
        if self._pipeline_cache is not None:
            if self.device.alive:
                try:
                    self.save()
                except OSError:
                    pass
            if self._path:  # the device's own lives as long as the device
                self._pipeline_cache.destroy()
            self._pipeline_cache = None
