"""Deliberately wrong softmax kernels: the suite must reject every one of them.

Each is a small Triton kernel with a wrapper written the way a correct kernel's is (input
checks, `out`, CPU tensors under TRITON_INTERPRET=1, CUDA tensors otherwise) and a `KernelSpec`;
`CORPUS` lists the specs. tests/test_new_kernels.py registers them through the
public registry seam,

    SOFTMAX_SUITE_EXTRA_KERNELS=tests.broken_kernels:CORPUS pytest -m cpu -k broken_

and checks that the registry-wide cases fail on each (`CAUGHT_BY` names the cases meant to
catch it). `CUDA_ONLY` are wrong only at sizes no CPU case reaches: `pytest -m cuda` must
reject them, and the tail faults too (tests/test_new_kernels.py runs that on a GPU).

The Triton ones tile a row in BLOCK-wide pieces (16 on the CPU cases' rows of tens of elements,
so those span several tiles) and compute in float32; the tail faults (TAIL_FAULTS) are PyTorch
ops on an otherwise accurate softmax, wrong only in the digits the tail tolerance looks at.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.checks import check_softmax_input, prepare_output
from kernels.spec import KernelSpec, Path

# The CPU-tensor idiom: under the interpreter the kernels take CPU tensors, else CUDA ones.
DEVICE_TYPE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
BLOCK_DEFAULT = 256  # the tile of a plain call; the CPU cases force 16 (Path.cpu)
_FP32 = (torch.float32,)


@triton.jit
def _safe(m):
    # The max to subtract: 0 while a row has seen only -inf, so exp gives 0 rather than NaN.
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def online_no_rescale_kernel(X, Y, V, stride_x, stride_y, BLOCK: tl.constexpr):
    # Online softmax (a running max and sum in one pass) that forgets to rescale the running sum
    # when the max grows: terms summed before the new max are too large.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    start = 0
    while start < V:
        x = tl.load(X + row * stride_x + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s + tl.sum(tl.exp(x - _safe(m_new)), axis=0)  # BUG: s * exp(m - m_new) + ...
        m = m_new
        start += BLOCK
    start = 0
    while start < V:
        x = tl.load(X + row * stride_x + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        tl.store(Y + row * stride_y + start + cols, (tl.exp(x - m) / s).to(Y.dtype.element_ty), mask=start + cols < V)
        start += BLOCK


@triton.jit
def three_pass_kernel(
    X,
    Y,
    V,
    stride_x,
    stride_y,
    BLOCK: tl.constexpr,
    SUBTRACT_MAX: tl.constexpr,
    LAST: tl.constexpr,
    ROW_STRIDE_IS_V: tl.constexpr,
    NORM: tl.constexpr,
    DIVIDE: tl.constexpr,
):
    # The three passes of a tiled softmax (max, sum, write), each bug behind a switch:
    #   SUBTRACT_MAX = 0     exp(x) instead of exp(x - max): overflows at large logits
    #   LAST = V - 1 ...     masks with `cols < V - 1`: the last element is lost
    #   ROW_STRIDE_IS_V = 1  addresses row r at r * V, not r * stride: wrong for padded rows
    #   NORM != 1            divides by NORM * sum
    #   DIVIDE = 1           divides by the sum instead of multiplying by its reciprocal (the
    #                        wrapper of the batch-dependent one does so for a batch of one row:
    #                        each output rounds differently, so a row's bits depend on the batch)
    row = tl.program_id(0).to(tl.int64)
    stride = stride_x
    if ROW_STRIDE_IS_V:
        stride = V
    x_row = X + row * stride
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK)
    n = V - LAST
    m = tl.full((), float("-inf"), tl.float32)
    start = 0
    while start < n:
        x = tl.load(x_row + start + cols, mask=start + cols < n, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x, axis=0))
        start += BLOCK
    if not SUBTRACT_MAX:
        m = tl.zeros((), tl.float32)
    s = tl.zeros((), tl.float32)
    start = 0
    while start < n:
        x = tl.load(x_row + start + cols, mask=start + cols < n, other=float("-inf")).to(tl.float32)
        s += tl.sum(tl.exp(x - m), axis=0)
        start += BLOCK
    s = s * NORM
    inv = 1.0 / s
    start = 0
    while start < n:
        x = tl.load(x_row + start + cols, mask=start + cols < n, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - m)
        if DIVIDE:
            y = e / s
        else:
            y = e * inv
        tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=start + cols < n)
        start += BLOCK


def _spec(name, launch, *, backend="triton") -> KernelSpec:
    """The spec of a one-path kernel whose wrapper is written as a correct kernel's is, launching
    `launch(x, y, BLOCK)`: tiles of BLOCK_DEFAULT through `softmax`, of 16 on the CPU cases'
    short rows (`run_path` with the path's `cpu` parameters; a kernel in PyTorch ops ignores it)."""

    def run_path(x, path, *, out=None, BLOCK=BLOCK_DEFAULT):
        check_softmax_input(x, kernel=name, dtypes=_FP32, device_type=DEVICE_TYPE)
        y = prepare_output(x, out, kernel=name)
        if path != "tile":
            raise ValueError(f"{name} softmax: unknown path {path!r} (tile)")
        if x.shape[0] == 0:
            return y
        if x.stride(1) != 1:
            x = x.contiguous()
        launch(x, y, BLOCK)
        return y

    def softmax(x, *, out=None):
        return run_path(x, "tile", out=out)

    path = Path("tile", gpu=(5, 100), cpu={"BLOCK": 16})
    return KernelSpec(name, softmax, (path,), ("float32",), backend=backend, run_path=run_path, interpretable=True)


def _three_pass(name, *, grid_cap=None, divide_one_row=False, **bug) -> KernelSpec:
    switches = {"SUBTRACT_MAX": 1, "LAST": 0, "ROW_STRIDE_IS_V": 0, "NORM": 1.0, "DIVIDE": 0, **bug}

    def launch(x, y, BLOCK):
        B = x.shape[0]
        grid = B if grid_cap is None else min(B, grid_cap)
        divide = {"DIVIDE": int(B == 1)} if divide_one_row else {}
        three_pass_kernel[(grid,)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=BLOCK, **{**switches, **divide})

    return _spec(name, launch)


def _online(name) -> KernelSpec:
    def launch(x, y, BLOCK):
        online_no_rescale_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=BLOCK)

    return _spec(name, launch)


LOG2E = 1.4426950408889634


def tail_faulted_softmax(x, *, fast_exp=False, normaliser=1.0, tail_error=0.0):
    """A float32 softmax in PyTorch ops (CPU or CUDA tensors), as accurate as F.softmax's or
    more: x - max rounded to float32 as F.softmax's, exp and the quotient in float64, with one of
    the faults the tail tolerance exists for (the numerics issue's three):
      fast_exp     exp(s) as 2^(s * log2 e) with s * log2 e rounded to float32: the error grows
                   with the distance from the max, about twice F.softmax's at |s| of tens
      normaliser   divides by normaliser * sum (1 + 2e-5: every output 2e-5 relative low)
      tail_error   every probability below 1e-6 off by this fraction, the sign alternating along
                   the row, so that row sums still hold"""
    xf = x.float()
    s = xf - xf.amax(dim=-1, keepdim=True)
    e = torch.exp2((s * LOG2E).double()) if fast_exp else torch.exp(s.double())
    y = (e / (e.sum(dim=-1, keepdim=True) * normaliser)).float()
    if tail_error:
        sign = 1 - 2 * (torch.arange(x.shape[-1], device=x.device) % 2)
        y = torch.where(y < 1e-6, y * (1 + tail_error * sign), y)
    return y


def _tail(name, **fault) -> KernelSpec:
    def launch(x, y, BLOCK):
        y.copy_(tail_faulted_softmax(x, **fault))

    return _spec(name, launch, backend="torch")


# The largest grid the CUDA-only one launches: rows past it are never written.
GRID_CAP = 4096

CORPUS = (
    _online("broken_online_no_rescale"),
    _three_pass("broken_no_max_subtraction", SUBTRACT_MAX=0),
    _three_pass("broken_tail_dropped", LAST=1),
    _three_pass("broken_row_stride_is_v", ROW_STRIDE_IS_V=1),
    _three_pass("broken_normaliser_off", NORM=1.001),
    _three_pass("broken_batch_dependent", divide_one_row=True),
    _three_pass("broken_grid_capped", grid_cap=GRID_CAP),
    _tail("broken_tail_off_5_percent", tail_error=0.05),
    _tail("broken_normaliser_off_2e_5", normaliser=1 + 2e-5),
    _tail("broken_fast_exp", fast_exp=True),
)
# The faults of the distribution's tail: wrong only where the tolerance looks at every output.
TAIL_FAULTS = ("broken_tail_off_5_percent", "broken_normaliser_off_2e_5", "broken_fast_exp")

# The registry-wide cases meant to catch each (a prefix of the test's name); more may fail too.
CAUGHT_BY = {
    "broken_online_no_rescale": ("test_cpu_path_under_layout",),
    "broken_no_max_subtraction": ("test_cpu_path_edges",),
    "broken_tail_dropped": ("test_cpu_path_under_layout",),
    "broken_row_stride_is_v": ("test_cpu_path_under_layout",),
    "broken_normaliser_off": ("test_cpu_path_under_layout",),
    "broken_batch_dependent": ("test_cpu_path_batch_invariant",),
    "broken_grid_capped": ("test_batch_invariant", "test_deterministic"),
    "broken_tail_off_5_percent": ("test_every_interpretable_path_on_wide_rows",),
    "broken_normaliser_off_2e_5": ("test_every_interpretable_path_on_wide_rows", "test_cpu_path_under_layout"),
    "broken_fast_exp": ("test_every_interpretable_path_on_wide_rows",),
}
# The cases of `pytest -m cuda` meant to catch each CUDA_ONLY kernel and each tail fault there.
CUDA_CAUGHT_BY = {
    "broken_grid_capped": ("test_byte_equivalence.py", ("test_batch_invariant", "test_deterministic")),
    **{name: ("test_accuracy.py", ("test_kernel_on_the_tail",)) for name in TAIL_FAULTS},
}
# Wrong only past GRID_CAP rows, which no CPU case runs (the interpreter would take minutes).
CUDA_ONLY = ("broken_grid_capped",)
