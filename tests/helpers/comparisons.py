"""Comparing outputs: a softmax output with the float64 reference under the tolerance table
(`check_softmax`, `assert_softmax_close`, `assert_rows_sum_to_one`) and the ratio rule against
F.softmax (`assert_as_accurate_as_torch`), two outputs with each other, and bit for bit."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from kernels.reference import softmax_ref
from kernels.spec import dtype_name
from tests.helpers.inputs import dtype_id
from tests.helpers.running import bits
from tests.helpers.tolerances import Tolerance, row_sum_tolerance, tolerance

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


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """`got` holds exactly the bits of `expected` (NaN payloads included), element by element."""
    differ = bits(got) != bits(expected)
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {differ.numel()} elements differ in their bits, "
        f"first at {differ.nonzero()[:4].tolist()}"
    )


def array_bit_difference(got, want) -> str | None:
    """None when two NumPy arrays (or array-likes) have the same dtype, shape and bits; else the
    count and the first differing indices."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    differ = np.ascontiguousarray(got).view(unsigned) != np.ascontiguousarray(want).view(unsigned)
    if not differ.any():
        return None
    first = np.argwhere(differ)[:4].tolist()
    return f"{int(differ.sum())} of {differ.size} elements differ in their bits, first at {first}"
