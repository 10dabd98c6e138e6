"""The Triton rows path with resident programs that walk the rows, against one program a row.

    python reports/probes/triton_rows_persist.py --out DIR     # on a GPU
    python reports/probes/triton_rows_persist.py --cpu-bits    # bits against run_path, interpreted

The question. The rows path (kernels/triton_kernels.py, `softmax_rows_kernel`) gives each row of
V > 512 one program of one warp, cut into a head and a tail. At bf16 (32768, 600) it runs at
0.70 of copy; its counters (reports/profiles.md, "Which unit") show no saturated pipe (xu 52 %,
issue 55 %) and achieved occupancy 31.7 % of a theoretical 50 %: an SM holds 32 one-warp
programs, and a program lives about as long as one row's load takes, so its slot sits empty
while the next program starts. Here a grid of G programs per SM walks the rows (program p takes
rows p, p + grid, ...), and with PREFETCH the next row's loads are issued before this row's
reductions, so a warp has a row in flight while it computes. The arithmetic of a row is the
product kernel's (its helpers, the same order of operations), so every output must keep the
dispatch's bits, which the probe checks.

Timed as probes/triton_rows_sweep.py times (CUDA graphs of L2 flush + call less the flushes
alone, median of its ROUNDS), fraction of a copy ceiling measured in the same run. Writes
DIR/triton_rows_persist.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from triton_rows_sweep import bits, path_variants, sweep_shapes  # noqa: E402

from kernels.softmax_triton import launch_params, run_path  # noqa: E402
from kernels.triton_dispatch import fixed_point_scale, rows_cut, vector_align  # noqa: E402
from kernels.triton_kernels import _exp, _fixed, _nan_max, _normalise, _row_max, _softmax_scale  # noqa: E402

SHAPES = [(B, V, dt) for dt in (torch.bfloat16, torch.float32) for B, V in ((8192, 600), (32768, 600), (32768, 1100))]
PER_SM = (8, 16, 32)


@triton.jit
def _load_row(X, row, B, stride_x, HEAD: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr, V):
    # Past the last row (a prefetch): -inf throughout, never stored. (Masks as tensors: the
    # interpreter rejects a scalar one.)
    head = tl.arange(0, HEAD)
    tail = HEAD + tl.arange(0, TAIL)
    x_row = X + tl.multiple_of(row * stride_x, ALIGN)
    x = tl.load(x_row + head, mask=(head * 0 + row) < B, other=-float("inf")).to(tl.float32)
    t_mask = ((tail * 0 + row) < B) & ((tail // ALIGN) < V // ALIGN)
    xt = tl.load(x_row + tail, mask=t_mask, other=-float("inf")).to(tl.float32)
    return x, xt


@triton.jit
def persist_rows_kernel(
    X,
    Y,
    B,
    V,
    stride_x,
    stride_y,
    SCALE,
    HEAD: tl.constexpr,
    TAIL: tl.constexpr,
    ALIGN: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    # One row at a time, cut as the rows kernel cuts it (TAIL > 0); rows p, p + grid, ...
    step = tl.num_programs(0).to(tl.int64)
    row = tl.program_id(0).to(tl.int64)
    tail = HEAD + tl.arange(0, TAIL)
    x, xt = _load_row(X, row, B, stride_x, HEAD, TAIL, ALIGN, V)
    while row < B:
        if PREFETCH:
            nx, nxt = _load_row(X, row + step, B, stride_x, HEAD, TAIL, ALIGN, V)
        m = _nan_max(_row_max(x, 0), _row_max(xt, 0))
        e = _exp(x, m, Y.dtype.element_ty)
        et = _exp(xt, m, Y.dtype.element_ty)
        S = tl.sum(_fixed(e, SCALE), axis=0) + tl.sum(_fixed(et, SCALE), axis=0)
        neg_hi, inv = _softmax_scale(S, SCALE, m)
        y_row = Y + tl.multiple_of(row * stride_y, ALIGN)
        tl.store(y_row + tl.arange(0, HEAD), _normalise(e, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty))
        yt = _normalise(et, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty)
        tl.store(y_row + tail, yt, mask=(tail // ALIGN) < V // ALIGN)
        row += step
        if PREFETCH:
            x, xt = nx, nxt
        else:
            x, xt = _load_row(X, row, B, stride_x, HEAD, TAIL, ALIGN, V)


def persist(x: torch.Tensor, out: torch.Tensor, programs: int, prefetch: bool, num_warps: int = 1) -> torch.Tensor:
    B, V = x.shape
    head, tail = rows_cut(V, True)
    assert tail > 0, "rows of a power-of-two length are not cut"
    align = vector_align(V, x.stride(0), out.stride(0), x.element_size())
    grid = (min(programs, B),)
    persist_rows_kernel[grid](
        x, out, B, V, x.stride(0), out.stride(0), fixed_point_scale(V),
        HEAD=head, TAIL=tail, ALIGN=align, PREFETCH=prefetch, num_warps=num_warps,
    )  # fmt: skip
    return out


def cpu_bits() -> int:
    """Under the interpreter: the persistent kernel's bits against run_path's rows path."""
    failures = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for B, V, programs in ((5, 40, 2), (7, 600, 3), (3, 1100, 4), (4, 77, 9)):
            x = (torch.randn(B, V) * 4).to(dtype)
            x[0, 3] = float("nan")
            x[min(1, B - 1)].fill_(-float("inf"))
            x[min(1, B - 1), V - 1] = 1.0
            want = run_path(x, "rows", ROWS=1, CUT=True, num_warps=1)
            for prefetch in (False, True):
                got = persist(x, torch.full_like(x, float("nan")), programs, prefetch)
                same = torch.equal(bits(got), bits(want))
                failures += not same
                verdict = "same bits" if same else "DIFFER"
                print(f"{dtype} ({B}, {V}) programs {programs} prefetch {prefetch}: {verdict}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cpu-bits", action="store_true")
    args = parser.parse_args()
    if args.cpu_bits:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--cpu-bits runs the kernels interpreted: set TRITON_INTERPRET=1")
        return 1 if cpu_bits() else 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def variants_of(x, want):
        variants = path_variants(x, want, {"rows x1": ("rows", {**launch_params("rows", x.shape[1], x.dtype)})})
        for per_sm in PER_SM:
            for prefetch in (False, True):
                name = f"persist {per_sm}/SM{' prefetch' if prefetch else ''}"
                y = persist(x, torch.full_like(x, float("nan")), per_sm * sms, prefetch)
                if not torch.equal(bits(y), bits(want)):
                    name += " BITS DIFFER"
                out = torch.empty_like(x)
                variants[name] = lambda x=x, out=out, n=per_sm * sms, p=prefetch: persist(x, out, n, p)
        return variants

    sweep_shapes(SHAPES, args.out / "triton_rows_persist.json", variants_of)
    return 0


if __name__ == "__main__":
    sys.exit(main())
