"""A two-pass softmax backward: the order-free sum with a scale per tile instead of per row.

    python reports/probes/backward_tile_scale.py --cpu-bits     # the kernel against its NumPy model, interpreted
    python reports/probes/backward_tile_scale.py --out DIR      # on a GPU: the timed comparison

The question. The Triton backward's stream path reads a row three times (reports/profiles.md):
the order-free sum truncates every term y dy at a scale set by the row's largest |y dy|, which
must be known before the first term is summed. torch.compile's kernel reads a row twice and
runs at 0.94 of the floor at V = 32000. Here the sum is defined per canonical tile instead: the
row is cut into tiles of T elements from its start; a tile's terms are truncated at the tile's
own scale (2^shift_t, from its largest finite |t|, K_T = 62 - log2 T bits) and summed exactly
in int64 (S_t); the tiles' sums are then brought to the row's scale 2^shift_row, shift_row =
min_t shift_t - ceil(log2 NT) for NT tiles, by an arithmetic right shift each (floor), and
summed in int64. Every step depends on a tile's terms and the row's tiles only: any cut of the
row into programs or loops that keeps the tiles gives the same bits, and the row is read once
for the sum. `tile_scale_kernel` walks the rows as the stream path does (programs_per_sm per
SM), one tile of T a step: pass 1 reads a tile, takes its largest |t| and its fixed-point sum
from registers and writes (S_t, shift_t) to a scratch row; then the row's words give s; pass 2
reads dy and y again (from L2) and writes dx = y (dy - s). `tile_scale_row_kernel` holds a row
whole (the row path's cut) and must give the same bits.

Not the suite's definition: its bits differ from the dispatch's (the row scale truncates each
term once, this truncates twice), so they are checked against `tile_scale_model`, a NumPy
model of the definition, and for invariance across grids; accuracy against the float64
reference with the suite's bound. On a GPU this times, in device time (CUDA events, L2 flushed,
median of ROUNDS), the dispatch, torch.compile (per shape) and the kernel at T x warps x per SM.
Writes DIR/backward_tile_scale.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

CPU_BITS = "--cpu-bits" in sys.argv
if CPU_BITS:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels import triton_backward as tb  # noqa: E402
from kernels.baselines import static_compile  # noqa: E402
from kernels.spec import matrix_bytes  # noqa: E402
from kernels.triton_loss_kernels import _finite_abs, _fixed_finite, _fixed_point_scale, _non_finite, _products  # noqa: E402

SHAPES = "4096x32000,4096x128256"
VARIANTS = "8192x16x1,4096x16x2,4096x8x2"  # T x num_warps x programs per SM
ROUNDS = 30
NT_BLOCK = 1024  # tiles a row may have: V <= 1024 T


@triton.jit
def _tile_shift(up):
    # shift, for the scale up = 2^shift of _fixed_point_scale.
    return ((up.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _tiles_sum(S_t, shift_t, in_row, LOG2_NT):
    # The finite part of s: the tiles' sums S_t (at scales 2^shift_t) shifted to the row's scale
    # (floor) and summed in int64, then scaled back.
    shift_row = tl.min(tl.where(in_row, shift_t, 1 << 20), axis=0) - LOG2_NT
    d = tl.minimum(shift_t - shift_row, 63).to(tl.int64)
    S = tl.sum(tl.where(in_row, S_t >> d, 0), axis=0)
    return S.to(tl.float32) * ((127 - shift_row).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _scratch_sum(ws, n_tiles, LOG2_NT, NT_BLOCK: tl.constexpr):
    # _tiles_sum of the n_tiles words this program wrote to its scratch row (S_t, then shift_t
    # NT_BLOCK further on). A barrier before makes every thread's stores visible to every
    # thread's loads; one after keeps the next row's words from overwriting these early.
    tiles = tl.arange(0, NT_BLOCK)
    in_row = tiles < n_tiles
    tl.debug_barrier()
    s_t = tl.load(ws + tiles, mask=in_row, other=0)
    sh_t = tl.load(ws + NT_BLOCK + tiles, mask=in_row, other=0)
    s = _tiles_sum(s_t, sh_t, in_row, LOG2_NT)
    tl.debug_barrier()
    return s


@triton.jit
def _write_dx(dx_row, y_row, dy_row, s, V, WIDTH: tl.constexpr):
    # dx = y (dy - s) over the row, WIDTH elements a step, dy and y read again (from L2).
    cols = tl.arange(0, WIDTH)
    start = 0
    while start < V:
        idx = start + cols
        y = tl.load(y_row + idx, mask=idx < V, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + idx, mask=idx < V, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(dx_row + idx, (y * (dy - s)).to(dx_row.dtype.element_ty), mask=idx < V)
        start += WIDTH


@triton.jit
def tile_scale_kernel(
    DY, Y, DX, WS, B, V, stride_dy, stride_y, stride_dx, KT, LOG2_NT,
    T: tl.constexpr, NT_BLOCK: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, T)
    pid = tl.program_id(0)
    ws = WS + pid.to(tl.int64) * (2 * NT_BLOCK)
    row = pid.to(tl.int64)
    while row < B:
        dy_row = DY + row * stride_dy
        y_row = Y + row * stride_y
        f_lane = tl.zeros([T], tl.float32)
        start = 0
        k = 0
        while start < V:
            t = _products(y_row, dy_row, start + cols, V)
            f_lane += _non_finite(t)
            up, _ = _fixed_point_scale(tl.max(_finite_abs(t), axis=0), KT)
            tl.store(ws + k, tl.sum(_fixed_finite(t, up), axis=0))
            tl.store(ws + NT_BLOCK + k, _tile_shift(up).to(tl.int64))
            start += T
            k += 1
        s = _scratch_sum(ws, k, LOG2_NT, NT_BLOCK) + tl.sum(f_lane, axis=0)
        _write_dx(DX + row * stride_dx, y_row, dy_row, s, V, T)
        row += tl.num_programs(0)


@triton.jit
def warp_tile_kernel(
    DY, Y, DX, WS, B, V, stride_dy, stride_y, stride_dx, KT, LOG2_NT,
    TW: tl.constexpr, NTC: tl.constexpr, NT_BLOCK: tl.constexpr,
):  # fmt: skip
    # tile_scale_kernel with small tiles (TW = one warp's load width) taken NTC at a time as the
    # rows of an [NTC, TW] block: a tile's largest |t| and its sum reduce along axis 1, within
    # a warp (shuffles, no barrier), so the loads of one step need not wait for a meeting.
    r = tl.arange(0, NTC)[:, None] * TW + tl.arange(0, TW)[None, :]
    pid = tl.program_id(0)
    ws = WS + pid.to(tl.int64) * (2 * NT_BLOCK)
    row = pid.to(tl.int64)
    while row < B:
        dy_row = DY + row * stride_dy
        y_row = Y + row * stride_y
        f_lane = tl.zeros([NTC, TW], tl.float32)
        start = 0
        k = 0
        while start < V:
            t = _products(y_row, dy_row, start + r, V)
            f_lane += _non_finite(t)
            up, _ = _fixed_point_scale(tl.max(_finite_abs(t), axis=1), KT)
            tl.store(ws + k + tl.arange(0, NTC), tl.sum(_fixed_finite(t, up[:, None]), axis=1))
            tl.store(ws + NT_BLOCK + k + tl.arange(0, NTC), _tile_shift(up).to(tl.int64))
            start += NTC * TW
            k += NTC
        s = _scratch_sum(ws, tl.cdiv(V, TW), LOG2_NT, NT_BLOCK) + tl.sum(tl.sum(f_lane, axis=1), axis=0)
        _write_dx(DX + row * stride_dx, y_row, dy_row, s, V, NTC * TW)
        row += tl.num_programs(0)


@triton.jit
def tile_scale_row_kernel(
    DY, Y, DX, V, stride_dy, stride_y, stride_dx, KT, LOG2_NT, T: tl.constexpr, NT_P: tl.constexpr
):
    # The same definition with the whole row held (the row path's shape): the row as NT_P tiles
    # of T, each tile's largest |t| and fixed-point sum a reduction along its own axis.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, NT_P * T)
    mask = cols < V
    y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    t = y * dy
    tiles = tl.reshape(t, (NT_P, T))
    up, _ = _fixed_point_scale(tl.max(_finite_abs(tiles), axis=1), KT)
    S_t = tl.sum(_fixed_finite(tiles, up[:, None]), axis=1)
    in_row = tl.arange(0, NT_P) * T < V
    s = _tiles_sum(S_t, _tile_shift(up), in_row, LOG2_NT) + tl.sum(_non_finite(t), axis=0)
    tl.store(DX + row * stride_dx + cols, (y * (dy - s)).to(DX.dtype.element_ty), mask=mask)


def tile_scale_row(dy, y, *, T, num_warps=4):
    """dx by tile_scale_row_kernel: one program a row holding it whole."""
    B, V = y.shape
    dy, y = dy.contiguous(), y.contiguous()
    dx = torch.full_like(y, float("nan"))
    nt = triton.cdiv(V, T)
    tile_scale_row_kernel[(B,)](
        dy, y, dx, V, dy.stride(0), y.stride(0), dx.stride(0), 62 - int(math.log2(T)), math.ceil(math.log2(nt)),
        T=T, NT_P=triton.next_power_of_2(nt), num_warps=num_warps,
    )  # fmt: skip
    return dx


def tile_scale(dy, y, *, T, num_warps=4, programs=None):
    """dx by tile_scale_kernel with tiles of T on a grid of `programs` (default min(B, 132))."""
    B, V = y.shape
    dy, y = dy.contiguous(), y.contiguous()
    dx = torch.full_like(y, float("nan"))
    nt = triton.cdiv(V, T)
    if nt > NT_BLOCK:
        raise ValueError(f"V = {V} has {nt} tiles of {T}: at most {NT_BLOCK}")
    grid = programs or min(B, 132)
    ws = torch.zeros(grid * 2 * NT_BLOCK, dtype=torch.int64, device=y.device)
    KT = 62 - int(math.log2(T))
    tile_scale_kernel[(grid,)](
        dy, y, dx, ws, B, V, dy.stride(0), y.stride(0), dx.stride(0), KT, math.ceil(math.log2(nt)),
        T=T, NT_BLOCK=NT_BLOCK, num_warps=num_warps,
    )  # fmt: skip
    return dx


def warp_tile(dy, y, *, TW, NTC, num_warps=4, programs=None):
    """dx by warp_tile_kernel: tiles of TW, NTC tiles a step, on `programs` (default min(B, 132))."""
    B, V = y.shape
    dy, y = dy.contiguous(), y.contiguous()
    dx = torch.full_like(y, float("nan"))
    nt = triton.cdiv(V, TW)
    nt_block = max(triton.next_power_of_2(nt), NTC)
    grid = programs or min(B, 132)
    ws = torch.zeros(grid * 2 * nt_block, dtype=torch.int64, device=y.device)
    warp_tile_kernel[(grid,)](
        dy, y, dx, ws, B, V, dy.stride(0), y.stride(0), dx.stride(0), 62 - int(math.log2(TW)),
        math.ceil(math.log2(nt)), TW=TW, NTC=NTC, NT_BLOCK=nt_block, num_warps=num_warps,
    )  # fmt: skip
    return dx


def tile_scale_model(dy: np.ndarray, y: np.ndarray, T: int) -> np.ndarray:
    """The definition in NumPy, float32 where the kernel rounds: dx for (B, V) float32 arrays."""
    B, V = y.shape
    t = y.astype(np.float32) * dy.astype(np.float32)
    out = np.empty_like(y, dtype=np.float32)
    KT = 62 - int(math.log2(T))
    nt = -(-V // T)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(B):
            sums, shifts, F = [], [], np.float32(0)
            for k in range(nt):
                tk = t[r, k * T : (k + 1) * T]
                finite = np.isfinite(tk)
                F = np.float32(F + np.float32(np.sum(tk[~finite]))) if (~finite).any() else F
                amax = np.max(np.abs(tk[finite]), initial=np.float32(0))
                biased = (np.float32(amax).view(np.int32) >> 23) & 0xFF
                shift = min(KT - (-126 if biased == 0 else int(biased) - 126), 126)
                scaled = tk[finite].astype(np.float32) * np.float32(2.0**shift)
                sums.append(int(np.sum(np.trunc(scaled).astype(np.int64), dtype=np.int64)))
                shifts.append(shift)
            shift_row = min(shifts) - math.ceil(math.log2(nt))
            S = sum(s >> min(sh - shift_row, 63) for s, sh in zip(sums, shifts, strict=True))
            s = np.int64(S).astype(np.float32) * np.float32(2.0 ** (-shift_row)) + F
            out[r] = y[r].astype(np.float32) * (dy[r].astype(np.float32) - np.float32(s))
    return out


def cpu_bits() -> int:
    from tests.helpers import assert_backward_close, logits

    failures = 0
    for B, V, T in ((5, 37, 16), (3, 100, 16), (4, 64, 32), (2, 16, 16)):
        y = torch.softmax(logits(B, V, seed=V), dim=-1)  # the suite's backward inputs
        dy = logits(B, V, seed=V + 1, neg_inf=False, scale=2.0)
        y[B - 1, 1] = y[B - 1, 0] = 0.03  # a cancelling row, as the suite's bits test has
        dy[B - 1, 0], dy[B - 1, 1] = 1e6, -1e6
        want = tile_scale_model(dy.numpy(), y.numpy(), T)
        runs = {f"stream, {p} programs": tile_scale(dy, y, T=T, programs=p) for p in (1, 2, B)}
        runs["row held whole"] = tile_scale_row(dy, y, T=T)
        for ntc, p in ((2, 1), (4, B)):
            runs[f"warp tiles, {ntc} a step, {p} programs"] = warp_tile(dy, y, TW=T, NTC=ntc, programs=p)
        for name, dx in runs.items():
            got = dx.numpy()
            same = np.array_equal(got.view(np.int32), want.view(np.int32))
            failures += not same
            print(f"B={B} V={V} T={T} {name}: bits {'equal' if same else 'DIFFER'} to the model")
        assert_backward_close(torch.from_numpy(want), dy, y, what=f"tile scale model V={V}")
    print("accuracy: within the suite's bound" if not failures else f"{failures} bit mismatches")
    return 1 if failures else 0


def time_shape(B, V, dtype, variants: str, copy: float, sms: int) -> list[dict]:
    """Device time of the dispatch, torch.compile and each T x warps x per-SM variant at (B, V)."""
    from triton_rows_sweep import bits

    from tests.suite.devicetime import device_times_us

    g = torch.Generator(device="cuda").manual_seed(B + V + 1)
    y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
    dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
    compiled = static_compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype))
    calls = {f"dispatch ({tb.plan(B, V, dtype)})": lambda: tb.softmax_backward(dy, y)}
    calls["torch.compile"] = lambda: compiled(dy, y)
    first = {}
    for v in variants.split(","):
        if v.startswith("w"):  # wTWxNTCxwarpsxper_sm: warp_tile_kernel
            T, ntc, warps, per_sm = (int(n) for n in v[1:].split("x"))
            grid = min(B, per_sm * sms)

            def run(T=T, ntc=ntc, warps=warps, programs=grid):
                return warp_tile(dy, y, TW=T, NTC=ntc, num_warps=warps, programs=programs)
        else:
            T, warps, per_sm = (int(n) for n in v.split("x"))
            grid = min(B, per_sm * sms)

            def run(T=T, warps=warps, programs=grid):
                return tile_scale(dy, y, T=T, num_warps=warps, programs=programs)

        got = run()
        same = torch.equal(bits(got), bits(first.setdefault(T, got)))  # one T, any grid: one answer
        calls[f"tile scale {v}" + ("" if same else " BITS DIFFER across grids")] = run
    rows = []
    for name, fn in calls.items():
        us = statistics.median(device_times_us(fn, rounds=ROUNDS))
        frac = matrix_bytes(B, V, str(dtype).removeprefix("torch."), passes=3) / (us * 1e-6) / 1e12 / copy
        rows.append({"B": B, "V": V, "dtype": str(dtype), "variant": name, "us": us, "of_floor": frac})
        print(f"{str(dtype):15s} ({B}, {V}) {name:40s} {us:9.1f} us {frac:.3f} of floor", flush=True)
    return rows


def timed(out: Path, shapes: str, variants: str) -> None:
    from triton_rows_sweep import copy_TBps

    copy = copy_TBps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for B, V in (tuple(int(n) for n in s.split("x")) for s in shapes.split(",")):
        for dtype in (torch.float32, torch.bfloat16):
            results += time_shape(B, V, dtype, variants, copy, sms)
    out.mkdir(parents=True, exist_ok=True)
    (out / "backward_tile_scale.json").write_text(json.dumps({"copy_TBps": copy, "results": results}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-bits", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--variants", default=VARIANTS)
    args = parser.parse_args()
    if args.cpu_bits:
        return cpu_bits()
    timed(args.out, args.shapes, args.variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
