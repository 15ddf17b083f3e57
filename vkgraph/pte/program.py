"""A loaded ExecuTorch program: one ComputeGraph per ET-VK delegate (as ET-VK builds them), all
on one device, loaded by staged prepack (or the legacy path, as the config says), and the
program's instruction chain run around them: delegate calls on the GPU, kernel calls by the
numpy kernels, moves, frees and jumps as ExecuTorch runs them."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..config import GraphConfig, load_config
from ..errors import PteFormatError, UnsupportedOpError, VkGraphError
from ..graph.compute_graph import ComputeGraph
from ..graph.report import LoadReport
from ..runtime import Device
from . import kernels
from .lower import Lowering, device_dtype, supported
from .reader import VULKAN_BACKEND, ExecutionPlan, PteFile, TensorInfo, VkGraphInfo

_MAX_STEPS = 1_000_000  # a chain of jumps that never ends is a malformed program


@dataclass(frozen=True)
class IOSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    dynamic: bool = False  # exported with dynamic shapes: ``shape`` holds their upper bounds, which vkgraph runs


@dataclass(frozen=True)
class OpUse:
    """One op of a program: where it runs and whether vkgraph supports it."""

    where: str  # "delegate 0" or "kernel"
    node: int
    name: str
    support: str  # "yes", "folded" (CPU, constant inputs only) or "" (not supported)

    @property
    def supported(self) -> bool:
        return bool(self.support)


def list_ops(path: str | os.PathLike) -> list[OpUse]:
    """Every op of a program (delegate ops in chain order, then the CPU kernels), without a device."""
    with PteFile(path) as pte:
        plan = pte.plan()
        out = []
        for k, d in enumerate(plan.delegates):
            if d.id != VULKAN_BACKEND:
                out.append(OpUse(f"delegate {k}", -1, d.id, ""))
                continue
            for op in pte.vkgraph(d).chain:
                out.append(OpUse(f"delegate {k}", op.node_id, op.name, supported(op.name)))
        for i, ins in enumerate(plan.instructions):
            if ins.kind == "kernel":
                name = plan.operators[ins.index]
                out.append(OpUse("kernel", i, name, "yes" if kernels.kernel(name) is not None else ""))
        return out


def _io(plan: ExecutionPlan, ids: list[int], what: str, path: str) -> list[IOSpec]:
    specs = []
    for k, i in enumerate(ids):
        v = plan.values[i]
        if v.kind != "tensor":
            raise UnsupportedOpError(f"{path}: {what} {k} is a {v.kind}; vkgraph runs programs whose inputs and "
                                     "outputs are tensors")
        specs.append(IOSpec(f"{what}_{k}", v.value.sizes, v.value.dtype, v.value.dynamic))
    return specs


def warn_storage(path: str, lowerings: list[Lowering]) -> None:
    """One warning per program whose delegates ask for textures that vkgraph computes in buffers,
    naming the ops it has no texture kernel for."""
    honoured, kept = 0, {}
    for lw in lowerings:
        n, ops = lw.storage()
        honoured += n
        for op, k in ops.items():
            kept[op] = kept.get(op, 0) + k
    if kept:
        n = sum(kept.values())
        names = ", ".join(f"{op} ({k})" for op, k in sorted(kept.items(), key=lambda kv: (-kv[1], kv[0])))
        warnings.warn(f"{path}: {n} of {n + honoured} tensors that the program asks to hold in textures are in buffers "
                      f"(ops vkgraph runs on buffers only: {names})", stacklevel=3)


def checked_delegates(pte: PteFile, plan: ExecutionPlan) -> list[VkGraphInfo]:
    """The VkGraph of every delegate, once every CPU kernel and delegate op is known to be supported
    (UnsupportedOpError naming the first that is not; nothing is built)."""
    for i, ins in enumerate(plan.instructions):
        if ins.kind == "kernel" and kernels.kernel(plan.operators[ins.index]) is None:
            raise UnsupportedOpError(f"{pte.path}: instruction {i}: CPU kernel {plan.operators[ins.index]!r} is not "
                                     "supported by vkgraph")
    infos = []
    for k, d in enumerate(plan.delegates):
        if d.id != VULKAN_BACKEND:
            raise UnsupportedOpError(f"{pte.path}: delegate {k} is for backend {d.id!r}; vkgraph runs "
                                     f"{VULKAN_BACKEND} delegates")
        infos.append(pte.vkgraph(d))
    for k, info in enumerate(infos):
        for op in info.chain:
            if not supported(op.name):
                raise UnsupportedOpError(f"{pte.path}: delegate {k}, node {op.node_id} ({op.name}): the op is not "
                                         "supported by vkgraph")
    return infos


def program_inputs(specs: list[IOSpec], npz: str | os.PathLike | None = None, seed: int = 0) -> list[np.ndarray]:
    """A program's inputs: ``input_0, input_1, ...`` of an .npz file, or seeded random arrays
    (floats standard normal, integers in [0, 8), booleans)."""
    if npz:
        with np.load(npz) as d:
            missing = [s.name for s in specs if s.name not in d.files]
            if missing:
                raise ValueError(f"{os.fspath(npz)}: no array named {', '.join(missing)} (the program takes "
                                 f"{', '.join(s.name for s in specs)})")
            return [d[s.name] for s in specs]
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        if s.dtype == np.bool_:
            out.append(rng.random(s.shape) < 0.5)
        elif s.dtype.kind in "iu":
            out.append(rng.integers(0, 8, s.shape).astype(s.dtype))
        else:
            out.append(rng.standard_normal(s.shape).astype(s.dtype))
    return out


def _merge(reports: list[LoadReport]) -> LoadReport:
    """One report for the delegates' loads (one after another): times and counts add up, peaks
    are the largest."""
    if len(reports) == 1:
        return reports[0]
    first = reports[0]
    merged = {}
    for f in dataclasses.fields(LoadReport):
        vals = [getattr(r, f.name) for r in reports]
        if f.name.startswith("peak") or f.name == "staging_allocated_nbytes":
            merged[f.name] = max(vals)
        elif isinstance(vals[0], bool) or isinstance(vals[0], str):
            merged[f.name] = vals[0]
        elif isinstance(vals[0], (int, float)):
            merged[f.name] = sum(vals)
        elif isinstance(vals[0], list):
            merged[f.name] = [x for v in vals for x in v]
        elif isinstance(vals[0], dict):
            merged[f.name] = {k: x for v in vals for k, x in v.items()}
        else:
            merged[f.name] = getattr(first, f.name)
    return LoadReport(**merged)


Execute = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class Chain:
    """The instruction chain of ``plan`` run once: delegate ``k`` through ``delegates[k]`` (its
    lowering, which names its graph inputs and outputs, and the function that executes its graph),
    CPU kernels in numpy, moves and jumps as ExecuTorch runs them."""

    def __init__(self, pte: PteFile, plan: ExecutionPlan, delegates: list[tuple[Lowering, Execute]]):
        self.pte, self.plan, self.delegates = pte, plan, delegates

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        plan = self.plan
        values: list[Any] = [self._initial(v) for v in plan.values]
        for i, a in zip(plan.inputs, arrays):
            values[i] = a
        pc = steps = 0
        while pc < len(plan.instructions):
            steps += 1
            if steps > _MAX_STEPS:
                raise PteFormatError(f"{self.pte.path}: the instruction chain ran {_MAX_STEPS} steps without ending")
            ins = plan.instructions[pc]
            pc += 1
            if ins.kind == "delegate":
                self._delegate(ins.index, ins.args, values)
            elif ins.kind == "kernel":
                self._kernel(plan.operators[ins.index], ins.args, values, pc - 1)
            elif ins.kind == "move":
                values[ins.target] = values[ins.index]
            elif ins.kind == "jump_false":
                if not bool(np.asarray(values[ins.index]).item()):
                    pc = ins.target
        return [np.asarray(values[i]) for i in plan.outputs]

    def _initial(self, v) -> Any:
        if v.kind == "tensor":
            t: TensorInfo = v.value
            return None if t.data is None else self.pte.array(*t.data, t.dtype, t.sizes)
        return v.value

    def _delegate(self, k: int, args: tuple[int, ...], values: list[Any]) -> None:
        lowering, execute = self.delegates[k]
        n_in = len(lowering.inputs)
        feeds = {}
        for name, i, vi in zip(lowering.inputs, args[:n_in], lowering.info.input_ids):
            a = values[i]
            if a is None:
                raise VkGraphError(f"{self.pte.path}: delegate {k} reads value {i} before anything wrote it")
            t = lowering.info.values[vi].value
            feeds[name] = np.ascontiguousarray(np.asarray(a).astype(device_dtype(t.dtype))).reshape(t.dims)
        got = execute(feeds)
        for name, i, vi in zip(lowering.outputs, args[n_in:], lowering.info.output_ids):
            t = lowering.info.values[vi].value
            pv = self.plan.values[i]  # the program's dtype wins (ET-VK declares argmax's int64 as int32)
            dtype = pv.value.dtype if pv.kind == "tensor" else t.dtype
            y = got[name]
            if dtype == np.bool_:
                y = y != 0
            elif dtype.kind in "iu" and y.dtype.kind == "f":
                y = np.rint(y)
            values[i] = y.astype(dtype).reshape(t.dims)

    def _kernel(self, op: str, args: tuple[int, ...], values: list[Any], at: int) -> None:
        fn = kernels.kernel(op)
        plan = self.plan
        # the last argument is what the kernel returns: a tensor, or a list of several; an out
        # variant also passes each output before it (ExecuTorch's emitter)
        ret = plan.values[args[-1]]
        outs = tuple(ret.value) if ret.kind == "tensor_list" else args[-1:]
        ins = args[:-1 - len(outs)] if ret.kind == "tensor_list" or (len(args) > 1 and args[-2] == args[-1]) else args[:-1]
        vals = []
        for i in ins:
            v = plan.values[i]
            if v.kind in ("tensor_list", "optional_tensor_list", "int_list"):  # lists of value indices
                vals.append([None if j < 0 else values[j] for j in v.value])
            else:
                vals.append(values[i])
        try:
            result = fn(*vals)
        except (ValueError, TypeError, IndexError) as exc:
            raise VkGraphError(f"{self.pte.path}: instruction {at} ({op}) failed: {exc}") from None
        results = result if isinstance(result, tuple) else (result,)
        if len(results) < len(outs):
            raise VkGraphError(f"{self.pte.path}: instruction {at} ({op}) gave {len(results)} outputs, the program "
                               f"takes {len(outs)}")
        for o, r in zip(outs, results):
            t = plan.values[o].value
            r = np.asarray(r)
            values[o] = r.astype(t.dtype).reshape(t.sizes) if isinstance(t, TensorInfo) else r


class Program:
    """An ExecuTorch program loaded on a device. Use :func:`load_program`."""

    def __init__(self, path: str | os.PathLike, config: GraphConfig | None = None, device: Device | None = None,
                 *, legacy: bool = False):
        self.path = os.fspath(path)
        self.config = config if config is not None else load_config()
        self.pte = PteFile(self.path)
        self.graphs: list[tuple[ComputeGraph, Lowering]] = []
        self._device = device
        self._owns_device = False
        try:
            self.plan = self.pte.plan()
            self.inputs = _io(self.plan, self.plan.inputs, "input", self.path)
            self.outputs = _io(self.plan, self.plan.outputs, "output", self.path)
            infos = checked_delegates(self.pte, self.plan)
            if self._device is None:
                self._device = Device(self.config.device.prefer or None, validation=self.config.device.validation,
                                      max_memory_nbytes=self.config.device.max_memory_nbytes)
                self._owns_device = True
            for k, info in enumerate(infos):
                g = ComputeGraph(self.config, device=self._device)
                self.graphs.append((g, None))  # destroyed on failure, even half-built
                lowering = Lowering(g, self.pte, info, f"d{k}")
                lowering.build()
                self.graphs[-1] = (g, lowering)
            warn_storage(self.path, [lw for _, lw in self.graphs])
            reports = []
            for g, _ in self.graphs:
                if legacy:
                    g.encode_prepack()
                    reports.append(g.prepack())
                else:
                    reports.append(g.run_prepack())
            self.report = _merge(reports) if reports else None
        except BaseException:
            self.close()
            raise

    @property
    def device(self) -> Device:
        return self._device

    def _check_inputs(self, arrays: tuple[Any, ...]) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"{self.path}: the program takes {len(self.inputs)} inputs "
                             f"({', '.join(f'{s.name} {s.shape} {s.dtype}' for s in self.inputs)}), got {len(arrays)}")
        out = []
        for spec, a in zip(self.inputs, arrays):
            a = np.asarray(a)
            if a.shape != spec.shape or a.dtype != spec.dtype:
                dynamic = (" (the program was exported with dynamic shapes; vkgraph runs it at their upper bounds, "
                           "the sizes it holds)") if spec.dynamic else ""
                raise ValueError(f"{self.path}: {spec.name} must be {spec.shape} {spec.dtype}, got {a.shape} {a.dtype}"
                                 + dynamic)
            out.append(a)
        return out

    def run(self, *arrays: Any) -> list[np.ndarray]:
        """Run the program's forward method on ``arrays`` (its inputs, in order); returns its outputs."""
        if self.pte.mapping is None:
            raise VkGraphError(f"{self.path}: the program was closed")
        return Chain(self.pte, self.plan, [(lw, g.execute) for g, lw in self.graphs]).run(self._check_inputs(arrays))

    def close(self) -> None:
        """Free every graph and the device it opened; unmap the file. Idempotent."""
        for g, _ in self.graphs:
            g.destroy()
        self.graphs = []
        if self._owns_device and self._device is not None:
            self._device.destroy()
            self._device = None
        self.pte.close()

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ProgramModel:
    """A program opened for ``vkgraph bench load``, ``simulate`` and ``tune`` (the model
    registry's kind "pte"): :meth:`build` puts every delegate into one graph, so that graph's
    prepack is the program's whole load; :meth:`run` runs the chain on that graph (each delegate
    call executes the graph with that delegate's inputs: delegates share no tensors)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.pte = PteFile(self.path)
        try:
            self.plan = self.pte.plan()
            self.inputs = _io(self.plan, self.plan.inputs, "input", self.path)
            self.infos = checked_delegates(self.pte, self.plan)
        except BaseException:
            self.pte.close()
            raise
        self.lowerings: list[Lowering] = []

    def build(self, g: ComputeGraph) -> None:
        self.lowerings = []
        for k, info in enumerate(self.infos):
            lowering = Lowering(g, self.pte, info, f"d{k}")
            lowering.build()
            self.lowerings.append(lowering)
        warn_storage(self.path, self.lowerings)

    def run(self, g: ComputeGraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
        feeds = {name: np.zeros(g.values[io.tensor].shape, g.values[io.tensor].dtype) for name, io in g.inputs.items()}

        def execute(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            feeds.update(f)
            return g.execute(feeds)

        return Chain(self.pte, self.plan, [(lw, execute) for lw in self.lowerings]).run(arrays)

    def close(self) -> None:
        self.pte.close()

    def __enter__(self) -> ProgramModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_program(path: str | os.PathLike, config: GraphConfig | None = None, device: Device | None = None) -> Program:
    """Load an ExecuTorch program (.pte) exported with ET-VK's VulkanPartitioner: read it, check
    every op, build one graph per delegate and pack its weights (staged prepack, the packed cache
    when the config names one). ``device``: a shared :class:`~vkgraph.runtime.Device` (default:
    one opened from ``config.device`` and closed with the program)."""
    return Program(path, config, device)
