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
         Rows past the largest cluster class, and short batches of long rows, are cut over
         several CTAs that meet through a per-row workspace (the split and loop paths).

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

from .build_once import build_lock
from .checks import check_softmax_input, prepare_output
from .cuda_build import FUSED_SOURCE, NAIVE_SOURCE, NVCC_OPTIONS, SMEM_SOURCE, kernel_source
from .cuda_plans import (
    FORMATS,
    LOOP_CLASS,
    SPLIT_MAX_POLLS,
    FusedClass,
    fused_parts,
    select_fused_class,
    slice_length,
    split_fits,
)
from .launch import (
    FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
    KernelLauncher,
    device_info,
    driver,
    workspace,
)

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


def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the CUDA C kernels (softmax naive, smem, fused; the fused softmax backward and "
            "cross-entropy) need CuPy: pip install cupy-cuda13x (or the cupy-cuda12x wheel matching "
            "the installed CUDA driver)"
        ) from e
    return cupy


def module_function(device_index: int, src: str, name: str) -> int:
    """The CUfunction handle of kernel `name` in the translation unit `src` on a device. Each
    (device, source) is compiled once per process, for this module's kernels and
    kernels/cuda_training.py's, and once per machine (CuPy's on-disk cache, build_once)."""
    cp = _cupy()
    sha = hashlib.sha256(src.encode()).hexdigest()
    mkey = (device_index, sha)
    with cp.cuda.Device(device_index):
        mod = _modules.get(mkey)
        if mod is not None:
            return mod.get_function(name).kernel.ptr
        backend = "nvcc" if cp.cuda.get_nvcc_path() else "nvrtc"  # the source needs no headers
        with build_lock(f"cupy {backend} {sha} {cp.cuda.Device(device_index).compute_capability}"):
            mod = cp.RawModule(code=src, options=NVCC_OPTIONS, backend=backend)
            function = mod.get_function(name).kernel.ptr  # compiles (or loads from the cache) now
        _modules[mkey] = mod
        return function


# Clusters of more than this many CTAs are non-portable: the kernel must allow them first.
PORTABLE_CLUSTER_SIZE = 8


def cuda_launcher(
    device_index: int,
    path,
    name: str,
    *,
    block: int,
    arg_kinds,
    cluster: int = 1,
    shared: int = 0,
    source=kernel_source,
) -> KernelLauncher:
    """The launcher of kernel `name` of `path` on a device (its unit: source(path, name)), built
    once per process, for this module's kernels and kernels/cuda_training.py's."""
    key = (device_index, name)
    launcher = _launchers.get(key)
    if launcher is not None:
        return launcher
    function = module_function(device_index, source(path, name), name)
    with _cupy().cuda.Device(device_index):
        if cluster > PORTABLE_CLUSTER_SIZE:
            driver().set_function_attribute(function, FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, name=name)
        if shared:  # past 48 KB a kernel must ask for its dynamic shared memory first
            driver().set_function_attribute(function, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared, name=name)
    launcher = _launchers[key] = KernelLauncher(name, function, arg_kinds=arg_kinds, block=block, shared=shared)
    return launcher


def check_columns(t: torch.Tensor, what: str) -> None:
    """A column index that fits the kernels' 32 bits."""
    if t.shape[1] >= MAX_V:
        raise ValueError(f"{what}: V = {t.shape[1]} exceeds the kernels' 32-bit column index")


def _prepare(x, out, kernel: str, dtypes):
    check_softmax_input(x, kernel=kernel, dtypes=dtypes)
    check_columns(x, f"{kernel} softmax")
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
    cuda_launcher(dev, NAIVE_SOURCE, "softmax_naive_f32", block=NAIVE_THREADS, arg_kinds=_ROWS_ARGS)(
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
    cuda_launcher(dev, SMEM_SOURCE, "softmax_smem_f32", block=SMEM_THREADS, arg_kinds=_ROWS_ARGS)(
        dev, min(B, SMEM_MAX_GRID), x.data_ptr(), y.data_ptr(), B, V
    )
    return y


class ClassLaunch(NamedTuple):
    """A size class resolved for one device and dtype: its launcher and the grid arithmetic (the
    fused softmax's and kernels/cuda_training.py's)."""

    size_class: FusedClass
    launcher: KernelLauncher
    rows_per_block: int
    grid_limit: int  # in row units: blocks for the warp kinds, CTA groups (clusters) otherwise
    cluster: int
    takes_flag: bool  # every kind but warp takes the vector-store flag
    sm_count: int

    def grid(self, B: int, grid_cap: int | None = None) -> int:
        units = min(-(-B // self.rows_per_block), self.grid_limit)
        if grid_cap is not None:
            units = max(1, min(units, grid_cap // self.cluster))
        return units * self.cluster


def class_launch(dev: int, size_class, launcher: KernelLauncher) -> ClassLaunch:
    sms = device_info(dev)[1]
    if size_class.kind in ("warp", "warpvec"):
        # Enough blocks to fill every SM several times over; the kernel loops over the rest.
        limit = sms * WARP_BLOCKS_PER_SM
    else:  # a CTA (group) per row, as many as the grid holds
        limit = _MAX_GRID_X // size_class.cluster
    cluster = size_class.cluster
    return ClassLaunch(size_class, launcher, size_class.rows_per_block, limit, cluster, size_class.kind != "warp", sms)


def _fused_launch(dev: int, V: int, dtype, size_class: FusedClass | None) -> ClassLaunch:
    _, sms, major = device_info(dev)
    if size_class is None:
        size_class = select_fused_class(V, dtype, clusters=major >= 9)
        if size_class.kind == "split" and not split_fits(size_class, V, sms):
            size_class = LOOP_CLASS  # a small GPU cannot hold all of the row's CTAs at once
    cap = size_class.capacity
    if cap is not None and V > cap:
        raise ValueError(f"fused softmax: V = {V} does not fit {size_class.describe()}")
    if size_class.meets_in_memory:
        kinds = _ROWS_ARGS + ("i32", "ptr", "i32", "i32")
    else:
        kinds = _ROWS_ARGS if size_class.kind == "warp" else _ROWS_ARGS + ("i32",)
    launcher = cuda_launcher(
        dev,
        FUSED_SOURCE,
        size_class.kernel_name(dtype),
        block=size_class.threads,
        arg_kinds=kinds,
        cluster=size_class.cluster,
        shared=size_class.shared_bytes(dtype),
    )
    return class_launch(dev, size_class, launcher)


# (dtype, V, device) -> the dispatched size_class's launch, resolved on the first checked call. A hit
# in the common call (a contiguous CUDA input, a new output) needs no check beyond B > 0 and
# contiguity: the entry exists only for what passed every check once. Microseconds of Python
# per call are the difference between beating F.softmax from Python and losing to it at small
# shapes.
_fused_dispatch: dict = {}

# The split / loop classes' workspace (kernels.launch.workspace): 8 int32 words per row.
WORKSPACE_WORDS_PER_ROW = 8


def softmax_fused(
    x: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    size_class: FusedClass | None = None,
    grid_cap: int | None = None,
    parts: int | None = None,
    max_polls: int | None = None,
) -> torch.Tensor:
    """Single read, single write softmax; float32 / bfloat16 / float16.

    For tests and probes: `size_class` forces a size class (one of
    `kernels.cuda_plans.fused_classes(dtype)`; ValueError if the row does not fit it),
    `grid_cap` caps the grid at that many CTAs so that CTAs loop over rows; for the split and
    loop classes `parts` sets the CTAs per row (ValueError where the slices would not fit) and
    `max_polls` how long a CTA waits for its partners before reading the row itself (0: at once).
    """
    if out is None and size_class is None and grid_cap is None and parts is None and max_polls is None:
        try:
            B, V = x.shape
            dev = x.get_device()
            fast = _fused_dispatch.get((x.dtype, V, dev))
        except (AttributeError, TypeError, ValueError):
            fast = None  # not a 2-D tensor: the checks below say what is wrong
        if fast is not None and B > 0 and x.is_contiguous():
            y = torch.empty_like(x)
            _launch_fused(fast, dev, x.data_ptr(), y.data_ptr(), B, V, None, None, None)
            return y
    x, y = _prepare(x, out, "fused", FUSED_DTYPES)
    B, V = x.shape
    if B == 0:
        return y
    dev = x.get_device()
    if size_class is None:
        key = (x.dtype, V, dev)
        entry = _fused_dispatch.get(key)
        if entry is None:
            entry = _fused_dispatch[key] = _fused_launch(dev, V, x.dtype, None)
    else:
        entry = _fused_launch(dev, V, x.dtype, size_class)
    if parts is not None:
        what = entry.size_class.describe()
        if not entry.size_class.meets_in_memory:
            raise ValueError(f"fused softmax: parts is for the split and loop classes, not {what}")
        cap = entry.size_class.slice_capacity
        if not 1 <= parts <= 2**20 or (cap is not None and slice_length(V, parts) > cap):
            raise ValueError(f"fused softmax: V = {V} cut into {parts} parts does not fit {what}")
    if max_polls is not None and max_polls < 0:
        raise ValueError(f"fused softmax: max_polls must be >= 0, got {max_polls}")
    _launch_fused(entry, dev, x.data_ptr(), y.data_ptr(), B, V, grid_cap, parts, max_polls)
    return y


def _launch_fused(
    entry: ClassLaunch, dev: int, x_ptr: int, y_ptr: int, B: int, V: int, grid_cap, parts, max_polls
) -> None:
    # Vector stores need the output slice aligned like the input slice; with equal addresses
    # mod 16 that holds for every row and slice.
    if entry.size_class.meets_in_memory:
        P = parts or fused_parts(entry.size_class, B, V, entry.sm_count)
        ws = 0
        if P > 1:
            words = WORKSPACE_WORDS_PER_ROW * B
            ws = workspace("fused", dev, words, at_least=WORKSPACE_WORDS_PER_ROW * 4096, dtype=torch.int32).data_ptr()
        grid = min(B * P, _MAX_GRID_X)
        if grid_cap is not None:
            grid = max(1, min(grid, grid_cap))
        polls = SPLIT_MAX_POLLS if max_polls is None else max_polls
        flag = int((y_ptr - x_ptr) % _VEC_BYTES == 0)
        entry.launcher(dev, grid, x_ptr, y_ptr, B, V, flag, ws, P, polls)
        return
    grid = entry.grid(B, grid_cap)
    if entry.takes_flag:
        entry.launcher(dev, grid, x_ptr, y_ptr, B, V, int((y_ptr - x_ptr) % _VEC_BYTES == 0))
    else:
        entry.launcher(dev, grid, x_ptr, y_ptr, B, V)
