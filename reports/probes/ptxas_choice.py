"""What builds the Triton kernels in a process that has run torch.compile, and what it costs them.

    python reports/probes/ptxas_choice.py --out DIR [--shapes 4096x128256,4096x50257]   # on a GPU

The question. Under xdist, the suite's GPU spill check found kernels compiled with other
registers and spills than the same kernels in a fresh process (16-bit weighted, smoothed
splits: 168 registers and 16 bytes spilled, against 204-206 and none; reports/profiles.md, "The
training splits cut odd rows on 16-byte groups"). A likely cause: Inductor can point Triton at
PyTorch's own ptxas (TRITON_PTXAS_PATH, where the wheel ships one) for the rest of the process.
And in run (c) the aligned backward split ran 6-10 % slower than in run (b), with a build that
matches run (b)'s in a fresh process; the benchmark process runs torch.compile too. Does a
torch.compile before them move the kernels' builds and time, and is it the ptxas?

The answer (run (d), runs/h200-2026-12-04d/ptxas_choice.log): no. After a torch.compile,
TRITON_PTXAS_PATH points at torch/bin/ptxas, and every kernel builds with the same registers
and spills, runs within 0.4 % of the fresh process's time and gives the same bits. The 6-10 %
was the place of the split's launch-tag read (probes/training_ab.py).

Each variant runs in a child process with a Triton cache directory of its own: "fresh";
"after torch.compile" (a compiled F.cross_entropy step runs first; the child reports the TRITON_*
variables it then finds changed); "pytorch's ptxas" (TRITON_PTXAS_PATH set to it, where this
PyTorch has one). Each builds the training kernels and the forward's split at each shape, times
the dispatched calls in graph replay (L2 flushed, interleaved rounds) and reports the registers
and spills the driver gives each compiled kernel; every output's bits are compared with the
fresh child's. Writes DIR/ptxas_choice.json and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = "4096x128256,4096x50257"


def torch_ptxas() -> str | None:
    """The ptxas Inductor hands Triton (torch/bin/ptxas: TRITON_PTXAS_PATH after a torch.compile in
    run (d)), if this PyTorch has one."""
    import torch

    path = Path(torch.__file__).parent / "bin" / "ptxas"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def child(shapes: str, after_compile: bool) -> dict:
    """In this process: time and build the dispatched kernels at `shapes` (both dtypes), after a
    torch.compile'd cross-entropy step where `after_compile`."""
    import torch
    import torch.nn.functional as F
    from triton_rows_sweep import bits, graph_times_us, training_inputs

    from kernels import softmax_triton as st
    from kernels import triton_backward as tb
    from kernels import triton_cross_entropy as tce
    from kernels.triton_kernels import JIT_KERNELS
    from kernels.triton_loss_kernels import JIT_KERNELS as LOSS_KERNELS

    before = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    if after_compile:
        x = torch.randn(64, 1000, device="cuda", requires_grad=True)
        t = torch.randint(0, 1000, (64,), device="cuda")
        torch.compile(lambda x, t: F.cross_entropy(x, t))(x, t).backward()
        torch.cuda.synchronize()
    after = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    changed = {k: after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    rows, digests = [], {}
    for B, V, dtype, x, t, y, dy in training_inputs(shapes):
        calls = {
            "softmax": lambda x=x: st.softmax(x),
            "softmax_backward": lambda dy=dy, y=y: tb.softmax_backward(dy, y),
            "cross_entropy": lambda x=x, t=t: tce.cross_entropy(x, t, validate=False),
        }
        outs = {name: fn() for name, fn in calls.items()}
        outs["cross_entropy"] = outs["cross_entropy"].grad
        times = graph_times_us(list(calls.values()))
        for (name, _), ts in zip(calls.items(), times, strict=True):
            key = f"{name} {str(dtype).removeprefix('torch.')} ({B}, {V})"
            rows.append({"case": key, "us": statistics.median(ts)})
            digests[key] = hashlib.sha256(bits(outs[name]).cpu().numpy().tobytes()).hexdigest()
    built = []
    for name, fn in {**JIT_KERNELS, **LOSS_KERNELS}.items():
        for caches in getattr(fn, "device_caches", {}).values():
            for k in caches[0].values():
                k._init_handles()
                built.append(f"{name}: {k.metadata.num_warps} warps, {k.n_regs} regs, {4 * k.n_spills} bytes spilled")
    return {"rows": rows, "digests": digests, "built": sorted(set(built)), "env_changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--after-compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.shapes, args.after_compile)))
        return
    if args.out is None:
        parser.error("--out DIR is required")
    ptxas = torch_ptxas()
    variants = {"fresh": (None, False), "after torch.compile": (None, True)}
    if ptxas:
        variants["pytorch's ptxas"] = (ptxas, False)
    else:
        print("pytorch's ptxas: none in this PyTorch")
    results = {}
    for name, (path, after_compile) in variants.items():
        env = {k: v for k, v in os.environ.items() if k != "TRITON_PTXAS_PATH"}
        if path:
            env["TRITON_PTXAS_PATH"] = path
        with tempfile.TemporaryDirectory() as cache:
            env["TRITON_CACHE_DIR"] = cache
            cmd = [sys.executable, __file__, "--child", "--shapes", args.shapes]
            cmd += ["--after-compile"] if after_compile else []
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: the child failed\n{proc.stderr[-4000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"pytorch_ptxas": ptxas, "results": results}
    (args.out / "ptxas_choice.json").write_text(json.dumps(record, indent=1))
    base = results["fresh"]
    for name, r in results.items():
        print(f"-- {name}: TRITON_* variables changed in the child: {r['env_changed'] or 'none'}")
        print("\n".join(r["built"]))
        for row, ref in zip(r["rows"], base["rows"], strict=True):
            differ = "" if r["digests"][row["case"]] == base["digests"][row["case"]] else "  BITS DIFFER"
            print(f"{row['case']:40s} {row['us']:9.1f} us  {ref['us'] / row['us']:.3f}x fresh{differ}")


if __name__ == "__main__":
    main()
