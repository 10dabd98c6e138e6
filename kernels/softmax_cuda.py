"""CUDA C softmax kernels (kernels/cuda/*.cu), compiled at run time through CuPy and launched
through `kernels.launch`.

Three versions side by side, each adding one idea to the last:
  naive  one thread per row, three serial passes (max, sum, normalise); float32 only.
  smem   one block per row, shared-memory tree reductions, three coalesced passes; float32 only.
  fused  the row read once and written once, held in registers between; float32, bfloat16,
         float16 storage with float32 arithmetic. A size class per row length (the table in
         `kernels.cuda_plans`), so per-thread arrays have compile-time sizes and never spill.
         A row's sum of exponentials is accumulated in 64-bit fixed point, so its bits do not
         depend on how the row was split over threads, CTAs or a cluster (see softmax_fused.cu).

Inputs: a (B, V) CUDA tensor. A non-contiguous input is copied with `.contiguous()` first
(the kernels assume a row stride of V); a contiguous input at any storage offset is read in
place. `out`, if given, must be contiguous (checks.prepare_output). Launches go to torch's
current stream on the tensor's device. CuPy compiles (and caches) the kernels on first use;
it is imported then, never at import time.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import torch

from .checks import check_softmax_input, prepare_output
from .cuda_build import (
    CU_SOURCES,
    CUPY_IMPLICIT_OPTIONS,
    FUSED_SOURCE,
    NAIVE_SOURCE,
    NVCC_OPTIONS,
    PTXAS_CHECK_OPTIONS,
    SMEM_SOURCE,
    TARGET_ARCH,
    compile_offline,
    expected_kernels,
    format_ptxas_report,
    module_source,
    parse_ptxas_report,
)
from .cuda_plans import (
    ALL_FUSED_PLANS,
    DISPATCH_BOUNDARIES,
    DISPATCH_BOUNDARIES_BY_DTYPE,
    FORMATS,
    PATHS,
    FusedPlan,
    fused_path,
    fused_plan,
    fused_plans,
    select_fused_plan,
)
from .launch import KernelLauncher

FUSED_DTYPES = tuple(FORMATS)
_VEC_BYTES = 16
_MAX_GRID_X = 2**31 - 1
MAX_V = 2**31 - 2**20  # the kernels index columns with 32-bit ints
# The warp kinds' grid: enough blocks to fill every SM several times over; rows past it are
# looped over inside the kernel.
WARP_BLOCKS_PER_SM = 32
NAIVE_THREADS = 256
SMEM_THREADS = 256  # must match SMEM_THREADS in softmax_smem.cu
SMEM_MAX_GRID = 1 << 20  # the kernel loops over rows beyond the grid

# -- compiled kernels, one launcher per (device, kernel) ------------------------------------------

_modules: dict = {}  # (device index, source sha256) -> cupy.RawModule
_launchers: dict = {}  # (device index, kernel name) -> KernelLauncher
_device_info: dict = {}  # device index -> (SM count, compute capability major)


def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the CUDA C softmax kernels (naive, smem, fused) need CuPy: pip install cupy-cuda13x "
            "(or the cupy-cuda12x wheel matching the installed CUDA driver)"
        ) from e
    return cupy


def _sm_count_and_major(device_index: int) -> tuple[int, int]:
    info = _device_info.get(device_index)
    if info is None:
        props = torch.cuda.get_device_properties(device_index)
        info = _device_info[device_index] = (props.multi_processor_count, props.major)
    return info


def _launcher(device_index: int, path, name: str, *, block: int, arg_kinds) -> KernelLauncher:
    key = (device_index, name)
    launcher = _launchers.get(key)
    if launcher is not None:
        return launcher
    cp = _cupy()
    src = module_source(path)
    mkey = (device_index, hashlib.sha256(src.encode()).hexdigest())
    with cp.cuda.Device(device_index):
        mod = _modules.get(mkey)
        if mod is None:
            backend = "nvcc" if cp.cuda.get_nvcc_path() else "nvrtc"  # the source needs no headers
            mod = _modules[mkey] = cp.RawModule(code=src, options=NVCC_OPTIONS, backend=backend)
        function = mod.get_function(name).kernel.ptr
    launcher = _launchers[key] = KernelLauncher(name, function, arg_kinds=arg_kinds, block=block)
    return launcher


def _prepare(x, out, kernel: str, dtypes):
    check_softmax_input(x, kernel=kernel, dtypes=dtypes)
    if x.shape[1] >= MAX_V:
        raise ValueError(f"{kernel} softmax: V = {x.shape[1]} exceeds the kernels' 32-bit column index")
    if not x.is_contiguous():
        x = x.contiguous()  # the kernels assume rows of stride V
    return x, prepare_output(x, out, kernel=kernel)


_ROWS_ARGS = ("ptr", "ptr", "i64", "i32")


def softmax_naive(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """One thread per row (float32)."""
    x, y = _prepare(x, out, "naive", (torch.float32,))
    B, V = x.shape
    if B == 0:
        return y
    grid = -(-B // NAIVE_THREADS)
    if grid > _MAX_GRID_X:
        raise ValueError(f"naive softmax: B = {B} needs more than 2^31 - 1 blocks")
    dev = x.get_device()
    _launcher(dev, NAIVE_SOURCE, "softmax_naive_f32", block=NAIVE_THREADS, arg_kinds=_ROWS_ARGS)(
        dev, grid, x.data_ptr(), y.data_ptr(), B, V
    )
    return y


def softmax_smem(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """One block per row, shared-memory tree reductions (float32)."""
    x, y = _prepare(x, out, "smem", (torch.float32,))
    B, V = x.shape
    if B == 0:
        return y
    dev = x.get_device()
    _launcher(dev, SMEM_SOURCE, "softmax_smem_f32", block=SMEM_THREADS, arg_kinds=_ROWS_ARGS)(
        dev, min(B, SMEM_MAX_GRID), x.data_ptr(), y.data_ptr(), B, V
    )
    return y


class _FusedLaunch(NamedTuple):
    """A plan resolved for one device and dtype: its launcher and the grid arithmetic."""

    plan: FusedPlan
    launcher: KernelLauncher
    rows_per_block: int
    grid_limit: int  # in row units: blocks for the warp kinds, CTA groups (clusters) otherwise
    cluster: int
    takes_flag: bool  # every kind but warp takes the vector-store flag

    def grid(self, B: int, grid_cap: int | None = None) -> int:
        units = min(-(-B // self.rows_per_block), self.grid_limit)
        if grid_cap is not None:
            units = max(1, min(units, grid_cap // self.cluster))
        return units * self.cluster


def _fused_launch(dev: int, V: int, dtype, plan: FusedPlan | None) -> _FusedLaunch:
    if plan is None:
        plan = select_fused_plan(V, dtype, clusters=_sm_count_and_major(dev)[1] >= 9)
    cap = plan.capacity
    if cap is not None and V > cap:
        raise ValueError(f"fused softmax: V = {V} does not fit {plan.describe()}")
    kinds = _ROWS_ARGS if plan.kind == "warp" else _ROWS_ARGS + ("i32",)
    launcher = _launcher(dev, FUSED_SOURCE, plan.kernel_name(dtype), block=plan.threads, arg_kinds=kinds)
    if plan.kind in ("warp", "warpvec"):
        # Enough blocks to fill every SM several times over; the kernel loops over the rest.
        limit = _sm_count_and_major(dev)[0] * WARP_BLOCKS_PER_SM
    else:  # a CTA (group) per row, as many as the grid holds
        limit = _MAX_GRID_X // plan.cluster
    return _FusedLaunch(plan, launcher, plan.rows_per_block, limit, plan.cluster, plan.kind != "warp")


# (dtype, V, device) -> the dispatched plan's launch, resolved on the first checked call. A hit
# in the common call (a contiguous CUDA input, a new output) needs no check beyond B > 0 and
# contiguity: the entry exists only for what passed every check once. Microseconds of Python
# per call are the difference between beating F.softmax from Python and losing to it at
# small shapes.
_fused_dispatch: dict = {}


def softmax_fused(
    x: torch.Tensor, *, out: torch.Tensor | None = None, plan: FusedPlan | None = None, grid_cap: int | None = None
) -> torch.Tensor:
    """Single read, single write softmax; float32 / bfloat16 / float16.

    `plan` forces a size class (one of `fused_plans(dtype)`; ValueError if the row does not
    fit it), `grid_cap` caps the grid at that many CTAs so that CTAs loop over rows: both for
    tests that reach every path and loop at small shapes.
    """
    if out is None and plan is None and grid_cap is None:
        try:
            B, V = x.shape
            dev = x.get_device()
            fast = _fused_dispatch.get((x.dtype, V, dev))
        except (AttributeError, TypeError, ValueError):
            fast = None  # not a 2-D tensor: the checks below say what is wrong
        if fast is not None and B > 0 and x.is_contiguous():
            y = torch.empty_like(x)
            _launch_fused(fast, dev, x.data_ptr(), y.data_ptr(), B, V, None)
            return y
    x, y = _prepare(x, out, "fused", FUSED_DTYPES)
    B, V = x.shape
    if B == 0:
        return y
    dev = x.get_device()
    if plan is None:
        key = (x.dtype, V, dev)
        entry = _fused_dispatch.get(key)
        if entry is None:
            entry = _fused_dispatch[key] = _fused_launch(dev, V, x.dtype, None)
    else:
        entry = _fused_launch(dev, V, x.dtype, plan)
    _launch_fused(entry, dev, x.data_ptr(), y.data_ptr(), B, V, grid_cap)
    return y


def _launch_fused(entry: _FusedLaunch, dev: int, x_ptr: int, y_ptr: int, B: int, V: int, grid_cap) -> None:
    grid = entry.grid(B, grid_cap)
    if entry.takes_flag:
        # Vector stores need the output slice aligned like the input slice; with equal addresses
        # mod 16 that holds for every row and slice.
        entry.launcher(dev, grid, x_ptr, y_ptr, B, V, int((y_ptr - x_ptr) % _VEC_BYTES == 0))
    else:
        entry.launcher(dev, grid, x_ptr, y_ptr, B, V)


def plan_path(B: int, V: int, dtype=torch.float32) -> str:
    """The path name `softmax_fused` takes on an sm_90 device (registry's plan function)."""
    return fused_path(B, V, dtype)


__all__ = [
    "softmax_naive",
    "softmax_smem",
    "softmax_fused",
    "fused_plan",
    "fused_path",
    "plan_path",
    "FusedPlan",
    "select_fused_plan",
    "DISPATCH_BOUNDARIES",
    "DISPATCH_BOUNDARIES_BY_DTYPE",
    "fused_plans",
    "ALL_FUSED_PLANS",
    "PATHS",
    "CU_SOURCES",
    "NVCC_OPTIONS",
    "CUPY_IMPLICIT_OPTIONS",
    "TARGET_ARCH",
    "PTXAS_CHECK_OPTIONS",
    "module_source",
    "expected_kernels",
    "parse_ptxas_report",
    "format_ptxas_report",
    "compile_offline",
    "FUSED_DTYPES",
    "WARP_BLOCKS_PER_SM",
]
