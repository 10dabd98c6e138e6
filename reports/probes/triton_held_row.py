"""Triton's held path (a 16-bit row held whole in shared memory) against the stream path it
replaces, and the float32 split's launch parameters against fused.

    python reports/probes/triton_held_row.py --out DIR            # on a GPU
    python reports/probes/triton_held_row.py --out DIR --part bits

Parts:
  bits    the held path's output bits against the stream path's, every layout of the suite
          (tests/helpers/inputs.py) at V = 16385, 20001, 32768 and 50257, bf16 and fp16, outputs
          poisoned with NaN first; a row of NaN and a row of -inf with one finite entry included.
  held    device time (probes/triton_rows_sweep.py's clock) of held at its launch parameters and
          others, stream, and the dispatch, bf16 and fp16, B = 1024 ... 32768, V = 16385 ... 57344;
          past 32768 also split, and held in a power-of-two buffer (65536: one program an SM)
          against the buffer in parts (kernels.triton_dispatch.held_block: two an SM to 57344).
  split   float32 rows of 50257 ... 200064 at B = 4096 (8192 at 50257): the split's CHUNK x warps x
          register cap against the dispatched one and fused, bits checked against the dispatch.

The question (reports/profiles.md, "16-bit rows held in shared memory"): the probe kernel held
bf16 rows of 32000 at 0.94-0.99 of copy on an H100, the stream path 0.78. Does the product's
kernel (edges, any layout, Triton 3.6 on the GPU) keep that, and where does it cross the row
path below and the stream path above?
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from kernels import SOFTMAX_KERNELS
from tests.helpers.inputs import layouts, logits

sys.path.insert(0, str(Path(__file__).parent))
from triton_rows_sweep import path_variants, paths_agree, sweep_shapes, with_edge_rows  # noqa: E402

# Launch variants over launch_params("held"): each names its warps and register cap in full, so a
# label stays true when the dispatched launch changes.
HELD = {
    "held 8x64": {"num_warps": 8, "maxnreg": 64},
    "held 4x128": {"num_warps": 4, "maxnreg": 128},
    "held 8 uncapped": {"num_warps": 8, "maxnreg": None},
    "held 8x80": {"num_warps": 8, "maxnreg": 80},  # 8 warps, three programs an SM, spills allowed
    "held 16x64": {"num_warps": 16, "maxnreg": 64},
}
HELD_SHAPES = [
    (B, V, dt)
    for dt in (torch.bfloat16, torch.float16)
    for B, V in ((1024, 16385), (4096, 16385), (4096, 20000), (4096, 24577), (4096, 32000), (32768, 32000),
                 (8192, 32768), (1024, 32000), (4096, 40960), (4096, 16384), (4096, 50257), (8192, 50257),
                 (1024, 50257), (4096, 57344))
    if dt == torch.bfloat16 or V in (32000, 16385, 50257)
]  # fmt: skip
SPLIT = {
    "split 8192x4 r96": {"CHUNK": 8192, "num_warps": 4, "maxnreg": 96},
    "split 8192x4 r128": {"CHUNK": 8192, "num_warps": 4, "maxnreg": 128},
    "split 8192x4 r80": {"CHUNK": 8192, "num_warps": 4, "maxnreg": 80},
    "split 4096x4 r64": {"CHUNK": 4096, "num_warps": 4, "maxnreg": 64},
    "split 4096x4 r96": {"CHUNK": 4096, "num_warps": 4, "maxnreg": 96},
    "split 16384x8 r96": {"CHUNK": 16384, "num_warps": 8, "maxnreg": 96},
    "split 16384x8 r128": {"CHUNK": 16384, "num_warps": 8, "maxnreg": 128},
    "split 8192x8 r64": {"CHUNK": 8192, "num_warps": 8, "maxnreg": 64},
}
SPLIT_SHAPES = [(4096, 50257), (8192, 50257), (4096, 128256), (4096, 151936), (4096, 200064)]


def check_bits() -> bool:
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        for V in (16385, 20001, 32768, 50257):
            for layout in layouts(dtype):
                x = with_edge_rows(logits(64, V, seed=V, dtype=dtype, device="cuda", layout=layout))
                same = paths_agree(x, "held", "stream")
                ok &= same
                print(f"bits {str(dtype):15s} V {V:6d} {layout:12s} held == stream: {same}")
    return ok


def held_variants(x, reference):
    B, V = x.shape
    runs = {"stream": ("stream", {})} if V <= 65536 else {}
    if V > 32768:  # the split path's rows, and the held buffer in its parts against a power of two
        runs["split"] = ("split", {})
        runs["held 65536x16x64"] = ("held", {"BLOCK": 65536, "num_warps": 16, "maxnreg": 64})
    runs |= {name: ("held", params) for name, params in HELD.items()}
    if (B, V) == (4096, 16384):
        runs["row"] = ("row", {})
    return path_variants(x, reference, runs)


def split_variants(x, reference):
    fused = SOFTMAX_KERNELS["fused"]
    return {"fused": lambda: fused(x), **path_variants(x, reference, {n: ("split", p) for n, p in SPLIT.items()})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part", nargs="+", default=["bits", "held", "split"])
    parser.add_argument("--v", type=int, nargs="+", help="the held part's shapes of these V only")
    args = parser.parse_args()
    if "bits" in args.part:
        print("held bits equal stream's everywhere:", check_bits())
    if "held" in args.part:
        shapes = [shape for shape in HELD_SHAPES if not args.v or shape[1] in args.v]
        sweep_shapes(shapes, args.out / "triton_held_row.json", held_variants)
    if "split" in args.part:
        split_shapes = [(B, V, torch.float32) for B, V in SPLIT_SHAPES]
        sweep_shapes(split_shapes, args.out / "triton_split_fp32.json", split_variants)


if __name__ == "__main__":
    main()
