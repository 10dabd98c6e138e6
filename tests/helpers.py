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
