"""What a remembered Triton softmax costs the host, path by path.

    python reports/probes/triton_host_cost.py --out DIR      # on a GPU

The question. Per call from Python, the dispatch took 14-19 us at decode shapes where its kernel
takes 6 (and F.softmax's whole call 11-13), and 16-bit calls cost about 5 us more than float32
ones of the same path. Per (dtype, B, V): which path the dispatch takes, whether its remembered
launch goes through the driver (kernels.launch.KernelLauncher) or back through Triton's own
launcher each call (and what in the compiled kernel's metadata sent it there), and the host's
enqueue cost: N calls back to back with no synchronize inside the timing (the GPU's queue holds
them), for F.softmax, an empty torch op and the dispatch; then a cProfile of the dispatch's calls.
Writes DIR/triton_host_cost.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import softmax_triton
from kernels import triton_launch as launch

SHAPES = [(1, 600), (1, 4096), (1, 16384), (1, 32000), (64, 32000), (1, 50257), (1024, 32000)]
CALLS = 400
REPEATS = 7

_META = ("num_ctas", "num_warps", "shared", "global_scratch_size", "profile_scratch_size")
_FLAGS = ("launch_cooperative_grid", "launch_pdl")


def enqueue_us(fn) -> float:
    """Median over REPEATS of the host's time per call for CALLS calls, synchronized outside."""
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def launcher_report(x: torch.Tensor, path: str) -> dict:
    """Whether this path's launch for x has a driver launcher, and the compiled metadata."""
    y = torch.empty_like(x)
    bound = launch.bind(x, y, path, {})
    compiled = bound()
    md = getattr(compiled, "metadata", None)
    meta = {k: getattr(md, k, None) for k in _META + _FLAGS}
    meta["driver_launcher"] = (
        launch._driver_launcher(compiled, bound.path.kernel.__name__, bound.path.arg_kinds) is not None
    )
    return meta


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for B, V in SHAPES:
            x = torch.randn(B, V, device="cuda").to(dtype)
            path = softmax_triton.plan(B, V, dtype)
            for _ in range(3):
                softmax_triton.softmax(x)
            row = {"B": B, "V": V, "dtype": str(dtype), "path": path, **launcher_report(x, path)}
            row["F.softmax_us"] = enqueue_us(lambda x=x: F.softmax(x, dim=-1))
            row["empty_like_us"] = enqueue_us(lambda x=x: torch.empty_like(x))
            row["dispatch_us"] = enqueue_us(lambda x=x: softmax_triton.softmax(x))
            results.append(row)
            print(json.dumps(row))
    # Where the dispatch's host time goes, at two decode shapes.
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 32000, device="cuda").to(dtype)
        softmax_triton.softmax(x)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(CALLS):
            softmax_triton.softmax(x)
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
        print(f"--- cProfile, {CALLS} calls of softmax((1, 32000) {dtype})\n{text.getvalue()}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "triton_host_cost.json").write_text(json.dumps({"results": results}, indent=1))


if __name__ == "__main__":
    main()
