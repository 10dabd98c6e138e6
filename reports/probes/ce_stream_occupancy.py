"""The stream kernels (cross-entropy, softmax backward) at the occupancy their launches ask for.

    python reports/probes/ce_stream_occupancy.py --out DIR [--v 50257]      # on a GPU

The question. The stream launch puts three programs of 8 warps on each SM (rows to 256 KB), which
fit only under 85 registers a thread. With class weights and smoothing, the sm_90 builds of
Triton 3.6 take 111 (bf16) and 128 (float32) registers at V = 65536, and 180 / 206 where rows are
not 16-byte aligned (V = 50257): one or two programs an SM run and the rest wait a wave. The H100
benchmark of 2026-12-07 timed the weighted stream at (4096, 50257) 1.34x / 1.31x slower than the
tree before its whole-tile loops (80 registers then). Does a cap (80: three programs an SM) win
the time back, with tiles of 2048 (136 bytes of spill at 50257, outside the tile loops) or of
1024 (no spill)? (On an H200, runs/h200-2026-12-07c: tiles of 2048 under 80, 1.2-1.4x the
others; rows cut on 16-byte groups ran slower than rows read element by element.) Likewise the
backward's 16-bit stream (rows of 8193-24576 from 64 rows on): two programs of 16 warps an SM,
under 64 registers, where rows not 16-byte aligned take 128.

The second question. Nsight Compute on an H100 (runs/h100-2026-12-07e) found the adopted launch
(2048 x 8 warps, three an SM: 396 rows in flight, 40 MB in bf16, 80 MB in float32) moving about
three reads and a write through DRAM, the re-reads missing L2. Do fewer rows in flight keep
the re-reads in L2, and does that beat the loads in flight they give up? On that H100
(runs/h100-2026-12-07f, event-timed): 4096 x 16 warps, one an SM, uncapped (128 registers, no
spill), 1596 against the dispatch's 1792 us in float32, 1048 against 992 in bf16; two 2048 x 8
programs an SM, the same warps and loads in flight over twice the rows, 1433 / 2175 us; under
64 registers (4096 x 16 two an SM, 8192 x 32 one an SM) the spill reached DRAM and both lost.
This probe's run on that H100 (runs/h100-2026-12-07g, graph clock): no launch led at every
shape, and rows held whole (HELD below) ran 2.5-3.3x the dispatch's time (reports/profiles.md).

The fourth question. Past 65536 weighted, smoothed rows took the split, which the H100
benchmark of 2026-12-07 timed at 0.26 of the floor in bf16 at (4096, 128256) (0.43 in float32),
against the stream's 0.28-0.42 at 50257-65536. Does the stream, whose rows there pass 256 KB
(one program an SM: 132 rows, 34 MB of bf16 in L2), or held_split lead the split? (On an H100,
runs/h100-2026-12-07h: three stream programs an SM led in 16-bit, 1.5x the split, which 16-bit
rows left; float32 tied and kept it. reports/profiles.md.)

Per shape, weighted and smoothed as the benchmark draws it: the dispatch, stream at (BLOCK, warps,
programs an SM, register cap), and the benchmark's torch.compile step, in the graph clock of
probes/triton_rows_sweep.py, as a fraction of the one-read-one-write floor against this GPU's
copy; each variant's bits against the dispatch's, on logits with a NaN row and a row of -inf.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import triton_backward as tb
from kernels.baselines import compiled_softmax_backward
from kernels.triton_dispatch import held_split_chunk
from tests.test_loss_benchmarks import LABEL_SMOOTHING

sys.path.insert(0, str(Path(__file__).parent))
from bwd_held_row import backward_case  # noqa: E402
from ce_weighted import time_against_dispatch  # noqa: E402
from triton_rows_sweep import bits, edge_logits, floor_rows, shapes_main  # noqa: E402

SHAPES = [(4096, V, dt) for V in (50257, 65536) for dt in (torch.bfloat16, torch.float32)]
SHAPES += [(1024, 50257, torch.bfloat16), (16384, 50257, torch.bfloat16)]
# The fourth question: rows past 65536, which took the split (its three meetings).
SHAPES += [(4096, 128256, torch.bfloat16), (4096, 128256, torch.float32), (4096, 262144, torch.bfloat16)]
BACKWARD_SHAPES = [(4096, 24575, torch.bfloat16), (4096, 24576, torch.bfloat16)]
# (BLOCK, warps, programs an SM, register cap or None: uncapped), each named in full. The cap
# replaces the launch's own (the run of 2026-12-07c kept it: its "cap None" rows ran under 80).
# That run also timed rows cut on 16-byte groups, since taken out (reports/profiles.md).
STREAM = {f"stream {b} x {w} warps, {p}/SM, cap {c}": (b, w, p, c) for b, w, p, c in (
    (2048, 8, 3, 80), (1024, 8, 3, 80), (2048, 8, 2, None), (4096, 16, 1, None), (4096, 16, 2, 64),
)}  # fmt: skip
# The third question: rows read once. held_split (warps, register cap or None, most bytes a
# chunk takes), each named in full: at 128 KB a bf16 row to 65536 is one program's (its
# meetings with itself alone), a float32 row of 50257 two programs'. Triton 3.6's sm_90 builds
# at (50257, bf16 / float32): 8 warps uncapped 255 / 244 registers (1516 / 0 bytes spilled),
# one program an SM; 16 warps under 64 two an SM (3460 / 864 bytes spilled).
# Chunks of 16 and 32 KB under 80 registers: three programs an SM. Their sm_90 builds (Triton
# 3.6, at 50257 and 128256, the smoothing sum's columns in 32 bits): float32 64 / 79 registers,
# no spill; bf16 76 registers, no spill / 80 registers, 260-396 bytes spilled.
HELD = {f"held_split {w} x {c}, {k // 1024}K": (w, c, k) for w, c, k in (
    (8, None, 131072), (16, 64, 131072), (8, 128, 65536), (8, 80, 16384), (8, 80, 32768),
)}  # fmt: skip


def measure(N: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    x = edge_logits(N, V, dtype)
    g = torch.Generator(device="cuda").manual_seed(N + V)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    w = (torch.rand(V, device="cuda", generator=g) + 0.5).to(dtype)
    o = {"weight": w, "label_smoothing": LABEL_SMOOTHING}
    runs = {
        name: ("stream", {"BLOCK": b, "num_warps": wp, "programs_per_sm": p, "maxnreg": c})
        for name, (b, wp, p, c) in STREAM.items()
    }
    for name, (wp, c, most) in HELD.items():
        chunk = held_split_chunk(V, x.element_size(), most, wp)
        runs[name] = ("held_split", {"CHUNK": chunk, "num_warps": wp, "maxnreg": c})
    return time_against_dispatch(x, t, runs, copy, **o)


# (BLOCK, warps, programs an SM, register cap or None) of the backward's stream.
BACKWARD_STREAM = {f"stream {b} x {w} warps, {p}/SM, cap {c}": (b, w, p, c) for b, w, p, c in (
    (4096, 16, 2, None), (4096, 16, 2, 64), (2048, 16, 2, 64), (2048, 8, 4, 64), (2048, 8, 2, 128),
)}  # fmt: skip


def measure_backward(B: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    dy, y, want, variants, same = backward_case(B, V, dtype)
    for name, (b, w, p, c) in BACKWARD_STREAM.items():
        params = {"BLOCK": b, "num_warps": w, "programs_per_sm": p, "maxnreg": c}
        same[name] = bool(torch.equal(bits(tb.run_path(dy, y, "stream", **params)), bits(want)))
        variants[name] = lambda params=params: tb.run_path(dy, y, "stream", **params)
    compiled_softmax_backward(dy, y)  # compiled before the clock starts
    variants["torch.compile"], same["torch.compile"] = (lambda: compiled_softmax_backward(dy, y)), True
    return floor_rows(variants, same, B, V, dtype, copy, passes=3)


def measure_any(B: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    backward = (B, V, dtype) in BACKWARD_SHAPES
    return (measure_backward if backward else measure)(B, V, dtype, copy)


if __name__ == "__main__":
    sys.exit(shapes_main("ce_stream_occupancy", measure_any, SHAPES + BACKWARD_SHAPES, __doc__))
