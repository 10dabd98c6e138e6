"""Triton's long rows on one GPU: the dispatch and the split / stream variants against F.softmax
and the copy ceiling at today's vocabularies, with correctness and bit checks on every output.

    python reports/probes/triton_long_rows.py --out DIR [--jobs N] [--before PKG] [--no-sweep]
    python reports/probes/triton_long_rows.py --single NAME --shape B,V,dtype   # for ncu

What it does, in one process on one GPU (the numbers behind reports/profiles.md's Triton
long-row section; raw JSON under reports/runs/):

- compiles every kernel specialisation it will time first, in --jobs child processes that
  share Triton's on-disk cache (the timed process then only loads them);
- measures the copy ceiling (a 4 GiB device-to-device copy, read + write bytes) and, per
  (dtype, V, B), F.softmax, the dispatch (`kernels.softmax_triton.softmax`), the dispatch of the
  package given by --before (the code before a change, for before/after in one run), and, where
  the sweep applies, split and stream with other launch parameters: device time with CUDA
  events, L2 flushed before every launch (tests.suite.devicetime, the suite's own clock);
- checks every output: three sampled rows against float64 softmax within the suite's
  tolerances, and their bits against the dispatch's, and row 0 (and row 1023) against the same
  row in every other batch size: paths, parameters and B must not change a bit;
- writes DIR/triton_long_rows.json and prints a table last.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# --cpu-smoke: the whole probe on CPU tensors under Triton's interpreter, at the shapes given with
# --vs / --bs, host-timed (a check of this script, not a measurement).
SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
DEV = "cpu" if SMOKE else "cuda"

from kernels import softmax_triton as st  # noqa: E402
from kernels import triton_dispatch as dispatch  # noqa: E402
from tests.helpers import check_softmax, dtype_id  # noqa: E402
from tests.suite.devicetime import device_times_us  # noqa: E402

VS = (50257, 128256, 151936, 200064, 202048, 262144, 1000003)
BS = (1, 8, 64, 1024, 4096)
SWEEP_V = (151936, 262144)  # large-B parameter sweep at these V (B >= SWEEP_MIN_B)
SWEEP_MIN_B = 1024
LIGHT_V = (50257, 128256)  # at B >= SWEEP_MIN_B: stream
DECODE_V = (262144,)  # small-B chunk sweep at these V (B <= 64)
# (CHUNK, num_warps, maxnreg): the register cap sets the programs resident per SM
SPLIT_SWEEP = {
    torch.float32: [
        (2048, 4, 48),
        (4096, 4, 64),
        (4096, 4, 80),
        (4096, 8, 40),
        (4096, 8, 48),
        (4096, 8, 64),
        (8192, 8, 64),
        (8192, 8, 80),
        (8192, 4, 128),
        (4096, 4, 72),
        (8192, 4, 96),
        (8192, 4, 80),
    ],
    torch.bfloat16: [
        (4096, 4, 72),
        (8192, 4, 128),
        (4096, 4, 64),
        (4096, 8, 40),
        (4096, 8, 48),
        (8192, 8, 64),
        (8192, 8, 72),
        (8192, 8, 80),
        (8192, 4, 96),
        (8192, 4, 80),
        (16384, 8, 96),
        (16384, 8, 128),
        (16384, 16, 64),
    ],
}
DECODE_CHUNKS = (8192, 4096, 2048, 1024, 512)
SAMPLE_ROWS = (0, 1023)


def timed(fn, rounds):
    """Device times (µs) of `rounds` launches of fn, L2 flushed before each (host clock in --cpu-smoke)."""
    if not SMOKE:
        return device_times_us(fn, warmup=2, rounds=rounds)
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def synchronize():
    if not SMOKE:
        torch.cuda.synchronize()


def variants(dtype, B, V, sweep=True):
    """(name, path, params) for the run_path variants timed at this shape."""
    out = []
    if sweep and B >= SWEEP_MIN_B and V in SWEEP_V:
        for chunk, warps, regs in SPLIT_SWEEP[dtype]:
            out.append(
                (f"split/{chunk}x{warps}/r{regs}", "split", {"CHUNK": chunk, "num_warps": warps, "maxnreg": regs})
            )
        out.append(("stream", "stream", st.launch_params("stream", V, dtype)))
    if sweep and B >= SWEEP_MIN_B and V in LIGHT_V:
        out.append(("stream", "stream", st.launch_params("stream", V, dtype)))
    if sweep and B <= 64 and V in DECODE_V:
        for chunk in DECODE_CHUNKS:
            out.append(
                (
                    f"split/{chunk}x4/r128",
                    "split",
                    {"CHUNK": chunk, "num_warps": 4, "maxnreg": 128},
                )
            )
    return out


def dispatch_params(B, V, dtype, sms):
    path = st.plan(B, V, dtype)
    return path, st.launch_params(path, V, dtype, B=B, sms=sms)


def _compile_specs(specs, before):
    """Child process: launch each (kind, path, params, V, dtype) once on a 1-row input."""
    old = importlib.import_module(f"{before}.softmax_triton") if before else None
    for kind, path, params, V, dtype in specs:
        x = torch.randn(1, V, device=DEV).to(getattr(torch, dtype))
        if kind == "before":
            old.softmax(x)
        else:
            st.run_path(x, path, **params)
    synchronize()


def precompile(cases, sweep, before, jobs, sms):
    specs = set()
    for dtype, B, V in cases:
        path, params = dispatch_params(B, V, dtype, sms)
        name = str(dtype).removeprefix("torch.")
        specs.add(("triton", path, json.dumps(params, sort_keys=True), V, name))
        if before:
            specs.add(("before", "", "{}", V, name))
        for _, vpath, vparams in variants(dtype, B, V, sweep):
            specs.add(("variant", vpath, json.dumps(vparams, sort_keys=True), V, name))
    specs = [(k, p, json.loads(q), V, d) for k, p, q, V, d in sorted(specs)]
    t0 = time.time()
    if jobs > 1:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_compile_specs, args=(specs[i::jobs], before)) for i in range(jobs)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    print(f"precompiled {len(specs)} specialisations in {time.time() - t0:.1f} s with {jobs} jobs", flush=True)


def copy_ceiling():
    x = torch.empty(1 << (20 if SMOKE else 30), dtype=torch.float32, device=DEV).uniform_()
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), rounds=10)
    return 2 * x.numel() * 4 / (sorted(t)[len(t) // 2] * 1e-6) / 1e12


def check_close(got, x):
    """'' when got (sampled rows of the output) meets the suite's softmax contract for x (the
    same rows of the input): tests.helpers.check_softmax, elements and row sums."""
    try:
        check_softmax(got, x)
    except AssertionError as e:
        return str(e).splitlines()[0][:300]
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--before", default=None, help="a package holding the earlier kernels (copy of kernels/)")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--single", default=None, help="run one variant (name as in the table) 3 times, for ncu")
    ap.add_argument("--shape", default="4096,262144,bfloat16")
    ap.add_argument("--vs", default=None, help="comma-separated V (default: the issue's)")
    ap.add_argument("--bs", default=None, help="comma-separated B")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--sweep-v", default=None, help="comma-separated V of the large-B sweep")
    ap.add_argument("--decode-v", default=None, help="comma-separated V of the small-B sweep")
    ap.add_argument("--sweep-min-b", type=int, default=None)
    ap.add_argument("--cpu-smoke", action="store_true", help="check this script on CPU (see SMOKE)")
    args = ap.parse_args()
    global SWEEP_V, DECODE_V, SWEEP_MIN_B
    SWEEP_V = tuple(int(v) for v in args.sweep_v.split(",")) if args.sweep_v else SWEEP_V
    DECODE_V = tuple(int(v) for v in args.decode_v.split(",")) if args.decode_v else DECODE_V
    SWEEP_MIN_B = args.sweep_min_b or SWEEP_MIN_B
    sms = 4 if SMOKE else torch.cuda.get_device_properties(0).multi_processor_count
    before = importlib.import_module(f"{args.before}.softmax_triton") if args.before else None

    if args.single:
        B, V, dt = args.shape.split(",")
        B, V, dtype = int(B), int(V), getattr(torch, dt)
        x = (torch.randn(B, V, device=DEV) * 3).to(dtype)
        fns = {"triton": lambda: st.softmax(x), "F": lambda: F.softmax(x, dim=-1)}
        if before:
            fns["before"] = lambda: before.softmax(x)
        for name, path, params in variants(dtype, B, V):
            fns[name] = lambda path=path, params=params: st.run_path(x, path, **params)
        for _ in range(3):
            fns[args.single]()
        synchronize()
        return 0

    vs = tuple(int(v) for v in args.vs.split(",")) if args.vs else VS
    bs = tuple(int(b) for b in args.bs.split(",")) if args.bs else BS
    sweep = not args.no_sweep
    dtypes = tuple(getattr(torch, d) for d in args.dtypes.split(","))
    cases = [(dtype, B, V) for dtype in dtypes for V in vs for B in bs]
    precompile(cases, sweep, args.before, 1 if SMOKE else args.jobs, sms)
    copy_tbps = copy_ceiling()
    print(f"copy ceiling {copy_tbps:.3f} TB/s", flush=True)

    rows, failures = [], []
    row_bits: dict = {}  # (dtype, V, row) -> (what, bits) first seen
    for dtype in dtypes:
        for V in vs:
            bmax = max(bs)
            g = torch.Generator(device=DEV).manual_seed(V)
            full = (torch.randn(bmax, V, device=DEV, generator=g) * 3).to(dtype)
            full[:, 7] = 30.0  # a dominant entry in every row
            full[:, 3::1000] = -math.inf
            for B in bs:
                x = full[:B]
                sample = sorted({0, B // 2, B - 1})
                path, params = dispatch_params(B, V, dtype, sms)
                fns = [
                    ("F", "torch", {}, lambda x=x: F.softmax(x, dim=-1)),
                    ("triton", path, params, lambda x=x: st.softmax(x)),
                ]
                if before:
                    fns.append(("before", before.plan(B, V, dtype), {}, lambda x=x: before.softmax(x)))
                for name, vpath, vparams in variants(dtype, B, V, sweep):
                    fns.append((name, vpath, vparams, lambda x=x, p=vpath, q=vparams: st.run_path(x, p, **q)))
                t_f = None
                want = None
                for name, vpath, vparams, fn in fns:
                    y = fn()
                    synchronize()
                    got = y[sample].clone()
                    del y
                    what = f"{dtype_id(dtype)} B={B} V={V} {name}"
                    if name != "F":
                        err = check_close(got, x[sample])
                        if err:
                            failures.append(f"{what}: {err}")
                        if want is None:
                            want = got
                        elif not torch.equal(
                            got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                            want.view(torch.int16 if want.element_size() == 2 else torch.int32),
                        ):
                            failures.append(f"{what}: bits differ from the dispatch on rows {sample}")
                        for r in SAMPLE_ROWS:
                            if r in sample:
                                b = got[sample.index(r)]
                                seen = row_bits.setdefault((dtype, V, r), (what, b))
                                if not torch.equal(seen[1], b):
                                    failures.append(f"{what}: row {r} bits differ from {seen[0]}")
                    big = B * V * x.element_size() > 1 << 30
                    times = timed(fn, rounds=5 if big else 20)
                    med = sorted(times)[len(times) // 2]
                    if name == "F":
                        t_f = med
                    gbps = 2 * B * V * x.element_size() / (med * 1e-6) / 1e9
                    rows.append(
                        {
                            "dtype": dtype_id(dtype),
                            "B": B,
                            "V": V,
                            "name": name,
                            "path": vpath,
                            "params": {k: v for k, v in vparams.items() if k != "config"},
                            "median_us": round(med, 2),
                            "min_us": round(min(times), 2),
                            "max_us": round(max(times), 2),
                            "GBps": round(gbps, 1),
                            "frac_of_copy": round(gbps / 1e3 / copy_tbps, 3),
                            "x_F_softmax": round(t_f / med, 3),
                        }
                    )
                print(f"done {dtype_id(dtype)} V={V} B={B}", flush=True)
            del full
            if not SMOKE:
                torch.cuda.empty_cache()

    result = {
        "what": "Triton long-row probe (reports/probes/triton_long_rows.py)",
        "device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(),
        "sms": sms,
        "versions": {
            "torch": torch.__version__,
            "triton": importlib.import_module("triton").__version__,
            "python": sys.version.split()[0],
        },
        "method": "device time, CUDA events, L2 flushed (256 MiB) before every launch, median of 20 "
        "(5 for inputs over 1 GiB) after 2 warm-ups; frac_of_copy against copy_TBps of this run",
        "copy_TBps": round(copy_tbps, 4),
        "dispatch": {
            "boundaries": dispatch.DISPATCH_BOUNDARIES,
            "split": dispatch.SPLIT_PARAMS,
            "split_fill": dispatch.SPLIT_FILL,
            "split_min_chunk": dispatch.SPLIT_MIN_CHUNK,
        },
        "failures": failures,
        "rows": rows,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "triton_long_rows.json").write_text(json.dumps(result, indent=1))

    print("\nfailures:", len(failures))
    for f in failures[:40]:
        print("  ", f)
    print(
        f"\ncopy {copy_tbps:.3f} TB/s; per shape: F.softmax us | triton us, frac of copy, x F [path params]"
        " | before | best variant"
    )
    by = {}
    for r in rows:
        by.setdefault((r["dtype"], r["V"], r["B"]), {})[r["name"]] = r
    for (d, V, B), m in by.items():
        t, f = m["triton"], m["F"]
        p = t["params"]
        pstr = t["path"] + ("" if t["path"] != "split" else f" {p.get('CHUNK')}x{p.get('num_warps')}")
        line = (
            f"{d} V={V:>7} B={B:>4}: F {f['median_us']:>8.1f} | {t['median_us']:>8.1f} {t['frac_of_copy']:.2f} "
            f"{t['x_F_softmax']:.2f}x [{pstr}]"
        )
        if "before" in m:
            line += f" | before {m['before']['median_us']:.1f} ({m['before']['frac_of_copy']:.2f})"
        others = [r for n, r in m.items() if n not in ("F", "triton", "before")]
        if others:
            best = min(others, key=lambda r: r["median_us"])
            line += f" | best {best['name']} {best['median_us']:.1f} ({best['frac_of_copy']:.2f})"
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
