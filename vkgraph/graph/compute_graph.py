"""ComputeGraph: the builder API (values, prepack nodes, dispatch nodes) and a graph's lifecycle;
pipelines, memory, prepack and execute are delegated (ARCHITECTURE.md §2, §3)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..config import GraphConfig, load_config
from ..errors import DeviceLostError, UnsupportedFeatureError, VkGraphError
from ..runtime import Device
from ..shaders import SpirvCompiler
from .allocation import TensorMemory
from .execute import ExecutePlan
from .kernels import KernelCache
from .nodes import DispatchNode, PrepackNode, dispatch_groups
from .packers import Packer, get_packer, packs_on_host
from .prepack import Prepacker, ProgressFn
from .report import LoadReport
from .values import ArraySource, ByteSource, IOStaging, Tensor, TensorRef, ValueRef, gather_params
from .windows import row_windows


@dataclass(frozen=True)
class DeviceFacts:
    """What building a graph needs to know about a device, without one: a recording graph
    (:meth:`ComputeGraph.recording`) uses these. The defaults bind any tensor whole."""

    name: str = "recording (no device)"
    host_visible_device_local: bool = True
    is_cpu: bool = False
    renderer: str = ""
    simd_width: int = 0  # a CPU renderer's vector width in invocations (Device.simd_width); 0: a GPU
    limits: dict[str, Any] = field(default_factory=lambda: {
        "minStorageBufferOffsetAlignment": 16, "maxStorageBufferRange": 2**32 - 1,
        "maxComputeWorkGroupCount": (65535, 65535, 65535), "maxImageDimension3D": 2048,
        "maxTexelBufferElements": 2**32 - 1, "minTexelBufferOffsetAlignment": 16})
    cpu_threads: int = 0  # a CPU renderer's worker threads (Device.cpu_threads); 0: a GPU, or not known


class ComputeGraph:
    """A graph of prepack nodes (pack constant weights) and dispatch nodes (the model's compute).

    Without ``device`` the graph opens one from ``config.device`` and owns it. Use as a context
    manager (or call :meth:`destroy`) to free every Vulkan object it made.
    """

    def __init__(
        self,
        config: GraphConfig | None = None,
        *,
        device: Device | DeviceFacts | None = None,
        compiler: SpirvCompiler | None = None,
    ):
        self.config = config if config is not None else load_config()
        #: True for a graph built against DeviceFacts: it records nodes and allocates nothing.
        self.recording = isinstance(device, DeviceFacts)
        self._owns_device = device is None
        budget = self.config.device.max_memory_nbytes
        self.device = device or Device(self.config.device.prefer or None, validation=self.config.device.validation,
                                       max_memory_nbytes=budget)
        # A shared device takes this graph's budget while the graph lives.
        self._saved_budget = None
        if device is not None and budget and not self.recording:
            self._saved_budget, device.max_memory_nbytes = device.max_memory_nbytes, budget
        self.values: list[Tensor | TensorRef] = []
        self.names: dict[str, ValueRef] = {}
        self.prepack_nodes: list[PrepackNode] = []
        self._packed: dict[tuple[ValueRef, str], ValueRef] = {}  # (source, packer name) -> packed tensor
        self.execute_nodes: list[DispatchNode] = []
        self.inputs: dict[str, IOStaging] = {}
        self.outputs: dict[str, IOStaging] = {}
        self._entry = ""  # the entry point inputs, outputs and dispatches are added to (entry())
        self.failed: str | None = None  # why an earlier prepack or execute failed; the graph is unusable
        #: Longest wait for one fence; past it FenceTimeoutError, and the graph is unusable.
        self.fence_timeout_s = self.config.resolved.device.fence_timeout_ms / 1000
        limits = self.device.limits
        self.staging_alignment = max(16, limits["minStorageBufferOffsetAlignment"])
        #: The most bytes one storage-buffer binding may span; bigger weights are packed and read
        #: in row windows. (Tests lower it to exercise windows on small tensors.)
        self.max_binding_nbytes: int = limits["maxStorageBufferRange"]
        self.max_groups_x = limits["maxComputeWorkGroupCount"][0]
        self._prepacker = Prepacker(self)
        self._execute: ExecutePlan | None = None
        if not self.recording:
            compiler = compiler or SpirvCompiler(self.config.cache.shader_cache_dir or None)
            self.kernels = KernelCache(self.device, compiler, self.config.cache.pipeline_cache_path)
            self.memory = TensorMemory(self.device, self.fence_timeout_s)

    @classmethod
    def recording(cls, config: GraphConfig | None = None, facts: DeviceFacts | None = None) -> ComputeGraph:
        """A graph that records what a builder adds (values, prepack and dispatch nodes) and
        allocates nothing: the simulator reads a model's prepack nodes from one."""
        return cls(config or GraphConfig(), device=facts or DeviceFacts())

    # --- building -----------------------------------------------------------------------------

    def _add(self, value: Tensor | TensorRef, name: str | None) -> ValueRef:
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

    def add_tensor(self, shape: Sequence[int], dtype: Any, name: str | None = None, state: bool = False) -> ValueRef:
        """A device tensor (memory is bound when execute is encoded). ``state``: its contents
        carry from one execute to the next (a key/value cache), so it never shares memory with
        other intermediates (allocation.shared_lifetimes)."""
        ref_name = name or f"t{len(self.values)}"
        return self._add(Tensor(ref_name, tuple(int(s) for s in shape), np.dtype(dtype), state=state), name)

    def add_view(self, ref: ValueRef, shape: Sequence[int]) -> ValueRef:
        """A tensor of ``shape`` sharing the memory of buffer tensor ``ref`` (a reshape: same
        element count, no copy)."""
        t = self.values[ref]
        if not isinstance(t, Tensor) or t.storage != "buffer" or t.layout != "contiguous":
            raise TypeError(f"a view needs a contiguous buffer tensor, not {getattr(t, 'name', t)!r}")
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(t.shape, dtype=np.int64)):
            raise ValueError(f"a view of {t.name!r} {t.shape} cannot have shape {shape}")
        root = ref if t.view_of is None else t.view_of
        return self._add(Tensor(f"t{len(self.values)}", shape, t.dtype, nbytes=t.nbytes, view_of=root), None)

    def add_texture(self, shape: Sequence[int], layout: str = "channels_packed", name: str | None = None) -> ValueRef:
        """A float32 device tensor in texture storage (memory bound when execute is encoded)."""
        t = Tensor(name or f"t{len(self.values)}", tuple(int(s) for s in shape), np.dtype(np.float32), layout,
                   storage="texture3d")
        self._check_texture(t)
        return self._add(t, name)

    def _check_texture(self, t: Tensor) -> None:
        most = self.device.limits["maxImageDimension3D"]
        if max(t.extents()) > most:
            raise UnsupportedFeatureError("maxImageDimension3D",
                                          f"tensor {t.name!r} {t.shape} needs a {t.extents()} texture; "
                                          f"{self.device.name} allows at most {most} texels per side")

    @contextlib.contextmanager
    def entry(self, name: str) -> Iterator[None]:
        """Inputs, outputs and dispatches added inside belong to entry point ``name``, which
        ``execute(inputs, entry=name)`` runs alone; outside, to the default entry ``""``. Entry
        points share the graph's weights and every tensor: e.g. a decoder's one-token step and
        its batched prompt write the same key/value caches."""
        saved, self._entry = self._entry, name
        try:
            yield
        finally:
            self._entry = saved

    @property
    def entries(self) -> list[str]:
        """The graph's entry points, the default ``""`` first."""
        named = {n.entry for n in self.execute_nodes} | {io.entry for io in (*self.inputs.values(), *self.outputs.values())}
        return [""] + sorted(named - {""})

    def add_input(self, shape: Sequence[int], dtype: Any, name: str) -> ValueRef:
        ref = self.add_tensor(shape, dtype, name)
        self.inputs[name] = IOStaging(ref, name, self._entry)
        return ref

    def set_output(self, ref: ValueRef, name: str | None = None) -> None:
        """Read ``ref`` back after every execute (a texture is converted back to NCHW first)."""
        tensor = self.values[ref]
        if tensor.storage == "texture3d":
            ref = self.texture_to_buffer(ref)
        name = name or tensor.name
        if name in self.outputs:
            raise ValueError(f"an output named {name!r} is already in the graph")
        self.outputs[name] = IOStaging(ref, name, self._entry)

    def texture_to_buffer(self, ref: ValueRef) -> ValueRef:
        """A dispatch that copies texture tensor ``ref`` into a new NCHW buffer tensor."""
        t: Tensor = self.values[ref]
        out = self.add_tensor(t.shape, np.float32)
        self.add_dispatch(DispatchNode("image_to_nchw", [ref, out], t.texture_params(), {0: 64},
                                       (dispatch_groups(int(np.prod(t.shape)), 64, self.max_groups_x), 1, 1)))
        return out

    def buffer_to_texture(self, ref: ValueRef, layout: str = "channels_packed") -> ValueRef:
        """A dispatch that copies buffer tensor ``ref`` (NCHW) into a new texture tensor."""
        t: Tensor = self.values[ref]
        out = self.add_texture(t.shape, layout)
        texels = int(np.prod(self.values[out].extents()))
        self.add_dispatch(DispatchNode("gather_texture", [ref, out], gather_params(self.values[out], t), {0: 64},
                                       (dispatch_groups(texels, 64, self.max_groups_x), 1, 1), {"SRC_TEXTURE": 0}))
        return out

    def prepack_tensor(self, src: ValueRef, packer: str | Packer | None = None, name: str | None = None) -> ValueRef:
        """Add a prepack node packing TensorRef ``src`` (default packer: its block format if it
        is quantized, else identity); returns the packed device tensor. Source and destination
        are validated here, before any GPU work."""
        ref: TensorRef = self.values[src]
        if not isinstance(ref, TensorRef):
            raise TypeError(f"prepack needs a TensorRef, got {type(ref).__name__}")
        packer = get_packer(packer or ref.quant or "identity")
        if (src, packer.name) in self._packed and name is None:  # a weight two ops read is packed once
            return self._packed[(src, packer.name)]
        packer.validate_source(ref)
        dst = packer.make_dst(ref, name or f"{ref.name}:{packer.name}")
        packer.validate(ref, dst)
        self._check_bindable(ref, dst, packer)
        if dst.storage == "texture3d":
            self._check_texture(dst)
        dst_ref = self._add(dst, None)
        direct = packs_on_host(packer, self.device.host_visible_device_local, self.device.is_cpu,
                               self.device.renderer, self.config.prepack.host_packing)
        ref.readers += 1
        self.prepack_nodes.append(PrepackNode(src, dst_ref, packer, direct))
        self._packed[(src, packer.name)] = dst_ref
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
                "maxStorageBufferRange",
                f"tensor {ref.name!r} needs {max(ref.nbytes, dst.nbytes)} bytes in one binding ({exc}); "
                f"{self.device.name} binds at most {most}",
            ) from None

    def add_dispatch(self, node: DispatchNode) -> None:
        if self._execute is not None:
            raise VkGraphError("cannot add nodes after execute was encoded")
        node.entry = self._entry
        self.execute_nodes.append(node)

    @property
    def total_constant_nbytes(self) -> int:
        return sum(self.values[n.src].nbytes for n in self.prepack_nodes)

    # --- prepare and prepack ------------------------------------------------------------------

    def _require_device(self, what: str) -> None:
        if self.recording:
            raise VkGraphError(f"a recording graph has no device: it cannot {what}")

    def check_usable(self) -> None:
        """Raise if an earlier prepack or execute failed (the graph is then unusable)."""
        self._require_device("run")
        if self.failed:
            raise VkGraphError(f"the graph is unusable: {self.failed}")

    def prepare(self) -> None:
        """Compile and create every pipeline the graph needs (before any timing starts)."""
        self._require_device("prepare")
        for node in self.prepack_nodes:
            for texel in set(node.dispatch_kinds(self)):
                node.kernel(self, texel)
        for node in self.execute_nodes:
            node.kernel(self)
        self.kernels.save()

    @property
    def prepacked(self) -> bool:
        return self._prepacker.prepacked

    def encode_prepack(self) -> None:
        """Legacy path, step 1: encode every prepack node into one command buffer (not submitted)."""
        self._prepacker.encode_legacy()

    def prepack(self) -> LoadReport:
        """Legacy path, step 2: submit the one command buffer and wait. Encodes first if needed."""
        return self._prepacker.submit_legacy()

    def run_prepack(self, progress: ProgressFn | None = None) -> LoadReport:
        """Staged prepack (ARCHITECTURE.md §4): command buffers cut by the scheduler, submitted
        without waiting while the CPU stages the next batch; reduce-peak mode waits at every cut.

        With ``prepack.reduce_peak_memory = "auto"``, a staged load that runs out of device memory
        (a real allocation failure or ``device.max_memory_nbytes``) frees what it packed and runs
        again in reduce-peak mode, whose peak is the weights plus one batch of staging."""
        return self._prepacker.run(progress)

    # --- execute ------------------------------------------------------------------------------

    def encode_execute(self, profile: bool = False) -> None:
        """Bind memory for every non-constant tensor and IO staging, dispatch every pipeline once
        with no workgroups (drivers that compile at the first dispatch compile then: lavapipe),
        and record the execute command buffers once (split by the execute thresholds).
        ``profile``: with a timestamp after every dispatch (see :meth:`execute_profile`); only on
        the first call."""
        self.check_usable()
        if not self.prepacked:
            raise VkGraphError("prepack the graph (run_prepack() or prepack()) before encoding execute")
        if self._execute is None:
            self.prepare()
            plan = ExecutePlan(self, profile)
            try:
                plan.record()
            except BaseException:
                if self.failed:  # a fence timeout or a lost device: destroy() waits, then frees the plan
                    self._execute = plan
                else:
                    plan.destroy()
                raise
            self._execute = plan
        elif profile and self._execute.queries is None:
            raise VkGraphError("execute was already encoded without profiling")

    def execute_profile(self) -> dict[str, tuple[float, int]]:
        """GPU time of the last execute per op kind: {shader: (seconds, dispatches)}, largest
        first (the graph's execute must have been encoded with ``profile=True``)."""
        if self._execute is None:
            raise VkGraphError("nothing was executed yet")
        try:
            return self._execute.profile()
        except ValueError as exc:
            raise VkGraphError(str(exc)) from None

    def copy_into_staging(self, name: str, array: np.ndarray) -> None:
        self.encode_execute()
        self._execute.copy_into_staging(name, array)

    def copy_from_staging(self, name: str) -> np.ndarray:
        self.encode_execute()
        return self._execute.copy_from_staging(name)

    def execute(self, inputs: Mapping[str, np.ndarray] | None = None, entry: str = "") -> dict[str, np.ndarray]:
        """Run entry point ``entry``'s recorded command buffers on its ``inputs``; returns its
        outputs by name."""
        self.encode_execute()
        return self._execute.run(dict(inputs or {}), entry)

    @property
    def execute_command_buffers(self) -> int:
        """Command buffers of the default entry point's execute."""
        return len(self._execute.cmds[""]) if self._execute else 0

    def read_tensor(self, ref: ValueRef) -> np.ndarray:
        """The raw bytes of a device tensor (a texture's texels), for checks. An intermediate
        that later dispatches read shares memory with others (``execute.memory_planning``): after
        a run it may hold another tensor's bytes."""
        self._require_device("read tensors")
        t: Tensor = self.values[ref]
        if t.resource is None:
            raise VkGraphError(f"tensor {t.name!r} has no memory yet")
        return self.memory.read(t)

    # --- teardown -----------------------------------------------------------------------------

    def destroy(self) -> None:
        """Free everything the graph made (and its device, if it opened one). Idempotent."""
        if self.recording:
            return
        if self.device.alive:
            try:
                self.device.wait_idle()
            except DeviceLostError:
                pass  # nothing runs on a lost device any more: free everything
        self._prepacker.close()
        if self._execute is not None:
            self._execute.destroy()
            self._execute = None
        self.memory.destroy(v for v in self.values if isinstance(v, Tensor))
        self.kernels.destroy()
        self._prepacker.close_cache()  # after the imported buffers that use its pages
        if self._owns_device:
            self.device.destroy()
        elif self._saved_budget is not None:
            self.device.max_memory_nbytes, self._saved_budget = self._saved_budget, None

    def __enter__(self) -> ComputeGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
