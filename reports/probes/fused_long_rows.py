"""Probe: the fused kernel on long rows (V past 131072) and small batches, against copy
bandwidth and F.softmax, with probe-only size classes beside the dispatched ones.

    PYTHONPATH=. python reports/probes/fused_long_rows.py --out DIR [--stage large|decode|all] [--quick]

What it does, on one GPU:
- compiles the fused module with the dispatch table's kernels plus the probe-only classes of
  VARIANTS (bigger CTAs, other cluster sizes), so all are timed from one build;
- large B: for each (B, V, dtype) of the vocabulary sweep, device time (CUDA events, L2
  flushed before each launch, as tests/suite/devicetime.py times the suite) of F.softmax, of
  fused as dispatched and of each variant, with the fraction of copy bandwidth (2 GiB
  device-to-device copy measured in the same run, as the suite's ceiling) and the speed ratio
  to F.softmax;
- decode: small B at the shorter long rows (V <= 131072; the longer ones are in the large
  stage's small B), fused as dispatched against F.softmax;
- every timed output of ours is checked: its bits must equal the dispatched output's bits (the
  sums are order-free), and sampled rows must match the float64 reference within the suite's
  tolerance (tests.helpers.check_softmax).

Writes DIR/fused_long_rows.json (every number) and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import cuda_plans as cp
from kernels import softmax_cuda as sc
from kernels.cuda_build import FUSED_SOURCE, expand_source, instantiations
from tests.helpers import check_softmax
from tests.suite.devicetime import device_times_us

FP32, BF16 = torch.float32, torch.bfloat16
NAMES = {FP32: "fp32", BF16: "bf16"}
LONG_V = (151936, 200064, 202048, 262144, 1000000)
LARGE_B = (1024, 4096)
SMALL_B = (1, 8, 64)
REGRESSION = ((4096, 32768), (4096, 50257), (4096, 128256))  # the classes that existed before
DECODE_V = (20000, 32768, 65536, 128256)
DECODE_B = (1, 8, 16, 64)


def _c(threads, elems, cluster, packed=False):
    return cp.FusedClass("cluster", threads, elems, cluster, packed)


# Probe-only classes per (dtype, V): the register-only cuts this work tried first (clusters of
# 13 and 16 CTAs, a non-portable size on sm_90; the split path without shared memory), to time
# beside the dispatched classes, which keep part of each slice in shared memory.
VARIANTS = {
    (FP32, 151936): [_c(320, 32, 16)],
    (FP32, 200064): [_c(512, 32, 13), _c(416, 32, 16)],
    (FP32, 202048): [_c(512, 32, 13), _c(416, 32, 16)],
    (FP32, 262144): [_c(512, 32, 16)],
    (FP32, 1000000): [cp.FusedClass("split", 512, 32)],
    (BF16, 151936): [_c(160, 64, 16, True)],
    (BF16, 200064): [_c(256, 64, 13, True), _c(224, 64, 16, True)],
    (BF16, 202048): [_c(256, 64, 13, True), _c(224, 64, 16, True)],
    (BF16, 262144): [_c(256, 64, 16, True)],
    (BF16, 1000000): [cp.FusedClass("split", 256, 64, packed=True)],
}


def _install_variants():
    """Let the fused launchers compile the probe-only classes: each is its own translation unit,
    as the table's classes are (kernel_source)."""
    extra = {p.kernel_name(dt): p.instantiation(dt) for (dt, _), plans in VARIANTS.items() for p in plans}
    original = sc.kernel_source

    def patched(path, name):
        if Path(path) == FUSED_SOURCE and name in extra:
            return expand_source(path) + instantiations([extra[name]])
        return original(path, name)

    sc.kernel_source = patched


def _median(ts):
    ts = sorted(ts)
    return ts[len(ts) // 2]


def _rounds(nbytes):
    return 30 if nbytes < 1 << 28 else 10 if nbytes < 1 << 32 else 5


def copy_ceiling_TBps():
    src = torch.empty(1 << 29, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    t = _median(device_times_us(lambda: dst.copy_(src), flush_l2=False, rounds=30))
    return src.numel() * 4 * 2 / (t * 1e-6) / 1e12


def _bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _check_rows(out, x, what):
    rows = sorted({0, x.shape[0] // 2, x.shape[0] - 1})
    try:
        check_softmax(out[rows].cpu(), x[rows].cpu(), what=what)
        return "ok"
    except AssertionError as e:
        return f"FAIL: {str(e)[:300]}"


def measure_shape(B, V, dtype, runs, ceiling):
    """Time F.softmax and each of `runs` ({name: fn(x) -> y}); the first run is the reference
    for bits. Returns the entry for the JSON."""
    torch.manual_seed(B * 7 + V)
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
    nbytes = 2 * B * V * x.element_size()
    rounds = _rounds(nbytes)
    entry = {"B": B, "V": V, "dtype": NAMES[dtype], "bytes": nbytes, "rounds": rounds, "t_us": {}, "notes": {}}
    f_us = _median(device_times_us(lambda: F.softmax(x, dim=-1), warmup=2, rounds=rounds))
    entry["t_us"]["F"] = f_us
    ref = None
    for name, fn in runs.items():
        try:
            out = fn(x)
            torch.cuda.synchronize()
        except Exception as e:  # a variant that cannot launch is reported, not fatal
            entry["notes"][name] = f"error: {type(e).__name__}: {str(e)[:200]}"
            continue
        if ref is None:
            ref = out
            entry["notes"][name] = _check_rows(out, x, f"{name} ({B}, {V}) {NAMES[dtype]}")
        else:
            same = bool(torch.equal(_bits(out), _bits(ref)))
            entry["notes"][name] = "bits equal" if same else "BITS DIFFER"
        del out
        entry["t_us"][name] = _median(device_times_us(lambda fn=fn: fn(x), warmup=2, rounds=rounds))
    entry["frac_copy"] = {k: nbytes / (t * 1e-6) / 1e12 / ceiling for k, t in entry["t_us"].items()}
    entry["x_F"] = {k: f_us / t for k, t in entry["t_us"].items()}
    return entry


def _fused(**kw):
    return lambda x: sc.softmax_fused(x, **kw)


def large_runs(B, V, dtype):
    runs = {"fused": _fused()}
    dispatched = cp.select_fused_class(V, dtype)
    for size_class in VARIANTS.get((dtype, V), []):
        if size_class != dispatched:
            name = "split_regs" if size_class.kind == "split" else f"c{size_class.cluster}x{size_class.threads}"
            runs[name] = _fused(size_class=size_class)
    if dispatched.kind == "split":
        runs["loop"] = _fused(size_class=cp.LOOP_CLASS)
    return runs


def decode_runs(B, V, dtype):
    return {"fused": _fused()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stage", choices=("large", "decode", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    _install_variants()
    t0 = time.time()
    sc.softmax_fused(torch.randn(2, 600, device="cuda"))  # compiles the module
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "compile_s": round(time.time() - t0, 1),
        "method": "device time: CUDA events around each launch, L2 flushed (256 MiB) before each, median; "
        "frac_copy: bytes (read + write) / time / the 2 GiB copy ceiling of this run; x_F: t(F.softmax) / t",
    }
    ceiling = result["copy_TBps"] = copy_ceiling_TBps()
    entries = result["entries"] = []

    def save():
        (args.out / "fused_long_rows.json").write_text(json.dumps(result, indent=1))

    if args.stage in ("large", "all"):
        shapes = [(B, V) for V in LONG_V for B in LARGE_B] + list(REGRESSION)
        shapes += [(B, V) for V in LONG_V for B in SMALL_B]
        if args.quick:
            shapes = [(1024, 151936), (8, 262144), (1024, 1000000)]
        for dtype in (FP32, BF16):
            for B, V in shapes:
                e = measure_shape(B, V, dtype, large_runs(B, V, dtype), ceiling)
                e["stage"] = "large"
                e["size_class"] = cp.fused_class_description(B, V, dtype)
                entries.append(e)
                print(f"{e['dtype']} ({B}, {V}) {_short(e)}", flush=True)
                torch.cuda.empty_cache()
                save()
    if args.stage in ("decode", "all"):
        shapes = [(B, V) for V in DECODE_V for B in DECODE_B]
        if args.quick:
            shapes = [(1, 32768), (16, 65536)]
        for dtype in (FP32, BF16):
            for B, V in shapes:
                e = measure_shape(B, V, dtype, decode_runs(B, V, dtype), ceiling)
                e["stage"] = "decode"
                e["size_class"] = cp.fused_class_description(B, V, dtype)
                entries.append(e)
                print(f"{e['dtype']} ({B}, {V}) {_short(e)}", flush=True)
                save()
    result["total_s"] = round(time.time() - t0, 1)
    save()
    print(f"\ncopy ceiling {ceiling:.2f} TB/s; {len(entries)} shapes in {result['total_s']} s")
    print(f"{'dtype':5s} {'B':>5s} {'V':>8s} {'F us':>8s} {'fused us':>9s} {'copy':>5s} {'xF':>5s}  best other")
    for e in entries:
        others = {k: v for k, v in e["t_us"].items() if k not in ("F", "fused")}
        best = min(others, key=others.get) if others else ""
        extra = f"{best} {others[best]:.1f} us" if best else ""
        bad = [k for k, v in e["notes"].items() if v not in ("ok", "bits equal")]
        t = e["t_us"].get("fused", math.nan)
        print(
            f"{e['dtype']:5s} {e['B']:5d} {e['V']:8d} {e['t_us']['F']:8.1f} {t:9.1f} "
            f"{e['frac_copy'].get('fused', math.nan):5.2f} {e['x_F'].get('fused', math.nan):5.2f}  {extra}"
            + (f"  PROBLEMS: {bad}" if bad else "")
        )


def _short(e):
    parts = [f"{k} {v:.1f}us({e['frac_copy'][k]:.2f})" for k, v in e["t_us"].items()]
    bad = {k: v for k, v in e["notes"].items() if v not in ("ok", "bits equal")}
    return " ".join(parts) + (f" PROBLEMS {bad}" if bad else "")


if __name__ == "__main__":
    main()
