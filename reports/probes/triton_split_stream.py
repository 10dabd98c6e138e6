"""Triton's long rows with chunks streamed, not held: pipelined loads and L2 re-reads.

    python reports/probes/triton_split_stream.py --aot              # sm_90 builds here, no GPU
    python reports/probes/triton_split_stream.py --cpu-smoke --out DIR  # this script, interpreted
    python reports/probes/triton_split_stream.py --out DIR          # on a GPU: the timed comparison
    python reports/probes/triton_split_stream.py --one NAME DTYPE B V  # three launches of one variant (ncu)

The question. The split kernel (kernels/triton_kernels.py) holds its chunk in registers as
float32 from the load to the store, so a 16-bit launch has half the bytes of a float32 one in
flight per SM (bf16 0.48 of copy at V >= 128256 against fp32's 0.79-0.83), and the bytes are in
flight only while a chunk loads: not while it waits at its meetings, exponentiates or stores.
`stream_split_kernel` cuts the row into the same kind of chunks but holds nothing: each program
reads its chunk three times in BLOCK-wide tiles (max, meeting, fixed-point sum, meeting,
write), the tiles' loads pipelined by Triton (`tl.range(..., num_stages=NS)`: NS tiles in
flight per program, through shared memory). The launch's chunks in flight at once (programs
per SM x 132 x CHUNK bytes) are a few tens of MB, so the second and third reads are served by
L2 and DRAM sees one read and one write. Same expression on the same values: the same bits as
the dispatch.

Also timed: the stream kernel with its three row loops pipelined (`stream_pipelined_kernel`,
NS tiles in flight), and the row path for bf16 rows of 8193-16384 at 16 warps (two programs per
SM, the change reports/profiles.md recommends) at other batches and in fp16.

Timing and checks as reports/probes/triton_hold16.py (its functions): device time with CUDA
events, interleaved rounds, output poisoned and L2 flushed before every launch, median of
ROUNDS; fraction of a copy ceiling measured in the same run; every output's bits against the
dispatch's, no NaN left. Writes DIR/triton_split_stream.json and prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
SMOKE = "--cpu-smoke" in sys.argv
AOT = "--aot" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
elif AOT:
    os.environ.pop("TRITON_INTERPRET", None)
DEV = "cpu" if SMOKE else "cuda"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton_hold16 as h16  # noqa: E402

from kernels import softmax_triton as st  # noqa: E402
from kernels import triton_dispatch as dispatch  # noqa: E402
from kernels.triton_kernels import (  # noqa: E402
    _exp,
    _fixed,
    _group_mask,
    _launch_tag,
    _meet_floats,
    _meet_sum,
    _nan_max,
    _no_value_specialisation,
    _normalise,
    _row_max,
    _softmax_scale,
    _split_edges,
    _tagged,
    _tagged_halves,
)
from kernels.triton_launch import PATH_TABLE  # noqa: E402


@_no_value_specialisation
def stream_split_kernel(
    X,
    Y,
    WS,
    B,
    V,
    P,
    stride_x,
    stride_y,
    x_off,
    y_off,
    SCALE,
    CHUNK: tl.constexpr,
    P_BLOCK: tl.constexpr,
    FALLBACK_BLOCK: tl.constexpr,
    MAX_SPINS: tl.constexpr,
    ALIGN: tl.constexpr = 1,
    Y_ALIGN: tl.constexpr = 1,
    BLOCK: tl.constexpr = 1024,
    NS: tl.constexpr = 1,
):
    # softmax_split_kernel's chunks and meetings; the chunk streamed three times in BLOCK tiles.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs = x_off + row * stride_x
    g_lo = (xs + ALIGN - 1) // ALIGN
    g_hi = (xs + V) // ALIGN
    c_start = tl.multiple_of((xs // ALIGN) * ALIGN + chunk * CHUNK, ALIGN)
    cols = tl.arange(0, BLOCK)
    grp = cols // ALIGN
    pos, e_mask = _split_edges(xs, chunk, V, ALIGN)
    xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)

    ws_row = WS + row * (3 * P)
    x_row = X + xs
    fcols = tl.arange(0, FALLBACK_BLOCK)
    tag = _launch_tag(ws_row + chunk, P_BLOCK)
    tag_hi = tag << 32

    m_lane = tl.full([BLOCK], -float("inf"), tl.float32)
    for j in tl.range(0, CHUNK, BLOCK, num_stages=NS):
        start = tl.multiple_of(c_start + j, ALIGN)
        x = tl.load(X + start + cols, mask=_group_mask(grp, start, g_lo, g_hi, ALIGN), other=-float("inf"))
        m_lane = _nan_max(m_lane, x.to(tl.float32))
    m_c = _nan_max(_row_max(m_lane, 0), _row_max(xe, 0))
    my_max = _tagged(tag_hi, m_c)
    tl.atomic_xchg(ws_row + chunk, my_max, sem="relaxed")
    m, stale = _meet_floats(ws_row, P, chunk, my_max, tag, False, P_BLOCK, MAX_SPINS)
    if stale > 0:
        m_run = tl.full([FALLBACK_BLOCK], -float("inf"), tl.float32)
        start = 0
        while start < V:
            idx = start + fcols
            m_run = _nan_max(m_run, tl.load(x_row + idx, mask=idx < V, other=-float("inf")).to(tl.float32))
            start += FALLBACK_BLOCK
        m = _row_max(m_run, 0)

    ee = _exp(xe, m, Y.dtype.element_ty)
    s_lane = tl.zeros([BLOCK], tl.int64)
    for j in tl.range(0, CHUNK, BLOCK, num_stages=NS):
        start = tl.multiple_of(c_start + j, ALIGN)
        x = tl.load(X + start + cols, mask=_group_mask(grp, start, g_lo, g_hi, ALIGN), other=-float("inf"))
        s_lane += _fixed(_exp(x.to(tl.float32), m, Y.dtype.element_ty), SCALE)
    s_c = tl.sum(s_lane, axis=0) + tl.sum(_fixed(ee, SCALE), axis=0)
    my_hi, my_lo = _tagged_halves(tag_hi, s_c)
    tl.atomic_xchg(ws_row + P + 2 * chunk, my_hi, sem="relaxed")
    tl.atomic_xchg(ws_row + P + 2 * chunk + 1, my_lo, sem="relaxed")
    s, stale = _meet_sum(ws_row + P, P, chunk, my_hi, my_lo, tag, P_BLOCK, MAX_SPINS)
    if stale > 0:
        s_run = tl.zeros([FALLBACK_BLOCK], tl.int64)
        start = 0
        while start < V:
            idx = start + fcols
            t = tl.load(x_row + idx, mask=idx < V, other=-float("inf")).to(tl.float32)
            s_run += _fixed(_exp(t, m, Y.dtype.element_ty), SCALE)
            start += FALLBACK_BLOCK
        s = tl.sum(s_run, axis=0)

    neg_hi, inv = _softmax_scale(s, SCALE, m)
    shift = tl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
    tl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=e_mask)
    for j in tl.range(0, CHUNK, BLOCK, num_stages=NS):
        start = tl.multiple_of(c_start + j, ALIGN)
        mask = _group_mask(grp, start, g_lo, g_hi, ALIGN)
        x = tl.load(X + start + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
        y = _normalise(_exp(x.to(tl.float32), m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty)
        tl.store(Y + shift + start + cols, y.to(Y.dtype.element_ty), mask=mask)


@_no_value_specialisation
def stream_pipelined_kernel(
    X,
    Y,
    B,
    V,
    stride_x,
    stride_y,
    x_off,
    y_off,
    SCALE,
    BLOCK: tl.constexpr,
    ALIGN: tl.constexpr = 1,
    Y_ALIGN: tl.constexpr = 1,
    NS: tl.constexpr = 1,
):
    # softmax_stream_kernel with its three loops over a row's tiles as pipelined for loops.
    cols = tl.arange(0, BLOCK)
    grp = cols // ALIGN
    e = tl.arange(0, 2 * ALIGN)
    row = tl.program_id(0).to(tl.int64)
    while row < B:
        xs = x_off + row * stride_x
        g_lo = (xs + ALIGN - 1) // ALIGN
        g_hi = (xs + V) // ALIGN
        base = (xs // ALIGN) * ALIGN
        end = g_hi * ALIGN
        pos = tl.where(e < ALIGN, xs + e, end + (e - ALIGN))
        pos_g = pos // ALIGN
        e_mask = (pos >= xs) & (pos < xs + V) & ((pos_g < g_lo) | (pos_g >= g_hi)) & ((e < ALIGN) | (pos >= xs + ALIGN))
        xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)
        n = end - base
        m_lane = tl.full([BLOCK], -float("inf"), tl.float32)
        for j in tl.range(0, n, BLOCK, num_stages=NS):
            start = tl.multiple_of(base + j, ALIGN)
            x = tl.load(X + start + cols, mask=_group_mask(grp, start, g_lo, g_hi, ALIGN), other=-float("inf"))
            m_lane = _nan_max(m_lane, x.to(tl.float32))
        m = _nan_max(_row_max(m_lane, 0), _row_max(xe, 0))
        ee = _exp(xe, m, Y.dtype.element_ty)
        s_lane = tl.zeros([BLOCK], tl.int64)
        for j in tl.range(0, n, BLOCK, num_stages=NS):
            start = tl.multiple_of(base + j, ALIGN)
            x = tl.load(X + start + cols, mask=_group_mask(grp, start, g_lo, g_hi, ALIGN), other=-float("inf"))
            s_lane += _fixed(_exp(x.to(tl.float32), m, Y.dtype.element_ty), SCALE)
        s = tl.sum(s_lane, axis=0) + tl.sum(_fixed(ee, SCALE), axis=0)
        neg_hi, inv = _softmax_scale(s, SCALE, m)
        shift = tl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
        tl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=e_mask)
        for j in tl.range(0, n, BLOCK, num_stages=NS):
            start = tl.multiple_of(base + j, ALIGN)
            mask = _group_mask(grp, start, g_lo, g_hi, ALIGN)
            x = tl.load(X + start + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
            y = _normalise(_exp(x.to(tl.float32), m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty)
            tl.store(Y + shift + start + cols, y.to(Y.dtype.element_ty), mask=mask)
        row += tl.num_programs(0)


_SPLIT, _STREAM = PATH_TABLE["split"], PATH_TABLE["stream"]
ENTRIES = {
    "split": _SPLIT,
    "stream": _STREAM,
    "row": PATH_TABLE["row"],
    "stream_split": dataclasses.replace(
        _SPLIT,
        name="stream_split",
        kernel=stream_split_kernel,
        constexprs=(*_SPLIT.constexprs, "BLOCK", "NS"),
        specialise=lambda p, g, V: {**_SPLIT.specialise(p, g, V), "BLOCK": p["BLOCK"], "NS": p["NS"]},
    ),
    "stream_pipelined": dataclasses.replace(
        _STREAM,
        name="stream_pipelined",
        kernel=stream_pipelined_kernel,
        constexprs=(*_STREAM.constexprs, "NS"),
        specialise=lambda p, g, V: {**_STREAM.specialise(p, g, V), "NS": p["NS"]},
    ),
}


def run_entry(x: torch.Tensor, entry: str, *, out: torch.Tensor, **params) -> torch.Tensor:
    dev = -1 if DEV == "cpu" else x.get_device()
    sms = None if DEV == "cpu" else torch.cuda.get_device_properties(dev).multi_processor_count
    ENTRIES[entry].bind(x, out, params, dev=dev, sms=sms)()
    return out


ROUNDS = 20
SHAPES = (
    (4096, 16384), (1024, 16384), (32768, 16384), (4096, 8192),
    (4096, 32000), (8192, 50257), (4096, 128256), (4096, 262144), (1024, 262144),
)  # fmt: skip
SMOKE_SHAPES = ((8, 200), (8, 700), (4, 1500), (6, 3000))


def variants(dtype, B: int, V: int) -> list[tuple[str, str, dict]]:
    """(name, entry, params) at (B, V): the current paths as controls, then the variants."""
    half = dtype != torch.float32
    if SMOKE:
        if V <= 256:
            return [("row nw4", "row", {"BLOCK": 256, "num_warps": 4})]
        return [
            ("split 128x4", "split", {"CHUNK": 128, "num_warps": 4}),
            ("ssplit 256/64 ns1", "stream_split", {"CHUNK": 256, "num_warps": 4, "BLOCK": 64, "NS": 1}),
            ("ssplit 512/128 ns3", "stream_split", {"CHUNK": 512, "num_warps": 4, "BLOCK": 128, "NS": 3}),
            ("streamp 256 ns2", "stream_pipelined", {"BLOCK": 256, "num_warps": 4, "programs_per_sm": 2, "NS": 2}),
        ]
    out = []
    if V <= 16384:
        block = triton.next_power_of_2(V)
        for warps in (8, 16, 32):
            out.append((f"row nw{warps}", "row", {"BLOCK": block, "num_warps": warps}))
        return out
    out.append(("split 8192x4 r128", "split", dict(dispatch.SPLIT_PARAMS)))
    if half:
        out.append(("split 8192x4 r80", "split", {**dispatch.SPLIT_PARAMS, "maxnreg": 80}))
    out.append(("stream 4096x16 8/SM", "stream", {"BLOCK": 4096, "num_warps": 16, "programs_per_sm": 8}))
    for block, warps, pps, ns in ((4096, 16, 4, 3), (2048, 8, 8, 3), (4096, 8, 4, 4), (2048, 4, 8, 4)):
        out.append(
            (
                f"streamp {block}x{warps} {pps}/SM ns{ns}",
                "stream_pipelined",
                {"BLOCK": block, "num_warps": warps, "programs_per_sm": pps, "NS": ns},
            )
        )
    for chunk, block, warps, ns in (
        (16384, 2048, 4, 3),
        (16384, 2048, 8, 3),
        (32768, 4096, 8, 3),
        (8192, 1024, 4, 4),
        (16384, 1024, 4, 4),
        (32768, 2048, 8, 4),
    ):
        out.append(
            (
                f"ssplit {chunk}/{block}x{warps} ns{ns}",
                "stream_split",
                {"CHUNK": chunk, "num_warps": warps, "BLOCK": block, "NS": ns},
            )
        )
    return out


def aot() -> list[dict]:
    """sm_90 builds of the variants at V = 262144: registers, spills, shared memory, and whether
    the loads went through shared memory (cp.async or bulk copies in the PTX)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.triton_build import build

    records = []
    for dtype, tdtype, es in (("bf16", torch.bfloat16, 2), ("fp32", torch.float32, 4)):
        for name, entry, p in variants(tdtype, 4096, 262144):
            e = ENTRIES[entry]
            a = e.aot(p, 262144, dtype, es)
            o = dict(a["options"])
            r = build(
                name,
                e.kernel,
                dtype,
                a["constexprs"],
                o.pop("num_warps"),
                sig=a["signature"],
                maxnreg=o.pop("maxnreg", None),
                aligned=a["aligned"],
            )
            attrs = {(i,): [["tt.divisibility", 16]] for i in a["aligned"]}
            src = ASTSource(fn=e.kernel, signature=a["signature"], constexprs=a["constexprs"], attrs=attrs)
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=a["options"]).asm["ptx"]
            r["cp_async"] = len(re.findall(r"cp\.async", ptx))
            r["bulk"] = len(re.findall(r"cp\.async\.bulk", ptx))
            records.append({"dtype": dtype, **r})
            print(json.dumps(records[-1]), flush=True)
    return records


def timed_comparison(args) -> int:
    from tests.helpers import dtype_id

    sms = 4 if SMOKE else torch.cuda.get_device_properties(0).multi_processor_count
    shapes = SMOKE_SHAPES if SMOKE else SHAPES
    dtypes = tuple(getattr(torch, d) for d in args.dtypes.split(","))
    copy_tbps = h16.copy_ceiling()
    print(f"copy ceiling {copy_tbps:.3f} TB/s", flush=True)
    rows, failures = [], []
    t_start = time.time()
    for dtype in dtypes:
        for B, V in shapes:
            if V <= 16384 and not SMOKE and dtype == torch.float32:
                continue  # the row-warps question is a 16-bit one
            g = torch.Generator(device=DEV).manual_seed(V + B)
            x = (torch.randn(B, V, device=DEV, generator=g) * 3).to(dtype)
            x[:, 7] = 30.0
            x[:, 3::1000] = -float("inf")
            y_disp = torch.empty_like(x)
            fns = [
                ("F.softmax", None, lambda x=x: F.softmax(x, dim=-1), None),
                ("dispatch", st.plan(B, V, dtype), lambda x=x, y=y_disp: st.softmax(x, out=y), y_disp),
            ]
            for name, entry, p in variants(dtype, B, V):
                y = torch.empty_like(x)
                fns.append((name, p, lambda x=x, y=y, e=entry, p=p: run_entry(x, e, out=y, **p), y))
            times = h16.timed_rounds([(fn, y) for *_, fn, y in fns], 2 if SMOKE else ROUNDS)
            what = f"{dtype_id(dtype)} B={B} V={V}"
            sample = sorted({0, B // 2, B - 1})
            err = h16.check_close(y_disp[sample], x[sample])
            if err:
                failures.append(f"{what} dispatch: {err}")
            meds = {}
            for (name, p, _, y), t in zip(fns, times, strict=True):
                med = sorted(t)[len(t) // 2]
                meds[name] = med
                bits = None
                if y is not None and name != "dispatch":
                    bits = bool(torch.equal(h16.bits_of(y), h16.bits_of(y_disp)))
                    if not bits:
                        failures.append(f"{what} {name}: bits differ from the dispatch")
                if y is not None and bool(torch.isnan(y).any()):
                    failures.append(f"{what} {name}: NaN left in the output")
                frac = 2 * B * V * x.element_size() / (med * 1e-6) / 1e12 / copy_tbps
                rows.append(
                    {
                        "dtype": dtype_id(dtype),
                        "B": B,
                        "V": V,
                        "name": name,
                        "params": p,
                        "median_us": round(med, 2),
                        "min_us": round(min(t), 2),
                        "max_us": round(max(t), 2),
                        "frac_of_copy": round(frac, 3),
                        "x_F_softmax": round(meds["F.softmax"] / med, 3),
                        "bits_equal_dispatch": bits,
                    }
                )
            print(f"done {what} at {time.time() - t_start:.0f} s", flush=True)
            result = {
                "what": "Triton long rows streamed (reports/probes/triton_split_stream.py)",
                "device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(),
                "sms": sms,
                "versions": {"torch": torch.__version__, "triton": triton.__version__},
                "method": "as reports/probes/triton_hold16.py: device time, CUDA events, interleaved rounds, "
                f"output NaN-filled and L2 flushed before every launch, median of {ROUNDS}",
                "copy_TBps": round(copy_tbps, 4),
                "failures": failures,
                "rows": rows,
            }
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "triton_split_stream.json").write_text(json.dumps(result, indent=1))
            del x, fns, y_disp
            if DEV == "cuda":
                torch.cuda.empty_cache()
    print(f"\nfailures: {len(failures)}")
    for f in failures[:30]:
        print("  ", f)
    print(f"\ncopy {copy_tbps:.3f} TB/s; per shape: fraction of copy (x F.softmax)")
    last = None
    for r in rows:
        if (r["dtype"], r["B"], r["V"]) != last:
            last = (r["dtype"], r["B"], r["V"])
            print(f"{r['dtype']} B={r['B']} V={r['V']}")
        print(
            f"   {r['name']:<28} {r['median_us']:>9.1f} us  {r['frac_of_copy']:.3f} ({r['x_F_softmax']:.2f}x)"
            + ("" if r["bits_equal_dispatch"] in (None, True) else " BITS DIFFER")
        )
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--aot", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--one", nargs=4, metavar=("NAME", "DTYPE", "B", "V"), help="three launches, for ncu")
    args = ap.parse_args()
    if args.one:
        name, dtype, B, V = args.one[0], getattr(torch, args.one[1]), int(args.one[2]), int(args.one[3])
        x = (torch.randn(B, V, device=DEV) * 3).to(dtype)
        y = torch.empty_like(x)
        entry, p = next((e, p) for n, e, p in variants(dtype, B, V) if n == name)
        for _ in range(3):
            run_entry(x, entry, out=y, **p)
        torch.cuda.synchronize()
        return 0
    if args.aot:
        aot()
        return 0
    return timed_comparison(args)


if __name__ == "__main__":
    sys.exit(main())
