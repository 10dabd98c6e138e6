"""The softmax backward's held split (split's programs, each holding its chunk of y and of dy in
shared memory) against the dispatched path, split and torch.compile.

    python reports/probes/bwd_held_split.py --out DIR [--v 32000 40960]     # on a GPU

The question (reports/profiles.md, "Where the misses wait"): the backward's split holds 168
registers a thread at bf16 V = 262144, a fifth of an SM's warps, and reached 0.37-0.45 of its
two-read-one-write floor on an H200, where torch.compile's two passes reached 0.60. The forward's
held split took its long rows from 0.81 to 0.96 of copy on an H100 by holding each chunk in
shared memory (no register an element, more programs an SM waiting at their meetings). Does the
backward follow? It did past stream's rows (dispatched since). Below them: at (4096, 32000) on an
H100 the stream path (bf16) reached 0.72 of the floor and reread (float32) 0.85, torch.compile
0.99 / 0.95; do held_split's chunks beat both at 16385-49152?

Per shape: the dispatch, split, held_split at its launch and at other warps, register caps and
chunk sizes, and torch.compile of the backward, in the graph clock of probes/triton_rows_sweep.py,
as a fraction of the floor against this GPU's copy; each variant's bits against the dispatch's
(torch.compile's are its own), on inputs with a NaN in y and an inf in dy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import triton_backward as tb
from kernels.baselines import compiled_softmax_backward
from kernels.triton_dispatch import held_split_chunk

sys.path.insert(0, str(Path(__file__).parent))
from bwd_held_row import backward_case  # noqa: E402
from triton_rows_sweep import bits, floor_rows, shapes_main  # noqa: E402

SHAPES = [
    *((4096, V, dt) for dt in (torch.bfloat16, torch.float32) for V in (65536, 128256, 262144)),
    # the rows stream (16-bit) and reread (float32) take, behind torch.compile at 32000 on an H100
    *((4096, V, dt) for dt in (torch.bfloat16, torch.float32) for V in (16385, 24576, 32000, 40960, 49152)),
    (1024, 262144, torch.bfloat16),
    (4096, 50257, torch.bfloat16),
    (4096, 128256, torch.float16),
]
# (warps, register cap, bytes a tensor's chunk may take): each named in full.
HELD_SPLIT = {
    "held_split 16x64 32K": (16, 64, 32768),
    "held_split 8x96 32K": (8, 96, 32768),
    "held_split 16x64 16K": (16, 64, 16384),
    "held_split 16x64 48K": (16, 64, 49152),
    "held_split 8x80 32K": (8, 80, 32768),
    "held_split 4x128 32K": (4, 128, 32768),
    "held_split 4 uncapped 32K": (4, None, 32768),
    "held_split 8x96 48K": (8, 96, 49152),
    "held_split 8 uncapped 48K": (8, None, 49152),
}


def measure(B: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    dy, y, want, variants, same = backward_case(B, V, dtype)
    runs = {"split": {}}
    for name, (warps, cap, most) in HELD_SPLIT.items():
        chunk = held_split_chunk(V, y.element_size(), most, warps)
        runs[name] = {"CHUNK": chunk, "num_warps": warps, "maxnreg": cap}
    for name, params in runs.items():
        path = "split" if name == "split" else "held_split"
        same[name] = bool(torch.equal(bits(tb.run_path(dy, y, path, **params)), bits(want)))
        variants[name] = lambda path=path, params=params: tb.run_path(dy, y, path, **params)
    compiled_softmax_backward(dy, y)  # compiled before the clock starts
    variants["torch.compile"], same["torch.compile"] = (lambda: compiled_softmax_backward(dy, y)), True
    return floor_rows(variants, same, B, V, dtype, copy, passes=3)


if __name__ == "__main__":
    sys.exit(shapes_main("bwd_held_split", measure, SHAPES, __doc__))
