"""Lean kernel launches: one driver-API call per softmax, from either backend's compiled kernel.

Why this exists. A softmax at a small shape runs for a few microseconds on the GPU, but the
generic launchers around our kernels cost far more from Python: CuPy's `RawKernel.__call__`
with its device and stream context managers, or Triton's JIT launcher, which re-binds and
re-specialises every argument on every call. Measured on an H200 they cost 7-15 us per call,
against about 10 us for the whole of `F.softmax`. Here a kernel that has been compiled and
loaded once (by CuPy or by Triton, which stay in charge of compiling and caching) is launched
with `cuLaunchKernel` directly:

  * the CUfunction handle, block size and shared memory are read once per kernel and device;
  * the arguments are packed with one `struct.pack_into` into a buffer whose slots the
    parameter array already points at;
  * the stream is torch's current stream on the tensor's device, so launches follow torch's
    stream semantics and are captured by `torch.cuda.graph` like any torch op.

Everything here is an optimisation of how a kernel is called, never of what it computes: each
`KernelLauncher` is built from the same compiled function the generic launcher would use.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

import torch

# CUresult code for success (cuda.h).
_CUDA_SUCCESS = 0
# CUfunction_attribute (cuda.h): the dynamic shared memory a kernel may be launched with (above
# 48 KB it must be raised first), and whether it may run in clusters of more than 8 CTAs.
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14

# Argument kinds -> struct codes, each padded to an 8-byte slot so every slot is aligned for
# any parameter type.
_SLOT = {"ptr": "Q", "i64": "q", "i32": "i4x", "u32": "I4x", "f32": "f4x"}


class LaunchError(RuntimeError):
    """A driver call failed; the message names the kernel and the CUDA error."""


class _Driver:
    """The few libcuda entry points we call, bound once per process."""

    def __init__(self):
        try:
            lib = ctypes.PyDLL("libcuda.so.1")  # PyDLL: the GIL stays held during the call
        except OSError as e:  # pragma: no cover - depends on the machine
            raise LaunchError(f"the CUDA driver library could not be loaded: {e}") from e
        self.launch = lib.cuLaunchKernel
        self.launch.restype = ctypes.c_int
        # (function, grid x y z, block x y z, shared bytes, stream, params, extra)
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.param_info = getattr(lib, "cuFuncGetParamInfo", None)
        if self.param_info is not None:
            self.param_info.restype = ctypes.c_int
            size_p = ctypes.POINTER(ctypes.c_size_t)
            self.param_info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, size_p, size_p]
        self.set_attribute = lib.cuFuncSetAttribute
        self.set_attribute.restype = ctypes.c_int
        self.set_attribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.error_name = lib.cuGetErrorName
        self.error_name.restype = ctypes.c_int
        self.error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def describe(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self.error_name(code, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
            return f"{name.value.decode()} ({code})"
        return f"CUDA error {code}"

    def set_function_attribute(self, function: int, attribute: int, value: int, *, name: str = "kernel") -> None:
        """cuFuncSetAttribute (a CUfunction_attribute of cuda.h); LaunchError naming the kernel."""
        code = self.set_attribute(ctypes.c_void_p(function), attribute, value)
        if code != _CUDA_SUCCESS:
            raise LaunchError(f"{name}: cuFuncSetAttribute({attribute}, {value}) failed: {self.describe(code)}")

    def param_sizes(self, function: int) -> list[int] | None:
        """Sizes in bytes of a kernel's parameters, or None where the driver cannot say."""
        if self.param_info is None:
            return None
        sizes = []
        offset, size = ctypes.c_size_t(), ctypes.c_size_t()
        while len(sizes) < 256:
            if self.param_info(function, len(sizes), ctypes.byref(offset), ctypes.byref(size)) != _CUDA_SUCCESS:
                break
            sizes.append(size.value)
        return sizes


_driver: _Driver | None = None
_driver_lock = threading.Lock()


def _cupy_launch():
    """CuPy's compiled binding of cuLaunchKernel (Cython: a fraction of a ctypes call's cost),
    or None where CuPy is not installed. SOFTMAX_SUITE_LAUNCH=ctypes forces the ctypes route."""
    if os.environ.get("SOFTMAX_SUITE_LAUNCH", "").strip().lower() == "ctypes":
        return None
    try:
        from cupy_backends.cuda.api.driver import launchKernel
    except ImportError:
        return None
    return launchKernel


def driver() -> _Driver:
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                _driver = _Driver()
    return _driver


def _raw_stream_getter():
    # The raw handle of torch's current stream without building a torch.cuda.Stream object
    # (a few hundred ns instead of over a microsecond); the public route where it is missing.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device_index: torch.cuda.current_stream(device_index).cuda_stream


current_stream = _raw_stream_getter()


class KernelLauncher:
    """Launches one loaded kernel (a CUfunction of one device) with a fixed argument layout.

    `arg_kinds` lists the kernel's parameters in order ("ptr", "i64", "i32", "u32", "f32");
    `extra_null_params` appends that many null pointers (Triton's scratch parameters).
    """

    def __init__(self, name: str, function: int, *, arg_kinds, block: int, shared: int = 0, extra_null_params: int = 0):
        self.name = name
        self.function = ctypes.c_void_p(function)
        self.block = int(block)
        self.shared = int(shared)
        kinds = tuple(arg_kinds) + ("ptr",) * extra_null_params
        self._pack = struct.Struct("<" + "".join(_SLOT[k] for k in kinds))
        self._nulls = (0,) * extra_null_params
        self._buffer = ctypes.create_string_buffer(max(self._pack.size, 8))
        base = ctypes.addressof(self._buffer)
        self._params = (ctypes.c_void_p * max(len(kinds), 1))(*[base + 8 * i for i in range(len(kinds))])
        self._params_address = ctypes.addressof(self._params)
        self._function_address = int(function)
        self._lock = threading.Lock()
        self._fast = _cupy_launch()
        sizes = driver().param_sizes(function)
        if sizes is not None:
            expected = [8 if k in ("ptr", "i64") else 4 for k in kinds]
            if sizes != expected:
                raise LaunchError(
                    f"{name}: the compiled kernel takes parameters of {sizes} bytes, "
                    f"the launcher was built for {expected}"
                )

    def __call__(self, device_index: int, grid: int, *args) -> None:
        """Launch on `grid` CTAs on torch's current stream of `device_index`."""
        if grid <= 0:
            return
        with self._lock:  # the buffer is shared: one launch packs and launches at a time
            self._pack.pack_into(self._buffer, 0, *args, *self._nulls)
            error = self._launch(device_index, grid)
            if error is not None and _wrong_context(error):
                # The function belongs to the device's context, which is not this thread's
                # current one (another device is current, or none yet): launch from inside it.
                with torch.cuda.device(device_index):
                    torch.cuda.current_stream(device_index).query()  # makes the context current
                    error = self._launch(device_index, grid)
        if error is not None:
            raise LaunchError(
                f"{self.name}: cuLaunchKernel(grid={grid}, block={self.block}, shared={self.shared}) failed: {error}"
            )

    def _launch(self, device_index: int, grid: int) -> str | None:
        stream = current_stream(device_index)
        if self._fast is not None:
            try:
                self._fast(
                    self._function_address, grid, 1, 1, self.block, 1, 1, self.shared, stream, self._params_address, 0
                )
            except Exception as e:  # CuPy's CUDADriverError; its text names the CUDA error
                return str(e)
            return None
        drv = driver()
        code = drv.launch(self.function, grid, 1, 1, self.block, 1, 1, self.shared, stream, self._params, None)
        return None if code == _CUDA_SUCCESS else drv.describe(code)


def _wrong_context(error: str) -> bool:
    return "INVALID_CONTEXT" in error or "INVALID_HANDLE" in error or "CONTEXT_IS_DESTROYED" in error


_device_info: dict = {}


def device_info(device_index: int) -> tuple[str, int, int]:
    """(name, SM count, compute capability major) of a GPU, read once per process."""
    info = _device_info.get(device_index)
    if info is None:
        props = torch.cuda.get_device_properties(device_index)
        info = _device_info[device_index] = (props.name, props.multi_processor_count, props.major)
    return info


# -- workspaces: the per-row words through which a split launch's CTAs or programs meet -------------

_workspaces: dict = {}


def workspace(kind, dev: int, words: int, *, at_least: int = 0, dtype=torch.int64) -> torch.Tensor:
    """`words` zeroed words of `dtype` (at least `at_least` when allocated) for the split launches
    of `kind` (what decides which launches may share words: the kernel family, and for Triton's
    tagged words P) on device `dev` (-1: the CPU, under the Triton interpreter), cached per
    device and torch's current stream. Every kernel leaves its words ready for the next launch
    (the CUDA C kernels zero them, kernels/cuda/softmax_fused.cu; Triton's tag them,
    kernels/triton_kernels.py), and a launch on a stream runs after the previous one there,
    never beside it: no fill runs per call. A buffer outgrown is replaced; torch's allocator
    reuses its memory only in that stream's order.

    Inside a CUDA graph capture every call gets a fresh buffer, allocated (and zeroed) in the
    graph's memory pool and never cached: a graph is replayed later, on whatever stream is
    current then, possibly beside eager launches or another graph's replay (graphs share
    torch's capture stream), and words shared with those would be written by two launches at
    once. That costs each replay one fill of the words; it is the one rule that holds however
    graphs and eager calls interleave."""
    device = "cpu" if dev < 0 else f"cuda:{dev}"
    if dev >= 0 and torch.cuda.is_current_stream_capturing():
        return torch.zeros(words, dtype=dtype, device=device)
    key = (kind, dev, 0 if dev < 0 else current_stream(dev))
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < words:
        ws = _workspaces[key] = torch.zeros(max(words, at_least), dtype=dtype, device=device)
    return ws


# -- the floor: an empty kernel through this path ------------------------------------------------

_NOOP_SOURCE = 'extern "C" __global__ void softmax_suite_noop(unsigned long long p) {}'
_noop: dict[int, KernelLauncher] = {}


def launch_noop(device_index: int) -> None:
    """Launch an empty kernel on torch's current stream of `device_index` through this path:
    the floor under which no kernel launched this way can be called."""
    launcher = _noop.get(device_index)
    if launcher is None:
        import cupy as cp

        with cp.cuda.Device(device_index):
            kernel = cp.RawKernel(_NOOP_SOURCE, "softmax_suite_noop")
            launcher = KernelLauncher("noop", kernel.kernel.ptr, arg_kinds=("ptr",), block=32)
        _noop[device_index] = launcher
    launcher(device_index, 1, 0)
