"""Helpers that run a one-dispatch compute shader on host-visible or staged buffers."""

from __future__ import annotations

from contextlib import ExitStack


from vkgraph.runtime import (
    Buffer,
    CommandPool,
    ComputePipeline,
    DescriptorPool,
    DescriptorSetLayout,
    DescriptorType,
    Fence,
    MemoryKind,
    PipelineLayout,
    ShaderModule,
)


def run_kernel(device, spirv, arrays, *, push=b"", spec=None, groups=(1, 1, 1)):
    """Bind ``arrays`` to bindings 0..n-1 as storage buffers (uploaded through UPLOAD buffers and
    read back through READBACK ones, so the path works on any device), dispatch once, and return
    the arrays as the shader left them."""
    with ExitStack() as stack:
        own = stack.enter_context
        n = len(arrays)
        dev_bufs = [own(Buffer(device, a.nbytes, name=f"arg{i}")) for i, a in enumerate(arrays)]
        ups = [own(Buffer(device, a.nbytes, MemoryKind.UPLOAD)) for a in arrays]
        downs = [own(Buffer(device, a.nbytes, MemoryKind.READBACK)) for a in arrays]
        for up, a in zip(ups, arrays):
            up.write(a)
        set_layout = own(DescriptorSetLayout(device, [DescriptorType.STORAGE_BUFFER] * n))
        pool = own(DescriptorPool.for_layouts(device, [set_layout]))
        dset = pool.allocate(set_layout)
        dset.bind_buffers(dict(enumerate(dev_bufs)))
        layout = own(PipelineLayout(device, [set_layout], push_constant_nbytes=len(push)))
        module = own(ShaderModule(device, spirv))
        pipeline = own(ComputePipeline(device, layout, module, spec))
        (cmd,) = own(CommandPool(device)).allocate()
        cmd.begin(one_time=True)
        for up, buf in zip(ups, dev_bufs):
            cmd.copy_buffer(up, buf)
        cmd.compute_barrier()
        cmd.bind_pipeline(pipeline)
        cmd.bind_descriptor_sets(layout, [dset])
        if push:
            cmd.push_constants(layout, push)
        cmd.dispatch(*groups)
        cmd.compute_barrier()
        for buf, down in zip(dev_bufs, downs):
            cmd.copy_buffer(buf, down)
        cmd.host_read_barrier()
        cmd.end()
        fence = own(Fence(device))
        device.submit([cmd], fence)
        fence.wait()
        return [down.read(a.dtype).reshape(a.shape) for down, a in zip(downs, arrays)]
