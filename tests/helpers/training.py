"""The training operations, the softmax backward and cross-entropy: their inputs, poisoned runs
and comparisons. Their tolerances are rows of TOLERANCES (train_ulps, ce_ulps, storage,
train_floor_abs, fixed_point_error; the derivation is above the table in
tests/helpers/tolerances.py); every comparison goes through assert_within, and the ratio to
PyTorch's own error through assert_no_less_accurate_than_torch."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from tests.helpers.comparisons import _ratio_rule, _where
from tests.helpers.inputs import NEG_INF_DENSITY, _place, dtype_id, logits
from tests.helpers.running import GUARD_BYTES, bits, run_poisoned
from tests.helpers.tolerances import FP32_EPS, TOLERANCES, Tolerance, fixed_point_error

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


def compiled_training_kernels(dtypes) -> list[tuple]:
    """Launch the Triton training kernels as their wrappers do, capped ones included (the
    backward's split and its reread past V = 16384, the cross-entropy's streams and held rows)
    and the weighted, smoothed rows 20000 longer (float32 past the stream's: split), for `dtypes`
    (names) on rows 16-byte aligned (V = 50272) and not (50257), contiguous and one element past
    a 16-byte boundary (the splits' element-wise cut); then
    (kernel, warps, register cap, registers, bytes spilled a thread, budget, specialisation if
    past it) for every kernel of theirs this process compiled, as the driver reports it. On a
    GPU; run in a process of its own (tests/test_triton_cuda.py)."""
    import itertools

    from kernels import triton_backward as tb
    from kernels import triton_cross_entropy as tce
    from kernels.triton_build import spill_budget
    from kernels.triton_loss_kernels import JIT_KERNELS

    for name, V in itertools.product(dtypes, (50257, 50272)):
        dtype = getattr(torch, name)
        for layout in ("contiguous", "offset:1"):
            for W in (V, V + 20000):  # weighted, smoothed rows: stream, then (float32) split
                x = _place(logits(8, W, seed=2, dtype=dtype), layout, torch.device("cuda"))
                t = targets(8, W, seed=2, device="cuda")
                if W == V:
                    tce.cross_entropy(x, t)
                tce.cross_entropy(x, t, weight=torch.rand(W, device="cuda", dtype=dtype), label_smoothing=0.1)
            for B, W in ((8, V), (64, V - 30257)):  # split; reread (float32) or stream, at 20000 and 20015
                y, dy = softmax_and_grad(B, W, seed=3, dtype=dtype, device="cuda", layout_y=layout)
                tb.softmax_backward(dy, y)
    torch.cuda.synchronize()
    rows = []
    for kernel, fn in JIT_KERNELS.items():
        for caches in fn.device_caches.values():  # Triton's (kernel cache, ...) per device
            for key, k in caches[0].items():
                k._init_handles()
                cap = getattr(k.metadata, "maxnreg", None)
                spilled, budget = 4 * k.n_spills, spill_budget({"maxnreg": cap})
                past = str(key) if spilled > budget else ""
                rows.append((kernel, k.metadata.num_warps, cap, k.n_regs, spilled, budget, past))
    return rows
