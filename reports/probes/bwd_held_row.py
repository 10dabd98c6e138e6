"""A softmax backward that holds a 16-bit row of y and dy whole in shared memory, against the
dispatched backward (the stream path at these shapes).

    python reports/probes/bwd_held_row.py --out DIR      # on a GPU

The question. The Triton backward streams 16-bit rows of 8193-98304 from B = 64 on: a few
programs per SM walk the rows, reading each three times, the re-reads from L2. At bf16 (4096,
32000) it ran at 0.66 of its two-read-one-write floor on an H200, where torch.compile's kernel
reached 0.95. The forward's held kernel (kernels/triton_kernels.py, softmax_held_kernel) took
the same rows from 0.78 to 0.96 of copy by copying the row into shared memory with cp.async and
making its three passes there. Here both inputs are copied in (2 x 64 KB at V = 32768: one
program an SM at V > 16384), then the backward's three passes (the largest finite |y dy| and
the non-finite terms; the fixed-point sum; the write) read shared memory only. Rows whose
pointers, stride and V are 16-byte aligned only (this probe's kernel has no edge code).

Per shape: the dispatch, and the held kernel at 16 and 32 warps, in the graph clock of
probes/triton_rows_sweep.py, as a fraction of the floor against this GPU's copy; each
variant's bits against the dispatch's, on inputs with a row of NaN and a row of inf.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from kernels import triton_backward as tb
from kernels.triton_dispatch import fixed_point_bits
from kernels.triton_kernels import _async_load, _barrier
from kernels.triton_loss_kernels import _finite_abs, _fixed_finite, _fixed_point_scale, _non_finite

sys.path.insert(0, str(Path(__file__).parent))
from triton_rows_sweep import bits, floor_rows, shapes_main  # noqa: E402

SHAPES = [
    *((B, V, torch.bfloat16) for B, V in ((4096, 32000), (4096, 32768), (4096, 24576), (4096, 16384))),
    *((B, 32000, torch.bfloat16) for B in (1024, 16384)),
    (4096, 32000, torch.float16),
]
WARPS = (16, 32)


@gluon.jit
def softmax_backward_held_kernel(DY, Y, DX, V, K, BLOCK: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    ALIGN: gl.constexpr = 8  # 16 bytes of 16-bit storage
    TILE: gl.constexpr = ALIGN * 32 * NW
    NT: gl.constexpr = BLOCK // TILE
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [NW], [0])
    layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    row = gl.program_id(0).to(gl.int64)
    start = gl.multiple_of(row * V, ALIGN)
    cols = gl.arange(0, TILE, layout=lanes)
    grp = cols // ALIGN  # masks constant over each 16-byte group, so cp.async moves whole groups
    groups = V // ALIGN
    y_buf = gl.allocate_shared_memory(Y.dtype.element_ty, [BLOCK], layout)
    dy_buf = gl.allocate_shared_memory(DY.dtype.element_ty, [BLOCK], layout)
    for t in gl.static_range(NT):
        mask = t * (TILE // ALIGN) + grp < groups
        _async_load(y_buf.slice(t * TILE, TILE), Y + start + t * TILE + cols, mask=mask)
        _async_load(dy_buf.slice(t * TILE, TILE), DY + start + t * TILE + cols, mask=mask)
    async_copy.commit_group()
    async_copy.wait_group(0)
    _barrier()

    a_lane = gl.zeros([TILE], gl.float32, lanes)
    f_lane = gl.zeros([TILE], gl.float32, lanes)
    for t in gl.static_range(NT):
        mask = t * (TILE // ALIGN) + grp < groups
        y = y_buf.slice(t * TILE, TILE).load(lanes).to(gl.float32)
        dy = dy_buf.slice(t * TILE, TILE).load(lanes).to(gl.float32)
        p = gl.where(mask, y * dy, 0.0)
        a_lane = gl.maximum(a_lane, _finite_abs(p))
        f_lane += _non_finite(p)
    up, down = _fixed_point_scale(gl.max(a_lane, axis=0), K)
    _barrier()
    s_lane = gl.zeros([TILE], gl.int64, lanes)
    for t in gl.static_range(NT):
        mask = t * (TILE // ALIGN) + grp < groups
        y = y_buf.slice(t * TILE, TILE).load(lanes).to(gl.float32)
        dy = dy_buf.slice(t * TILE, TILE).load(lanes).to(gl.float32)
        s_lane += _fixed_finite(gl.where(mask, y * dy, 0.0), up)
    s = gl.sum(s_lane, axis=0).to(gl.float32) * down + gl.sum(f_lane, axis=0)
    _barrier()
    for t in gl.static_range(NT):
        mask = t * (TILE // ALIGN) + grp < groups
        y = y_buf.slice(t * TILE, TILE).load(lanes).to(gl.float32)
        dy = dy_buf.slice(t * TILE, TILE).load(lanes).to(gl.float32)
        gl.store(DX + start + t * TILE + cols, (y * (dy - s)).to(DX.dtype.element_ty), mask=mask)


def held(dy: torch.Tensor, y: torch.Tensor, num_warps: int) -> torch.Tensor:
    B, V = y.shape
    assert y.is_contiguous() and dy.is_contiguous() and V % 8 == 0 and y.element_size() == 2
    dx = torch.empty_like(y)
    block = max(triton.next_power_of_2(V), 8 * 32 * num_warps)
    softmax_backward_held_kernel[(B,)](dy, y, dx, V, fixed_point_bits(V), BLOCK=block, num_warps=num_warps)
    return dx


def backward_case(B: int, V: int, dtype: torch.dtype):
    """(dy, y, the dispatch's dx, {name: call} and {name: same bits} holding the dispatch) for a
    probe's shape: y a softmax with a NaN, dy with an inf."""
    g = torch.Generator(device="cuda").manual_seed(B + V)
    y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
    dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
    y[1, 5], dy[2, 9] = float("nan"), float("inf")
    name = f"dispatch ({tb.plan(B, V, dtype)})"
    return dy, y, tb.softmax_backward(dy, y), {name: lambda: tb.softmax_backward(dy, y)}, {name: True}


def measure(B: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    dy, y, want, variants, same = backward_case(B, V, dtype)
    for w in WARPS:
        name = f"held {w} warps"
        same[name] = bool(torch.equal(bits(held(dy, y, w)), bits(want)))
        variants[name] = lambda w=w: held(dy, y, w)
    return floor_rows(variants, same, B, V, dtype, copy, passes=3)


if __name__ == "__main__":
    sys.exit(shapes_main("bwd_held_row", measure, SHAPES, __doc__))
