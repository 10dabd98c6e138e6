"""Triton's 16-bit split with each chunk held in shared memory instead of registers.

    python reports/probes/triton_smem_split.py --out DIR          # on a GPU
    python reports/probes/triton_smem_split.py --out DIR --variants 32768x8x64 16384x8x48 --shapes 4096x32000
    python reports/probes/triton_smem_split.py --aot              # sm_90 builds only, no GPU

A variant is CHUNKxWARPS or CHUNKxWARPSxCAP (the register cap); a shape is BxV (bf16). CHUNK >= V
holds a whole row in one program, whose meetings then have no sibling to wait for.

The question. The split path holds a chunk's float32 exponentials in registers through its two
meetings. Its counters (reports/profiles.md) have it latency-bound: five 4-warp programs an SM
under the cap of 96 registers, 80 KB of a 16-bit row held per SM, a program's life about 7.5 us
on the H200 and 8.7 us on the H100 (from its bandwidth and the bytes it holds), so bf16 reaches
0.67 of copy there and 0.80 here; 0.88 would need some 106 KB held per SM, which registers
cannot hold without a spill. Shared memory holds 227 KB an SM. This kernel, written in Gluon
(Triton's lower-level language, which places tensors in shared memory and issues cp.async
itself), copies its chunk from global to shared memory with cp.async (no register holds the
bytes in flight), and reads it from there three times: for the max, for the fixed-point sum
(after the first meeting) and for the output (after the second), computing each exponential
twice. The meetings, the tags, the sum and the normaliser are the split kernel's
(kernels/triton_kernels.py, whose _gather and _nan_max it calls as they are), so the output bits
must equal the dispatch's.

Prediction: with the registers free, programs per SM are set by shared memory (CHUNK 8192 of
bf16: 13 of 16 KB, 208 KB held), so bandwidth follows 2-3 times the bytes in flight until the
DRAM or the issue of the second exponential limits; bf16 (4096, V >= 128256) from 0.80 of copy
to 0.90 or more on the H100 if the issue stays below its limit.

Limits of the probe: rows whose length and stride are multiples of 16 elements and whose start
is 16-byte aligned (the product's split also cuts unaligned rows on groups and handles their
edges); no streaming fallback (a program whose siblings never arrive writes NaN, which the bit
check reports); 16-bit storage only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from kernels.triton_kernels import _LOW, _TAG_MASK, _gather, _nan_max

# The cp.async copy from global to shared memory: async_load from Triton 3.7 on, before that
# async_copy_global_to_shared (same arguments).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# The block-wide barrier: gl.barrier from Triton 3.7 on, gl.thread_barrier before.
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
LOG2E = gl.constexpr(1.4426950408889634)
MAX_SPINS = 1 << 20

# (CHUNK, num_warps, register cap or None): shared memory per program is CHUNK x 2 bytes, and
# the cap lets as many programs fit an SM as its shared memory holds (65536 registers).
VARIANTS = ((8192, 4, None), (8192, 4, 48), (8192, 4, 40), (4096, 4, 40), (16384, 8, 48), (16384, 4, 64))
SHAPES = ((4096, 32000), (4096, 128256), (4096, 262144), (1024, 262144), (4096, 151936))


@gluon.jit
def smem_split_kernel(
    X,
    Y,
    WS,
    V,
    P,
    stride_x,
    stride_y,
    SCALE,
    CHUNK: gl.constexpr,
    VEC: gl.constexpr,
    P_BLOCK: gl.constexpr,
    MAX_SPINS: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    TILE: gl.constexpr = VEC * 32 * NW
    NT: gl.constexpr = CHUNK // TILE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [NW], [0])
    words: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    held: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    pid = gl.program_id(0).to(gl.int64)
    row = pid // P
    chunk = pid - row * P
    start = chunk * CHUNK
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = gl.arange(0, TILE, layout=layout)

    buf = gl.allocate_shared_memory(X.dtype.element_ty, [CHUNK], held)
    for t in gl.static_range(NT):
        offs = start + t * TILE + cols
        _async_load(buf.slice(t * TILE, TILE), x_row + offs, mask=offs < V)
    async_copy.commit_group()

    # The launch's tag, read while the chunk is in flight.
    lanes = gl.arange(0, P_BLOCK, layout=words)
    ws_row = WS + row * (3 * P)
    old = gl.max(gl.load(ws_row + chunk + lanes, mask=lanes == 0, other=0, volatile=True), axis=0)
    tag = ((old >> 32) + 1) & _TAG_MASK
    tag_hi = tag << 32

    async_copy.wait_group(0)
    _barrier()

    # Meeting 1: the row's max.
    m_lane = gl.full([TILE], -float("inf"), gl.float32, layout)
    for t in gl.static_range(NT):
        offs = start + t * TILE + cols
        x = buf.slice(t * TILE, TILE).load(layout).to(gl.float32)
        m_lane = _nan_max(m_lane, gl.where(offs < V, x, -float("inf")))
    m_c = gl.reduce(m_lane, 0, _nan_max)
    my_max = tag_hi | (m_c.to(gl.int32, bitcast=True).to(gl.int64) & _LOW)
    gl.atomic_xchg(ws_row + chunk, my_max, sem="relaxed")
    ok = lanes < P
    w, stale = _gather(ws_row + lanes, ok, lanes == chunk, my_max, tag, MAX_SPINS)
    v = (w & _LOW).to(gl.int32).to(gl.float32, bitcast=True)
    m = gl.reduce(gl.where(ok, v, -float("inf")), 0, _nan_max)

    # Meeting 2: the fixed-point sum, every chunk relative to the same m.
    s_lane = gl.zeros([TILE], gl.int64, layout)
    for t in gl.static_range(NT):
        offs = start + t * TILE + cols
        x = buf.slice(t * TILE, TILE).load(layout).to(gl.float32)
        e = gl.exp2((gl.where(offs < V, x, -float("inf")) - m) * LOG2E)
        s_lane += (e * SCALE).to(gl.int64)
    s_c = gl.sum(s_lane, axis=0)
    my_hi = tag_hi | ((s_c >> 32) & _LOW)
    my_lo = tag_hi | (s_c & _LOW)
    gl.atomic_xchg(ws_row + P + 2 * chunk, my_hi, sem="relaxed")
    gl.atomic_xchg(ws_row + P + 2 * chunk + 1, my_lo, sem="relaxed")
    upper = (lanes % 2) == 0
    ok2 = lanes < 2 * P
    w2, stale2 = _gather(ws_row + P + lanes, ok2, (lanes // 2) == chunk, gl.where(upper, my_hi, my_lo), tag, MAX_SPINS)
    s = gl.sum(gl.where(ok2, gl.where(upper, (w2 & _LOW) << 32, w2 & _LOW), 0), axis=0)

    hi = s.to(gl.float32)
    inv = gl.div_rn(SCALE, hi)
    inv = gl.where(m < float("inf"), inv, float("nan"))
    inv = gl.where((stale + stale2) > 0, float("nan"), inv)  # siblings that never came: NaN, seen by the bit check
    for t in gl.static_range(NT):
        offs = start + t * TILE + cols
        x = buf.slice(t * TILE, TILE).load(layout).to(gl.float32)
        e = gl.exp2((x - m) * LOG2E)
        gl.store(y_row + offs, (e * inv).to(Y.dtype.element_ty), mask=offs < V)


def launch(x, y, ws_cache: dict, CHUNK: int, num_warps: int, maxnreg: int | None = None):
    """One launch of smem_split_kernel for x -> y; ws_cache holds a zeroed workspace per (B, P)."""
    import torch

    from kernels.triton_dispatch import fixed_point_scale

    B, V = x.shape
    if V % 16 or x.stride(0) % 16 or y.stride(0) % 16 or x.data_ptr() % 16 or y.data_ptr() % 16:
        raise ValueError(f"the probe takes 16-element-aligned rows only, not ({B}, {V})")
    P = triton.cdiv(V, CHUNK)
    p_block = max(32 * num_warps, triton.next_power_of_2(2 * P))
    key = (x.device, B, P)
    if key not in ws_cache:
        ws_cache[key] = torch.zeros(B * 3 * P, dtype=torch.int64, device=x.device)
    ws = ws_cache[key]
    smem_split_kernel[(B * P,)](
        x, y, ws, V, P, x.stride(0), y.stride(0), fixed_point_scale(V),
        CHUNK=CHUNK, VEC=16 // x.element_size(), P_BLOCK=p_block, MAX_SPINS=MAX_SPINS, num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip
    return y


def aot() -> None:
    """Registers, spills and shared memory of each variant's sm_90 build (bf16)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from kernels.triton_build import build

    sig = {
        "X": "*bf16", "Y": "*bf16", "WS": "*i64", "V": "i32", "P": "i32", "stride_x": "i32", "stride_y": "i32",
        "SCALE": "fp32", "CHUNK": "constexpr", "VEC": "constexpr", "P_BLOCK": "constexpr", "MAX_SPINS": "constexpr",
    }  # fmt: skip
    print(f"triton {triton.__version__}")
    for CHUNK, warps, cap in VARIANTS:
        consts = {"CHUNK": CHUNK, "VEC": 8, "P_BLOCK": max(32 * warps, 64), "MAX_SPINS": MAX_SPINS}
        b = build(
            "smem_split", smem_split_kernel, "bf16", consts, warps,
            sig=sig, aligned=(0, 1, 2, 3, 5, 6), maxnreg=cap, ast_source=GluonASTSource,
        )  # fmt: skip
        print(
            f"CHUNK {CHUNK:6d} x {warps} warps, cap {cap}: {b['regs']} registers, {b['local']} bytes local "
            f"({b['spill_bytes']} spilled in a plain ptxas -v build of the PTX), {b['shared']} bytes shared"
        )


def _ints(text: str, n: int) -> tuple:
    """ "8192x4" -> (8192, 4) or, with n = 3, (8192, 4, None); "8192x4x48" -> (8192, 4, 48)."""
    parts = [int(p) for p in text.split("x")]
    return tuple(parts + [None] * (n - len(parts)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--aot", action="store_true")
    parser.add_argument("--variants", nargs="+", help="CHUNKxWARPS[xCAP] ...")
    parser.add_argument("--shapes", nargs="+", help="BxV ...")
    args = parser.parse_args()
    global VARIANTS, SHAPES
    if args.variants:
        VARIANTS = tuple(_ints(v, 3) for v in args.variants)
    if args.shapes:
        SHAPES = tuple(_ints(v, 2) for v in args.shapes)
    if args.aot:
        aot()
        return
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from triton_rows_sweep import bits, sweep_shapes

    cache: dict = {}

    def variants_of(x, reference):
        variants = {}
        for CHUNK, warps, cap in VARIANTS:
            y = torch.full_like(x, float("nan"))
            launch(x, y, cache, CHUNK, warps, cap)
            torch.cuda.synchronize()
            same = torch.equal(bits(y), bits(reference))
            out = torch.empty_like(x)
            name = f"smem {CHUNK}x{warps}" + (f"/r{cap}" if cap else "") + ("" if same else " BITS DIFFER")
            variants[name] = lambda x=x, out=out, c=CHUNK, w=warps, r=cap: launch(x, out, cache, c, w, r)
        return variants

    shapes = [(B, V, torch.bfloat16) for B, V in SHAPES]
    sweep_shapes(shapes, args.out / "triton_smem_split.json", variants_of)


if __name__ == "__main__":
    main()
