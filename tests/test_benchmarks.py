"""Benchmarks of every softmax in the registry in three clocks (tests/suite/devicetime.py), the
ceilings they are judged against, the launch floors, and the lab's speed gates. Each case
validates its kernel's output before timing it and records raw values only; the manifest
derives every ratio from the whole run when it ends.

    pytest -m cuda --benchmark-only                      # everything, then reports/ is rewritten
    pytest -m cuda --benchmark-only -k lab               # the lab's grid only
    pytest -m cuda --benchmark-only -k "call- or floor-" # per-call and graph modes, launch floors
    pytest -m cuda --benchmark-only --regression-gate    # and fail on a regression (README: GPU CI job)
"""

import functools
import importlib
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton

from kernels import SOFTMAX_KERNELS, SUPPORTED_DTYPES
from tests.helpers import accuracy_gated, check_softmax
from tests.suite.devicetime import (
    calls_per_round,
    capture_graph,
    device_times_us,
    graph_replay_times_us,
    per_call_times_us,
    report_times_us,
)
from tests.suite.gpus import cupy_unusable_reason
from tests.suite.manifest import matrix_bytes

pytestmark = pytest.mark.cuda

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LAB_GRID = [(64, 600), (512, 600), (4096, 600)]
SWEEP_B = (64, 512, 4096, 32768)
SWEEP_V = (600, 4096, 32000, 50257, 128256)
SWEEP_KERNELS = ("F_softmax", "fused", "triton", "torch_compile")
MAX_TENSOR_BYTES = 16e9  # (32768, 128256) in fp32 is 16.8 GB per tensor: skipped

# Shapes at which every kernel is also timed per call and as a graph replay: from one row (a
# decode step) to a batch, at the lab's V and at real vocabularies (Llama 2, GPT-2, Llama 3).
CALL_B = (1, 8, 64, 512)
CALL_V = (600, 32000, 50257, 128256)
CALL_MODES = ("per_call", "graph")

# naive gives each row one thread that walks it three times, serially; smem reads it three
# times. Past V = 32000 a call takes milliseconds (naive) and neither is a kernel anyone would
# call there, so both stay at the lab's grid and V <= 32000.
ROW_SERIAL_KERNELS = ("naive", "smem")
ROW_SERIAL_MAX_V = 32000

# How many times each kernel moves the matrix through device memory by design, at rows that fit
# on chip (V = 600): naive reads it three times (max, sum, normalise) and writes it once; smem
# does the same with a block per row; the fused kernels, Triton and PyTorch's warp softmax
# read once and write once. The roofline places each kernel at its own intensity from these.
MATRIX_PASSES = {"naive": 4, "smem": 4, "fused": 2, "triton": 2, "F_softmax": 2, "torch_compile": 2}


@functools.cache
def compiled_softmax():
    return torch.compile(lambda x: F.softmax(x, dim=-1))


def run_kernel(name: str):
    if name in SOFTMAX_KERNELS:
        return SOFTMAX_KERNELS[name]
    if name == "torch_compile":  # until the registry carries it
        compiled = compiled_softmax()
        return lambda x, out=None: compiled(x) if out is None else out.copy_(compiled(x))
    raise KeyError(name)


# Every registered kernel, plus torch.compile(F.softmax) where the registry does not have it.
ALL_KERNELS = tuple(SOFTMAX_KERNELS) + (() if "torch_compile" in SOFTMAX_KERNELS else ("torch_compile",))


def supports(kernel: str, dtype: str) -> bool:
    return kernel not in SUPPORTED_DTYPES or DTYPES[dtype] in SUPPORTED_DTYPES[kernel]


def is_lab(B: int, V: int, dtype: str) -> bool:
    return (B, V) in LAB_GRID and dtype == "float32"


def call_shapes() -> list[tuple]:
    """(B, V, dtype) of the call-mode grid, then the lab's shapes it does not already have."""
    shapes = [(B, V, dtype) for dtype in DTYPES for V in CALL_V for B in CALL_B]
    return shapes + [(B, V, "float32") for B, V in LAB_GRID if (B, V, "float32") not in shapes]


def call_kernel_params(kernel: str, B: int, V: int, dtype: str, marks=()) -> list:
    """The pytest marks of one call-grid case: a skip, with its reason, for the row-serial
    kernels at long rows."""
    if kernel in ROW_SERIAL_KERNELS and not is_lab(B, V, dtype) and V > ROW_SERIAL_MAX_V:
        return [
            *marks,
            pytest.mark.skip(
                reason=f"{kernel} is timed at the lab's grid and V <= {ROW_SERIAL_MAX_V} "
                f"only: it reads each row three times (naive with one thread "
                f"per row), so a call at V = {V} takes far too long for "
                f"loops of back-to-back calls"
            ),
        ]
    return list(marks)


def device_cases():
    """(kernel, B, V, dtype): the lab grid (every kernel), the large-vocabulary sweep, and the
    call-mode shapes, so every call-mode entry has a device time beside it."""
    seen = []
    for B, V in LAB_GRID:
        for kernel in ("F_softmax", "naive", "smem", "fused", "triton"):
            seen.append((kernel, B, V, "float32"))
    for dtype in DTYPES:
        for V in SWEEP_V:
            for B in SWEEP_B:
                if B * V * DTYPES[dtype].itemsize > MAX_TENSOR_BYTES:
                    continue
                seen += [(k, B, V, dtype) for k in SWEEP_KERNELS if supports(k, dtype) and (k, B, V, dtype) not in seen]
    for B, V, dtype in call_shapes():
        seen += [(k, B, V, dtype) for k in ALL_KERNELS if supports(k, dtype) and (k, B, V, dtype) not in seen]
    return [
        pytest.param(
            *c, id=f"{'lab' if is_lab(*c[1:]) else 'sweep'}-{c[0]}-B{c[1]}-V{c[2]}-{c[3]}", marks=call_kernel_params(*c)
        )
        for c in seen
    ]


def call_cases():
    """(mode, kernel, B, V, dtype) for the per-call and graph modes."""
    return [
        pytest.param(
            mode,
            kernel,
            B,
            V,
            dtype,
            id=f"call-{mode}-{kernel}-B{B}-V{V}-{dtype}",
            marks=call_kernel_params(kernel, B, V, dtype),
        )
        for B, V, dtype in call_shapes()
        for kernel in ALL_KERNELS
        if supports(kernel, dtype)
        for mode in CALL_MODES
    ]


def make_logits(B: int, V: int, dtype: torch.dtype) -> torch.Tensor:
    """randn·3 with a few large outliers per row, so a wrong max-subtraction shows."""
    x = torch.randn(B, V, device="cuda") * 3
    cols = torch.randint(0, V, (B, 2), device="cuda")
    x.scatter_(1, cols, torch.tensor([30.0, -30.0], device="cuda").expand(B, 2).contiguous())
    return x.to(dtype)


def validate_output(name: str, x: torch.Tensor, out: torch.Tensor) -> None:
    """Every element written and finite; a sample of rows within tests.helpers.TOLERANCES of
    the float64 reference (for the baselines the suite does not gate, their placement of NaN and
    ±inf only: accuracy_gated)."""
    assert torch.isfinite(out).all(), f"{name}: output has NaN/inf (an element was not written?)"
    B = x.shape[0]
    rows = torch.unique(torch.tensor([0, B - 1, *np.random.randint(0, B, 14)])).to(x.device)
    kernel = SOFTMAX_KERNELS.get(name.split()[0])
    gated = kernel is not None and accuracy_gated(kernel)
    check_softmax(out[rows], x[rows], what=f"{name} on rows {rows.tolist()}", gated=gated)


# -- ceilings, measured in the same run ------------------------------------------------------------


@pytest.fixture(scope="session")
def copy_times_us():
    """Device-to-device copy of 2 GiB (bytes counted: read + write)."""
    src = torch.randn(2**29, device="cuda")
    dst = torch.empty_like(src)
    return src.numel() * 4 * 2, device_times_us(lambda: dst.copy_(src), flush_l2=False, rounds=30)


def test_ceiling_copy_bandwidth(benchmark, copy_times_us, record_manifest):
    nbytes, times = copy_times_us
    copy_TBps = nbytes / (np.median(times) * 1e-6) / 1e12
    record_manifest(
        "ceilings",
        hbm_copy_TBps=copy_TBps,
        how_measured="hbm_copy_TBps: median of 30 device-to-device copies of 2 GiB (torch "
        "copy_, bytes read + written, CUDA events); fp32_TFLOPS: median of 10 "
        "8192^3 fp32 matrix products (torch.mm, TF32 off, cuBLAS SGEMM, 2n^3 FLOPs)",
    )
    benchmark.extra_info.update(ceiling="copy", bytes=nbytes, TBps=copy_TBps)
    report_times_us(benchmark, times)
    assert 0.5 < copy_TBps < 10, f"implausible copy bandwidth {copy_TBps:.2f} TB/s"


def test_ceiling_fp32_matmul(benchmark, record_manifest, monkeypatch):
    # Restored after the test: later tests must see the process's own setting.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    n = 8192
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    times = device_times_us(lambda: torch.mm(a, b), flush_l2=False, rounds=10)
    tflops = 2 * n**3 / (np.median(times) * 1e-6) / 1e12
    record_manifest("ceilings", fp32_TFLOPS=tflops)
    benchmark.extra_info.update(ceiling="fp32", TFLOPS=tflops)
    report_times_us(benchmark, times)
    assert 5 < tflops < 120, f"implausible fp32 rate {tflops:.1f} TFLOP/s"


# -- the kernels -------------------------------------------------------------------------------------------


def prepared_case(name: str, B: int, V: int, dtype: torch.dtype):
    """The kernel, a validated input, and the raw facts of the case for extra_info."""
    fn = run_kernel(name)
    x = make_logits(B, V, dtype)
    out = torch.full_like(x, float("nan"))
    validate_output(name, x, fn(x, out=out))
    del out
    info = {
        "kernel": name,
        "B": B,
        "V": V,
        "dtype": str(dtype).removeprefix("torch."),
        "bytes": matrix_bytes(B, V, dtype, passes=MATRIX_PASSES.get(name, 2)),
    }
    # After the first call: that is when Triton has picked (or loaded) its config.
    if name == "triton":
        from kernels import softmax_triton

        info["autotune_picked"] = softmax_triton.autotune_picked(V, dtype=dtype)
        info["plan"] = softmax_triton.plan(B, V, dtype)
    elif name == "fused":
        from kernels import softmax_cuda

        info["plan"] = softmax_cuda.fused_plan(B, V, dtype)
    return fn, x, info


def time_case(name: str, B: int, V: int, dtype: torch.dtype) -> tuple[list[float], dict]:
    fn, x, info = prepared_case(name, B, V, dtype)
    # Timed as callers use them: each call allocates its output from torch's caching allocator
    # (free after warm-up). Passing `out` would add a copy to F.softmax, which has no out=.
    return device_times_us(lambda: fn(x)), info


@pytest.mark.parametrize("kernel, B, V, dtype", device_cases())
def test_softmax_speed(benchmark, kernel, B, V, dtype):
    times, info = time_case(kernel, B, V, DTYPES[dtype])
    benchmark.extra_info.update(mode="device", **info)
    report_times_us(benchmark, times)


@pytest.mark.parametrize("mode, kernel, B, V, dtype", call_cases())
def test_softmax_call_modes(benchmark, mode, kernel, B, V, dtype):
    """per_call: N back-to-back calls from Python, one synchronize; graph: one captured call
    replayed. Both allocate the output as callers do; the graph's output is checked too."""
    fn, x, info = prepared_case(kernel, B, V, DTYPES[dtype])
    if mode == "per_call":
        calls = calls_per_round(lambda: fn(x))
        times = per_call_times_us(lambda: fn(x), calls=calls)
        info["calls_per_round"] = calls
    else:
        graph, out = capture_graph(lambda: fn(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        validate_output(f"{kernel} (graph replay)", x, out)
        times = graph_replay_times_us(graph)
    benchmark.extra_info.update(mode=mode, **info)
    report_times_us(benchmark, times)


# -- launch floors: what a call costs before any softmax work ----------------------------------------------

FLOOR_SHAPE = (512, 600)
# An empty launch should take a few microseconds; a millisecond means something synchronises.
MAX_FLOOR_US = 1000.0
EMPTY_CUDA_SOURCE = 'extern "C" __global__ void empty_kernel() {}'


@triton.jit
def _empty_triton_kernel(X):
    pass


@functools.cache
def _empty_cupy_kernel():
    import cupy

    return cupy.RawKernel(EMPTY_CUDA_SOURCE, "empty_kernel")


_cupy_streams: dict = {}  # torch stream pointer -> cupy.cuda.ExternalStream


def _cupy_stream_of_torch():
    """CuPy's handle on torch's current stream, made once per stream as the project's CuPy
    kernels do; looking up the current stream is part of every call."""
    import cupy

    ptr = torch.cuda.current_stream().cuda_stream
    stream = _cupy_streams.get(ptr)
    if stream is None:
        with warnings.catch_warnings():  # deprecated in CuPy 14 in favour of from_external
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = _cupy_streams[ptr] = cupy.cuda.ExternalStream(ptr)
    return stream


def floor_call(name: str, x: torch.Tensor):
    """The call whose cost is the floor `name`, or a skip saying why it cannot run here."""
    if name == "empty_like":
        return lambda: torch.empty_like(x)
    if name == "triton_empty":
        return lambda: _empty_triton_kernel[(1,)](x)
    if name == "cupy_empty":
        reason = cupy_unusable_reason()
        if reason:
            pytest.skip(reason)
        kernel = _empty_cupy_kernel()
        return lambda: kernel((1,), (32,), (), stream=_cupy_stream_of_torch())
    if name == "launch_noop":
        try:
            launch = importlib.import_module("kernels.launch")
        except ImportError:
            launch = None
        if not hasattr(launch, "launch_noop"):
            pytest.skip(
                "kernels.launch.launch_noop(device_index) is not there: the project's own launch path "
                "has no empty kernel to time"
            )
        device = x.device.index
        return lambda: launch.launch_noop(device)
    raise KeyError(name)


def floor_cases():
    # torch.empty_like launches no kernel (the caching allocator hands out a block), so a graph
    # of it would be empty: it is a per-call floor only.
    return [
        pytest.param(name, mode, id=f"floor-{mode}-{name}")
        for name in ("empty_like", "triton_empty", "cupy_empty", "launch_noop")
        for mode in CALL_MODES
        if (name, mode) != ("empty_like", "graph")
    ]


@pytest.mark.parametrize("name, mode", floor_cases())
def test_launch_floor(benchmark, name, mode):
    x = make_logits(*FLOOR_SHAPE, torch.float32)
    call = floor_call(name, x)
    result = call()  # the launch works before it is timed
    torch.cuda.synchronize()
    if name == "empty_like":
        assert result.shape == x.shape and result.dtype == x.dtype and result.device == x.device
    if mode == "per_call":
        times = per_call_times_us(call)
    else:
        graph, _ = capture_graph(call)
        times = graph_replay_times_us(graph)
    benchmark.extra_info.update(floor=name, mode=mode, B=FLOOR_SHAPE[0], V=FLOOR_SHAPE[1], dtype="float32")
    report_times_us(benchmark, times)
    assert all(0 < t < MAX_FLOOR_US for t in times), f"{name} {mode}: implausible times {times} us"


# -- the lab's gates: ratios measured in the same test ---------------------------------------------------


@pytest.mark.parametrize(
    "kernel, reference, floor",
    [("fused", "F_softmax", 0.30), ("triton", "fused", 0.80)],
    ids=["lab-gate-fused-vs-F_softmax", "lab-gate-triton-vs-fused"],
)
def test_lab_gate(benchmark, kernel, reference, floor):
    """At (512, 600) fp32: speed(kernel) >= floor x speed(reference), timed back to back."""
    times, _ = time_case(kernel, 512, 600, torch.float32)
    reference_times, _ = time_case(reference, 512, 600, torch.float32)
    ratio = float(np.median(reference_times) / np.median(times))
    benchmark.extra_info.update(gate=f"{kernel} >= {floor} x {reference}", speed_ratio=ratio)
    report_times_us(benchmark, times)
    assert ratio >= floor, f"{kernel} runs at {ratio:.2f} x the speed of {reference} (floor {floor})"
