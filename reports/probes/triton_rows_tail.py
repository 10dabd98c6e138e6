"""The Triton rows path with a row cut into a power-of-two head and a short tail.

    python reports/probes/triton_rows_tail.py --out DIR     # on a GPU

The question. The rows path gives a row of V = 600 one warp over BLOCK_V = 1024 lanes: 41 % of
the lanes are masked, and their exponentials, fixed-point terms and roundings are issued all
the same. Its counters at (32768, 600) bf16 (reports/profiles.md): 68 % of issue slots busy at
49 % of DRAM, so the instruction count holds it. The variant loads the row as a head of HEAD
lanes (the largest power of two <= V, no mask) and a tail of TAIL lanes (the next power of two
>= V - HEAD), 640 lanes at V = 600. The max and the fixed-point sum of the two parts are
combined exactly (a NaN-propagating max, an integer sum), and each output is the kernel's own
expression of its element, so every output must keep the dispatch's bits, which the probe checks.

Per (dtype, B, V): F.softmax, the dispatch and the variant at 1 and 2 warps, timed as
probes/triton_rows_sweep.py times (CUDA graphs of L2 flush + call less the flushes alone, median
of its ROUNDS), fraction of a copy ceiling measured in the same run. Writes DIR/triton_rows_tail.json
and prints a table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton_rows_sweep import copy_TBps, timed_variants, write_results

from kernels import SOFTMAX_KERNELS
from kernels.softmax_triton import plan
from kernels.triton_dispatch import fixed_point_scale, vector_align
from kernels.triton_kernels import _exp, _fixed, _nan_max, _normalise, _row_max, _softmax_scale

SHAPES = [(B, V, dt) for dt in (torch.bfloat16, torch.float32) for B, V in ((8192, 600), (32768, 600), (32768, 1100))]
WARPS = (1, 2)


@triton.jit
def rows_tail_kernel(X, Y, V, stride_x, stride_y, SCALE, HEAD: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + tl.multiple_of(row * stride_x, ALIGN)
    y_row = Y + tl.multiple_of(row * stride_y, ALIGN)
    head = tl.arange(0, HEAD)
    tail = HEAD + tl.arange(0, TAIL)
    tail_mask = (tail // ALIGN) < V // ALIGN
    xh = tl.load(x_row + head).to(tl.float32)
    xt = tl.load(x_row + tail, mask=tail_mask, other=-float("inf")).to(tl.float32)
    m = _nan_max(_row_max(xh, 0), _row_max(xt, 0))
    eh = _exp(xh, m, Y.dtype.element_ty)
    et = _exp(xt, m, Y.dtype.element_ty)
    neg_hi, inv = _softmax_scale(tl.sum(_fixed(eh, SCALE), axis=0) + tl.sum(_fixed(et, SCALE), axis=0), SCALE, m)
    tl.store(y_row + head, _normalise(eh, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty))
    tl.store(y_row + tail, _normalise(et, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=tail_mask)


def rows_tail(x: torch.Tensor, warps: int, out: torch.Tensor | None = None) -> torch.Tensor:
    B, V = x.shape
    y = torch.empty_like(x) if out is None else out
    head = 1 << (V.bit_length() - 1)
    tail = triton.next_power_of_2(max(V - head, 16))
    align = vector_align(V, x.stride(0), y.stride(0), x.element_size())
    rows_tail_kernel[(B,)](
        x, y, V, x.stride(0), y.stride(0), fixed_point_scale(V), HEAD=head, TAIL=tail, ALIGN=align, num_warps=warps
    )
    return y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    copy = copy_TBps()
    triton_softmax = SOFTMAX_KERNELS["triton"]
    results = []
    for B, V, dtype in SHAPES:
        x = torch.randn(B, V, device="cuda", dtype=torch.float32).mul_(3).to(dtype)
        x[1, 7] = float("nan")  # a NaN row and a row of -inf with one finite entry keep their bits too
        x[2].fill_(-float("inf"))
        x[2, V - 1] = 0.0
        reference = triton_softmax(x)
        as_int = torch.int16 if x.element_size() == 2 else torch.int32
        variants = {
            "F.softmax": lambda x=x: F.softmax(x, -1),
            f"dispatch ({plan(B, V, dtype)})": lambda x=x: triton_softmax(x),
        }
        for warps in WARPS:
            y = torch.full_like(x, float("nan"))
            rows_tail(x, warps, out=y)
            same = bool(torch.equal(y.view(as_int), reference.view(as_int)))
            variants[f"head+tail x{warps}" + ("" if same else " BITS DIFFER")] = lambda x=x, w=warps: rows_tail(x, w)
        results += timed_variants(variants, B, V, dtype, copy)
    write_results(args.out / "triton_rows_tail.json", copy, results)


if __name__ == "__main__":
    main()
