"""The training kernels of earlier trees against this one's, in one process.

    python reports/probes/training_ab.py --packages kernels,kernels_2763148,... [--shapes 4096x128256]   # on a GPU

The question. In run (c) the aligned backward split ran 6-10 % slower than in run (b), and
ptxas_choice.py showed a fresh process does too (the build environment is not the cause).
Each package named (a copy of kernels/ from an earlier commit, beside kernels/, made with
`git archive REV kernels | tar -x --transform s/^kernels/kernels_REV/`) times its dispatched
softmax backward and plain cross-entropy in graph replay (L2 flushed, interleaved rounds), every
output's bits compared with the first package's, and lists the registers and spills the driver
gave each compiled training kernel.
"""

from __future__ import annotations

import argparse
import importlib
import statistics

import torch
from triton_rows_sweep import bits, graph_times_us, training_inputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--packages", required=True)
    parser.add_argument("--shapes", default="4096x128256")
    args = parser.parse_args()
    pkgs = args.packages.split(",")
    mods = {p: (importlib.import_module(f"{p}.triton_backward"), importlib.import_module(f"{p}.triton_cross_entropy"))
            for p in pkgs}  # fmt: skip
    for B, V, dtype, x, t, y, dy in training_inputs(args.shapes):
        calls, outs = [], []
        for p, (tb, tce) in mods.items():
            calls.append((f"bwd {p}", lambda tb=tb, dy=dy, y=y: tb.softmax_backward(dy, y)))
            calls.append((f"ce  {p}", lambda tce=tce, x=x, t=t: tce.cross_entropy(x, t, validate=False)))
        for name, fn in calls:
            out = fn()
            outs.append(bits(out if name.startswith("bwd") else out.grad).clone())
        times = graph_times_us([fn for _, fn in calls])
        for i, ((name, _), ts) in enumerate(zip(calls, times, strict=True)):
            differ = "" if torch.equal(outs[i], outs[i % 2]) else "  BITS DIFFER"
            us, ref = statistics.median(ts), statistics.median(times[i % 2])
            print(f"{str(dtype):15s} ({B}, {V}) {name:28s} {us:9.1f} us {ref / us:.3f}x first{differ}", flush=True)
    for p in pkgs:
        lk = importlib.import_module(f"{p}.triton_loss_kernels")
        for name, fn in lk.JIT_KERNELS.items():
            for caches in getattr(fn, "device_caches", {}).values():
                for k in caches[0].values():
                    k._init_handles()
                    print(f"{p} {name}: {k.metadata.num_warps} warps, {k.n_regs} regs, {4 * k.n_spills} bytes spilled")


if __name__ == "__main__":
    main()
