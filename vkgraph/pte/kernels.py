"""Numpy kernels of ExecuTorch ops, by name: the program's KernelCalls between delegates (the
portable ops ExecuTorch runs on the CPU: ``aten::mean.out`` ...) and constant folding inside a
delegate (ops whose inputs are all known when the graph is built: masks from ``full``,
``arange``, comparisons). A kernel takes the op's inputs (arrays, numbers, lists, None) in schema
order and returns its output (a tuple for several)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np


def _dims(x: np.ndarray, dims: Any) -> tuple[int, ...] | None:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None  # every dim
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return tuple(d % max(x.ndim, 1) for d in dims)


def _reduction(fn: Callable) -> Callable:
    def k(x, dims=None, keepdim=False, *_):
        return fn(np.asarray(x), axis=_dims(np.asarray(x), dims), keepdims=bool(keepdim))
    return k


def _sum(x, axis, keepdims):
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=np.float32 if x.dtype.kind == "f" else np.int64)


def _slice(x, dim=0, start=None, end=None, step=1):
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


def _squeeze(x, dims=None):
    dims = _dims(x, dims)
    if dims is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(d for d in dims if x.shape[d] == 1))


def _expand(x, size, implicit=False):
    size = tuple(x.shape[i - (len(size) - x.ndim)] if s == -1 else s for i, s in enumerate(size))
    return np.broadcast_to(x, size).copy()


def _erf(x):
    # Abramowitz & Stegun 7.1.26, as glsl/unary.glsl (numpy has no erf)
    s, a = np.sign(x), np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2.0)))


def _softmax(x, dim=-1, half=False):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _log_softmax(x, dim=-1, half=False):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


def _layer_norm(x, shape, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, mean, rstd


def _full(size, value, *_):
    return np.full(tuple(size), value)


def _arange(start, end=None, step=1, *_):
    return np.arange(start, end, step)


def _where(c, a, b):
    return np.where(np.asarray(c).astype(bool), a, b)


def _linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def _clamp(x, lo=None, hi=None):
    return np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    """aten.convolution of 1-D (N, C, L) or 2-D (N, C, H, W) inputs, transposed too: one
    einsum per kernel tap, in float32."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    one_d = x.ndim == 3
    if one_d:
        x, w = x[:, :, None], w[:, :, None]
        stride, padding, dilation, output_padding = ([1, *stride], [0, *padding], [1, *dilation], [0, *output_padding])
    (sy, sx), (py, px), (dy, dx), g = stride, padding, dilation, int(groups)
    n, cin, h, wd = x.shape
    kh, kw = w.shape[2:]
    if not transposed:  # w [Cout, Cin/g, KH, KW]
        cout = w.shape[0]
        ho, wo = (h + 2 * py - dy * (kh - 1) - 1) // sy + 1, (wd + 2 * px - dx * (kw - 1) - 1) // sx + 1
        xg = np.pad(x, ((0, 0), (0, 0), (py, py), (px, px))).reshape(n, g, cin // g, h + 2 * py, wd + 2 * px)
        wg = w.reshape(g, cout // g, cin // g, kh, kw)
        out = np.zeros((n, g, cout // g, ho, wo), np.float32)
        for ky in range(kh):
            for kx in range(kw):
                patch = xg[..., ky * dy:ky * dy + sy * (ho - 1) + 1:sy, kx * dx:kx * dx + sx * (wo - 1) + 1:sx]
                out += np.einsum("ngchw,goc->ngohw", patch, wg[..., ky, kx])
    else:  # w [Cin, Cout/g, KH, KW]: every input pixel scattered through the kernel
        cout = w.shape[1] * g
        (oy, ox) = output_padding
        ho, wo = (h - 1) * sy - 2 * py + dy * (kh - 1) + oy + 1, (wd - 1) * sx - 2 * px + dx * (kw - 1) + ox + 1
        xg, wg = x.reshape(n, g, cin // g, h, wd), w.reshape(g, cin // g, cout // g, kh, kw)
        full = np.zeros((n, g, cout // g, (h - 1) * sy + dy * (kh - 1) + 1 + oy, (wd - 1) * sx + dx * (kw - 1) + 1 + ox),
                        np.float32)
        for ky in range(kh):
            for kx in range(kw):
                full[..., ky * dy:ky * dy + sy * (h - 1) + 1:sy, kx * dx:kx * dx + sx * (wd - 1) + 1:sx] += \
                    np.einsum("ngchw,gco->ngohw", xg, wg[..., ky, kx])
        out = full[..., py:py + ho, px:px + wo]
    out = out.reshape(n, cout, ho, wo)
    if b is not None:
        out = out + np.asarray(b, np.float32)[None, :, None, None]
    return out[:, :, 0] if one_d else out


def _adaptive_avg_pool2d(x, size):
    """aten._adaptive_avg_pool2d: output cell i averages input rows floor(i H / O) .. ceil((i + 1) H / O)."""
    h, w = x.shape[-2:]
    rows = [(i * h // size[0], -(-(i + 1) * h // size[0])) for i in range(size[0])]
    cols = [(j * w // size[1], -(-(j + 1) * w // size[1])) for j in range(size[1])]
    return np.stack([np.stack([x[..., r0:r1, c0:c1].mean(axis=(-2, -1)) for c0, c1 in cols], -1) for r0, r1 in rows], -2)


def _constant_pad_nd(x, pad, value=0.0):
    """Pads (negative amounts crop) the last dims: ``pad`` is (before, after) pairs from the last dim back."""
    widths = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        widths[x.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    grown = np.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], constant_values=value)
    return grown[tuple(slice(max(-a, 0), grown.shape[d] - max(-b, 0)) for d, (a, b) in enumerate(widths))]


def _var(x, dims=None, correction=1, keepdim=False):
    """aten.var.correction (``correction`` None: 1, as torch)."""
    x = np.asarray(x, np.float64)
    return np.var(x, axis=_dims(x, dims), ddof=1 if correction is None else correction, keepdims=bool(keepdim))


def _extreme(fn: Callable, arg: Callable, pairwise: Callable) -> Callable:
    """aten.max / min: .dim gives (values, indices) along ``dim``, .other the elementwise extreme
    of two tensors, .default the extreme of all elements."""
    def k(x, dim=None, keepdim=False):
        x = np.asarray(x)
        if isinstance(dim, np.ndarray):
            return pairwise(x, dim)
        if dim is None:
            return fn(x)
        return fn(x, axis=dim, keepdims=bool(keepdim)), arg(x, axis=dim, keepdims=bool(keepdim))
    return k


def _topk(x, k, dim=-1, largest=True, sorted_=True):
    order = np.argsort(-x if largest else x, axis=dim, kind="stable")
    idx = np.take(order, np.arange(k), axis=dim)
    return np.take_along_axis(x, idx, axis=dim), idx


def _sort(x, dim=-1, descending=False, *_):
    idx = np.argsort(-x if descending else x, axis=dim, kind="stable")
    return np.take_along_axis(x, idx, axis=dim), idx


def _instance_stats_norm(x, w, b, training, momentum, eps):
    """aten._native_batch_norm_legit.no_stats: normalized with the batch's own statistics per
    channel, (out, mean, 1 / std)."""
    axes = (0, *range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    y = (x - mean) * rstd
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = y * np.reshape(w, shape) if w is not None else y
    y = y + np.reshape(b, shape) if b is not None else y
    return y, mean.reshape(-1), rstd.reshape(-1)


def _logsumexp(x, dims, keepdim=False):
    axis = _dims(x, dims)
    m = np.max(x, axis=axis, keepdims=True)
    out = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return out if keepdim else np.squeeze(out, axis=axis)


KERNELS: dict[str, Callable[..., Any]] = {
    # elementwise
    "add": lambda a, b, alpha=1: np.add(a, np.multiply(b, alpha) if alpha != 1 else b),
    "sub": lambda a, b, alpha=1: np.subtract(a, np.multiply(b, alpha) if alpha != 1 else b),
    "rsub": lambda a, b, alpha=1: np.subtract(b, np.multiply(a, alpha) if alpha != 1 else a),
    "mul": np.multiply, "div": lambda a, b, *_: np.true_divide(a, b), "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "gt": np.greater, "lt": np.less, "ge": np.greater_equal, "le": np.less_equal, "eq": np.equal, "ne": np.not_equal,
    "logical_and": lambda a, b: np.logical_and(a, b), "logical_or": lambda a, b: np.logical_or(a, b),
    "logical_not": np.logical_not, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_not": lambda a: np.logical_not(a) if a.dtype == bool else ~a,
    "where": _where, "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1.0 / np.sqrt(a), "reciprocal": lambda a: 1.0 / a,
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)), "tanh": np.tanh, "relu": lambda a: np.maximum(a, 0),
    "silu": lambda a: a / (1.0 + np.exp(-a)), "gelu": _gelu, "clamp": _clamp, "hardtanh": _clamp,
    "erf": np.frompyfunc(math.erf, 1, 1), "log1p": np.log1p, "expm1": np.expm1, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "round": np.round, "sign": np.sign, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "log2": np.log2,
    "log10": np.log10, "square": np.square, "remainder": np.mod, "fmod": np.fmod,
    "elu": lambda a, alpha=1.0, scale=1.0, input_scale=1.0: scale * np.where(a > 0, a, alpha * np.expm1(a * input_scale)),
    "softplus": lambda a, beta=1.0, threshold=20.0: np.where(a * beta > threshold, a, np.log1p(np.exp(a * beta)) / beta),
    # reductions
    "sum": _reduction(_sum), "mean": _reduction(np.mean), "amax": _reduction(np.max), "amin": _reduction(np.min),
    "any": _reduction(np.any), "prod": lambda x, dim=None, keepdim=False, *_: np.prod(x, axis=dim, keepdims=bool(keepdim)),
    "var": _var, "std": lambda *a: np.sqrt(_var(*a)), "logsumexp": _logsumexp,
    "max": _extreme(np.max, np.argmax, np.maximum), "min": _extreme(np.min, np.argmin, np.minimum),
    "argmax": lambda x, dim=None, keepdim=False: np.argmax(x, axis=dim, keepdims=bool(keepdim)),
    "argmin": lambda x, dim=None, keepdim=False: np.argmin(x, axis=dim, keepdims=bool(keepdim)),
    "cumsum": lambda x, dim, *_: np.cumsum(x, axis=dim), "cumprod": lambda x, dim, *_: np.cumprod(x, axis=dim),
    "topk": _topk, "sort": _sort, "_native_batch_norm_legit": _instance_stats_norm,
    # shapes and copies
    "view_copy": lambda x, size: np.reshape(x, tuple(size)), "_unsafe_view": lambda x, size: np.reshape(x, tuple(size)),
    "reshape": lambda x, size: np.reshape(x, tuple(size)),
    "permute_copy": lambda x, dims: np.transpose(x, tuple(dims)), "permute": lambda x, dims: np.transpose(x, tuple(dims)),
    "unsqueeze_copy": lambda x, d: np.expand_dims(x, d % (x.ndim + 1)), "squeeze_copy": _squeeze,
    "select_copy": lambda x, d, i: np.take(x, i, axis=d), "slice_copy": _slice,
    "cat": lambda xs, dim=0: np.concatenate(xs, axis=dim), "expand_copy": _expand,
    "repeat": lambda x, reps: np.tile(x, tuple(reps)),
    "gather": lambda x, dim, index, *_: np.take_along_axis(x, np.asarray(index, np.int64), axis=dim),
    "index": lambda x, indices: x[tuple(slice(None) if i is None else np.asarray(i) for i in indices)],
    "clone": lambda x, *_: np.array(x),
    "_to_copy": lambda x, *_: np.array(x), "alias_copy": lambda x: np.array(x),
    "_to_dim_order_copy": lambda x, *_: np.array(x), "_clone_dim_order": lambda x, *_: np.array(x),
    # creation
    "full": _full, "full_like": lambda x, value, *_: np.full(np.shape(x), value),
    "zeros": lambda size, *_: np.zeros(tuple(size)), "zeros_like": lambda x, *_: np.zeros(np.shape(x)),
    "ones": lambda size, *_: np.ones(tuple(size)), "ones_like": lambda x, *_: np.ones(np.shape(x)),
    "arange": _arange, "scalar_tensor": lambda s, *_: np.array(s),
    # compute
    "linear": _linear, "mm": np.matmul, "bmm": np.matmul, "matmul": np.matmul,
    "addmm": lambda b, x, w, beta=1, alpha=1: beta * b + alpha * (x @ w),
    "_softmax": _softmax, "softmax": _softmax, "_log_softmax": _log_softmax, "log_softmax": _log_softmax,
    "native_layer_norm": _layer_norm, "embedding": lambda w, ids, *_: w[np.asarray(ids)],
    "convolution": _convolution, "_adaptive_avg_pool2d": _adaptive_avg_pool2d, "constant_pad_nd": _constant_pad_nd,
    "hardswish": lambda a: a * np.clip(a + 3, 0, 6) / 6, "hardsigmoid": lambda a: np.clip(a + 3, 0, 6) / 6,
    "leaky_relu": lambda a, slope=0.01: np.where(a >= 0, a, a * slope),
    # quantization (scale and zero point: scalars, or one-element tensors for the .tensor overloads)
    "quantize_per_tensor": lambda x, s, z, lo, hi, *_: np.clip(np.round(np.float32(x) * np.float32(1.0 / float(s)))
                                                               + float(z), lo, hi),
    "dequantize_per_tensor": lambda x, s, z, *_: ((np.asarray(x, np.float32) - float(z)) * np.float32(s)),
}


def op_key(name: str) -> str:
    """The kernel name of an ET-VK or ExecuTorch op name: ``aten.mean.dim`` and ``aten::mean.out``
    are both ``mean``."""
    base = name.replace("::", ".").split(".")
    return base[1] if len(base) > 1 else base[0]


def kernel(name: str) -> Callable[..., Any] | None:
    return KERNELS.get(op_key(name))
