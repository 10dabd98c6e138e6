"""What every softmax test shares: one seeded input generator, one poisoned runner, one
comparison with the float64 reference and one tolerance table.

    x = logits(B, V, seed=1, dtype=torch.bfloat16, device="cuda", layout="offset:3")
    out = run_poisoned(SOFTMAX_KERNELS["fused"], x)
    check_softmax(out, x, what="fused offset:3")         # TOLERANCES, every output, row sums
    assert_as_accurate_as_torch(out, x, what="fused")    # and no worse than F.softmax
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest
import torch

from kernels.reference import softmax_ref
from kernels.registry import triton_missing
from kernels.spec import DTYPE_IDS, dtype_name

FP32_EPS = torch.finfo(torch.float32).eps
VECTOR_BYTES = 16  # the widest vector access of the kernels: alignment classes are counted in it


def dtype_id(dtype) -> str:
    """ "fp32" / "bf16" / "fp16": the dtype as test ids name it."""
    return DTYPE_IDS[dtype_name(dtype)]


# -- inputs ------------------------------------------------------------------------------------

OUTLIER = 30.0
NEG_INF_DENSITY = 50  # one -inf per this many entries, on average
# A row-stride layout pads each row so that the stride is odd: consecutive rows then start in
# every alignment class, and no vector width divides the stride.
_ROW_PADS = (5, 6)


def layouts(dtype) -> tuple[str, ...]:
    """Every input layout the suite runs a kernel on: contiguous, rows with a stride > V, a
    contiguous view at every other 16-byte alignment class (offset 0 is "contiguous"), and
    elements strided within a row."""
    classes = VECTOR_BYTES // torch.tensor([], dtype=dtype).element_size()
    return ("contiguous", "row_stride", *(f"offset:{k}" for k in range(1, classes)), "col_stride")


# Named input recipes (`logits(..., recipe=...)`). Each is drawn from the same seeded float64
# generator, then the outliers and -inf entries (where asked for) and the recipe's own last step.
RECIPES = {
    "randn": "randn * scale: the default",
    "plain": "randn * scale, never an outlier or a -inf entry (the inputs the issue's figures used)",
    "confident": "randn * scale, then one entry per row raised until it holds 0.999 of the row's mass",
    "span": "-uniform(0, 110) per entry (scale unused, no outliers): probabilities from ~1 down through every "
    "binade of float32 and past its smallest normal",
    "masked": "randn * scale with all but 1/2, 1/8, 1/64 or a single entry of each row -inf (row by row in "
    "turn), as a top-k or attention mask leaves it",
    "overflow": "randn * scale shifted so that each row's max lies at one of OVERFLOW_MAXIMA (row by row in "
    "turn): at and past where exp(x) itself overflows (88.72) or underflows in float32",
}
# exp(88.72) is float32's largest; a kernel that does not subtract the max overflows past it.
OVERFLOW_MAXIMA = (88.0, 88.72, 89.5, 100.0, 1000.0, 30000.0, -88.0, -30000.0)
_MASK_KEEP = (2, 8, 64, 0)  # masked: keep 1/k of a row's entries (0: a single one)
CONFIDENT_MASS = 0.999

# The inputs of the accuracy tests, (recipe, scale): wide ranges, one confident entry, the whole
# exponent range, masks and the overflow edge. ISSUE_CASES: (B, V, scale) of the measurements
# in the issue that asked for them ("plain" inputs).
TAIL_CASES = (
    ("randn", 4.0),
    ("randn", 8.0),
    ("randn", 20.0),
    ("confident", 3.0),
    ("span", 1.0),
    ("masked", 4.0),
    ("overflow", 3.0),
)
ISSUE_CASES = ((512, 600, 1.0), (64, 600, 8.0), (256, 32000, 4.0), (16, 128256, 10.0), (4, 262144, 4.0))


def logits(
    B: int,
    V: int,
    *,
    seed: int,
    dtype=torch.float32,
    device="cpu",
    layout: str = "contiguous",
    outliers: bool = True,
    neg_inf: bool = True,
    scale: float = 3.0,
    neg_inf_rows=(),
    recipe: str = "randn",
    on_device: bool = False,
) -> torch.Tensor:
    """A (B, V) tensor drawn in float64 from a generator of its own, then cast.

    recipe: one of RECIPES (randn * scale by default).
    outliers: every row gets a -30 and every even row a +30. A +30 makes one entry take
        nearly all of a row's mass, so a wrong max or a lost element shows there; odd rows keep
        their mass spread, so an error in the sum or in the small probabilities shows there.
    neg_inf: about one entry in NEG_INF_DENSITY is -inf (at least one per tensor), never a
        whole row; neg_inf_rows lists rows to make entirely -inf (their softmax is NaN).
    layout: see `layouts`; storage outside the view (padding, gaps, the bytes before an
        offset view) holds NaN, so a kernel that reads past its row poisons its own output.
    on_device: draw on `device` itself, in float32 with a generator of that device, instead of
        in float64 on the host: the same recipe for shapes too large to draw on the host (the
        benchmarks, the GPU byte cases); the values then differ from one device to another.
        The recipes "randn", "plain" and "span" only.
    The same seed gives the same values in every layout, dtype and device (on_device aside).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}: one of {', '.join(RECIPES)}")
    if on_device and recipe not in ("randn", "plain", "span"):
        raise ValueError(f"recipe {recipe!r} is drawn on the host only (on_device=False)")
    if recipe == "plain":
        outliers = neg_inf = False
    if recipe == "span":
        outliers = False  # a +30 would leave every other entry 30 nats down: the span is the point
    where = torch.device(device) if on_device else torch.device("cpu")
    draw = (B, V, seed, outliers, neg_inf, float(scale), tuple(neg_inf_rows), recipe)
    if not on_device:
        x = _host_draw(*draw)
        # The draw is shared by every call with the same arguments: a cast or placement that
        # would return it as it is must copy it.
        x = x.to(dtype, copy=True) if torch.device(device).type == "cpu" else x.to(dtype)
    else:
        x = _draw(where, torch.float32, *draw).to(dtype)
    return _place(x, layout, torch.device(device))


# Host draws are deterministic in their arguments, and the same one is asked for in many layouts,
# dtypes and kernels (a coverage cell, a property per path): the newest ones are kept, up to this
# many bytes per process, so a large shape is drawn once per process instead of once per call.
_DRAW_CACHE_BYTES = 1 << 30
_draws: dict = {}


def _host_draw(*draw) -> torch.Tensor:
    x = _draws.pop(draw, None)
    if x is None:
        x = _draw(torch.device("cpu"), torch.float64, *draw)
    _draws[draw] = x  # newest last
    while sum(t.numel() * t.element_size() for t in _draws.values()) > _DRAW_CACHE_BYTES and len(_draws) > 1:
        del _draws[next(iter(_draws))]
    return x


def _draw(where, wide, B, V, seed, outliers, neg_inf, scale, neg_inf_rows, recipe) -> torch.Tensor:
    """The recipe's values in `wide` (float64 on the host, float32 drawn on a device), uncast."""
    g = torch.Generator(device=where).manual_seed(seed)

    def randint(high, n):
        return torch.randint(0, high, (n,), generator=g, device=where)

    if recipe == "span":
        x = -torch.rand(B, V, generator=g, dtype=wide, device=where) * 110.0
    else:
        x = torch.randn(B, V, generator=g, dtype=wide, device=where) * scale
    if B and V >= 3 and outliers:
        rows = torch.arange(B, device=where)
        x[rows, randint(V, B)] = -OUTLIER
        x[rows[::2], randint(V, len(rows[::2]))] = OUTLIER
    if B and V >= 2 and neg_inf:
        n = max(1, B * V // NEG_INF_DENSITY)
        x[randint(B, n), randint(V, n)] = -math.inf
        lost = torch.isneginf(x).all(dim=1).nonzero().flatten()  # short rows may lose every entry
        x[lost, randint(V, len(lost))] = torch.randn(len(lost), generator=g, dtype=wide, device=where) * scale
    if B and V and recipe == "masked":
        keep = torch.tensor([_MASK_KEEP[r % len(_MASK_KEEP)] for r in range(B)])
        kept = torch.rand(B, V, generator=g, dtype=torch.float64) * torch.where(keep > 0, keep, 1)[:, None] < 1
        kept[keep == 0] = False
        # One entry of every row is kept and finite, so no row is masked whole.
        rows, one = torch.arange(B), torch.randint(0, V, (B,), generator=g)
        kept[rows, one] = True
        x[rows, one] = torch.where(torch.isneginf(x[rows, one]), 0.0, x[rows, one])
        x = torch.where(kept, x, -math.inf)
    if B and V and recipe == "confident":
        top = torch.randint(0, V, (B,), generator=g)
        rest = x.clone()
        rest[torch.arange(B), top] = -math.inf
        # p(top) = 1 / (1 + sum(exp(rest - top))): the top entry sits ln(mass / (1 - mass)) above
        # the rest's log-sum-exp (rows of one entry have no rest and hold all of their mass).
        # 0.3 nats more keep it above the mass after rounding to bf16 (steps of 0.25 up to 64).
        lift = torch.logsumexp(rest, dim=1) + math.log(CONFIDENT_MASS / (1 - CONFIDENT_MASS)) + 0.3
        x[torch.arange(B), top] = torch.where(torch.isfinite(lift), lift, x[torch.arange(B), top])
    if B and V and recipe == "overflow":
        target = torch.tensor([OVERFLOW_MAXIMA[r % len(OVERFLOW_MAXIMA)] for r in range(B)], dtype=torch.float64)
        finite = torch.where(torch.isneginf(x), -math.inf, x)
        x = x - finite.max(dim=1, keepdim=True).values + target[:, None]
    for row in neg_inf_rows:
        x[row] = -math.inf
    return x


def _place(values: torch.Tensor, layout: str, device: torch.device) -> torch.Tensor:
    B, V = values.shape
    dtype = values.dtype
    if layout == "contiguous":
        return values.to(device)
    if layout == "row_stride":
        buf = torch.full((B, V + _ROW_PADS[V % 2]), math.nan, dtype=dtype, device=device)
        buf[:, :V] = values
        return buf[:, :V]
    if layout == "col_stride":
        buf = torch.full((B, V, 2), math.nan, dtype=dtype, device=device)
        buf[..., 0] = values
        return buf[..., 0]
    if layout.startswith("offset:"):
        k = int(layout.removeprefix("offset:"))
        guard = VECTOR_BYTES // values.element_size()
        flat = torch.full((k + B * V + guard,), math.nan, dtype=dtype, device=device)
        x = flat[k : k + B * V].view(B, V)
        x.copy_(values)
        assert x.data_ptr() % VECTOR_BYTES == k * values.element_size() % VECTOR_BYTES, "allocation not aligned"
        return x
    raise ValueError(f"unknown layout {layout!r}: one of {layouts(dtype)} or offset:<k>")


# -- running a kernel --------------------------------------------------------------------------

GUARD_BYTES = 64  # NaN on both sides of the output, a multiple of 16 so the output stays aligned


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor, for bitwise comparisons (NaN payloads included)."""
    return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def run_poisoned(fn, x: torch.Tensor, *, out_offset: int = 0, **kwargs) -> torch.Tensor:
    """fn(x, out=out, **kwargs) into an `out` filled with NaN and framed by NaN guards; returns
    `out`. Asserts that fn wrote into the `out` it was given, wrote nothing outside it and left
    x unchanged. `out_offset` starts the output that many elements past a 16-byte boundary."""
    guard = GUARD_BYTES // x.element_size()
    n = x.numel()
    buf = torch.full((guard + out_offset + n + guard,), math.nan, dtype=x.dtype, device=x.device)
    start = guard + out_offset
    out = buf[start : start + n].view(x.shape)
    x_before = bits(x).clone()
    result = fn(x, out=out, **kwargs)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    name = getattr(fn, "name", getattr(fn, "__name__", repr(fn)))
    assert isinstance(result, torch.Tensor) and result.data_ptr() == out.data_ptr() and result.shape == out.shape, (
        f"{name} did not return the out tensor it was given"
    )
    outside = torch.cat([buf[:start], buf[start + n :]])
    assert torch.isnan(outside).all(), f"{name} wrote {int((~torch.isnan(outside)).sum())} elements outside out"
    assert torch.equal(bits(x), x_before), f"{name} changed its input"
    return out


# -- the tolerance table -----------------------------------------------------------------------
#
# How far a correct kernel's output y may be from p, the float64 softmax of the same input
# values. Every kernel computes in float32 whatever it stores (eps = 2^-23, one ulp of 1.0;
# relative errors below are in eps). For an entry x of a row with max m and p >= float32's
# smallest normal:
#
#   (a) s = x - m rounded to float32 is off by at most half an ulp of s: exp(s) is off by
#       eps/2 * |x - m|, half an ulp per nat of distance from the max. F.softmax, naive and
#       smem before, and every softmax that forms x - m in float32 keep this error; the
#       suite's kernels now cancel it (2Sum), but the bound is for any correct softmax.
#   (b) exp itself: 2 ulps (CUDA's expf and ex2.approx on an exact argument; NumPy's and
#       PyTorch's CPU exp measured below 1.8 eps). The fast form 2^(s * L) that fp32 outputs
#       no longer use adds the rounding of s * L and L's own error: ~1.1 eps per nat.
#   (c) normalising: a quotient rounded once (half an ulp) or a reciprocal and a product (1).
#   (d) the row's normaliser, a sum of exponentials: it carries their errors averaged by mass,
#       at most eps * (3 + D/2) with D = sum_j p_j |x_j - m|, plus the summation's own
#       rounding: nothing but the float conversion in the fixed-point sums, up to ~sqrt(V)
#       ulps in a float32 one (measured: F.softmax on the CPU drifts by 480 eps at V = 262144).
#
# (a)-(c) are an output's own error, at most eps * (EXP_ULPS + |x - m| / 2) with EXP_ULPS = 3;
# (d) scales a whole row alike, so it shows in the row's sum. The rule checks them apart:
#
#   elementwise: y / sum(y over the row) against p, relative, within
#                eps * (2 * EXP_ULPS + (|x - m| + D) / 2)   (the row's own scale divided out)
#   row sums:    |sum(y) - 1| <= eps * (16 + sqrt(V))       (row_sum_tolerance)
#   log-probs:   |log y - log p| in nats within the two combined, -log(1 - rel)
#   below the normal range (where p, less the error allowed above, is no longer a normal
#   float32): |y - p| <= float32's smallest normal (the kernels flush to zero there).
#
# 16-bit storage rounds that float32 result once: half an ulp of the stored format when it
# rounds to nearest (the kernels on the GPU, F.softmax), under one ulp when it merely truncates
# (Triton's interpreter converts float32 to bf16 so). The rule allows one ulp, plus 1/16 ulp
# for the float32 error before it (2^-15 relative for fp16, 2^-12 for bf16: a few times the
# largest float32 error above): |y - p| <= 17/16 ulp(p) of the stored format. Below its normal
# range: the subnormal spacing (fp16), or float32's smallest normal (bf16: the float32
# arithmetic flushes to zero there).
#
# Beside it, the rule PyTorch's own tests and the fused cross-entropy kernels of the field use:
# a kernel's largest error over a tensor may be at most K times that of F.softmax computed in
# the same dtype on the same input. K = 1.0: the kernels must be at least as accurate as the
# library they replace. Where F.softmax happens to be nearly exact (short rows near their max)
# the comparison is against a floor instead: RATIO_FLOOR_ULPS eps for float32, what the
# suite's kernels may err by anywhere (2 ulps of ex2, half an ulp of the fma that corrects it,
# half of the quotient or one where underflow loses its correction, half for the row's sum
# rounded to float, 1/8 for the truncated fixed-point terms at V = 2^18: 4.1, rounded up).
# Rows whose max is large against their spread (x - m exact by Sterbenz's lemma, as in the
# overflow recipe) leave F.softmax with no more error than that. For 16-bit storage the floor
# is the 17/16-ulp bound itself: both round once, and the rule adds nothing to the absolute one.
#
# The training operations (the softmax backward and cross-entropy) are held to the same table:
# their rows below are the per-dtype fields train_ulps, train_k, train_floor of each entry and
# the fixed-point term fixed_point_error. Their outputs can cancel to ~0 (dy - S, p_j - [j == t]),
# so a bound relative to the result would be arbitrary: each element is bounded by the float32
# roundings of the terms it is formed from, scaled by the magnitudes of those terms.
#
#   softmax backward  dx_j = y_j (dy_j - S), S = sum_k y_k dy_k, A = sum_k |y_k dy_k|, V terms:
#
#     |dx_j - ref_j| <= TRAIN_ULPS eps |y_j| (|dy_j| + |S| + A)      the float32 arithmetic
#                     + |y_j| (2 fixed_point_error(V) A + V 2^-126)   the fixed-point row sum
#                     + storage |ref_j|                               one rounding into 16 bits
#                     + floor (1 + |dy_j| + |S|)                      below the normal range
#
#   A correct kernel rounds at most four times on the way to dx_j: each product y_k dy_k (u A
#   over the sum; the CUDA kernel adds them exactly), S once when it leaves the fixed point
#   (u |S|), dy_j - S (u (|dy_j| + |S|)) and the product with y_j (u |dx_j|): under
#   3 u (|dy_j| + |S| + A) |y_j|, u = eps / 2. TRAIN_ULPS = 4 eps = 8 u leaves a factor 2.7;
#   a lost term, a wrong sign or a sum that drifts (sqrt(V) to V roundings of S) exceeds it.
#   storage: 0 for float32 (the last rounding is in the arithmetic term), one ulp of the stored
#   format for 16-bit outputs (round to nearest is half of it; the interpreter truncates).
#   floor: the format's subnormal spacing (fp16), or float32's smallest normal where the
#   float32 arithmetic flushes (fp32, bf16), plus that of y_j flushed to 0 (times |dy_j - S|).
#
#   The fixed-point row sum (kernels/triton_loss_kernels.py, softmax_backward.cu's FreeSum):
#   both kernels scale every term so that the largest, M in [2^(E-1), 2^E), lies below 2^K with
#   K = 62 - ceil(log2 V), and sum integers; one unit of the result is 2^(E - K) <= 2 M 2^-K.
#   The Triton kernels truncate each term (under one unit); the CUDA kernel rounds the product
#   and its FMA-exact remainder to nearest (half a unit each): at most one unit a term in both,
#   so one bound holds for both: V units <= 2 M V 2^-K = 2 fixed_point_error(V) M, M <= A
#   (fixed_point_error(V) = V 2^-K <= 2^(2 ceil(log2 V) - 62)). The Triton kernels cap the scale
#   at 2^126 (rows whose largest product is below ~2^-64 / V): their unit is then 2^-126, which
#   adds V 2^-126 absolutely. The exponential sums of cross-entropy (terms in [0, 1] at the fixed
#   scale 2^K) err by fixed_point_error(V) itself: under one unit a term truncated (Triton), half
#   of one rounded to nearest (CUDA).
#
#   cross-entropy: ce_ulps eps per chain of roundings (exponential, logarithm, sums), the same
#   storage, floor and fixed_point_error, in one derivation written beside its function,
#   cross_entropy_expected, for both kernel families: each forms the loss relative to the row's
#   max, (max - x_t) + log1p(...), the smoothing sum as sum w_j (x_j - max), and p_t - 1 from an
#   exact integer difference, so none is allowed the rounding of lse - x_t (eps |x_t|) or of
#   1 minus a probability near 1 (eps p_t).
#
# The ratio rule for the training operations: the worst error over the tensor, in units of
# the bound above (|error| / bound, element by element), at most train_k times that of
# PyTorch's own kernel on the same input in the same dtype (torch._softmax_backward_data,
# F.cross_entropy), or train_k * train_floor where PyTorch is nearly exact: TRAIN_RATIO_FLOOR of
# the bound whatever k. train_k: 1 for float32 (the kernels must be at least as accurate as the
# library they replace); 2 for 16-bit outputs, where one rounding of the output is most of the
# bound and PyTorch's cast can land on the nearer side.


@dataclass(frozen=True)
class Tolerance:
    """How far a softmax output of one storage dtype may be from the float64 reference, and
    (train_*, ce_ulps) a softmax backward's or cross-entropy's output (the derivation is above
    this class)."""

    dtype: torch.dtype
    exp_ulps: float  # an output's own float32 error at x = max: exp, normalisation
    per_nat: float  # and per nat of |x - max|: the rounding of x - max
    row_ulps: float  # a row's sum: eps32 * (row_ulps + sqrt(V)), plus one ulp of 16-bit storage
    store_ulps: float | None  # 16-bit storage: bound in ulps of the stored format; None for fp32
    k: float  # ratio to F.softmax's error on the same input
    k_floor: float  # ... or to this floor (fp32: eps; 16-bit: ulps of the stored format)
    train_ulps: float  # softmax backward: float32 eps per element's chain of roundings
    ce_ulps: float  # cross-entropy: float32 eps per operation chain (exp, log, sums)
    train_k: float  # their ratio to PyTorch's error on the same input, in units of the bound
    train_floor: float  # ... or to this floor, in units of the bound (train_k * it is allowed)

    @property
    def eps(self) -> float:
        return torch.finfo(self.dtype).eps

    @property
    def tiny(self) -> float:
        """Smallest normal of the storage format: outputs below it get the absolute floor."""
        return torch.finfo(self.dtype).smallest_normal

    @property
    def floor(self) -> float:
        """Absolute bound below the normal range: float32 arithmetic flushes to zero below its
        smallest normal (bf16 shares that range); fp16 rounds to its subnormal spacing."""
        fi = torch.finfo(self.dtype)
        return max(fi.smallest_normal * fi.eps * (self.store_ulps or 1.0), FP32_TINY)

    @property
    def storage(self) -> float:
        """Training outputs: the relative error of one rounding of a float32 result into the
        stored format (under one ulp); 0 for float32, whose last rounding is the arithmetic's."""
        return 0.0 if self.store_ulps is None else self.eps

    @property
    def train_floor_abs(self) -> float:
        """Training outputs: the absolute error allowed below the normal range, the format's
        subnormal spacing (fp16) or float32's smallest normal (fp32, bf16: flushed to zero)."""
        fi = torch.finfo(self.dtype)
        return max(fi.smallest_normal * fi.eps, FP32_TINY)

    def row_sum(self, V: int) -> float:
        """How far a row of V outputs may sum from 1 (see row_sum_tolerance)."""
        storage = 0.0 if self.store_ulps is None else self.eps
        return storage + FP32_EPS * (self.row_ulps + math.sqrt(V))


FP32_TINY = torch.finfo(torch.float32).smallest_normal
EXP_ULPS = 3.0
PER_NAT = 0.5
RATIO_K = 1.0
RATIO_FLOOR_ULPS = 5.0
STORE_ULPS = 17 / 16
TRAIN_ULPS = 4.0
CE_ULPS = 8.0
TRAIN_K = 1.0
TRAIN_K_16BIT = 2.0
TRAIN_RATIO_FLOOR = 0.05


def _training_fields(k: float) -> dict:
    """The training operations' fields of a TOLERANCES entry whose ratio rule allows k."""
    return {"train_ulps": TRAIN_ULPS, "ce_ulps": CE_ULPS, "train_k": k, "train_floor": TRAIN_RATIO_FLOOR / k}


TOLERANCES = {
    torch.float32: Tolerance(
        torch.float32, EXP_ULPS, PER_NAT, 16.0, None, RATIO_K, RATIO_FLOOR_ULPS, **_training_fields(TRAIN_K)
    ),
    **{
        dt: Tolerance(dt, EXP_ULPS, PER_NAT, 16.0, STORE_ULPS, RATIO_K, STORE_ULPS, **_training_fields(TRAIN_K_16BIT))
        for dt in (torch.bfloat16, torch.float16)
    },
}

# The PyTorch port's equivalence contract with the NumPy model (fixed by the project, not derived
# from the kernels' error analysis): every tensor of the port, and anything that compares two
# runs of the whole model, within atol = rtol = 1e-5 of the other.
PORT_ATOL = PORT_RTOL = 1e-5


def fixed_point_error(V: int) -> float:
    """V 2^-K = V 2^(ceil(log2 V) - 62): the most a 64-bit fixed-point sum of V terms in the
    training kernels may err by, relative to the scale 2^E its terms lie below (1 for the
    exponential sums, at most twice the largest term for the others; the derivation above
    TOLERANCES)."""
    return V * 2.0 ** ((max(int(V), 1) - 1).bit_length() - 62)


# -- comparing with the reference --------------------------------------------------------------

_SHOWN = 6  # mismatches printed per kind


def _np(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _where(mask, got, ref=None, bound=None) -> str:
    """The first few positions of `mask`, with got, ref and (error, allowed) there (NumPy
    arrays or tensors: only a failing check comes here)."""
    mask, got = _np(mask), _np(got)
    ref = None if ref is None else _np(ref)
    bound = None if bound is None else (_np(bound[0]), _np(bound[1]))
    idx = np.argwhere(mask)[:_SHOWN]
    parts = []
    for i in map(tuple, idx):
        at = ", ".join(str(int(k)) for k in i)
        part = f"({at}) got {got[i]:.9g}" + ("" if ref is None else f" expected {ref[i]:.9g}")
        parts.append(part + ("" if bound is None else f" (error {bound[0][i]:.3g}, allowed {bound[1][i]:.3g})"))
    more = " ..." if mask.sum() > _SHOWN else ""
    return "; ".join(parts) + more


def ulp_of(p: torch.Tensor, dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at the magnitude of p (p >= 0, float64): the
    spacing of the binade p lies in, or the subnormal spacing below the normal range."""
    fi = torch.finfo(dtype)
    return torch.exp2(torch.floor(torch.log2(torch.clamp(p, min=fi.smallest_normal)))) * fi.eps


def _quantile(v: torch.Tensor, q: float) -> float:
    """np.quantile(v, q) (linear interpolation) without sorting or copying v off its device."""
    n = v.numel()
    if n == 0:
        return 0.0
    pos = q * (n - 1)
    lo = math.floor(pos)
    a = torch.kthvalue(v, lo + 1).values.item()
    b = torch.kthvalue(v, min(lo + 2, n)).values.item()
    return a + (b - a) * (pos - lo)


@dataclass
class SoftmaxErrors:
    """Every output of `got` against the float64 softmax `ref` of its input (computed by the
    NumPy reference), with what TOLERANCES allows; float64 tensors on got's device, so a
    comparison of a large GPU output costs no pass of the host over it. `summary` gives the
    figures the manifest records."""

    got: torch.Tensor
    ref: torch.Tensor
    tol: Tolerance
    normal: torch.Tensor  # outputs held to the relative rule (reference >= the format's tiny)
    below: torch.Tensor  # finite outputs whose reference is below the normal range
    rel: torch.Tensor  # |got - ref| / ref where normal, else 0
    elem: torch.Tensor  # the elementwise quantity checked (fp32: rel. after the row scale; 16-bit: ulps)
    elem_bound: torch.Tensor
    logp: torch.Tensor  # |log got - log ref| where normal, else 0
    logp_bound: torch.Tensor
    abs_err: torch.Tensor  # |got - ref| where both are finite, else 0
    allowed: torch.Tensor  # the |got - ref| the rule allows at each output (relative bounds combined)

    def summary(self) -> dict:
        rel = self.rel[self.normal]
        ulps = (self.got - self.ref).abs()[self.normal] / ulp_of(self.ref[self.normal], self.tol.dtype)

        def top(t):
            return float(t.max().item()) if t.numel() else 0.0

        return {
            "max_rel_err": top(rel),
            "p999_rel_err": _quantile(rel, 0.999),
            "max_logp_err_nats": top(self.logp),
            "max_err_ulps": top(ulps),
            "max_abs_err": top(self.abs_err),
            "normal_outputs": int(self.normal.sum().item()),
        }


def tolerance(dtype, kernel=None) -> Tolerance:
    """TOLERANCES[dtype], with the fields the registry kernel's spec overrides for that dtype
    (`KernelSpec.tolerances`, e.g. {"k": 2.0}) replaced."""
    override = kernel.tolerance(dtype) if kernel is not None else None
    return dataclasses.replace(TOLERANCES[dtype], **override) if override else TOLERANCES[dtype]


def softmax_errors(got: torch.Tensor, x: torch.Tensor, *, dtype=None, kernel=None) -> SoftmaxErrors:
    """`got` against the float64 softmax of `x` over the last axis, with tolerance(dtype,
    kernel)'s bounds for every output (dtype: got's by default). An output is held to the
    relative rule where its reference, less all the error the rule allows it, is still a normal
    number of the format; below that it may be flushed to zero or be subnormal, and the absolute
    floor holds. The reference is kernels.reference.softmax_ref (NumPy, float64 accumulation);
    the comparison runs in float64 on got's device."""
    tol = tolerance(got.dtype if dtype is None else dtype, kernel)
    dev = got.device
    g = got.detach().to(torch.float64)
    x64 = x.detach().to("cpu", torch.float64)
    r = torch.from_numpy(softmax_ref(x64.numpy())).to(dev)
    if g.shape != r.shape:
        raise AssertionError(f"shape {tuple(g.shape)}, expected {tuple(r.shape)}")
    xs = x64.to(dev)
    zero, one = g.new_zeros(()), g.new_ones(())
    both = torch.isfinite(g) & torch.isfinite(r)
    gz, rz = torch.where(both, g, zero), torch.where(both, r, zero)
    rp = torch.where(rz > 0, rz, one)
    if tol.store_ulps is None:
        finite = torch.isfinite(xs)
        row_max = torch.where(finite, xs, -math.inf).amax(dim=-1, keepdim=True) if xs.shape[-1] else xs
        dist = torch.where(finite, row_max - xs, zero)
        dist = torch.nan_to_num(dist, nan=0.0, posinf=0.0)  # rows of all -inf: -inf - -inf
        mean_dist = (rz * dist).sum(dim=-1, keepdim=True)
        elem_bound = tol.eps * (2 * tol.exp_ulps + tol.per_nat * (dist + mean_dist))
        direct = (1 + elem_bound) * (1 + tol.row_sum(r.shape[-1])) - 1
    else:
        ulp = ulp_of(rp, tol.dtype)
        elem_bound = torch.full_like(r, tol.store_ulps)
        direct = tol.store_ulps * ulp / rp
    normal = both & (rz >= tol.tiny) & (rz * (1 - direct) >= tol.tiny)
    below = both & ~normal
    abs_err = (gz - rz).abs()
    r1 = torch.where(normal, rz, one)
    rel = torch.where(normal, abs_err / r1, zero)
    if tol.store_ulps is None:
        # The row's own scale divided out: sum(got) over the row's finite outputs.
        scale = gz.sum(dim=-1, keepdim=True)
        elem = torch.where(normal, (gz / torch.where(scale > 0, scale, one) - rz).abs() / r1, zero)
    else:
        elem = torch.where(normal, abs_err / ulp_of(r1, tol.dtype), zero)
    logp = torch.where(normal, (torch.log(torch.where(normal & (g > 0), g, one)) - torch.log(r1)).abs(), zero)
    logp = torch.where(normal & ~(g > 0), math.inf, logp)
    logp_bound = -torch.log1p(-torch.clamp(direct, max=0.5))
    allowed = torch.where(normal, direct * r1, tol.floor)
    return SoftmaxErrors(g, r, tol, normal, below, rel, elem, elem_bound, logp, logp_bound, abs_err, allowed)


def accuracy_gated(kernel) -> bool:
    """Whether TOLERANCES gate a registry kernel's outputs: ours do, and so does F.softmax, the
    yardstick of the ratio rule, which must meet the absolute rule itself (if it does not, the
    rule is wrong). torch.compile(F.softmax) is measured, not gated: Inductor's arithmetic is
    not ours to fix (the issue measured it at 5e-5 relative, 20 x F.softmax, at V = 262144), so
    only the placement of its NaN and ±inf is asserted and its errors are recorded."""
    from kernels import BASELINE

    return not kernel.baseline or kernel.name == BASELINE


def assert_softmax_close(
    got: torch.Tensor,
    x: torch.Tensor,
    *,
    dtype=None,
    what: str = "",
    record=None,
    gated: bool | None = None,
    kernel=None,
) -> dict:
    """`got` against the float64 softmax of `x` (over the last axis) within TOLERANCES[dtype]
    (dtype: got's by default): every output at or above the format's smallest normal by the
    elementwise rule and as a log-probability, every one below it by the absolute floor. NaN is
    expected exactly where the reference has it (all -inf rows); NaN elsewhere, numbers where
    NaN belongs, and ±inf are reported apart from plain mismatches, each with a count and the
    first indices. gated=False (see accuracy_gated) asserts only those NaN and ±inf placements;
    by default a registry `kernel` is gated as accuracy_gated says, with its spec's tolerance
    overrides, and anything else is gated. Returns SoftmaxErrors.summary() (`record` gets its
    max_abs_err)."""
    return _assert_close(got, x, dtype=dtype, what=what, record=record, gated=gated, kernel=kernel)[0]


def _assert_close(got, x, *, dtype, what, record, gated, kernel) -> tuple[dict, SoftmaxErrors]:
    if gated is None:
        gated = accuracy_gated(kernel) if kernel is not None else True
    try:
        e = softmax_errors(got, x, dtype=dtype, kernel=kernel)
    except AssertionError as err:
        raise AssertionError(f"{what}: {err}") from None
    g, r, tol = e.got, e.ref, e.tol
    summary = e.summary()
    if record is not None:
        record(summary["max_abs_err"])
    nan_g, nan_r = torch.isnan(g), torch.isnan(r)
    inf_g = torch.isinf(g)
    problems = []
    if (nan_g & ~nan_r).any():
        problems.append(
            f"{int((nan_g & ~nan_r).sum())} NaN where the reference is a number (unwritten or lost): "
            + _where(nan_g & ~nan_r, g, r)
        )
    if (nan_r & ~nan_g).any():
        problems.append(
            f"{int((nan_r & ~nan_g).sum())} numbers where the reference is NaN (an all -inf row): "
            + _where(nan_r & ~nan_g, g)
        )
    if inf_g.any():
        problems.append(f"{int(inf_g.sum())} ±inf: " + _where(inf_g, g, r))
    off = e.normal & ~(e.elem <= e.elem_bound) & gated
    if off.any():
        kind = (
            "relative to the reference once the row's own sum is divided out"
            if tol.store_ulps is None
            else f"ulps of {dtype_id(tol.dtype)}"
        )
        problems.append(
            f"{int(off.sum())} of {int(e.normal.sum())} normal outputs beyond the elementwise bound ({kind}; "
            f"worst {e.elem[off].max().item():.3g}, worst relative error {e.rel[off].max().item():.3g}): "
            + _where(off, g, r, (e.elem, e.elem_bound))
        )
    low = e.below & ~(e.abs_err <= tol.floor) & gated
    if low.any():
        problems.append(
            f"{int(low.sum())} outputs below the normal range off by more than {tol.floor:.3g}: " + _where(low, g, r)
        )
    bad_logp = e.normal & ~(e.logp <= e.logp_bound) & gated
    if bad_logp.any():
        problems.append(
            f"{int(bad_logp.sum())} log-probabilities beyond their bound "
            f"(worst {e.logp[bad_logp].max().item():.3g} nats): " + _where(bad_logp, g, r, (e.logp, e.logp_bound))
        )
    if problems:
        head = f"{what or 'softmax'} ({dtype_id(tol.dtype)}, shape {tuple(g.shape)})"
        if kernel is not None and (off.any() or bad_logp.any()):
            problems.append(tolerance_verdict(got, x, kernel))
        raise AssertionError(head + ":\n  " + "\n  ".join(problems))
    return summary, e


def tolerance_verdict(got: torch.Tensor, x: torch.Tensor, kernel) -> str:
    """What a contributor reads when a registry kernel fails on accuracy: its largest error
    measured against F.softmax's on the same input, and the KernelSpec field that states a looser
    rule for a kernel knowingly less accurate."""
    r = ratio_to_torch(got, x, kernel=kernel)
    k = max(1, math.ceil(r["x_F_softmax"])) if math.isfinite(r["x_F_softmax"]) else None
    example = f"{{{dtype_name(got.dtype)!r}: {{'k': {k}}}}}" if k else "(no finite ratio states it)"
    return (
        f"measured: largest error {r['ours']:.3g} ({r['unit']}), {r['x_F_softmax']:.3g} x F.softmax's "
        f"{r['F_softmax']:.3g} on this input; a kernel held to a looser rule states it in its KernelSpec "
        f"field `tolerances`, e.g. tolerances={example}"
    )


def _ratio_rule(ours: float, theirs: float, k: float, floor: float) -> tuple[float, float]:
    """The ratio rule's verdict, forward and training alike: (allowed, ours / theirs); `ours`
    passes when it is at most allowed = k * max(theirs, floor)."""
    ratio = ours / theirs if theirs > 0 else (0.0 if ours == 0 else math.inf)
    return k * max(theirs, floor), ratio


def ratio_to_torch(got: torch.Tensor, x: torch.Tensor, *, reference: torch.Tensor | None = None, kernel=None) -> dict:
    """The ratio rule's figures: the largest error of `got` and of F.softmax on the same x in
    the same dtype (`reference`: that output, if already computed), in the rule's units (fp32:
    relative; 16-bit: ulps of the format), and what TOLERANCES allows (with a registry `kernel`'s
    own fields, KernelSpec.tolerances)."""
    tol = tolerance(got.dtype, kernel)
    if reference is None:
        reference = torch.softmax(x, dim=-1)
    ours, theirs = softmax_errors(got, x).summary(), softmax_errors(reference, x).summary()
    unit = "max_rel_err" if tol.store_ulps is None else "max_err_ulps"
    floor = tol.k_floor * (tol.eps if tol.store_ulps is None else 1.0)
    allowed, ratio = _ratio_rule(ours[unit], theirs[unit], tol.k, floor)
    return {
        "ours": ours[unit],
        "F_softmax": theirs[unit],
        "allowed": allowed,
        "unit": "relative" if tol.store_ulps is None else f"ulps of {dtype_id(tol.dtype)}",
        "x_F_softmax": ratio,
        "summary": ours,
        "F_softmax_summary": theirs,
    }


def assert_as_accurate_as_torch(
    got: torch.Tensor, x: torch.Tensor, *, what: str = "", reference=None, kernel=None
) -> dict:
    """The ratio rule: `got`'s largest error over the tensor at most TOLERANCES' k times that of
    F.softmax on the same input in the same dtype (or k times the floor), k as a registry
    `kernel`'s spec states it. Returns ratio_to_torch."""
    r = ratio_to_torch(got, x, reference=reference, kernel=kernel)
    tol = tolerance(got.dtype, kernel)
    assert r["ours"] <= r["allowed"], (
        f"{what or 'softmax'} ({dtype_id(got.dtype)}, shape {tuple(got.shape)}): largest error {r['ours']:.3g} "
        f"({r['unit']}) against F.softmax's {r['F_softmax']:.3g} on the same input: {r['x_F_softmax']:.3g} x, "
        f"allowed {tol.k} x (or {tol.k_floor} {'eps' if tol.store_ulps is None else 'ulps'}: {r['allowed']:.3g})"
        + ("" if kernel is None else "; " + tolerance_verdict(got, x, kernel))
    )
    return r


def assert_outputs_agree(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, *, what: str = "") -> None:
    """Two softmax outputs of the same x (same dtype) agree as TOLERANCES allows each to differ
    from the float64 reference: |a - b| within the sum of their two bounds at every output, NaN
    at the same places."""
    ea, eb = softmax_errors(a, x), softmax_errors(b.to(a.device), x)
    nan_a, nan_b = torch.isnan(ea.got), torch.isnan(eb.got)
    assert torch.equal(nan_a, nan_b), f"{what}: NaN at different places ({int((nan_a != nan_b).sum())} outputs)"
    diff = torch.nan_to_num(ea.got - eb.got, nan=0.0).abs()
    off = ~(diff <= ea.allowed + eb.allowed)
    assert not off.any(), (
        f"{what} ({dtype_id(a.dtype)}): {int(off.sum())} outputs differ by more than their two bounds: "
        + _where(off, ea.got, eb.got, (diff, ea.allowed + eb.allowed))
    )


def row_sum_tolerance(V: int, dtype=torch.float32) -> float:
    """How far a correct kernel's row of V probabilities may sum from 1 (TOLERANCES[dtype]).

    fp32 arithmetic: the error of the exponentials and the division is a few ulps, and a sum
    taken in blocks or a tree (or exactly) grows at most like sqrt(V) ulps; a long row added
    one term at a time in fp32 drifts linearly and leaves this bound (1.4e-4 at V = 128256),
    which is what the bound is for. 16-bit storage adds one rounding of every output: at most
    half an ulp of the row's total mass, bounded here by a whole ulp.
    """
    return TOLERANCES[dtype].row_sum(V)


def storage_rounding(ref, dtype) -> np.ndarray:
    """Per row, how far the exact probabilities `ref` (float64) sum from their own sum once each
    is rounded to `dtype`: what storing the row costs a correct kernel. Negligible unless many
    of them fall below the format's smallest normal number, where its absolute spacing takes
    over (fp16 at V in the millions, where most of a row's elements round to 0 or a few
    subnormal steps)."""
    if dtype == torch.float32:
        return np.zeros(ref.shape[:-1])
    ref = ref if isinstance(ref, torch.Tensor) else torch.from_numpy(ref)
    rounded = ref.to(dtype).to(torch.float64)
    return _np((rounded.nansum(dim=-1) - ref.nansum(dim=-1)).abs())


def assert_rows_sum_to_one(got: torch.Tensor, *, dtype=None, what: str = "", slack=None) -> None:
    """Every row of `got` sums to 1 within row_sum_tolerance(V, dtype) (NaN rows fail), plus
    `slack` per row where given (storage_rounding of the reference)."""
    dtype = got.dtype if dtype is None else dtype
    V = got.shape[-1]
    tol = row_sum_tolerance(V, dtype) + (0.0 if slack is None else np.asarray(slack))
    sums = got.detach().to(torch.float64).sum(dim=-1).cpu().numpy()
    bad = ~(np.abs(sums - 1.0) <= tol)
    if bad.any():
        drift = np.abs(sums - 1.0)
        raise AssertionError(
            f"{what or 'softmax'} ({dtype_id(dtype)}, V = {V}): {int(bad.sum())} of {sums.size} rows do not sum to 1 "
            f"within {np.max(tol):.3g} (worst drift {np.nanmax(drift) if not np.isnan(drift).all() else np.nan:.3g}): "
            + _where(bad, sums)
        )


def check_softmax(
    got: torch.Tensor, x: torch.Tensor, *, what: str = "", record=None, gated: bool | None = None, kernel=None
) -> dict:
    """The whole contract of a softmax output: assert_softmax_close to the reference (NaN exactly
    in the rows of x that are all -inf; a registry `kernel` held to its spec) and
    assert_rows_sum_to_one for every other row, less what storing the exact row in the output's
    dtype costs; with gated=False (accuracy_gated) only the NaN and ±inf placements. Returns
    assert_softmax_close's summary."""
    if gated is None:
        gated = accuracy_gated(kernel) if kernel is not None else True
    summary, e = _assert_close(got, x, dtype=None, what=what, record=record, gated=gated, kernel=kernel)
    if gated:
        defined = ~torch.isneginf(x).all(dim=-1).to(got.device)
        slack = storage_rounding(e.ref[defined], got.dtype)
        assert_rows_sum_to_one(got[defined], dtype=got.dtype, what=what, slack=slack)
    return summary


# -- what an offline CUDA build must show ---------------------------------------------------------


def assert_builds_clean(report: dict, expected, source: str) -> None:
    """Every entry point the dispatcher launches (`expected`) is in ptxas's `report` for `source`,
    with no stack frame, no spill and at most 64 registers (the launch bounds promise >= 1024
    resident threads per SM)."""
    missing = sorted(set(expected) - set(report))
    assert not missing, f"{source}: entry points the dispatcher launches were not compiled: {missing}"
    for name in expected:
        r = report[name]
        assert {"registers", "stack_bytes", "spill_stores", "spill_loads"} <= set(r), (name, r)
        assert r["stack_bytes"] == 0, f"{name}: {r['stack_bytes']} bytes stack frame (arrays in local memory)"
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{name} spills: {r}"
        assert r["registers"] <= 64, f"{name} uses {r['registers']} registers"


# -- which machine a kernel needs --------------------------------------------------------------

# Whether the kernels run on CPU tensors through Triton's interpreter (the conftest sets the
# variable where no GPU is visible, before any kernel module is imported).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Why Triton cannot be used on this machine (it publishes Linux wheels only), or None. Every test
# that needs it skips with this one reason.
TRITON_MISSING = triton_missing()
needs_triton = pytest.mark.skipif(TRITON_MISSING is not None, reason=TRITON_MISSING or "")


def triton_module():
    """kernels.softmax_triton, or None where Triton is missing (its tests skip: needs_triton)."""
    return None if TRITON_MISSING else importlib.import_module("kernels.softmax_triton")


def needs_cupy(kernel) -> bool:
    """Whether a registry kernel is one of the CUDA C kernels, compiled through CuPy."""
    return kernel.backend == "cupy"


def skip_if_unavailable(kernel) -> None:
    """Skip (with the reason) a test whose kernel's backend package is missing here (Triton
    off Linux): what even its plan and its CPU cases need."""
    reason = kernel.unavailable_reason()
    if reason:
        pytest.skip(reason)


def skip_unless_runnable(kernel) -> None:
    """Skip (with the reason) a test whose kernel cannot run on this machine: its backend's
    package is missing, or it is launched through CuPy and CuPy cannot be used."""
    skip_if_unavailable(kernel)
    if needs_cupy(kernel):
        from tests.suite.gpus import cupy_unusable_reason

        reason = cupy_unusable_reason()
        if reason:
            pytest.skip(reason)


# -- one path of a kernel ------------------------------------------------------------------------


def path_runner(kernel, path: str, **params):
    """fn(x, *, out) that runs a registry kernel through the named path with launch parameters
    `params` (kernel.run_path), in run_poisoned's calling convention."""

    def run(x, *, out=None):
        return kernel.run_path(x, path, out=out, **params)

    run.__name__ = f"{kernel.name} via {path}"
    return run


def cpu_path_runner(kernel, path: str):
    """path_runner with the launch parameters the kernel's spec gives the path for the CPU (the
    Triton interpreter): scaled down so that rows of tens of elements span several tiles."""
    return path_runner(kernel, path, **kernel.path(path).cpu)


# -- training: the softmax backward and cross-entropy ------------------------------------------------
# Inputs, poisoned runs and comparisons for the two training operations. Their tolerances are
# rows of TOLERANCES (train_ulps, ce_ulps, storage, train_floor_abs, fixed_point_error; the
# derivation is above the table); every comparison goes through assert_within, and the ratio
# to PyTorch's own error through assert_no_less_accurate_than_torch.

UNIT_ROUNDOFF = FP32_EPS / 2


def softmax_and_grad(
    B: int,
    V: int,
    *,
    seed: int,
    dtype=torch.float32,
    device="cpu",
    layout_y: str = "contiguous",
    layout_dy: str = "contiguous",
    dy_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, dy) for a softmax backward: y the float64 softmax of logits(B, V, seed=seed) cast to
    dtype (-inf logits give exact zeros, the +30 outliers nearly one-hot rows), dy randn *
    dy_scale from seed + 1. Each is placed in its own layout (see `layouts`), so y and dy can
    differ in alignment and stride."""
    y = torch.softmax(logits(B, V, seed=seed, dtype=torch.float64), dim=-1).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    dy = (torch.randn(B, V, generator=g, dtype=torch.float64) * dy_scale).to(dtype)
    return _place(y, layout_y, torch.device(device)), _place(dy, layout_dy, torch.device(device))


def place(values: torch.Tensor, layout: str, device="cpu") -> torch.Tensor:
    """`values` copied into `layout` (see `layouts`; NaN outside the view) on `device`."""
    return _place(values, layout, torch.device(device))


def targets(N: int, V: int, *, seed: int, ignore_rows=(), ignore_index: int = -100, dtype=torch.int64, device="cpu"):
    """(N,) class indices drawn from their own generator; `ignore_rows` set to ignore_index."""
    g = torch.Generator().manual_seed(seed + 7)
    t = torch.randint(0, V, (N,), generator=g)
    for row in ignore_rows:
        t[row] = ignore_index
    return t.to(device=device, dtype=dtype)


def cross_entropy_inputs(
    N: int,
    V: int,
    *,
    seed: int,
    dtype=torch.float32,
    device="cpu",
    layout: str = "contiguous",
    ignore_index: int = -100,
    ignored: int = 3,
    neg_inf: bool = True,
    scale: float = 3.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, target): logits(N, V, seed=seed, neg_inf=False, scale=scale) in `layout`, with
    (neg_inf) about one -inf in NEG_INF_DENSITY entries in rows 0, 3, 6, ... only, so that the
    other rows keep a finite smoothing loss; int64 targets uniform over [0, V), rows 2,
    2 + ignored, ... set to ignore_index (ignored=0: none), and rows 1, 6, 11, ... made
    confident: their target logit raised 25 above the row's max (p_t >= 0.99999). Targets never
    point at a -inf logit unless the caller puts one there."""
    x = logits(N, V, seed=seed, dtype=torch.float64, neg_inf=False, scale=scale)
    g = torch.Generator().manual_seed(seed + 2)
    t = torch.randint(0, V, (N,), generator=g)
    if neg_inf and N and V >= 2:
        rows = torch.arange(0, N, 3)
        hit = torch.rand(len(rows), V, generator=g) < 1.0 / NEG_INF_DENSITY
        x[rows] = x[rows].masked_fill(hit, -math.inf)
    if N:
        finite = torch.isfinite(x[torch.arange(N), t])
        x[torch.arange(N)[~finite], t[~finite]] = 0.0
        confident = torch.arange(1, N, 5)
        x[confident, t[confident]] = x[confident].max(dim=1).values + 25.0
        if ignored:
            t[2::ignored] = ignore_index
    return _place(x.to(dtype), layout, torch.device(device)), t.to(device)


def _float64(a) -> np.ndarray:
    """A tensor (any dtype, any device) or array as a float64 NumPy array."""
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def assert_within(got, ref, tol, what: str) -> float:
    """got against ref element by element (float arrays or tensors of one shape): NaN exactly
    where ref is NaN, the same infinities where ref has them, |got - ref| <= tol elsewhere; each
    kind of mismatch reported with its count and first indices. Returns the worst error in
    units of the bound, max |got - ref| / tol over the finite elements (<= 1 passes)."""
    got, ref = _float64(got), _float64(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), got.shape)
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    problems = []
    if (nan_g & ~nan_r).any():
        problems.append(
            f"{int((nan_g & ~nan_r).sum())} NaN where the reference is a number: " + _where(nan_g & ~nan_r, got, ref)
        )
    if (nan_r & ~nan_g).any():
        problems.append(
            f"{int((nan_r & ~nan_g).sum())} numbers where the reference is NaN: " + _where(nan_r & ~nan_g, got, ref)
        )
    inf_mismatch = (np.isinf(got) | np.isinf(ref)) & ~nan_g & ~nan_r & (got != ref)
    if inf_mismatch.any():
        problems.append(f"{int(inf_mismatch.sum())} infinities that differ: " + _where(inf_mismatch, got, ref))
    ratio = _bound_units(got, ref, tol)
    off = ~(ratio <= 1.0)
    if off.any():
        with np.errstate(invalid="ignore"):  # inf - inf where a NaN bound flagged an infinity
            err = np.abs(np.where(off, got - ref, 0.0))
        problems.append(
            f"{int(off.sum())} of {got.size} beyond the error bound (worst {ratio[off].max():.3g} x it): "
            + _where(off, got, ref, (err, tol))
        )
    if problems:
        raise AssertionError(f"{what}:\n  " + "\n  ".join(problems))
    return float(ratio.max(initial=0.0))


def _bound_units(got: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """|got - ref| / tol where both are finite (a zero error within a zero bound: 0), else 0;
    NaN where the bound is NaN."""
    finite = np.isfinite(got) & np.isfinite(ref)
    err = np.abs(np.where(finite, got, 0.0) - np.where(finite, ref, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        units = err / tol
    return np.where(finite & ~((err == 0) & (tol == 0)), units, 0.0)


def assert_no_less_accurate_than_torch(got, baseline, ref, tol, dtype, *, what: str = "") -> dict:
    """The ratio rule of the training operations: the worst error of `got` in units of the
    bound `tol` (max |got - ref| / tol) at most TOLERANCES[dtype].train_k times that of PyTorch's
    `baseline` output on the same input, or train_k * train_floor. As in the forward rule, the
    outputs compared are those whose reference is a normal number of dtype: below that a kernel
    may flush to zero (ours do, PyTorch's do not), and assert_within's absolute floor judges them.
    Returns {"ours", "theirs", "allowed", "x_torch"}."""
    t = TOLERANCES[dtype]
    ref = _float64(ref)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), ref.shape)
    normal = np.abs(ref) >= t.tiny
    ours = float(_bound_units(_float64(got), ref, tol)[normal].max(initial=0.0))
    theirs = float(_bound_units(_float64(baseline), ref, tol)[normal].max(initial=0.0))
    allowed, ratio = _ratio_rule(ours, theirs, t.train_k, t.train_floor)
    assert ours <= allowed, (
        f"{what or 'training op'} ({dtype_id(dtype)}): worst error {ours:.3g} of the bound against PyTorch's "
        f"{theirs:.3g} on the same input: {ratio:.3g} x, allowed {t.train_k} x (or {t.train_k * t.train_floor:.3g})"
    )
    return {"ours": ours, "theirs": theirs, "allowed": allowed, "x_torch": ratio}


# -- the softmax backward --


def backward_error_bound(dy, y, dtype=None, *, tol: Tolerance | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(float64 reference dx, per-element bound) for the softmax backward of dy, y (tensors)
    stored in dtype (y's by default): the bound derived above TOLERANCES, for every kernel
    (tol: another Tolerance than TOLERANCES[dtype], to take the bound apart)."""
    from kernels.reference import softmax_backward_ref

    t = TOLERANCES[y.dtype if dtype is None else dtype] if tol is None else tol
    d = dy.detach().to("cpu", torch.float64).numpy()
    yy = y.detach().to("cpu", torch.float64).numpy()
    ref = softmax_backward_ref(d, yy)
    V = yy.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        S = (yy * d).sum(axis=-1, keepdims=True)
        A = np.abs(yy * d).sum(axis=-1, keepdims=True)
        # 2^E <= 2 max |y dy| <= 2 A; V 2^-126: the Triton kernels' scale capped at 2^126.
        arith = t.train_ulps * FP32_EPS * (np.abs(d) + np.abs(S) + A) + 2 * fixed_point_error(V) * A + V * 2.0**-126
        tol = np.abs(yy) * arith + t.storage * np.abs(ref) + t.train_floor_abs * (1 + np.abs(d) + np.abs(S))
    return ref, tol


def assert_backward_close(dx, dy, y, *, what: str = "softmax backward") -> float:
    """dx against softmax_backward_ref(dy, y) within backward_error_bound (NaN and infinities
    exactly where the reference has them); returns the worst error in units of the bound."""
    ref, tol = backward_error_bound(dy, y, dx.dtype)
    return assert_within(dx, ref, tol, f"{what} ({dtype_id(dx.dtype)}, shape {tuple(dx.shape)})")


def assert_backward_as_accurate_as_torch(dx, dy, y, *, what: str = "softmax backward") -> dict:
    """assert_no_less_accurate_than_torch for a softmax backward's dx, against
    torch._softmax_backward_data on the same dy, y (the kernel PyTorch's autograd runs)."""
    ref, tol = backward_error_bound(dy, y, dx.dtype)
    theirs = torch._softmax_backward_data(dy, y, -1, y.dtype)
    return assert_no_less_accurate_than_torch(dx, theirs, ref, tol, dx.dtype, what=what)


# -- cross-entropy --


def cross_entropy_expected(
    logits_,
    target,
    *,
    weight=None,
    ignore_index=-100,
    label_smoothing=0.0,
    reduction="none",
    counted=None,
    tol: Tolerance | None = None,
) -> dict:
    """kernels.reference.cross_entropy_ref of everything a cross-entropy kernel returns (the CUDA
    C kernels' cross_entropy_fused, the Triton kernels), and the tolerances a correct float32
    kernel meets, derived from their arithmetic: keys loss, grad, lse and loss_tol, grad_tol,
    lse_tol (float64 arrays; the loss a 0-d array for "mean" / "sum"). c = TOLERANCES' ce_ulps
    (eps), storage and floor its rows.

    Per row, with m the max, L = lse - m, E = sum_j p_j |x_j - m| (the exponentials' argument
    rounding costs up to 1.5 u |x_j - m| each), alpha = (1 - e) w_t, beta = e W / V and the
    gradient scale g (1 / sum of the counted w_t for "mean"):
      lse   u (4 |lse| + 4 E + 12)
      loss  c eps (alpha (|m - x_t| + |L| + E + 2 M) + e / V (W (|L| + E + 2) + |q|)) plus the
            exp sum's and the smoothing sum's truncations, q = sum_j w_j (x_j - m), M the mass
            off the row's max; then one rounding into dtype (its floor below the normal range)
      grad  c eps (|g| (alpha + beta) p_j (|x_j - m| + E + 4) + |g| e w_j / V) at every j but the
            target, where alpha's share is c eps |g| alpha |p_t - 1| (E_t + E + 2) instead, E_t
            the mean distance of the other classes' mass (which p_t - 1 is), and the exp sum's
            truncation; then one rounding into dtype.
    "mean" / "sum" add the order-free sum over the rows (its truncation and one rounding).
    counted: for "mean" over rows sampled from a larger batch, that batch's denominator (the sum
    of its counted rows' w_t), so that grad and grad_tol are those of the sampled rows within it
    (the loss is then their share of its mean); by default these rows' own. tol: another
    Tolerance than TOLERANCES[logits_.dtype], to take the bounds apart.
    """
    from kernels.reference import cross_entropy_ref

    x = logits_.detach().to("cpu", torch.float64).numpy()
    t = target.detach().to("cpu", torch.int64).numpy()
    w = None if weight is None else weight.detach().to("cpu", torch.float32).to(torch.float64).numpy()
    loss, lse, grad = cross_entropy_ref(
        x, t, weight=w, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="none"
    )
    N, V = x.shape
    wv = np.ones(V) if w is None else w
    e = float(np.float32(label_smoothing))
    u = UNIT_ROUNDOFF
    tol = TOLERANCES[logits_.dtype] if tol is None else tol
    c = tol.ce_ulps * FP32_EPS
    bits = math.ceil(math.log2(V)) if V > 1 else 0
    ignored = t == ignore_index
    ts = np.where(ignored, 0, t)
    rows = np.arange(N)
    # One rounding of the float32 result: into 16 bits, or its own last one in float32.
    rel, floor = max(tol.storage, FP32_EPS), tol.train_floor_abs
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = x.max(axis=1, initial=-np.inf)
        fin = np.isfinite(m)
        d = np.where(fin[:, None], np.abs(x - np.where(fin, m, 0.0)[:, None]), 0.0)
        d = np.where(np.isfinite(d), d, 0.0)
        p = np.exp(-d) * np.isfinite(x) / np.where(fin, np.exp(lse - m), 1.0)[:, None]
        E = (p * d).sum(axis=1)
        L = np.where(fin, lse - m, 0.0)
        w_t = np.where(ignored, 0.0, wv[ts])
        alpha = (1 - e) * w_t
        W = wv.sum()
        beta = np.where(ignored, 0.0, e * W / V)
        gam = np.where(ignored, 0.0, e / V)
        q = np.where(np.isfinite(x), wv[None, :] * (x - np.where(fin, m, 0.0)[:, None]), 0.0).sum(axis=1)
        mn = np.where(np.isfinite(x), x, np.inf).min(axis=1)
        q_trunc = 2.0 ** (2 * bits - 58) * np.abs(wv).max() * np.where(fin, m - mn, 0.0)
        x_t = np.where(ignored, 0.0, x[rows, ts])
        # L's error follows the mass off the max (the max's own exponentials are exactly 1, the
        # others' errors weigh by their probabilities), so a confident row keeps its small loss
        # to a few ulps: a kernel that takes log(S) of a sum S near 1 (not log1p of S - 1, an
        # exact integer difference) fails there.
        off_max = np.where(fin, (p * (d > 0)).sum(axis=1), 0.0)
        loss_scale = alpha * (np.abs(np.where(fin, m - x_t, 0.0)) + np.abs(L) + E + 2 * off_max) + gam * (
            W * (np.abs(L) + E + 2) + np.abs(q)
        )
        # the float32 row loss, before any rounding into dtype; the exp sum's truncation as at the target's gradient
        loss_arith = c * loss_scale + gam * q_trunc + np.abs(alpha) * 2.0 ** (2 * bits - 60)
        # floor: a 16-bit loss below its format's normal range (fp16's subnormal spacing).
        loss_tol = rel * np.abs(loss) + loss_arith + floor
        counted = np.where(ignored, 0.0, w_t).sum() if counted is None else float(counted)
        # The gradient scale per row: an ignored row stays 0 (or NaN) even where g is inf.
        g = np.where(ignored, 0.0, 1.0 / counted if reduction == "mean" else 1.0)
        grad = np.where(ignored[:, None], grad, grad * g[:, None])
        coef = np.abs(g) * (np.abs(alpha) + np.abs(beta))
        # At the target, alpha multiplies p_t - 1, bounded relatively below (target_extra), not
        # eps p_t: a kernel that forms 1 - p_t as 1 minus a probability near 1 fails there.
        is_t = np.arange(V)[None, :] == ts[:, None]
        coef_j = np.where(is_t, (np.abs(g) * np.abs(beta))[:, None], coef[:, None])
        grad_tol = c * (coef_j * p * (d + E[:, None] + 4) + (np.abs(g) * gam)[:, None] * np.abs(wv)[None, :])
        # p_t - 1 = -(the other classes' mass): its error follows their mean distance to the max.
        others = p.sum(axis=1) - p[rows, ts]
        E_t = np.where(others > 0, (E - p[rows, ts] * d[rows, ts]) / np.where(others > 0, others, 1.0), 0.0)
        target_extra = c * np.abs(g) * np.abs(alpha) * np.abs(np.expm1(-(lse - x_t))) * (E_t + E + 2)
        target_extra += np.abs(g) * np.abs(alpha) * 2.0 ** (2 * bits - 60)
        grad_tol[rows, ts] += np.where(ignored, 0.0, target_extra)
        grad_tol = rel * np.abs(grad) + grad_tol + floor * (1 + coef[:, None])
        lse_tol = u * (4 * np.abs(lse) + 4 * E + 12)
        if reduction != "none":
            bits_n = math.ceil(math.log2(N)) if N > 1 else 0
            total = loss.sum()
            total_tol = (
                loss_arith.sum() + 4 * u * np.abs(total) + 2.0 ** (2 * bits_n - 60) * np.abs(loss).max(initial=0)
            )
            if reduction == "mean":
                total, total_tol = total / counted, total_tol / abs(counted) + 2 * u * abs(total / counted)
            loss, loss_tol = np.asarray(total), np.asarray(rel * abs(total) + total_tol + floor)
    return {"loss": loss, "grad": grad, "lse": lse, "loss_tol": loss_tol, "grad_tol": grad_tol, "lse_tol": lse_tol}


def assert_cross_entropy_close(result, logits_, target, *, what: str = "", **options) -> dict:
    """(loss, grad, lse) from a cross-entropy against cross_entropy_expected(logits_, target,
    **options) through assert_within: every value within its tolerance, NaN and infinities
    exactly where the reference has them. Returns the worst error of each in units of its
    bound, by name."""
    loss, grad, lse = result
    exp = cross_entropy_expected(logits_, target, **options)
    label = f"{what or 'cross-entropy'} ({dtype_id(logits_.dtype)}, shape {tuple(logits_.shape)})"
    assert loss.dtype == logits_.dtype, f"{label}: loss is {loss.dtype}"
    assert lse.dtype == torch.float32 and grad.dtype == logits_.dtype, f"{label}: lse {lse.dtype}, grad {grad.dtype}"
    out = {}
    for name, got in (("loss", loss), ("grad", grad), ("lse", lse)):
        g = got.detach().to("cpu", torch.float64).numpy()
        assert g.shape == exp[name].shape, f"{label}: {name} shape {g.shape}, expected {exp[name].shape}"
        out[name] = assert_within(
            np.atleast_1d(g), np.atleast_1d(exp[name]), np.atleast_1d(exp[f"{name}_tol"]), f"{label} {name}"
        )
    return out


def check_cross_entropy(result, logits, target, *, what: str = "cross-entropy", **options) -> dict:
    """result = (loss, lse, grad) against cross_entropy_ref within cross_entropy_expected's bounds
    (through assert_within; reduction "mean" unless options say otherwise):
    values, NaN where the reference has NaN (an all -inf row, a weight-0 target on -inf), the
    loss's shape and dtype (the logits'), lse float32. Returns the worst error relative to the
    bound for each of loss, lse and grad (<= 1 passes)."""
    loss, lse, grad = result
    reduction = options.get("reduction", "mean")
    N = logits.shape[0]
    assert loss.shape == ((N,) if reduction == "none" else ()), f"{what}: loss shape {tuple(loss.shape)}"
    assert loss.dtype == logits.dtype, f"{what}: loss dtype {loss.dtype}, logits {logits.dtype}"
    assert lse.shape == (N,) and lse.dtype == torch.float32, f"{what}: lse {tuple(lse.shape)} {lse.dtype}"
    assert grad.shape == logits.shape and grad.dtype == logits.dtype, f"{what}: grad {tuple(grad.shape)} {grad.dtype}"
    exp = cross_entropy_expected(logits, target, **{"reduction": reduction, **options})
    worst = {}
    for name, got in (("loss", loss), ("lse", lse), ("grad", grad)):
        worst[name] = assert_within(
            got, exp[name], exp[f"{name}_tol"], f"{what}: {name} ({dtype_id(logits.dtype)}, {options})"
        )
    return worst


def assert_loss_reduces_its_rows(loss, rows, *, reduction: str, counted=None, what: str = "") -> float:
    """A cross-entropy kernel's "sum" or "mean" `loss` against the same reduction, in float64, of
    its own "none" losses `rows` of the same input (stored in the loss's dtype; counted: the
    denominator of "mean", the sum of the counted rows' w_t), through assert_within. Returns the
    error in units of the bound.

    Both kernel families form each row's loss l_i in float32 and store it for "none" (r_i, one
    rounding into dtype: |l_i - r_i| <= storage |l_i|); "sum" and "mean" sum the same l_i in
    64-bit fixed point (its truncation, 2^(2 ceil(log2 N) - 60) max |l_i|, and the conversion to
    float32, 4 u relative, as in cross_entropy_expected), divide by W for "mean" (2 u: W's own
    rounding and the quotient's) and round once into dtype (rel = max(storage, eps)). The rows'
    own arithmetic is the same on both sides. With A = sum |l_i| <= sum |r_i| / (1 - storage):

      sum    |loss - sum r_i|      <= (rel + 4 u + storage) A + 2^(2 bits - 60) max |l_i|
      mean   |loss - sum r_i / W|  <= ((rel + 6 u + storage) A + 2^(2 bits - 60) max |l_i|) / |W|
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction {reduction!r}: 'sum' or 'mean'")
    tol = TOLERANCES[loss.dtype]
    r = _float64(rows).reshape(-1)
    u, s = UNIT_ROUNDOFF, tol.storage
    rel = max(s, FP32_EPS)
    bits = math.ceil(math.log2(r.size)) if r.size > 1 else 0
    mag = np.where(np.isfinite(r), np.abs(r), 0.0) / (1 - s)
    trunc = 2.0 ** (2 * bits - 60) * mag.max(initial=0.0)
    expected, bound = r.sum(), (rel + 4 * u + s) * mag.sum() + trunc
    if reduction == "mean":
        W = float(counted)
        expected, bound = expected / W, ((rel + 6 * u + s) * mag.sum() + trunc) / abs(W)
    label = f"{what or 'cross-entropy'}: {reduction} of {r.size} rows ({dtype_id(loss.dtype)})"
    return assert_within(np.atleast_1d(_float64(loss)), np.atleast_1d(expected), np.atleast_1d(bound), label)


def linear_weight_grad_expected(h, logits_, target, **options) -> tuple[np.ndarray, np.ndarray]:
    """For a linear layer's logits_ = h W^T + b (h float32, (N, d)) and a cross-entropy of them
    (options: cross_entropy_expected's): (the float64 gradient of W, G^T h with G
    cross_entropy_expected's grad; the bound its float32 autograd meets when the kernel's
    gradient G' meets grad_tol T). |G' - G| <= T carries through the product as T^T |h|; the
    float32 product adds its own rounding, at most gamma_N |G'|^T |h| <= gamma_N (|G| + T)^T |h|
    with gamma_N = N u / (1 - N u) (a sum of N products in any order, fused or not)."""
    exp = cross_entropy_expected(logits_, target, **options)
    G, T, hh = exp["grad"], exp["grad_tol"], np.abs(_float64(h))
    N = hh.shape[0]
    gamma = N * UNIT_ROUNDOFF / (1 - N * UNIT_ROUNDOFF)
    return G.T @ _float64(h), T.T @ hh + gamma * (np.abs(G) + T).T @ hh


class LossResult(NamedTuple):
    loss: torch.Tensor
    lse: torch.Tensor
    grad: torch.Tensor


def run_cross_entropy_poisoned(fn, logits: torch.Tensor, target: torch.Tensor, **options) -> LossResult:
    """fn(logits, target, out=grad, **options) with the gradient buffer NaN-filled and framed by
    NaN guards; asserts fn returned that buffer, wrote nothing outside it and changed neither
    input. Returns (loss, lse, grad)."""
    guard = GUARD_BYTES // logits.element_size()
    n = logits.numel()
    buf = torch.full((2 * guard + n,), math.nan, dtype=logits.dtype, device=logits.device)
    out = buf[guard : guard + n].view(logits.shape)
    before = (bits(logits).clone(), target.clone())
    loss, lse, grad = fn(logits, target, out=out, **options)
    if logits.is_cuda:
        torch.cuda.synchronize(logits.device)
    name = getattr(fn, "name", getattr(fn, "__name__", repr(fn)))
    assert grad.data_ptr() == out.data_ptr(), f"{name} did not return the gradient buffer it was given"
    outside = torch.cat([buf[:guard], buf[guard + n :]])
    assert torch.isnan(outside).all(), f"{name} wrote {int((~torch.isnan(outside)).sum())} elements outside out"
    assert torch.equal(bits(logits), before[0]) and torch.equal(target, before[1]), f"{name} changed its inputs"
    return LossResult(loss, lse, grad)


def run_backward_poisoned(fn, dy: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
    """fn(dy, y, out=dx) into a NaN-poisoned, NaN-guarded dx (see run_poisoned); dy unchanged too."""
    dy_before = bits(dy).clone()

    def call(y_, *, out):
        return fn(dy, y_, out=out, **kwargs)

    call.__name__ = getattr(fn, "name", getattr(fn, "__name__", repr(fn)))
    dx = run_poisoned(call, y)
    assert torch.equal(bits(dy), dy_before), f"{call.__name__} changed dy"
    return dx


def edge_rows(V: int, *, seed: int, dtype=torch.float32, device="cpu", ignore_index: int = -100):
    """(logits, target) whose rows are the cross-entropy edge cases, one per row, V >= 4:
    0 ordinary; 1 ignored; 2 confident (p >= 0.999 on the target); 3 a -inf entry and a -inf
    target logit; 4 huge logits (±1e30, ±3e4 in float16; the target on one of them); 5 ignored with -inf entries;
    6 confident but wrong (the target's p ~ 1e-6); 7 every logit equal."""
    x = logits(8, V, seed=seed, dtype=torch.float64, outliers=False, neg_inf=False)
    t = targets(8, V, seed=seed)
    x[2, t[2]] = x[2].max() + 7 + math.log(V)  # exp(7) * V / V > 999 x the rest
    x[3, (t[3] + 1) % V] = -math.inf
    x[3, t[3]] = -math.inf
    huge = 1e30 if dtype != torch.float16 else 3e4  # near the top of the dtype's range
    x[4, 0], x[4, 1], x[4, 2] = huge, -huge, huge
    t[4] = 2
    x[5, :2] = -math.inf
    t[1] = t[5] = ignore_index
    x[6, 0] = x[6].max() + 14 + math.log(V)
    t[6] = 1 if V > 1 else 0
    x[6, 1] = x[6, 1:].max() if V > 2 else x[6, 1]
    x[7] = 0.5
    return x.to(device=device, dtype=dtype), t.to(device)


def run_interpreted_in_subprocess(test_file, pytestconfig, *, exclude: str = "interpreted_in_a_subprocess") -> None:
    """On a machine whose test process runs the compiled Triton modules (a GPU is visible), run the
    cpu tests of `test_file` again in a child with TRITON_INTERPRET=1 from the start (the variable
    is read when kernels are decorated, at import), so the interpreter cases run there too."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    cmd += ["-m", "cpu", "-k", f"not {exclude}", "-W", "ignore::RuntimeWarning"]
    try:
        pytestconfig.getoption("no_reports")
        cmd.append("--no-reports")  # the parent session writes the reports, not the child
    except ValueError:
        pass
    proc = subprocess.run(
        cmd, cwd=Path(test_file).resolve().parents[1], env=env, capture_output=True, text=True, timeout=1800
    )
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert re.search(r"\d+ passed", proc.stdout), tail
