"""Triton's row and split kernels with 16-bit rows held as stored: registers, bits and device time.

    python reports/probes/triton_hold16.py --aot                # sm_90 builds here, no GPU
    PYTHONPATH=DIR python reports/probes/triton_hold16.py --aot # the same with the Triton in DIR
    python reports/probes/triton_hold16.py --cpu-bits           # bits against the kernels, interpreted
    python reports/probes/triton_hold16.py --out DIR [--jobs N] # on a GPU: the timed comparison
    python reports/probes/triton_hold16.py --cpu-smoke --out DIR  # the GPU run's code path, on CPU

The question. `softmax_row_kernel` and `softmax_split_kernel` (kernels/triton_kernels.py) upcast a
loaded row to float32 at once and keep float32 values (the upcast row, then its exponentials) in
registers until the store. A 16-bit row then takes the registers of a float32 row for half its
bytes, so a 16-bit launch has half the bytes in flight per SM of a float32 one at the same
occupancy. The variants here keep the loaded tensor as stored instead:

    m  = max(up(x))                         up: the upcast, done on the fly
    e  = exp(up(x) - m)  -> fixed-point sum (the split kernel: after the first meeting)
    e  = exp(up(x) - m)  -> output          computed again from the held x (after the sum)

Both exponentials are the kernels' own expression (`_exp`) on the same values, and the sum is an
integer fixed-point sum, so the output bits must equal the kernels' bits, whatever CHUNK or
num_warps. The compiler would merge the repeated upcasts and exponentials back into one float32
tensor held across the reductions, so each recomputation upcasts the held values XORed with a
flag the compiler cannot know is 0 (`_launder`, `_both_halves`). The flags are `m != m` and
`inv != inv`: each is 1 only in a row whose max is NaN, whose outputs are all NaN whatever its
values, and each depends on the reduction before its recomputation, so that cannot be hoisted
above it. (A flag in bit 0 of a word alone left the upper element of the word provably
untouched, and the compiler merged its upcasts: 96 exponentials a thread instead of 128.)

Two kinds of held kernel:
- `unpacked` (`unpacked_row_kernel`, `unpacked_split_kernel`): the loaded tensor of 16-bit
  elements is held as Triton loaded it. This frees few or no registers: the SASS moves each
  loaded word's upper element into a register of its own (PRMT), so the tensor takes a register
  per element (row bf16 V = 32000 at 16 warps: 128 registers against the current 106); a control.
- `packed` (`hold16_row_kernel`, `hold16_split_kernel`; 16-bit storage, even ALIGN): the row or
  chunk is loaded, held and stored as int32 words of two elements, upcast exactly from the
  word's halves, the outputs rounded to storage as the current kernels round them and packed
  back. This is what holds two elements per register.
The registers freed go to more bytes in flight: fewer warps per row (row: two programs per SM at
BLOCK 32768, under a 64-register cap) or more programs per SM and longer chunks (split).

Modes:
- `--aot`: sm_90 builds (kernels.triton_build.build, Triton's own ptxas) of the current and the
  held kernels at the launch parameters compared, with an occupancy estimate; prints JSON.
- `--cpu-bits`: under TRITON_INTERPRET=1, the held kernels' output bits against the current
  path's (kernels.softmax_triton.run_path) for fp32, bf16 and fp16 at small shapes, edge rows
  included (-inf entries, an all -inf row, NaN and +inf rows, large magnitudes).
- default (a GPU): per (dtype, B, V), F.softmax, the dispatch, the current path at its current
  parameters (and other parameters as controls) and every held variant: device time with CUDA
  events, interleaved rounds, output poisoned with NaN and L2 flushed (tests.suite.devicetime's
  flush size) before every launch, median of ROUNDS; fraction of a copy ceiling measured in the
  same run; every output's bits against the dispatch's, no NaN left (every element written),
  sampled rows within the suite's tolerance (tests.helpers.check_softmax). Writes
  DIR/triton_hold16.json and prints a table last.
- `--cpu-smoke`: the default mode on CPU tensors under the interpreter at tiny shapes with
  scaled-down parameters, host-timed (a check of this script, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SMOKE = "--cpu-smoke" in sys.argv
CPU_BITS = "--cpu-bits" in sys.argv
AOT = "--aot" in sys.argv
if SMOKE or CPU_BITS:
    os.environ["TRITON_INTERPRET"] = "1"
elif AOT:
    os.environ.pop("TRITON_INTERPRET", None)
DEV = "cpu" if (SMOKE or CPU_BITS) else "cuda"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

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
    _split_chunk,
    _split_edges,
    _tagged,
    _tagged_halves,
)
from kernels.triton_launch import PATH_TABLE  # noqa: E402

# --------------------------------------------------------------------------- the kernels


@triton.jit
def _launder(x, z):
    # x with its bits XORed by z (a 0/1 flag, 0 in every row whose outputs are not NaN anyway):
    # the same values, but an expression the compiler cannot merge with another upcast of x.
    if x.dtype.primitive_bitwidth == 32:
        b = x.to(tl.int32, bitcast=True) ^ z.to(tl.int32)
    else:
        b = x.to(tl.int16, bitcast=True) ^ z.to(tl.int16)
    return b.to(x.dtype, bitcast=True)


@_no_value_specialisation
def unpacked_row_kernel(X, Y, V, stride_x, stride_y, SCALE, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    # softmax_row_kernel with the row held as stored: max, sum and output each upcast it again.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (cols // ALIGN) < V // ALIGN
    x_in = tl.load(X + tl.multiple_of(row * stride_x, ALIGN) + cols, mask=mask, other=-float("inf"))
    m = _row_max(x_in.to(tl.float32), 0)
    e = _exp(_launder(x_in, m != m).to(tl.float32), m, Y.dtype.element_ty)
    neg_hi, inv = _softmax_scale(tl.sum(_fixed(e, SCALE), axis=0), SCALE, m)
    e = _exp(_launder(x_in, inv != inv).to(tl.float32), m, Y.dtype.element_ty)
    y = _normalise(e, neg_hi, inv, Y.dtype.element_ty)
    tl.store(Y + tl.multiple_of(row * stride_y, ALIGN) + cols, y.to(Y.dtype.element_ty), mask=mask)


@_no_value_specialisation
def unpacked_split_kernel(X, Y, WS, B, V, P, stride_x, stride_y, x_off, y_off, SCALE,
                            CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr,
                          MAX_SPINS: tl.constexpr, ALIGN: tl.constexpr = 1, Y_ALIGN: tl.constexpr = 1):  # fmt: skip
    # softmax_split_kernel with the chunk held as stored across both meetings: the float32
    # exponentials exist only between the first meeting and the sum, and after the second.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs = x_off + row * stride_x
    c_start, mask = _split_chunk(xs, chunk, V, CHUNK, ALIGN)
    x_in = tl.load(X + c_start + tl.arange(0, CHUNK), mask=mask, other=-float("inf"))
    pos, e_mask = _split_edges(xs, chunk, V, ALIGN)
    xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)

    ws_row = WS + row * (3 * P)
    x_row = X + xs
    fcols = tl.arange(0, FALLBACK_BLOCK)
    tag = _launch_tag(ws_row + chunk, P_BLOCK)
    tag_hi = tag << 32

    # Meeting 1: the row's max.
    m_c = _nan_max(_row_max(x_in.to(tl.float32), 0), _row_max(xe, 0))
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

    # Meeting 2: the row's fixed-point sum, every chunk relative to the same m.
    tl.debug_barrier()
    ex = _exp(_launder(x_in, m != m).to(tl.float32), m, Y.dtype.element_ty)
    ee = _exp(xe, m, Y.dtype.element_ty)
    s_c = tl.sum(_fixed(ex, SCALE), axis=0) + tl.sum(_fixed(ee, SCALE), axis=0)
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
    ex = _exp(_launder(x_in, inv != inv).to(tl.float32), m, Y.dtype.element_ty)
    yx = _normalise(ex, neg_hi, inv, Y.dtype.element_ty)
    tl.store(Y + shift + c_start + tl.arange(0, CHUNK), yx.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=e_mask)


# The packed kernels (16-bit storage only): the row or chunk is loaded, held and stored as int32
# words of two elements each, so that a held element costs half a register. (A tensor of 16-bit
# elements, as the unpacked kernels hold it, is split into a register per element after the
# load: it saves only what holding no float32 exponentials saves.) The halves are upcast
# exactly (bf16: the bits shifted into the upper half of a float32; fp16: through fp16), and
# each output is rounded to storage as the current kernels round it, so the bits are theirs.
# Needs ALIGN >= 2 (rows and strides of even length): chunk and tile offsets then fall on words.
_NEG_INF_BF16 = tl.constexpr(-8323200)  # 0xFF80FF80: two bf16 -inf
_NEG_INF_FP16 = tl.constexpr(-67044352)  # 0xFC00FC00: two fp16 -inf
_HIGH = tl.constexpr(-65536)  # 0xFFFF0000


@triton.jit
def _both_halves(flag):
    # The 0/1 flag in the low bit of both halves of a word: a flag only in bit 0 would leave the
    # upper element provably untouched, and the compiler would merge its upcasts again.
    return flag.to(tl.int32) * 65537


@triton.jit
def _load_words(ptrs, mask, IN: tl.constexpr):
    # Words of two IN elements, both -inf where masked.
    if IN == tl.bfloat16:
        w = tl.load(ptrs, mask=mask, other=_NEG_INF_BF16)
    else:
        w = tl.load(ptrs, mask=mask, other=_NEG_INF_FP16)
    return w


@triton.jit
def _halves(w, IN: tl.constexpr):
    # (element 2k, element 2k + 1) of words w as float32: little-endian, the first in the low half.
    if IN == tl.bfloat16:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & _HIGH).to(tl.float32, bitcast=True)
    else:
        lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pack(lo, hi, OUT: tl.constexpr):
    # Two float32 outputs rounded to OUT (as .to(OUT) rounds them) in one word.
    b_lo = lo.to(OUT).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    b_hi = hi.to(OUT).to(tl.int16, bitcast=True).to(tl.int32) << 16
    return b_hi | b_lo


@_no_value_specialisation
def hold16_row_kernel(X, Y, V, stride_x, stride_y, SCALE, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    # softmax_row_kernel with the row held in words: max, sum and output each upcast it again.
    tl.static_assert(ALIGN >= 2)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK // 2)
    mask = (cols // (ALIGN // 2)) < V // ALIGN  # == 2 * cols < V, constant over groups
    xw = X.to(tl.pointer_type(tl.int32)) + tl.multiple_of(row * (stride_x // 2), ALIGN // 2)
    w = _load_words(xw + cols, mask, X.dtype.element_ty)
    lo, hi = _halves(w, X.dtype.element_ty)
    m = _row_max(_nan_max(lo, hi), 0)
    lo, hi = _halves(w ^ _both_halves(m != m), X.dtype.element_ty)
    s = tl.sum(_fixed(_exp(lo, m, Y.dtype.element_ty), SCALE) + _fixed(_exp(hi, m, Y.dtype.element_ty), SCALE), axis=0)
    neg_hi, inv = _softmax_scale(s, SCALE, m)
    lo, hi = _halves(w ^ _both_halves(inv != inv), X.dtype.element_ty)
    y = _pack(
        _normalise(_exp(lo, m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty),
        _normalise(_exp(hi, m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty),
        Y.dtype.element_ty,
    )
    yw = Y.to(tl.pointer_type(tl.int32)) + tl.multiple_of(row * (stride_y // 2), ALIGN // 2)
    tl.store(yw + cols, y, mask=mask)


@_no_value_specialisation
def hold16_split_kernel(X, Y, WS, B, V, P, stride_x, stride_y, x_off, y_off, SCALE,
                        CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr,
                        MAX_SPINS: tl.constexpr, ALIGN: tl.constexpr = 1, Y_ALIGN: tl.constexpr = 1):  # fmt: skip
    # softmax_split_kernel with the chunk held in words across both meetings; the edges (at most
    # 2 * ALIGN elements, chunk 0 only) stay float32 as there.
    tl.static_assert(ALIGN >= 2)
    tl.static_assert(Y_ALIGN >= 2)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs = x_off + row * stride_x
    g_lo = (xs + ALIGN - 1) // ALIGN
    g_hi = (xs + V) // ALIGN
    c_start = tl.multiple_of((xs // ALIGN) * ALIGN + chunk * CHUNK, ALIGN)
    cols = tl.arange(0, CHUNK // 2)
    mask = _group_mask(cols // (ALIGN // 2), c_start, g_lo, g_hi, ALIGN)
    c_word = tl.multiple_of(c_start // 2, ALIGN // 2)
    w = _load_words(X.to(tl.pointer_type(tl.int32)) + c_word + cols, mask, X.dtype.element_ty)
    pos, e_mask = _split_edges(xs, chunk, V, ALIGN)
    xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)

    ws_row = WS + row * (3 * P)
    x_row = X + xs
    fcols = tl.arange(0, FALLBACK_BLOCK)
    tag = _launch_tag(ws_row + chunk, P_BLOCK)
    tag_hi = tag << 32

    # Meeting 1: the row's max.
    lo, hi = _halves(w, X.dtype.element_ty)
    m_c = _nan_max(_row_max(_nan_max(lo, hi), 0), _row_max(xe, 0))
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

    # Meeting 2: the row's fixed-point sum, every chunk relative to the same m.
    tl.debug_barrier()
    lo, hi = _halves(w ^ _both_halves(m != m), X.dtype.element_ty)
    ee = _exp(xe, m, Y.dtype.element_ty)
    s_c = tl.sum(
        _fixed(_exp(lo, m, Y.dtype.element_ty), SCALE) + _fixed(_exp(hi, m, Y.dtype.element_ty), SCALE), axis=0
    ) + tl.sum(_fixed(ee, SCALE), axis=0)
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
    lo, hi = _halves(w ^ _both_halves(inv != inv), X.dtype.element_ty)
    y = _pack(
        _normalise(_exp(lo, m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty),
        _normalise(_exp(hi, m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty),
        Y.dtype.element_ty,
    )
    y_word = tl.multiple_of((shift + c_start) // 2, ALIGN // 2)
    tl.store(Y.to(tl.pointer_type(tl.int32)) + y_word + cols, y, mask=mask)
    tl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=e_mask)


# The held kernels launch through the product's path entries (same arguments, geometry, grid
# and workspace protocol), with only the kernel swapped: the entry checks the signature.
# Row entries take a register cap too (maxnreg, as split's do); "current" names the product's
# kernels through these entries, for capped controls.
_CAPPED = {"options": PATH_TABLE["split"].options}
HOLD_PATHS = {
    "current": {
        "row": dataclasses.replace(PATH_TABLE["row"], **_CAPPED),
        "split": PATH_TABLE["split"],
    },
    "unpacked": {
        "row": dataclasses.replace(PATH_TABLE["row"], kernel=unpacked_row_kernel, **_CAPPED),
        "split": dataclasses.replace(PATH_TABLE["split"], kernel=unpacked_split_kernel),
    },
    "packed": {
        "row": dataclasses.replace(PATH_TABLE["row"], kernel=hold16_row_kernel, **_CAPPED),
        "split": dataclasses.replace(PATH_TABLE["split"], kernel=hold16_split_kernel),
    },
}
KINDS = ("current", "unpacked", "packed")


def entry_of(kind: str, path: str):
    return HOLD_PATHS[kind][path]


def run_hold(x: torch.Tensor, path: str, *, out: torch.Tensor, kind: str = "packed", **params) -> torch.Tensor:
    """The held kernel (`kind`: packed or unpacked) of `path` for x -> out, launch parameters as
    run_path takes them."""
    dev = -1 if DEV == "cpu" else x.get_device()
    sms = None if DEV == "cpu" else torch.cuda.get_device_properties(dev).multi_processor_count
    p = {**st.launch_params(path, x.shape[1], x.dtype, B=x.shape[0], sms=sms), **params}
    HOLD_PATHS[kind][path].bind(x, out, p, dev=dev, sms=sms)()
    return out


# --------------------------------------------------------------------------- sm_90 builds

SM_REGS, SM_THREADS, SM_CTAS, SM_SHARED = 65536, 2048, 32, 228 * 1024


def occupancy(regs: int, num_warps: int, shared: int) -> int:
    """Programs an sm_90 SM holds at once: registers (allocated per warp in units of 256),
    threads, CTA slots and shared memory (1 KB reserved per CTA)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = SM_REGS // (per_warp * num_warps)
    by_shared = SM_SHARED // (shared + 1024) if shared else SM_CTAS
    return min(by_regs, SM_THREADS // (32 * num_warps), SM_CTAS, by_shared)


def aot_record(kind: str, path: str, p: dict, V: int, dtype_name: str) -> dict:
    from kernels.spec import ITEMSIZE
    from kernels.triton_build import build

    entry = entry_of(kind, path)
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype_name]
    spec = entry.aot(p, V, dtype, ITEMSIZE[dtype_name])
    options = dict(spec["options"])
    r = build(
        f"{kind} {path} {dtype}",
        entry.kernel,
        dtype,
        spec["constexprs"],
        options.pop("num_warps"),
        options.pop("num_stages", 3),
        sig=spec["signature"],
        aligned=spec["aligned"],
        maxnreg=options.pop("maxnreg", None),
    )
    per_sm = occupancy(r["regs"], r["num_warps"], r["shared"])
    width = spec["constexprs"].get("CHUNK") or V
    return {
        "kind": kind,
        "path": path,
        "dtype": dtype_name,
        "V": V,
        "num_warps": r["num_warps"],
        "maxnreg": r["maxnreg"],
        "BLOCK_or_CHUNK": spec["constexprs"].get("CHUNK") or spec["constexprs"]["BLOCK"],
        "regs": r["regs"],
        "spill_bytes": r["spill_bytes"],
        "stack": r["stack"],
        "shared": r["shared"],
        "vector_loads": r["vector_loads"],
        "programs_per_sm": per_sm,
        "threads_per_sm": per_sm * 32 * r["num_warps"],
        "KB_in_flight_per_sm": round(per_sm * width * ITEMSIZE[dtype_name] / 1024, 1),
    }


def aot_cases():
    """(kind, path, params, V, dtype) of every build the comparison needs."""
    cases = []
    for dtype in ("bfloat16", "float32"):
        kinds = KINDS if dtype != "float32" else ("current", "unpacked")
        for V in (32000, 16384):
            for warps in (8, 16, 32):
                for kind in kinds:
                    for regs in (None, 64) if warps == 16 else (None,):
                        p = {"BLOCK": triton.next_power_of_2(V), "num_warps": warps, "maxnreg": regs}
                        cases.append((kind, "row", p, V, dtype))
        for chunk in (8192, 16384):
            for warps in (4, 8):
                for regs in (None, 64, 80, 128):
                    for kind in kinds:
                        cases.append(
                            (kind, "split", {"CHUNK": chunk, "num_warps": warps, "maxnreg": regs}, 262144, dtype)
                        )
    return cases


def run_aot(jobs: int) -> list[dict]:
    cases = aot_cases()
    if jobs > 1:
        with mp.get_context("spawn").Pool(jobs) as pool:
            return pool.starmap(aot_record, cases)
    return [aot_record(*c) for c in cases]


# --------------------------------------------------------------------------- bits on the CPU


def edge_rows(B: int, V: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * 4
    big = 6e4 if dtype == torch.float16 else 1e30
    x[0, :: max(V // 5, 1)] = -math.inf
    if B > 1:
        x[1] = -math.inf  # all -inf: NaN throughout
    if B > 2:
        x[2, V // 3] = math.nan
    if B > 3:
        x[3, V // 2] = math.inf
    if B > 4:
        x[4] = x[4] * 0 + torch.linspace(-big, big, V)
    if B > 5:
        x[5, 1] = 30.0  # one confident entry
    return x.to(dtype)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def cpu_bits() -> dict:
    """Held kernels' bits against the current paths' at small shapes, several CHUNKs / BLOCKs."""
    out = {"cases": 0, "nan_rows_differ_only_in_payload": 0, "failures": []}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        kinds = ("unpacked",) if dtype == torch.float32 else ("unpacked", "packed")
        for B, V in ((7, 38), (6, 200), (8, 1000), (3, 2), (6, 37), (2, 1)):
            x = edge_rows(B, V, dtype, seed=V)
            want = st.run_path(x, "row")
            for kind in kinds:
                if kind == "packed" and V % 2:
                    continue  # the packed kernels need rows of even length (ALIGN >= 2)
                for block in sorted({triton.next_power_of_2(V), 2 * triton.next_power_of_2(V)}):
                    got = run_hold(x, "row", out=torch.full_like(x, math.nan), kind=kind, BLOCK=max(block, 2))
                    out["cases"] += 1
                    _compare(out, got, want, f"{kind} row {dtype} B={B} V={V} BLOCK={block}")
            for chunk in (16, 32, 64, 128):
                cur = st.run_path(x, "split", CHUNK=chunk, num_warps=4)
                _compare(out, cur, want, f"current split {dtype} B={B} V={V} CHUNK={chunk}")
                for kind in kinds:  # split cuts on 16-byte groups: odd V too
                    for warps in (4, 8):
                        y = torch.full_like(x, math.nan)
                        got = run_hold(x, "split", out=y, kind=kind, CHUNK=chunk, num_warps=warps)
                        out["cases"] += 1
                        _compare(out, got, want, f"{kind} split {dtype} B={B} V={V} CHUNK={chunk} nw={warps}")
            # a row offset inside a 16-byte group and a padded row stride (split's heads and edges);
            # packed: an even offset and stride (its output words need Y_ALIGN >= 2)
            for head, pad in ((3, 11), (2, 10)):
                if V < 37:
                    continue
                big = edge_rows(B, V + pad, dtype, seed=V + 1)
                xo = big[:, head : head + V]
                want_o = st.run_path(xo.contiguous(), "row")
                for kind in kinds:
                    if kind == "packed" and head % 2:
                        continue
                    for chunk in (16, 32):
                        y = torch.full((B, V), math.nan, dtype=dtype)
                        got = run_hold(xo, "split", out=y, kind=kind, CHUNK=chunk)
                        out["cases"] += 1
                        _compare(out, got, want_o, f"{kind} split strided {head}/{pad} {dtype} B={B} V={V} {chunk}")
    return out


def _compare(out: dict, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if torch.equal(bits_of(got), bits_of(want)):
        return
    same_nan = torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    if same_nan and torch.equal(bits_of(got)[finite], bits_of(want)[finite]):
        out["nan_rows_differ_only_in_payload"] += 1  # the interpreter keeps NaN payloads; a GPU does not
        return
    n = int((bits_of(got) != bits_of(want)).sum())
    out["failures"].append(f"{what}: {n} elements differ")


# --------------------------------------------------------------------------- the timed comparison

ROUNDS = 20
SHAPES = ((4096, 32000), (32768, 32000), (4096, 16384), (4096, 50257), (4096, 128256), (4096, 262144), (1024, 262144))
SMOKE_SHAPES = ((8, 200), (16, 200), (8, 100), (8, 300), (8, 700), (8, 1500), (4, 1500))
# Smoke: parameters scaled so the interpreter's tensors stay small (a check of the code only).
SMOKE_SPLIT_CHUNK = {8192: 128, 16384: 256}
SMOKE_ROW_V = 512  # held-row variants past the row path's V (GPU: 65536 at V = 50257)


def variants(dtype, B: int, V: int) -> list[tuple[str, str, str, dict]]:
    """(name, kind, path, params): the current path's controls and the held variants at (B, V)."""
    out = []
    row_max = SMOKE_ROW_V // 2 if SMOKE else dispatch.DISPATCH_BOUNDARIES["row_max_v"]
    chunk = (lambda c: SMOKE_SPLIT_CHUNK[c]) if SMOKE else (lambda c: c)
    half = dtype != torch.float32
    if V <= row_max:
        cur = {**st.launch_params("row", V, dtype), "maxnreg": None}
        nw = cur["num_warps"]
        out.append((f"row cur nw{nw}", "current", "row", dict(cur)))
        out.append(("row cur nw16", "current", "row", {**cur, "num_warps": 16}))
        out.append((f"row unpacked nw{nw}", "unpacked", "row", dict(cur)))
        if half and V % 2 == 0:
            out.append(("row cur nw16 r64", "current", "row", {**cur, "num_warps": 16, "maxnreg": 64}))
            for warps, regs in ((32, None), (16, None), (16, 64), (8, None)):
                name = f"row packed nw{warps}" + (f" r{regs}" if regs else "")
                out.append((name, "packed", "row", {**cur, "num_warps": warps, "maxnreg": regs}))
        return out
    cur = dict(dispatch.SPLIT_PARAMS)
    cur["CHUNK"] = chunk(cur["CHUNK"])
    out.append(("split cur 8192x4 r128", "current", "split", cur))
    out.append(("split unpacked 8192x4 r128", "unpacked", "split", dict(cur)))
    if half:
        out.append(("split cur 8192x4 r80", "current", "split", {**cur, "maxnreg": 80}))
        for c, warps, regs in SPLIT_PACKED:
            name = f"split packed {c}x{warps}" + (f" r{regs}" if regs else "")
            out.append((name, "packed", "split", {"CHUNK": chunk(c), "num_warps": warps, "maxnreg": regs}))
    return out


# (CHUNK, num_warps, maxnreg) of the packed 16-bit split, from the sm_90 builds of triton 3.6 (the
# H200's; --aot with it on the path): programs per SM and KB of chunk in flight per SM, against
# the current 8192 x 4 under 128 (121 registers: four, 64 KB):
#   8192 x 4 under 128: 94 registers, five, 80 KB      8192 x 4 under 80: 80, six, 96 KB
#   16384 x 4 uncapped: 166, three, 96 KB              16384 x 8 under 80: 80, three, 96 KB
#   8192 x 4 under 64: spills 104 bytes, eight, 128 KB 16384 x 4 under 128: spills 104, four, 128 KB
# (The current kernel under 80 spills 240 bytes: "split cur 8192x4 r80", a control.)
SPLIT_PACKED = [(8192, 4, 128), (8192, 4, 80), (16384, 4, None), (16384, 8, 80), (8192, 4, 64), (16384, 4, 128)]


def dispatch_params(B, V, dtype, sms):
    path = st.plan(B, V, dtype)
    if path == "tile":  # --cpu-smoke's short rows: the stored or interpreter config
        return path, {}
    return path, st.launch_params(path, V, dtype, B=B, sms=sms)


def _compile_specs(specs):
    """Child process: launch each (kind, path, params, V, dtype) once on a 1-row input."""
    for kind, path, params, V, dtype in specs:
        x = torch.randn(1, V, device=DEV).to(getattr(torch, dtype))
        y = torch.empty_like(x)
        if kind in ("dispatch", "current") and not (path == "row" and params.get("maxnreg")):
            # the dispatch's own parameters at the timed batch (a 1-row call would shrink split's chunks)
            st.run_path(x, path, out=y, **params)
        else:
            run_hold(x, path, out=y, kind=kind, **params)
    if DEV == "cuda":
        torch.cuda.synchronize()


def precompile(cases, jobs, sms):
    specs = set()
    for dtype, B, V in cases:
        name = str(dtype).removeprefix("torch.")
        path, params = dispatch_params(B, V, dtype, sms)
        specs.add(("dispatch", path, json.dumps(params, sort_keys=True), V, name))
        for _, kind, path, params in variants(dtype, B, V):
            specs.add((kind, path, json.dumps(params, sort_keys=True), V, name))
    specs = [(k, p, json.loads(q), V, d) for k, p, q, V, d in sorted(specs)]
    t0 = time.time()
    if jobs > 1:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_compile_specs, args=(specs[i::jobs],)) for i in range(jobs)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    print(f"precompiled {len(specs)} specialisations in {time.time() - t0:.1f} s with {jobs} jobs", flush=True)


def compiled_resources(kind, path, params, x, y):
    """Registers and spills of the kernel the launch compiled, as this GPU's Triton built it."""
    try:
        entry = entry_of(kind, path)
        dev = -1 if DEV == "cpu" else x.get_device()
        sms = None if DEV == "cpu" else torch.cuda.get_device_properties(dev).multi_processor_count
        p = {**st.launch_params(path, x.shape[1], x.dtype, B=x.shape[0], sms=sms), **params}
        k = entry.bind(x, y, p, dev=dev, sms=sms).warmup()
        k._init_handles()
        return {"regs": k.n_regs, "spills": k.n_spills, "shared": k.metadata.shared, "num_warps": k.metadata.num_warps}
    except Exception as e:  # noqa: BLE001 - a probe's side note, never fatal
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def timed_rounds(fns, rounds):
    """Per fn (callable, out or None): device times (µs) of `rounds` interleaved rounds, each launch
    after its output is poisoned with NaN and L2 flushed (host clock in --cpu-smoke)."""
    if SMOKE:
        out = []
        for fn, y in fns:
            t = []
            for _ in range(2):
                if y is not None:
                    y.fill_(math.nan)
                t0 = time.perf_counter()
                fn()
                t.append((time.perf_counter() - t0) * 1e6)
            out.append(t)
        return out
    from tests.suite.devicetime import interleaved_device_times_us

    outputs = [y for _, y in fns if y is not None]

    def poison():
        for y in outputs:
            y.fill_(math.nan)

    return interleaved_device_times_us([fn for fn, _ in fns], warmup=2, rounds=rounds, refresh=poison)


def copy_ceiling():
    from tests.suite.devicetime import device_times_us

    x = torch.empty(1 << (20 if SMOKE else 30), dtype=torch.float32, device=DEV).uniform_()
    y = torch.empty_like(x)
    if SMOKE:
        t0 = time.perf_counter()
        y.copy_(x)
        return 2 * x.numel() * 4 / (time.perf_counter() - t0) / 1e12
    t = device_times_us(lambda: y.copy_(x), warmup=2, rounds=10)
    return 2 * x.numel() * 4 / (sorted(t)[len(t) // 2] * 1e-6) / 1e12


def check_close(got, x):
    from tests.helpers import check_softmax

    try:
        check_softmax(got, x)
    except AssertionError as e:
        return str(e).splitlines()[0][:300]
    return ""


def write_result(out, sms, copy_tbps, failures, rows, *, done):
    result = {
        "what": "Triton 16-bit rows held packed (reports/probes/triton_hold16.py)",
        "complete": done,
        "device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(),
        "sms": sms,
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]},
        "method": f"device time, CUDA events, interleaved rounds (order reversed every round), output filled "
        f"with NaN and L2 flushed (256 MiB) before every launch, median of {ROUNDS} after 2 warm-ups; "
        "frac_of_copy: (read + write bytes) / time against copy_TBps of this run (4 GiB fp32 copy)",
        "copy_TBps": round(copy_tbps, 4),
        "failures": failures,
        "rows": rows,
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "triton_hold16.json").write_text(json.dumps(result, indent=1))


def timed_comparison(args) -> int:
    from tests.helpers import dtype_id

    sms = 4 if SMOKE else torch.cuda.get_device_properties(0).multi_processor_count
    shapes = SMOKE_SHAPES if SMOKE else SHAPES
    dtypes = tuple(getattr(torch, d) for d in args.dtypes.split(","))
    cases = [(dtype, B, V) for dtype in dtypes for B, V in shapes]
    precompile(cases, 1 if SMOKE else args.jobs, sms)
    copy_tbps = copy_ceiling()
    print(f"copy ceiling {copy_tbps:.3f} TB/s", flush=True)
    rows, failures, resources = [], [], {}
    for dtype, B, V in cases:
        g = torch.Generator(device=DEV).manual_seed(V + B)
        x = (torch.randn(B, V, device=DEV, generator=g) * 3).to(dtype)
        x[:, 7] = 30.0
        x[:, 3::1000] = -math.inf
        path, params = dispatch_params(B, V, dtype, sms)
        y_disp = torch.empty_like(x)
        fns = [
            ("F.softmax", "torch", "torch", {}, lambda x=x: F.softmax(x, dim=-1), None),
            ("dispatch", "dispatch", path, params, lambda x=x, y=y_disp: st.softmax(x, out=y), y_disp),
        ]
        for name, kind, vpath, vparams in variants(dtype, B, V):
            y = torch.empty_like(x)
            if kind == "current" and not (vpath == "row" and vparams.get("maxnreg")):
                fn = lambda x=x, y=y, p=vpath, q=vparams: st.run_path(x, p, out=y, **q)  # noqa: E731
            else:
                fn = lambda x=x, y=y, p=vpath, q=vparams, k=kind: run_hold(x, p, out=y, kind=k, **q)  # noqa: E731
            fns.append((name, kind, vpath, vparams, fn, y))
            if DEV == "cuda":
                key = (kind, vpath, json.dumps(vparams, sort_keys=True), dtype_id(dtype), triton.next_power_of_2(V))
                if key not in resources:
                    resources[key] = compiled_resources(kind, vpath, vparams, x[:1], y[:1])
        times = timed_rounds([(fn, y) for *_, fn, y in fns], 2 if SMOKE else ROUNDS)
        if DEV == "cuda":
            torch.cuda.synchronize()
        sample = sorted({0, B // 2, B - 1})
        what = f"{dtype_id(dtype)} B={B} V={V}"
        err = check_close(y_disp[sample], x[sample])
        if err:
            failures.append(f"{what} dispatch: {err}")
        meds = {}
        for (name, kind, vpath, vparams, _, y), t in zip(fns, times, strict=True):
            med = sorted(t)[len(t) // 2]
            meds[name] = med
            bits_equal = None
            if y is not None and name != "dispatch":
                bits_equal = bool(torch.equal(bits_of(y), bits_of(y_disp)))
                if not bits_equal:
                    n = int((bits_of(y) != bits_of(y_disp)).sum())
                    failures.append(f"{what} {name}: {n} elements' bits differ from the dispatch")
            if y is not None and bool(torch.isnan(y).any()):
                failures.append(f"{what} {name}: NaN left in the output (an element not written)")
            gbps = 2 * B * V * x.element_size() / (med * 1e-6) / 1e9
            key = (kind, vpath, json.dumps(vparams, sort_keys=True), dtype_id(dtype), triton.next_power_of_2(V))
            rows.append(
                {
                    "dtype": dtype_id(dtype),
                    "B": B,
                    "V": V,
                    "name": name,
                    "kind": kind,
                    "path": vpath,
                    "params": vparams,
                    "median_us": round(med, 2),
                    "min_us": round(min(t), 2),
                    "max_us": round(max(t), 2),
                    "frac_of_copy": round(gbps / 1e3 / copy_tbps, 3),
                    "x_F_softmax": round(meds["F.softmax"] / med, 3),
                    "bits_equal_dispatch": bits_equal,
                    "compiled": resources.get(key),
                }
            )
        print(f"done {what}", flush=True)
        write_result(args.out, sms, copy_tbps, failures, rows, done=False)  # what a cut-off run leaves
        del x, fns, y_disp
        if DEV == "cuda":
            torch.cuda.empty_cache()

    write_result(args.out, sms, copy_tbps, failures, rows, done=True)

    print(f"\nfailures: {len(failures)}")
    for f in failures[:30]:
        print("  ", f)
    print(f"\ncopy {copy_tbps:.3f} TB/s. Per shape: fraction of copy (x F.softmax) [registers as compiled here]")
    by = {}
    for r in rows:
        by.setdefault((r["dtype"], r["B"], r["V"]), []).append(r)
    for (d, B, V), rs in by.items():
        print(f"{d} B={B} V={V}: F {rs[0]['median_us']:.1f} us")
        for r in rs[1:]:
            c = r["compiled"] or {}
            reg = f" [{c.get('regs')}r/{c.get('spills')}s]" if "regs" in c else ""
            bits = "" if r["bits_equal_dispatch"] in (None, True) else " BITS DIFFER"
            t = f"{r['median_us']:>9.1f} us  {r['frac_of_copy']:.3f} ({r['x_F_softmax']:.2f}x)"
            print(f"   {r['name']:<26} {t}{reg}{bits}")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--aot", action="store_true", help="sm_90 builds and occupancy, no GPU")
    ap.add_argument("--cpu-bits", action="store_true", help="bits against the current kernels, interpreted")
    ap.add_argument("--cpu-smoke", action="store_true", help="check this script on CPU (see SMOKE)")
    args = ap.parse_args()
    if args.aot:
        print(json.dumps(run_aot(args.jobs)))
        return 0
    if args.cpu_bits:
        r = cpu_bits()
        print(json.dumps(r, indent=1))
        return 1 if r["failures"] else 0
    if SMOKE:
        importlib.import_module("tests.helpers")
    return timed_comparison(args)


if __name__ == "__main__":
    sys.exit(main())
