"""How many multiply-adds a second the device runs in a kernel of nothing else: 32 independent
accumulators an invocation, in float32 (a multiply and an add), int16 pairs in a 32-bit word
unpacked (two multiply-adds a term), int8 quads unpacked (four), and two int16 halves of one
32-bit word multiplied at once (two a term: a small int times the word gives both products, the
tiles' int8 activations, glsl/q8_pairs.glsl). The ceiling the linears' tiles are measured against
(README, "Decode speed"): on a CPU renderer, whether narrower activations could buy arithmetic.

    python benchmarks/mac_peak.py [--device lavapipe] [--invocations 16384] [--iters 2000]
"""

from __future__ import annotations

import argparse
import struct
from contextlib import ExitStack

from vkgraph.runtime import Buffer, Device, OneShot, Stage, TimestampQueryPool
from vkgraph.shaders import default_compiler
from vkgraph.tools.smoke import storage_kernel

SOURCE = """#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) writeonly buffer Y { uint y[]; };
layout(set = 0, binding = 1) readonly buffer X { uint x[]; };
layout(push_constant) uniform P { uint iters; };
void main() {
    uint gid = gl_GlobalInvocationID.x;
#if MODE == 0
    float acc[32], a[32];
    [[unroll]] for (uint j = 0u; j < 32u; ++j) { acc[j] = 0.0; a[j] = uintBitsToFloat((x[(gid + j) & 1023u] & 0x3FFFFFu) | 0x3F800000u); }
    float b = float(gid & 7u) * 0.001 + 1.0;
    for (uint i = 0u; i < iters; ++i) {
        [[unroll]] for (uint j = 0u; j < 32u; ++j) acc[j] += a[j] * b;
        b = b * 0.999 + 0.001;
    }
    float s = 0.0;
    [[unroll]] for (uint j = 0u; j < 32u; ++j) s += acc[j];
    y[gid] = floatBitsToUint(s);
#else
    int acc[32], a[32];
    [[unroll]] for (uint j = 0u; j < 32u; ++j) { acc[j] = 0; a[j] = int(x[(gid + j) & 1023u]); }
    int b = int(gid * 2654435761u);
    for (uint i = 0u; i < iters; ++i) {
#if MODE == 1
        int b0 = (b << 16) >> 16, b1 = b >> 16;
        [[unroll]] for (uint j = 0u; j < 32u; ++j) acc[j] += ((a[j] << 16) >> 16) * b0 + (a[j] >> 16) * b1;
        b += 0x00030001;
#elif MODE == 3
        [[unroll]] for (uint j = 0u; j < 32u; ++j) acc[j] += a[j] * b;
        b = (b + 3) & 7;
#else
        int b0 = bitfieldExtract(b, 0, 8), b1 = bitfieldExtract(b, 8, 8), b2 = bitfieldExtract(b, 16, 8),
            b3 = bitfieldExtract(b, 24, 8);
        [[unroll]] for (uint j = 0u; j < 32u; ++j)
            acc[j] += bitfieldExtract(a[j], 0, 8) * b0 + bitfieldExtract(a[j], 8, 8) * b1
                      + bitfieldExtract(a[j], 16, 8) * b2 + bitfieldExtract(a[j], 24, 8) * b3;
        b += 0x01030507;
#endif
    }
    int s = 0;
    [[unroll]] for (uint j = 0u; j < 32u; ++j) s += acc[j];
    y[gid] = uint(s);
#endif
}
"""

#: mode: (name, multiply-adds a term)
MODES = {0: ("float32 (multiply + add)", 1), 1: ("int16 pairs", 2), 2: ("int8 quads", 4),
         3: ("int16 halves, one multiply", 2)}


def seconds(device: Device, mode: int, invocations: int, iters: int, local: int, repeat: int = 5) -> float:
    """GPU seconds of one dispatch of ``mode``, the least of ``repeat``."""
    spirv = default_compiler().compile_source(SOURCE, f"mac_peak_{mode}.comp", {"MODE": mode})
    with ExitStack() as stack:
        own = stack.enter_context
        y = own(Buffer(device, invocations * 4, name="y"))
        x = own(Buffer(device, 1024 * 4, name="x"))
        layout, dset, pipeline = storage_kernel(stack, device, spirv, "mac_peak", [y, x], 4, {0: local})
        queries = own(TimestampQueryPool(device, 2))
        best = float("inf")
        for _ in range(repeat):
            with OneShot(device) as cmd:
                cmd.fill_buffer(x, 0x3C003C00)
                cmd.compute_barrier()
                cmd.reset_query_pool(queries)
                cmd.write_timestamp(queries, 0, Stage.TOP_OF_PIPE)
                cmd.bind_pipeline(pipeline)
                cmd.bind_descriptor_sets(layout, [dset])
                cmd.push_constants(layout, struct.pack("<I", iters))
                cmd.dispatch(invocations // local)
                cmd.write_timestamp(queries, 1, Stage.BOTTOM_OF_PIPE)
            t0, t1 = queries.results_ns()
            best = min(best, (t1 - t0) / 1e9)
        return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="renderer (lavapipe, swiftshader) or device-name substring")
    ap.add_argument("--invocations", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--local", type=int, default=None,
                    help="workgroup size (default: ops' on a CPU renderer, one SIMD group: 8, or lavapipe's 16 at 512 bits)")
    args = ap.parse_args()
    with Device(prefer=args.device) as device:
        if not device.physical.timestamps_supported:
            print(f"{device.physical.name}: no timestamp queries")
            return 1
        local = args.local or max(8, device.simd_width)
        print(f"{device.physical.name}, {args.invocations} invocations x {args.iters} iterations x 32 accumulators, "
              f"workgroups of {local}\n")
        print("| arithmetic | GPU ms | G terms/s | G multiply-adds/s |")
        print("|---|---|---|---|")
        terms = args.invocations * args.iters * 32
        for mode, (name, per_term) in MODES.items():
            sec = seconds(device, mode, args.invocations, args.iters, local)
            print(f"| {name} | {sec * 1e3:.1f} | {terms / sec / 1e9:.1f} | {terms * per_term / sec / 1e9:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
