"""The tolerance table: how far a correct kernel's output may be from the float64 reference (the
derivation is written out above `Tolerance`), per storage dtype and for the training operations,
and the PyTorch port's equivalence contract with the NumPy model."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

FP32_EPS = torch.finfo(torch.float32).eps

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


def tolerance(dtype, kernel=None) -> Tolerance:
    """TOLERANCES[dtype], with the fields the registry kernel's spec overrides for that dtype
    (`KernelSpec.tolerances`, e.g. {"k": 2.0}) replaced."""
    override = kernel.tolerance(dtype) if kernel is not None else None
    return dataclasses.replace(TOLERANCES[dtype], **override) if override else TOLERANCES[dtype]


def row_sum_tolerance(V: int, dtype=torch.float32) -> float:
    """How far a correct kernel's row of V probabilities may sum from 1 (TOLERANCES[dtype]).

    fp32 arithmetic: the error of the exponentials and the division is a few ulps, and a sum
    taken in blocks or a tree (or exactly) grows at most like sqrt(V) ulps; a long row added
    one term at a time in fp32 drifts linearly and leaves this bound (1.4e-4 at V = 128256),
    which is what the bound is for. 16-bit storage adds one rounding of every output: at most
    half an ulp of the row's total mass, bounded here by a whole ulp.
    """
    return TOLERANCES[dtype].row_sum(V)
