"""What every softmax test shares: one seeded input generator, one poisoned runner, one
comparison with the float64 reference and one tolerance table.

    x = logits(B, V, seed=1, dtype=torch.bfloat16, device="cuda", layout="offset:3")
    out = run_poisoned(SOFTMAX_KERNELS["fused"], x)
    check_softmax(out, x, what="fused offset:3")         # TOLERANCES, every output, row sums
    assert_as_accurate_as_torch(out, x, what="fused")    # and no worse than F.softmax
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from kernels.reference import softmax_ref

DTYPE_IDS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
FP32_EPS = torch.finfo(torch.float32).eps
VECTOR_BYTES = 16  # the widest vector access of the kernels: alignment classes are counted in it


def dtype_id(dtype) -> str:
    return DTYPE_IDS[dtype]


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
    The same seed gives the same values in every layout, dtype and device.
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}: one of {', '.join(RECIPES)}")
    if recipe == "plain":
        outliers = neg_inf = False
    if recipe == "span":
        outliers = False  # a +30 would leave every other entry 30 nats down: the span is the point
    g = torch.Generator().manual_seed(seed)
    if recipe == "span":
        x = -torch.rand(B, V, generator=g, dtype=torch.float64) * 110.0
    else:
        x = torch.randn(B, V, generator=g, dtype=torch.float64) * scale
    if B and V >= 3 and outliers:
        rows = torch.arange(B)
        x[rows, torch.randint(0, V, (B,), generator=g)] = -OUTLIER
        x[rows[::2], torch.randint(0, V, (len(rows[::2]),), generator=g)] = OUTLIER
    if B and V >= 2 and neg_inf:
        n = max(1, B * V // NEG_INF_DENSITY)
        x[torch.randint(0, B, (n,), generator=g), torch.randint(0, V, (n,), generator=g)] = -math.inf
        lost = torch.isneginf(x).all(dim=1).nonzero().flatten()  # short rows may lose every entry
        x[lost, torch.randint(0, V, (len(lost),), generator=g)] = (
            torch.randn(len(lost), generator=g, dtype=torch.float64) * scale
        )
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
    return _place(x.to(dtype), layout, torch.device(device))


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


@dataclass(frozen=True)
class Tolerance:
    """How far a softmax output of one storage dtype may be from the float64 reference (the
    derivation is above this class)."""

    dtype: torch.dtype
    exp_ulps: float  # an output's own float32 error at x = max: exp, normalisation
    per_nat: float  # and per nat of |x - max|: the rounding of x - max
    row_ulps: float  # a row's sum: eps32 * (row_ulps + sqrt(V)), plus one ulp of 16-bit storage
    store_ulps: float | None  # 16-bit storage: bound in ulps of the stored format; None for fp32
    k: float  # ratio to F.softmax's error on the same input
    k_floor: float  # ... or to this floor (fp32: eps; 16-bit: ulps of the stored format)

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

TOLERANCES = {
    torch.float32: Tolerance(torch.float32, EXP_ULPS, PER_NAT, 16.0, None, RATIO_K, RATIO_FLOOR_ULPS),
    **{
        dt: Tolerance(dt, EXP_ULPS, PER_NAT, 16.0, STORE_ULPS, RATIO_K, STORE_ULPS)
        for dt in (torch.bfloat16, torch.float16)
    },
}


# -- comparing with the reference --------------------------------------------------------------

_SHOWN = 6  # mismatches printed per kind


def _where(mask: np.ndarray, got: np.ndarray, ref: np.ndarray | None = None, bound: np.ndarray | None = None) -> str:
    idx = np.argwhere(mask)[:_SHOWN]
    parts = []
    for i in map(tuple, idx):
        at = ", ".join(str(int(k)) for k in i)
        part = f"({at}) got {got[i]:.9g}" + ("" if ref is None else f" expected {ref[i]:.9g}")
        parts.append(part + ("" if bound is None else f" (error {bound[0][i]:.3g}, allowed {bound[1][i]:.3g})"))
    more = " ..." if mask.sum() > _SHOWN else ""
    return "; ".join(parts) + more


def ulp_of(p: np.ndarray, dtype) -> np.ndarray:
    """One unit in the last place of `dtype` at the magnitude of p (p >= 0): the spacing of the
    binade p lies in, or the subnormal spacing below the normal range."""
    fi = torch.finfo(dtype)
    with np.errstate(divide="ignore"):
        binade = np.floor(np.log2(np.maximum(p, fi.smallest_normal)))
    return np.exp2(binade) * fi.eps


@dataclass
class SoftmaxErrors:
    """Every output of `got` against the float64 softmax `ref` of its input (NumPy, float64),
    with what TOLERANCES allows; `summary` gives the figures the manifest records."""

    got: np.ndarray
    ref: np.ndarray
    tol: Tolerance
    normal: np.ndarray  # outputs held to the relative rule (reference >= the format's tiny)
    below: np.ndarray  # finite outputs whose reference is below the normal range
    rel: np.ndarray  # |got - ref| / ref where normal, else 0
    elem: np.ndarray  # the elementwise quantity checked (fp32: rel. after the row scale; 16-bit: ulps)
    elem_bound: np.ndarray
    logp: np.ndarray  # |log got - log ref| where normal, else 0
    logp_bound: np.ndarray
    abs_err: np.ndarray  # |got - ref| where both are finite, else 0
    allowed: np.ndarray  # the |got - ref| the rule allows at each output (relative bounds combined)

    def summary(self) -> dict:
        rel = self.rel[self.normal]
        ulps = np.abs(self.got - self.ref)[self.normal] / ulp_of(self.ref[self.normal], self.tol.dtype)
        return {
            "max_rel_err": float(rel.max(initial=0.0)),
            "p999_rel_err": float(np.quantile(rel, 0.999)) if rel.size else 0.0,
            "max_logp_err_nats": float(self.logp.max(initial=0.0)),
            "max_err_ulps": float(ulps.max(initial=0.0)),
            "max_abs_err": float(self.abs_err.max(initial=0.0)),
            "normal_outputs": int(self.normal.sum()),
        }


def softmax_errors(got: torch.Tensor, x: torch.Tensor, *, dtype=None) -> SoftmaxErrors:
    """`got` against the float64 softmax of `x` over the last axis, with TOLERANCES[dtype]'s
    bounds for every output (dtype: got's by default). An output is held to the relative rule
    where its reference, less all the error the rule allows it, is still a normal number of the
    format; below that it may be flushed to zero or be subnormal, and the absolute floor holds."""
    tol = TOLERANCES[got.dtype if dtype is None else dtype]
    g = got.detach().to("cpu", torch.float64).numpy()
    xs = x.detach().to("cpu", torch.float64).numpy()
    r = softmax_ref(xs)
    if g.shape != r.shape:
        raise AssertionError(f"shape {g.shape}, expected {r.shape}")
    both = np.isfinite(g) & np.isfinite(r)
    gz, rz = np.where(both, g, 0.0), np.where(both, r, 0.0)
    rp = np.where(rz > 0, rz, 1.0)
    if tol.store_ulps is None:
        with np.errstate(invalid="ignore"):  # rows of all -inf: -inf - -inf
            dist = np.where(np.isfinite(xs), xs.max(axis=-1, keepdims=True, initial=-np.inf) - xs, 0.0)
        dist = np.nan_to_num(dist, nan=0.0, posinf=0.0)
        mean_dist = (rz * dist).sum(axis=-1, keepdims=True)
        elem_bound = tol.eps * (2 * tol.exp_ulps + tol.per_nat * (dist + mean_dist))
        direct = (1 + elem_bound) * (1 + tol.row_sum(r.shape[-1])) - 1
    else:
        ulp = ulp_of(rp, tol.dtype)
        elem_bound = np.full_like(r, tol.store_ulps)
        direct = tol.store_ulps * ulp / rp
    normal = both & (rz >= tol.tiny) & (rz * (1 - direct) >= tol.tiny)
    below = both & ~normal
    abs_err = np.abs(gz - rz)
    r1 = np.where(normal, rz, 1.0)
    rel = np.where(normal, abs_err / r1, 0.0)
    if tol.store_ulps is None:
        # The row's own scale divided out: sum(got) over the row's finite outputs.
        scale = gz.sum(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            elem = np.where(normal, np.abs(gz / np.where(scale > 0, scale, 1.0) - rz) / r1, 0.0)
    else:
        elem = np.where(normal, abs_err / ulp_of(r1, tol.dtype), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.where(normal, np.abs(np.log(np.where(normal & (g > 0), g, 1.0)) - np.log(r1)), 0.0)
    logp = np.where(normal & ~(g > 0), np.inf, logp)
    logp_bound = -np.log1p(-np.minimum(direct, 0.5))
    allowed = np.where(normal, direct * r1, tol.floor)
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
    got: torch.Tensor, x: torch.Tensor, *, dtype=None, what: str = "", record=None, gated: bool = True
) -> dict:
    """`got` against the float64 softmax of `x` (over the last axis) within TOLERANCES[dtype]
    (dtype: got's by default): every output at or above the format's smallest normal by the
    elementwise rule and as a log-probability, every one below it by the absolute floor. NaN is
    expected exactly where the reference has it (all -inf rows); NaN elsewhere, numbers where
    NaN belongs, and ±inf are reported apart from plain mismatches, each with a count and the
    first indices. gated=False (see accuracy_gated) asserts only those NaN and ±inf placements.
    Returns SoftmaxErrors.summary() (`record` gets its max_abs_err)."""
    try:
        e = softmax_errors(got, x, dtype=dtype)
    except AssertionError as err:
        raise AssertionError(f"{what}: {err}") from None
    g, r, tol = e.got, e.ref, e.tol
    summary = e.summary()
    if record is not None:
        record(summary["max_abs_err"])
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    inf_g = np.isinf(g)
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
            f"worst {e.elem[off].max():.3g}, worst relative error {e.rel[off].max():.3g}): "
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
            f"{int(bad_logp.sum())} log-probabilities beyond their bound (worst {e.logp[bad_logp].max():.3g} nats): "
            + _where(bad_logp, g, r, (e.logp, e.logp_bound))
        )
    if problems:
        head = f"{what or 'softmax'} ({dtype_id(tol.dtype)}, shape {g.shape})"
        raise AssertionError(head + ":\n  " + "\n  ".join(problems))
    return summary


def ratio_to_torch(got: torch.Tensor, x: torch.Tensor, *, reference: torch.Tensor | None = None) -> dict:
    """The ratio rule's figures: the largest error of `got` and of F.softmax on the same x in
    the same dtype (`reference`: that output, if already computed), in the rule's units (fp32:
    relative; 16-bit: ulps of the format), and what TOLERANCES allows."""
    tol = TOLERANCES[got.dtype]
    if reference is None:
        reference = torch.softmax(x, dim=-1)
    ours, theirs = softmax_errors(got, x).summary(), softmax_errors(reference, x).summary()
    unit = "max_rel_err" if tol.store_ulps is None else "max_err_ulps"
    floor = tol.k_floor * (tol.eps if tol.store_ulps is None else 1.0)
    return {
        "ours": ours[unit],
        "F_softmax": theirs[unit],
        "allowed": tol.k * max(theirs[unit], floor),
        "unit": "relative" if tol.store_ulps is None else f"ulps of {dtype_id(tol.dtype)}",
        "x_F_softmax": ours[unit] / theirs[unit] if theirs[unit] > 0 else (0.0 if ours[unit] == 0 else math.inf),
        "summary": ours,
        "F_softmax_summary": theirs,
    }


def assert_as_accurate_as_torch(got: torch.Tensor, x: torch.Tensor, *, what: str = "", reference=None) -> dict:
    """The ratio rule: `got`'s largest error over the tensor at most TOLERANCES' k times that of
    F.softmax on the same input in the same dtype (or k times the floor). Returns ratio_to_torch."""
    r = ratio_to_torch(got, x, reference=reference)
    tol = TOLERANCES[got.dtype]
    assert r["ours"] <= r["allowed"], (
        f"{what or 'softmax'} ({dtype_id(got.dtype)}, shape {tuple(got.shape)}): largest error {r['ours']:.3g} "
        f"({r['unit']}) against F.softmax's {r['F_softmax']:.3g} on the same input: {r['x_F_softmax']:.3g} x, "
        f"allowed {tol.k} x (or {tol.k_floor} {'eps' if tol.store_ulps is None else 'ulps'}: {r['allowed']:.3g})"
    )
    return r


def assert_outputs_agree(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, *, what: str = "") -> None:
    """Two softmax outputs of the same x (same dtype) agree as TOLERANCES allows each to differ
    from the float64 reference: |a - b| within the sum of their two bounds at every output, NaN
    at the same places."""
    ea, eb = softmax_errors(a, x), softmax_errors(b, x)
    nan_a, nan_b = np.isnan(ea.got), np.isnan(eb.got)
    assert np.array_equal(nan_a, nan_b), f"{what}: NaN at different places ({int((nan_a != nan_b).sum())} outputs)"
    diff = np.abs(np.nan_to_num(ea.got - eb.got, nan=0.0))
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


def assert_rows_sum_to_one(got: torch.Tensor, *, dtype=None, what: str = "") -> None:
    """Every row of `got` sums to 1 within row_sum_tolerance(V, dtype) (NaN rows fail)."""
    dtype = got.dtype if dtype is None else dtype
    V = got.shape[-1]
    tol = row_sum_tolerance(V, dtype)
    sums = got.detach().to("cpu", torch.float64).sum(dim=-1).numpy()
    bad = ~(np.abs(sums - 1.0) <= tol)
    if bad.any():
        drift = np.abs(sums - 1.0)
        raise AssertionError(
            f"{what or 'softmax'} ({dtype_id(dtype)}, V = {V}): {int(bad.sum())} of {sums.size} rows do not sum to 1 "
            f"within {tol:.3g} (worst drift {np.nanmax(drift) if not np.isnan(drift).all() else np.nan:.3g}): "
            + _where(bad, sums)
        )


def check_softmax(got: torch.Tensor, x: torch.Tensor, *, what: str = "", record=None, gated: bool = True) -> dict:
    """The whole contract of a softmax output: assert_softmax_close to the reference (NaN exactly
    in the rows of x that are all -inf) and assert_rows_sum_to_one for every other row; with
    gated=False (accuracy_gated) only the NaN and ±inf placements. Returns
    assert_softmax_close's summary."""
    summary = assert_softmax_close(got, x, what=what, record=record, gated=gated)
    if gated:
        defined = ~torch.isneginf(x).all(dim=-1)
        assert_rows_sum_to_one(got[defined], dtype=got.dtype, what=what)
    return summary


# -- which machine a kernel needs --------------------------------------------------------------


def needs_cupy(kernel) -> bool:
    """Whether a registry kernel is one of the CUDA C kernels, compiled through CuPy."""
    return kernel.backend == "cupy"


def skip_unless_runnable(kernel) -> None:
    """Skip (with the reason) a cuda test whose kernel's backend cannot run on this machine."""
    import pytest

    if needs_cupy(kernel):
        from tests.suite.gpus import cupy_unusable_reason

        reason = cupy_unusable_reason()
        if reason:
            pytest.skip(reason)


# -- Triton paths at small shapes -----------------------------------------------------------------

# kernels.softmax_triton.run_path parameters that scale each path's thresholds down, so the
# interpreter (and a GPU at small V) runs every path's real code on rows of tens of elements.
SCALED_TRITON_PARAMS = {
    "tile": {"config": {"BLOCK": 16, "num_warps": 2}},  # V > BLOCK: the multi-pass loop
    "row": {"num_warps": 4},
    "rows": {"ROWS": 4, "num_warps": 2},
    "split": {"CHUNK": 16, "num_warps": 2},  # P = cdiv(V + head, 16) programs a row
    "stream": {"BLOCK": 16, "num_warps": 2, "programs_per_sm": 1},  # tiles of 16, rows walked by 2 programs
}
