"""The Triton rows path with a row cut into a power-of-two head and a short tail, against
the same kernel over one block of next_power_of_2(V) lanes.

    python reports/probes/triton_rows_tail.py --out DIR     # on a GPU

The question. Over one block, a row of V = 600 takes one warp over BLOCK_V = 1024 lanes: 41 %
of the lanes are masked, and their exponentials, fixed-point terms and roundings are issued all
the same. Its counters at (32768, 600) bf16 (reports/profiles.md): 68 % of issue slots busy at
49 % of DRAM, so the instruction count holds it. Cut (`CUT=True`, what `launch_params("rows")`
now gives from V = 513), the row loads as a head of HEAD lanes (the largest power of two <= V,
no mask) and a tail of TAIL lanes (the next power of two >= V - HEAD), 640 lanes at V = 600.
The max and the fixed-point sum of the two parts are combined exactly (a NaN-propagating max,
an integer sum), so every output must keep the dispatch's bits, which the probe checks.

Per (dtype, B, V): F.softmax, the dispatch and the rows kernel through `run_path`, whole and cut,
at 1 and 2 warps, timed as probes/triton_rows_sweep.py times (CUDA graphs of L2 flush + call
less the flushes alone, median of its ROUNDS), fraction of a copy ceiling measured in the same
run. Writes DIR/triton_rows_tail.json and prints a table. (runs/h200-2026-12-03b/ holds the
first run's JSON, when the cut kernel lived in this probe.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from triton_rows_sweep import rows_variants, sweep_shapes

from kernels.softmax_triton import launch_params

SHAPES = [(B, V, dt) for dt in (torch.bfloat16, torch.float32) for B, V in ((8192, 600), (32768, 600), (32768, 1100))]
WARPS = (1, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    def variants_of(x, reference):
        V, dtype = x.shape[1], x.dtype
        params = {
            f"{'head+tail' if cut else 'whole'} x{warps}": {
                **launch_params("rows", V, dtype),
                "CUT": cut,
                "num_warps": warps,
            }
            for cut in (False, True)
            for warps in WARPS
        }
        return rows_variants(x, reference, params)

    sweep_shapes(SHAPES, args.out / "triton_rows_tail.json", variants_of)


if __name__ == "__main__":
    main()
