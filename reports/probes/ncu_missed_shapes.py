"""Nsight Compute counters for the shapes that miss issue 22's bandwidth goals, in one ncu run.

    python reports/probes/ncu_missed_shapes.py --out DIR [--only NAME,...] [--ncu PATH]

runs, on one GPU, a single `ncu` over this script's workload (`--workload DIR`), which launches
every case below after two warm-up calls (compiling, allocating the split workspace), with the
profiler started (cudaProfilerStart, ncu --profile-from-start off) around exactly one launch per
case and a kernel-name filter, so ncu profiles one launch of each kernel and nothing else. ncu
collects the SpeedOfLight, Occupancy, LaunchStats and WarpStateStats sections; the script then
writes, under DIR:

    ncu_missed_shapes.ncu-rep   the report (open with ncu-ui, or ncu --import)
    ncu_missed_shapes.txt       its details page, as ncu prints it (the raw text)
    ncu_missed_shapes.csv       its raw page: every metric of every profiled launch
    cases.json                  the cases in launch order (the report's IDs follow it)
    summary.md                  per case: duration, DRAM and SM throughput (% of peak), achieved /
                                theoretical occupancy, registers per thread, waves per SM and the
                                three largest stall reasons (warp-cycles stalled per issued
                                instruction, smsp__average_warps_issue_stalled_*_per_issue_active)

    python reports/probes/ncu_missed_shapes.py --summarise DIR   # summary.md again from DIR

One case alone, as reports/probes/ncu_shape.py does it (two warm-up launches skipped):

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats -k regex:'softmax_split_kernel' --launch-skip 2 --launch-count 1 \\
        python reports/probes/ncu_missed_shapes.py --workload DIR --only triton-bf16-split-262144 --no-profiler-range

Inputs are randn * 3 drawn on the device; outputs are not checked here (the cuda suite does).
Sizes: (4096, 1000003) fp32 is 16 GB in and 16 GB out, the largest case; the others are at most
4.3 GB each. Each case's tensors are freed before the next.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEM = "ncu_missed_shapes"
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "ComputeWorkloadAnalysis", "InstructionStats")
# (name, kernel family, dtype, B, V, path): the shapes issue 22 lists as missed.
CASES = (
    ("triton-bf16-stream-262144", "triton", "bf16", 4096, 262144, "stream"),
    ("triton-bf16-split-262144", "triton", "bf16", 4096, 262144, "split"),
    ("triton-bf16-stream-151936", "triton", "bf16", 4096, 151936, "stream"),
    ("triton-bf16-split-151936", "triton", "bf16", 4096, 151936, "split"),
    ("triton-fp32-split-262144", "triton", "fp32", 4096, 262144, "split"),
    ("fused-fp32-split-1000003", "fused", "fp32", 4096, 1000003, "split"),
    ("fused-bf16-cluster-151936", "fused", "bf16", 4096, 151936, "cluster"),
    # Short rows in 16-bit, where the issue slots are busiest (profiles.md).
    ("triton-bf16-rows-600", "triton", "bf16", 32768, 600, "rows"),
    ("fused-bf16-warpvec-600", "fused", "bf16", 32768, 600, "warpvec"),
    ("fused-bf16-cluster-262144", "fused", "bf16", 4096, 262144, "cluster"),
    ("triton-bf16-row-32000", "triton", "bf16", 4096, 32000, "row"),
    ("triton-fp32-ce-32000", "triton-ce", "fp32", 4096, 32000, "row"),
    ("triton-bf16-bwd-32000", "triton-bwd", "bf16", 4096, 32000, "stream"),
    ("triton-fp32-bwd-32000", "triton-bwd", "fp32", 4096, 32000, "reread"),
    ("triton-fp32-bwd-16384", "triton-bwd", "fp32", 4096, 16384, "reread"),
    ("triton-fp32-bwd-128256", "triton-bwd", "fp32", 4096, 128256, "split"),
    # torch.compile's softmax backward (one kernel, compiled for the shape), the goal's yardstick.
    ("torch_compile-fp32-bwd-32000", "torch_compile-bwd", "fp32", 4096, 32000, "-"),
    ("torch_compile-bf16-bwd-32000", "torch_compile-bwd", "bf16", 4096, 32000, "-"),
    ("torch_compile-fp32-bwd-128256", "torch_compile-bwd", "fp32", 4096, 128256, "-"),
    # Issue 23's training kernels (family "<kernel>-ce": cross-entropy, loss and gradient in one
    # launch; "<kernel>-bwd": the softmax backward), each as its registry entry dispatches it.
    ("triton-bf16-ce-32000", "triton-ce", "bf16", 4096, 32000, "held"),
    ("fused-bf16-ce-32000", "fused-ce", "bf16", 4096, 32000, "cluster"),
    ("triton-fp32-ce-262144", "triton-ce", "fp32", 4096, 262144, "split"),
    ("triton-fp32-ce-128256", "triton-ce", "fp32", 4096, 128256, "split"),
    ("triton-bf16-ce-128256", "triton-ce", "bf16", 4096, 128256, "split"),
    ("fused-fp32-ce-262144", "fused-ce", "fp32", 4096, 262144, "loop"),
    ("triton-bf16-bwd-262144", "triton-bwd", "bf16", 4096, 262144, "split"),
    ("fused-bf16-bwd-262144", "fused-bwd", "bf16", 4096, 262144, "loop"),
    # The held kernels (a row whole in shared memory), where the H200 leaves them short of copy.
    ("triton-bf16-held-32000", "triton", "bf16", 4096, 32000, "held"),
    ("triton-bf16-held-32768", "triton", "bf16", 4096, 32768, "held"),
    ("triton-bf16-ce-24577", "triton-ce", "bf16", 4096, 24577, "held"),
    ("triton-bf16-held-50257", "triton", "bf16", 4096, 50257, "held"),
    ("triton-bf16-ce-50257", "triton-ce", "bf16", 4096, 50257, "held"),
    # The fused cross-entropy's cluster class beside the forward's at the same rows: why the
    # one reaches about half its floor where the other nears copy.
    ("fused-bf16-ce-50257", "fused-ce", "bf16", 4096, 50257, "cluster"),
    ("fused-bf16-cluster-50257", "fused", "bf16", 4096, 50257, "cluster"),
    ("fused-bf16-ce-128256", "fused-ce", "bf16", 4096, 128256, "cluster"),
)
TRAINING = ("ce", "bwd")
KERNEL_FILTER = (
    "regex:softmax_(split|stream|rows?|held)_kernel|fused_(split|cluster|warpvec)_"
    "|(ce|bwd)_(warp|warpvec|row|cluster|loop)_|(cross_entropy|softmax_backward)_(row|tile|split|stream|reread|held)_kernel"
    "|_softmax_backward_data"
)
WARMUP = 2
STALL_METRICS = r"regex:^smsp__average_warps_issue_stalled_\w+_per_issue_active\.ratio$"
STALL_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
# Each pipe's share of its peak (ComputeWorkloadAnalysis): which unit a kernel saturates, if any.
PIPE_METRICS = r"regex:^sm__inst_executed_pipe_\w+\.avg\.pct_of_peak_sustained_active$"
PIPE_RE = re.compile(r"^sm__inst_executed_pipe_(\w+?)\.avg\.pct_of_peak_sustained_active$")
# The memory units' shares of their peaks: L2 (sectors through the slices) and L1, with L2's hit rate.
MEMORY_METRICS = (
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,"
    "l1tex__throughput.avg.pct_of_peak_sustained_active"
)
# Summary columns: (label, candidate metric names, first found wins).
COLUMNS = (
    ("duration us", ("gpu__time_duration.sum",)),
    (
        "DRAM %",
        (
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        ),
    ),
    ("L2 %", ("lts__t_sectors.avg.pct_of_peak_sustained_elapsed",)),
    ("L2 hit %", ("lts__t_sector_hit_rate.pct",)),
    ("L1 %", ("l1tex__throughput.avg.pct_of_peak_sustained_active",)),
    ("SM %", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    ("occupancy achieved", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    ("theoretical", ("sm__maximum_warps_per_active_cycle_pct",)),
    ("registers", ("launch__registers_per_thread",)),
    ("waves/SM", ("launch__waves_per_multiprocessor",)),
)


def selected(only: str | None) -> list[tuple]:
    if not only:
        return list(CASES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {c[0]: c for c in CASES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}: one of {', '.join(known)}")
    return [known[n] for n in names]


# -- the workload ncu runs ---------------------------------------------------------------------------


def workload(out: Path, only: str | None, profiler_range: bool) -> None:
    import torch

    sys.path.insert(0, str(REPO))
    from kernels import CROSS_ENTROPY_KERNELS, SOFTMAX_BACKWARD_KERNELS, SOFTMAX_KERNELS
    from kernels import softmax_triton as st

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    done = []
    for name, family, dt, B, V, path in selected(only):
        dtype = dtypes[dt]
        t0 = time.perf_counter()
        x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
        kernel, _, op = family.partition("-")
        if op == "ce":
            t = torch.randint(0, V, (B,), device="cuda")
            entry = CROSS_ENTROPY_KERNELS[kernel]
            call = functools.partial(entry, x, t)
        elif op == "bwd":
            y = torch.softmax(x.float(), dim=-1).to(dtype)
            entry = SOFTMAX_BACKWARD_KERNELS[kernel]
            call = functools.partial(entry, torch.randn_like(y), y)
        elif family == "triton":
            entry = SOFTMAX_KERNELS[family]

            def call(x=x, path=path):
                return st.run_path(x, path)

        else:
            entry = SOFTMAX_KERNELS[family]
            call = functools.partial(entry, x)
        dispatched = "-" if entry.baseline else entry.plan(B, V, dtype)  # the path the entry takes
        if (family == "fused" or op in TRAINING) and dispatched != path:
            raise SystemExit(f"{name}: {family} dispatches {dispatched} here, not {path}")
        for _ in range(WARMUP):
            call()
        torch.cuda.synchronize()
        if profiler_range:
            torch.cuda.profiler.start()
        y = call()
        torch.cuda.synchronize()
        if profiler_range:
            torch.cuda.profiler.stop()
        done.append(
            {"name": name, "family": family, "dtype": dt, "B": B, "V": V, "path": path, "dispatched": dispatched}
        )
        print(f"{name}: {time.perf_counter() - t0:.1f} s (warm-up and one profiled launch)", flush=True)
        del x, y
        torch.cuda.empty_cache()
        (out / "cases.json").write_text(json.dumps(done, indent=1) + "\n")


# -- the driver ----------------------------------------------------------------------------------------


def run_ncu(out: Path, ncu: str, only: str | None, timeout: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rep = out / STEM
    cmd = [ncu, "--force-overwrite", "--export", str(rep), "--clock-control", "none", "--profile-from-start", "off"]
    cmd += ["-k", KERNEL_FILTER]  # unmodified clocks, as profiles.md measured
    for s in SECTIONS:
        cmd += ["--section", s]
    # asked for by name so the raw page has them
    cmd += ["--metrics", f"{STALL_METRICS},{PIPE_METRICS},{MEMORY_METRICS}"]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--workload", str(out)]
    if only:
        cmd += ["--only", only]
    print(" ".join(cmd), flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        rc = subprocess.run(cmd, cwd=REPO, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"ncu ran past {timeout:.0f} s: what it profiled so far is summarised", flush=True)
        rc = 124
    report = rep.with_suffix(".ncu-rep")
    if report.exists():
        with open(out / f"{STEM}.txt", "w") as f:
            subprocess.run([ncu, "--import", str(report), "--page", "details", "--print-units", "base"], stdout=f)
        with open(out / f"{STEM}.csv", "w") as f:
            subprocess.run([ncu, "--import", str(report), "--page", "raw", "--csv", "--print-units", "base"], stdout=f)
        summarise(out)
    else:
        print(f"no report at {report}", flush=True)
    return rc


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_raw(path: Path) -> list[dict]:
    """Rows of ncu's raw CSV page, one per profiled launch (the units row skipped)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        return []
    names = rows[head]
    launches = []
    for r in rows[head + 1 :]:
        rec = dict(zip(names, r, strict=False))  # ncu may end a row early
        if _number(rec.get("ID", "")) is None:
            continue  # the units row
        launches.append(rec)
    return launches


def summarise(out: Path) -> str:
    cases = json.loads((out / "cases.json").read_text()) if (out / "cases.json").exists() else []
    launches = read_raw(out / f"{STEM}.csv") if (out / f"{STEM}.csv").exists() else []
    lines = [
        "| case | path (dispatched) | kernel | "
        + " | ".join(c for c, _ in COLUMNS)
        + " | top stalls (cycles per issued instruction) | busiest pipes (% of peak) |",
        "|---" * (5 + len(COLUMNS)) + "|",
    ]
    for i, rec in enumerate(launches):
        case = cases[i] if i < len(cases) else {"name": "?", "path": "?", "dispatched": "?"}
        values = []
        for label, names in COLUMNS:
            v = next((_number(rec[n]) for n in names if n in rec and _number(rec[n]) is not None), None)
            if v is not None and label == "duration us":
                v /= 1000.0  # ncu gives ns (--print-units base)
            values.append("?" if v is None else f"{v:.4g}")
        stalls = sorted(
            ((m.group(1), _number(v)) for k, v in rec.items() if (m := STALL_RE.match(k)) and _number(v) is not None),
            key=lambda kv: -kv[1],
        )
        top = ", ".join(f"{k} {v:.2f}" for k, v in stalls[:3]) or "?"
        pipes = sorted(
            ((m.group(1), _number(v)) for k, v in rec.items() if (m := PIPE_RE.match(k)) and _number(v) is not None),
            key=lambda kv: -kv[1],
        )
        busiest = ", ".join(f"{k} {v:.0f}" for k, v in pipes[:4]) or "?"
        kernel = rec.get("Kernel Name", "?")[:48]
        lines.append(
            f"| {case['name']} | {case['path']} ({case['dispatched']}) | `{kernel}` | "
            + " | ".join(values)
            + f" | {top} | {busiest} |"
        )
    if len(launches) != len(cases):
        lines.append(f"\n{len(cases)} cases ran, {len(launches)} launches profiled: the table pairs them in order.")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="run ncu over the workload and write the files listed above here")
    mode.add_argument("--workload", type=Path, metavar="DIR", help="(what ncu runs) launch the cases; cases.json here")
    mode.add_argument("--summarise", type=Path, metavar="DIR", help="summary.md from DIR's raw CSV and cases.json")
    ap.add_argument("--only", help=f"comma-separated case names (default: all): {', '.join(c[0] for c in CASES)}")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu", help="the ncu binary (default: from PATH)")
    ap.add_argument("--timeout", type=float, default=140.0, help="seconds before ncu is stopped (default 140)")
    ap.add_argument(
        "--no-profiler-range",
        action="store_true",
        help="with --workload: no cudaProfilerStart/Stop (for ncu with --launch-skip instead)",
    )
    args = ap.parse_args(argv)
    selected(args.only)  # names checked before anything starts
    if args.workload:
        args.workload.mkdir(parents=True, exist_ok=True)
        workload(args.workload, args.only, not args.no_profiler_range)
        return 0
    if args.summarise:
        summarise(args.summarise)
        return 0
    return run_ncu(args.out, args.ncu, args.only, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
