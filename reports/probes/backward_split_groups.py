"""The softmax backward's split with its chunks cut on 16-byte groups: vector accesses at any V.

    python reports/probes/backward_split_groups.py --cpu-bits   # against the dispatch, interpreted
    python reports/probes/backward_split_groups.py --aot        # sm_90 builds: registers, spills, vectors
    python reports/probes/backward_split_groups.py --out DIR    # on a GPU: timed against the dispatch

The question. The training split kernels index a row from its start, so Triton vectorises
their accesses only where the pointers, the row strides and V are all divisible by 16. At an odd
V they move a row element by element: the backward's split ran at 0.25-0.45 of its floor at
(4096, 50257 / 128257), against 0.48-0.72 at V = 128256 (reports/profiles.md, "Rows not 16-byte
aligned"). The forward's split cuts its chunks on 16-byte groups of the row's aligned base view
and has chunk 0 move the partial groups at the row's two ends (at most 2 (ALIGN - 1) elements)
one by one. Does the same cut bring odd rows to the aligned rows' speed?

`backward_split_groups_kernel` is the dispatch's split kernel (kernels/triton_loss_kernels.py:
the same terms, the same two meetings through the same helpers) with that cut, so its bits must
be the dispatch's; --cpu-bits checks that on rows of odd and even V in every layout the suite
uses, edge rows included. Rows whose dy, y and dx do not share their offset within a 16-byte
group (and their strides modulo it) take ALIGN = 1, the dispatch's own access pattern.

On a GPU this times, in graph replay (L2 flushed, interleaved rounds), the dispatch and the
group cut at CHUNK x num_warps x register cap, and writes DIR/backward_split_groups.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

CPU_BITS = "--cpu-bits" in sys.argv
if CPU_BITS:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton_rows_sweep import bits, copy_TBps, graph_times_us  # noqa: E402

from kernels import triton_backward as tb  # noqa: E402
from kernels.spec import matrix_bytes  # noqa: E402
from kernels.triton_dispatch import (  # noqa: E402
    INTERPRET,
    SPLIT_MAX_SPINS,
    aligned_base,
    checked_p_block,
    fixed_point_bits,
    p_block,
)
from kernels.triton_kernels import _launch_tag, _split_chunk, _split_edges  # noqa: E402
from kernels.triton_loss_kernels import (  # noqa: E402
    _backward_meet_scale,
    _backward_meet_sum,
    _finite_abs,
    _fixed_finite,
    _non_finite,
)

SHAPES = "4096x50257,4096x128257,4096x128256,1024x50257"
VARIANTS = "4096x4x128,4096x8x128,4096x4x168,8192x8x128"  # CHUNK x num_warps x maxnreg


@triton.jit
def backward_split_groups_kernel(
    DY, Y, DX, WS, V, P, stride_dy, stride_y, stride_dx, y_off, dy_off, dx_off, K,
    CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    # Offsets count from Y's aligned base: row r starts at ys; dy and dx sit sh_dy and sh_dx
    # elements from y's element of the same column, multiples of ALIGN (the wrapper checks).
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    ys = y_off + row * stride_y
    sh_dy = tl.multiple_of(dy_off + row * stride_dy - ys, ALIGN)
    sh_dx = tl.multiple_of(dx_off + row * stride_dx - ys, ALIGN)
    c_start, mask = _split_chunk(ys, chunk, V, CHUNK, ALIGN)
    offs = c_start + tl.arange(0, CHUNK)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + sh_dy + offs, mask=mask, other=0.0).to(tl.float32)
    pos, e_mask = _split_edges(ys, chunk, V, ALIGN)
    ye = tl.load(Y + pos, mask=e_mask, other=0.0).to(tl.float32)
    dye = tl.load(DY + sh_dy + pos, mask=e_mask, other=0.0).to(tl.float32)
    t = y * dy
    te = ye * dye
    y_row = Y + ys
    dy_row = DY + sh_dy + ys
    ws = WS + row * (4 * P)
    tag = _launch_tag(ws + chunk, P_BLOCK)
    a_c = tl.maximum(tl.max(_finite_abs(t), axis=0), tl.max(_finite_abs(te), axis=0))
    f_c = tl.sum(_non_finite(t), axis=0) + tl.sum(_non_finite(te), axis=0)
    up, down, F = _backward_meet_scale(ws, P, chunk, tag, a_c, f_c, y_row, dy_row, V, K,
                                       P_BLOCK, FALLBACK_BLOCK, MAX_SPINS)  # fmt: skip
    s_c = tl.sum(_fixed_finite(t, up), axis=0) + tl.sum(_fixed_finite(te, up), axis=0)
    S = _backward_meet_sum(ws, P, chunk, tag, s_c, up, y_row, dy_row, V, P_BLOCK, FALLBACK_BLOCK, MAX_SPINS)
    s = S.to(tl.float32) * down + F
    tl.store(DX + sh_dx + offs, (y * (dy - s)).to(DX.dtype.element_ty), mask=mask)
    tl.store(DX + sh_dx + pos, (ye * (dye - s)).to(DX.dtype.element_ty), mask=e_mask)


_workspaces: dict = {}
_grouped = []  # ALIGN of each launch (--cpu-bits reports how many cut on groups)


def layout(dy, y, dx, CHUNK: int) -> dict:
    """The launch's views and geometry: each tensor's aligned base and head, ALIGN (1 where the
    three rows are not in step within a 16-byte group) and P."""
    a = 16 // y.element_size()
    (dyb, dyo), (yb, yo), (dxb, dxo) = (aligned_base(t, a) for t in (dy, y, dx))
    in_step = all((o - yo) % a == 0 and (t.stride(0) - y.stride(0)) % a == 0 for t, o in ((dy, dyo), (dx, dxo)))
    if not in_step:
        a, (dyb, dyo), (yb, yo), (dxb, dxo) = 1, (dy, 0), (y, 0), (dx, 0)
    V = y.shape[1]
    head = yo % a if y.stride(0) % a == 0 else a - 1
    P = triton.cdiv(V + head, CHUNK)
    return {"DY": dyb, "Y": yb, "DX": dxb, "y_off": yo, "dy_off": dyo, "dx_off": dxo, "ALIGN": a, "P": P}


def split_groups(dy, y, *, CHUNK=4096, num_warps=4, maxnreg=None, P_BLOCK=None):
    """softmax_backward(dy, y) through backward_split_groups_kernel: dx new and contiguous."""
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    y = y if y.stride(1) == 1 else y.contiguous()
    B, V = y.shape
    dx = torch.empty(B, V, dtype=y.dtype, device=y.device)
    g = layout(dy, y, dx, CHUNK)
    P = g.pop("P")
    _grouped.append(g["ALIGN"])
    key = (y.device, B, P)
    if key not in _workspaces:  # tagged words: zeroed once, one workspace per P (as the dispatch's)
        _workspaces[key] = torch.zeros(max(B, 64) * 4 * P, dtype=torch.int64, device=y.device)
    pb = checked_p_block(P_BLOCK or p_block(P, num_warps), num_warps)
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg and not INTERPRET else {})}
    backward_split_groups_kernel[(B * P,)](
        g["DY"], g["Y"], g["DX"], _workspaces[key], V, P, dy.stride(0), y.stride(0), dx.stride(0),
        g["y_off"], g["dy_off"], g["dx_off"], fixed_point_bits(V),
        CHUNK=CHUNK, P_BLOCK=pb, FALLBACK_BLOCK=min(CHUNK, 1024), MAX_SPINS=0 if INTERPRET else SPLIT_MAX_SPINS,
        ALIGN=g["ALIGN"], **options,
    )  # fmt: skip
    return dx


def cpu_bits() -> int:
    """The group cut against the dispatch, interpreted: odd and even V, every layout of dy and
    of y, chunks of 16 and 32 (several programs a row, partial groups at both ends)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.helpers import layouts, logits, place

    failures, runs = [], 0
    for dtype in (torch.float32, torch.bfloat16):
        for B, V in ((3, 37), (4, 101), (2, 64)):
            y0 = torch.softmax(logits(B, V, seed=V), dim=-1).to(dtype)
            dy0 = logits(B, V, seed=V + 1, neg_inf=False, scale=2.0).to(dtype)
            dy0[1, 3] = float("inf")  # a non-finite term in one row
            want = bits(tb.softmax_backward(dy0, y0))
            for which in ("dy", "y"):
                for lay in layouts(dtype):
                    dy = place(dy0, lay) if which == "dy" else dy0
                    y = place(y0, lay) if which == "y" else y0
                    for chunk in (16, 32):
                        got = bits(split_groups(dy, y, CHUNK=chunk, num_warps=1, P_BLOCK=2))
                        runs += 1
                        if not torch.equal(got, want):
                            failures.append(f"{dtype} ({B}, {V}) {which} {lay} CHUNK {chunk}")
    grouped = sum(a > 1 for a in _grouped)
    print(f"{runs - len(failures)} of {runs} runs give the dispatch's bits ({grouped} cut on groups of 4 or 8)")
    for f in failures:
        print("  differs:", f)
    return 1 if failures or not grouped else 0


def aot() -> int:
    """sm_90 builds (no GPU needed) at odd V, as launched on contiguous rows from aligned
    allocations (pointers divisible by 16, V and strides not): registers, spills, vectors."""
    from kernels.triton_build import build

    ints = ("V", "P", "stride_dy", "stride_y", "stride_dx", "y_off", "dy_off", "dx_off", "K")
    for dtype, a in (("fp32", 4), ("bf16", 8)):
        pointers = {"DY": f"*{dtype}", "Y": f"*{dtype}", "DX": f"*{dtype}", "WS": "*i64"}
        for chunk, warps, cap in (tuple(int(v) for v in item.split("x")) for item in VARIANTS.split(",")):
            P = triton.cdiv(262145 + a - 1, chunk)
            constexprs = {"CHUNK": chunk, "P_BLOCK": p_block(P, warps), "FALLBACK_BLOCK": min(chunk, 1024),
                          "MAX_SPINS": SPLIT_MAX_SPINS, "ALIGN": a}  # fmt: skip
            signature = pointers | dict.fromkeys(ints, "i32") | dict.fromkeys(constexprs, "constexpr")
            r = build(f"groups {dtype}", backward_split_groups_kernel, dtype, constexprs, warps,
                      sig=signature, aligned=(0, 1, 2, 3), maxnreg=cap)  # fmt: skip
            print(f"{dtype} {chunk}x{warps}x{cap}: {r['regs']} registers, stack {r['stack']} bytes, spill "
                  f"{r['spill_bytes']} bytes (stores and loads), vector loads {r['vector_loads']}, "
                  f"vector stores {r['vector_stores']}")  # fmt: skip
    return 0


def timed(out: Path, shapes: str, variants: str) -> None:
    copy = copy_TBps()
    rows = []
    for item in shapes.split(","):
        B, V = (int(v) for v in item.split("x"))
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(V)
            y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
            dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
            want = bits(tb.softmax_backward(dy, y))
            calls = {f"dispatch ({tb.plan(B, V, dtype)})": lambda dy=dy, y=y: tb.softmax_backward(dy, y)}
            same = {}
            for v in variants.split(","):
                chunk, warps, cap = (int(n) for n in v.split("x"))
                params = {"CHUNK": chunk, "num_warps": warps, "maxnreg": cap}
                same[f"groups {v}"] = bool(torch.equal(bits(split_groups(dy, y, **params)), want))
                calls[f"groups {v}"] = lambda dy=dy, y=y, params=params: split_groups(dy, y, **params)
            times = graph_times_us(list(calls.values()))
            floor = matrix_bytes(B, V, str(dtype).removeprefix("torch."), passes=3) / (copy * 1e12) * 1e6
            for name, ts in zip(calls, times, strict=True):
                us = statistics.median(ts)
                rows.append({"B": B, "V": V, "dtype": str(dtype), "variant": name, "us": us,
                             "of_floor": floor / us, "bits": same.get(name, True)})  # fmt: skip
                print(f"{str(dtype):<15} ({B}, {V}) {name:<28} {us:9.1f} us {floor / us:.3f} of floor"
                      f"{'' if same.get(name, True) else '  BITS DIFFER'}", flush=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "backward_split_groups.json").write_text(json.dumps({"copy_TBps": copy, "rows": rows}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu-bits", action="store_true")
    mode.add_argument("--aot", action="store_true")
    mode.add_argument("--out", type=Path)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--variants", default=VARIANTS)
    args = ap.parse_args()
    if args.cpu_bits:
        return cpu_bits()
    if args.aot:
        return aot()
    timed(args.out, args.shapes, args.variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
