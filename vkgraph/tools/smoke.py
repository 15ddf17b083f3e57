"""A compute smoke test: ``y = alpha * x + beta * y`` on the device, checked against numpy."""

from __future__ import annotations

import struct
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from ..runtime import (
    Buffer,
    ComputePipeline,
    DescriptorPool,
    DescriptorSet,
    DescriptorSetLayout,
    DescriptorType,
    Device,
    MemoryKind,
    OneShot,
    PipelineCache,
    PipelineLayout,
    ShaderModule,
    Stage,
    TimestampQueryPool,
)
from ..shaders import SpirvCompiler, default_compiler


def storage_kernel(stack: ExitStack, device: Device, spirv: bytes, name: str, buffers: list[Buffer],
                   push_nbytes: int, spec: dict[int, int | float | bool],
                   cache: PipelineCache | None = None) -> tuple[PipelineLayout, DescriptorSet, ComputePipeline]:
    """A compute pipeline whose bindings 0..n-1 are ``buffers`` as storage buffers, and its bound
    descriptor set: (pipeline layout, set, pipeline), every object owned by ``stack``."""
    own = stack.enter_context
    set_layout = own(DescriptorSetLayout(device, [DescriptorType.STORAGE_BUFFER] * len(buffers)))
    pool = own(DescriptorPool.for_layouts(device, [set_layout]))
    dset = pool.allocate(set_layout)
    dset.bind_buffers(dict(enumerate(buffers)))
    layout = own(PipelineLayout(device, [set_layout], push_constant_nbytes=push_nbytes))
    module = own(ShaderModule(device, spirv, name))
    return layout, dset, own(ComputePipeline(device, layout, module, spec, cache=cache))


@dataclass
class AxpbyResult:
    y: np.ndarray
    gpu_ns: float | None  # dispatch time from timestamp queries, when the device has them


def axpby(
    device: Device,
    x: np.ndarray,
    y: np.ndarray,
    alpha: float,
    beta: float = 1.0,
    *,
    local_size: int = 64,
    compiler: SpirvCompiler | None = None,
    pipeline_cache: PipelineCache | None = None,
) -> AxpbyResult:
    """Run ``glsl/axpby.glsl`` once on fresh buffers; every object it makes is destroyed."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    y = np.ascontiguousarray(y, dtype=np.float32).reshape(-1)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"x and y must be non-empty and the same size, got {x.size} and {y.size}")
    n = x.size
    spirv = (compiler or default_compiler()).compile_named("axpby")
    with ExitStack() as stack:
        own = stack.enter_context
        bx = own(Buffer(device, x.nbytes, name="x"))
        by = own(Buffer(device, y.nbytes, name="y"))
        # Device-local memory may not be mappable (discrete GPUs): stage through host buffers.
        if bx.host_visible:
            bx.write(x)
            by.write(y)
            readback = by
        else:
            sx = own(Buffer(device, x.nbytes, MemoryKind.UPLOAD, name="x staging"))
            sy = own(Buffer(device, y.nbytes, MemoryKind.UPLOAD, name="y staging"))
            readback = own(Buffer(device, y.nbytes, MemoryKind.READBACK, name="y readback"))
            sx.write(x)
            sy.write(y)
        layout, dset, pipeline = storage_kernel(stack, device, spirv, "axpby", [bx, by], 8,
                                                {0: local_size, 1: float(beta)}, pipeline_cache)
        queries = own(TimestampQueryPool(device, 2)) if device.physical.timestamps_supported else None

        with OneShot(device) as cmd:
            if readback is not by:
                cmd.copy_buffer(sx, bx)
                cmd.copy_buffer(sy, by)
                cmd.compute_barrier()
            if queries:
                cmd.reset_query_pool(queries)
                cmd.write_timestamp(queries, 0, Stage.TOP_OF_PIPE)
            cmd.bind_pipeline(pipeline)
            cmd.bind_descriptor_sets(layout, [dset])
            cmd.push_constants(layout, struct.pack("<fI", float(alpha), n))
            most = device.limits["maxComputeWorkGroupCount"][0]
            cmd.dispatch(min((n + local_size - 1) // local_size, most))
            if queries:
                cmd.write_timestamp(queries, 1, Stage.BOTTOM_OF_PIPE)
            if readback is not by:
                cmd.compute_barrier()
                cmd.copy_buffer(by, readback)
            cmd.host_read_barrier()
        out = readback.read(np.float32, n)
        gpu_ns = None
        if queries:
            t0, t1 = queries.results_ns()
            gpu_ns = t1 - t0
        return AxpbyResult(out, gpu_ns)
