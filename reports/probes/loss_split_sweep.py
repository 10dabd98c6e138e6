"""Where the Triton cross-entropy's and softmax backward's time goes at today's vocabularies.

    python reports/probes/loss_split_sweep.py --out DIR     # on a GPU

The question. In the benchmark run the Triton cross-entropy step took 0.21 of copy at (4096,
32000) fp32 (0.39 x torch.compile) and its softmax backward 0.49. Per shape this times, in
device time (CUDA events around each call, L2 flushed, median of ROUNDS):
  - the training step the benchmark times (the custom op forward, loss.backward()),
  - the cross-entropy call with and without its target validation (one host synchronisation),
  - torch.compile's F.cross_entropy step,
and in CUDA graphs (graph_times_us: free of host launch cost) the split path at other CHUNK x
num_warps, each output's bits against the dispatch's (CHUNK changes how a row is cut, never
how it is combined). Writes DIR/loss_split.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from triton_rows_sweep import copy_TBps, graph_times_us

from kernels import ops
from kernels import triton_backward as tb
from kernels import triton_cross_entropy as tce
from kernels.spec import matrix_bytes
from tests.suite.devicetime import device_times_us

SHAPES = [(4096, 32000, torch.float32), (4096, 32000, torch.bfloat16), (4096, 128256, torch.bfloat16)]
SPLITS = [(2048, 4), (4096, 4), (4096, 8), (4096, 16), (8192, 8), (8192, 16), (16384, 16)]
ROUNDS = 30


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


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


def cross_entropy_rows(B, V, dtype, copy) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(B + V)
    x = (torch.randn(B, V, device="cuda", generator=g) * 3).to(dtype).requires_grad_(True)
    t = torch.randint(0, V, (B,), device="cuda", generator=g)
    xd = x.detach()

    def step():
        x.grad = None
        ops.cross_entropy(x, t)[0].backward()

    compiled = torch.compile(lambda x, t: F.cross_entropy(x, t))

    def compiled_step():
        x.grad = None
        compiled(x, t).backward()

    out = []
    events = {
        "step (op + backward)": step,
        "call, validate": lambda: tce.cross_entropy(xd, t),
        "call, no validate": lambda: tce.cross_entropy(xd, t, validate=False),
        "torch.compile step": compiled_step,
    }
    for name, fn in events.items():
        out.append(
            row(
                "cross_entropy",
                B,
                V,
                dtype,
                f"events: {name}",
                statistics.median(device_times_us(fn, rounds=ROUNDS)),
                copy,
                2,
            )
        )
    reference = tce.cross_entropy(xd, t, validate=False).grad.clone()
    variants = {"graph: dispatch": lambda: tce.cross_entropy(xd, t, validate=False)}
    same = {"graph: dispatch": True}
    for chunk, warps in SPLITS:
        name = f"graph: split {chunk}x{warps}"
        params = {"CHUNK": chunk, "num_warps": warps}
        got = tce.run_path(xd, t, "split", params=params, validate=False).grad
        same[name] = bool(torch.equal(bits(got), bits(reference)))
        variants[name] = lambda params=params: tce.run_path(xd, t, "split", params=params, validate=False)
    times = graph_times_us(list(variants.values()))
    for name, ts in zip(variants, times, strict=True):
        out.append(row("cross_entropy", B, V, dtype, name, statistics.median(ts), copy, 2, same[name]))
    return out


def backward_rows(B, V, dtype, copy) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(B + V + 1)
    y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
    dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
    compiled = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype))
    reference = tb.softmax_backward(dy, y)
    variants = {"graph: dispatch": lambda: tb.softmax_backward(dy, y), "graph: torch.compile": lambda: compiled(dy, y)}
    same = {"graph: dispatch": True, "graph: torch.compile": None}
    for chunk, warps in SPLITS:
        name = f"graph: split {chunk}x{warps}"
        params = {"CHUNK": chunk, "num_warps": warps}
        same[name] = bool(torch.equal(bits(tb.run_path(dy, y, "split", **params)), bits(reference)))
        variants[name] = lambda params=params: tb.run_path(dy, y, "split", **params)
    times = graph_times_us(list(variants.values()))
    return [
        row("softmax_backward", B, V, dtype, name, statistics.median(ts), copy, 3, same[name])
        for name, ts in zip(variants, times, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    copy = copy_TBps()
    results = []
    for B, V, dtype in SHAPES:
        results += cross_entropy_rows(B, V, dtype, copy)
        results += backward_rows(B, V, dtype, copy)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loss_split.json").write_text(json.dumps({"copy_TBps": copy, "results": results}, indent=1))
    print(f"copy {copy:.3f} TB/s")
    for r in results:
        print(
            f"{r['op']:17s} {r['dtype']:15s} ({r['B']}, {r['V']}) {r['variant']:34s} {r['us']:9.1f} us "
            f"{r['of_copy']:.3f} of floor{'' if r['bits'] in (True, None) else '  BITS DIFFER'}"
        )


if __name__ == "__main__":
    main()
