"""Probe: the fused kernel's fixed-point conversion on the integer pipes instead of the
conversion unit, A/B in one process.

    PYTHONPATH=. python reports/probes/cuda_fixed_ab.py --out DIR        # on a GPU

The question. The counters (reports/profiles.md, "Which unit") put fused's bf16 cluster class at
76 % of the xu pipe for 79 % of DRAM: per element two MUFU.EX2 (the 16-bit rows are held packed
and exponentiated twice) and one F2I.S64, the truncation of e * 2^K to int64 that the
fixed-point sum adds. This builds the fused module a second time with that truncation written
with shifts on the float's bits (exact for every e in [0, 1]: the bits must not change), and
times both builds interleaved (device time, L2 flushed, fresh contents each round), at the
shapes that miss and at fp32 controls. Writes DIR/cuda_fixed_ab.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from triton_rows_sweep import copy_TBps

from kernels import cuda_build
from kernels import softmax_cuda as sc
from tests.suite.devicetime import fresh_contents, interleaved_device_times_us

ORIGINAL = "    return __float2ll_rz(e * scale);  // e <= 1: scaling by a power of two is exact\n"
# f = e * 2^K (exact) = m * 2^(E - 150) with m the 24-bit significand and E the biased exponent;
# (m << 40) >> (190 - E) is trunc(f) for E <= 189 (f < 2^63), and 0 once the shift reaches 64
# (f < 1: zero, subnormal; a NaN's sign or exponent makes the unsigned shift wrap past 64).
INTEGER = (
    "    const unsigned b = __float_as_uint(e * scale);\n"
    "    const unsigned sh = 190u - (b >> 23);\n"
    "    const unsigned long long v = static_cast<unsigned long long>((b << 8) | 0x80000000u) << 32;\n"
    "    return static_cast<long long>(sh < 64u ? v >> sh : 0ull);\n"
)
SHAPES = (
    (4096, 32768, torch.bfloat16),
    (8192, 50257, torch.bfloat16),
    (4096, 128256, torch.bfloat16),
    (4096, 262144, torch.bfloat16),
    (32768, 600, torch.bfloat16),
    (4096, 128256, torch.float32),
    (8192, 32000, torch.float32),
)


def build(integer: bool, shapes) -> dict:
    """The fused dispatch table of one build: each shape's launch, compiled now."""
    base = _EXPAND

    def expand(path):
        src = base(path)
        if integer and Path(path).name == "softmax_fused.cu":
            if ORIGINAL not in src:
                raise RuntimeError("to_fixed's body changed: update the probe")
            src = src.replace(ORIGINAL, INTEGER)
        return src

    cuda_build.expand_source = expand
    sc._launchers.clear()
    sc._fused_dispatch.clear()
    for _, V, dtype in shapes:
        sc.softmax_fused(torch.zeros(1, V, dtype=dtype, device="cuda"))
    table = dict(sc._fused_dispatch)
    cuda_build.expand_source = base
    return table


_EXPAND = cuda_build.expand_source


def _call(table, x):
    def call():
        sc._fused_dispatch = table  # the build whose launches this call takes
        sc.softmax_fused(x)

    return call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    tables = {"f2i": build(False, SHAPES), "shifts": build(True, SHAPES)}
    copy = copy_TBps()
    results = []
    for B, V, dtype in SHAPES:
        torch.manual_seed(B + V)
        x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
        x[0, : min(V, 64)] = float("-inf")
        outs = {}
        for name, table in tables.items():
            sc._fused_dispatch = table
            outs[name] = sc.softmax_fused(x).view(torch.int16 if dtype != torch.float32 else torch.int32)
        same = bool(torch.equal(outs["f2i"], outs["shifts"]))
        del outs
        calls = [_call(table, x) for table in tables.values()]
        times = interleaved_device_times_us(calls, rounds=args.rounds, refresh=fresh_contents(x))
        nbytes = 2 * x.numel() * x.element_size()
        entry = {"B": B, "V": V, "dtype": str(dtype).removeprefix("torch."), "bits_equal": same}
        for name, ts in zip(tables, times, strict=True):
            us = statistics.median(ts)
            entry[name] = {"us": us, "of_copy": nbytes / (us * 1e-6) / 1e12 / copy}
        entry["speedup"] = entry["f2i"]["us"] / entry["shifts"]["us"]
        results.append(entry)
        del x
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_fixed_ab.json").write_text(json.dumps({"copy_TBps": copy, "results": results}, indent=1))
    print(f"copy {copy:.3f} TB/s")
    for r in results:
        print(
            f"({r['B']}, {r['V']}) {r['dtype']:9s} f2i {r['f2i']['us']:8.1f} us {r['f2i']['of_copy']:.3f}  "
            f"shifts {r['shifts']['us']:8.1f} us {r['shifts']['of_copy']:.3f}  x{r['speedup']:.3f}  "
            f"bits {'equal' if r['bits_equal'] else 'DIFFER'}"
        )


if __name__ == "__main__":
    main()
