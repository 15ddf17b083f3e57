"""Export the .pte fixtures in tests/data/programs/ with ExecuTorch's VulkanPartitioner.

Run by hand in a virtual environment of its own (never by CI; vkgraph never imports torch):

    python3 -m venv /tmp/etvenv
    /tmp/etvenv/bin/pip install torch==2.13.0+cpu executorch==1.5.1 torchao
    /tmp/etvenv/bin/python scripts/export_programs.py [--only NAME ...] [--out DIR]
    /tmp/etvenv/bin/python scripts/export_programs.py --minilm DIR   # all-MiniLM-L6-v2 (not committed)

Each program NAME gets NAME.pte and NAME.npz (input_0, ... in the program's input order and
output_0, ... the eager PyTorch outputs). Inputs are random with a fixed seed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "programs"


class MLP(nn.Module):
    """linear, layer_norm, gelu, relu, softmax, log_softmax, residual add."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 10)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        h = F.gelu(self.norm(self.fc1(x)))
        h = x + torch.relu(self.fc2(h))
        return torch.softmax(self.fc3(h), dim=-1), torch.log_softmax(self.fc3(h) * 0.5, dim=-1)


class Encoder(nn.Module):
    """A transformer encoder block: multi-head attention written out (view, permute, bmm,
    softmax), layer norms, GELU feed-forward."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads, self.d = heads, d
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        dh = d // self.heads

        def split(y):
            return y.view(b, t, self.heads, dh).permute(0, 2, 1, 3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(b, t, d)
        x = self.ln1(x + self.o(y))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class ConvNet(nn.Module):
    """conv2d (+ bias, stride, padding, groups), relu, hardtanh (conv_with_clamp), max/avg pool,
    mean over H and W, linear."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.clamp(self.c2(x), 0.0, 6.0)
        x = F.avg_pool2d(torch.sigmoid(self.dw(x)) * x, 2)
        return self.fc(x.mean(dim=(2, 3)))


class Elementwise(nn.Module):
    """Elementwise, comparison and reduction ops, scalar and tensor forms, and shape ops."""

    def forward(self, a, b):
        c = (a - b) / (b.abs() + 1.0) + a * 2.0 - 0.5
        d = torch.sqrt(a.abs() + 1e-3) + torch.rsqrt(b * b + 1.0) + torch.exp(-a.abs()) + torch.pow(b, 2.0)
        e = torch.where(a > b, torch.tanh(c), torch.neg(d))
        f = torch.cat([e, c.clamp(-1.0, 1.0)], dim=1)
        s = f.sum(dim=-1, keepdim=True) + f.amax(dim=-1, keepdim=True) + f.mean(dim=1, keepdim=True)
        g = F.hardtanh(f - s, -2.0, 2.0) * torch.sigmoid(a.unsqueeze(0)).expand(2, -1, -1).sum(0).repeat(1, 2)
        return g[:, 1:7], g.select(1, 3), F.silu(g).permute(1, 0)


class TinyLlama(nn.Module):
    """A Llama-style decoder of two layers over a whole prompt: embedding, RMSNorm, RoPE (half
    rotation), causal SDPA with grouped key/value heads, SiLU-gated MLP, tied-free LM head."""

    def __init__(self, vocab=96, d=64, heads=4, kv_heads=2, layers=2, seq=16):
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            m = nn.Module()
            m.wq, m.wk, m.wv, m.wo = (nn.Linear(d, o, bias=False) for o in (d, kv_heads * self.dh, kv_heads * self.dh, d))
            m.w1, m.w3, m.w2 = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), nn.Linear(2 * d, d, bias=False)
            m.n1, m.n2 = nn.Parameter(torch.rand(d) + 0.5), nn.Parameter(torch.rand(d) + 0.5)
            self.layers.append(m)
        self.norm = nn.Parameter(torch.rand(d) + 0.5)
        self.head = nn.Linear(d, vocab, bias=False)
        inv = 10000.0 ** (-torch.arange(0, self.dh, 2).float() / self.dh)
        ang = torch.arange(seq).float()[:, None] * inv[None]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1))
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1))

    @staticmethod
    def rms(x, w, eps=1e-5):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(self, x):
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rot * self.sin

    def forward(self, ids):
        b, t = ids.shape
        x = self.emb(ids)
        for m in self.layers:
            h = self.rms(x, m.n1)
            q = m.wq(h).view(b, t, self.heads, self.dh).transpose(1, 2)
            k = m.wk(h).view(b, t, self.kv_heads, self.dh).transpose(1, 2)
            v = m.wv(h).view(b, t, self.kv_heads, self.dh).transpose(1, 2)
            q, k = self.rope(q), self.rope(k)
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + m.wo(y.transpose(1, 2).reshape(b, t, -1))
            h = self.rms(x, m.n2)
            x = x + m.w2(F.silu(m.w1(h)) * m.w3(h))
        return self.head(self.rms(x, self.norm))


class KVDecoder(nn.Module):
    """A Llama-style decoder with a KV cache (ExecuTorch's llama custom ops: update_cache and
    custom_sdpa, which ET-VK fuses into sdpa_with_kv_cache): each call appends its tokens at
    input_pos. Stateful: the fixture holds two calls, the second reading the first one's keys."""

    def __init__(self, vocab=96, d=64, heads=4, kv_heads=2, max_seq=32):
        super().__init__()
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (registers torch.ops.llama)

        self.h, self.kvh, self.dh = heads, kv_heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, o, bias=False)
                                              for o in (d, kv_heads * self.dh, kv_heads * self.dh, d))
        self.norm = nn.Parameter(torch.rand(d) + 0.5)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, max_seq, kv_heads, self.dh))
        self.register_buffer("v_cache", torch.zeros(1, max_seq, kv_heads, self.dh))

    def reset(self):
        self.k_cache.zero_()
        self.v_cache.zero_()

    def forward(self, ids, input_pos):
        b, t = ids.shape
        x = self.emb(ids)
        q = self.wq(x).view(b, t, self.h, self.dh)
        k = self.wk(x).view(b, t, self.kvh, self.dh)
        v = self.wv(x).view(b, t, self.kvh, self.dh)
        pos = input_pos[0].item()
        torch.ops.llama.update_cache(k, self.k_cache, pos)
        torch.ops.llama.update_cache(v, self.v_cache, pos)
        y = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, pos, None, 0.0, True)
        x = x + self.wo(y.view(b, t, -1))
        return self.head(TinyLlama.rms(x, self.norm))


class QuantMLP(nn.Module):
    """Linears quantized by torchao (see _quantize for the schemes and what each lowers to)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 128), nn.Linear(128, 32)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def _quantize(model, scheme: str):
    """torchao schemes and what VulkanPartitioner lowers them to:
    dq8ca_q4: int8 dynamic activations, int4 weights in groups of 32 -> et_vk.linear_dq8ca_q4gsw
    q4w: int4 weights in groups of 32 -> et_vk.linear_q4gsw
    q8w: int8 weights per channel -> torchao.dequantize_affine + aten.linear
    int8wo: Int8WeightOnlyConfig -> CPU casts of the weights + aten.mm in the delegate"""
    from torchao.quantization import (Int8DynamicActivationIntxWeightConfig, Int8WeightOnlyConfig,
                                      IntxWeightOnlyConfig, quantize_)
    from torchao.quantization.granularity import PerAxis, PerGroup

    config = {
        "dq8ca_q4": lambda: Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                                  weight_granularity=PerGroup(32)),
        "q4w": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
        "q8w": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
        "int8wo": lambda: Int8WeightOnlyConfig(),
    }[scheme]()
    quantize_(model, config)
    return model


class Vision(nn.Module):
    """batch norm (on the input: not fused into a conv), conv + batch norm (fused by ExecuTorch),
    hardswish, group norm, leaky relu, transposed conv, constant pad, hardsigmoid, nearest
    upsampling, pixel shuffle, flip, adaptive average pooling."""

    def __init__(self):
        super().__init__()
        self.bn0, self.bn = nn.BatchNorm2d(3), nn.BatchNorm2d(8)
        for bn in (self.bn0, self.bn):  # running statistics that are not the identity
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.gn = nn.GroupNorm(2, 8)
        self.up = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        x = F.hardswish(self.bn(self.c1(self.bn0(x))))
        x = F.leaky_relu(self.gn(x), 0.1)
        y = F.hardsigmoid(self.c2(F.pad(self.up(x), (1, 1, 2, 0), value=0.5)))
        z = F.pixel_shuffle(F.interpolate(x, scale_factor=2, mode="nearest"), 2)
        return y, z.flip(-1), F.adaptive_avg_pool2d(x, 1).flatten(1)


class Elementwise2(nn.Module):
    """sin, cos, round, log10, hardshrink, floor and trunc division, split, t, index_select (by
    constant and by computed indices), argmax, argmin, reciprocal (a CPU kernel), ones_like."""

    def forward(self, a, b):
        c = torch.sin(a) * torch.cos(b) + torch.round(a * 3.0) + torch.log10(b.abs() + 1.0)
        d = F.hardshrink(a, 0.5) + torch.div(a, b.abs() + 0.5, rounding_mode="floor") + \
            torch.div(a * 4, b.abs() + 0.5, rounding_mode="trunc")
        p, q = torch.split(c + d, [3, 5], dim=1)
        e = torch.index_select(p.t(), 0, torch.tensor([2, 0]))
        f = torch.index_select(c, 1, torch.argmin(a, dim=1))
        return p * 2, q.t(), e, torch.argmax(c, dim=1), torch.reciprocal(b.abs() + 1) + torch.ones_like(a), f


class Rope(nn.Module):
    """ExecuTorch llama's two rotary embeddings, which ET-VK fuses: apply_rotary_emb (pairs) and
    hf_apply_rotary_emb (rotate_half), on grouped query and key heads."""

    def __init__(self, d=32, heads=4, kv_heads=2, seq=8):
        super().__init__()
        self.h, self.kvh, self.dh = heads, kv_heads, d // heads
        self.wq, self.wk = nn.Linear(d, d, bias=False), nn.Linear(d, kv_heads * self.dh, bias=False)
        ang = torch.arange(seq).float()[:, None] * 10000.0 ** (-torch.arange(0, self.dh, 2).float() / self.dh)[None]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())
        self.register_buffer("hf_cos", torch.cat([ang.cos(), ang.cos()], -1))
        self.register_buffer("hf_sin", torch.cat([ang.sin(), ang.sin()], -1))

    def forward(self, x):
        from executorch.examples.models.llama.rope import apply_rotary_emb, hf_apply_rotary_emb

        b, t, _ = x.shape
        q, k = self.wq(x).view(b, t, self.h, self.dh), self.wk(x).view(b, t, self.kvh, self.dh)
        return (*apply_rotary_emb(q, k, self.cos[:t], self.sin[:t]),
                *hf_apply_rotary_emb(q, k, self.hf_cos[:t], self.hf_sin[:t]))


class QConv(nn.Module):
    """Convolutions for static int8 quantization (XNNPACKQuantizer): lowered to et_vk.q8ta_conv2d,
    q8ta_conv2d_dw, q8ta_conv2d_pw and q8ta_conv2d_transposed."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 12, 1)
        self.up = nn.ConvTranspose2d(12, 4, 2, stride=2)

    def forward(self, x):
        return self.up(self.pw(self.dw(F.relu(self.c1(x)))))


class Resample(nn.Module):
    """Bilinear upsampling: by a scale factor (then a per-channel gain), to a size with corners
    aligned, to a size that is no whole multiple."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(3, 1, 1) + 0.5)

    def forward(self, x):
        return (F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False) * self.gain,
                F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True),
                F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False))


def _pt2e(model: nn.Module, inputs: tuple, scheme: str) -> nn.Module:
    """PT2E quantization (prepare, calibrate on ``inputs``, convert) and what VulkanPartitioner
    lowers each scheme to:
    vk_w4: VulkanQuantizer, int4 weights per channel -> et_vk.linear_qcs4w
    vk_w8: VulkanQuantizer, int8 weights per channel -> aten._weight_int8pack_mm
    vk_dyn8: VulkanQuantizer is_dynamic -> quantized_decomposed.dequantize_per_channel + aten.linear
    xnn_static: XNNPACKQuantizer, static int8 activations -> quantize_per_tensor, et_vk.q8ta_linear
    (et_vk.q8ta_conv2d* for convolutions), dequantize_per_tensor"""
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if scheme == "xnn_static":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                            get_symmetric_quantization_config)
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    else:
        from executorch.backends.vulkan.quantizer.vulkan_quantizer import (VulkanQuantizer,
                                                                          get_symmetric_quantization_config)
        quantizer = VulkanQuantizer().set_global(get_symmetric_quantization_config(
            is_dynamic=scheme == "vk_dyn8", weight_bits=4 if scheme == "vk_w4" else 8))
    m = prepare_pt2e(torch.export.export(model.eval(), inputs, strict=True).module(), quantizer)
    m(*inputs)
    m = convert_pt2e(m)
    allow_exported_model_train_eval(m)
    return m


class QEmbedSDPA(nn.Module):
    """A 4-bit embedding table as ExecuTorch's llama export quantizes one
    (quantized_decomposed.embedding_4bit.dtype, groups of 32; ET-VK rewrites it to
    et_vk.embedding_q4gsw), a linear, and et_vk.sdpa called directly: with an additive mask,
    and without one at a given scale. A second table, 48 wide in groups of 16, stays embedding_4bit
    (ET-VK's rewrite wants widths of multiples of 32; with zero points its pattern matcher fails
    to export)."""

    def __init__(self, vocab=80, d=64, heads=4, group=32):
        super().__init__()
        import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  (torch.ops.et_vk)
        import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401  (quantized_decomposed)

        gen = torch.Generator().manual_seed(1)
        q = torch.randint(-8, 8, (vocab, d), generator=gen)
        self.register_buffer("packed", (((q[:, 0::2] + 8) << 4) | (q[:, 1::2] + 8)).to(torch.uint8))
        self.register_buffer("scales", torch.rand(vocab, d // group, generator=gen) * 0.1 + 0.01)
        self.qkv = nn.Linear(d, 3 * d)
        self.heads = heads
        q2 = torch.randint(-8, 8, (vocab, 48), generator=gen)
        self.register_buffer("packed2", (((q2[:, 0::2] + 8) << 4) | (q2[:, 1::2] + 8)).to(torch.uint8))
        self.register_buffer("scales2", torch.rand(vocab, 3, generator=gen) * 0.1 + 0.01)

    def forward(self, ids, mask):
        h = torch.ops.quantized_decomposed.embedding_4bit.dtype(self.packed, self.scales, None, -8, 7, ids,
                                                                dtype=torch.float32)
        b, t, d = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.ops.et_vk.sdpa(q, k, v, mask)
        e2 = torch.ops.quantized_decomposed.embedding_4bit.dtype(self.packed2, self.scales2, None, -8, 7, ids,
                                                                 dtype=torch.float32)
        return a.transpose(1, 2).reshape(b, t, d), torch.ops.et_vk.sdpa(q, k, v, None, 0.5), e2 * 2.0


class RopeInterleaved(nn.Module):
    """et_vk.apply_rotary_emb_interleaved (EdgeTAM's RoPE, called directly) with a constant
    freqs_cis [1, N, C/2, 2] between two linears."""

    def __init__(self, n=12, c=32):
        super().__init__()
        import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  (torch.ops.et_vk)

        angles = torch.outer(torch.arange(n, dtype=torch.float32), 1.0 / 100.0 ** (torch.arange(0, c, 2) / c))
        self.register_buffer("freqs", torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).unsqueeze(0))
        self.fc1, self.fc2 = nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, x):
        return self.fc2(torch.ops.et_vk.apply_rotary_emb_interleaved(self.fc1(x), self.freqs))


class BatchedCNN(nn.Module):
    """A residual CNN block on a batch of 2: ET-VK leaves its convolutions to ExecuTorch's CPU
    kernels (aten::convolution.out between delegates)."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        for b in (self.b1, self.b2):
            b.running_mean.normal_()
            b.running_var.uniform_(0.5, 2)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = F.relu(self.b2(self.c2(h)) + h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class PoolsAndConvs(nn.Module):
    """Pools, padding, a transposed convolution and a 1-D convolution on a batch of 2 (some of
    them left to the CPU: aten::_adaptive_avg_pool2d.out, aten::convolution.out)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
        self.bn.running_mean.normal_()
        self.bn.running_var.uniform_(0.5, 2)
        self.ct = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.c1 = nn.Conv1d(4, 6, 3, padding=2, dilation=2)

    def forward(self, x):
        h = self.bn(x)
        return (F.max_pool2d(h, 3, 2, 1), F.avg_pool2d(h, 2), F.adaptive_avg_pool2d(h, (2, 3)), self.ct(h),
                F.pad(h, (1, 2, 0, 1), value=0.5), self.c1(h.flatten(2)))


class CpuKernels(nn.Module):
    """Ops ET-VK 1.5.1 leaves to ExecuTorch's portable CPU kernels, several with two or three
    outputs: max/min along a dim, topk, var/std, cumsum, elu, erf, log1p (softplus), remainder,
    instance norm; around a linear that ET-VK runs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, img):
        x = self.fc(x)
        a = x.max(1).values - x.min(0).values.sum() + x.topk(3, 1).values.sum(1, keepdim=True)
        b = x.var(1, keepdim=True) + x.std(0) + torch.cumsum(x, 1)
        c = F.elu(x) + torch.erf(x) + F.softplus(x) + torch.remainder(x, 0.7)
        return a, b, c, F.instance_norm(img)


def programs(gen: torch.Generator):
    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "mlp": (MLP(), (rand(4, 32),)),
        "encoder": (Encoder(), (rand(1, 16, 64),)),
        "convnet": (ConvNet(), (rand(1, 3, 16, 16),)),
        "elementwise": (Elementwise(), (rand(5, 8), rand(5, 8))),
        "tiny_llama": (TinyLlama(), (torch.randint(0, 96, (1, 16), generator=gen),)),
        "quant_mlp": (_quantize(QuantMLP(), "dq8ca_q4"), (rand(4, 64),)),
        "q4w_mlp": (_quantize(QuantMLP(), "q4w"), (rand(4, 64),)),
        "q8w_mlp": (_quantize(QuantMLP(), "q8w"), (rand(4, 64),)),
        "int8wo_mlp": (_quantize(QuantMLP(), "int8wo"), (rand(4, 64),)),
        "kv_decoder": (KVDecoder(), (torch.randint(0, 96, (1, 4), generator=gen), torch.tensor([0])),
                       [(torch.randint(0, 96, (1, 4), generator=gen), torch.tensor([4]))]),
        "paged_mlp": (MLP(), (rand(4, 32),), (), 4096),
        "paged_kv_decoder": (KVDecoder(), (torch.randint(0, 96, (1, 4), generator=gen), torch.tensor([0])),
                             [(torch.randint(0, 96, (1, 4), generator=gen), torch.tensor([4]))], 4096),
        "vision": (Vision(), (rand(1, 3, 8, 8),)),
        "elementwise2": (Elementwise2(), (rand(4, 8), rand(4, 8))),
        "rope": (Rope(), (rand(1, 8, 32),)),
        **{name: (_pt2e(QuantMLP(), (x,), scheme), (x,)) for name, scheme, x in (
            ("qcs4w_mlp", "vk_w4", rand(4, 64)), ("int8pack_mlp", "vk_w8", rand(4, 64)),
            ("pc8_mlp", "vk_dyn8", rand(4, 64)), ("q8ta_mlp", "xnn_static", rand(4, 64)))},
        **{"qconv": (_pt2e(QConv(), (x,), "xnn_static"), (x,)) for x in (rand(1, 4, 8, 8),)},
        "resample": (Resample(), (rand(1, 3, 4, 6),)),
        "qembed_sdpa": (QEmbedSDPA(), (torch.randint(0, 80, (2, 6), generator=gen),
                                       torch.triu(torch.full((6, 6), -1e4), 1) + rand(6, 6) * 0.1)),
        "rope_interleaved": (RopeInterleaved(), (rand(2, 12, 32),)),
        # exported with a dynamic batch dim (up to 8): vkgraph runs it at the bound
        "dynamic_mlp": (MLP(), (rand(8, 32),), (), 128, ({0: torch.export.Dim("batch", max=8)},)),
        "batched_cnn": (BatchedCNN(), (rand(2, 3, 8, 8),)),
        "pools_convs": (PoolsAndConvs(), (rand(2, 4, 7, 9),)),
        "cpu_kernels": (CpuKernels(), (rand(3, 8), rand(1, 6, 5, 7))),
    }


def export(name: str, model: nn.Module, inputs: tuple, out: Path, more_calls: tuple = (),
           segment_alignment: int = 128, dynamic_shapes: tuple | None = None) -> None:
    """NAME.pte and NAME.npz: input_K and output_K of the first call, and for a stateful model
    (one with a reset()) callN.input_K / callN.output_K of the calls after it, in order.
    ``segment_alignment`` 4096 puts every constant on a page of its own (vkgraph imports such
    weights in place; ExecuTorch's default is 128); ``dynamic_shapes`` as torch.export takes it."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    model.eval()
    arrays = {}
    with torch.no_grad():
        for n, call in enumerate((inputs, *more_calls)):
            prefix = f"call{n}." if n else ""
            ref = model(*call)
            refs = ref if isinstance(ref, tuple) else (ref,)
            arrays.update({f"{prefix}input_{i}": x.numpy() for i, x in enumerate(call)})
            arrays.update({f"{prefix}output_{i}": y.detach().contiguous().numpy() for i, y in enumerate(refs)})
        if hasattr(model, "reset"):
            model.reset()  # the program starts from the state the first call saw
        ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
        prog = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).to_executorch(
            ExecutorchBackendConfig(segment_alignment=segment_alignment))
    (out / f"{name}.pte").write_bytes(prog.buffer)
    np.savez(out / f"{name}.npz", **arrays)
    print(f"{name}: {len(prog.buffer)} bytes, {len(inputs)} inputs, {1 + len(more_calls)} calls")


def export_minilm(directory: str, out: Path, segment_alignment: int = 128) -> None:
    """all-MiniLM-L6-v2's BERT encoder (mean pooling and normalisation included) from a checkpoint
    directory (config.json, model.safetensors), for a batch of 3 sequences of 16 tokens."""
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig.from_json_file(str(Path(directory) / "config.json")), add_pooling_layer=False)
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / "model.safetensors"))
    bert.load_state_dict({k.removeprefix("bert."): v for k, v in state.items()}, strict=False)

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).float()
            return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (3, 16), generator=gen)
    mask = torch.ones(3, 16, dtype=torch.int64)
    export("minilm", Embed(), (ids, mask), out, segment_alignment=segment_alignment)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="export these programs only")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--minilm", metavar="DIR", help="export all-MiniLM-L6-v2 from this checkpoint directory instead")
    ap.add_argument("--segment-alignment", type=int, default=128, help="for --minilm (4096: weights on pages)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if args.minilm:
        export_minilm(args.minilm, out, args.segment_alignment)
        return 0
    for name, (model, inputs, *more) in programs(torch.Generator().manual_seed(0)).items():
        if not args.only or name in args.only:
            export(name, model, inputs, out, *more)
    return 0


if __name__ == "__main__":
    sys.exit(main())
