"""Online softmax in Triton, the example of README.md's "Adding a kernel": one pass over a row
keeps a running max and a running sum of exponentials (in float64), rescaling the sum whenever
the max grows; a second pass writes exp(x - max) / sum.

Two paths: "row" (a program per row) and "rows" (a program per ROWS rows, for large batches).
Both run the same per-row code in the same order, so a row gets the same bits through either,
at any batch size, position or layout: the invariance every kernel of the suite must keep.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.checks import check_softmax_input, prepare_output

NAME = "toy_online"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Under TRITON_INTERPRET=1 (set by the suite where no GPU is visible) Triton runs kernels on CPU
# tensors: the wrapper then asks for CPU tensors, else for CUDA ones.
DEVICE_TYPE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
ROWS_MIN_B = 4096  # from this many rows on, a program takes ROWS rows


@triton.jit
def _online_row(X, Y, row, V, stride_x, stride_y, BLOCK: tl.constexpr):
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float64)  # float64, with its rescaling: no less accurate than F.softmax
    start = 0
    while start < V:
        x = tl.load(x_row + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # only -inf so far: exp gives 0, not NaN
        rescale = tl.exp(m.to(tl.float64) - safe.to(tl.float64))
        s = s * rescale + tl.sum(tl.exp(x - safe).to(tl.float64), axis=0)  # the running sum, rescaled
        m = m_new
        start += BLOCK
    start = 0
    while start < V:
        x = tl.load(x_row + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        y = (tl.exp(x - m).to(tl.float64) / s).to(tl.float32)
        tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=start + cols < V)
        start += BLOCK


@triton.jit
def online_row_kernel(X, Y, V, stride_x, stride_y, BLOCK: tl.constexpr):
    _online_row(X, Y, tl.program_id(0).to(tl.int64), V, stride_x, stride_y, BLOCK)


@triton.jit
def online_rows_kernel(X, Y, B, V, stride_x, stride_y, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * ROWS
    for r in range(ROWS):
        if first + r < B:
            _online_row(X, Y, first + r, V, stride_x, stride_y, BLOCK)


def plan(B: int, V: int, dtype=None) -> str:
    """The path a (B, V) input takes."""
    return "rows" if B >= ROWS_MIN_B else "row"


def run_path(x, path: str, *, out=None, BLOCK: int = 256, ROWS: int = 8):
    """softmax(x) through one named path with its launch parameters (the CPU cases of the suite
    pass small ones, so their short rows span several tiles)."""
    check_softmax_input(x, kernel=NAME, dtypes=DTYPES, device_type=DEVICE_TYPE)
    y = prepare_output(x, out, kernel=NAME)
    B, V = x.shape
    if B == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    if path == "row":
        online_row_kernel[(B,)](x, y, V, x.stride(0), y.stride(0), BLOCK=BLOCK)
    elif path == "rows":
        online_rows_kernel[(triton.cdiv(B, ROWS),)](x, y, B, V, x.stride(0), y.stride(0), BLOCK=BLOCK, ROWS=ROWS)
    else:
        raise ValueError(f"{NAME} softmax: unknown path {path!r} (row, rows)")
    return y


def softmax(x, *, out=None):
    """Softmax over the last dimension of a (B, V) tensor, through the path `plan` picks."""
    check_softmax_input(x, kernel=NAME, dtypes=DTYPES, device_type=DEVICE_TYPE)
    return run_path(x, plan(x.shape[0], x.shape[1], x.dtype), out=out)


def softmax_row(x, *, out=None):
    """The same kernel with one path: a program per row at its default tile."""
    return run_path(x, "row", out=out)
