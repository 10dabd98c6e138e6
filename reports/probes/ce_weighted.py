"""The Triton cross-entropy with class weights and label smoothing: the split it took against
the two paths prepared for it, stream (dispatched since to V = 65536, from this probe's H200
run at 50257, and past it for 16-bit rows: probes/ce_stream_occupancy.py) and held_split
(run_path only).

    python reports/probes/ce_weighted.py --out DIR [--v 50257]      # on a GPU

The question. With class weights and label smoothing the cross-entropy keeps to the split past
the row path's 8192: its programs meet three times (the max and min, then three sums) holding
their chunks in registers, and the benchmark timed it at 0.16-0.26 of its one-read-one-write
floor in bf16 and 0.30-0.43 in float32 at (4096, 50257 / 128256) on an H100, 0.95-1.54x
torch.compile. Two candidates: stream (a few programs an SM walking the rows, each read three
times with the re-reads and the class weights from L2, no meetings), whose rows crowd L2 past
some V; and held_split (the plain rows' path: split's programs with their chunks in shared
memory), which with weights takes chunks of 16 KB to stay under 80 registers. Which leads, at
which launch, and where does each stop leading?

Per shape, the weighted, smoothed case as the benchmark draws it (weights in [0.5, 1.5),
smoothing tests.test_loss_benchmarks.LABEL_SMOOTHING): the dispatch (split), stream at each
(BLOCK, warps, programs an SM), held_split at each (warps, register cap, most bytes a chunk
takes), and the benchmark's torch.compile step (F.cross_entropy's forward and backward), in the
graph clock of probes/triton_rows_sweep.py, as a fraction of the one-read-one-write floor
against this GPU's copy; each variant's loss, lse and gradient bits against the dispatch's, on
logits with a NaN row and a row of -inf with one finite entry. Plain rows at two shapes too,
against their held paths.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import triton_cross_entropy as tce
from kernels.triton_dispatch import held_split_chunk
from tests.test_loss_benchmarks import LABEL_SMOOTHING, cross_entropy_step

sys.path.insert(0, str(Path(__file__).parent))
from ce_held_row import path_variants  # noqa: E402
from triton_rows_sweep import edge_logits, floor_rows, shapes_main  # noqa: E402

WEIGHTED = [
    *((4096, V, dt) for dt in (torch.bfloat16, torch.float32) for V in (16385, 32000, 50257, 65536, 128256)),
    (1024, 50257, torch.bfloat16),
    (16384, 50257, torch.bfloat16),
    (4096, 262144, torch.bfloat16),
]
PLAIN = [(4096, 32000, torch.bfloat16), (4096, 50257, torch.bfloat16)]
SHAPES = [*WEIGHTED, *PLAIN]
# (BLOCK, warps, programs an SM), each named in full.
STREAM = {f"stream {b} x {w} warps, {p}/SM": (b, w, p) for b, w, p in (
    (2048, 8, 1), (2048, 8, 2), (2048, 8, 3), (4096, 8, 1), (4096, 8, 2), (4096, 16, 1), (1024, 4, 4), (1024, 4, 6),
)}  # fmt: skip
# (warps, register cap, most bytes a chunk takes), each named in full.
HELD_SPLIT = {f"held_split {w} x {c}, {k // 1024}K": (w, c, k) for w, c, k in (
    (8, 80, 16384), (8, 96, 16384), (8, 80, 8192), (16, 80, 32768), (8, 128, 32768),
)}  # fmt: skip


def measure(N: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    x = edge_logits(N, V, dtype)
    g = torch.Generator(device="cuda").manual_seed(N + V)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    weighted = (N, V, dtype) in WEIGHTED
    o = {}
    if weighted:
        w = (torch.rand(V, device="cuda", generator=g) + 0.5).to(dtype)
        o = {"weight": w, "label_smoothing": LABEL_SMOOTHING}
    runs = {name: ("stream", {"BLOCK": b, "num_warps": w, "programs_per_sm": p}) for name, (b, w, p) in STREAM.items()}
    for name, (warps, cap, most) in HELD_SPLIT.items():
        chunk = held_split_chunk(V, x.element_size(), most, warps)
        runs[name] = ("held_split", {"CHUNK": chunk, "num_warps": warps, "maxnreg": cap})
    return time_against_dispatch(x, t, runs, copy, **o)


def time_against_dispatch(x, t, runs: dict, copy: float, **options) -> list[dict]:
    """floor_rows of the cross-entropy of logits x and targets t, called with `options`, through
    each of `runs` ({name: (path, launch parameters)}), the dispatch and the benchmark's
    torch.compile step, each variant's bits against the dispatch's."""
    (N, V), dtype = x.shape, x.dtype
    want = tce.cross_entropy(x, t, validate=False, reduction="none", **options)
    plan = tce.plan(N, V, dtype, plain=not options)
    variants = {f"dispatch ({plan})": lambda: tce.cross_entropy(x, t, validate=False, **options)}
    same = {f"dispatch ({plan})": True}
    more_variants, more_same = path_variants(x, t, runs, want, **options)
    variants |= more_variants
    same |= more_same
    step = cross_entropy_step("torch_compile", x.detach().clone().requires_grad_(True), t, **options)
    step()  # compiled before the clock starts
    variants["torch.compile"], same["torch.compile"] = step, True  # the benchmark's step
    return floor_rows(variants, same, N, V, dtype, copy)


if __name__ == "__main__":
    sys.exit(shapes_main("ce_weighted", measure, SHAPES, __doc__))
