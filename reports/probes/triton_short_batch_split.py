"""Should a short batch of rows up to row_max_v split its rows, as longer rows do?

    python reports/probes/triton_short_batch_split.py --out DIR                  # on a GPU
    python reports/probes/triton_short_batch_split.py --out DIR --lengths 20480 24576 --batches 1 8 64
    python reports/probes/triton_short_batch_split.py --out DIR --per-call      # host side too

The question. The dispatch sent rows of tile_max_v < V <= row_max_v to the row path at any B:
one program holds a row. At B <= 64 that leaves most of the 132 SMs idle, and the benchmark
had Triton at 1.34-1.49x F.softmax at fp32 V = 32000 (row: 10.5 us at B = 1) against 2.4-2.5x at
V = 50257, where the split path spreads a short batch over the GPU (7.8 us at B = 1). Per
(dtype, B, V): F.softmax, the dispatch, the row path and the split path at its own launch
parameters (the chunks shrink for a short batch) and at CHUNK 1024, 2048 and 4096, timed as
probes/triton_rows_sweep.py times (CUDA graphs of L2 flush + call less the flushes alone),
every output's bits against the dispatch's. Writes DIR/triton_short_batch_split.json.

--per-call times what a caller pays instead: back-to-back calls from Python, one synchronize a
round, rounds interleaved (tests/suite/devicetime.py), for F.softmax, the dispatch, and the row
and split paths through run_path; writes DIR/triton_short_batch_per_call.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from triton_rows_sweep import baseline_variants, edge_logits, path_variants, sweep_shapes

from kernels.softmax_triton import run_path
from tests.suite.devicetime import interleaved_per_call_times_us

LENGTHS = (4096, 8192, 16384, 32000, 32768)
BATCHES = (1, 8, 64, 256)


def per_call(shapes, path: Path) -> None:
    results = []
    for B, V, dtype in shapes:
        x = edge_logits(B, V, dtype)
        fns = baseline_variants(x) | {p: (lambda p=p, x=x: run_path(x, p)) for p in ("row", "split")}
        times = interleaved_per_call_times_us(list(fns.values()))
        medians = {name: statistics.median(t) for name, t in zip(fns, times, strict=True)}
        for name, us in medians.items():
            results.append({"B": B, "V": V, "dtype": str(dtype), "variant": name, "per_call_us": us})
            print(f"{str(dtype):15s} ({B}, {V}) {name:22s} {us:7.2f} us a call, {medians['F.softmax'] / us:.2f}x F")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": results}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    parser.add_argument("--per-call", action="store_true")
    args = parser.parse_args()
    shapes = [(B, V, d) for d in (torch.float32, torch.bfloat16) for V in args.lengths for B in args.batches]
    if args.per_call:
        per_call(shapes, args.out / "triton_short_batch_per_call.json")
        return

    def variants_of(x, reference):
        runs = {"row": ("row", {}), "split": ("split", {})}
        runs |= {f"split {c}": ("split", {"CHUNK": c}) for c in (1024, 2048, 4096) if c < x.shape[1]}
        return path_variants(x, reference, runs)

    sweep_shapes(shapes, args.out / "triton_short_batch_split.json", variants_of)


if __name__ == "__main__":
    main()
