"""ComputeGraph: values, prepack nodes, dispatch nodes, staged prepack and execute (DESIGN.md §2-§4)."""

from __future__ import annotations

import os
import struct
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..config import GraphConfig, load_config
from ..errors import DeviceLostError, FenceTimeoutError, OutOfDeviceMemoryError, UnsupportedFeatureError, VkGraphError
from ..runtime import (
    Buffer,
    ImportedBuffer,
    CommandBuffer,
    CommandPool,
    ComputePipeline,
    DescriptorPool,
    DescriptorSetLayout,
    DescriptorType,
    Device,
    Fence,
    Image3D,
    MemoryKind,
    PipelineCache,
    PipelineLayout,
    ShaderModule,
    Stage,
    TimestampQueryPool,
)
from ..shaders import SpirvCompiler
from .nodes import PACK_LOCAL_SIZE, DispatchNode, PrepackNode, dispatch_groups, packer_bindings
from .packers import Packer, get_packer
from .report import CommandBufferSpan, LoadReport
from .scheduler import (
    PrepackThresholds,
    batches,
    execute_cut_points,
    prepack_cut_points,
    reduce_peak_memory,
)
from .staging import StagingRing, align_up
from .windows import row_windows
from .values import ArraySource, ByteSource, IOStaging, Scalar, Tensor, TensorRef, ValueRef

ProgressFn = Callable[[int, int], None]  # (nodes done, nodes total)


@dataclass
class Kernel:
    """A compute pipeline and its layouts, shared by every node that uses the same shader."""

    set_layout: DescriptorSetLayout
    layout: PipelineLayout
    module: ShaderModule
    pipeline: ComputePipeline


class ComputeGraph:
    """A graph of prepack nodes (pack constant weights) and dispatch nodes (the model's compute).

    Without ``device`` the graph opens one from ``config.device`` and owns it. Use as a context
    manager (or call :meth:`destroy`) to free every Vulkan object it made.
    """

    def __init__(
        self,
        config: GraphConfig | None = None,
        *,
        device: Device | None = None,
        compiler: SpirvCompiler | None = None,
    ):
        self.config = config if config is not None else load_config()
        self._owns_device = device is None
        budget = self.config.device.max_memory_nbytes
        self.device = device or Device(self.config.device.prefer or None, validation=self.config.device.validation,
                                       max_memory_nbytes=budget)
        # A shared device takes this graph's budget while the graph lives.
        self._saved_budget = None
        if device is not None and budget:
            self._saved_budget, device.max_memory_nbytes = device.max_memory_nbytes, budget
        self.compiler = compiler or SpirvCompiler(self.config.cache.shader_cache_dir or None)
        self.values: list[Any] = []
        self.names: dict[str, ValueRef] = {}
        self.prepack_nodes: list[PrepackNode] = []
        self.execute_nodes: list[DispatchNode] = []
        self.inputs: dict[str, IOStaging] = {}
        self.outputs: dict[str, IOStaging] = {}
        self._kernels: dict[tuple, Kernel] = {}
        self._resources: list[Buffer | Image3D] = []
        self._execute: tuple[CommandPool, DescriptorPool, list[CommandBuffer], Fence] | None = None
        self._clock_offset_ns: float | None = None
        self.prepacked = False
        self.failed: str | None = None  # why an earlier prepack or execute failed; the graph is unusable
        #: Longest wait for one fence; past it FenceTimeoutError, and the graph is unusable.
        self.fence_timeout_s = self.config.effective("device.fence_timeout_ms") / 1000
        self._held: list[TensorRef] | None = None  # released sources kept for a possible retry
        self._parked: list[_PrepackRun] = []  # runs the GPU may still use (after a timeout): freed in destroy()
        self.load_report: LoadReport | None = None
        self._legacy_run: _PrepackRun | None = None
        self._cache_file = None  # the open packed-weight cache (its pages may back device memory)
        self._pipeline_cache: PipelineCache | None = None
        self._pipeline_cache_data = b""
        self._cache_keys: dict[int, str] = {}
        self._shader_hashes: dict[tuple, str] = {}  # packing-shader SPIR-V hashes, for cache keys
        limits = self.device.limits
        self.staging_alignment = max(16, limits["minStorageBufferOffsetAlignment"])
        #: The most bytes one storage-buffer binding may span; bigger weights are packed and read
        #: in row windows. (Tests lower it to exercise windows on small tensors.)
        self.max_binding_nbytes: int = limits["maxStorageBufferRange"]
        self.max_groups_x = limits["maxComputeWorkGroupCount"][0]

    # --- building -----------------------------------------------------------------------------

    def _add(self, value: Any, name: str | None) -> ValueRef:
        if name:
            if name in self.names:
                raise ValueError(f"a value named {name!r} is already in the graph")
            self.names[name] = len(self.values)
        self.values.append(value)
        return len(self.values) - 1

    def add_tensorref(
        self, data: np.ndarray | ByteSource, name: str, *, shape: Sequence[int] | None = None, dtype: Any = None,
        quant: str = "",
    ) -> ValueRef:
        """A CPU constant: a numpy array (or memmap view), or a :class:`ByteSource` with
        ``shape`` and ``dtype``. ``quant`` names the GGML block format of a quantized weight."""
        if isinstance(data, np.ndarray):
            source: ByteSource = ArraySource(data)
            shape, dtype = data.shape if shape is None else shape, data.dtype if dtype is None else dtype
        else:
            source = data
            if shape is None or dtype is None:
                raise ValueError(f"tensorref {name!r}: a byte source needs shape and dtype")
        return self._add(TensorRef(name, tuple(int(s) for s in shape), np.dtype(dtype), source, quant=quant), name)

    def add_tensor(self, shape: Sequence[int], dtype: Any, name: str | None = None) -> ValueRef:
        """A device tensor (memory is bound when execute is encoded)."""
        ref_name = name or f"t{len(self.values)}"
        return self._add(Tensor(ref_name, tuple(int(s) for s in shape), np.dtype(dtype)), name)

    def add_texture(self, shape: Sequence[int], layout: str = "channels_packed", name: str | None = None) -> ValueRef:
        """A float32 device tensor in texture storage (memory bound when execute is encoded)."""
        t = Tensor(name or f"t{len(self.values)}", tuple(int(s) for s in shape), np.dtype(np.float32), layout,
                   storage="texture3d")
        self._check_texture(t)
        return self._add(t, name)

    def _check_texture(self, t: Tensor) -> None:
        most = self.device.limits["maxImageDimension3D"]
        if max(t.extents()) > most:
            raise UnsupportedFeatureError("vkCreateImage", "maxImageDimension3D",
                                          f"tensor {t.name!r} {t.shape} needs a {t.extents()} texture; "
                                          f"{self.device.name} allows at most {most} texels per side")

    def add_scalar(self, value: Any) -> ValueRef:
        return self._add(Scalar(value), None)

    def add_input(self, shape: Sequence[int], dtype: Any, name: str) -> ValueRef:
        ref = self.add_tensor(shape, dtype, name)
        self.inputs[name] = IOStaging(ref, name)
        return ref

    def set_output(self, ref: ValueRef, name: str | None = None) -> None:
        """Read ``ref`` back after every execute (a texture is converted back to NCHW first)."""
        tensor = self.values[ref]
        if tensor.storage == "texture3d":
            ref = self.texture_to_buffer(ref)
        self.outputs[name or tensor.name] = IOStaging(ref, name or tensor.name)

    def texture_to_buffer(self, ref: ValueRef) -> ValueRef:
        """A dispatch that copies texture tensor ``ref`` into a new NCHW buffer tensor."""
        t: Tensor = self.values[ref]
        out = self.add_tensor(t.shape, np.float32)
        self.add_dispatch(DispatchNode("image_to_nchw", [ref, out], struct.pack("<IIII", *t.sizes()), {0: 64},
                                       (dispatch_groups(int(np.prod(t.shape)), 64, self.max_groups_x), 1, 1),
                                       {"CHANNELS_PACKED": int(t.layout != "width_packed")}))
        return out

    def buffer_to_texture(self, ref: ValueRef, layout: str = "channels_packed") -> ValueRef:
        """A dispatch that copies buffer tensor ``ref`` (NCHW) into a new texture tensor."""
        t: Tensor = self.values[ref]
        out = self.add_texture(t.shape, layout)
        texels = int(np.prod(self.values[out].extents()))
        self.add_dispatch(DispatchNode("nchw_to_image", [ref, out], struct.pack("<IIII", *t.sizes()), {0: 64},
                                       (dispatch_groups(texels, 64, self.max_groups_x), 1, 1),
                                       {"CHANNELS_PACKED": int(layout != "width_packed")}))
        return out

    def prepack_tensor(self, src: ValueRef, packer: str | Packer | None = None, name: str | None = None) -> ValueRef:
        """Add a prepack node packing TensorRef ``src`` (default packer: its block format if it
        is quantized, else identity); returns the packed device tensor. Source and destination
        are validated here, before any GPU work."""
        ref: TensorRef = self.values[src]
        if not isinstance(ref, TensorRef):
            raise TypeError(f"prepack needs a TensorRef, got {type(ref).__name__}")
        packer = get_packer(packer or ref.quant or "identity")
        packer.validate_source(ref)
        dst = packer.make_dst(ref, name or f"{ref.name}:{packer.name}")
        packer.validate(ref, dst)
        self._check_bindable(ref, dst, packer)
        if dst.storage == "texture3d":
            self._check_texture(dst)
        dst_ref = self._add(dst, None)
        direct = packer.shader is None and self.device.host_visible_device_local
        ref.readers += 1
        self.prepack_nodes.append(PrepackNode(src, dst_ref, packer, direct))
        return dst_ref

    def _check_bindable(self, ref: TensorRef, dst: Tensor, packer: Packer) -> None:
        """A shader packer must see source and destination through bindings of at most
        max_binding_nbytes: whole, or in row windows when the packer can window."""
        most = self.max_binding_nbytes
        bound = ref.nbytes if dst.storage == "texture3d" else max(ref.nbytes, dst.nbytes)
        if packer.shader is None or bound <= most:
            return
        layout = packer.row_layout(ref)
        try:
            if layout is None:
                raise ValueError(f"packer {packer.name!r} cannot pack in row windows")
            rows, src_row, dst_row, unit = layout
            row_windows(rows, (src_row, dst_row), most, self.staging_alignment, unit)
        except ValueError as exc:
            raise UnsupportedFeatureError(
                "vkUpdateDescriptorSets", "maxStorageBufferRange",
                f"tensor {ref.name!r} needs {max(ref.nbytes, dst.nbytes)} bytes in one binding ({exc}); "
                f"{self.device.name} binds at most {most}",
            ) from None

    def add_dispatch(self, node: DispatchNode) -> None:
        if self.prepacked and self._execute is not None:
            raise VkGraphError("cannot add nodes after execute was encoded")
        self.execute_nodes.append(node)

    # --- kernels ------------------------------------------------------------------------------

    def kernel(self, shader: str, bindings: int | Sequence[DescriptorType], push_nbytes: int,
               spec: Mapping[int, Any] | None = None, defines: Mapping[str, object] | None = None) -> Kernel:
        """The pipeline for ``shader`` with these binding types (an int: that many storage
        buffers), push-constant size, specialization constants and defines; made once."""
        spec = dict(spec or {})
        defines = dict(defines or {})
        types = (DescriptorType.STORAGE_BUFFER,) * bindings if isinstance(bindings, int) else tuple(bindings)
        key = (shader, types, push_nbytes, tuple(sorted(spec.items())), tuple(sorted(defines.items())))
        k = self._kernels.get(key)
        if k is None:
            spirv = self.compiler.compile_named(shader, defines)
            set_layout = DescriptorSetLayout(self.device, list(types))
            layout = PipelineLayout(self.device, [set_layout], push_nbytes)
            module = ShaderModule(self.device, spirv, shader)
            pipeline = ComputePipeline(self.device, layout, module, spec, cache=self.pipeline_cache())
            k = self._kernels[key] = Kernel(set_layout, layout, module, pipeline)
        return k

    def pipeline_cache_path(self) -> Path:
        """``cache.pipeline_cache_path``, else one file per device/driver in the cache directory."""
        if self.config.cache.pipeline_cache_path:
            return Path(self.config.cache.pipeline_cache_path)
        from .._files import user_cache_dir

        p = self.device.physical
        return user_cache_dir() / "pipelines" / f"{p.vendor_id:04x}-{p.device_id:04x}-{p.pipeline_cache_uuid.hex()}.bin"

    def pipeline_cache(self) -> PipelineCache:
        """The VkPipelineCache every pipeline of this graph goes through (loaded on first use)."""
        if self._pipeline_cache is None:
            self._pipeline_cache = PipelineCache.load(self.device, self.pipeline_cache_path())
            self._pipeline_cache_data = self._pipeline_cache.data()
        return self._pipeline_cache

    def _save_pipeline_cache(self) -> None:
        if self._pipeline_cache is not None:
            data = self._pipeline_cache.data()
            if data != self._pipeline_cache_data:  # new pipelines: keep them for the next process
                self._pipeline_cache.save(self.pipeline_cache_path())
                self._pipeline_cache_data = data

    def prepare(self) -> None:
        """Compile and create every pipeline the graph needs (before any timing starts)."""
        for node in self.prepack_nodes:
            if node.packer.shader is not None:
                self.kernel(node.packer.shader, packer_bindings(node.packer), node.packer.push_nbytes,
                            {0: PACK_LOCAL_SIZE}, node.packer.defines)
        for node in self.execute_nodes:
            self.kernel(node.shader, node.binding_types(self), len(node.push), node.spec, node.defines)
        self._save_pipeline_cache()

    # --- memory -------------------------------------------------------------------------------

    def _allocate(self, tensor: Tensor) -> Buffer | Image3D:
        """Device memory for ``tensor``: a buffer, or an image for texture storage."""
        if tensor.storage == "texture3d":
            res: Buffer | Image3D = Image3D(self.device, tensor.extents(), name=tensor.name)
            tensor.image = res
        else:
            res = tensor.buffer = Buffer(self.device, tensor.nbytes, MemoryKind.DEVICE, name=tensor.name)
        self._resources.append(res)
        return res

    @property
    def total_constant_nbytes(self) -> int:
        return sum(self.values[n.src].nbytes for n in self.prepack_nodes)

    # --- prepack ------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.failed:
            raise VkGraphError(f"the graph is unusable: {self.failed}")

    def _check_not_prepacked(self) -> None:
        self._check_usable()
        if self.prepacked or self._legacy_run is not None:
            raise VkGraphError("the graph is already prepacked")

    def _abandon(self, run: _PrepackRun | None, exc: BaseException) -> None:
        """After a failed prepack: free the run and every weight packed so far. After a fence
        timeout or a lost device the GPU may still be using them: they are kept until destroy()."""
        self.failed = f"an earlier prepack failed ({type(exc).__name__}: {exc})"
        if isinstance(exc, (FenceTimeoutError, DeviceLostError)):
            if run is not None:
                self._parked.append(run)
            return
        if run is not None:
            run.close()
        for v in self.values:
            if isinstance(v, Tensor) and v.constant and v.resource is not None:
                v.resource.destroy()
                v.buffer = v.image = None
        self._resources = [r for r in self._resources if r.alive]

    def encode_prepack(self) -> None:
        """Legacy path, step 1: encode every prepack node into one command buffer (not submitted)."""
        self._check_not_prepacked()
        self.prepare()
        run = None
        t0 = time.perf_counter()  # the cache lookup is part of the load
        try:
            hits = self._cache_lookup()
            nodes = [n for i, n in enumerate(self.prepack_nodes) if i not in hits]
            run = _PrepackRun(self, "legacy", nodes, [range(len(nodes))] if nodes else [], hits=hits, t0=t0)
            if nodes:
                run.encode(0)
        except BaseException as exc:
            self._abandon(run, exc)
            raise
        self._legacy_run = run

    def prepack(self) -> LoadReport:
        """Legacy path, step 2: submit the one command buffer and wait. Encodes first if needed."""
        if self._legacy_run is None:
            self.encode_prepack()
        run, self._legacy_run = self._legacy_run, None
        try:
            if run.plan:
                run.submit(0)
            return self._finish(run)
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    def run_prepack(self, progress: ProgressFn | None = None) -> LoadReport:
        """Staged prepack (DESIGN.md §4): command buffers cut by the scheduler, submitted without
        waiting while the CPU stages the next batch; reduce-peak mode waits at every cut.

        With ``prepack.reduce_peak_memory = "auto"``, a staged load that runs out of device memory
        (a real allocation failure or ``device.max_memory_nbytes``) frees what it packed and runs
        again in reduce-peak mode, whose peak is the weights plus one batch of staging."""
        self._check_not_prepacked()
        self.prepare()
        mode = "reduce-peak" if reduce_peak_memory(self.config, self.total_constant_nbytes) else "staged"
        may_retry = mode == "staged" and self.config.prepack.reduce_peak_memory == "auto"
        self._held = [] if may_retry else None  # sources a retry would read again
        try:
            report = self._run_prepack(mode, progress)
        except OutOfDeviceMemoryError as exc:
            if not may_retry:
                raise
            reason = str(exc)
            self._held = None  # still readable; the retry releases them after their last reader
        finally:
            held, self._held = self._held or [], None
            for src in held:
                src.source.release()
        if self.prepacked:
            return report
        self.failed = None  # _abandon freed everything the staged attempt made
        if self._cache_file is not None:
            self._cache_file.close()
            self._cache_file = None
        for v in self.values:
            if isinstance(v, TensorRef):
                v.readers = 0
        for node in self.prepack_nodes:
            self.values[node.src].readers += 1
        report = self._run_prepack("reduce-peak", progress)
        report.retried_after = reason
        return report

    def _run_prepack(self, mode: str, progress: ProgressFn | None) -> LoadReport:
        run = None
        t0 = time.perf_counter()  # the cache lookup is part of the load
        try:
            hits = self._cache_lookup()
            nodes = [n for i, n in enumerate(self.prepack_nodes) if i not in hits]
            sizes = [n.staging_nbytes(self) for n in nodes]
            cuts = prepack_cut_points(sizes, PrepackThresholds.from_config(self.config))
            run = _PrepackRun(self, mode, nodes, batches(len(sizes), cuts), progress, hits=hits, t0=t0)
            for b in range(len(run.plan)):
                run.encode(b)
                run.submit(b)
                if mode == "reduce-peak":
                    run.wait(b)
            return self._finish(run)
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    def _finish(self, run: _PrepackRun) -> LoadReport:
        report = run.finish()
        self.prepacked = True
        self.load_report = report
        self._cache_save(run)
        return report

    # --- packed-weight cache --------------------------------------------------------------------

    def _cache_lookup(self) -> dict[int, Any]:
        """{prepack node index: cache entry} for the nodes the cache file already holds."""
        path = self.config.cache.packed_weights_path
        self._cache_keys: dict[int, str] = {}
        if not path:
            return {}
        from ..cache import packed_cache

        self._cache_identity = packed_cache.device_identity(self)
        self._cache_file = packed_cache.open_cache(Path(path), self._cache_identity)
        hits = {}
        for i, node in enumerate(self.prepack_nodes):
            if self.values[node.dst].storage != "buffer":
                continue  # textures are not cached
            key = self._cache_keys[i] = packed_cache.node_key(self, node)
            entry = self._cache_file.entries.get(key) if self._cache_file else None
            if entry is not None and entry.nbytes == self.values[node.dst].nbytes:
                hits[i] = entry
        if not hits:
            return hits
        # Check every region this load will use; xxh3 releases the GIL, so use the cores.
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            intact = list(pool.map(self._cache_file.intact, hits.values()))
        bad = [e.key for e, ok in zip(hits.values(), intact) if not ok]
        if bad:  # never hand the device damaged weights: pack everything, rebuild the file
            warnings.warn(f"packed-weight cache rejected, it will be rebuilt: {path}: region checksum mismatch "
                          f"for {bad[0].split('|', 1)[0]!r}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else ""),
                          stacklevel=3)
            self._cache_file.close()
            self._cache_file = None
            return {}
        return hits

    def _load_cached(self, node: PrepackNode, entry: Any) -> str:
        """Give a cache hit's tensor its memory; returns the path taken: "zero-copy" (the file's
        pages imported as device memory) or "copy"."""
        from ..cache.format import PAGE

        dst: Tensor = self.values[node.dst]
        f = self._cache_file
        padded = memoryview(f.mapping)[entry.offset:entry.offset + (entry.nbytes + PAGE - 1) // PAGE * PAGE]
        align = self.device.physical.min_imported_host_pointer_alignment
        if self.device.has_external_memory_host and align and PAGE % align == 0:
            dst.buffer = ImportedBuffer(self.device, padded, dst.nbytes, name=dst.name)
            path = "zero-copy"
        else:
            dst.buffer = self._upload(np.frombuffer(f.region(entry), np.uint8), dst.nbytes, dst.name)
            path = "copy"
        self._resources.append(dst.buffer)
        self._read_done(self.values[node.src])
        return path

    def _read_done(self, src: TensorRef) -> None:
        """A prepack node has read ``src``: after its last reader the source is released (file
        pages dropped), unless a retry may need to read it again and could not."""
        src.readers -= 1
        if src.readers == 0:
            if self._held is not None and not getattr(src.source, "rereadable", False):
                self._held.append(src)
            else:
                src.source.release()

    def _upload(self, data: np.ndarray, nbytes: int, name: str) -> Buffer:
        buf = Buffer(self.device, nbytes, MemoryKind.DEVICE, name=name)
        if buf.host_visible:
            buf.write(data)
            return buf
        with Buffer(self.device, nbytes, MemoryKind.UPLOAD) as up, CommandPool(self.device) as pool, \
                Fence(self.device) as fence:
            up.write(data)
            (cmd,) = pool.allocate()
            cmd.begin(one_time=True)
            cmd.copy_buffer(up, buf, nbytes)
            cmd.compute_barrier()
            cmd.end()
            self.device.submit([cmd], fence)
            fence.wait(self.fence_timeout_s)
        return buf

    def _cache_save(self, run: _PrepackRun) -> None:
        """After a load: write what was packed (misses) to the cache file, once; nothing when
        everything came from the cache."""
        path = self.config.cache.packed_weights_path
        if not path:
            return
        from ..cache import packed_cache

        t0 = time.perf_counter()
        new = {}
        for i, node in enumerate(self.prepack_nodes):
            key = self._cache_keys.get(i)
            if key is not None and i not in run.hits:
                new[key] = (self.values[node.dst].layout, self.read_tensor(node.dst))
        if new or (self._cache_file is None and Path(path).exists()):
            packed_cache.save(Path(path), self._cache_identity, new)
        run.report.cache_save_s = time.perf_counter() - t0

    def clock_offset_ns(self) -> float:
        """host perf_counter_ns - device timestamp ns, measured once (error < half a round trip)."""
        if self._clock_offset_ns is None:
            with TimestampQueryPool(self.device, 1) as qp, CommandPool(self.device) as pool, Fence(self.device) as fence:
                (cmd,) = pool.allocate()
                cmd.begin(one_time=True)
                cmd.reset_query_pool(qp)
                cmd.write_timestamp(qp, 0, Stage.BOTTOM_OF_PIPE)
                cmd.end()
                t0 = time.perf_counter_ns()
                self.device.submit([cmd], fence)
                fence.wait(self.fence_timeout_s)
                t1 = time.perf_counter_ns()
                (dev_ns,) = qp.results_ns()
            self._clock_offset_ns = (t0 + t1) / 2 - dev_ns
        return self._clock_offset_ns

    # --- execute ------------------------------------------------------------------------------

    def encode_execute(self) -> None:
        """Bind memory for every non-constant tensor and IO staging, and record the execute
        command buffers once (split by the execute thresholds)."""
        self._check_usable()
        if not self.prepacked:
            raise VkGraphError("prepack the graph (run_prepack() or prepack()) before encoding execute")
        if self._execute is not None:
            return
        self.prepare()
        for v in self.values:
            if isinstance(v, Tensor) and v.resource is None and not v.constant:
                self._allocate(v)
        for io, kind in [(s, MemoryKind.UPLOAD) for s in self.inputs.values()] + \
                        [(s, MemoryKind.READBACK) for s in self.outputs.values()]:
            t = self.values[io.tensor]
            io.buffer = Buffer(self.device, t.nbytes, kind, name=f"{io.name} staging")
            self._resources.append(io.buffer)

        nodes = self.execute_nodes
        pool = CommandPool(self.device)
        dpool = None
        try:
            types = [t for n in nodes for t in n.binding_types(self)]
            dpool = DescriptorPool(self.device, max(1, len(nodes)),
                                   {DescriptorType.STORAGE_BUFFER: max(1, types.count(DescriptorType.STORAGE_BUFFER)),
                                    DescriptorType.STORAGE_IMAGE: types.count(DescriptorType.STORAGE_IMAGE)})
            plan = batches(len(nodes), execute_cut_points(len(nodes), self.config)) or [range(0)]
            cmds = pool.allocate(len(plan))
            for i, (cmd, batch) in enumerate(zip(cmds, plan)):
                cmd.begin()
                if i == 0:
                    for io in self.inputs.values():
                        cmd.copy_buffer(io.buffer, self.values[io.tensor].buffer)
                    cmd.compute_barrier()
                for n in batch:
                    nodes[n].encode(self, cmd, dpool)
                if i == len(plan) - 1:
                    for io in self.outputs.values():
                        cmd.copy_buffer(self.values[io.tensor].buffer, io.buffer)
                    cmd.host_read_barrier()
                cmd.end()
            self._execute = (pool, dpool, cmds, Fence(self.device))
        except BaseException:
            if dpool is not None:
                dpool.destroy()
            pool.destroy()
            raise

    def copy_into_staging(self, name: str, array: np.ndarray) -> None:
        io = self.inputs.get(name)
        if io is None:
            raise KeyError(f"no graph input named {name!r}; inputs: {', '.join(self.inputs) or '-'}")
        t: Tensor = self.values[io.tensor]
        a = np.asarray(array)
        if a.shape != t.shape or a.dtype != t.dtype:
            raise ValueError(f"input {name!r} needs shape {t.shape} and dtype {t.dtype}, got {a.shape} {a.dtype}")
        io.buffer.write(a)

    def copy_from_staging(self, name: str) -> np.ndarray:
        io = self.outputs[name]
        t: Tensor = self.values[io.tensor]
        return io.buffer.read(t.dtype, int(np.prod(t.shape))).reshape(t.shape)

    def execute(self, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run the recorded command buffers on ``inputs``; returns every output by name."""
        self._check_usable()
        self.encode_execute()
        inputs = dict(inputs or {})
        missing = set(self.inputs) - set(inputs)
        if missing:
            raise KeyError(f"missing graph inputs: {', '.join(sorted(missing))}")
        for name, array in inputs.items():
            self.copy_into_staging(name, array)
        _pool, _dpool, cmds, fence = self._execute
        try:
            fence.reset()
            self.device.submit(cmds, fence)
            fence.wait(self.fence_timeout_s)
        except (FenceTimeoutError, DeviceLostError) as exc:
            # The command buffers may still be running (or the device is gone): never reuse them.
            self.failed = f"an earlier execute failed ({type(exc).__name__}: {exc})"
            raise
        return {name: self.copy_from_staging(name) for name in self.outputs}

    @property
    def execute_command_buffers(self) -> int:
        return len(self._execute[2]) if self._execute else 0

    def read_tensor(self, ref: ValueRef) -> np.ndarray:
        """The raw bytes of a device tensor (a texture's texels), for checks."""
        t: Tensor = self.values[ref]
        if t.resource is None:
            raise VkGraphError(f"tensor {t.name!r} has no memory yet")
        if t.buffer is not None and t.buffer.host_visible:
            return t.buffer.read(np.uint8, t.nbytes)
        with Buffer(self.device, t.nbytes, MemoryKind.READBACK) as rb, CommandPool(self.device) as pool, \
                Fence(self.device) as fence:
            (cmd,) = pool.allocate()
            cmd.begin(one_time=True)
            cmd.compute_barrier()
            if t.image is not None:  # raw texels: RGBA32F, x fastest
                cmd.copy_image_to_buffer(t.image, rb)
            else:
                cmd.copy_buffer(t.buffer, rb, t.nbytes)
            cmd.host_read_barrier()
            cmd.end()
            self.device.submit([cmd], fence)
            fence.wait(self.fence_timeout_s)
            return rb.read(np.uint8, t.nbytes)

    # --- teardown -----------------------------------------------------------------------------

    def destroy(self) -> None:
        """Free everything the graph made (and its device, if it opened one). Idempotent."""
        if self.device.alive:
            try:
                self.device.wait_idle()
            except DeviceLostError:
                pass  # nothing runs on a lost device any more: free everything
        for run in self._parked:
            run.close(wait=False)
        self._parked.clear()
        if self._legacy_run is not None:
            self._legacy_run.close()
            self._legacy_run = None
        if self._execute is not None:
            pool, dpool, _cmds, fence = self._execute
            fence.destroy()
            dpool.destroy()
            pool.destroy()
            self._execute = None
        for buf in self._resources:
            buf.destroy()
        self._resources.clear()
        for v in self.values:
            if isinstance(v, Tensor):
                v.buffer = v.image = None
        for k in self._kernels.values():
            for obj in (k.pipeline, k.module, k.layout, k.set_layout):
                obj.destroy()
        self._kernels.clear()
        if self._pipeline_cache is not None:
            if self.device.alive:
                try:
                    self._save_pipeline_cache()
                except OSError:
                    pass  # an unwritable cache directory must not break teardown
            self._pipeline_cache.destroy()
            self._pipeline_cache = None
        if self._cache_file is not None:  # after the imported buffers that use its pages
            self._cache_file.close()
            self._cache_file = None
        if self._owns_device:
            self.device.destroy()
        elif self._saved_budget is not None:
            self.device.max_memory_nbytes, self._saved_budget = self._saved_budget, None

    def __enter__(self) -> ComputeGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


class _PrepackRun:
    """The state of one prepack: plan, staging, command buffers, fences, timings."""

    def __init__(self, graph: ComputeGraph, mode: str, nodes: list[PrepackNode], plan: list[range],
                 progress: ProgressFn | None = None, *, hits: dict[int, Any] | None = None,
                 t0: float | None = None):
        self.graph = graph
        self.mode = mode
        self.nodes = nodes  # the nodes to pack (cache hits are not among them)
        self.plan = plan
        self.progress = progress
        self.hits = hits or {}
        dev = graph.device
        align = graph.staging_alignment
        self.batch_nbytes = [sum(align_up(nodes[i].staging_nbytes(graph), align) for i in b) for b in plan]
        total = sum(self.batch_nbytes)
        if mode == "legacy":
            capacity = total  # all staging alive at once
        elif mode == "reduce-peak":
            capacity = max(self.batch_nbytes, default=0)  # one batch, reused after each wait
        else:
            capacity = min(graph.config.effective("prepack.staging_ring_nbytes"), total)
        self.t0 = time.perf_counter() if t0 is None else t0
        self.device_base = dev.allocated_nbytes
        dev.peak_allocated_nbytes = dev.allocated_nbytes
        self.report = LoadReport(mode, len(graph.prepack_nodes), graph.total_constant_nbytes,
                                 sum(n.staging_nbytes(graph) for n in nodes))
        self.cmds: list[CommandBuffer | None] = [None] * len(plan)
        self.fences: list[Fence | None] = [None] * len(plan)
        self.regions: list = [None] * len(plan)
        self.done = 0
        self.ring = self.pool = self.dpool = self.queries = None
        try:
            self.ring = StagingRing(dev, capacity, align, graph.fence_timeout_s) if total else None
            self.pool = CommandPool(dev, transient=True)
            sets = sum(len(n.windows(graph)) for n in nodes if n.packer.shader is not None and not n.direct)
            self.dpool = DescriptorPool(dev, max(1, sets), {DescriptorType.STORAGE_BUFFER: max(2, 2 * sets)})
            if dev.physical.timestamps_supported and plan:
                self.queries = TimestampQueryPool(dev, 2 * len(plan))
        except BaseException:
            self.close()
            raise
        self._load_hits()

    def _load_hits(self) -> None:
        r = self.report
        r.cache_hits = len(self.hits)
        r.cache_misses = len(self.graph._cache_keys) - len(self.hits)
        for i, entry in self.hits.items():
            node = self.graph.prepack_nodes[i]
            path = self.graph._load_cached(node, entry)
            r.tensor_paths[self.graph.values[node.src].name] = path
            r.zero_copy_tensors += path == "zero-copy"
            self.done += 1
            if self.progress:
                self.progress(self.done, len(self.graph.prepack_nodes))

    def encode(self, b: int) -> None:
        g = self.graph
        region = self.ring.reserve(self.batch_nbytes[b]) if self.ring and self.batch_nbytes[b] else None
        cpu0 = time.perf_counter()
        (cmd,) = self.pool.allocate()
        cmd.begin(one_time=True)
        if self.queries:
            cmd.reset_query_pool(self.queries, 2 * b, 2)
            cmd.write_timestamp(self.queries, 2 * b, Stage.TOP_OF_PIPE)
        dispatches = 0
        for i in self.plan[b]:
            node = self.nodes[i]
            dispatches += node.encode(g, cmd, region, self.dpool)
            if g._cache_keys:
                self.report.tensor_paths[g.values[node.src].name] = "packed"
            self.report.direct_writes += node.direct
            self.done += 1
            if self.progress:
                self.progress(self.done, len(g.prepack_nodes))
        cmd.compute_barrier()  # packed weights become visible to later dispatches and copies
        if self.queries:
            cmd.write_timestamp(self.queries, 2 * b + 1, Stage.BOTTOM_OF_PIPE)
        cmd.end()
        self.cmds[b], self.regions[b] = cmd, region
        self.report.packing_dispatches += dispatches
        self.report.spans.append(CommandBufferSpan(
            b, len(self.plan[b]), sum(self.nodes[i].staging_nbytes(g) for i in self.plan[b]),
            dispatches, cpu0 - self.t0, 0.0))

    def submit(self, b: int) -> None:
        fence = self.fences[b] = Fence(self.graph.device)
        self.graph.device.submit([self.cmds[b]], fence)
        if self.regions[b] is not None:
            self.ring.attach(self.regions[b], fence)
        span = self.report.spans[b]
        span.cpu_end_s = time.perf_counter() - self.t0
        self.report.cpu_encode_s += span.cpu_end_s - span.cpu_start_s

    def _wait_fence(self, fence: Fence) -> None:
        if not fence.is_signaled():
            w0 = time.perf_counter()
            fence.wait(self.graph.fence_timeout_s)
            self.report.waits.append((w0 - self.t0, time.perf_counter() - self.t0))

    def wait(self, b: int) -> None:
        self._wait_fence(self.fences[b])

    def finish(self) -> LoadReport:
        for f in self.fences:
            if f is not None:
                self._wait_fence(f)
        r = self.report
        r.load_s = time.perf_counter() - self.t0
        dev = self.graph.device
        r.peak_device_nbytes = dev.peak_allocated_nbytes - self.device_base
        if self.ring:
            r.peak_staging_nbytes = self.ring.peak_nbytes
            r.waits.extend((w0 - self.t0, w1 - self.t0) for w0, w1 in self.ring.waits)
        r.waits.sort()
        r.fence_wait_s = sum(w1 - w0 for w0, w1 in r.waits)
        if self.queries:
            offset_s = self.graph.clock_offset_ns() / 1e9 - self.t0
            ts = self.queries.results_ns()
            for span in r.spans:
                span.gpu_start_s = ts[2 * span.index] / 1e9 + offset_s
                span.gpu_end_s = ts[2 * span.index + 1] / 1e9 + offset_s
        self.close()
        return r

    def close(self, wait: bool = True) -> None:
        """Free the run's objects, waiting for its work first (``wait=False``: the caller already
        waited for the device). Safe after a failure."""
        dev = self.graph.device
        if wait and dev.alive:
            dev.wait_idle()
        if self.ring is not None:  # before the fences it checks
            self.ring.destroy(wait)
            self.ring = None
        for obj in (*self.fences, self.queries, self.dpool, self.pool):
            if obj is not None:
                obj.destroy()
