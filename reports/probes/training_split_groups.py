"""The training split kernels with their chunks cut on 16-byte groups: vector accesses at any V.

    python reports/probes/training_split_groups.py --cpu-bits   # against the dispatch, interpreted
    python reports/probes/training_split_groups.py --aot        # sm_90 builds: registers, spills, vectors
    python reports/probes/training_split_groups.py --out DIR [--ops bwd,ce]   # on a GPU: timed

The question. The training split kernels index a row from its start, so Triton vectorises
their accesses only where the pointers, the row strides and V are all divisible by 16. At an odd
V they move a row element by element: at (4096, 50257 / 128257) the backward's split ran at
0.25-0.45 of its floor and the cross-entropy's at 0.18-0.29, against 0.43-0.72 at V = 128256
(reports/profiles.md, "Rows not 16-byte aligned"). The forward's split cuts its chunks on
16-byte groups of the row's aligned base view and has chunk 0 move the partial groups at the
row's two ends (at most 2 (ALIGN - 1) elements) one by one. Does the same cut bring odd rows to
the aligned rows' speed?

`backward_split_groups_kernel` and `cross_entropy_split_groups_kernel` are the dispatch's split
kernels (kernels/triton_loss_kernels.py: the same terms, the same meetings through the same
helpers) with that cut, so their bits must be the dispatch's; --cpu-bits checks that on rows of
odd and even V in every layout the suite uses, the cross-entropy's edge rows with and without
class weights and smoothing included. Rows whose tensors do not share their offset within a
16-byte group (and their strides modulo it) take ALIGN = 1, the dispatch's own access pattern.

On a GPU this times, in graph replay (L2 flushed, interleaved rounds), the dispatch and the
group cut at CHUNK x num_warps x register cap, and writes DIR/training_split_groups.json.
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
from kernels import triton_cross_entropy as tce  # noqa: E402
from kernels.spec import matrix_bytes  # noqa: E402
from kernels.triton_dispatch import (  # noqa: E402
    INTERPRET,
    SPLIT_MAX_SPINS,
    aligned_base,
    checked_p_block,
    fixed_point_bits,
    p_block,
)
from kernels.triton_kernels import _exp, _fixed, _launch_tag, _nan_max, _split_chunk, _split_edges  # noqa: E402
from kernels.triton_launch import launch_entry  # noqa: E402
from kernels.triton_loss_kernels import (  # noqa: E402
    INF,
    _backward_meet_scale,
    _backward_meet_sum,
    _ce_gradient,
    _ce_meet_extremes,
    _ce_meet_sums,
    _ce_row_outputs,
    _finite_abs,
    _fixed_finite,
    _fixed_point_scale,
    _non_finite,
)

SHAPES = "4096x50257,4096x128257,4096x128256,1024x50257"
VARIANTS = "4096x4x128,4096x8x128,4096x4x168,8192x8x80,8192x4x128"  # CHUNK x num_warps x maxnreg


@triton.jit
def _group_cut(off, row, stride, chunk, V, CHUNK: tl.constexpr, ALIGN: tl.constexpr):
    # Where chunk `chunk` of row `row` falls, from a base view `off` elements before row 0: the
    # row's start, the chunk's offsets over whole 16-byte groups and their mask, and (chunk 0
    # only) the row's partial groups at both ends, element by element, and their mask.
    start = off + row * stride
    c_start, mask = _split_chunk(start, chunk, V, CHUNK, ALIGN)
    pos, e_mask = _split_edges(start, chunk, V, ALIGN)
    return start, c_start + tl.arange(0, CHUNK), mask, pos, e_mask


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
    ys, offs, mask, pos, e_mask = _group_cut(y_off, row, stride_y, chunk, V, CHUNK, ALIGN)
    sh_dy = tl.multiple_of(dy_off + row * stride_dy - ys, ALIGN)
    sh_dx = tl.multiple_of(dx_off + row * stride_dx - ys, ALIGN)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + sh_dy + offs, mask=mask, other=0.0).to(tl.float32)
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


@triton.jit
def cross_entropy_split_groups_kernel(
    X, T, W, G, LOSS, LSE, PREP, WS, V, P, stride_x, stride_g, x_off, g_off, ignore_index, eps, inv_v, KW,
    SCALE, CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    # The cut of backward_split_groups_kernel on the dispatch's cross-entropy split: offsets
    # count from X's aligned base (row r starts at xs), the gradient sits sh_g from its logit.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs, offs, mask, pos, e_mask = _group_cut(x_off, row, stride_x, chunk, V, CHUNK, ALIGN)
    sh_g = tl.multiple_of(g_off + row * stride_g - xs, ALIGN)
    cols = offs - xs
    e_cols = pos - xs
    t = tl.load(T + row).to(tl.int64)
    ignored = t == ignore_index
    valid = (t != ignore_index) & (t >= 0) & (t < V)
    t_safe = tl.where(valid, t, 0)
    if HAS_WEIGHT:
        w_t = tl.load(W + t_safe).to(tl.float32)
        w_j = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        w_e = tl.load(W + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        w_all = tl.load(PREP + 0)
    else:
        w_t = 1.0
        w_j = tl.where(mask, 1.0, 0.0)
        w_e = tl.where(e_mask, 1.0, 0.0)
        w_all = V * 1.0
    x = tl.load(X + offs, mask=mask, other=-INF).to(tl.float32)
    xe = tl.load(X + pos, mask=e_mask, other=-INF).to(tl.float32)
    x_row = X + xs
    ws = WS + row * (7 * P)
    tag = _launch_tag(ws + chunk, P_BLOCK)
    neg_mn = tl.zeros([], tl.float32)
    if HAS_SMOOTHING:
        neg_mn = -tl.minimum(tl.min(tl.where(mask, x, INF), axis=0), tl.min(tl.where(e_mask, xe, INF), axis=0))
    m_c = _nan_max(tl.reduce(x, 0, _nan_max), tl.reduce(xe, 0, _nan_max))
    m, mn = _ce_meet_extremes(ws, P, chunk, tag, m_c, neg_mn, x_row, V, P_BLOCK, FALLBACK_BLOCK, MAX_SPINS,
                              HAS_SMOOTHING)  # fmt: skip
    up = 1.0
    if HAS_SMOOTHING:
        up, down = _fixed_point_scale(tl.load(PREP + 3) * (m - mn), KW)
    e = _exp(x, m, G.dtype.element_ty)
    ee = _exp(xe, m, G.dtype.element_ty)
    s_c = tl.sum((e * SCALE).to(tl.int64), axis=0) + tl.sum((ee * SCALE).to(tl.int64), axis=0)
    q_c = tl.zeros([], tl.int64)
    f_c = tl.zeros([], tl.float32)
    if HAS_SMOOTHING:
        wd = tl.where(mask, w_j * (x - m), 0.0)
        wde = tl.where(e_mask, w_e * (xe - m), 0.0)
        q_c = tl.sum(_fixed_finite(wd, up), axis=0) + tl.sum(_fixed_finite(wde, up), axis=0)
        f_c = tl.sum(_non_finite(wd), axis=0) + tl.sum(_non_finite(wde), axis=0)
    S_fix, Q_fix, F = _ce_meet_sums(ws, P, chunk, tag, s_c, q_c, f_c, x_row, W, m, up, V, SCALE, G.dtype.element_ty,
                                    P_BLOCK, FALLBACK_BLOCK, MAX_SPINS, HAS_WEIGHT, HAS_SMOOTHING)  # fmt: skip
    x_t = tl.load(x_row + t_safe).to(tl.float32)
    E_t = _fixed(_exp(x_t, m, G.dtype.element_ty), SCALE)
    q = 0.0
    if HAS_SMOOTHING:
        q = Q_fix.to(tl.float32) * down + F
    lse, loss, fin = _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, q, eps, inv_v, ignored, valid, HAS_SMOOTHING)
    if chunk == row % P:
        tl.store(LSE + row, lse)
        tl.store(LOSS + row, loss)
    g = _ce_gradient(e, S_fix, E_t, SCALE, fin, cols, t_safe, w_t, w_all, w_j, eps, inv_v, PREP, ignored, valid,
                     G.dtype.element_ty, HAS_SMOOTHING)  # fmt: skip
    tl.store(G + sh_g + offs, g.to(G.dtype.element_ty), mask=mask)
    ge = _ce_gradient(ee, S_fix, E_t, SCALE, fin, e_cols, t_safe, w_t, w_all, w_e, eps, inv_v, PREP, ignored, valid,
                      G.dtype.element_ty, HAS_SMOOTHING)  # fmt: skip
    tl.store(G + sh_g + pos, ge.to(G.dtype.element_ty), mask=e_mask)


_workspaces: dict = {}
_grouped = []  # ALIGN of each launch (--cpu-bits reports how many cut on groups)


def layout(ref, *others, CHUNK: int) -> dict:
    """Where the cut falls: the aligned base view and head of `ref` (whose row starts define the
    groups) and of each of `others`, ALIGN (1 where their rows are not in step with ref's within
    a 16-byte group), and P."""
    a = 16 // ref.element_size()
    views = [aligned_base(t, a) for t in (ref, *others)]
    in_step = all((o - views[0][1]) % a == 0 and (t.stride(0) - ref.stride(0)) % a == 0
                  for t, (_, o) in zip(others, views[1:], strict=True))  # fmt: skip
    if not in_step:
        a, views = 1, [(t, 0) for t in (ref, *others)]
    head = views[0][1] % a if ref.stride(0) % a == 0 else a - 1
    _grouped.append(a)
    return {"views": views, "ALIGN": a, "P": triton.cdiv(ref.shape[1] + head, CHUNK)}


def _launch_options(P, CHUNK, num_warps, maxnreg, P_BLOCK, device, B, words):
    key = (device, words, B, P)
    if key not in _workspaces:  # tagged words: zeroed once, one workspace per P (as the dispatch's)
        _workspaces[key] = torch.zeros(max(B, 64) * words * P, dtype=torch.int64, device=device)
    constexprs = {"CHUNK": CHUNK, "P_BLOCK": checked_p_block(P_BLOCK or p_block(P, num_warps), num_warps),
                  "FALLBACK_BLOCK": min(CHUNK, 1024), "MAX_SPINS": 0 if INTERPRET else SPLIT_MAX_SPINS}  # fmt: skip
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg and not INTERPRET else {})}
    return _workspaces[key], {**constexprs, **options}


def backward_groups(dy, y, *, CHUNK=4096, num_warps=4, maxnreg=None, P_BLOCK=None):
    """softmax_backward(dy, y) through backward_split_groups_kernel: dx new and contiguous."""
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    y = y if y.stride(1) == 1 else y.contiguous()
    B, V = y.shape
    dx = torch.empty(B, V, dtype=y.dtype, device=y.device)
    g = layout(y, dy, dx, CHUNK=CHUNK)
    (yb, yo), (dyb, dyo), (dxb, dxo) = g["views"]
    P = g["P"]
    ws, kw = _launch_options(P, CHUNK, num_warps, maxnreg, P_BLOCK, y.device, B, 4)
    backward_split_groups_kernel[(B * P,)](
        dyb, yb, dxb, ws, V, P, dy.stride(0), y.stride(0), dx.stride(0), yo, dyo, dxo, fixed_point_bits(V),
        ALIGN=g["ALIGN"], **kw,
    )  # fmt: skip
    return dx


def cross_entropy_groups(x, t, *, weight=None, label_smoothing=0.0, ignore_index=-100, reduction="none",
                         CHUNK=4096, num_warps=4, maxnreg=None, P_BLOCK=None):  # fmt: skip
    """(per-row loss in float32, lse, gradient) of F.cross_entropy(x, t, ...) through the dispatch's
    prep kernel and cross_entropy_split_groups_kernel; the gradient as the dispatch scales it
    for `reduction`."""
    x = x if x.stride(1) == 1 else x.contiguous()
    N, V = x.shape
    grad = torch.empty(N, V, dtype=x.dtype, device=x.device)
    lse = torch.empty(N, dtype=torch.float32, device=x.device)
    loss = torch.empty(N, dtype=torch.float32, device=x.device)
    prep = torch.empty(4, dtype=torch.float32, device=x.device)
    bad = torch.empty(3, dtype=torch.int64, device=x.device)
    w = weight if weight is not None else lse
    flags = {"HAS_WEIGHT": weight is not None, "MEAN": reduction == "mean"}
    KN, KV = fixed_point_bits(N), fixed_point_bits(V)
    values = {
        "T": t,
        "W": w,
        "PREP": prep,
        "BAD": bad,
        "N": N,
        "V": V,
        "ignore_index": ignore_index,
        "KN": KN,
        "KV": KV,
    }
    dev = -1 if INTERPRET else x.get_device()
    launch_entry("cross_entropy", "prep", values, {**tb.launch_params("prep", V), **flags}, V, 1, dev)
    g = layout(x, grad, CHUNK=CHUNK)
    (xb, xo), (gb, go) = g["views"]
    P = g["P"]
    ws, kw = _launch_options(P, CHUNK, num_warps, maxnreg, P_BLOCK, x.device, N, 7)
    cross_entropy_split_groups_kernel[(N * P,)](
        xb, t, w, gb, loss, lse, prep, ws, V, P, x.stride(0), grad.stride(0), xo, go, ignore_index,
        float(label_smoothing), 1.0 / V, KV, float(2.0**KV), ALIGN=g["ALIGN"], HAS_WEIGHT=weight is not None,
        HAS_SMOOTHING=float(label_smoothing) > 0.0, **kw,
    )  # fmt: skip
    return loss, lse, grad


def cpu_bits() -> int:
    """The group cut against the dispatch, interpreted: odd and even V, every layout of the
    inputs, chunks of 16 and 32 (several programs a row, partial groups at both ends); for the
    cross-entropy its edge rows, with and without class weights and smoothing."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.helpers import edge_rows, layouts, logits, place

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
                        got = bits(backward_groups(dy, y, CHUNK=chunk, num_warps=1, P_BLOCK=2))
                        runs += 1
                        if not torch.equal(got, want):
                            failures.append(f"backward {dtype} ({B}, {V}) {which} {lay} CHUNK {chunk}")
        for V in (37, 101, 64):
            x0, t = edge_rows(V, seed=V, dtype=dtype)
            weight = (0.5 + torch.rand(V, generator=torch.Generator().manual_seed(V))).to(dtype)
            for options in ({}, {"weight": weight, "label_smoothing": 0.1}, {"label_smoothing": 0.2}):
                for reduction in ("none", "mean"):
                    ref = tce.cross_entropy(x0, t, reduction=reduction, validate=False, **options)
                    for lay in layouts(dtype):
                        for chunk in (16, 32):
                            loss, lse, grad = cross_entropy_groups(
                                place(x0, lay), t, reduction=reduction, CHUNK=chunk, num_warps=1, P_BLOCK=2,
                                **options,
                            )  # fmt: skip
                            same = torch.equal(bits(grad), bits(ref.grad)) and torch.equal(bits(lse), bits(ref.lse))
                            if reduction == "none":
                                same = same and torch.equal(bits(loss.to(dtype)), bits(ref.loss))
                            runs += 1
                            if not same:
                                failures.append(f"cross-entropy {dtype} V={V} {sorted(options)} {reduction} {lay} "
                                                f"CHUNK {chunk}")  # fmt: skip
    grouped = sum(a > 1 for a in _grouped)
    print(f"{runs - len(failures)} of {runs} runs give the dispatch's bits ({grouped} cut on groups of 4 or 8)")
    for f in failures:
        print("  differs:", f)
    return 1 if failures or not grouped else 0


def aot() -> int:
    """sm_90 builds (no GPU needed) at odd V, as launched on contiguous rows from aligned
    allocations (pointers divisible by 16, V and strides not): registers, spills, vectors."""
    from kernels.triton_build import build

    kernels = {
        "bwd": (backward_split_groups_kernel, ("DY", "Y", "DX", "WS"), 4, {},
                ("V", "P", "stride_dy", "stride_y", "stride_dx", "y_off", "dy_off", "dx_off", "K")),
        "ce": (cross_entropy_split_groups_kernel, ("X", "T:i64", "W", "G", "LOSS:fp32", "LSE:fp32", "PREP:fp32", "WS"),
               7, {"HAS_WEIGHT": False, "HAS_SMOOTHING": False},
               ("V", "P", "stride_x", "stride_g", "x_off", "g_off", "ignore_index", "eps:fp32", "inv_v:fp32", "KW",
                "SCALE:fp32")),
    }  # fmt: skip
    for op, (kernel, pointers, _, flags, scalars) in kernels.items():
        for dtype, a in (("fp32", 4), ("bf16", 8)):
            sig = {}
            for n in pointers:
                name, _, ty = n.partition(":")
                sig[name] = "*" + (ty or ("i64" if name == "WS" else dtype))
            for n in scalars:
                name, _, ty = n.partition(":")
                sig[name] = ty or "i32"
            for chunk, warps, cap in (tuple(int(v) for v in item.split("x")) for item in VARIANTS.split(",")):
                P = triton.cdiv(262145 + a - 1, chunk)
                constexprs = {"CHUNK": chunk, "P_BLOCK": p_block(P, warps), "FALLBACK_BLOCK": min(chunk, 1024),
                              "MAX_SPINS": SPLIT_MAX_SPINS, **flags, "ALIGN": a}  # fmt: skip
                signature = sig | dict.fromkeys(constexprs, "constexpr")
                r = build(f"{op} groups {dtype}", kernel, dtype, constexprs, warps, sig=signature,
                          aligned=tuple(range(len(pointers))), maxnreg=cap)  # fmt: skip
                print(f"{op} {dtype} {chunk}x{warps}x{cap}: {r['regs']} registers, stack {r['stack']} bytes, "
                      f"spill {r['spill_bytes']} bytes (stores and loads), vector loads {r['vector_loads']}, "
                      f"vector stores {r['vector_stores']}")  # fmt: skip
    return 0


def timed(out: Path, shapes: str, variants: str, ops: str) -> None:
    copy = copy_TBps()
    rows = []
    for op in ops.split(","):
        for item in shapes.split(","):
            B, V = (int(v) for v in item.split("x"))
            for dtype in (torch.float32, torch.bfloat16):
                g = torch.Generator(device="cuda").manual_seed(V)
                if op == "bwd":
                    y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
                    dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
                    want = bits(tb.softmax_backward(dy, y))
                    calls = {f"dispatch ({tb.plan(B, V, dtype)})": lambda dy=dy, y=y: tb.softmax_backward(dy, y)}
                    run = lambda p, dy=dy, y=y: backward_groups(dy, y, **p)  # noqa: E731
                    passes = 3
                else:
                    x = (torch.randn(B, V, device="cuda", generator=g) * 3).to(dtype)
                    t = torch.randint(0, V, (B,), device="cuda", generator=g)
                    want = bits(tce.cross_entropy(x, t, reduction="none", validate=False).grad)
                    calls = {f"dispatch ({tce.plan(B, V, dtype)})":
                             lambda x=x, t=t: tce.cross_entropy(x, t, reduction="none", validate=False)}  # fmt: skip
                    run = lambda p, x=x, t=t: cross_entropy_groups(x, t, **p)[2]  # noqa: E731
                    passes = 2
                same = {}
                for v in variants.split(","):
                    chunk, warps, cap = (int(n) for n in v.split("x"))
                    params = {"CHUNK": chunk, "num_warps": warps, "maxnreg": cap}
                    same[f"groups {v}"] = bool(torch.equal(bits(run(params)), want))
                    calls[f"groups {v}"] = lambda run=run, params=params: run(params)
                times = graph_times_us(list(calls.values()))
                floor = matrix_bytes(B, V, str(dtype).removeprefix("torch."), passes=passes) / (copy * 1e12) * 1e6
                for name, ts in zip(calls, times, strict=True):
                    us = statistics.median(ts)
                    ok = same.get(name, True)
                    rows.append({"op": op, "B": B, "V": V, "dtype": str(dtype), "variant": name, "us": us,
                                 "of_floor": floor / us, "bits": ok})  # fmt: skip
                    print(f"{op:<4} {str(dtype):<15} ({B}, {V}) {name:<28} {us:9.1f} us {floor / us:.3f} of floor"
                          f"{'' if ok else '  BITS DIFFER'}", flush=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_split_groups.json").write_text(json.dumps({"copy_TBps": copy, "rows": rows}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu-bits", action="store_true")
    mode.add_argument("--aot", action="store_true")
    mode.add_argument("--out", type=Path)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--ops", default="bwd,ce")
    args = ap.parse_args()
    if args.cpu_bits:
        return cpu_bits()
    if args.aot:
        return aot()
    timed(args.out, args.shapes, args.variants, args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
