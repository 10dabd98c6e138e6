"""Triton's held split (each of a row's programs holds its chunk in shared memory) against the
split path it would replace, which keeps a chunk in registers.

    python reports/probes/triton_held_split.py --out DIR            # on a GPU
    python reports/probes/triton_held_split.py --out DIR --part bits
    python reports/probes/triton_held_split.py --out DIR --part time --v 65536 262144

Parts:
  bits    held_split's output bits against split's at every layout of the suite
          (tests/helpers/inputs.py), float32, bfloat16 and float16, V = 53249, 65537, 131075 and
          262144 (B = 64, and one row of 262144: the short batch's chunks), outputs poisoned with
          NaN first; a NaN row and a row of -inf with one finite entry included.
  bounds  where held_split should begin: against held at bf16 rows of 24577-50257 (B = 1024 ...
          32768), against split at float32 rows of 50257-65536 and at batches of 256-1024.
  fill    rows whose last chunk is nearly empty (V one past a multiple of the chunk): split,
          held_split, and held_split with its chunks balanced (the least tile multiple that
          keeps P: kernels.triton_dispatch.held_block of cdiv(V, P)).
  fp32    float32 rows of the forward benchmark's long shapes (B >= 1024) and a few beside them:
          split as launched and at 4096-element chunks under 64 registers, held_split as
          launched, and fused. The run of 2026-12-06c (H100) found held_split leading split by
          1-5 % where rows are 16-byte aligned (65536, 128256, 262144) and trailing by 1-2 % at
          odd V (50257, 65537, 98305); the benchmark has Triton at 0.933-0.946x fused there.
  time    device time (probes/triton_rows_sweep.py's clock: graph replay, L2 flushed, against a
          copy measured in the same run) of held_split at several chunk x warps x register caps,
          split, fused and the dispatch, at long rows: float32 from 50257, 16-bit from 57345,
          batches 1 ... 8192.

The question (reports/profiles.md, "Where the misses wait"): the split holds 120 registers a
thread at bf16 V = 262144, runs a quarter occupancy and waits at its meetings (0.63-0.69 of
copy on an H200). A chunk in shared memory needs no register per element, so more programs
share an SM; does the row then move at the held path's speed (0.85-1.0 of copy)?
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

# Launch variants: each names its chunk in KB, warps and register cap, so a label stays true when
# the dispatched launch changes. Chunks of 64 KB: two to three programs an SM; 32 KB: up to six.
HELD_SPLIT = {
    "hs 64K 16x64": {"bytes": 65536, "num_warps": 16, "maxnreg": 64},
    "hs 64K 8x80": {"bytes": 65536, "num_warps": 8, "maxnreg": 80},
    "hs 64K 8x128": {"bytes": 65536, "num_warps": 8, "maxnreg": 128},
    "hs 64K 8 uncapped": {"bytes": 65536, "num_warps": 8, "maxnreg": None},
    "hs 64K 8x64": {"bytes": 65536, "num_warps": 8, "maxnreg": 64},
    "hs 32K 8x64": {"bytes": 32768, "num_warps": 8, "maxnreg": 64},
    "hs 32K 4x128": {"bytes": 32768, "num_warps": 4, "maxnreg": 128},
    "hs 96K 16x64": {"bytes": 98304, "num_warps": 16, "maxnreg": 64},
    "hs dispatched": {},
}
SHAPES = [
    (B, V, dt)
    for dt in (torch.bfloat16, torch.float32)
    for B, V in ((4096, 65536), (4096, 128256), (4096, 262144), (1024, 262144), (1024, 128256), (8192, 50257),
                 (4096, 57345), (64, 262144), (1, 1000000))
    if not (dt == torch.bfloat16 and V == 50257)
]  # fmt: skip


BOUNDS = [
    *((B, 50257, torch.bfloat16) for B in (1024, 4096, 8192, 32768)),
    *((4096, V, torch.bfloat16) for V in (24577, 32769, 40961, 45057)),
    (1024, 40961, torch.bfloat16),
    *((B, V, torch.bfloat16) for B in (256, 512) for V in (65537, 262144)),
    *((4096, V, torch.float32) for V in (50257, 57345, 61441, 65536)),
    (1024, 65536, torch.float32),
    *((B, 262144, torch.float32) for B in (256, 512, 1024)),
]


def bounds_variants(x, reference):
    B, V = x.shape
    runs = {"split": ("split", {}), "held_split": ("held_split", {})}
    if x.dtype != torch.float32 and V <= 53248:
        runs["held"] = ("held", {})
    return path_variants(x, reference, runs)


FILL = [(4096, V, dt) for dt in (torch.float32, torch.bfloat16) for V in (50257, 65537, 81921, 98305, 151936, 200064)]


def fill_variants(x, reference):
    from kernels.triton_dispatch import held_block, launch_params

    B, V = x.shape
    es = x.element_size()
    p = launch_params("held_split", V, x.dtype)
    P = -(-V // p["CHUNK"])
    balanced = held_block(-(-V // P), 16 // es * 32 * p["num_warps"], es)
    runs = {"split": ("split", {}), "held_split": ("held_split", {})}
    runs[f"held_split balanced {balanced}"] = ("held_split", {"CHUNK": balanced})
    return path_variants(x, reference, runs)


FP32 = [(4096, V, torch.float32) for V in (50257, 65536, 128256, 128257, 151936, 200064, 262144)]
FP32 += [(32768, 50257, torch.float32), (1024, 128256, torch.float32), (1024, 262144, torch.float32)]


def fp32_variants(x, reference):
    fused = SOFTMAX_KERNELS["fused"]
    runs = {
        "split 8192x4 cap 96": ("split", {"CHUNK": 8192, "num_warps": 4, "maxnreg": 96}),
        "split 4096x4 cap 64": ("split", {"CHUNK": 4096, "num_warps": 4, "maxnreg": 64}),
        "held_split as launched": ("held_split", {}),
    }
    return {"fused": lambda: fused(x), **path_variants(x, reference, runs)}


def check_bits() -> bool:
    ok = True
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for B, V in ((64, 53249), (64, 65537), (64, 131075), (64, 262144), (1, 262144)):
            for layout in layouts(dtype) if B > 1 else ("contiguous",):
                x = with_edge_rows(logits(B, V, seed=V, dtype=dtype, device="cuda", layout=layout))
                same = paths_agree(x, "held_split", "split")
                ok &= same
                print(f"bits {str(dtype):15s} ({B}, {V}) {layout:12s} held_split == split: {same}", flush=True)
    return ok


def variants(x, reference):
    fused = SOFTMAX_KERNELS["fused"]
    es = x.element_size()
    runs = {"split": ("split", {})}
    for name, p in HELD_SPLIT.items():
        q = {k: v for k, v in p.items() if k != "bytes"}
        if "bytes" in p:
            q["CHUNK"] = p["bytes"] // es
        runs[name] = ("held_split", q)
    return {"fused": lambda: fused(x), **path_variants(x, reference, runs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part", nargs="+", default=["bits", "bounds", "fill", "time"])
    parser.add_argument("--v", type=int, nargs="+", help="time the shapes of these V only")
    args = parser.parse_args()
    if "bits" in args.part:
        print("held_split bits equal split's everywhere:", check_bits(), flush=True)
    if "bounds" in args.part:
        sweep_shapes(BOUNDS, args.out / "triton_held_split_bounds.json", bounds_variants)
    if "fill" in args.part:
        sweep_shapes(FILL, args.out / "triton_held_split_fill.json", fill_variants)
    if "fp32" in args.part:
        sweep_shapes(FP32, args.out / "triton_held_split_fp32.json", fp32_variants)
    if "time" in args.part:
        shapes = [s for s in SHAPES if not args.v or s[1] in args.v]
        sweep_shapes(shapes, args.out / "triton_held_split.json", variants)


if __name__ == "__main__":
    main()
