"""Should a short batch of rows up to row_max_v split its rows, as longer rows do?

    python reports/probes/triton_short_batch_split.py --out DIR     # on a GPU

The question. The dispatch sends rows of tile_max_v < V <= row_max_v to the row path at any B:
one program holds a row. At B <= 64 that leaves most of the 132 SMs idle, and the benchmark
has Triton at 1.34-1.49x F.softmax at fp32 V = 32000 (row: 10.5 us at B = 1) against 2.4-2.5x at
V = 50257, where the split path spreads a short batch over the GPU (7.8 us at B = 1). Per
(dtype, B, V): F.softmax, the dispatch, the row path and the split path at its own launch
parameters (the chunks shrink for a short batch) and at CHUNK 1024, 2048 and 4096, timed as
probes/triton_rows_sweep.py times (CUDA graphs of L2 flush + call less the flushes alone),
every output's bits against the dispatch's. Writes DIR/triton_short_batch_split.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from triton_rows_sweep import baseline_variants, copy_TBps, path_variants, timed_variants, write_results

from kernels import SOFTMAX_KERNELS

SHAPES = [
    (B, V, dtype)
    for dtype in (torch.float32, torch.bfloat16)
    for V in (4096, 8192, 16384, 32000, 32768)
    for B in (1, 8, 64, 256)
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    copy = copy_TBps()
    triton = SOFTMAX_KERNELS["triton"]
    results = []
    for B, V, dtype in SHAPES:
        x = torch.randn(B, V, device="cuda").mul_(3).to(dtype)
        x[0, 7] = float("nan") if B > 1 else x[0, 7]
        runs = {"row": ("row", {}), "split": ("split", {})}
        runs |= {f"split {c}": ("split", {"CHUNK": c}) for c in (1024, 2048, 4096) if c < V}
        variants = baseline_variants(x)
        variants.update(path_variants(x, triton(x), runs))
        results += timed_variants(variants, B, V, dtype, copy)
        del x, variants
        torch.cuda.empty_cache()
    write_results(args.out / "triton_short_batch_split.json", copy, results)


if __name__ == "__main__":
    main()
