"""Layer 3: op builders. Each adds the prepack nodes its weights need and its dispatch nodes,
and returns the ref of its output tensor."""

from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np

from ..errors import UnsupportedFeatureError
from ..ggml import FORMATS, INT8_ACTIVATION_FORMATS
from ..graph.compute_graph import ComputeGraph
from ..graph.nodes import DispatchNode, dispatch_groups, grid_groups
from ..graph.packers import get_packer
from ..graph.scheduler import align_up
from ..graph.values import (PACKED_DIM, TEXTURE_LAYOUTS, LazySource, Tensor, TensorRef, ValueRef, contiguous_strides,
                             gather_params)
from ..graph.windows import row_windows

LOCAL_SIZE = 64
#: CPU renderers' kernels: invocations per workgroup, at least (the renderer's SIMD width where
#: wider: _cpu_local; one SIMD group, so small work still spreads over the cores; a row of a norm,
#: a query row of attention each), and the linears' tile: rows per invocation (at CPU_LOCAL
#: invocations a workgroup: _cpu_rows), tokens per invocation when there are several (a batched
#: prompt); see _linear_quant and _linear_tiled
CPU_LOCAL = 8
LINEAR_ROWS_CPU = 32
#: a GGML-quantized linear over one token (decoding) on CPU renderers, in workgroups of
#: CPU_LOCAL: as few rows an invocation as make one wave of SIMD batches (a workgroup for each
#: worker thread: _gemv_rows), at most GEMV_ROWS_CPU.
#: lavapipe (AVX2), SmolLM2 decode steps in one process, 10 rounds of 16 steps each, either order:
#: 64 rows against 32 36.0 / 43.1 ms (min / median) against 42.1 / 50.6 and 43.1 / 47.9 against
#: 48.4 / 59.9 (16 and 8 rows ran as 32: more waves); a wave (576-row linears 36 rows, 1536-row
#: ones 96) against 64 rows 27.2 / 32.4 against 30.7 / 36.5 and 28.0 / 30.8 against 31.2 / 34.4
#: (the host's power management held at its lowest latency: /dev/cpu_dma_latency). SwiftShader
#: ran 64 rows slower than 32 (162 against 127 ms), a wave faster: 136.9 / 145.3 -> 125.6 / 128.2
#: and 125.0 / 141.7 -> 119.1 / 129.2. Workgroups wider than CPU_LOCAL (lavapipe at 512 bits),
#: where none of this is measured, take LINEAR_ROWS_CPU (and _cpu_rows).
GEMV_ROWS_CPU = 128
LINEAR_TOKENS_CPU = 8
#: tokens per invocation of tiles that multiply int8 activations (_q8_pairs), two a word: SmolLM2's
#: 64-token prompt, 16 against 8 in one process (min of 8 batches): lavapipe (AVX2) 413 -> 374 and
#: 388 -> 330 ms, SwiftShader 2970 -> 2441 ms
LINEAR_TOKENS_INT8 = 16
#: tokens per invocation of a GGML-quantized linear over a batch on GPUs (a row an invocation),
#: each weight block decoded once for them. Before, an invocation per row looped over all the
#: batch's tokens: an H100's 64-token SmolLM2 batch spent 92.5 ms in its 121 linears (1.44 ms a
#: token against a decode step's 3.26; a 576-row linear was 9 workgroups). With the GPU kernels
#: forced on lavapipe that prompt took 85.1 s, 5.6 s in tiles of 8 (logits within 4.2e-5); on an
#: H200 (2026-11-29) the batch's 121 linears took 6.43 ms in tiles of 8 (prefill 8233 tok/s)
LINEAR_TOKENS_GPU = 8
#: invocations that share a row of a GGML-quantized linear over one token (decoding) on GPUs, each
#: taking every GEMV_SPLIT_GPU-th block of it (glsl/linear_quant.glsl SPLIT; a power of two, at
#: most LOCAL_SIZE). An invocation a row left most of a GPU idle: an H200's SmolLM2 decode step
#: spent 3.24 of its 4.0 ms GPU time in the 121 linears (a 576-row linear was 9 workgroups). Not
#: measured on a GPU yet (1, the old kernel, against others: benchmarks/policy_ab.py
#: GEMV_SPLIT_GPU=1 default GEMV_SPLIT_GPU=32)
GEMV_SPLIT_GPU = 16
#: rows per invocation of a GGML-quantized linear's tiles (several tokens on a CPU renderer),
#: whose rows loop is unrolled (glsl/linear_quant.glsl). lavapipe, SmolLM2's linears at 32 tokens
#: in one process, GPU ms min (median), against 32 rows rolled: q4_0 9.8 (10.1) against 11.9
#: (12.1) for 2 layers, q8_0 11.6 (13.4) against 15.4 (20.4), q4_1 14.5 (15.2) against 16.3
#: (16.8) for 3 layers (16 rows rolled 16.6, 32 unrolled 15.9); SwiftShader within 3%. The
#: unrolled loop costs at pipeline creation: SmolLM2's 7 linear pipelines 229-254 ms against 130.
LINEAR_TILE_ROWS_CPU = 16
#: renderers whose tiles (quantized and fp32) take fewer rows: SwiftShader's compile time grows
#: with the unrolled tile (SmolLM2's session, its pipelines made: 18 s at 16 rows, 6.4 s at 8,
#: 3.2-3.9 s at 4, against 2.9 s before the tiles' token loops were unrolled; its 64-token prefill
#: batch 1.33, 1.46 and 1.71 s, against 6.8 s; `bench embed` of MiniLM 7.9 s at 16 rows, 5.7 at
#: 8, 5.1 at 4, batch 1 at 41, 51 and 47 sentences/s)
LINEAR_TILE_ROWS = {"swiftshader": 4}
#: CPU renderers that run the fp32 linear as glsl/linear_tiled.glsl (lavapipe, MiniLM at 32
#: sentences: linear_4x4 16.1 s, tiled 0.5-0.9 s, and about 3x faster again since its rows loop
#: is unrolled; SwiftShader, once its token loops were unrolled too: `bench embed` 13.0 -> 46.9
#: sentences/s at batch 1, 10.1 -> 36.8 at 32; fp32 linears of MiniLM's three shapes at one
#: token 1.63 -> 1.19 ms)
TILED_LINEAR_RENDERERS = {"lavapipe", "swiftshader"}
#: CPU renderers whose one-token linears read the weight from a storage buffer, not a texel buffer
#: (SwiftShader, SmolLM2 decode step in one process: 99.2 -> 87.6 ms; its tiles keep the texels:
#: without any, a 64-token batch 1.49 -> 2.33 s)
GEMV_STORAGE_RENDERERS = {"swiftshader"}
#: CPU renderers whose quantized tiles add each token's products in pairs (PAIRS in
#: glsl/linear_quant.glsl: lavapipe's code spills less, a SmolLM2 prefill batch 6-15% faster);
#: SwiftShader compiles that longer code 2.7x slower for a 2% faster tile
DOT_PAIRS_RENDERERS = {"lavapipe"}
#: CPU renderers whose attention in a batched prompt gives one invocation of glsl/sdpa_rows.glsl
#: the query heads that share a key/value head, up to SDPA_GROUP_MAX of them (GROUP: each key and
#: value row fetched once for them). lavapipe, SmolLM2's 64-token prefill in one process (3
#: sessions each): 153.8 -> 144.2 ms median, logits identical; SwiftShader 1497.9 -> 1531.4 (2
#: sessions each, within its noise), so it keeps a head per invocation.
SDPA_GROUP_RENDERERS = {"lavapipe"}
SDPA_GROUP_MAX = 4
#: CPU renderers whose one-token gated_linear runs as one dispatch (GATED in glsl/linear_quant.glsl:
#: x read once for both weights); elsewhere two linears (each normalizing x itself) and silu_mul.
#: SmolLM2's gate and up shape (2 x 1536 x 576, Q4_1), 30 in a graph, one process, executes in
#: turn, median of 9: lavapipe 7.4 ms in one dispatch against 13.0 in two; SwiftShader 23.4-32.0
#: against 19.0-26.4 (five runs), its tiles 0.74x the plain ones' time (simulate's gated_tiles)
GATED_GEMV_RENDERERS = {"lavapipe"}
#: False: the GPU kernels everywhere, also on CPU renderers (tests run both; benchmarks/gemv.py
#: compares the two): the linears' layouts (_linear_quant, _linear_tiled), the norms (_norm) and
#: attention (sdpa)
CPU_KERNELS = True


def _cpu_local(g: ComputeGraph) -> int:
    """A CPU renderer's workgroup size: CPU_LOCAL, or its SIMD width where wider (lavapipe at 512
    bits: 16; runtime.instance.LAVAPIPE_VECTOR_BITS), so no vector runs half empty (SmolLM2's
    64-token prefill at 512 bits took 290 ms in workgroups of 8, 147 in workgroups of 16)."""
    return max(CPU_LOCAL, g.device.simd_width)


#: a linear whose invocations would fill fewer workgroups than this at a CPU renderer's
#: workgroup size takes fewer rows per invocation (_cpu_rows)
SMALL_LINEAR_GROUPS = 4


def _cpu_rows(g: ComputeGraph, rows: int, n: int, m: int, tokens: int) -> int:
    """``rows`` per invocation of an ``n``-row linear over ``m`` tokens (``tokens`` an
    invocation), as tuned for workgroups of CPU_LOCAL; where the renderer's workgroups are wider
    and the linear would fill fewer than SMALL_LINEAR_GROUPS of them, scaled down so its
    workgroups cover as many rows as before and the cores still share them (lavapipe at 512
    bits: SmolLM2 decode step 31.1 ms at 32 rows, 27.9 at 16, 35.5 at 8; MiniLM `bench embed`
    at batch 1 80 sentences/s at 32 rows, 144 at 16; at batch 32 297 at 32 and 252 at 16)."""
    local = _cpu_local(g)
    if local > CPU_LOCAL and -(-n // rows) * -(-m // tokens) < SMALL_LINEAR_GROUPS * local:
        return max(4, rows * CPU_LOCAL // local)
    return rows


def _gemv_rows(g: ComputeGraph, n: int) -> int:
    """Rows per invocation of a one-token GGML linear of ``n`` rows on a CPU renderer: where its
    workgroups are CPU_LOCAL wide, as few (a multiple of 4) as give each worker thread one
    workgroup, so every thread runs one SIMD batch and none a second (SmolLM2's 576-row linears on
    2 threads: 36 rows, 16 invocations; at 64 rows 9 invocations take as long, at 32 two waves), at
    most GEMV_ROWS_CPU; in wider workgroups LINEAR_ROWS_CPU."""
    if _cpu_local(g) != CPU_LOCAL:
        return LINEAR_ROWS_CPU
    wave = max(1, g.device.cpu_threads) * CPU_LOCAL
    return min(GEMV_ROWS_CPU, -(-n // (4 * wave)) * 4)


def _buffer(g: ComputeGraph, ref: ValueRef, what: str) -> tuple[ValueRef, Tensor]:
    """(ref, tensor) of a float32 tensor in buffer storage: a texture input is converted on the
    device first (buffer-only kernels read it)."""
    t = _tensor(g, ref, what)
    if t.storage == "texture3d":
        ref = g.texture_to_buffer(ref)
        t = g.values[ref]
    return ref, t


def _kernel_input(g: ComputeGraph, ref: ValueRef, layout: str | None, texture_layout: str,
                  what: str) -> tuple[ValueRef, Tensor]:
    """(ref, tensor) of ``ref`` as a kernel with one texture layout reads it: a texture in
    ``layout`` (which must be ``texture_layout``), or a buffer when ``layout`` is None."""
    if layout is None:
        return _buffer(g, ref, f"{what} input")
    if layout != texture_layout:
        raise ValueError(f"{what}: on textures, {texture_layout} only, not {layout}")
    ref = to_texture(g, ref, layout)
    return ref, g.values[ref]


def _tensor(g: ComputeGraph, ref: ValueRef, what: str) -> Tensor:
    t = g.values[ref]
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} must be a device tensor, got {type(t).__name__}")
    if t.dtype != np.float32:
        raise TypeError(f"{what} {t.name!r} must be float32, got {t.dtype}")
    return t


def _weight(g: ComputeGraph, ref: ValueRef, packer: str) -> ValueRef:
    """A packed device tensor for ``ref``: packs a TensorRef (with its own block format when it
    is quantized), passes a device tensor through."""
    value = g.values[ref]
    if isinstance(value, TensorRef):
        return g.prepack_tensor(ref, value.quant or packer)
    return ref


#: the layouts of GGML weights, by the block format they hold: the file's blocks, or on CPU
#: renderers split into planes (packers.QuantPlanesPacker; a decode step's GEMVs, lavapipe,
#: SmolLM2's shapes in one process: 20 of them in q4_1 min 4.80 -> 4.09 ms, median 6.53 -> 5.19;
#: its Q8_0 output projection, 49152 rows, min 7.48 -> 6.26 ms, median 9.11 -> 7.05)
QUANT_LAYOUTS = {**{f: f for f in FORMATS}, **{f"{f}_planes": f for f in FORMATS}}


def _planes(g: ComputeGraph, ref: ValueRef) -> str | None:
    """The planes packer of a GGML weight source where a CPU renderer's kernels read it
    (CPU_KERNELS) whole (one binding) from host-visible memory the CPU writes, else None."""
    value = g.values[ref]
    if not (isinstance(value, TensorRef) and value.quant in FORMATS and CPU_KERNELS and g.device.is_cpu
            and g.device.host_visible_device_local):
        return None
    packer = f"{value.quant}_planes"
    return packer if get_packer(packer).packed_nbytes(value) <= g.max_binding_nbytes else None


def _linear_weight(g: ComputeGraph, ref: ValueRef) -> ValueRef:
    """A linear's packed weight: :func:`_weight`'s, but GGML blocks in planes (:func:`_planes`),
    and an fp32 weight that linear_tiled reads as it is (_rows_weight) unpacked."""
    planes = _planes(g, ref)
    if planes:
        return g.prepack_tensor(ref, planes)
    return _weight(g, ref, "identity" if _rows_weight(g, ref) else "linear_4x4")


def _rows_weight(g: ComputeGraph, ref: ValueRef) -> bool:
    """Whether an fp32 linear weight source goes to the device as it is ([N, K] rows, the
    identity packer: a copy, written straight into host-visible device memory) rather than in
    4x4 blocks: with config ``graph.fp32_linear_layout = "rows"`` where the linear runs
    linear_tiled (a CPU renderer, K a multiple of 4), which reads either as fast (its W_ROWS;
    MiniLM's linears, one process, executes in turn, rows against blocks: lavapipe 0.96-1.03x,
    SwiftShader 0.93-1.08x at 1, 16 and 256 tokens), and the load then packs none of them
    (MiniLM's staged load against the copy floor, 2026-11-29: lavapipe 0.72x -> 1.18x,
    SwiftShader 0.62x -> 1.20x). Not the default: on the two renderers this project tests on,
    fp32 models would then pack nothing, and staged prepack, the simulator and the tuner would
    no longer see there the work a GPU does."""
    value = g.values[ref]
    return (g.config.graph.fp32_linear_layout == "rows" and isinstance(value, TensorRef) and not value.quant
            and len(value.shape) == 2 and _tiled(g, value.shape[1]))


def _tiled(g: ComputeGraph, k: int) -> bool:
    """Whether an fp32 linear of ``k`` inputs runs linear_tiled (_linear_tiled) on this device."""
    return CPU_KERNELS and g.device.is_cpu and g.device.renderer in TILED_LINEAR_RENDERERS and k % 4 == 0


def tied_table(g: ComputeGraph, ref: ValueRef) -> ValueRef:
    """A table that both an embedding and a linear read (a model's tied input and output
    embeddings), packed once: GGML blocks in planes where :func:`linear` would put them, else
    as it is."""
    return g.prepack_tensor(ref, _planes(g, ref))


def _one_window(g: ComputeGraph, ref: ValueRef, rows: int, what: str) -> list[tuple[int, int, tuple]]:
    """:func:`_row_windows`, where a weight in planes must be bound whole."""
    t = g.values[ref]
    if QUANT_LAYOUTS.get(t.layout, t.layout) != t.layout and t.nbytes > g.max_binding_nbytes:
        raise ValueError(f"{what}: {t.name} in {t.layout} ({t.nbytes} bytes) is larger than one binding "
                         f"({g.max_binding_nbytes} bytes)")
    return _row_windows(g, ref, rows)


def _row_windows(g: ComputeGraph, ref: ValueRef, rows: int, unit: int = 1) -> list[tuple[int, int, tuple]]:
    """``[(r0, r1, binding)]``: the whole weight, or windows of rows that each fit one binding
    (for weights beyond maxStorageBufferRange)."""
    t = g.values[ref]
    if t.nbytes <= g.max_binding_nbytes:
        return [(0, rows, ref)]
    row_nbytes = t.nbytes // ((rows + unit - 1) // unit * unit)
    try:
        windows = row_windows(rows, (row_nbytes,), g.max_binding_nbytes, g.staging_alignment, unit)
    except ValueError as exc:
        raise UnsupportedFeatureError("maxStorageBufferRange",
                                      f"tensor {t.name!r} of {t.nbytes} bytes cannot be read in windows ({exc})") from None
    out = []
    for r0, r1 in windows:
        off = r0 * row_nbytes
        span = align_up((r1 - r0 + unit - 1) // unit * unit * row_nbytes, 4)  # whole words (GGML rows may end mid-word)
        out.append((r0, r1, (ref, off, min(span, t.nbytes - off))))
    return out


def _groups(g: ComputeGraph, work: int) -> tuple[int, int, int]:
    return (dispatch_groups(work, LOCAL_SIZE, g.max_groups_x), 1, 1)


LINEAR_ACTS = {"silu", "relu", "gelu", "gelu_tanh", "sigmoid", "tanh"}  # linear(act=): unary ops without parameters
#: an RMSNorm a linear applies to its input first: (its weight [K], eps)
Norm = tuple[ValueRef, float]


def linear(g: ComputeGraph, x: ValueRef, weight: ValueRef, bias: ValueRef | None = None,
           residual: ValueRef | None = None, act: str = "", layout: str | None = None,
           norm: Norm | None = None) -> ValueRef:
    """``y = x @ weight.T (+ bias) (+ residual)``; ``weight`` is ``[out_features, in_features]``:
    fp32 (packed in 4x4 blocks) or GGML-quantized (q4_0, q4_1, q8_0: the file's blocks). ``act`` (one of :data:`LINEAR_ACTS`) is applied to ``x @ weight.T + bias``, then
    ``residual`` (``[M, N]``, a skip connection) added; both in the linear's own dispatch where
    its kernel can. With ``layout="width_packed"`` (fp32 weights, no residual or activation)
    ``x`` may have up to 4 dims ``[..., K]`` and ``y`` ``[..., N]`` is a width-packed texture.
    ``norm`` (a :data:`Norm`): x is :func:`rms_norm`'d first, inside a GGML linear's dispatch."""
    if layout is not None:
        return _linear_texture(g, _normed(g, x, norm), weight, bias, layout)
    x, xt = _buffer(g, x, "linear input")
    out_shape = (xt.shape[0], g.values[weight].shape[0])
    if residual is not None and tuple(g.values[residual].shape) != out_shape:
        raise ValueError(f"linear: residual {g.values[residual].shape} is not the output's {out_shape}")
    w_ref = _linear_weight(g, weight)
    w = g.values[w_ref]
    if len(xt.shape) != 2 or len(w.shape) != 2 or w.shape[1] != xt.shape[1]:
        raise ValueError(f"linear: input {xt.shape} and weight {w.shape} do not fit ([M, K] x [N, K])")
    (m, k), n = xt.shape, w.shape[0]
    y = g.add_tensor((m, n), np.float32)
    if act and act not in LINEAR_ACTS:
        raise ValueError(f"linear: activation {act!r} is not one of {', '.join(sorted(LINEAR_ACTS))}")
    if w.layout in QUANT_LAYOUTS:
        if bias is not None:
            raise ValueError("linear: a bias with quantized weights is not supported")
        if act:
            _linear_quant(g, y, x, w_ref, m, n, k, norm=norm)
            y = unary(g, y, act)
            return y if residual is None else add(g, residual, y)
        _linear_quant(g, y, x, w_ref, m, n, k, residual, norm=norm)
        return y
    x = _normed(g, x, norm)
    extra = []
    if bias is not None:
        if tuple(g.values[bias].shape) != (n,):
            raise ValueError(f"linear: bias {g.values[bias].shape} does not match {n} output features")
        extra.append(_weight(g, bias, "identity"))
    if _tiled(g, k):
        _linear_tiled(g, y, x, w_ref, m, n, k, extra, residual, act)
        return y
    for r0, r1, wb in _row_windows(g, w_ref, n, unit=4):
        g.add_dispatch(DispatchNode("linear_4x4", [y, x, wb, *extra], struct.pack("<IIIII", m, r1 - r0, k, r0, n),
                                    {0: LOCAL_SIZE}, _groups(g, m * ((r1 - r0 + 3) // 4)),
                                    {"HAS_BIAS": int(bias is not None)}, weight_passes=m,
                                    linear_shape=(m, r1 - r0, k), invocations=m * ((r1 - r0 + 3) // 4)))
    if act:
        y = unary(g, y, act)
    return y if residual is None else add(g, residual, y)


def _normed(g: ComputeGraph, x: ValueRef, norm: Norm | None) -> ValueRef:
    """``x``, or with ``norm`` :func:`rms_norm` of it in a dispatch of its own (for the linears
    whose kernel does not normalize)."""
    return x if norm is None else rms_norm(g, x, *norm)


def _norm_weight(g: ComputeGraph, norm: Norm, k: int) -> tuple[ValueRef, float]:
    _check_norm_params(g, "rms_norm", [norm[0]], k)
    return _weight(g, norm[0], "identity"), float(norm[1])


def _check_norm_params(g: ComputeGraph, kind: str, params: list[ValueRef], d: int) -> None:
    """A norm's weight (and bias) must be ``[d]``: ValueError naming which."""
    for what, ref in zip(("weight", "bias"), params):
        if tuple(g.values[ref].shape) != (d,):
            raise ValueError(f"{kind}: {what} {g.values[ref].shape} does not match dimension {d}")


def _linear_texture(g: ComputeGraph, x: ValueRef, weight: ValueRef, bias: ValueRef | None, layout: str) -> ValueRef:
    """An fp32 linear on width-packed textures (glsl/linear_texture.glsl)."""
    x, xt = _kernel_input(g, x, layout, "width_packed", "linear")
    w_ref = _weight(g, weight, "linear_4x4")
    w = g.values[w_ref]
    if w.layout != "linear_4x4" or w.nbytes > g.max_binding_nbytes:
        raise ValueError(f"linear: on textures, fp32 weights within one binding; not {w.layout} {w.nbytes} bytes")
    if not 1 <= len(xt.shape) <= 4 or xt.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input {xt.shape} and weight {w.shape} do not fit ([..., K] x [N, K])")
    n = w.shape[0]
    extra = []
    if bias is not None:
        if tuple(g.values[bias].shape) != (n,):
            raise ValueError(f"linear: bias {g.values[bias].shape} does not match {n} output features")
        extra.append(_weight(g, bias, "identity"))
    y = g.add_texture((*xt.shape[:-1], n), "width_packed")
    g.add_dispatch(DispatchNode("linear_texture", [y, x, w_ref, *extra], struct.pack("<II", xt.shape[-1], n),
                                {0: LOCAL_SIZE}, _groups(g, int(np.prod(g.values[y].extents()))),
                                {"HAS_BIAS": int(bias is not None)}))
    return y


def _texel_ok(g: ComputeGraph, binding: ValueRef | tuple, total_nbytes: int, texel_nbytes: int) -> bool:
    """Whether ``binding`` (a tensor, or a (tensor, offset, nbytes) window) can be read as a
    uniform texel buffer of ``texel_nbytes`` texels on this device."""
    lim = g.device.limits
    offset, nbytes = binding[1:] if isinstance(binding, tuple) else (0, total_nbytes)
    return nbytes // texel_nbytes <= lim["maxTexelBufferElements"] and offset % lim["minTexelBufferOffsetAlignment"] == 0


def _stores_vec4(tokens: int, rows: int, n: int, r0: int, r1: int) -> int:
    """Whether a tile kernel writes y (and the residual, and linear_tiled's bias) as vec4s, four
    rows a store (their ``Y4``): for tiles (several tokens) whose rows per invocation, row window,
    its start and y's row length are multiples of 4. lavapipe stores lane by lane, a vector's
    components in one pass over the lanes."""
    return int(tokens > 1 and rows % 4 == 0 and n % 4 == 0 and r0 % 4 == 0 and (r1 - r0) % 4 == 0)


def _linear_groups(g: ComputeGraph, tokens: int, work: int, local: int) -> tuple[int, int, int]:
    """A linear's workgroups: tiles (several tokens) get an invocation each, their kernels have no
    grid-stride loop (lavapipe ran them 5-20% faster without); one token at a time loops over rows."""
    if tokens > 1:
        return grid_groups(work, local, g.max_groups_x)
    return dispatch_groups(work, local, g.max_groups_x), 1, 1


def _linear_tiled(g: ComputeGraph, y: ValueRef, x: ValueRef, w_ref: ValueRef, m: int, n: int, k: int,
                  bias: list[ValueRef], residual: ValueRef | None, act: str) -> None:
    """The dispatches of an fp32 linear on CPU renderers, one per window of weight rows
    (glsl/linear_tiled.glsl): LINEAR_ROWS_CPU rows (tiles: LINEAR_TILE_ROWS per renderer) for up
    to LINEAR_TOKENS_CPU tokens per invocation, the 4x4-packed weight and x read as RGBA32F texels
    where the device allows."""
    x_texel = _texel_ok(g, x, m * k * 4, 16)
    extra = bias + ([_buffer(g, residual, "linear residual")[0]] if residual is not None else [])
    tokens = min(LINEAR_TOKENS_CPU, m)
    rows = _cpu_rows(g, LINEAR_TILE_ROWS.get(g.device.renderer, LINEAR_ROWS_CPU) if tokens > 1 else LINEAR_ROWS_CPU,
                     n, m, tokens)
    local = _cpu_local(g)
    w_rows = int(g.values[w_ref].layout != "linear_4x4")  # [N, K] as stored: windows of any rows
    for r0, r1, wb in _row_windows(g, w_ref, n, unit=1 if w_rows else 4):
        texel = _texel_ok(g, wb, g.values[w_ref].nbytes, 16)
        work = -(-(r1 - r0) // rows) * -(-m // tokens)
        g.add_dispatch(DispatchNode("linear_tiled", [y, x, wb, *extra], struct.pack("<IIIII", m, r1 - r0, k, r0, n),
                                    {0: local}, _linear_groups(g, tokens, work, local),
                                    {"R4": rows // 4, "TOKENS": tokens, "TEXEL": int(texel),
                                     "W_ROWS": w_rows,
                                     "X_TEXEL": int(x_texel), "HAS_BIAS": len(bias),
                                     "RESIDUAL": int(residual is not None), "ACT": 1 + UNARY_OPS[act] if act else 0,
                                     "Y4": _stores_vec4(tokens, rows, n, r0, r1)},
                                    texels=({1: "rgba32f"} if x_texel else {}) | ({2: "rgba32f"} if texel else {}),
                                    weight_passes=-(-m // tokens), linear_shape=(m, r1 - r0, k), invocations=work))


def _linear_quant(g: ComputeGraph, y: ValueRef, x: ValueRef, w_ref: ValueRef, m: int, n: int, k: int,
                  residual: ValueRef | None = None, up: ValueRef | None = None, norm: Norm | None = None) -> None:
    """The dispatches of a GGML-quantized linear, one per window of weight rows. On CPU renderers
    (lavapipe, SwiftShader) an invocation computes rows of one token (_gemv_rows), or
    LINEAR_TILE_ROWS_CPU rows for up to LINEAR_TOKENS_CPU tokens (LINEAR_TILE_ROWS: per
    renderer), so a weight block is decoded once for all of them and x read once for all rows; the
    weight and x are read as uniform texel buffers where the device allows one that large (a
    one-token linear's weight not on GEMV_STORAGE_RENDERERS): lavapipe runs a storage-buffer load
    inside a loop as a loop over the SIMD lanes, a texel fetch as one gather
    (glsl/linear_quant.glsl; figures in benchmarks/gemv.py). On GPUs an invocation computes one
    row, for LINEAR_TOKENS_GPU tokens of a batch, and GEMV_SPLIT_GPU invocations share a row of
    one token (their sums added in shared memory). ``residual`` is added to y; with ``up`` (a
    second weight of w's format and shape, within one binding) y is silu(x . w) * (x . up)
    (gated_linear); with ``norm`` x is RMS-normalized on the way in: in the same dispatch one
    token at a time, in one before it for tiles. With config ``graph.int8_activations`` tiles of
    Q4 weights in planes multiply x in int8, made (and normalized) by a dispatch before them
    (_q8_pairs), LINEAR_TOKENS_INT8 tokens an invocation."""
    w = g.values[w_ref]
    cpu = CPU_KERNELS and g.device.is_cpu
    fmt, planes = QUANT_LAYOUTS[w.layout], w.layout != QUANT_LAYOUTS[w.layout]  # planes: on CPU renderers
    int8 = (m > 1 and planes and fmt in INT8_ACTIVATION_FORMATS and g.config.graph.int8_activations
            and _texel_ok(g, x, m * k * 4, 16))
    tokens = min(LINEAR_TOKENS_INT8 if int8 else LINEAR_TOKENS_CPU, m) if cpu else min(LINEAR_TOKENS_GPU, m)
    rows = _cpu_rows(g, LINEAR_TILE_ROWS.get(g.device.renderer, LINEAR_TILE_ROWS_CPU) if tokens > 1
                     else _gemv_rows(g, n), n, m, tokens) if cpu else 1
    local = _cpu_local(g) if cpu else LOCAL_SIZE
    split = GEMV_SPLIT_GPU if tokens == 1 and not cpu else 1  # invocations a row shares
    if split & (split - 1) or not 0 < split <= local:  # the shader's reduction halves it; a workgroup holds a row
        raise ValueError(f"GEMV_SPLIT_GPU must be a power of two of at most {local}, got {split}")
    if int8:  # x in int8 (and normalized) once, for every tile
        x, norm = _q8_pairs(g, x, m, k, norm), None
    elif norm is not None and tokens > 1:  # tiles would normalize each token again: once, apart
        x, norm = _normed(g, x, norm), None
    # x as RGBA32F texels on CPU renderers and for GPUs' tiles: lavapipe runs a one-token linear's x
    # loads from a storage buffer lane by lane (SmolLM2 decode step, one process, min of 6 rounds:
    # 58.5 -> 47.8 ms, logits identical; SwiftShader 130.1 -> 123.8)
    x_texel = (tokens > 1 or cpu) and _texel_ok(g, x, g.values[x].nbytes, 16)
    extra = [_buffer(g, residual, "linear residual")[0]] if residual is not None else []
    weights = 1 if up is None else 2
    gamma, eps = _norm_weight(g, norm, k) if norm is not None else (None, 0.0)
    at = 3 + len(extra) + (up is not None)  # the norm's weight's binding
    g_texel = cpu and gamma is not None and _texel_ok(g, gamma, k * 4, 16)
    word = "rgba32ui" if planes else "r32ui"  # the weight's texels: 16 bytes of a block's quants, or a word
    for r0, r1, wb in _one_window(g, w_ref, n, "linear"):
        texel = cpu and _texel_ok(g, wb, w.nbytes, 16 if planes else 4) and not (
            tokens == 1 and g.device.renderer in GEMV_STORAGE_RENDERERS)
        work = -(-(r1 - r0) // rows) * -(-m // tokens) * split
        args = [y, x, wb, *extra, *([up] if up is not None else []), *([gamma] if gamma is not None else [])]
        # planes' heads also through a word view of the same buffer where the device takes one
        # that long (the shader's HEAD_AT): a head one fetch, not a texel of four and a pick
        heads = len(args) if planes and texel and _texel_ok(g, wb, w.nbytes, 4) else 0
        if heads:
            args += [wb, *([up] if up is not None else [])]
        g.add_dispatch(DispatchNode("linear_quant", args,
                                    struct.pack("<IIIII", m, r1 - r0, k, r0, n)
                                    + (struct.pack("<f", eps) if gamma is not None else b""),
                                    {0: local}, _linear_groups(g, tokens, work, local),
                                    {"QTYPE": FORMATS[fmt].qtype, "PLANES": int(planes), "ROWS": rows, "TOKENS": tokens,
                                     "TEXEL": int(texel), "X_TEXEL": int(x_texel), "RESIDUAL": len(extra),
                                     "GATED": int(up is not None), "NORM": int(gamma is not None),
                                     "G_TEXEL": int(g_texel), "HEAD_AT": heads,
                                     "PAIRS": int(tokens > 1 and not int8 and g.device.renderer in DOT_PAIRS_RENDERERS),
                                     "Q8X": int(int8), "SPLIT": split,
                                     "Y4": _stores_vec4(tokens, rows, n, r0, r1)},
                                    texels=({1: "rgba32ui" if int8 else "rgba32f"} if x_texel else {})
                                    | ({2: word} if texel else {}) | ({3: word} if texel and up is not None else {})
                                    | ({at: "rgba32f"} if g_texel else {})
                                    | {i: "r32ui" for i in range(heads, len(args) if heads else 0)},
                                    weight_passes=-(-m // tokens), weights=weights,
                                    linear_shape=(m, weights * (r1 - r0), k), invocations=work))


def _q8_pairs(g: ComputeGraph, x: ValueRef, m: int, k: int, norm: Norm | None) -> ValueRef:
    """x [m, k] (RMS-normalized first with ``norm``) in glsl/q8_pairs.glsl's int8 form, as the
    tiles of Q4 weights in planes read it where ``graph.int8_activations`` is on (linear_quant.glsl
    Q8X): the quants of ceil(m / 2) pairs of tokens, a word of two per value, then the scales of
    each pair's blocks. Two tokens' products come from one 32-bit integer multiply, where float32
    takes a multiply and an add for one: SmolLM2's 64-token prompt with and without, one process,
    min of 8 batches, lavapipe (AVX2) 562 -> 419 ms (tiles of 8 tokens both) and 438 -> 327, 570 ->
    426 (16); SwiftShader 3463 -> 2276 (8). An invocation per pair of tokens (dispatch_groups)."""
    pairs = (m + 1) // 2
    q = g.add_tensor((pairs * k + pairs * (k // 32) * 4,), np.int32)
    gamma, eps = _norm_weight(g, norm, k) if norm is not None else (None, 0.0)
    local = _cpu_local(g)
    g.add_dispatch(DispatchNode("q8_pairs", [q, x, *([gamma] if gamma is not None else [])],
                                struct.pack("<IIf", m, k, eps), {0: local},
                                (dispatch_groups(pairs, local, g.max_groups_x), 1, 1), {"NORM": int(gamma is not None)},
                                texels={1: "rgba32f", **({2: "rgba32f"} if gamma is not None else {})}))
    return q


def stacked_linear(g: ComputeGraph, x: ValueRef, weights: Sequence[ValueRef], norm: Norm | None = None) -> ValueRef:
    """``x`` times the ``weights`` (``[N_i, K]`` each) stacked row after row: ``y [M, sum N_i]``,
    each weight's outputs in its columns, in order (a decoder layer's q, k and v projections).
    GGML weights of one format, not packed yet, become one weight at load (their sources' bytes
    one after another) read by one linear dispatch: fewer dispatches, and more rows to share out
    among a CPU renderer's threads than 192 (SmolLM2's k and v) give. Otherwise a linear per
    weight, copied into its columns. ``norm``: as :func:`linear`'s."""
    x, xt = _buffer(g, x, "stacked_linear input")
    refs = [g.values[w] for w in weights]
    if (len(refs) > 1 and all(isinstance(r, TensorRef) and r.quant for r in refs)
            and len({(r.quant, r.shape[1:], r.dtype) for r in refs}) == 1):
        name = "+".join(r.name for r in refs)
        if name in g.names:  # stacked for another entry point already: packed once
            return linear(g, x, g.names[name], norm=norm)
        sources = [r.source for r in refs]
        nbytes = sum(r.nbytes for r in refs)

        def load() -> np.ndarray:
            return np.concatenate([s.read() for s in sources])

        def release() -> None:
            for s in sources:
                s.release()
        stacked = g.add_tensorref(LazySource(nbytes, load, release), name,
                                  shape=(sum(r.shape[0] for r in refs), *refs[0].shape[1:]), dtype=refs[0].dtype,
                                  quant=refs[0].quant)
        return linear(g, x, stacked, norm=norm)
    x = _normed(g, x, norm)
    parts = [linear(g, x, w) for w in weights]
    widths = [g.values[p].shape[1] for p in parts]
    m, n = xt.shape[0], sum(widths)
    y = g.add_tensor((m, n), np.float32)
    for p, col, width in zip(parts, np.cumsum([0, *widths[:-1]]), widths):
        strided_copy(g, y, p, (m, width), (width, 1), (n, 1), out_base=int(col))
    return y


def gated_linear(g: ComputeGraph, x: ValueRef, w_gate: ValueRef, w_up: ValueRef, norm: Norm | None = None) -> ValueRef:
    """``silu(x @ w_gate.T) * (x @ w_up.T)``, a Llama MLP's SwiGLU. One dispatch where both weights
    are GGML blocks of one format and shape, each within one binding (x read once for both, no
    separate silu_mul pass: glsl/linear_quant.glsl GATED); else two linears and silu_mul.
    ``norm``: as :func:`linear`'s."""
    x, xt = _buffer(g, x, "gated_linear input")
    wg, wu = _linear_weight(g, w_gate), _linear_weight(g, w_up)
    tg, tu = g.values[wg], g.values[wu]
    one_dispatch = (xt.shape[0] > 1 or not (CPU_KERNELS and g.device.is_cpu)
                    or g.device.renderer in GATED_GEMV_RENDERERS)
    if (one_dispatch and tg.layout in QUANT_LAYOUTS and tu.layout == tg.layout and tg.shape == tu.shape
            and len(xt.shape) == 2 and xt.shape[1] == tg.shape[1] and max(tg.nbytes, tu.nbytes) <= g.max_binding_nbytes):
        (m, k), n = xt.shape, tg.shape[0]
        y = g.add_tensor((m, n), np.float32)
        _linear_quant(g, y, x, wg, m, n, k, up=wu, norm=norm)
        return y
    if tg.layout in QUANT_LAYOUTS and tu.layout in QUANT_LAYOUTS and len(xt.shape) == 2 and xt.shape[0] == 1:
        return silu_mul(g, linear(g, x, wg, norm=norm), linear(g, x, wu, norm=norm))  # each normalizes x itself
    x = _normed(g, x, norm)
    return silu_mul(g, linear(g, x, wg), linear(g, x, wu))


def _broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of a C-contiguous ``shape`` per dim of ``out`` (4 dims), 0 where broadcast."""
    shape = (1,) * (len(out) - len(shape)) + tuple(shape)
    strides = [0 if dim == 1 else s for dim, s in zip(shape, contiguous_strides(shape))]
    return [0] * (4 - len(strides)) + strides


BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "maximum": 5, "minimum": 6, "gt": 7, "lt": 8,
              "ge": 9, "le": 10, "eq": 11, "ne": 12, "logical_and": 13, "logical_or": 14, "div_floor": 15,
              "div_trunc": 16, "silu_mul": 17}
_VEC4_OPS = {"add", "sub", "mul", "div", "maximum", "minimum", "silu_mul"}  # glsl/binary.glsl VEC4


def _dims4(name: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{name}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None
    if len(shape) > 4:
        raise ValueError(f"{name}: {len(shape)}-D broadcasting is not supported (at most 4 dims)")
    return shape


def _texture_operand(g: ComputeGraph, ref: ValueRef, layout: str, what: str) -> ValueRef:
    """``ref`` as a texture for glsl/elementwise_texture.glsl, which reads any layout: a constant
    packed by the standard packer into ``layout``, a buffer converted, a texture as it is."""
    value = g.values[ref]
    if isinstance(value, TensorRef):
        if 1 <= len(value.shape) <= 4 and value.dtype == np.float32:
            return g.prepack_tensor(ref, f"texture3d_{layout}")
        ref = g.prepack_tensor(ref)
    return ref if _tensor(g, ref, what).storage == "texture3d" else to_texture(g, ref, layout)


def _elementwise_texture(g: ComputeGraph, arity: int, inputs: list[ValueRef], layout: str, what: str,
                         params: tuple[float, ...], defines: dict[str, int]) -> ValueRef:
    """An elementwise op on textures: the output a ``layout`` texture of the inputs' broadcast
    shape (up to 4 dims), the inputs textures of any layout (converted or packed if not)."""
    refs = [_texture_operand(g, r, layout, f"{what} input {k}") for k, r in enumerate(inputs)]
    ts = [g.values[r] for r in refs]
    out = g.add_texture(_dims4(what, *(t.shape for t in ts)), layout)
    ot = g.values[out]
    sizes = [ot.sizes()] + [t.sizes() for t in ts] + [(1, 1, 1, 1)] * (3 - arity)
    packed = [PACKED_DIM[t.layout] for t in (ot, *ts)] + [0] * (3 - arity)
    same = [int(t.sizes() == ot.sizes() and t.layout == ot.layout) for t in ts] + [0] * (4 - arity)
    push = struct.pack("<24I4f", *(d for s in sizes for d in s), *packed, *same, *params, *(0.0,) * (4 - len(params)))
    g.add_dispatch(DispatchNode("elementwise_texture", [out, *refs], push, {0: LOCAL_SIZE},
                                _groups(g, int(np.prod(ot.extents()))), {"ARITY": arity, **defines}))
    return out


def binary(g: ComputeGraph, a: ValueRef, b: ValueRef, op: str, alpha: float = 1.0, layout: str | None = None) -> ValueRef:
    """Elementwise ``a OP b`` with numpy broadcasting (up to 4 dims); ``op`` is one of
    :data:`BINARY_OPS` (comparisons and logic give 1.0 or 0.0); ``alpha`` scales ``b`` in add
    and sub. With ``layout`` (one of TEXTURE_LAYOUTS) the output is a texture in it, and the
    op reads textures (glsl/elementwise_texture.glsl)."""
    if layout:
        return _elementwise_texture(g, 2, [a, b], layout, op, (alpha,), {"OP": BINARY_OPS[op]})
    a, at = _buffer(g, a, f"{op} input a")
    b = _weight(g, b, "identity")
    b, bt = _buffer(g, b, f"{op} input b")
    shape = _dims4(op, at.shape, bt.shape)
    dims = [1] * (4 - len(shape)) + list(shape)
    n = int(np.prod(shape))
    out = g.add_tensor(shape, np.float32)
    push = struct.pack("<13If", *dims, *_broadcast_strides(at.shape, shape), *_broadcast_strides(bt.shape, shape), n,
                       alpha)
    flat = tuple(at.shape) == tuple(bt.shape) == tuple(shape)  # no broadcast: no index arithmetic
    vec4 = flat and n % 4 == 0 and op in _VEC4_OPS
    g.add_dispatch(DispatchNode("binary", [out, a, b], push, {0: LOCAL_SIZE}, _groups(g, n // 4 if vec4 else n),
                                {"OP": BINARY_OPS[op], "FLAT": int(flat), "VEC4": int(vec4)}))
    return out


def add(g: ComputeGraph, a: ValueRef, b: ValueRef) -> ValueRef:
    return binary(g, a, b, "add")


def sub(g: ComputeGraph, a: ValueRef, b: ValueRef) -> ValueRef:
    return binary(g, a, b, "sub")


def mul(g: ComputeGraph, a: ValueRef, b: ValueRef) -> ValueRef:
    return binary(g, a, b, "mul")


def silu_mul(g: ComputeGraph, a: ValueRef, b: ValueRef) -> ValueRef:
    """``silu(a) * b`` in one dispatch (a gated MLP's activation)."""
    return binary(g, a, b, "silu_mul")


def where(g: ComputeGraph, cond: ValueRef, a: ValueRef, b: ValueRef, layout: str | None = None) -> ValueRef:
    """``a`` where ``cond`` is non-zero, else ``b`` (numpy broadcasting, up to 4 dims); with
    ``layout``, on textures as :func:`binary`."""
    if layout:
        return _elementwise_texture(g, 3, [cond, a, b], layout, "where", (), {})
    refs = []
    for what, ref in (("condition", cond), ("a", a), ("b", b)):
        refs.append(_buffer(g, _weight(g, ref, "identity"), f"where {what}"))
    shape = _dims4("where", *(t.shape for _, t in refs))
    n = int(np.prod(shape))
    out = g.add_tensor(shape, np.float32)
    strides = [s for _, t in refs for s in _broadcast_strides(t.shape, shape)]
    push = struct.pack("<17I", *([1] * (4 - len(shape)) + list(shape)), *strides, n)
    g.add_dispatch(DispatchNode("where", [out, *(r for r, _ in refs)], push, {0: LOCAL_SIZE}, _groups(g, n)))
    return out


UNARY_OPS = {"silu": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "sigmoid": 4, "tanh": 5, "exp": 6, "sqrt": 7,
             "rsqrt": 8, "neg": 9, "abs": 10, "clamp": 11, "affine": 12, "pow": 13, "logical_not": 14, "log": 15,
             "gt": 16, "lt": 16, "ge": 16, "le": 16, "eq": 16, "ne": 16, "rdiv": 17, "rsub": 18, "sin": 19,
             "cos": 20, "log10": 21, "round": 22, "hardswish": 23, "leaky_relu": 24, "hardshrink": 25, "quantize": 26}
_COMPARE = ("gt", "lt", "ge", "le", "eq", "ne")


def unary(g: ComputeGraph, a: ValueRef, op: str, p0: float = 0.0, p1: float = 0.0, p2: float = 0.0,
          p3: float = 0.0, layout: str | None = None) -> ValueRef:
    """Elementwise ``f(a)`` for ``op`` in :data:`UNARY_OPS`: clamp to ``[p0, p1]``, affine
    ``a * p0 + p1``, ``pow(a, p0)``, comparisons with the scalar ``p0`` (1.0 or 0.0), ``rdiv``
    ``p0 / a``, ``rsub`` ``p0 - a``, ``leaky_relu`` slope ``p0``, ``hardshrink`` lambda ``p0``,
    ``quantize`` ``clamp(round(a * p0) + p1, p2, p3)`` (inverse scale, zero point, range). With
    ``layout``, on textures as :func:`binary`."""
    defines = {"OP": UNARY_OPS[op]}
    if op in _COMPARE:
        defines["OP2"] = _COMPARE.index(op)
    if layout:
        return _elementwise_texture(g, 1, [a], layout, op, (p0, p1, p2, p3), defines)
    a, at = _buffer(g, a, f"{op} input")
    out = g.add_tensor(at.shape, np.float32)
    n = at.nbytes // 4
    g.add_dispatch(DispatchNode("unary", [out, a], struct.pack("<Iffff", n, p0, p1, p2, p3), {0: LOCAL_SIZE}, _groups(g, n),
                                defines))
    return out


def silu(g: ComputeGraph, a: ValueRef) -> ValueRef:
    return unary(g, a, "silu")


def relu(g: ComputeGraph, a: ValueRef) -> ValueRef:
    return unary(g, a, "relu")


def gelu(g: ComputeGraph, a: ValueRef, approximate: str = "none", layout: str | None = None) -> ValueRef:
    """GELU, exact (erf) form or ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")
    return unary(g, a, "gelu" if approximate == "none" else "gelu_tanh", layout=layout)


def layer_norm(g: ComputeGraph, x: ValueRef, weight: ValueRef, bias: ValueRef, eps: float = 1e-5,
               layout: str | None = None) -> ValueRef:
    """LayerNorm over the last dimension of a ``[M, D]`` tensor (with ``layout="width_packed"``:
    of a texture of up to 4 dims, into one)."""
    return _norm(g, "layer_norm", x, [weight, bias], eps, layout)


def rms_norm(g: ComputeGraph, x: ValueRef, weight: ValueRef, eps: float = 1e-6, layout: str | None = None) -> ValueRef:
    """RMSNorm over the last dimension of a ``[M, D]`` tensor, scaled by ``weight[D]`` (with
    ``layout``, as :func:`layer_norm`)."""
    return _norm(g, "rms_norm", x, [weight], eps, layout)


ROW_TEXTURE_OPS = {"softmax": 0, "log_softmax": 1, "layer_norm": 2, "rms_norm": 3}  # glsl/rows_texture.glsl


def _rows_texture(g: ComputeGraph, kind: str, x: ValueRef, params: list[ValueRef], eps: float, layout: str) -> ValueRef:
    """``kind`` over the last dim of a texture of up to 4 dims, into a width-packed texture (a
    row per invocation; x converted to width-packed first if it is not)."""
    x, xt = _kernel_input(g, x, layout, "width_packed", kind)
    if not 1 <= len(xt.shape) <= 4:
        raise ValueError(f"{kind}: on textures, inputs of 1-4 dims, not {xt.shape}")
    d = xt.shape[-1]
    _check_norm_params(g, kind, params, d)
    out = g.add_texture(xt.shape, "width_packed")
    _, h, z = g.values[out].extents()
    g.add_dispatch(DispatchNode("rows_texture", [out, x, *(_weight(g, p, "identity") for p in params)],
                                struct.pack("<If", d, eps), {0: LOCAL_SIZE}, _groups(g, h * z), {"OP": ROW_TEXTURE_OPS[kind]}))
    return out


def _norm(g: ComputeGraph, kind: str, x: ValueRef, params: list[ValueRef], eps: float,
          layout: str | None = None) -> ValueRef:
    """``kind`` (layer_norm: weight and bias; rms_norm: weight) of each row: a row per
    invocation on CPU renderers (glsl/norm_rows.glsl, D a multiple of 4), a workgroup per row
    elsewhere; on textures glsl/rows_texture.glsl."""
    if layout is not None:
        return _rows_texture(g, kind, x, params, eps, layout)
    x, xt = _buffer(g, x, f"{kind} input")
    m, d = xt.shape
    _check_norm_params(g, kind, params, d)
    out = g.add_tensor((m, d), np.float32)
    args = [out, x, *(_weight(g, p, "identity") for p in params)]
    push = struct.pack("<IIf", m, d, eps)
    if CPU_KERNELS and g.device.is_cpu and d % 4 == 0 and _texel_ok(g, x, xt.nbytes, 16):
        local = _cpu_local(g)
        g.add_dispatch(DispatchNode("norm_rows", args, push, {0: local},
                                    (dispatch_groups(m, local, g.max_groups_x), 1, 1),
                                    {"LAYER": int(kind == "layer_norm")},
                                    texels={i: "rgba32f" for i in range(1, len(args))}))
    else:
        g.add_dispatch(DispatchNode(kind, args, push, {0: LOCAL_SIZE}, (min(m, g.max_groups_x), 1, 1)))
    return out


MAX_KEYS = 2048  # glsl/sdpa.glsl keeps one row of scores in shared memory


def _step(g: ComputeGraph, step: ValueRef, what: str) -> None:
    st = g.values[step]
    if st.dtype not in (np.uint32, np.int32) or len(st.shape) < 1 or st.shape[0] < 1:
        raise TypeError(f"{what}: step must be a uint32 (or non-negative int32) tensor holding the position, "
                        f"got {st.shape} {st.dtype}")


def rope_table(g: ComputeGraph, positions: int, head_dim: int, theta: float = 10000.0) -> ValueRef:
    """The rotary angles' (cos, sin) for positions ``0..positions-1``, ``[positions, head_dim/2, 2]``
    float32, computed in float64 on the CPU and packed as a constant: shaders' sin and cos are
    not precise enough at large angles (SwiftShader's least of all). One table serves every
    :func:`rope` with this head size and theta."""
    if positions < 1 or head_dim % 2:
        raise ValueError(f"rope table: {positions} positions of head size {head_dim} (must be even)")
    i = np.arange(head_dim // 2, dtype=np.float64)
    angles = np.arange(positions, dtype=np.float64)[:, None] * float(theta) ** (-2.0 * i / head_dim)
    table = np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
    return g.prepack_tensor(g.add_tensorref(table, f"rope_table.{head_dim}.{theta:g}"))


def rope(g: ComputeGraph, x: ValueRef, step: ValueRef, table: ValueRef, *, heads: int, neox: bool = False) -> ValueRef:
    """Rotary embedding of ``x`` ``[T, heads*Dh]`` at positions ``step[0] + t``, angles from
    ``table`` (:func:`rope_table`; positions past its end take its last row). Pairs are adjacent
    (GGUF llama) or, with ``neox``, half a head apart (Hugging Face llama)."""
    x, xt = _buffer(g, x, "rope input")
    _step(g, step, "rope")
    t, width = xt.shape
    if width % heads or (width // heads) % 2:
        raise ValueError(f"rope: width {width} is not {heads} heads of an even size")
    dh = width // heads
    tt = g.values[table]
    if tt.dtype != np.float32 or len(tt.shape) != 3 or tt.shape[1:] != (dh // 2, 2):
        raise ValueError(f"rope: table {tt.shape} {tt.dtype} is not [positions, {dh // 2}, 2] float32")
    out = g.add_tensor(xt.shape, np.float32)
    g.add_dispatch(DispatchNode("rope", [out, x, step, table], struct.pack("<IIII", t, heads, dh, tt.shape[0]),
                                {0: LOCAL_SIZE}, _groups(g, t * width // 2), {"NEOX": int(neox)}))
    return out


def rotary(g: ComputeGraph, x: ValueRef, cos: ValueRef, sin: ValueRef, step: ValueRef, *, heads: int, seq: int,
           interleaved: bool, per_head: bool = False) -> ValueRef:
    """Rotary embedding of ``x`` ``[B, seq, heads, D]`` with the angles as tensors: ``cos`` and
    ``sin`` ``[rows, F]``, row ``step[0] + t`` (``per_head``: row ``(step[0] + t) * heads + h``).
    ``interleaved``: pairs (2i, 2i+1) by column i, F = D/2 (ExecuTorch llama); else the first F
    values turn in halves (rotate_half, Hugging Face) and the rest pass."""
    x, xt = _buffer(g, x, "rotary input")
    cos, ct = _buffer(g, _weight(g, cos, "identity"), "rotary cos")
    sin, st = _buffer(g, _weight(g, sin, "identity"), "rotary sin")
    _step(g, step, "rotary")
    n = int(np.prod(xt.shape))
    d = xt.shape[-1] if xt.shape else 0
    if not d or n % (seq * heads * d) or len(ct.shape) != 2 or ct.shape != st.shape:
        raise ValueError(f"rotary: input {xt.shape} is not [B, {seq}, {heads}, D] or cos {ct.shape} / sin {st.shape} "
                         "are not the same [rows, F]")
    f = ct.shape[1]
    if (f != d // 2 or d % 2) if interleaved else (f > d or f % 2):
        raise ValueError(f"rotary: {f} angle columns do not fit head size {d}")
    out = g.add_tensor(xt.shape, np.float32)
    g.add_dispatch(DispatchNode("rotary", [out, x, cos, sin, step], struct.pack("<6I", n, seq, heads, d, f, ct.shape[0]),
                                {0: LOCAL_SIZE}, _groups(g, n), {"INTERLEAVED": int(interleaved),
                                                                 "PER_HEAD": int(per_head)}))
    return out


def rope_kv(g: ComputeGraph, qkv: ValueRef, step: ValueRef, table: ValueRef, k_cache: ValueRef,
            v_cache: ValueRef, *, heads: int, kv_heads: int, neox: bool = False) -> ValueRef:
    """What a decoder layer does between its projections and attention, in one dispatch
    (glsl/rope_kv.glsl; ET-VK fuses the same). ``qkv`` ``[T, (heads + 2 kv_heads) Dh]`` holds
    q, k and v side by side (:func:`stacked_linear` of their weights); returns :func:`rope` of q
    ``[T, heads Dh]`` and writes :func:`rope` of k and v into rows ``step[0]..`` of the caches
    ``[rows, kv_heads Dh]``, as :func:`kv_write` does."""
    qkv, qt = _buffer(g, qkv, "rope_kv qkv")
    _step(g, step, "rope_kv")
    ct, vct = _tensor(g, k_cache, "k cache"), _tensor(g, v_cache, "v cache")
    if len(qt.shape) != 2 or len(ct.shape) != 2 or ct.shape[1] % kv_heads:
        raise ValueError(f"rope_kv: qkv {qt.shape} and k cache {ct.shape} must be 2-D, the cache [rows, {kv_heads} x Dh]")
    width = ct.shape[1]
    dh = width // kv_heads
    t = qt.shape[0]
    if qt.shape[1] != (heads + 2 * kv_heads) * dh or dh % 2:
        raise ValueError(f"rope_kv: qkv {qt.shape} is not ({t}, ({heads} + 2 x {kv_heads}) x {dh}) (an even head size)")
    if vct.shape != ct.shape:
        raise ValueError(f"rope_kv: caches {ct.shape} and {vct.shape} must be [rows, {width}]")
    tt = g.values[table]
    if tt.dtype != np.float32 or len(tt.shape) != 3 or tt.shape[1:] != (dh // 2, 2):
        raise ValueError(f"rope_kv: table {tt.shape} {tt.dtype} is not [positions, {dh // 2}, 2] float32")
    out = g.add_tensor((t, heads * dh), np.float32)
    cpu = CPU_KERNELS and g.device.is_cpu
    # CPU renderers: two pairs an invocation, as vec4s, where the layout allows (glsl/rope_kv.glsl QUAD)
    quad = cpu and not neox and dh % 4 == 0 and _texel_ok(g, qkv, qt.nbytes, 16) and _texel_ok(g, table, tt.nbytes, 16)
    texel = quad or (cpu and _texel_ok(g, qkv, qt.nbytes, 4) and _texel_ok(g, table, tt.nbytes, 8))
    work = t * (heads + 2 * kv_heads) * dh // (4 if quad else 2)
    g.add_dispatch(DispatchNode("rope_kv", [out, qkv, step, table, k_cache, v_cache],
                                struct.pack("<3I", t, tt.shape[0], ct.shape[0]), {0: LOCAL_SIZE},
                                grid_groups(work, LOCAL_SIZE, g.max_groups_x),
                                {"NEOX": int(neox), "TEXEL": int(texel), "QUAD": int(quad), "HEADS": heads,
                                 "KV_HEADS": kv_heads, "HEAD_DIM": dh},
                                texels=({1: "rgba32f", 3: "rgba32f"} if quad else {1: "r32f", 3: "rg32f"} if texel else {}),
                                moved_nbytes=2 * qt.nbytes))
    return out


def kv_write(g: ComputeGraph, cache: ValueRef, src: ValueRef, step: ValueRef) -> ValueRef:
    """Write ``src`` ``[T, W]`` into rows ``step[0]..`` of ``cache`` ``[rows, W]``; returns ``cache``."""
    ct = _tensor(g, cache, "kv cache")
    src, st = _buffer(g, src, "kv_write source")
    _step(g, step, "kv_write")
    if ct.shape[1] != st.shape[1]:
        raise ValueError(f"kv_write: cache {ct.shape} and source {st.shape} differ in width")
    g.add_dispatch(DispatchNode("kv_write", [cache, src, step], struct.pack("<III", st.shape[0], st.shape[1], ct.shape[0]),
                                {0: LOCAL_SIZE}, _groups(g, st.shape[0] * st.shape[1]), moved_nbytes=2 * st.nbytes))
    return cache


def sdpa(g: ComputeGraph, q: ValueRef, k: ValueRef, v: ValueRef, *, heads: int, kv_heads: int | None = None,
         batch: int = 1, key_mask: ValueRef | None = None, causal: bool = False, q_pos0: int = 0,
         step: ValueRef | None = None, scale: float | None = None) -> ValueRef:
    """Scaled dot-product attention. ``q``: ``[batch*T, heads*Dh]``; ``k``, ``v``:
    ``[batch*S, kv_heads*Dh]``; ``key_mask``: ``[batch*S]`` (0 masks a key out). With
    ``step`` (a uint32 tensor), the first query's position is read from ``step[0]`` at run time
    instead of ``q_pos0``: attention over a key/value cache during generation."""
    (q, qt), (k, kt), (v, vt) = (_buffer(g, r, f"sdpa {n}") for r, n in ((q, "q"), (k, "k"), (v, "v")))
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ValueError(f"sdpa: {heads} heads cannot share {kv_heads} key/value heads")
    if qt.shape[1] % heads or qt.shape[0] % batch or kt.shape[0] % batch or kt.shape != vt.shape:
        raise ValueError(f"sdpa: q {qt.shape}, k {kt.shape}, v {vt.shape} do not fit {batch} x {heads} heads")
    dh = qt.shape[1] // heads
    t, s = qt.shape[0] // batch, kt.shape[0] // batch
    if kt.shape[1] != kv_heads * dh:
        raise ValueError(f"sdpa: k/v width {kt.shape[1]} != {kv_heads} kv heads x head dim {dh}")
    if s > MAX_KEYS:
        raise ValueError(f"sdpa: {s} keys exceed the kernel's {MAX_KEYS}")
    if key_mask is None:
        key_mask = g.add_tensorref(np.ones(batch * s, np.float32), f"sdpa_mask_{len(g.values)}")
    mask = _weight(g, key_mask, "identity")
    if tuple(g.values[mask].shape) != (batch * s,):
        raise ValueError(f"sdpa: key_mask {g.values[mask].shape} must be ({batch * s},)")
    out = g.add_tensor(qt.shape, np.float32)
    scale = 1.0 / float(np.sqrt(dh)) if scale is None else scale
    push = struct.pack("<8If", batch, t, s, heads, kv_heads, dh, int(causal), q_pos0, scale)
    args = [out, q, k, v, mask]
    if step is not None:
        _step(g, step, "sdpa")
        args.append(step)
    dynamic = int(step is not None)
    moved = 2 * qt.nbytes  # q in, out (the keys read up to the step: key_rows)
    if CPU_KERNELS and g.device.is_cpu and dh % 4 == 0 and dh <= 256:
        # CPU renderers: an invocation per query row, one pass (glsl/sdpa_rows.glsl); a
        # workgroup's barriers per row cost more there than the row's work
        texel = all(_texel_ok(g, r, g.values[r].nbytes, 16) for r in args[1:4])
        local = _cpu_local(g)
        group = heads // kv_heads if (t > 1 and heads // kv_heads <= SDPA_GROUP_MAX
                                      and g.device.renderer in SDPA_GROUP_RENDERERS) else 1
        rows = batch * t * heads // group
        g.add_dispatch(DispatchNode("sdpa_rows", args, push, {0: local},
                                    (dispatch_groups(rows, local, g.max_groups_x), 1, 1),
                                    {"DYNAMIC_POS": dynamic, "DH": dh, "TEXEL": int(texel), "GROUP": group},
                                    texels={1: "rgba32f", 2: "rgba32f", 3: "rgba32f"} if texel else {}, moved_nbytes=moved,
                                    key_rows=heads // group, invocations=rows))
        return out
    g.add_dispatch(DispatchNode("sdpa", args, push, {0: LOCAL_SIZE}, (min(batch * heads * t, g.max_groups_x), 1, 1),
                                {"DYNAMIC_POS": dynamic}, moved_nbytes=moved, key_rows=heads,
                                invocations=batch * heads * t))
    return out


def softmax(g: ComputeGraph, x: ValueRef, log: bool = False, layout: str | None = None) -> ValueRef:
    """Softmax (or with ``log`` its logarithm) over the last dimension of a ``[M, D]`` tensor
    (with ``layout="width_packed"``: of a texture of up to 4 dims, into one)."""
    if layout is not None:
        return _rows_texture(g, "log_softmax" if log else "softmax", x, [], 0.0, layout)
    x, xt = _buffer(g, x, "softmax input")
    m, d = xt.shape
    out = g.add_tensor((m, d), np.float32)
    g.add_dispatch(DispatchNode("softmax", [out, x], struct.pack("<II", m, d), {0: LOCAL_SIZE},
                                (min(m, g.max_groups_x), 1, 1), {"LOG": int(log)}))
    return out


def matmul(g: ComputeGraph, a: ValueRef, b: ValueRef, *, transpose_b: bool = False,
           layout: str | None = None) -> ValueRef:
    """``a @ b`` (or ``a @ b.T``) for ``[M, K]`` x ``[K, N]`` or batched ``[B, M, K]`` x ``[B, K, N]``;
    both operands may be runtime tensors or constants. With ``layout="width_packed"`` (not
    ``transpose_b``): up to 4 dims, leading dims equal or 1 in one operand, into a texture."""
    if layout is not None:
        return _matmul_texture(g, a, b, layout, transpose_b)
    a, at = _buffer(g, a, "matmul a")
    b = _weight(g, b, "identity")
    b, bt = _buffer(g, b, "matmul b")
    if len(at.shape) != len(bt.shape) or len(at.shape) not in (2, 3):
        raise ValueError(f"matmul: a {at.shape} and b {bt.shape} must both be 2-D or both 3-D")
    batch = at.shape[0] if len(at.shape) == 3 else 1
    m, k = at.shape[-2:]
    n, kb = (bt.shape[-2], bt.shape[-1]) if transpose_b else (bt.shape[-1], bt.shape[-2])
    if kb != k or (len(at.shape) == 3 and bt.shape[0] != batch):
        raise ValueError(f"matmul: a {at.shape} and b {bt.shape} do not fit (transpose_b={transpose_b})")
    out = g.add_tensor((batch, m, n) if len(at.shape) == 3 else (m, n), np.float32)
    g.add_dispatch(DispatchNode("matmul", [out, a, b], struct.pack("<IIII", batch, m, n, k), {0: LOCAL_SIZE},
                                _groups(g, batch * m * n), {"TRANSPOSE_B": int(transpose_b)}))
    return out


def _matmul_texture(g: ComputeGraph, a: ValueRef, b: ValueRef, layout: str, transpose_b: bool) -> ValueRef:
    """``a @ b`` on width-packed textures (glsl/matmul_texture.glsl); operands converted to them."""
    refs = [to_texture(g, _weight(g, r, "texture3d_width_packed"), "width_packed") for r in (a, b)]
    at, bt = (g.values[r] for r in refs)
    lead_a, lead_b = at.shape[:-2], bt.shape[:-2]
    if layout != "width_packed" or transpose_b or not 2 <= len(at.shape) <= 4 or len(at.shape) != len(bt.shape) or \
            at.shape[-1] != bt.shape[-2] or (lead_a != lead_b and 1 not in (np.prod(lead_a), np.prod(lead_b))):
        raise ValueError(f"matmul: on textures a [..., M, K] and b [..., K, N] width-packed, not a {at.shape}, "
                         f"b {bt.shape}, {layout}, transpose_b={transpose_b}")
    lead = lead_a if np.prod(lead_a) >= np.prod(lead_b) else lead_b
    out = g.add_texture((*lead, at.shape[-2], bt.shape[-1]), "width_packed")
    push = struct.pack("<III", at.shape[-1], int(np.prod(lead_a) > 1), int(np.prod(lead_b) > 1))
    g.add_dispatch(DispatchNode("matmul_texture", [out, *refs], push, {0: LOCAL_SIZE},
                                _groups(g, int(np.prod(g.values[out].extents())))))
    return out


def _pair(v: int | tuple[int, int], what: str) -> tuple[int, int]:
    pair = (v, v) if isinstance(v, int) else tuple(v)
    if len(pair) != 2 or any(int(p) != p for p in pair):
        raise ValueError(f"conv2d: {what} must be an int or a pair of ints, got {v!r}")
    return int(pair[0]), int(pair[1])


def conv2d(g: ComputeGraph, x: ValueRef, weight: ValueRef, bias: ValueRef | None = None, *,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1) -> ValueRef:
    """2-D convolution of NCHW ``x`` with ``weight[Cout, Cin/groups, KH, KW]`` (channels-packed
    on the device), as torch.nn.functional.conv2d. Runs on channels-packed textures when ``x`` is
    a texture or the config's ``graph.storage`` is ``"texture3d"``; the output then is one too."""
    xt = _tensor(g, x, "conv2d input")
    texture = xt.storage == "texture3d" or g.config.graph.storage == "texture3d"
    if texture and (xt.storage != "texture3d" or xt.layout != "channels_packed"):
        if xt.storage == "texture3d":
            x = g.texture_to_buffer(x)
        x = g.buffer_to_texture(x, "channels_packed")
        xt = g.values[x]
    elif not texture:
        x, xt = _buffer(g, x, "conv2d input")
    w_ref = _weight(g, weight, "conv2d_c4")
    wt = g.values[w_ref]
    if len(xt.shape) != 4 or wt.layout != "conv2d_c4":
        raise ValueError(f"conv2d: input {xt.shape} must be NCHW and the weight a conv2d_c4-packed tensor")
    n, cin, h, w = xt.shape
    cout, cin_g, kh, kw = wt.shape
    (sy, sx), (py, px), (dy, dx) = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    if groups < 1 or cin % groups or cout % groups or cin // groups != cin_g:
        raise ValueError(f"conv2d: {cin} input / {cout} output channels do not fit {groups} groups of weight {wt.shape}")
    if min(sy, sx, dy, dx) < 1 or min(py, px) < 0:
        raise ValueError("conv2d: stride and dilation must be >= 1 and padding >= 0")
    ho = (h + 2 * py - dy * (kh - 1) - 1) // sy + 1
    wo = (w + 2 * px - dx * (kw - 1) - 1) // sx + 1
    if ho < 1 or wo < 1:
        raise ValueError(f"conv2d: a {kh}x{kw} kernel does not fit a {h}x{w} input with this padding/dilation")
    args = [None, x, w_ref]
    if bias is not None:
        args.append(_weight(g, bias, "identity"))
    push = struct.pack("<16I", n, cin, h, w, cout, ho, wo, groups, kh, kw, sy, sx, py, px, dy, dx)
    if texture:
        out = g.add_texture((n, cout, ho, wo), "channels_packed")
        args[0] = out
        g.add_dispatch(DispatchNode("conv2d_texture", args, push, {0: LOCAL_SIZE},
                                    _groups(g, n * ((cout + 3) // 4) * ho * wo), {"HAS_BIAS": int(bias is not None)}))
        return out
    out = g.add_tensor((n, cout, ho, wo), np.float32)
    args[0] = out
    g.add_dispatch(DispatchNode("conv2d", args, push, {0: LOCAL_SIZE}, _groups(g, n * cout * ho * wo),
                                {"HAS_BIAS": int(bias is not None)}))
    return out


def conv_transpose2d(g: ComputeGraph, x: ValueRef, weight: ValueRef, bias: ValueRef | None, out_hw: tuple[int, int], *,
                     stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int],
                     groups: int = 1) -> ValueRef:
    """Transposed 2-D convolution of NCHW ``x`` with ``weight[Cin, Cout/groups, KH, KW]`` into
    ``out_hw`` (the caller's output size: output padding is in it), as
    torch.nn.functional.conv_transpose2d."""
    x, xt = _buffer(g, x, "conv_transpose2d input")
    w_ref, wt = _buffer(g, _weight(g, weight, "identity"), "conv_transpose2d weight")
    if len(xt.shape) != 4 or len(wt.shape) != 4:
        raise ValueError(f"conv_transpose2d: input {xt.shape} and weight {wt.shape} must be 4-D")
    n, cin, h, w = xt.shape
    wcin, cout_g, kh, kw = wt.shape
    if groups < 1 or wcin != cin or cin % groups:
        raise ValueError(f"conv_transpose2d: weight {wt.shape} does not fit {cin} input channels in {groups} groups")
    if min(*stride, *dilation) < 1 or min(padding) < 0:
        raise ValueError("conv_transpose2d: stride and dilation must be >= 1 and padding >= 0")
    cout = cout_g * groups
    out = g.add_tensor((n, cout, *out_hw), np.float32)
    args = [out, x, w_ref]
    if bias is not None:
        args.append(_weight(g, bias, "identity"))
    push = struct.pack("<16I", n, cin, h, w, cout, *out_hw, groups, kh, kw, *stride, *padding, *dilation)
    g.add_dispatch(DispatchNode("conv_transpose2d", args, push, {0: LOCAL_SIZE}, _groups(g, n * cout * out_hw[0] * out_hw[1]),
                                {"HAS_BIAS": int(bias is not None)}))
    return out


def upsample_bilinear(g: ComputeGraph, x: ValueRef, out_hw: tuple[int, int], *, align_corners: bool,
                      scales: tuple[float, float] | None = None) -> ValueRef:
    """Bilinear resize of NCHW ``x`` to ``out_hw`` as torch's upsample_bilinear2d; ``scales`` are
    the caller's scale factors (the source step is their inverse), else in/out sizes."""
    x, xt = _buffer(g, x, "upsample input")
    if len(xt.shape) != 4:
        raise ValueError(f"upsample_bilinear: input {xt.shape} must be NCHW")
    n, c, h, w = xt.shape
    ho, wo = out_hw
    if align_corners:
        step = ((h - 1) / (ho - 1) if ho > 1 else 0.0, (w - 1) / (wo - 1) if wo > 1 else 0.0)
    else:
        step = (1.0 / scales[0], 1.0 / scales[1]) if scales else (h / ho, w / wo)
    out = g.add_tensor((n, c, ho, wo), np.float32)
    g.add_dispatch(DispatchNode("upsample_bilinear", [out, x], struct.pack("<5I2f", n * c, h, w, ho, wo, *step),
                                {0: LOCAL_SIZE}, _groups(g, n * c * ho * wo), {"ALIGN_CORNERS": int(align_corners)}))
    return out


def to_texture(g: ComputeGraph, x: ValueRef, layout: str = "") -> ValueRef:
    """``x`` in texture storage (width-, height- or channels-packed; default: the config's
    ``graph.memory_layout``, else channels-packed)."""
    layout = layout or g.config.graph.memory_layout or "channels_packed"
    if layout not in TEXTURE_LAYOUTS:
        raise ValueError(f"to_texture: layout must be one of {', '.join(TEXTURE_LAYOUTS)}, not {layout!r}")
    t = _tensor(g, x, "to_texture input")
    if t.storage == "texture3d" and t.layout == layout:
        return x
    return gather(g, x, t.shape, contiguous_strides(t.shape), layout=layout)


def to_buffer(g: ComputeGraph, x: ValueRef) -> ValueRef:
    """``x`` in buffer storage (NCHW)."""
    return _buffer(g, x, "to_buffer input")[0]


def mean_pool(g: ComputeGraph, x: ValueRef, mask: ValueRef, batch: int) -> ValueRef:
    """Masked mean over tokens: ``x`` ``[batch*T, D]``, ``mask`` ``[batch*T]`` -> ``[batch, D]``."""
    x, xt = _buffer(g, x, "mean_pool input")
    n, d = xt.shape
    if n % batch or tuple(g.values[mask].shape) != (n,):
        raise ValueError(f"mean_pool: x {xt.shape} and mask {g.values[mask].shape} do not fit batch {batch}")
    out = g.add_tensor((batch, d), np.float32)
    g.add_dispatch(DispatchNode("mean_pool", [out, x, _weight(g, mask, "identity")],
                                struct.pack("<III", batch, n // batch, d), {0: LOCAL_SIZE}, _groups(g, batch * d)))
    return out


def l2_normalize(g: ComputeGraph, x: ValueRef, eps: float = 1e-12) -> ValueRef:
    """Each row divided by its L2 norm (at least ``eps``), as torch.nn.functional.normalize."""
    x, xt = _buffer(g, x, "l2_normalize input")
    m, d = xt.shape
    out = g.add_tensor((m, d), np.float32)
    g.add_dispatch(DispatchNode("l2_normalize", [out, x], struct.pack("<IIf", m, d, eps), {0: LOCAL_SIZE},
                                (min(m, g.max_groups_x), 1, 1)))
    return out


def embedding(g: ComputeGraph, ids: ValueRef, table: ValueRef, layout: str | None = None,
              shape: Sequence[int] | None = None) -> ValueRef:
    """Rows of ``table[V, D]`` (fp32 or GGML-quantized) for int32 ``ids[T]`` (ids outside
    [0, V) give zero rows). With ``layout="width_packed"`` (an fp32 table within one binding) a
    texture, of ``shape`` when given (``[..., D]`` of T rows)."""
    it = g.values[ids]
    if it.dtype != np.int32 or len(it.shape) != 1:
        raise TypeError(f"embedding ids must be a 1-D int32 tensor, got {it.shape} {it.dtype}")
    table = _weight(g, table, "identity")
    tt = g.values[table]
    v, d = tt.shape
    t = it.shape[0]
    if layout:
        out_shape = tuple(shape or (t, d))
        if layout != "width_packed" or tt.layout in QUANT_LAYOUTS or tt.nbytes > g.max_binding_nbytes or \
                out_shape[-1] != d or int(np.prod(out_shape)) != t * d:
            raise ValueError(f"embedding: on textures, width-packed [..., {d}] rows of an fp32 table within one "
                             f"binding; not {layout} {out_shape} of {tt.layout} {tt.nbytes} bytes")
        out = g.add_texture(out_shape, layout)
        ot = g.values[out]
        g.add_dispatch(DispatchNode("embedding", [out, ids, table], struct.pack("<7I", t, d, 0, v, v, 1, ot.sizes()[2]),
                                    {0: LOCAL_SIZE}, _groups(g, int(np.prod(ot.extents()))), {"TEXTURE": 1},
                                    moved_nbytes=2 * ot.nbytes))
        return out
    out = g.add_tensor((t, d), np.float32)
    fmt = QUANT_LAYOUTS.get(tt.layout)
    defines = {"QTYPE": FORMATS[fmt].qtype, "PLANES": int(fmt != tt.layout)} if fmt else {}
    for i, (r0, r1, tb) in enumerate(_one_window(g, table, v, "embedding")):
        g.add_dispatch(DispatchNode("embedding_quant" if fmt else "embedding", [out, ids, tb],
                                    struct.pack("<6I", t, d, r0, r1, v, int(i == 0)) + bytes(0 if fmt else 4),
                                    {0: LOCAL_SIZE}, _groups(g, t * d), defines,
                                    moved_nbytes=2 * g.values[out].nbytes))  # the rows it reads, not the table
    return out


MAX_COPY_DIMS = 6  # glsl/copy_nd.glsl


def strided_copy(g: ComputeGraph, out: ValueRef, src: ValueRef, size: Sequence[int], src_strides: Sequence[int],
                 out_strides: Sequence[int], src_base: int = 0, out_base: int = 0) -> None:
    """For every index ``i`` of ``size``: ``out[out_base + i . out_strides] = src[src_base + i .
    src_strides]`` (elements of 32 bits; dims of size 1 are dropped, at most 6 remain)."""
    dims = [(int(n), int(a), int(b)) for n, a, b in zip(size, src_strides, out_strides) if n != 1]
    if len(dims) > MAX_COPY_DIMS:
        raise ValueError(f"strided copy of {len(dims)} dims (at most {MAX_COPY_DIMS})")
    dims = [(1, 0, 0)] * (MAX_COPY_DIMS - len(dims)) + dims
    n = int(np.prod([d[0] for d in dims]))
    if n == 0:
        return
    for ref in (out, src):
        if g.values[ref].dtype.itemsize != 4:
            raise TypeError(f"strided copy of {g.values[ref].name!r}: elements must be 32-bit")
    push = struct.pack("<22I", n, src_base, out_base, 0, *(d[0] for d in dims), *(d[1] for d in dims),
                       *(d[2] for d in dims))
    g.add_dispatch(DispatchNode("copy_nd", [out, src], push, {0: LOCAL_SIZE}, _groups(g, n)))


def gather(g: ComputeGraph, x: ValueRef, shape: Sequence[int], strides: Sequence[int], base: int = 0,
           layout: str | None = None) -> ValueRef:
    """A new tensor of ``shape`` whose element ``i`` is element ``base + i . strides`` of ``x``
    read as its contiguous (NCHW) elements; negative strides flip. One op for reshapes,
    permutes, slices, selects, expands and flips. With ``layout`` the result is a texture in it
    (glsl/gather_texture.glsl reads a buffer, or a texture of any layout); else a buffer."""
    shape = [int(s) for s in shape]
    wrap = [int(s) & 0xFFFFFFFF for s in strides]
    if layout is None:
        x, xt = _buffer_any(g, x, "gather input")
        out = g.add_tensor(shape, xt.dtype)
        strided_copy(g, out, x, shape, wrap, contiguous_strides(shape), int(base) & 0xFFFFFFFF)
        return out
    if len(shape) > 4:
        raise ValueError(f"gather: a texture has at most 4 dims, not {shape}")
    xt = _tensor(g, x, "gather input")
    out = g.add_texture(shape, layout)
    ot = g.values[out]
    g.add_dispatch(DispatchNode("gather_texture", [x, out], gather_params(ot, xt, strides, base), {0: LOCAL_SIZE},
                                _groups(g, int(np.prod(ot.extents()))), {"SRC_TEXTURE": int(xt.storage == "texture3d")}))
    return out


def fill(g: ComputeGraph, shape: Sequence[int], value: float) -> ValueRef:
    """A new float32 tensor of ``shape`` holding ``value`` everywhere (a strided copy with stride
    0 from a one-element constant)."""
    out = g.add_tensor(shape, np.float32)
    name = f"fill.{float(value)!r}"
    one = g.names.get(name)
    if one is None:
        one = g.add_tensorref(np.full(1, value, np.float32), name)
    one = g.prepack_tensor(one)
    strided_copy(g, out, one, shape, [0] * len(shape), contiguous_strides(shape))
    return out


def permute(g: ComputeGraph, x: ValueRef, dims: Sequence[int]) -> ValueRef:
    """``x`` with its dimensions reordered (as torch.permute)."""
    x, xt = _buffer_any(g, x, "permute input")
    if sorted(dims) != list(range(len(xt.shape))):
        raise ValueError(f"permute: {list(dims)} is not a permutation of {len(xt.shape)} dims")
    shape = [xt.shape[d] for d in dims]
    out = g.add_tensor(shape, xt.dtype)
    src = contiguous_strides(xt.shape)
    strided_copy(g, out, x, shape, [src[d] for d in dims], contiguous_strides(shape))
    return out


def _buffer_any(g: ComputeGraph, ref: ValueRef, what: str) -> tuple[ValueRef, Tensor]:
    """(ref, tensor) of a 32-bit device tensor of any dtype in buffer storage."""
    t = g.values[ref]
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} must be a device tensor, got {type(t).__name__}")
    if t.storage == "texture3d":
        return _buffer(g, ref, what)
    return ref, t


REDUCE_OPS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "any": 4, "argmax": 5, "argmin": 6}


def reduce(g: ComputeGraph, x: ValueRef, dim: int, op: str, count: int = 1, layout: str | None = None,
           shape: Sequence[int] | None = None) -> ValueRef:
    """Reduce ``count`` adjacent dims of ``x`` starting at ``dim`` with ``op`` (sum, mean, max,
    min, any; argmax and argmin give the index as a float); the reduced dims are dropped. ``x``
    may be a texture of any layout. With ``layout`` the result is a texture in it, of ``shape``
    when given (the same elements: keepdim's ones)."""
    xt = _tensor(g, x, f"{op} input")
    dims = list(xt.shape)
    if not 0 <= dim or dim + count > len(dims):
        raise ValueError(f"{op}: dims {dim}..{dim + count - 1} are outside a {len(dims)}-D tensor")
    outer = int(np.prod(dims[:dim]))
    r = int(np.prod(dims[dim:dim + count]))
    inner = int(np.prod(dims[dim + count:]))
    out_shape = list(shape) if shape is not None else dims[:dim] + dims[dim + count:]
    if int(np.prod(out_shape)) != outer * inner:
        raise ValueError(f"{op}: output shape {out_shape} does not hold the {outer * inner} results")
    out = g.add_texture(out_shape, layout) if layout else g.add_tensor(out_shape, np.float32)
    ot, textures = g.values[out], (xt.storage == "texture3d", bool(layout))
    packed = [PACKED_DIM[t.layout] if on else 0 for t, on in ((ot, textures[1]), (xt, textures[0]))]
    push = struct.pack("<13I", *ot.sizes(), *xt.sizes(), outer, r, inner, *packed)
    work = int(np.prod(ot.extents())) if layout else outer * inner
    g.add_dispatch(DispatchNode("reduce_dim", [out, x], push, {0: LOCAL_SIZE}, _groups(g, work),
                                {"OP": REDUCE_OPS[op], "IN_TEXTURE": int(textures[0]), "OUT_TEXTURE": int(textures[1])}))
    return out


def pool2d(g: ComputeGraph, x: ValueRef, out_hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
           padding: tuple[int, int], dilation: tuple[int, int] = (1, 1), *, max_pool: bool,
           count_include_pad: bool = True, divisor: int = 0, layout: str | None = None) -> ValueRef:
    """Max or average 2-D pooling of NCHW ``x`` into ``out_hw`` (the caller's output size:
    ceil mode is in it); with ``layout="channels_packed"`` on channels-packed textures."""
    x, xt = _kernel_input(g, x, layout, "channels_packed", "pool2d")
    if len(xt.shape) != 4:
        raise ValueError(f"pool2d: input {xt.shape} must be NCHW")
    n, c, h, w = xt.shape
    ho, wo = out_hw
    out = g.add_texture((n, c, ho, wo), layout) if layout else g.add_tensor((n, c, ho, wo), np.float32)
    planes = n * ((c + 3) // 4) if layout else n * c
    push = struct.pack("<14I", planes, h, w, ho, wo, *kernel, *stride, *padding, *dilation, divisor)
    g.add_dispatch(DispatchNode("pool2d", [out, x], push, {0: LOCAL_SIZE}, _groups(g, planes * ho * wo),
                                {"MAX": int(max_pool), "COUNT_PAD": int(count_include_pad), "TEXTURE": int(bool(layout))}))
    return out


def cast(g: ComputeGraph, x: ValueRef, dtype: Any) -> ValueRef:
    """``x`` converted between int32 and float32 (to int: toward zero)."""
    x, xt = _buffer_any(g, x, "cast input")
    dtype = np.dtype(dtype)
    if xt.dtype == dtype:
        return x
    if {xt.dtype, dtype} != {np.dtype(np.int32), np.dtype(np.float32)}:
        raise TypeError(f"cast of {xt.name!r}: {xt.dtype} to {dtype} is not supported (int32 <-> float32)")
    out = g.add_tensor(xt.shape, dtype)
    n = int(np.prod(xt.shape))
    g.add_dispatch(DispatchNode("cast", [out, x], struct.pack("<I", n), {0: LOCAL_SIZE}, _groups(g, n),
                                {"TO_INT": int(dtype == np.int32)}))
    return out


def linear_qw(g: ComputeGraph, x: ValueRef, weight: ValueRef, scales: ValueRef, *, bits: int, group_size: int,
              scales_gn: bool, zero_points: ValueRef | None = None, bias: ValueRef | None = None,
              high_first: bool = False, layout: str | None = None) -> ValueRef:
    """``y = x @ w.T (+ bias)`` with ``w`` ``[N, K]`` quantized in groups of ``group_size`` along K:
    4-bit (``weight`` uint8 ``[N, K/2]``, offset 8, even k in the low nibble: ET-VK's q4gsw, or
    with ``high_first`` in the high one: ET-VK's qcs4w) or 8-bit
    (``weight`` int8 ``[N, K]``); ``scales`` (and float ``zero_points``) ``[groups, N]`` when
    ``scales_gn`` (ET-VK), else ``[N, groups]`` (torchao). With ``layout="width_packed"``: x
    ``[..., K]`` (up to 4 dims) and y ``[..., N]`` width-packed textures."""
    x, xt = _kernel_input(g, x, layout, "width_packed", "quantized linear")
    wt = g.values[weight]
    n, row_bytes = wt.shape
    rank_ok = 1 <= len(xt.shape) <= 4 if layout else len(xt.shape) == 2
    m, k = (int(np.prod(xt.shape[:-1])), xt.shape[-1]) if rank_ok else (0, 0)
    if bits not in (4, 8) or not rank_ok or row_bytes * 8 // bits < k or group_size < 1:
        raise ValueError(f"quantized linear: input {xt.shape} does not fit {bits}-bit weight {wt.shape} "
                         f"in groups of {group_size}")
    if (n * row_bytes) % 4:
        raise ValueError(f"quantized linear: weight {wt.name!r} of {n * row_bytes} bytes is not whole 32-bit words")
    groups = (k + group_size - 1) // group_size
    st = g.values[scales]
    if int(np.prod(st.shape)) != n * groups:
        raise ValueError(f"quantized linear: scales {st.shape} do not fit {n} rows x {groups} groups")
    args = [None, x, _weight(g, weight, "identity"), _weight(g, scales, "identity")]
    if zero_points is not None:
        args.append(_weight(g, zero_points, "identity"))
    if bias is not None:
        args.append(_weight(g, bias, "identity"))
    y = g.add_texture((*xt.shape[:-1], n), layout) if layout else g.add_tensor((m, n), np.float32)
    args[0] = y
    sn, sg = (1, n) if scales_gn else (groups, 1)
    push = struct.pack("<8I", m, n, k, group_size, row_bytes, sn, sg, xt.sizes()[2])
    g.add_dispatch(DispatchNode("linear_qw", args, push, {0: LOCAL_SIZE}, _groups(g, m * ((n + 3) // 4)),
                                {"BITS": bits, "HAS_ZP": int(zero_points is not None), "HAS_BIAS": int(bias is not None),
                                 "HI_FIRST": int(high_first), "TEXTURE": int(bool(layout))}))
    return y


def embedding_qw(g: ComputeGraph, ids: ValueRef, weight: ValueRef, scales: ValueRef, *, bits: int, group_size: int,
                 zero_points: ValueRef | None = None, high_first: bool = False) -> ValueRef:
    """Rows of a table ``[V, D]`` quantized in groups of ``group_size`` along D (the weight
    formats of :func:`linear_qw`; ``scales`` and float ``zero_points`` ``[V, groups]``) for int32
    ``ids[T]`` (ids outside [0, V) give zero rows), dequantized to float32 ``[T, D]``."""
    it = g.values[ids]
    if it.dtype != np.int32 or len(it.shape) != 1:
        raise TypeError(f"embedding ids must be a 1-D int32 tensor, got {it.shape} {it.dtype}")
    wt = g.values[weight]
    v, row_bytes = wt.shape
    d = row_bytes * 8 // bits
    if bits not in (4, 8) or group_size < 1 or (v * row_bytes) % 4:
        raise ValueError(f"quantized embedding: a {bits}-bit table {wt.shape} in groups of {group_size} is not supported "
                         "(4 or 8 bits, whole 32-bit words)")
    groups = -(-d // group_size)
    if int(np.prod(g.values[scales].shape)) != v * groups:
        raise ValueError(f"quantized embedding: scales {g.values[scales].shape} do not fit {v} rows x {groups} groups")
    args = [None, ids, _weight(g, weight, "identity"), _weight(g, scales, "identity")]
    if zero_points is not None:
        args.append(_weight(g, zero_points, "identity"))
    t = it.shape[0]
    args[0] = out = g.add_tensor((t, d), np.float32)
    g.add_dispatch(DispatchNode("embedding_qw", args, struct.pack("<7I", t, d, v, group_size, row_bytes, groups, 1),
                                {0: LOCAL_SIZE}, _groups(g, t * d),
                                {"BITS": bits, "HAS_ZP": int(zero_points is not None), "HI_FIRST": int(high_first)}))
    return out


__all__ = [
    "add", "binary", "cast", "contiguous_strides", "conv2d", "conv_transpose2d", "embedding", "embedding_qw", "fill", "gather", "gelu", "kv_write", "l2_normalize",
    "layer_norm", "linear", "linear_qw", "matmul", "mean_pool", "mul", "permute", "pool2d", "reduce", "relu", "rms_norm",
    "rope", "rotary", "sdpa", "silu", "softmax", "strided_copy", "sub", "to_buffer", "to_texture", "unary", "upsample_bilinear", "where",
]
