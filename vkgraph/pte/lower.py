"""A VkGraph (one ET-VK delegate) becomes a ComputeGraph: constants become TensorRefs over the
mapped file (packed by prepack nodes), and each OperatorCall goes through :data:`OPS`, the one
table from ET-VK op names to vkgraph op builders.

Conventions (ARCHITECTURE.md §7): every device tensor is a float32 buffer (bool as 0.0/1.0, an
int8 activation as its integer value) except int32 ids that a graph receives or an embedding
reads; a reshape is a view (no copy).
Ops whose inputs are all constants are folded on the CPU by the numpy kernels
(:mod:`.kernels`). The last argument of an OperatorCall is its output (a value list for
several)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import ops
from ..errors import UnsupportedOpError
from ..graph.compute_graph import ComputeGraph
from ..graph.values import TEXTURE_LAYOUTS, ArraySource, LazySource, Tensor, ValueRef
from . import kernels
from .reader import OperatorCall, PteFile, VkGraphInfo

FOLD_MAX_ELEMENTS = 1 << 20  # constant folding on the CPU is for masks and small tables
_INT = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.int16), np.dtype(np.int8), np.dtype(np.uint8))
#: constants read in place from the file (others are converted when packed)
_IN_PLACE = (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int8), np.dtype(np.uint8))


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a graph input of ``dtype`` has on the device."""
    return np.dtype(np.int32) if np.dtype(dtype) in _INT else np.dtype(np.float32)


class Lowering:
    """Builds one delegate's nodes into ``g``; ``inputs``/``outputs`` name its IO in order."""

    def __init__(self, g: ComputeGraph, pte: PteFile, info: VkGraphInfo, label: str):
        self.g, self.pte, self.info, self.label = g, pte, info, label
        self.refs: dict[int, ValueRef] = {}  # VkValue index -> device tensor (or TensorRef for constants)
        self.consts: dict[int, np.ndarray] = {}  # folded values
        self.same: dict[int, int] = {}  # et_vk.prepack output -> the constant it copies
        self.qweights: dict[int, QuantWeight] = {}  # dequantize_affine outputs, dequantized only if needed
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.node: OperatorCall | None = None
        self.textures: dict[tuple[int, str], ValueRef] = {}  # (value, layout) -> the texture an op on textures read
        self.buffers: dict[int, ValueRef] = {}  # value held in a texture -> its copy in a buffer, for buffer ops
        #: values the delegate asks to hold in textures -> the op that computed them (see storage())
        self.asked_textures: dict[int, str] = {}
        self.symints: dict[int, ValueRef] = {}  # SymInt read from a tensor at run time -> that (int32) tensor

    # --- values -------------------------------------------------------------------------------

    def vk(self, i: int):
        return self.info.values[i]

    def dims(self, i: int) -> tuple[int, ...]:
        return self.vk(i).value.dims

    def arg(self, i: int) -> Any:
        """A non-tensor argument as a Python value (None for null)."""
        v = self.vk(i)
        if v.kind == "tensor":
            raise self.error(f"argument {i} is a tensor where a {v.kind} was expected")
        return v.value

    def const(self, i: int) -> np.ndarray | None:
        """The value of tensor ``i`` when it is known on the CPU (a constant or a folded op)."""
        i = self.same.get(i, i)
        if i in self.qweights and i not in self.consts:  # read as float32 by something other than a linear
            self.consts[i] = self.qweights[i].dequantize(self)
        if i in self.consts:
            return self.consts[i]
        t = self.vk(i).value
        if self.vk(i).kind == "tensor" and t.constant_id >= 0:
            off, _ = self.info.constants[t.constant_id]
            nbytes = int(np.prod(t.dims, dtype=np.int64)) * t.dtype.itemsize
            return self.pte.array(off, nbytes, t.dtype, t.dims)
        return None

    def weight(self, i: int) -> ValueRef:
        """A constant as a TensorRef (ops pack it as they need: linear 4x4, conv2d, identity);
        a runtime tensor as itself."""
        i = self.same.get(i, i)
        if i in self.refs:
            return self.refs[i]
        t = self.vk(i).value
        arr = self.const(i)
        if arr is None:
            raise self.error(f"value {i} is used before any op computed it")
        name = f"{self.label}.c{t.constant_id}" if t.constant_id >= 0 and i not in self.consts else f"{self.label}.v{i}"
        if t.constant_id >= 0 and i not in self.consts and t.dtype in _IN_PLACE:
            off, _ = self.info.constants[t.constant_id]
            src = ArraySource(arr, mapping=self.pte.mapping, offset=off, path=self.pte.path, importable=True)
            ref = self.g.add_tensorref(src, name, shape=t.dims, dtype=t.dtype)
        else:  # folded, or stored in another dtype: int32 for integers, float32 for the rest (bool as 0/1)
            want = np.int32 if t.dtype in _INT and np.asarray(arr).dtype.kind in "iu" else np.float32
            if t.constant_id >= 0 and i not in self.consts:
                ref = self.g.add_tensorref(LazySource(int(np.prod(t.dims)) * 4, lambda a=arr, w=want: a.astype(w)),
                                           name, shape=t.dims, dtype=want)
            else:
                ref = self.g.add_tensorref(np.ascontiguousarray(np.asarray(arr).astype(want)).reshape(t.dims), name)
        self.refs[i] = ref
        return ref

    def operand(self, i: int, layout: str | None = None) -> ValueRef:
        """A float32 operand of an elementwise op or matmul: a float32 constant as its TensorRef
        (packed where the op reads it), anything else as a float32 device tensor (as
        :meth:`src`)."""
        if self.const(i) is not None:
            ref = self.weight(i)
            if self.g.values[ref].dtype == np.float32:
                return ref
        return self.src(i, layout)

    def texture_layout(self, i: int) -> str | None:
        """The texture layout tensor ``i`` is held in, None for a buffer: the storage and layout
        the delegate asks for it (its own, else the graph's overrides; the config's
        ``graph.storage`` and ``graph.memory_layout`` override both), where vkgraph can hold it
        in a texture (float or bool, 1-4 dims, within the device's image size)."""
        if self.asked_storage(i) != "texture3d":
            return None  # a buffer, or texture2d: vkgraph has no 2-D texture kernels
        t = self.vk(i).value
        layout = self.g.config.graph.memory_layout or t.layout or self.info.layout_override or "channels_packed"
        if layout not in TEXTURE_LAYOUTS or t.dtype.kind not in "fb" or not 1 <= len(t.dims) <= 4 or 0 in t.dims:
            return None
        probe = Tensor("", t.dims, np.dtype(np.float32), layout, storage="texture3d")
        return layout if max(probe.extents()) <= self.g.device.limits["maxImageDimension3D"] else None

    def asked_storage(self, i: int) -> str:
        """The storage the config's ``graph.storage``, else the delegate asks for tensor ``i``:
        its own, else the delegate's override ("" when none, and for non-tensors)."""
        v = self.vk(i)
        return (self.g.config.graph.storage or v.value.storage or self.info.storage_override) if v.kind == "tensor" else ""

    def gather(self, out: int, x: int, strides: Sequence[int], base: int = 0) -> None:
        """Tensor ``out`` (its dims) gathered from tensor ``x`` by strides over x's contiguous
        elements (:func:`ops.gather`): a texture where ``out`` is asked to be one, read from x
        as it is held (a buffer or a texture), else a buffer."""
        lay = self.texture_layout(out)
        self.set(out, ops.gather(self.g, self.held(x) if lay else self.t(x), self.dims(out), strides, base, lay))

    def held(self, i: int) -> ValueRef:
        """Tensor ``i`` as float32 on the device in the storage it is held in (a texture or a buffer)."""
        ref = self.refs.get(self.same.get(i, i))
        if ref is not None and isinstance(self.g.values[ref], Tensor) and self.g.values[ref].storage == "texture3d":
            return ref
        return self.t(i)

    def src(self, i: int, layout: str | None = None) -> ValueRef:
        """Tensor ``i`` as the input of an op on buffers (``layout`` None: :meth:`t`) or on
        textures: a texture as it is (those ops read any layout), a buffer converted into
        ``layout`` once."""
        if layout is None:
            return self.t(i)
        i = self.same.get(i, i)
        ref = self.held(i)
        if self.g.values[ref].storage == "texture3d":
            return ref
        if (i, layout) not in self.textures:
            self.textures[(i, layout)] = self.g.buffer_to_texture(self.t(i), layout)
        return self.textures[(i, layout)]

    def vector(self, i: int, n: int, name: str) -> ValueRef:
        """Constant ``i`` as ``n`` float32 values: ET-VK pads per-channel scales and biases to a
        multiple of 4; the padding is cut off here."""
        arr = self.const(i)
        if arr is None or arr.size < n:
            raise self.error(f"{name} (value {i}) must be a constant of at least {n} values")
        if arr.size == n and arr.dtype == np.float32:
            return self.weight(i)
        return self.derived(f"{name}{i}", lambda: arr.reshape(-1)[:n])

    def derived(self, name: str, make: Callable[[], np.ndarray]) -> ValueRef:
        """A float32 constant computed from constants on the CPU, made once per delegate and name."""
        key = f"{self.label}.{name}"
        ref = self.g.names.get(key)
        if ref is None:
            ref = self.g.add_tensorref(np.ascontiguousarray(make(), np.float32), key)
        return ref

    def t(self, i: int) -> ValueRef:
        """Tensor ``i`` on the device as float32."""
        i = self.same.get(i, i)
        ref = self.refs.get(i)
        if ref is None or not isinstance(self.g.values[ref], Tensor):
            ref = self.g.prepack_tensor(self.weight(i))
            self.refs[i] = ref
        if self.g.values[ref].storage == "texture3d":  # an op on buffers reads a texture: a copy, made once
            if i not in self.buffers:
                self.buffers[i] = self.g.texture_to_buffer(ref)
            ref = self.buffers[i]
        if self.g.values[ref].dtype != np.float32:
            ref = ops.cast(self.g, ref, np.float32)
        return ref

    def ids(self, i: int) -> ValueRef:
        """Tensor ``i`` on the device as int32 (indices)."""
        i = self.same.get(i, i)
        ref = self.refs.get(i)
        if ref is None or not isinstance(self.g.values[ref], Tensor):
            ref = self.g.prepack_tensor(self.weight(i))
        return ops.cast(self.g, ref, np.int32)

    def set(self, i: int, ref: ValueRef) -> None:
        """Tensor ``i`` is ``ref``, viewed in ``i``'s dims when they differ (a texture is copied
        into a buffer first: a texture has no views)."""
        want = self.dims(i)
        if tuple(self.g.values[ref].shape) != want:
            if self.g.values[ref].storage == "texture3d":
                ref = self.g.texture_to_buffer(ref)
            ref = self.g.add_view(ref, want)
        self.refs[i] = ref
        if self.node is not None and self.asked_storage(i) in ("texture3d", "texture2d"):
            self.asked_textures[i] = self.node.name

    def error(self, reason: str) -> UnsupportedOpError:
        node = self.node
        at = f"node {node.node_id} ({node.name})" if node else "graph"
        return UnsupportedOpError(f"{self.pte.path}: delegate {self.label}, {at}: {reason}")

    # --- building -----------------------------------------------------------------------------

    def build(self) -> None:
        info, g = self.info, self.g
        for k, i in enumerate(info.input_ids):
            t = self.vk(i).value
            name = f"{self.label}.input_{k}"
            self.refs[i] = g.add_input(t.dims, device_dtype(t.dtype), name)
            self.inputs.append(name)
        for node in info.chain:
            self.node = node
            self.lower(node)
        self.node = None
        for k, i in enumerate(info.output_ids):
            name = f"{self.label}.output_{k}"
            ref = self.refs.get(i)
            if ref is None or not isinstance(g.values[ref], Tensor):
                ref = self.t(i)
            g.set_output(ref, name)
            self.outputs.append(name)

    def storage(self) -> tuple[int, dict[str, int]]:
        """How the storage the delegate asks for was honoured: the number of tensors computed in
        the textures they ask for, and per op, how many it computed in buffers instead (vkgraph
        has no texture kernel for it, or the tensor cannot be one)."""
        kept: dict[str, int] = {}
        honoured = 0
        for i, op in self.asked_textures.items():
            if self.g.values[self.refs[i]].storage == "texture3d":
                honoured += 1
            else:
                kept[op] = kept.get(op, 0) + 1
        return honoured, kept

    def lower(self, node: OperatorCall) -> None:
        args = node.args
        if self._fold(node):
            return
        handler = OPS.get(node.name)
        if handler is None:
            if kernels.kernel(node.name) is not None:
                raise self.error("vkgraph computes this op only from constants (folded on the CPU); here an "
                                 "input is computed at run time")
            raise self.error("the op is not supported by vkgraph")
        try:
            handler(self, *args)
        except UnsupportedOpError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, ArithmeticError) as exc:
            raise self.error(f"{type(exc).__name__}: {exc}") from None

    def _fold(self, node: OperatorCall) -> bool:
        fn = kernels.kernel(node.name)
        if fn is None or node.name in NEVER_FOLD:
            return False
        *ins, out = node.args
        values = []
        for i in ins:
            v = self.vk(i)
            if v.kind == "tensor":
                c = self.const(i)
                if c is None:
                    if node.name in SHAPE_ONLY:  # full_like: only the shape of its input matters
                        c = np.zeros(self.dims(i), np.float32)
                    else:
                        return False
                values.append(c)
            elif v.kind == "value_list":
                items = [self.const(j) for j in v.value]
                if any(c is None for c in items):
                    return False
                values.append(items)
            else:
                values.append(v.value)
        outs = self.vk(out).value if self.vk(out).kind == "value_list" else (out,)
        if sum(int(np.prod(self.dims(o))) for o in outs) > FOLD_MAX_ELEMENTS:
            return False
        result = fn(*values)
        results = result if isinstance(result, tuple) else (result,)
        for o, r in zip(outs, results):
            t = self.vk(o).value
            self.consts[o] = np.asarray(r).astype(t.dtype).reshape(t.dims)
        return True


@dataclass(frozen=True)
class QuantWeight:
    """A weight ``[N, K]`` quantized in groups along K, kept quantized for ``ops.linear_qw``:
    ``bits`` 4 (uint8 ``[N, K/2]``, ET-VK's q4gsw) or 8 (int8 ``[N, K]``); scales ``[groups, N]``
    when ``scales_gn`` (ET-VK) else ``[N, groups]`` (torchao); optional zero points; 4-bit pairs
    with even k in the high nibble when ``high_first`` (ET-VK's qcs4w)."""

    q: int
    scales: int
    zeros: int | None
    group: int
    bits: int
    scales_gn: bool
    high_first: bool = False

    def dequantize(self, L: Lowering) -> np.ndarray:
        q = np.asarray(L.const(self.q))
        if self.bits == 4:
            q8 = np.empty((q.shape[0], q.shape[1] * 2), np.int8)
            lo, hi = (q & 0xF).astype(np.int8) - 8, (q >> 4).astype(np.int8) - 8
            q8[:, ::2], q8[:, 1::2] = (hi, lo) if self.high_first else (lo, hi)
            q = q8
        n, k = q.shape
        groups = -(-k // self.group)
        sc = np.asarray(L.const(self.scales), np.float32)
        # ET-VK pads N (of [groups, N], or of per-channel [N]) to a multiple of 4
        s = sc.reshape(groups, -1)[:, :n].T if self.scales_gn else sc.reshape(-1)[:n * groups].reshape(n, groups)
        z = 0.0 if self.zeros is None else np.asarray(L.const(self.zeros), np.float32).reshape(-1)[:n * groups].reshape(s.shape)
        g = np.arange(k) // self.group
        return ((q.astype(np.float32) - (z[:, g] if self.zeros is not None else 0.0)) * s[:, g]).astype(np.float32)


def _linear_quant(L: Lowering, x: ValueRef, qw: QuantWeight, b: int | None, layout: str | None = None) -> ValueRef:
    """``x @ dequantized(qw).T (+ b)`` for device tensor ``x`` (last dim K), the weight kept
    quantized on the device; the result has x's leading dims (with ``layout="width_packed"``
    a texture, x as it is held: see :func:`_quant_input`)."""
    dims = L.g.values[x].shape
    flat = x if layout else L.g.add_view(x, (int(np.prod(dims[:-1])), dims[-1]))
    n = L.dims(qw.q)[0]
    scales = L.const(qw.scales)
    if qw.scales_gn and scales.ndim == 2 and scales.shape[1] != n:  # ET-VK pads the N of [groups, N] to 4
        scales = L.derived(f"scales{qw.scales}", lambda: scales[:, :n])
    else:
        scales = L.vector(qw.scales, n if not qw.scales_gn and scales.ndim == 1 else scales.size, "scales")
    zeros = None if qw.zeros is None else L.derived(f"zp{qw.zeros}", lambda: L.const(qw.zeros))
    bias = None if b is None or L.vk(b).kind == "null" else L.vector(b, n, "bias")
    y = ops.linear_qw(L.g, flat, L.weight(qw.q), scales, bits=qw.bits, group_size=qw.group,
                      scales_gn=qw.scales_gn, zero_points=zeros, bias=bias, high_first=qw.high_first, layout=layout)
    return y if layout else L.g.add_view(y, (*dims[:-1], n))


def _set_linear_quant(L: Lowering, out: int, x: int, qw: QuantWeight, b: int | None) -> None:
    """Tensor ``out`` = tensor ``x`` @ dequantized(qw).T (+ b): on width-packed textures when
    ``out`` is asked to be one, else on buffers."""
    if len(L.dims(x)) <= 4 and L.texture_layout(out) == "width_packed":
        L.set(out, _linear_quant(L, L.held(x), qw, b, "width_packed"))
    else:
        L.set(out, _linear_quant(L, L.t(x), qw, b))


def _linear_q4gsw(L: Lowering, x: int, w: int, scales: int, group: int, bias: int, out: int) -> None:
    _set_linear_quant(L, out, x, QuantWeight(w, scales, None, int(L.arg(group)), 4, True), bias)


def _linear_dq8ca_q4gsw(L: Lowering, x: int, x_scale: int, x_zero: int, w: int, w_sums: int, scales: int, group: int,
                        bias: int, out: int) -> None:
    # ET-VK's reference (custom_ops_lib.py) is the weight-only linear: the int8 activation
    # quantization only approximates it, so vkgraph runs x in float32 against the int4 weights.
    _linear_q4gsw(L, x, w, scales, group, bias, out)


def _per_channel(L: Lowering, x: int, w: int, scales: int, bias: int | None, out: int, bits: int) -> None:
    """x @ w.T with w quantized per output channel (one group of all K): int8 ``[N, K]`` or
    4-bit pairs ``[N, K/2]`` (ET-VK's qcs4w: even k in the high nibble)."""
    k = L.dims(x)[-1]
    qw = QuantWeight(L.same.get(w, w), L.same.get(scales, scales), None, k, bits, False, bits == 4)
    _set_linear_quant(L, out, x, qw, bias)


def _weight_int8pack_mm(L: Lowering, x: int, w: int, scales: int, out: int) -> None:
    _per_channel(L, x, w, scales, None, out, 8)


def _linear_qcs4w(L: Lowering, x: int, w: int, scales: int, out: int) -> None:
    _per_channel(L, x, w, scales, None, out, 4)


def _dequantize_per_channel(L: Lowering, x: int, scale: int, zero: int, axis: int, qmin: int, qmax: int,
                            *rest: int) -> None:
    """quantized_decomposed.dequantize_per_channel of a constant int8 weight along axis 0: kept
    quantized for the linear that reads it (any other reader gets it dequantized)."""
    xi = L.same.get(x, x)
    if L.const(xi) is None or len(L.dims(x)) != 2 or int(L.arg(axis)) % 2 != 0 or L.vk(xi).value.dtype != np.int8:
        raise L.error("dequantize_per_channel is supported for constant int8 [N, K] weights along axis 0, not "
                      f"{L.dims(x)} {L.vk(xi).value.dtype} along axis {L.arg(axis)}")
    zeros = None if L.vk(zero).kind == "null" or not np.any(L.const(zero)) else L.same.get(zero, zero)
    L.qweights[rest[-1]] = QuantWeight(xi, L.same.get(scale, scale), zeros, L.dims(x)[1], 8, False)


def _qparam(L: Lowering, i: int, what: str) -> float:
    """A quantization scale or zero point: a scalar argument, or a one-element constant tensor."""
    v = L.vk(i)
    if v.kind != "tensor":
        return float(v.value)
    c = L.const(i)
    if c is None or c.size != 1:
        raise L.error(f"the {what} (value {i}) must be a constant scalar; a scale computed at run time "
                      "(dynamic quantization) is not supported here")
    return float(c.reshape(-1)[0])


def _quantize(L: Lowering, ref: ValueRef, scale: float, zero: float, qmin: float = -128, qmax: float = 127) -> ValueRef:
    """The int8 value of float ``ref`` (a float32 tensor holding integers: vkgraph keeps quantized
    activations as floats, exact for 8-bit values)."""
    return ops.unary(L.g, ref, "quantize", 1.0 / scale, zero, qmin, qmax)


def _dequantize(L: Lowering, ref: ValueRef, scale: float, zero: float) -> ValueRef:
    return ops.unary(L.g, ref, "affine", scale, -zero * scale)


def _quantize_per_tensor(L: Lowering, x: int, scale: int, zero: int, qmin: int, qmax: int, dtype: int,
                         out: int) -> None:
    L.set(out, _quantize(L, L.t(x), _qparam(L, scale, "scale"), _qparam(L, zero, "zero point"),
                         float(L.arg(qmin)), float(L.arg(qmax))))


def _dequantize_per_tensor(L: Lowering, x: int, scale: int, zero: int, qmin: int, qmax: int, dtype: int,
                           *rest: int) -> None:
    L.set(rest[-1], _dequantize(L, L.t(x), _qparam(L, scale, "scale"), _qparam(L, zero, "zero point")))


def _linear_q8ta_q8csw(L: Lowering, x: int, x_scale: int, x_zero: int, w: int, w_sums: int, w_scales: int, bias: int,
                       out: int) -> None:
    """int8 static activations x int8 per-channel weights (ET-VK's PT2E flow): x is quantized and
    dequantized as the integer kernel sees it, then multiplied with the int8 weights."""
    s, z = _qparam(L, x_scale, "input scale"), _qparam(L, x_zero, "input zero point")
    xq = _dequantize(L, _quantize(L, L.t(x), s, z), s, z)
    qw = QuantWeight(L.same.get(w, w), L.same.get(w_scales, w_scales), None, L.dims(w)[1], 8, False)
    L.set(out, _linear_quant(L, xq, qw, bias))


def _q8ta_linear(L: Lowering, x: int, x_scale: int, x_zero: int, w: int, w_sums: int, w_scales: int, o_scale: int,
                 o_zero: int, bias: int, activation: int, out: int) -> None:
    """A linear between int8 activations (ET-VK's q8ta_linear / q8ta_linear_gemv): dequantize the
    input, int8 per-channel weights, bias, optional relu, quantize the output."""
    s, z = _qparam(L, x_scale, "input scale"), _qparam(L, x_zero, "input zero point")
    qw = QuantWeight(L.same.get(w, w), L.same.get(w_scales, w_scales), None, L.dims(w)[1], 8, False)
    _q8ta_output(L, _linear_quant(L, _dequantize(L, L.t(x), s, z), qw, bias), L.arg(activation), o_scale, o_zero,
                 out)


def _q8ta_output(L: Lowering, y: ValueRef, act: str | None, o_scale: int, o_zero: int, out: int) -> None:
    """The end of a q8ta op: its activation ("none" or "relu"), then the output quantized."""
    if act not in ("none", "relu", None):
        raise L.error(f"activation {act!r} is not supported")
    if act == "relu":
        y = ops.unary(L.g, y, "relu")
    L.set(out, _quantize(L, y, _qparam(L, o_scale, "output scale"), _qparam(L, o_zero, "output zero point")))


def _q8ta_add(L: Lowering, a: int, b: int, a_scale: int, a_zero: int, b_scale: int, b_zero: int, o_scale: int,
              o_zero: int, alpha: int, out: int) -> None:
    da = _dequantize(L, L.t(a), _qparam(L, a_scale, "scale"), _qparam(L, a_zero, "zero point"))
    db = _dequantize(L, L.t(b), _qparam(L, b_scale, "scale"), _qparam(L, b_zero, "zero point"))
    _q8ta_output(L, ops.binary(L.g, da, db, "add", float(L.arg(alpha))), None, o_scale, o_zero, out)


def _q8ta_relu(L: Lowering, x: int, x_scale: int, x_zero: int, o_scale: int, o_zero: int, out: int) -> None:
    y = _dequantize(L, L.t(x), _qparam(L, x_scale, "scale"), _qparam(L, x_zero, "zero point"))
    _q8ta_output(L, y, "relu", o_scale, o_zero, out)


def _q8ta_conv(kind: str) -> Callable:
    """ET-VK's int8 convolutions (q8ta_conv2d, _pw, _dw, _transposed): the input dequantized, the
    int8 weights (in ET-VK's im2col layouts) turned back into float32 OIHW (IOHW when transposed)
    on the CPU, a float convolution, optional relu, the output quantized."""
    transposed = kind == "transposed"

    def build(L: Lowering, x: int, x_scale: int, x_zero: int, w: int, w_sums: int, w_scales: int, o_scale: int,
              o_zero: int, bias: int, ksize: int, stride: int, pad: int, *rest: int) -> None:
        out_pad, dil, groups, act, out = rest if transposed else (None, *rest)
        n, cin, h, wd = L.dims(x)
        cout = L.dims(out)[1]
        grp = int(L.arg(groups))
        kh, kw = (int(k) for k in L.arg(ksize))
        q, sc = L.const(w), L.const(w_scales)
        if q is None or sc is None:
            raise L.error("the int8 convolution weights and scales must be constants")

        def weight() -> np.ndarray:
            scale = np.asarray(sc, np.float32).reshape(-1)[:cout]
            if kind == "dw":  # [KH, KW, OC] -> [OC, 1, KH, KW]
                return (q.reshape(kh, kw, -1)[:, :, :cout].transpose(2, 0, 1) * scale[:, None, None])[:, None]
            cin_g = cin // grp
            m = q.reshape(q.shape[0], -1)[:cout, :kh * kw * cin_g].astype(np.float32) * scale[:, None]
            if not transposed:  # [OC, KH*KW*ICg] (kh, kw, ic) -> OIHW
                return m.reshape(cout, kh, kw, cin_g).transpose(0, 3, 1, 2)
            cout_g = cout // grp  # [groups*OCg, KH*KW*ICg] -> [IC, OCg, KH, KW]
            return m.reshape(grp, cout_g, kh, kw, cin_g).transpose(0, 4, 1, 2, 3).reshape(cin, cout_g, kh, kw)

        wref = L.derived(f"qconv{L.node.node_id}", weight)
        b = None if L.vk(bias).kind == "null" else L.vector(bias, cout, "bias")
        xd = _dequantize(L, L.t(x), _qparam(L, x_scale, "input scale"), _qparam(L, x_zero, "input zero point"))
        st, pd, dl = _pair(L.arg(stride), 1), _pair(L.arg(pad), 0), _pair(L.arg(dil), 1)
        if transposed:
            y = ops.conv_transpose2d(L.g, xd, wref, b, L.dims(out)[-2:], stride=st, padding=pd, dilation=dl, groups=grp)
        else:
            y = ops.to_buffer(L.g, ops.conv2d(L.g, xd, wref, b, stride=st, padding=pd, dilation=dl, groups=grp))
        _q8ta_output(L, y, L.arg(act), o_scale, o_zero, out)
    return build


def _choose_qparams(L: Lowering, *args: int) -> None:
    """Activation scale and zero point for linear_dq8ca_*: nothing to compute (see above); a
    later op reading them fails with 'used before any op computed it'."""


def _dequantize_affine(L: Lowering, x: int, block: int, scale: int, zero: int, in_dtype: int, qmin: int, qmax: int,
                       *rest: int) -> None:
    out = rest[-1]
    block_size = [int(b) for b in L.arg(block)]
    xi = L.same.get(x, x)
    if L.const(xi) is None or L.const(scale) is None or len(L.dims(x)) != 2 or len(block_size) != 2 or \
            block_size[0] != 1 or L.vk(xi).value.dtype != np.int8:
        raise L.error("dequantize_affine is supported for constant int8 weights quantized in groups along rows "
                      f"(block size [1, G]), not {L.dims(x)} {L.vk(xi).value.dtype} with block size {block_size}")
    zeros = None if L.vk(zero).kind == "null" or not np.any(L.const(zero)) else zero
    L.qweights[out] = QuantWeight(xi, L.same.get(scale, scale), None if zeros is None else L.same.get(zeros, zeros),
                                  block_size[1], 8, False)


# --- op builders: (lowering, *argument value indices) -------------------------------------------

def _binary(op: str, alpha_arg: bool = False) -> Callable:
    def build(L: Lowering, a: int, b: int, *rest: int) -> None:
        out = rest[-1]
        lay = L.texture_layout(out)
        alpha = float(L.arg(rest[0])) if alpha_arg and len(rest) > 1 else 1.0
        va, vb = L.vk(a), L.vk(b)
        if vb.kind != "tensor":  # Scalar overloads
            s = float(vb.value)
            if op in ("add", "sub", "mul", "div"):
                inv = 1.0 / s if s else float("inf")  # x / 0: inf, -inf or nan, as torch
                p0, p1 = {"add": (1.0, alpha * s), "sub": (1.0, -alpha * s), "mul": (s, 0.0), "div": (inv, 0.0)}[op]
                L.set(out, ops.unary(L.g, L.src(a, lay), "affine", p0, p1, layout=lay))
            else:
                L.set(out, ops.unary(L.g, L.src(a, lay), op, s, layout=lay))
            return
        if va.kind != "tensor":
            raise L.error(f"a scalar first operand of {op} is not supported")
        L.set(out, ops.binary(L.g, L.src(a, lay), L.operand(b, lay), op, alpha, layout=lay))
    return build


def _bitwise(op: str) -> Callable:
    """bitwise and/or of bools (what masks use) as logical and/or."""
    logical = _binary(op)

    def build(L: Lowering, a: int, b: int, out: int) -> None:
        if any(L.vk(L.same.get(i, i)).value.dtype != np.bool_ for i in (a, b)):
            raise L.error("bitwise ops are supported on bool tensors only")
        logical(L, a, b, out)
    return build


def _unary(op: str) -> Callable:
    def build(L: Lowering, x: int, *rest: int) -> None:
        out = rest[-1]
        lay = L.texture_layout(out)
        vals = [L.arg(i) for i in rest[:-1]]
        if op == "clamp":
            lo = -3.4e38 if vals[0] is None else max(float(vals[0]), -3.4e38)
            hi = 3.4e38 if len(vals) < 2 or vals[1] is None else min(float(vals[1]), 3.4e38)
            L.set(out, ops.unary(L.g, L.src(x, lay), "clamp", lo, hi, layout=lay))
        elif op == "gelu":
            L.set(out, ops.gelu(L.g, L.src(x, lay), vals[0] if vals else "none", layout=lay))
        elif op in ("pow", "leaky_relu", "hardshrink"):
            default = {"pow": None, "leaky_relu": 0.01, "hardshrink": 0.5}[op]
            p = vals[0] if vals and vals[0] is not None else default
            L.set(out, ops.unary(L.g, L.src(x, lay), op, float(p), layout=lay))
        else:
            L.set(out, ops.unary(L.g, L.src(x, lay), op, layout=lay))
    return build


def _div_mode(L: Lowering, a: int, b: int, mode: int, out: int) -> None:
    m = L.arg(mode)
    if m not in (None, "floor", "trunc"):
        raise L.error(f"rounding mode {m!r} is not supported")
    _binary("div" if m is None else f"div_{m}")(L, a, b, out)


def _rsub(L: Lowering, a: int, b: int, alpha: int, out: int) -> None:
    lay = L.texture_layout(out)
    L.set(out, ops.unary(L.g, L.src(a, lay), "affine", -float(L.arg(alpha)), float(L.arg(b)), layout=lay))


def _where(L: Lowering, c: int, a: int, b: int, out: int) -> None:
    lay = L.texture_layout(out)
    L.set(out, ops.where(L.g, *(L.operand(i, lay) for i in (c, a, b)), layout=lay))


def _last_dim_op(L: Lowering, x: int, dim: int, fn: Callable[[ValueRef], ValueRef]) -> ValueRef:
    """Apply a last-dimension op along ``dim`` (moving it last and back)."""
    shape = L.dims(x)
    nd = max(len(shape), 1)
    d = dim % nd
    ref = L.t(x)
    if d != nd - 1:
        perm = [i for i in range(nd) if i != d] + [d]
        ref = ops.permute(L.g, ref, perm)
        moved = [shape[i] for i in perm]
    else:
        moved = list(shape) or [1]
    flat = L.g.add_view(ref, (int(np.prod(moved[:-1])), moved[-1]))
    y = L.g.add_view(fn(flat), moved)
    if d != nd - 1:
        y = ops.permute(L.g, y, list(np.argsort(perm)))
    return y


def _softmax(log: bool) -> Callable:
    def build(L: Lowering, x: int, dim: int, half: int, out: int) -> None:
        nd = max(len(L.dims(x)), 1)
        if int(L.arg(dim)) % nd == nd - 1 and L.texture_layout(out) == "width_packed":
            L.set(out, ops.softmax(L.g, L.held(x), log=log, layout="width_packed"))
            return
        L.set(out, _last_dim_op(L, x, int(L.arg(dim)), lambda r: ops.softmax(L.g, r, log=log)))
    return build


def _optional_weight(L: Lowering, i: int, d: int, fill: float, name: str) -> ValueRef:
    if L.vk(i).kind == "null":
        return L.g.add_tensorref(np.full(d, fill, np.float32), f"{L.label}.{name}{len(L.g.values)}")
    return L.weight(i)


def _layer_norm(L: Lowering, x: int, shape: int, w: int, b: int, eps: int, out: int) -> None:
    dims = L.dims(x)
    d = int(np.prod(L.arg(shape)))
    outs = L.arg(out) if L.vk(out).kind == "value_list" else (out,)
    params = (_optional_weight(L, w, d, 1.0, "ln_w"), _optional_weight(L, b, d, 0.0, "ln_b"), float(L.arg(eps)))
    if d == dims[-1] and L.texture_layout(outs[0]) == "width_packed":
        L.set(outs[0], ops.layer_norm(L.g, L.held(x), *params, layout="width_packed"))
        return
    L.set(outs[0], ops.layer_norm(L.g, L.g.add_view(L.t(x), (int(np.prod(dims)) // d, d)), *params))


def _rms_norm(L: Lowering, x: int, w: int, eps: int, out: int) -> None:
    dims = L.dims(x)
    params = (_optional_weight(L, w, dims[-1], 1.0, "rms_w"), float(L.arg(eps)))
    if L.texture_layout(out) == "width_packed":
        L.set(out, ops.rms_norm(L.g, L.held(x), *params, layout="width_packed"))
        return
    L.set(out, ops.rms_norm(L.g, L.g.add_view(L.t(x), (int(np.prod(dims[:-1])), dims[-1])), *params))


def _linear(L: Lowering, x: int, w: int, b: int, out: int) -> None:
    if L.same.get(w, w) in L.qweights:
        _set_linear_quant(L, out, x, L.qweights[L.same.get(w, w)], b)
        return
    dims = L.dims(x)
    k = dims[-1]
    bias = None if L.vk(b).kind == "null" else L.weight(b)
    fp32 = L.const(w) is not None and L.vk(w).value.dtype == np.float32
    if fp32 and L.texture_layout(out) == "width_packed" and len(dims) <= 4:
        L.set(out, ops.linear(L.g, L.held(x), L.weight(w), bias, layout="width_packed"))
        return
    flat = L.g.add_view(L.t(x), (int(np.prod(dims[:-1])), k))
    if fp32:
        y = ops.linear(L.g, flat, L.weight(w), bias)
    else:
        y = ops.matmul(L.g, flat, L.t(w), transpose_b=True)
        if bias is not None:
            y = ops.add(L.g, y, bias)
    L.set(out, y)


def _matmul(L: Lowering, a: int, b: int, out: int) -> None:
    lead_a, lead_b = (int(np.prod(L.dims(i)[:-2])) for i in (a, b))
    if L.texture_layout(out) == "width_packed" and len(L.dims(a)) == len(L.dims(b)) >= 2 and \
            (L.dims(a)[:-2] == L.dims(b)[:-2] or 1 in (lead_a, lead_b)):
        L.set(out, ops.matmul(L.g, L.held(a), L.operand(b, "width_packed"), layout="width_packed"))
        return
    L.set(out, _matmul_ref(L, a, b))


def _addmm(L: Lowering, bias: int, a: int, b: int, beta: int, alpha: int, out: int) -> None:
    y = _matmul_ref(L, a, b)
    if float(L.arg(alpha)) != 1.0:
        y = ops.unary(L.g, y, "affine", float(L.arg(alpha)), 0.0)
    L.set(out, ops.binary(L.g, y, L.operand(bias), "add", float(L.arg(beta))))


def _matmul_ref(L: Lowering, a: int, b: int) -> ValueRef:
    return ops.matmul(L.g, L.t(a), L.operand(b))


def _conv(L: Lowering, x: int, w: int, b: int, stride: int, pad: int, dil: int, transposed: int, out_pad: int,
          groups: int, *rest: int) -> None:
    out = rest[-1]
    if L.arg(transposed):
        if len(rest) == 3:
            raise L.error("a transposed convolution with clamp is not supported")
        return _conv_transposed(L, x, w, b, stride, pad, dil, groups, out)
    if L.const(w) is None:
        raise L.error("a convolution weight computed at run time is not supported")
    dims = L.dims(x)
    if len(dims) not in (3, 4):
        raise L.error(f"only 1-D and 2-D convolution (NCL or NCHW input) are supported, not input {dims}")
    bias = None if L.vk(b).kind == "null" else L.weight(b)
    geometry = [tuple(int(v) for v in L.arg(i)) for i in (stride, pad, dil)]
    if len(dims) == 3:  # 1-D: a 2-D convolution of height 1
        wt = L.const(w)
        weight = L.derived(f"conv1d_w{w}", lambda: np.asarray(wt, np.float32).reshape(*wt.shape[:2], 1, wt.shape[2]))
        geometry = [(first, *v) for first, v in zip((1, 0, 1), geometry)]
        lay, xin = None, L.g.add_view(L.t(x), (dims[0], dims[1], 1, dims[2]))
    else:  # ops.conv2d runs on channels-packed textures when its input is one
        weight = L.weight(w)
        lay = "channels_packed" if L.texture_layout(out) == "channels_packed" else None
        xin = L.src(x, lay)
    y = ops.conv2d(L.g, xin, weight, bias, stride=geometry[0], padding=geometry[1], dilation=geometry[2],
                   groups=int(L.arg(groups)))
    if lay is None:
        y = ops.to_buffer(L.g, y)
    if len(rest) == 3:  # et_vk.conv_with_clamp: output_min, output_max
        lo, hi = (L.arg(i) for i in rest[:2])
        lo = -3.4e38 if lo is None else max(float(lo), -3.4e38)
        hi = 3.4e38 if hi is None else min(float(hi), 3.4e38)
        y = ops.unary(L.g, y, "clamp", lo, hi, layout=lay)
    L.set(out, y)


def _pair(v: Sequence[int] | None, default: int) -> tuple[int, int]:
    v = tuple(v or ())
    if not v:
        return (default, default)
    return (int(v[0]), int(v[-1]))


def _max_pool(L: Lowering, x: int, k: int, stride: int, pad: int, dil: int, ceil: int, out: int) -> None:
    outs = L.arg(out) if L.vk(out).kind == "value_list" else (out,)
    kernel = _pair(L.arg(k), 1)
    lay = _pool_layout(L, x, outs[0])
    y = ops.pool2d(L.g, L.src(x, lay), L.dims(outs[0])[-2:], kernel, _pair(L.arg(stride), 0) if L.arg(stride) else kernel,
                   _pair(L.arg(pad), 0), _pair(L.arg(dil), 1), max_pool=True, layout=lay)
    L.set(outs[0], y)


def _pool_layout(L: Lowering, x: int, out: int) -> str | None:
    """Pooling runs on textures when its output is asked channels-packed (ops.pool2d)."""
    return "channels_packed" if L.texture_layout(out) == "channels_packed" and len(L.dims(x)) == 4 else None


def _avg_pool(L: Lowering, x: int, k: int, stride: int, pad: int, ceil: int, count_pad: int, divisor: int,
              out: int) -> None:
    kernel = _pair(L.arg(k), 1)
    lay = _pool_layout(L, x, out)
    y = ops.pool2d(L.g, L.src(x, lay), L.dims(out)[-2:], kernel, _pair(L.arg(stride), 0) if L.arg(stride) else kernel,
                   _pair(L.arg(pad), 0), max_pool=False, count_include_pad=bool(L.arg(count_pad)),
                   divisor=int(L.arg(divisor) or 0), layout=lay)
    L.set(out, y)


def _reduce(op: str) -> Callable:
    def build(L: Lowering, x: int, dims: int, keepdim: int, *rest: int) -> None:
        out = rest[-1]
        shape = L.dims(x)
        nd = max(len(shape), 1)
        ds = L.arg(dims)
        ds = sorted({int(d) % nd for d in ((ds,) if isinstance(ds, int) else (ds or range(nd)))}, reverse=True)
        lay = L.texture_layout(out) if shape else None
        ref = L.held(x) if shape else L.g.add_view(L.t(x), (1,))
        # adjacent dims reduce in one dispatch; others one after another (highest first), the
        # last into the texture ``out`` asks for
        groups: list[list[int]] = []
        for d in ds:
            if groups and groups[-1][-1] == d + 1:
                groups[-1].append(d)
            else:
                groups.append([d])
        for k, grp in enumerate(groups):
            last = k == len(groups) - 1
            ref = ops.reduce(L.g, ref, grp[-1], op, len(grp), lay if last else None, L.dims(out) if last and lay else None)
        L.set(out, ref)
    return build


def _arg_reduce(op: str) -> Callable:
    def build(L: Lowering, x: int, dim: int, keepdim: int, out: int) -> None:
        shape = L.dims(x)
        d = L.arg(dim)
        if d is None or not shape:
            L.set(out, ops.reduce(L.g, L.g.add_view(L.t(x), (1, int(np.prod(shape)))), 1, op))
        else:
            L.set(out, ops.reduce(L.g, L.t(x), int(d) % len(shape), op))
    return build


def _batch_norm(L: Lowering, x: int, w: int, b: int, mean: int, var: int, momentum: int, eps: int, out: int) -> None:
    """Inference batch norm: one scale and shift per channel (dim 1), computed on the CPU."""
    c = L.dims(x)[1]
    ids = (w, b, mean, var)
    absent = [k < 2 and L.vk(i).kind == "null" for k, i in enumerate(ids)]  # weight and bias may be; statistics not
    arrays = [None if gone else L.const(i) for gone, i in zip(absent, ids)]
    if any(a is None and not gone for a, gone in zip(arrays, absent)):
        raise L.error("batch norm needs constant running statistics, weight and bias")
    wt, bs, mu, vr = (None if a is None else np.asarray(a, np.float64).reshape(-1) for a in arrays)
    scale = (1.0 if wt is None else wt) / np.sqrt(vr + float(L.arg(eps)))
    shift = (0.0 if bs is None else bs) - mu * scale
    tail = (1,) * (len(L.dims(x)) - 2)
    y = ops.binary(L.g, L.t(x), L.derived(f"bn_scale{x}", lambda: np.broadcast_to(scale, (c,)).reshape(c, *tail)), "mul")
    y = ops.binary(L.g, y, L.derived(f"bn_shift{x}", lambda: np.broadcast_to(shift, (c,)).reshape(c, *tail)), "add")
    L.set(L.arg(out)[0] if L.vk(out).kind == "value_list" else out, y)


def _group_norm(L: Lowering, x: int, w: int, b: int, n: int, c: int, hw: int, group: int, eps: int, out: int) -> None:
    """Group norm as a layer norm over each group's [C/G * HxW] values, then the per-channel
    weight and bias."""
    n, c, hw, grp = (int(L.arg(i)) for i in (n, c, hw, group))
    d = c // grp * hw
    y = ops.layer_norm(L.g, L.g.add_view(L.t(x), (n * grp, d)), L.derived(f"ones{d}", lambda: np.ones(d)),
                       L.derived(f"zeros{d}", lambda: np.zeros(d)), float(L.arg(eps)))
    y = L.g.add_view(y, (n, c, hw))
    if L.vk(w).kind != "null":
        y = ops.binary(L.g, y, L.g.add_view(L.t(w), (c, 1)), "mul")
    if L.vk(b).kind != "null":
        y = ops.binary(L.g, y, L.g.add_view(L.t(b), (c, 1)), "add")
    L.set(L.arg(out)[0] if L.vk(out).kind == "value_list" else out, y)


def _start(L: Lowering, start: int) -> ValueRef:
    """A constant start position as the int32 tensor the position-reading ops take (one per
    delegate and value)."""
    key = f"{L.label}.start{start}"
    ref = L.g.names.get(key)
    return L.g.prepack_tensor(ref if ref is not None else L.g.add_tensorref(np.array([start], np.int32), key))


def _rotary(hf: bool) -> Callable:
    def build(L: Lowering, xq: int, xk: int, cos: int, sin: int, *rest: int) -> None:
        outs = L.arg(rest[-1])
        pos = rest[0] if hf else None  # the HF op's start position: a SymInt read on the device, or a number
        step = L.symints[pos] if pos in L.symints else _start(L, int(L.arg(pos)) if hf else 0)
        cd = L.dims(cos)
        per_head = not hf and len(cd) == 3
        cr = L.g.add_view(L.t(cos), (int(np.prod(cd[:-1])), cd[-1]))
        sr = L.g.add_view(L.t(sin), (int(np.prod(cd[:-1])), cd[-1]))
        for x, o in zip((xq, xk), outs):
            b, t, h, d = L.dims(x)
            L.set(o, ops.rotary(L.g, L.t(x), cr, sr, step, heads=h, seq=t, interleaved=not hf, per_head=per_head))
    return build


def _rotary_interleaved(L: Lowering, x: int, freqs: int, out: int) -> None:
    """et_vk.apply_rotary_emb_interleaved (EdgeTAM's RoPE): x ``[B, N, C]`` in (real, imag) pairs,
    turned by a constant freqs_cis whose flat layout is ``[N, C/2, (cos, sin)]``."""
    b, n, c = L.dims(x)
    fc = L.const(freqs)
    if fc is None:
        raise L.error("apply_rotary_emb_interleaved needs freqs_cis as a constant")
    if fc.size != n * c or c % 2:
        raise L.error(f"freqs_cis of {fc.size} values does not fit x {L.dims(x)}")
    pairs = lambda k: L.derived(f"freqs{freqs}.{k}", lambda: np.asarray(fc, np.float32).reshape(n, c // 2, 2)[..., k])  # noqa: E731
    L.set(out, ops.rotary(L.g, L.t(x), pairs(0), pairs(1), _start(L, 0), heads=1, seq=n, interleaved=True))


def _conv_transposed(L: Lowering, x: int, w: int, b: int, stride: int, pad: int, dil: int, groups: int, out: int) -> None:
    if len(L.dims(x)) != 4:
        raise L.error(f"only 2-D transposed convolution (NCHW input) is supported, not input {L.dims(x)}")
    bias = None if L.vk(b).kind == "null" else L.weight(b)
    L.set(out, ops.conv_transpose2d(L.g, L.t(x), L.operand(w), bias, L.dims(out)[-2:], stride=_pair(L.arg(stride), 1),
                                    padding=_pair(L.arg(pad), 0), dilation=_pair(L.arg(dil), 1),
                                    groups=int(L.arg(groups))))


def _prepack(L: Lowering, x: int, out: int) -> None:
    """et_vk.prepack copies a constant into a tensor: the output is the constant (packed where used)."""
    if L.const(x) is not None and x not in L.refs:
        L.same[out] = L.same.get(x, x)
    else:
        _view(L, x, out)


def _view(L: Lowering, x: int, *rest: int) -> None:
    out = rest[-1]
    src = L.refs.get(x)
    if src is not None and isinstance(L.g.values[src], Tensor) and L.g.values[src].dtype != np.float32:
        L.set(out, src)  # ids keep their int32
        return
    lay = L.texture_layout(out)
    held = L.held(x) if lay else L.t(x)
    t = L.g.values[held]
    if lay and (t.storage != "texture3d" or t.layout != lay or tuple(t.shape) != tuple(L.dims(out))):
        L.gather(out, x, ops.contiguous_strides(L.dims(out)))  # a texture has no views: a copy in the new shape
    else:
        L.set(out, held)


def _to_copy(L: Lowering, x: int, *rest: int) -> None:
    """A dtype conversion (the layout and device arguments change nothing here): to bool is
    ``x != 0``, to an integer rounds toward zero (int32 on the device), to a float is the value."""
    out = rest[-1]
    want = L.vk(out).value.dtype
    src = L.vk(L.same.get(x, x)).value.dtype
    if want == np.bool_ and src != np.bool_:
        L.set(out, ops.unary(L.g, L.t(x), "ne", 0.0))
    elif want.kind in "iu" and src.kind == "f":
        L.set(out, ops.cast(L.g, L.t(x), np.int32))
    else:
        _view(L, x, out)


def _permute(L: Lowering, x: int, dims: int, out: int) -> None:
    st = ops.contiguous_strides(L.dims(x))
    L.gather(out, x, [st[int(d) % len(st)] for d in L.arg(dims)])


def _select(L: Lowering, x: int, dim: int, index: int, out: int) -> None:
    shape = L.dims(x)
    d = int(L.arg(dim)) % len(shape)
    i = int(L.arg(index)) % shape[d]
    st = ops.contiguous_strides(shape)
    L.gather(out, x, [s for k, s in enumerate(st) if k != d], i * st[d])


def _slice(L: Lowering, x: int, dim: int, start: int, end: int, step: int, out: int) -> None:
    shape = L.dims(x)
    d = int(L.arg(dim)) % len(shape)
    s = L.arg(start)
    s = 0 if s is None else int(s)
    s = max(0, min(shape[d], s + shape[d] if s < 0 else s))
    st = ops.contiguous_strides(shape)
    src = list(st)
    src[d] *= int(L.arg(step) or 1)
    L.gather(out, x, src, s * st[d])


def _cat(L: Lowering, xs: int, dim: int, out: int) -> None:
    shape = L.dims(out)
    d = int(L.arg(dim)) % len(shape)
    y = L.g.add_tensor(shape, np.float32)
    ost = ops.contiguous_strides(shape)
    offset = 0
    for i in L.arg(xs):
        part = L.dims(i)
        if int(np.prod(part)) == 0:
            continue
        ops.strided_copy(L.g, y, L.t(i), part, ops.contiguous_strides(part), ost, 0, offset * ost[d])
        offset += part[d]
    L.set(out, y)


def _expand(L: Lowering, x: int, size: int, *rest: int) -> None:
    out = rest[-1]
    shape = L.dims(out)
    src_shape = (1,) * (len(shape) - len(L.dims(x))) + tuple(L.dims(x))
    L.gather(out, x, [0 if n == 1 and m != 1 else s for n, m, s in zip(src_shape, shape, ops.contiguous_strides(src_shape))])


def _repeat(L: Lowering, x: int, reps: int, out: int) -> None:
    reps = [int(r) for r in L.arg(reps)]
    src_shape = (1,) * (len(reps) - len(L.dims(x))) + tuple(L.dims(x))
    # out viewed as (r0, s0, r1, s1, ...): the repetitions have stride 0 in the source
    size, src, dst = [], [], []
    ost = ops.contiguous_strides([r * s for r, s in zip(reps, src_shape)])
    for r, s, ss, os_ in zip(reps, src_shape, ops.contiguous_strides(src_shape), ost):
        size += [r, s]
        src += [0, ss]
        dst += [os_ * s, os_]
    y = L.g.add_tensor(L.dims(out), np.float32)
    ops.strided_copy(L.g, y, L.t(x), size, src, dst)
    L.set(out, y)


def _split(L: Lowering, x: int, sizes: int, dim: int, outs: int) -> None:
    shape = L.dims(x)
    d = int(L.arg(dim)) % len(shape)
    st = ops.contiguous_strides(shape)
    start = 0
    for o in L.arg(outs):
        L.gather(o, x, st, start * st[d])
        start += L.dims(o)[d]


def _t(L: Lowering, x: int, out: int) -> None:
    if len(L.dims(x)) < 2:
        return _view(L, x, out)
    st = ops.contiguous_strides(L.dims(x))
    L.gather(out, x, [st[1], st[0]])


def _flip(L: Lowering, x: int, dims: int, out: int) -> None:
    shape = L.dims(x)
    st = ops.contiguous_strides(shape)
    flipped = {int(d) % len(shape) for d in L.arg(dims)}
    base = sum((shape[d] - 1) * st[d] for d in flipped)
    L.gather(out, x, [-s if d in flipped else s for d, s in enumerate(st)], base)


def _index_select(L: Lowering, x: int, dim: int, index: int, out: int) -> None:
    shape = L.dims(x)
    d = int(L.arg(dim)) % max(len(shape), 1)
    idx = L.const(index)
    if idx is None:  # indices computed at run time: rows of x moved to the front, gathered
        moved = [d] + [i for i in range(len(shape)) if i != d]
        table = L.g.add_view(ops.permute(L.g, L.t(x), moved) if d else L.t(x),
                             (shape[d], int(np.prod(shape)) // shape[d]))
        rows = ops.embedding(L.g, L.g.add_view(L.ids(index), (int(np.prod(L.dims(index))),)), table)
        want = [int(np.prod(L.dims(index)))] + [shape[i] for i in moved[1:]]
        y = L.g.add_view(rows, want)
        L.set(out, ops.permute(L.g, y, list(np.argsort(moved))) if d else y)
        return
    y = L.g.add_tensor(L.dims(out), np.float32)
    st = ops.contiguous_strides(shape)
    ost = ops.contiguous_strides(L.dims(out))
    part = [1 if i == d else n for i, n in enumerate(shape)]
    for k, j in enumerate(np.asarray(idx).reshape(-1)):
        ops.strided_copy(L.g, y, L.t(x), part, st, ost, int(j) % shape[d] * st[d], k * ost[d])
    L.set(out, y)


def _constant_pad(L: Lowering, x: int, pad: int, value: int, out: int) -> None:
    """Pad (or, with negative amounts, crop) the last dims: pad is (left, right) pairs from the
    last dim backwards."""
    shape = L.dims(x)
    oshape = L.dims(out)
    pads = [int(p) for p in L.arg(pad)]
    y = ops.fill(L.g, oshape, float(L.arg(value) or 0.0))
    size, src_base, dst_base = list(shape), 0, 0
    st, ost = ops.contiguous_strides(shape), ops.contiguous_strides(oshape)
    for k in range(len(pads) // 2):
        d = len(shape) - 1 - k
        lo, hi = pads[2 * k], pads[2 * k + 1]
        size[d] = shape[d] + min(lo, 0) + min(hi, 0)
        src_base += max(-lo, 0) * st[d]
        dst_base += max(lo, 0) * ost[d]
    if min(size) > 0:
        ops.strided_copy(L.g, y, L.t(x), size, st, ost, src_base, dst_base)
    L.set(out, y)


def _copy_into(L: Lowering, out: int, src: ValueRef, size: Sequence[int], strides: Sequence[int]) -> None:
    """Output ``out`` gathered in a buffer from ``src`` over ``size`` (more dims than a texture
    has: out's elements viewed as ``size``)."""
    L.set(out, ops.gather(L.g, src, size, strides))


def _upsample_nearest(L: Lowering, x: int, size: int, scales: int, out: int) -> None:
    n, c, h, w = L.dims(x)
    ho, wo = L.dims(out)[-2:]
    if ho % h or wo % w:
        raise L.error(f"nearest upsampling from {h}x{w} to {ho}x{wo} is supported for whole scale factors only")
    ry, rx = ho // h, wo // w
    _copy_into(L, out, L.t(x), (n, c, h, ry, w, rx), (c * h * w, h * w, w, 0, 1, 0))


def _upsample_bilinear(L: Lowering, x: int, size: int, align: int, scales: int, out: int) -> None:
    sc = L.arg(scales)
    L.set(out, ops.upsample_bilinear(L.g, L.t(x), L.dims(out)[-2:], align_corners=bool(L.arg(align)),
                                     scales=(float(sc[0]), float(sc[-1])) if sc else None))


def _pixel_shuffle(L: Lowering, x: int, factor: int, out: int) -> None:
    n, crr, h, w = L.dims(x)
    r = int(L.arg(factor))
    c = crr // (r * r)
    # out[n, c, h*r + i, w*r + j] = x[n, c*r*r + i*r + j, h, w]
    _copy_into(L, out, L.t(x), (n, c, h, r, w, r), (crr * h * w, r * r * h * w, w, r * h * w, 1, h * w))


def _select_as_symint(L: Lowering, x: int, dim: int, index: int, out: int) -> None:
    """A SymInt read from a tensor when the graph runs (ET-VK: the cache position). Ops taking it
    read the tensor's first element on the device."""
    if int(L.arg(dim)) != 0 or int(L.arg(index)) != 0:
        raise L.error("select_as_symint is supported for element 0 of a tensor")
    L.symints[out] = L.ids(x)


def _sdpa_with_kv_cache(L: Lowering, q: int, k: int, v: int, k_cache: int, v_cache: int, pos: int, seq_len: int,
                        mask: int, dropout: int, causal: int, scale: int, out: int) -> None:
    """ExecuTorch's llama update_cache + custom_sdpa (fused by ET-VK): write k and v at rows
    pos.. of the caches ([1, max_seq, kv_heads, head_dim] constants: device tensors that keep
    their contents between runs), then attend over the cache."""
    b, t, heads, dh = L.dims(q)
    _, s, kv_heads, _ = L.dims(k_cache)
    if b != 1 or L.vk(mask).kind != "null" or float(L.arg(dropout) or 0) != 0:
        raise L.error("sdpa_with_kv_cache is supported for batch 1 without a mask or dropout")
    step = L.symints.get(pos)
    if step is None:
        raise L.error(f"the cache position (value {pos}) is not a SymInt read from a tensor")
    caches = []
    for cache, new in ((k_cache, k), (v_cache, v)):
        c = L.g.add_view(L.t(cache), (s, kv_heads * dh))
        ops.kv_write(L.g, c, L.g.add_view(L.t(new), (t, kv_heads * dh)), step)
        caches.append(c)
    sc = L.arg(scale)
    y = ops.sdpa(L.g, L.g.add_view(L.t(q), (t, heads * dh)), *caches, heads=heads, kv_heads=kv_heads,
                 causal=bool(L.arg(causal)), step=step, scale=None if sc is None else float(sc))
    L.set(out, y)


def _embedding(L: Lowering, w: int, ids: int, *rest: int) -> None:
    out = rest[-1]
    flat = L.g.add_view(L.ids(ids), (int(np.prod(L.dims(ids))),))
    table = L.weight(w)
    fits = L.g.values[table].dtype == np.float32 and L.g.values[table].nbytes <= L.g.max_binding_nbytes
    if fits and L.texture_layout(out) == "width_packed":
        L.set(out, ops.embedding(L.g, flat, table, "width_packed", L.dims(out)))
        return
    L.set(out, ops.embedding(L.g, flat, table))


def _embedding_q4gsw(L: Lowering, w: int, scales: int, group: int, ids: int, is_linear: int, out: int) -> None:
    """ET-VK's 4-bit embedding: uint8 ``[V, D/2]``, scales ``[V, groups]`` (or ``[V]``); even d in
    the low nibble when the table is stored as a 4-bit linear's weight (``is_linear_weight``,
    shared with a tied output head), else in the high one."""
    _embedding_4bit(L, w, scales, None, ids, out, int(L.arg(group)), high_first=not L.arg(is_linear))


def _embedding_4bit_dtype(L: Lowering, w: int, scales: int, zeros: int, qmin: int, qmax: int, ids: int, *rest: int) -> None:
    """quantized_decomposed.embedding_4bit.dtype: even d in the high nibble, values nibble - 8,
    optional zero points, group size from the scales' shape."""
    if (L.arg(qmin), L.arg(qmax)) != (-8, 7):
        raise L.error(f"embedding_4bit with quant range [{L.arg(qmin)}, {L.arg(qmax)}] (only [-8, 7])")
    sc = L.dims(scales)
    group = L.dims(w)[1] * 2 // (sc[1] if len(sc) == 2 else 1)
    _embedding_4bit(L, w, scales, None if L.vk(zeros).kind == "null" else zeros, ids, rest[-1], group, high_first=True)


def _embedding_4bit(L: Lowering, w: int, scales: int, zeros: int | None, ids: int, out: int, group: int, *,
                    high_first: bool) -> None:
    if any(L.const(i) is None for i in (w, scales, *([zeros] if zeros is not None else []))):
        raise L.error("a quantized embedding table, its scales and zero points must be constants")
    as_rows = lambda i: L.derived(f"emb{i}", lambda: np.asarray(L.const(i), np.float32).reshape(L.dims(w)[0], -1))  # noqa: E731
    sc, zp = as_rows(scales), None if zeros is None else as_rows(zeros)
    flat = L.g.add_view(L.ids(ids), (int(np.prod(L.dims(ids))),))
    L.set(out, ops.embedding_qw(L.g, flat, L.weight(w), sc, bits=4, group_size=group, zero_points=zp,
                                high_first=high_first))


def _et_vk_sdpa(L: Lowering, q: int, k: int, v: int, mask: int, scale: int, out: int) -> None:
    """et_vk.sdpa: softmax(q @ k^T * scale + mask) @ v over the last two dims, batched over the
    leading ones (the same for q, k and v); scale defaults to 1/sqrt(head dim); the mask is added,
    broadcast to the scores."""
    qd, kd, vd = L.dims(q), L.dims(k), L.dims(v)
    if len(qd) < 2 or qd[:-2] != kd[:-2] or kd[:-2] != vd[:-2] or qd[-1] != kd[-1] or kd[-2] != vd[-2]:
        raise L.error(f"sdpa of q {qd}, k {kd}, v {vd}: batch dims, head dims and keys must match")
    lead, (t, dh), s_ = qd[:-2], qd[-2:], kd[-2]
    b = int(np.prod(lead))
    scores = ops.matmul(L.g, L.g.add_view(L.t(q), (b, t, dh)), L.g.add_view(L.t(k), (b, s_, dh)), transpose_b=True)
    sc = L.arg(scale)
    scores = ops.unary(L.g, scores, "affine", 1 / np.sqrt(dh) if sc is None else float(sc), 0.0)
    if L.vk(mask).kind != "null":
        scores = ops.add(L.g, L.g.add_view(scores, (*lead, t, s_)), L.operand(mask))
    probs = ops.softmax(L.g, L.g.add_view(scores, (b * t, s_)))
    L.set(out, ops.matmul(L.g, L.g.add_view(probs, (b, t, s_)), L.g.add_view(L.t(v), (b, s_, vd[-1]))))


OPS: dict[str, Callable[..., None]] = {
    "et_vk.prepack.default": _prepack,
    "et_vk.linear_q4gsw.default": _linear_q4gsw, "et_vk.linear_dq8ca_q4gsw.default": _linear_dq8ca_q4gsw,
    "torchao.choose_qparams_affine.default": _choose_qparams, "torchao.dequantize_affine.default": _dequantize_affine,
    "aten._weight_int8pack_mm.default": _weight_int8pack_mm, "et_vk.linear_qcs4w.default": _linear_qcs4w,
    "quantized_decomposed.dequantize_per_channel.default": _dequantize_per_channel,
    "et_vk.linear_q8ta_q8csw.default": _linear_q8ta_q8csw,
    **{f"quantized_decomposed.{op}.{k}": fn for op, fn in (("quantize_per_tensor", _quantize_per_tensor),
                                                            ("dequantize_per_tensor", _dequantize_per_tensor))
       for k in ("default", "tensor")},
    "et_vk.q8ta_linear.default": _q8ta_linear, "et_vk.q8ta_linear_gemv.default": _q8ta_linear,
    "et_vk.q8ta_add.default": _q8ta_add, "et_vk.q8ta_relu.default": _q8ta_relu,
    **{f"et_vk.q8ta_conv2d{k and '_' + k}.default": _q8ta_conv(k) for k in ("", "pw", "dw", "transposed")},
    "aten.add.Tensor": _binary("add", alpha_arg=True), "aten.sub.Tensor": _binary("sub", alpha_arg=True),
    "aten.add.Scalar": _binary("add", alpha_arg=True), "aten.sub.Scalar": _binary("sub", alpha_arg=True),
    "aten.mul.Tensor": _binary("mul"), "aten.mul.Scalar": _binary("mul"),
    "aten.div.Tensor": _binary("div"), "aten.div.Scalar": _binary("div"), "aten.div.Tensor_mode": _div_mode,
    "aten.pow.Tensor_Tensor": _binary("pow"), "aten.pow.Tensor_Scalar": _unary("pow"),
    "aten.rsub.Scalar": _rsub, "aten.maximum.default": _binary("maximum"), "aten.minimum.default": _binary("minimum"),
    "aten.logical_and.default": _binary("logical_and"), "aten.logical_or.default": _binary("logical_or"),
    "aten.bitwise_and.Tensor": _bitwise("logical_and"), "aten.bitwise_or.Tensor": _bitwise("logical_or"),
    "aten.logical_not.default": _unary("logical_not"), "aten.bitwise_not.default": _unary("logical_not"),
    "aten.where.self": _where,
    **{f"aten.{c}.{k}": _binary(c) for c in ("gt", "lt", "ge", "le", "eq", "ne") for k in ("Tensor", "Scalar")},
    **{f"aten.{u}.default": _unary(u) for u in ("relu", "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "neg", "abs",
                                                 "log", "silu", "sin", "cos", "log10", "round", "hardswish",
                                                 "leaky_relu", "hardshrink")},
    "aten.gelu.default": _unary("gelu"), "aten.hardtanh.default": _unary("clamp"), "aten.clamp.default": _unary("clamp"),
    "aten._softmax.default": _softmax(False), "aten._log_softmax.default": _softmax(True),
    "aten.native_layer_norm.default": _layer_norm, "et_vk.rms_norm.default": _rms_norm,
    "aten.native_group_norm.default": _group_norm, "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "et_vk.apply_rotary_emb.default": _rotary(False), "et_vk.apply_rotary_emb_hf.default": _rotary(True),
    "et_vk.apply_rotary_emb_interleaved.default": _rotary_interleaved,
    "aten.linear.default": _linear, "aten.mm.default": _matmul, "aten.bmm.default": _matmul,
    "aten.addmm.default": _addmm,
    "aten.convolution.default": _conv, "et_vk.conv_with_clamp.default": _conv,
    "aten.max_pool2d_with_indices.default": _max_pool, "aten.max_pool2d.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    "aten.mean.dim": _reduce("mean"), "aten.sum.dim_IntList": _reduce("sum"), "aten.amax.default": _reduce("max"),
    "aten.amin.default": _reduce("min"), "aten.argmax.default": _arg_reduce("argmax"),
    "aten.argmin.default": _arg_reduce("argmin"),
    "aten.view_copy.default": _view, "aten._unsafe_view.default": _view, "aten.squeeze_copy.dims": _view,
    "aten.squeeze_copy.dim": _view, "aten.squeeze_copy.default": _view, "aten.unsqueeze_copy.default": _view,
    "aten.clone.default": _view, "aten.alias_copy.default": _view, "aten._to_copy.default": _to_copy,
    "dim_order_ops._to_dim_order_copy.default": _to_copy,
    "aten.permute_copy.default": _permute, "aten.select_copy.int": _select, "aten.slice_copy.Tensor": _slice,
    "aten.cat.default": _cat, "aten.expand_copy.default": _expand, "aten.repeat.default": _repeat,
    "aten.embedding.default": _embedding, "et_vk.embedding_q4gsw.default": _embedding_q4gsw,
    "quantized_decomposed.embedding_4bit.dtype": _embedding_4bit_dtype, "et_vk.sdpa.default": _et_vk_sdpa,
    "aten.split_with_sizes_copy.default": _split, "aten.t_copy.default": _t,
    "aten.flip.default": _flip, "aten.index_select.default": _index_select,
    "aten.constant_pad_nd.default": _constant_pad, "aten.upsample_nearest2d.vec": _upsample_nearest,
    "aten.upsample_bilinear2d.vec": _upsample_bilinear,
    "aten.pixel_shuffle.default": _pixel_shuffle,
    "et_vk.select_as_symint.default": _select_as_symint, "sdpa_with_kv_cache.default": _sdpa_with_kv_cache,
}
SHAPE_ONLY = ("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
NEVER_FOLD = ("et_vk.prepack.default",)  # a constant stays a TensorRef (packed, cacheable)


def supported(name: str) -> str:
    """"yes" (a GPU op builder), "folded" (numpy on constants only: full, arange, gather of a
    constant table...) or "" (not supported)."""
    if name in OPS:
        return "yes"
    return "folded" if kernels.kernel(name) is not None else ""
