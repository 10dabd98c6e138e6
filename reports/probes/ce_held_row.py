"""The Triton cross-entropy's held path (a 16-bit plain row held whole in shared memory) against
the row path it replaces (the row in registers, one program an SM).

    python reports/probes/ce_held_row.py --out DIR      # on a GPU

Per shape (bf16; fp16 at one shape): the cross-entropy call without validation through row (split
past 32768: the paths held would replace), held
at 16 warps under a cap of 64 registers and at 8 warps uncapped, and the dispatch, in the graph clock of
probes/triton_rows_sweep.py (L2 flushed, free of host launch cost), as a fraction of the
one-read-one-write floor against this GPU's copy; each variant's loss, lse and gradient bits
against that path's, on logits with a NaN row and a row of -inf with one finite entry. Past 32768
the held buffer is in parts (kernels.triton_dispatch.held_block), two programs an SM to 57344.

The question: the softmax's held kernel took bf16 rows of 32000 from 0.78 to 0.96 of copy on an
H100 (reports/profiles.md). The cross-entropy's row kernel at (4096, 32000) bf16 ran at 0.44 of
its floor on an H200. Does holding the row in shared memory give the cross-entropy the same, and
below which V does the row path stay ahead (the held path's lower bound)? And past the rows held
whole (V > 57344, the split's), does held_split (each split program's chunk in shared memory,
not dispatched) do for the cross-entropy what it did for the softmax (0.81 -> 0.96 of copy at
bf16 (4096, 262144) on an H100)? `--v 57345 65537 128256 262144` times those shapes only. Since
held_split took the plain rows past 40960 (bf16 50257: 0.79 of the floor in the benchmark, device
time), do smaller chunks at fewer warps, more programs an SM, lift it?
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import triton_backward as tb
from kernels import triton_cross_entropy as tce
from kernels.triton_dispatch import held_longest_row, held_split_chunk

sys.path.insert(0, str(Path(__file__).parent))
from triton_rows_sweep import bits, edge_logits, floor_rows, shapes_main  # noqa: E402

SHAPES = [
    *((4096, V, torch.bfloat16) for V in (16385, 20001, 24577, 28000, 32000, 32768, 40961, 50257, 57344)),
    *((N, V, torch.bfloat16) for N in (64, 1024, 16384) for V in (32000, 50257)),
    (4096, 32000, torch.float16),
    # past the held rows: split against held_split (each program's chunk held)
    *((4096, V, torch.bfloat16) for V in (57345, 65537, 128256, 262144)),
    (1024, 262144, torch.bfloat16),
    (64, 262144, torch.bfloat16),
    (16384, 128256, torch.bfloat16),
    *((4096, V, torch.float32) for V in (65537, 128256, 262144)),
    (4096, 128256, torch.float16),
]
# Each names its launch in full, so that a label stays true when the dispatched launch changes.
HELD_VARIANTS = {
    "held 16 warps cap 64": {"num_warps": 16, "maxnreg": 64},
    "held 8 warps uncapped": {"num_warps": 8, "maxnreg": None},
    "held 8 warps cap 80": {"num_warps": 8, "maxnreg": 80},
}
HELD_SPLIT_VARIANTS = {  # the launch's chunks (balanced, at most 64 KB) at these warps and caps
    "held_split 8 warps cap 80": {"num_warps": 8, "maxnreg": 80},
    "held_split 8 warps cap 128": {"num_warps": 8, "maxnreg": 128},
    "held_split 8 warps uncapped": {"num_warps": 8, "maxnreg": None},
}
# Smaller chunks, more programs an SM (registers allow four of 8 warps uncapped, eight of 4):
# (warps, the most bytes a chunk takes), uncapped.
HELD_SPLIT_CHUNKS = {
    "held_split 8 warps uncapped 32K": (8, 32768),
    "held_split 4 warps uncapped 32K": (4, 32768),
    "held_split 4 warps uncapped 16K": (4, 16384),
}


def path_variants(x, t, runs: dict, want, **options) -> tuple[dict, dict]:
    """({name: call}, {name: whether its loss, lse and gradient bits are `want`'s}) for each
    named (path, launch parameters) of `runs`, the cross-entropy called with `options`."""
    variants, same = {}, {}
    for name, (path, params) in runs.items():
        got = tce.run_path(x, t, path, params=params, validate=False, reduction="none", **options)
        same[name] = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want, strict=True))
        variants[name] = lambda p=path, q=params: tce.run_path(x, t, p, params=q, validate=False, **options)
    return variants, same


def measure(N: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    x = edge_logits(N, V, dtype)
    t = torch.randint(0, V, (N,), device="cuda")
    other = "row" if V <= 32768 else "split"  # the path held would replace
    runs = {other: (other, tb.launch_params(other, V, dtype, op="cross_entropy", plain=True))}
    if V <= held_longest_row(x.element_size()):
        runs |= {name: ("held", params) for name, params in HELD_VARIANTS.items()}
    if V > 32768:
        runs |= {name: ("held_split", params) for name, params in HELD_SPLIT_VARIANTS.items()}
        for name, (warps, most) in HELD_SPLIT_CHUNKS.items():
            chunk = held_split_chunk(V, x.element_size(), most, warps)
            runs[name] = ("held_split", {"CHUNK": chunk, "num_warps": warps, "maxnreg": None})
    want = tce.run_path(x, t, other, validate=False, reduction="none")
    variants, same = path_variants(x, t, runs, want)
    plan = tce.plan(N, V, dtype)
    variants[f"dispatch ({plan})"] = lambda: tce.cross_entropy(x, t, validate=False)
    same[f"dispatch ({plan})"] = all(
        torch.equal(bits(a), bits(b))
        for a, b in zip(tce.cross_entropy(x, t, validate=False, reduction="none"), want, strict=True)
    )
    return floor_rows(variants, same, N, V, dtype, copy)


if __name__ == "__main__":
    sys.exit(shapes_main("ce_held_row", measure, SHAPES, __doc__))
