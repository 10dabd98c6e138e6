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
from triton_rows_sweep import path_variants, sweep_shapes

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

    def variants_of(x, reference):
        runs = {"row": ("row", {}), "split": ("split", {})}
        runs |= {f"split {c}": ("split", {"CHUNK": c}) for c in (1024, 2048, 4096) if c < x.shape[1]}
        return path_variants(x, reference, runs)

    sweep_shapes(SHAPES, args.out / "triton_short_batch_split.json", variants_of)


if __name__ == "__main__":
    main()
