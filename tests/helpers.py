"""What every softmax test shares: one seeded input generator, one poisoned runner, one
comparison with the float64 reference and one tolerance table.

    x = logits(B, V, seed=1, dtype=torch.bfloat16, device="cuda", layout="offset:3")
    out = run_poisoned(SOFTMAX_KERNELS["fused"], x)
    assert_softmax_close(out, x, what="fused offset:3")
    assert_rows_sum_to_one(out)
"""

from __future__ import annotations

import importlib
import math
import os

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
    on_device: bool = False,
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
    on_device: draw on `device` itself, in float32 with a generator of that device, instead of
        in float64 on the host: the same recipe for shapes too large to draw on the host (the
        benchmarks, the GPU byte cases); the values then differ from one device to another.
    """
    where = torch.device(device) if on_device else torch.device("cpu")
    wide = torch.float32 if on_device else torch.float64
    g = torch.Generator(device=where).manual_seed(seed)

    def randint(high, n):
        return torch.randint(0, high, (n,), generator=g, device=where)

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


def tolerance(dtype, kernel=None) -> tuple[float, float]:
    """(atol, rtol) for an output of `dtype`: TOLERANCES, unless the registry kernel's spec
    sets its own for that dtype."""
    override = kernel.tolerance(dtype) if kernel is not None else None
    return override or TOLERANCES[dtype]


def assert_softmax_close(
    got: torch.Tensor, x: torch.Tensor, *, dtype=None, what: str = "", record=None, kernel=None
) -> float:
    """`got` against the float64 softmax of `x` (over the last axis) within tolerance(dtype,
    kernel) (dtype: got's by default). NaN is expected exactly where the reference has it (all -inf
    rows); NaN elsewhere, numbers where NaN belongs, and ±inf are reported apart from plain
    mismatches, each with a count and the first indices. Returns the largest absolute error
    over the elements both hold finite, for the manifest."""
    dtype = got.dtype if dtype is None else dtype
    atol, rtol = tolerance(dtype, kernel)
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


def storage_rounding(ref: np.ndarray, dtype) -> np.ndarray:
    """Per row, how far the exact probabilities `ref` (float64) sum from their own sum once each
    is rounded to `dtype`: what storing the row costs a correct kernel. Negligible unless many
    of them fall below the format's smallest normal number, where its absolute spacing takes
    over (fp16 at V in the millions, where most of a row's elements round to 0 or a few
    subnormal steps)."""
    if dtype == torch.float32:
        return np.zeros(ref.shape[:-1])
    rounded = torch.from_numpy(ref).to(dtype).to(torch.float64).numpy()
    return np.abs(np.nansum(rounded, axis=-1) - np.nansum(ref, axis=-1))


def assert_rows_sum_to_one(got: torch.Tensor, *, dtype=None, what: str = "", slack=None) -> None:
    """Every row of `got` sums to 1 within row_sum_tolerance(V, dtype) (NaN rows fail), plus
    `slack` per row where given (storage_rounding of the reference)."""
    dtype = got.dtype if dtype is None else dtype
    V = got.shape[-1]
    tol = row_sum_tolerance(V, dtype) + (0.0 if slack is None else np.asarray(slack))
    sums = got.detach().to("cpu", torch.float64).sum(dim=-1).numpy()
    bad = ~(np.abs(sums - 1.0) <= tol)
    if bad.any():
        drift = np.abs(sums - 1.0)
        raise AssertionError(
            f"{what or 'softmax'} ({dtype_id(dtype)}, V = {V}): {int(bad.sum())} of {sums.size} rows do not sum to 1 "
            f"within {np.max(tol):.3g} (worst drift {np.nanmax(drift) if not np.isnan(drift).all() else np.nan:.3g}): "
            + _where(bad, sums)
        )


def check_softmax(got: torch.Tensor, x: torch.Tensor, *, what: str = "", record=None, kernel=None) -> float:
    """The whole contract of a softmax output: assert_softmax_close to the reference (NaN exactly
    in the rows of x that are all -inf; the registry `kernel`'s own tolerance where its spec sets
    one) and assert_rows_sum_to_one for every other row."""
    err = assert_softmax_close(got, x, what=what, record=record, kernel=kernel)
    defined = ~torch.isneginf(x).all(dim=-1)
    ref = softmax_ref(x[defined].detach().to("cpu", torch.float64).numpy())
    assert_rows_sum_to_one(got[defined], dtype=got.dtype, what=what, slack=storage_rounding(ref, got.dtype))
    return err


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
# The tolerances below are derived from the float32 arithmetic the kernels do (u = 2^-24 is one
# rounding): each bound scales with the magnitudes that enter the result, so a correct kernel
# passes at any value range and a wrong sum, a lost element or a wrong coefficient does not.

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


def _storage(dtype) -> tuple[float, float]:
    """(relative error of one rounding into dtype, absolute floor below which values may be
    flushed or lose their digits) for a float32 computation stored in dtype."""
    if dtype == torch.float32:
        return FP32_EPS, torch.finfo(torch.float32).tiny
    return TOLERANCES[dtype][1], TOLERANCES[dtype][0]


def _assert_within(got: np.ndarray, ref: np.ndarray, tol: np.ndarray, what: str) -> float:
    """NaN exactly where ref is NaN, the same infinities where ref has them, and |got - ref| <= tol
    elsewhere; returns the largest error over the finite elements."""
    problems = []
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    if (nan_g != nan_r).any():
        problems.append(
            f"{int((nan_g & ~nan_r).sum())} NaN where the reference is not, {int((nan_r & ~nan_g).sum())} "
            "numbers where it is NaN: " + _where(nan_g != nan_r, got, ref)
        )
    inf_g, inf_r = np.isinf(got), np.isinf(ref)
    if ((inf_g | inf_r) & ~(nan_g | nan_r)).any():
        bad_inf = (inf_g | inf_r) & ~(nan_g | nan_r) & ~(inf_g & inf_r & (np.sign(got) == np.sign(ref)))
        if bad_inf.any():
            problems.append(f"{int(bad_inf.sum())} infinities differ: " + _where(bad_inf, got, ref))
    both = np.isfinite(got) & np.isfinite(ref)
    err = np.abs(np.where(both, got, 0.0) - np.where(both, ref, 0.0))
    off = both & ~(err <= tol)
    if off.any():
        ratio = np.max(err[off] / np.maximum(tol[off], np.finfo(np.float64).tiny))
        problems.append(
            f"{int(off.sum())} of {got.size} beyond tolerance (worst {ratio:.3g}x it): " + _where(off, got, ref)
        )
    if problems:
        raise AssertionError(f"{what}:\n  " + "\n  ".join(problems))
    return float(err.max(initial=0.0))


def backward_tolerance(y, dy, dtype) -> np.ndarray:
    """Per element, how far a correct float32 softmax backward stored in dtype may be from the
    float64 dx: the product y * dy (one rounding), the row sum S (rounded once, plus the
    fixed-point truncation of at most 2^(2 ceil(log2 V) - 61) times the largest product), the
    difference dy - S and the product with y (one rounding each), then the rounding into dtype."""
    y = np.asarray(y, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    V = y.shape[-1]
    bits = math.ceil(math.log2(V)) if V > 1 else 0
    with np.errstate(invalid="ignore", over="ignore"):
        S = (y * dy).sum(axis=-1, keepdims=True)
        A = np.abs(y * dy).sum(axis=-1, keepdims=True)
        ref = y * (dy - S)
        rel, floor = _storage(dtype)
        arith = np.abs(y) * (8 * UNIT_ROUNDOFF * (np.abs(dy) + np.abs(S) + A) + 2.0 ** (2 * bits - 60) * A)
        return rel * np.abs(ref) + arith + floor * (1 + np.abs(dy) + np.abs(S))


def assert_backward_close(got: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, *, what: str = "") -> float:
    """`got` against softmax_backward_ref(y, dy) within backward_tolerance (NaN and infinities
    exactly where the reference has them). Returns the largest absolute error."""
    from kernels.reference import softmax_backward_ref

    yd = y.detach().to("cpu", torch.float64).numpy()
    dyd = dy.detach().to("cpu", torch.float64).numpy()
    ref = softmax_backward_ref(y=yd, dy=dyd)
    g = got.detach().to("cpu", torch.float64).numpy()
    assert g.shape == ref.shape, f"{what}: shape {g.shape}, expected {ref.shape}"
    tol = backward_tolerance(yd, dyd, got.dtype)
    return _assert_within(g, ref, tol, f"{what or 'softmax backward'} ({dtype_id(got.dtype)}, shape {g.shape})")


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


def cross_entropy_expected(
    logits_, target, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="none"
) -> dict:
    """The float64 reference of everything cross_entropy_fused returns, and the tolerances a
    correct float32 kernel meets, derived from its arithmetic: keys loss, grad, lse and
    loss_tol, grad_tol, lse_tol (float64 arrays; the loss a 0-d array for "mean" / "sum").

    Per row, with m the max, L = lse - m, E = sum_j p_j |x_j - m| (the exponentials' argument
    rounding costs up to 1.5 u |x_j - m| each), alpha = (1 - e) w_t, beta = e W / V and the
    gradient scale g (1 / sum of the counted w_t for "mean"):
      lse   u (4 |lse| + 4 E + 12)
      loss  16 u (alpha (|m - x_t| + |L| + E + 2) + e / V (W (|L| + E + 2) + |q|)) plus the
            smoothing sum's truncation, q = sum_j w_j (x_j - m); then one rounding into dtype
      grad  16 u (|g| (alpha + beta) p_j (|x_j - m| + E + 4) + |g| e w_j / V) at every j, plus at
            the target 16 u |g| alpha |p_t - 1| (E_t + E + 2), E_t the mean distance of the other
            classes' mass (which p_t - 1 is), and the exp sum's truncation; then one rounding into
            dtype.
    "mean" / "sum" add the order-free sum over the rows (its truncation and one rounding).
    """
    from kernels.reference import cross_entropy_ref

    x = logits_.detach().to("cpu", torch.float64).numpy()
    t = target.detach().to("cpu", torch.int64).numpy()
    w = None if weight is None else weight.detach().to("cpu", torch.float32).to(torch.float64).numpy()
    loss, grad, lse = cross_entropy_ref(x, t, weight=w, ignore_index=ignore_index, label_smoothing=label_smoothing)
    N, V = x.shape
    wv = np.ones(V) if w is None else w
    e = float(np.float32(label_smoothing))
    u = UNIT_ROUNDOFF
    bits = math.ceil(math.log2(V)) if V > 1 else 0
    ignored = t == ignore_index
    ts = np.where(ignored, 0, t)
    rows = np.arange(N)
    rel, floor = _storage(logits_.dtype)
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
        loss_scale = alpha * (np.abs(np.where(fin, m - x_t, 0.0)) + np.abs(L) + E + 2) + gam * (
            W * (np.abs(L) + E + 2) + np.abs(q)
        )
        loss_arith = 16 * u * loss_scale + gam * q_trunc  # the float32 row loss, before any rounding into dtype
        loss_tol = rel * np.abs(loss) + loss_arith
        counted = np.where(ignored, 0.0, w_t).sum()
        # The gradient scale per row: an ignored row stays 0 (or NaN) even where g is inf.
        g = np.where(ignored, 0.0, 1.0 / counted if reduction == "mean" else 1.0)
        grad = np.where(ignored[:, None], grad, grad * g[:, None])
        coef = np.abs(g) * (np.abs(alpha) + np.abs(beta))
        grad_tol = (
            16 * u * (coef[:, None] * p * (d + E[:, None] + 4) + (np.abs(g) * gam)[:, None] * np.abs(wv)[None, :])
        )
        # p_t - 1 = -(the other classes' mass): its error follows their mean distance to the max.
        others = p.sum(axis=1) - p[rows, ts]
        E_t = np.where(others > 0, (E - p[rows, ts] * d[rows, ts]) / np.where(others > 0, others, 1.0), 0.0)
        target_extra = 16 * u * np.abs(g) * np.abs(alpha) * np.abs(np.expm1(-(lse - x_t))) * (E_t + E + 2)
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
            loss, loss_tol = np.asarray(total), np.asarray(rel * abs(total) + total_tol)
    return {"loss": loss, "grad": grad, "lse": lse, "loss_tol": loss_tol, "grad_tol": grad_tol, "lse_tol": lse_tol}


def assert_cross_entropy_close(result, logits_, target, *, what: str = "", **options) -> dict:
    """(loss, grad, lse) from a cross-entropy against cross_entropy_expected(logits_, target,
    **options): every value within its tolerance, NaN and infinities exactly where the reference
    has them. Returns the largest error of each, by name."""
    loss, grad, lse = result
    exp = cross_entropy_expected(logits_, target, **options)
    label = f"{what or 'cross-entropy'} ({dtype_id(logits_.dtype)}, shape {tuple(logits_.shape)})"
    assert loss.dtype == logits_.dtype, f"{label}: loss is {loss.dtype}"
    assert lse.dtype == torch.float32 and grad.dtype == logits_.dtype, f"{label}: lse {lse.dtype}, grad {grad.dtype}"
    out = {}
    for name, got in (("loss", loss), ("grad", grad), ("lse", lse)):
        g = got.detach().to("cpu", torch.float64).numpy()
        assert g.shape == exp[name].shape, f"{label}: {name} shape {g.shape}, expected {exp[name].shape}"
        out[name] = _assert_within(
            np.atleast_1d(g), np.atleast_1d(exp[name]), np.atleast_1d(exp[f"{name}_tol"]), f"{label} {name}"
        )
    return out
