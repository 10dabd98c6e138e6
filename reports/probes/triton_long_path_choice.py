"""Which path 16-bit rows of 32000-65536 should take, now that the split kernel's exponential is
one flush-to-zero ex2.

    python reports/probes/triton_long_path_choice.py --out DIR     # on a GPU

The question. The dispatch sends 16-bit rows of row_max_v < V <= stream_max_v to the stream
path from stream_min_b rows on, and 16-bit rows up to row_max_v to the row path, after sweeps
made when the split kernel computed its exponentials with tl.exp (three more instructions an
element). With one ex2 the split gained 17-22 % at V >= 128256 in bf16 and the stream path
4-5 % (reports/history.md). Per (dtype, B, V): F.softmax, the dispatch and each path that can
take the shape through `run_path` at its own launch parameters, timed as
probes/triton_rows_sweep.py times (CUDA graphs of L2 flush + call less the flushes alone,
median of its ROUNDS), fraction of a copy ceiling measured in the same run, every output's bits
against the dispatch's (every path gives a row the same bits). Writes
DIR/triton_long_path_choice.json and prints a table. (runs/h200-2026-12-03d/ holds the run that
set the stream path's bounds.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from triton_rows_sweep import path_variants, sweep_shapes

SHAPES = [
    (B, V, torch.bfloat16) for V in (16384, 32000, 32769, 50257, 65536) for B in (1024, 4096, 32768) if B * V <= 2**31
] + [(4096, 50257, torch.float16), (4096, 32000, torch.float16)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    def variants_of(x, reference):
        paths = ["split", "stream"] + (["row"] if x.shape[1] <= 32768 else [])
        return path_variants(x, reference, {path: (path, {}) for path in paths})

    sweep_shapes(SHAPES, args.out / "triton_long_path_choice.json", variants_of)


if __name__ == "__main__":
    main()
