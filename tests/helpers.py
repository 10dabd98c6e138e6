"""What every softmax test shares: one seeded input generator, one poisoned runner, one
comparison with the float64 reference and one tolerance table.

    x = logits(B, V, seed=1, dtype=torch.bfloat16, device="cuda", layout="offset:3")
    out = run_poisoned(SOFTMAX_KERNELS["fused"], x)
    assert_softmax_close(out, x, what="fused offset:3")
    assert_rows_sum_to_one(out)
"""

from __future__ import annotations

import math
from typing import NamedTuple

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
) -> torch.Tensor:
    """A (B, V) tensor of randn * scale drawn in float64 from a generator of its own, then cast.

    outliers: every row gets a -30 and every even row a +30. A +30 makes one entry take
        nearly all of a row's mass, so a wrong max or a lost element shows there; odd rows keep
        their mass spread, so an error in the sum or in the small probabilities shows there.
    neg_inf: about one entry in NEG_INF_DENSITY is -inf (at least one per tensor), never a
        whole row; neg_inf_rows lists rows to make entirely -inf (their softmax is NaN).
    layout: see `layouts`; storage outside the view (padding, gaps, the bytes before an
        offset view) holds NaN, so a kernel that reads past its row poisons its own output.
    The same seed gives the same values in every layout, dtype and device.
    """
    g = torch.Generator().manual_seed(seed)
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


# -- comparing with the reference --------------------------------------------------------------


def _low_precision(dtype) -> tuple[float, float]:
    fi = torch.finfo(dtype)
    # A correct kernel computes in fp32 and rounds once: one unit in the last place relative to
    # the exact value, and below the normal range the subnormal spacing (fp16) or fp32's
    # flush-to-zero threshold, which the kernels' arithmetic has (bf16), whichever is larger.
    return max(fi.smallest_normal * fi.eps, torch.finfo(torch.float32).tiny), fi.eps


# dtype -> (atol, rtol) of an output against the float64 reference of its input. fp32: 1e-4
# relative, with absolute slack for the probabilities far below any that matter.
TOLERANCES = {
    torch.float32: (1e-6, 1e-4),
    torch.bfloat16: _low_precision(torch.bfloat16),
    torch.float16: _low_precision(torch.float16),
}
_SHOWN = 6  # mismatches printed per kind


def _where(mask: np.ndarray, got: np.ndarray, ref: np.ndarray | None = None) -> str:
    idx = np.argwhere(mask)[:_SHOWN]
    parts = []
    for i in map(tuple, idx):
        at = ", ".join(str(int(k)) for k in i)
        parts.append(f"({at}) got {got[i]:.9g}" + ("" if ref is None else f" expected {ref[i]:.9g}"))
    more = " ..." if mask.sum() > _SHOWN else ""
    return "; ".join(parts) + more


def assert_softmax_close(got: torch.Tensor, x: torch.Tensor, *, dtype=None, what: str = "", record=None) -> float:
    """`got` against the float64 softmax of `x` (over the last axis) within TOLERANCES[dtype]
    (dtype: got's by default). NaN is expected exactly where the reference has it (all -inf
    rows); NaN elsewhere, numbers where NaN belongs, and ±inf are reported apart from plain
    mismatches, each with a count and the first indices. Returns the largest absolute error
    over the elements both hold finite, for the manifest."""
    dtype = got.dtype if dtype is None else dtype
    atol, rtol = TOLERANCES[dtype]
    g = got.detach().to("cpu", torch.float64).numpy()
    r = softmax_ref(x.detach().to("cpu", torch.float64).numpy())
    assert g.shape == r.shape, f"{what}: shape {g.shape}, expected {r.shape}"
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    inf_g = np.isinf(g)
    both = np.isfinite(g) & np.isfinite(r)
    err = np.abs(np.where(both, g, 0.0) - np.where(both, r, 0.0))
    off = both & (err > atol + rtol * np.abs(np.where(both, r, 0.0)))
    if record is not None:
        record(float(err.max(initial=0.0)))
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
    if off.any():
        rel = err / np.maximum(np.abs(np.where(both, r, 1.0)), np.finfo(np.float64).tiny)
        problems.append(
            f"{int(off.sum())} of {g.size} beyond atol {atol:.3g} + rtol {rtol:.3g} * |expected| "
            f"(worst abs {err.max():.3g}, worst rel {rel[off].max():.3g}): " + _where(off, g, r)
        )
    if problems:
        raise AssertionError(f"{what or 'softmax'} ({dtype_id(dtype)}, shape {g.shape}):\n  " + "\n  ".join(problems))
    return float(err.max(initial=0.0))


def row_sum_tolerance(V: int, dtype=torch.float32) -> float:
    """How far a correct kernel's row of V probabilities may sum from 1.

    fp32 arithmetic: the error of the exponentials and the division is a few ulps, and a sum
    taken in blocks or a tree (or exactly) grows at most like sqrt(V) ulps; a long row added
    one term at a time in fp32 drifts linearly and leaves this bound (1.4e-4 at V = 128256),
    which is what the bound is for. 16-bit storage adds one rounding of every output: at most
    half an ulp of the row's total mass, bounded here by a whole ulp.
    """
    storage = 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps
    return storage + FP32_EPS * (16 + math.sqrt(V))


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


def check_softmax(got: torch.Tensor, x: torch.Tensor, *, what: str = "", record=None) -> float:
    """The whole contract of a softmax output: assert_softmax_close to the reference (NaN exactly
    in the rows of x that are all -inf) and assert_rows_sum_to_one for every other row."""
    err = assert_softmax_close(got, x, what=what, record=record)
    defined = ~torch.isneginf(x).all(dim=-1)
    assert_rows_sum_to_one(got[defined], dtype=got.dtype, what=what)
    return err


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


# -- the softmax backward and cross-entropy --------------------------------------------------------
#
# Inputs, poisoned runs and comparisons for the two training operations. Tolerances follow an
# error model of a correct float32 kernel, scaled element by element to the magnitudes that the
# result is formed from (not to the result, which may cancel to ~0), so they stay tight wherever
# the values are and fail a kernel that loses a term, a sign or digits:
#
#   softmax backward  dx_j = y_j (dy_j - s), s = sum y*dy.  mag_j = |y_j| (|dy_j| + |s| + sum |y*dy|)
#   cross-entropy     p_j carries float32 error ~ (C + |x_j - max|) eps (the exponential's argument
#                     is rounded at |x_j - max|); u_j = p_j (C + |x_j - max|). The gradient's entry
#                     at the target, p_t - 1, is allowed the error of the other entries (sum of
#                     u_k, k != t) plus its own relative error, never eps * p_t: a kernel that
#                     forms 1 - p_t as 1 minus a probability near 1 fails on confident rows. Row
#                     sums in fixed point add at most n * 2^-(62 - ceil(log2 n)) of the largest
#                     term (FIXED_POINT_ERROR).
#
# Every bound is C_ERR * eps32 * magnitude, plus one rounding of the stored dtype (16-bit
# outputs) and that dtype's smallest normal as an absolute floor.

C_ERR = 8.0  # units of float32 eps per operation chain; a wrong term is off by far more


def place(values: torch.Tensor, layout: str, device="cpu") -> torch.Tensor:
    """`values` copied into `layout` (see `layouts`; NaN outside the view) on `device`."""
    return _place(values, layout, torch.device(device))


def fixed_point_error(n: int) -> float:
    """The largest relative error a fixed-point row sum of n terms adds (kernels.triton_loss_kernels)."""
    return n * 2.0 ** -(62 - (max(n, 1) - 1).bit_length())


def targets(N: int, V: int, *, seed: int, ignore_rows=(), ignore_index: int = -100, dtype=torch.int64, device="cpu"):
    """(N,) class indices drawn from their own generator; `ignore_rows` set to ignore_index."""
    g = torch.Generator().manual_seed(seed + 7)
    t = torch.randint(0, V, (N,), generator=g)
    for row in ignore_rows:
        t[row] = ignore_index
    return t.to(device=device, dtype=dtype)


def _out_floor(dtype) -> tuple[float, float]:
    """(rounding of the stored value, absolute floor) of an output of `dtype`."""
    fi = torch.finfo(dtype)
    return (0.0 if dtype == torch.float32 else fi.eps), fi.smallest_normal


def _report(what: str, got: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> None:
    """Raise with counts and first indices where got and ref disagree: NaN patterns must match,
    finite values within tol, infinities equal."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
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
    finite = np.isfinite(got) & np.isfinite(ref)
    err = np.abs(np.where(finite, got - ref, 0.0))
    off = finite & (err > np.broadcast_to(tol, got.shape))
    if off.any():
        problems.append(
            f"{int(off.sum())} of {got.size} beyond the error bound (worst error {err[off].max():.3g}, "
            f"bound there {np.broadcast_to(tol, got.shape)[off][np.argmax(err[off])]:.3g}): " + _where(off, got, ref)
        )
    if problems:
        raise AssertionError(f"{what}:\n  " + "\n  ".join(problems))


def backward_error_bound(dy, y, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """(reference dx, per-element bound) for the softmax backward of float tensors dy, y."""
    from kernels.reference import softmax_backward_ref

    dtype = y.dtype if dtype is None else dtype
    d = dy.detach().to("cpu", torch.float64).numpy()
    yy = y.detach().to("cpu", torch.float64).numpy()
    ref = softmax_backward_ref(d, yy)
    V = yy.shape[-1]
    with np.errstate(invalid="ignore"):
        t = yy * d
        s = t.sum(axis=-1, keepdims=True)
        mag = np.abs(yy) * (np.abs(d) + np.abs(s) + np.abs(t).sum(axis=-1, keepdims=True))
    rounding, floor = _out_floor(dtype)
    with np.errstate(invalid="ignore"):
        tol = (C_ERR * FP32_EPS + fixed_point_error(V)) * mag + rounding * np.abs(ref) + floor
    return ref, tol


def assert_backward_close(dx, dy, y, *, what: str = "softmax backward") -> float:
    """dx against softmax_backward_ref(dy, y) within backward_error_bound; returns the worst error
    relative to the bound (<= 1 passes)."""
    ref, tol = backward_error_bound(dy, y, dx.dtype)
    got = dx.detach().to("cpu", torch.float64).numpy()
    _report(f"{what} ({dtype_id(dx.dtype)}, shape {tuple(dx.shape)})", got, ref, tol)
    with np.errstate(invalid="ignore"):
        r = np.abs(got - ref) / tol
    return float(np.nanmax(np.where(np.isfinite(r), r, 0.0), initial=0.0))


CE_OPTIONS = ("weight", "ignore_index", "label_smoothing", "reduction")


def cross_entropy_error_bounds(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                               reduction="mean", dtype=None) -> dict:  # fmt: skip
    """Reference values and per-element bounds: {"loss": (ref, tol), "lse": ..., "grad": ...}."""
    from kernels.reference import cross_entropy_ref

    dtype = logits.dtype if dtype is None else dtype
    x = logits.detach().to("cpu", torch.float64).numpy()
    t = target.detach().cpu().numpy().astype(np.int64)
    w = None if weight is None else weight.detach().to("cpu", torch.float64).numpy()
    loss, lse, grad = cross_entropy_ref(
        x, t, weight=w, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction
    )
    N, V = x.shape
    eps = float(label_smoothing)
    wv = np.ones(V) if w is None else w
    ignored = t == ignore_index
    ts = np.where(ignored, 0, t)
    rows = np.arange(N)
    e32 = C_ERR * FP32_EPS
    fix = fixed_point_error(V)
    with np.errstate(invalid="ignore", over="ignore"):
        m = x.max(axis=1, keepdims=True)
        p = softmax_ref(x)
        u = np.where(p > 0, p * (C_ERR + np.abs(x - m)), 0.0)  # error scale of each probability, in eps
        U = u.sum(axis=1)
        w_t = np.where(ignored, 0.0, wv[ts])
        W_abs = np.abs(wv).sum()
        lse_mag = np.abs(lse) + C_ERR + U
        row_mag = np.abs(w_t) * (lse_mag + np.abs(x[rows, ts]))
        if eps > 0:
            row_mag = (1 - eps) * row_mag + eps / V * (W_abs * lse_mag + np.abs(wv[None, :] * x).sum(axis=1))
        row_mag = np.where(ignored, 0.0, row_mag)
        is_t = np.arange(V)[None, :] == ts[:, None]
        # p_j - [j == t]: a probability's own error, and its share of the error of the row's sum;
        # at the target, the others' errors and its relative error, not eps * p_t.
        q_mag = u + p * U[:, None]
        q_mag = np.where(is_t, (U - u[rows, ts])[:, None] + (1 - p) * (U[:, None] + C_ERR), q_mag)
        g_mag = np.abs(w_t)[:, None] * q_mag
        g_fix = np.abs(w_t)[:, None] * np.where(is_t, fix, fix * p)
        if eps > 0:
            g_mag = (1 - eps) * g_mag + eps / V * (W_abs * u + C_ERR * np.abs(wv)[None, :])
            g_fix = (1 - eps) * g_fix + eps / V * W_abs * fix * p
        scale = 1.0
        if reduction == "mean":
            scale = 1.0 / abs(w_t.sum()) if w_t.sum() != 0 else 1.0
        g_mag = np.where(ignored[:, None], 0.0, g_mag * scale)
        g_fix = np.where(ignored[:, None], 0.0, g_fix * scale)
    rounding, floor = _out_floor(dtype)
    grad_tol = FP32_EPS * g_mag + g_fix + (rounding + e32) * np.abs(grad) + floor
    lse_tol = FP32_EPS * lse_mag + fix + e32 * np.abs(lse)
    row_tol = e32 * row_mag + fix * row_mag
    if reduction == "none":
        loss_tol = row_tol + (rounding + e32) * np.abs(loss) + floor
    else:
        total_tol = row_tol.sum() * (scale if reduction == "mean" else 1.0)
        loss_tol = np.asarray(total_tol + (rounding + e32) * abs(loss) + floor)
    return {"loss": (np.asarray(loss), loss_tol), "lse": (lse, lse_tol), "grad": (grad, grad_tol)}


def check_cross_entropy(result, logits, target, *, what: str = "cross-entropy", **options) -> dict:
    """result = (loss, lse, grad) against cross_entropy_ref within cross_entropy_error_bounds:
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
    bounds = cross_entropy_error_bounds(logits, target, **options)
    worst = {}
    for name, got in (("loss", loss), ("lse", lse), ("grad", grad)):
        ref, tol = bounds[name]
        g = got.detach().to("cpu", torch.float64).numpy()
        _report(f"{what}: {name} ({dtype_id(logits.dtype)}, {options})", g, ref, tol)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.abs(g - ref) / tol
        worst[name] = float(np.nanmax(np.where(np.isfinite(r), r, 0.0), initial=0.0))
    return worst


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
