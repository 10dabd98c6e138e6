"""Where the Triton cross-entropy's and softmax backward's time goes at today's vocabularies.

    python reports/probes/loss_split_sweep.py --out DIR [--shapes 4096x32000,...] [--dtypes fp32,bf16]
        [--ops ce,bwd] [--splits 4096x4,4096x8x128] [--streams 2048x8x2,...] [--rereads 4096x32,...]
        [--no-compile] [--weighted-smoothed]   # on a GPU

The question. In the benchmark run the Triton cross-entropy step took 0.21 of its floor at
(4096, 32000) fp32 (0.39 x torch.compile) and its softmax backward 0.49. Per shape this times, in
device time (CUDA events around each call, L2 flushed, median of ROUNDS):
  - the cross-entropy training step the benchmark times (the custom op's forward, then
    loss.backward()), and torch.compile's F.cross_entropy step compiled for the shape (unless
    --no-compile),
  - the cross-entropy call with and without its target validation (one host synchronisation),
and in CUDA graphs (graph_times_us: free of host launch cost) the dispatch, the row path where a
row fits it (V <= 32768, at launch_params("row")) and the split path at CHUNK x num_warps, each
output's bits against the dispatch's (the path and CHUNK change how a row is cut, never how it
is combined), the backward's stream path at BLOCK x num_warps x programs_per_sm (--streams) and
its reread path at TILE x num_warps (--rereads); the backward's variants also in device time.
--weighted-smoothed times the cross-entropy with class weights and label smoothing 0.1 (its
calls and graphs; no training step). Prints the registers and spills of the row and split
kernels as this GPU's Triton built them. Writes DIR/loss_split.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from triton_rows_sweep import bits, copy_TBps, graph_times_us

from kernels import ops
from kernels import triton_backward as tb
from kernels import triton_cross_entropy as tce
from kernels.baselines import static_compile
from kernels.spec import matrix_bytes
from kernels.triton_loss_kernels import JIT_KERNELS
from tests.suite.devicetime import device_times_us

SHAPES = "4096x32000,4096x128256"
SPLITS = "2048x4,4096x4,4096x8,4096x16,8192x8,8192x16,16384x16"
STREAMS = "1024x4x4,2048x8x2,4096x16x1"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ROUNDS = 30


def pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(n) for n in item.split("x")) for item in text.split(",") if item]


def split_params(item: tuple) -> dict:
    """A --splits item, CHUNK x num_warps [x maxnreg], as the split path's launch parameters."""
    chunk, warps, *cap = item
    return {"CHUNK": chunk, "num_warps": warps, **({"maxnreg": cap[0]} if cap else {})}


def row(op, B, V, dtype, variant, us, copy, passes, same=True):
    of_copy = matrix_bytes(B, V, str(dtype).removeprefix("torch."), passes=passes) / (us * 1e-6) / 1e12 / copy
    return {
        "op": op,
        "B": B,
        "V": V,
        "dtype": str(dtype),
        "variant": variant,
        "us": us,
        "of_copy": of_copy,
        "bits": same,
    }


def cross_entropy_rows(B, V, dtype, copy, splits, compile_step, weighted_smoothed=False) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(B + V)
    x = (torch.randn(B, V, device="cuda", generator=g) * 3).to(dtype).requires_grad_(True)
    t = torch.randint(0, V, (B,), device="cuda", generator=g)
    xd = x.detach()
    o = {}
    if weighted_smoothed:
        o = {"weight": (0.5 + torch.rand(V, device="cuda", generator=g)).to(dtype), "label_smoothing": 0.1}

    def step():
        x.grad = None
        ops.cross_entropy(x, t)[0].backward()

    events = {
        "step (op + backward)": step,
        "call, validate": lambda: tce.cross_entropy(xd, t, **o),
        "call, no validate": lambda: tce.cross_entropy(xd, t, validate=False, **o),
    }
    if weighted_smoothed:
        del events["step (op + backward)"]
    elif compile_step:
        compiled = static_compile(lambda x, t: F.cross_entropy(x, t))

        def compiled_step():
            x.grad = None
            compiled(x, t).backward()

        events["torch.compile step"] = compiled_step
    out = []
    for name, fn in events.items():
        us = statistics.median(device_times_us(fn, rounds=ROUNDS))
        out.append(row("cross_entropy", B, V, dtype, f"events: {name}", us, copy, 2))
    reference = tce.cross_entropy(xd, t, validate=False, **o).grad.clone()
    plan = tce.plan(B, V, dtype, plain=not o)
    variants = {f"graph: dispatch ({plan})": lambda: tce.cross_entropy(xd, t, validate=False, **o)}
    runs = [("split", split_params(item)) for item in splits]
    if V <= tce.DISPATCH_BOUNDARIES["plain_row_max_v"]:
        runs.insert(0, ("row", tb.launch_params("row", V, dtype, op="cross_entropy")))
    same = {name: True for name in variants}
    for path, params in runs:
        name = f"graph: {path} " + "x".join(str(v) for v in params.values())
        got = tce.run_path(xd, t, path, params=params, validate=False, **o).grad
        same[name] = bool(torch.equal(bits(got), bits(reference)))
        variants[name] = lambda path=path, params=params: tce.run_path(xd, t, path, params=params, validate=False, **o)
    times = graph_times_us(list(variants.values()))
    for name, ts in zip(variants, times, strict=True):
        out.append(row("cross_entropy", B, V, dtype, name, statistics.median(ts), copy, 2, same[name]))
    return out


def backward_rows(B, V, dtype, copy, splits, compile_step, streams=(), rereads=()) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(B + V + 1)
    y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
    dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
    reference = tb.softmax_backward(dy, y)
    variants = {f"graph: dispatch ({tb.plan(B, V, dtype)})": lambda: tb.softmax_backward(dy, y)}
    same = {name: True for name in variants}
    if compile_step:
        compiled = static_compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype))
        variants["graph: torch.compile"], same["graph: torch.compile"] = (lambda: compiled(dy, y)), None
    for item in splits:
        name = "graph: split " + "x".join(map(str, item))
        params = split_params(item)
        same[name] = bool(torch.equal(bits(tb.run_path(dy, y, "split", **params)), bits(reference)))
        variants[name] = lambda params=params: tb.run_path(dy, y, "split", **params)
    for block, warps, per_sm in streams:
        name = f"graph: stream {block}x{warps}x{per_sm}"
        params = {"BLOCK": block, "num_warps": warps, "programs_per_sm": per_sm}
        same[name] = bool(torch.equal(bits(tb.run_path(dy, y, "stream", **params)), bits(reference)))
        variants[name] = lambda params=params: tb.run_path(dy, y, "stream", **params)
    for tile, warps in rereads:
        name = f"graph: reread {tile}x{warps}"
        params = {"TILE": tile, "num_warps": warps}
        same[name] = bool(torch.equal(bits(tb.run_path(dy, y, "reread", **params)), bits(reference)))
        variants[name] = lambda params=params: tb.run_path(dy, y, "reread", **params)
    times = graph_times_us(list(variants.values()))
    out = [
        row("softmax_backward", B, V, dtype, name, statistics.median(ts), copy, 3, same[name])
        for name, ts in zip(variants, times, strict=True)
    ]
    # The same calls in the benchmark's clock (CUDA events around each, L2 flushed).
    for name, fn in variants.items():
        us = statistics.median(device_times_us(fn, rounds=ROUNDS))
        out.append(row("softmax_backward", B, V, dtype, name.replace("graph:", "events:"), us, copy, 3, same[name]))
    return out


def built_kernels() -> list[str]:
    """Registers and spills of every training kernel this process compiled (Triton's cache)."""
    lines = []
    for name, fn in JIT_KERNELS.items():
        for caches in getattr(fn, "device_caches", {}).values():
            for kernel in caches[0].values():
                kernel._init_handles()
                warps = kernel.metadata.num_warps
                lines.append(f"{name}: {warps} warps, {kernel.n_regs} regs, {kernel.n_spills} spills")
    return sorted(set(lines))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--ops", default="ce,bwd")
    parser.add_argument("--splits", default=SPLITS)
    parser.add_argument("--streams", default=STREAMS)
    parser.add_argument("--rereads", default="")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--weighted-smoothed", action="store_true")
    args = parser.parse_args()
    copy = copy_TBps()
    splits, todo = pairs(args.splits), args.ops.split(",")
    results = []
    for B, V in pairs(args.shapes):
        for dtype in (DTYPES[d] for d in args.dtypes.split(",")):
            if "ce" in todo:
                results += cross_entropy_rows(B, V, dtype, copy, splits, not args.no_compile, args.weighted_smoothed)
            if "bwd" in todo:
                results += backward_rows(
                    B, V, dtype, copy, splits, not args.no_compile, pairs(args.streams), pairs(args.rereads)
                )
    args.out.mkdir(parents=True, exist_ok=True)
    built = built_kernels()
    record = {"copy_TBps": copy, "results": results, "built": built}
    (args.out / "loss_split.json").write_text(json.dumps(record, indent=1))
    print(f"copy {copy:.3f} TB/s")
    print("\n".join(built))
    for r in results:
        print(
            f"{r['op']:17s} {r['dtype']:15s} ({r['B']}, {r['V']}) {r['variant']:34s} {r['us']:9.1f} us "
            f"{r['of_copy']:.3f} of floor{'' if r['bits'] in (True, None) else '  BITS DIFFER'}"
        )


if __name__ == "__main__":
    main()
