"""Benchmarks of every softmax in the registry in three clocks (tests/suite/devicetime.py), the
ceilings they are judged against, the launch floors, and the lab's speed gates. Each case
validates its kernel's output before timing it and records raw values only; the manifest
derives every ratio from the whole run when it ends.

    pytest -m cuda --benchmark-only                      # everything, then reports/ is rewritten
    pytest -m cuda --benchmark-only -k lab               # the lab's grid only
    pytest -m cuda --benchmark-only -k "call- or floor-" # per-call and graph modes, launch floors
    pytest -m cuda --benchmark-only --regression-gate    # and fail on a regression (README: GPU CI job)
    pytest -m "cuda and gated" --benchmark-only --regression-gate   # every case of the gated kernels
    pytest tests/test_benchmarks.py --benchmark-only --gate-quick --regression-gate  # only what the gate compares

The cases of the gated kernels (tests/suite/gate.py: fused, Triton) carry the marker `gated` and
time their kernel and F.softmax in interleaved rounds, keeping the per-round ratios for the gate;
the kernel's own times reach pytest-benchmark as in every other case. --gate-quick keeps only
the (case, mode) pairs the baseline of this GPU model gates (tests/suite/gate.py): the device-time
case of each gated shape, timing its graph replay too where that gates it, and the per-call
cases per-call time gates; device time then takes gate.QUICK_DEVICE_ROUNDS rounds.
"""

import functools
import warnings

import numpy as np
import pytest
import torch

from kernels import SOFTMAX_KERNELS
from kernels.checks import torch_dtype
from kernels.spec import LAB_POINT, LAB_SHAPES, in_grid, matrix_bytes
from tests.helpers import check_softmax, device_logits
from tests.suite import gate
from tests.suite.devicetime import (
    CALL_MODES,
    CALL_ROUNDS,
    MODES,
    ROUNDS,
    calls_per_round,
    capture_graph,
    device_times_us,
    fresh_contents,
    graph_replay_times_us,
    interleaved_device_times_us,
    interleaved_graph_replay_times_us,
    interleaved_per_call_times_us,
    per_call_times_us,
    physically_possible,
    report_times_us,
)
from tests.suite.gpus import cupy_unusable_reason
from tests.suite.manifest import copy_goal

pytestmark = pytest.mark.cuda

# Which kernels each grid times, how many passes over the matrix each makes by design (the
# roofline places each kernel at its own intensity) and the longest rows a kernel is timed at,
# are facts of the kernels' specs (kernels/spec.py).
DTYPES = ("float32", "bfloat16")
LAB_GRID = list(LAB_SHAPES)
SWEEP_B = (64, 512, 4096, 32768)
SWEEP_V = (600, 4096, 32000, 50257, 128256)
# Today's vocabularies past 131072 (Qwen 151936, GPT-4o-style 200064, Gemma 262144) and one row of
# a million (odd), from a decode step to a prefill batch. Coarser than the sweep in B: a kernel's
# time is linear in B once B fills the GPU (B >= 1024 here), so 4096 stands for the large
# batches, and 1 and 64 for decode.
WIDE_B = (1, 64, 4096)
WIDE_V = (151936, 200064, 262144, 1000003)
MAX_TENSOR_BYTES = 16e9  # (32768, 128256) in fp32 is 16.8 GB per tensor: skipped

# Shapes at which every kernel is also timed per call and as a graph replay: from one row (a
# decode step) to a batch, at the lab's V and at real vocabularies (Llama 2, GPT-2, Llama 3).
CALL_B = (1, 8, 64, 512)
CALL_V = (600, 32000, 50257, 128256)


def supports(kernel: str, dtype: str) -> bool:
    return torch_dtype(dtype) in SOFTMAX_KERNELS[kernel].dtypes


def is_lab(B: int, V: int, dtype: str) -> bool:
    return (B, V) in LAB_GRID and dtype == "float32"


def call_shapes() -> list[tuple]:
    """(B, V, dtype) of the call-mode grid, then the lab's shapes it does not already have."""
    shapes = [(B, V, dtype) for dtype in DTYPES for V in CALL_V for B in CALL_B]
    return shapes + [(B, V, "float32") for B, V in LAB_GRID if (B, V, "float32") not in shapes]


def gated_marks(kernel: str) -> tuple:
    """`gated` on the cases of the kernels the regression gate compares."""
    return (pytest.mark.gated,) if kernel in gate.GATED_KERNELS else ()


def call_kernel_params(kernel: str, B: int, V: int, dtype: str, marks=()) -> list:
    """The pytest marks of one case: `gated` for the gated kernels, and a skip, with its reason,
    past the longest rows the kernel's spec has it timed at (bench_max_v; the lab grid is always
    timed)."""
    marks = (*marks, *gated_marks(kernel))
    limit = SOFTMAX_KERNELS[kernel].spec.bench_max_v
    if limit is not None and not is_lab(B, V, dtype) and V > limit[0]:
        reason = f"{kernel} is timed at the lab's grid and V <= {limit[0]} only, at V = {V}: {limit[1]}"
        return [*marks, pytest.mark.skip(reason=reason)]
    return list(marks)


def device_cases():
    """(kernel, B, V, dtype): the lab grid, the large-vocabulary sweep (SWEEP and WIDE), and the
    call-mode shapes, so every call-mode entry has a device time beside it."""
    seen = []
    for B, V in LAB_GRID:
        for kernel in in_grid("lab"):
            seen.append((kernel, B, V, "float32"))
    grids = ((SWEEP_V, SWEEP_B), (WIDE_V, WIDE_B))
    for dtype in DTYPES:
        for V, B in ((V, B) for vs, bs in grids for V in vs for B in bs):
            if matrix_bytes(B, V, dtype, passes=1) > MAX_TENSOR_BYTES:
                continue
            seen += [(k, B, V, dtype) for k in in_grid("sweep") if supports(k, dtype) and (k, B, V, dtype) not in seen]
    for B, V, dtype in call_shapes():
        seen += [(k, B, V, dtype) for k in in_grid("calls") if supports(k, dtype) and (k, B, V, dtype) not in seen]
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
        for kernel in in_grid("calls")
        if supports(kernel, dtype)
        for mode in CALL_MODES
    ]


def validate_output(name: str, x: torch.Tensor, out: torch.Tensor, how: str = "") -> None:
    """Every element written and finite; a sample of rows held to the float64 reference as
    tests.helpers holds the registry kernel (TOLERANCES for the kernels the accuracy rule gates,
    the placement of NaN and ±inf only for the others: accuracy_gated)."""
    what = f"{name}{how}"
    assert torch.isfinite(out).all(), f"{what}: output has NaN/inf (an element was not written?)"
    B = x.shape[0]
    rows = torch.unique(torch.tensor([0, B - 1, *np.random.randint(0, B, 14)])).to(x.device)
    check_softmax(out[rows], x[rows], what=f"{what} on rows {rows.tolist()}", kernel=SOFTMAX_KERNELS[name])


# -- ceilings, measured in the same run ------------------------------------------------------------


@pytest.fixture(scope="session")
def copy_times_us():
    """Device-to-device copy of 2 GiB (bytes counted: read + write)."""
    src = torch.randn(2**29, device="cuda")
    dst = torch.empty_like(src)
    return matrix_bytes(1, src.numel(), src.dtype), device_times_us(lambda: dst.copy_(src), flush_l2=False, rounds=30)


@pytest.fixture(scope="session")
def copy_same_bytes_us():
    """copy(B, V, dtype): median device time of a copy of a (B, V) matrix of dtype (one read and
    one write, L2 flushed), once per shape. A copy of a few hundred MB reaches less of the ceiling
    than the 2 GiB one (its ramp and tail weigh more): the targets say how much, beside a miss."""
    medians = {}

    def copy(B: int, V: int, dtype: str) -> float:
        if (B, V, dtype) not in medians:
            src = torch.ones(B, V, dtype=torch_dtype(dtype), device="cuda")
            dst = torch.empty_like(src)
            medians[B, V, dtype] = float(np.median(device_times_us(lambda: dst.copy_(src), rounds=30)))
            del src, dst
        return medians[B, V, dtype]

    return copy


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
    benchmark.extra_info.update(ceiling="copy", bytes=nbytes, TBps=copy_TBps, gpu=torch.cuda.get_device_name())
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
    benchmark.extra_info.update(ceiling="fp32", TFLOPS=tflops, gpu=torch.cuda.get_device_name())
    report_times_us(benchmark, times)
    assert 5 < tflops < 120, f"implausible fp32 rate {tflops:.1f} TFLOP/s"


# -- the kernels -------------------------------------------------------------------------------------------


def prepared_case(name: str, B: int, V: int, dtype: torch.dtype):
    """The kernel, a validated input, and the raw facts of the case for extra_info."""
    fn = SOFTMAX_KERNELS[name]
    x = device_logits(B, V, dtype, "cuda", seed=B * 100003 + V, neg_inf=False)
    out = torch.full_like(x, float("nan"))
    validate_output(name, x, fn(x, out=out))
    del out
    info = {
        "kernel": name,
        "B": B,
        "V": V,
        "dtype": str(dtype).removeprefix("torch."),
        "bytes": matrix_bytes(B, V, dtype, passes=fn.spec.passes),
    }
    info["plan"] = fn.plan(B, V, dtype)  # the dispatch path the case takes
    # After the first call: that is when Triton has picked (or loaded) its config.
    if name == "triton":
        from kernels import triton_store

        info["autotune_picked"] = triton_store.autotune_picked(V, dtype=dtype)
        tuned = triton_store.tuned_at_first_use(V, dtype=dtype)
        if info["plan"] == "tile" and tuned:
            info["tuned_at_first_use"] = tuned  # the gate says so of a slower case
    elif name == "fused":
        from kernels import cuda_plans

        info["size_class"] = cuda_plans.fused_class_description(B, V, dtype)
    info["gpu"] = torch.cuda.get_device_name()
    return fn, x, info


def time_case(name: str, B: int, V: int, dtype: torch.dtype) -> tuple[list[float], dict]:
    fn, x, info = prepared_case(name, B, V, dtype)
    # Timed as callers use them: each call allocates its output from torch's caching allocator
    # (free after warm-up). Passing `out` would add a copy to F.softmax, which has no out=.
    return device_times_us(lambda: fn(x), refresh=fresh_contents(x)), info


def graph_pair(name: str, fn, x: torch.Tensor):
    """The kernel's call and F.softmax's, each captured in a CUDA graph (the kernel's replay
    checked first), and measure(rounds) timing their replays in interleaved rounds."""
    graph, out = capture_graph(lambda: fn(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    validate_output(name, x, out, " (graph replay)")
    reference = SOFTMAX_KERNELS[gate.REFERENCE]
    reference_graph, _ = capture_graph(lambda: reference(x))
    return lambda rounds: interleaved_graph_replay_times_us([graph, reference_graph], rounds=rounds)


CALL_SHAPES = frozenset(call_shapes())


@pytest.mark.parametrize("kernel, B, V, dtype", device_cases())
def test_softmax_speed(benchmark, request, copy_times_us, copy_same_bytes_us, kernel, B, V, dtype):
    fn, x, info = prepared_case(kernel, B, V, torch_dtype(dtype))
    refresh = fresh_contents(x)  # new values in x every round: no remembered answer is timed
    if kernel in gate.GATED_KERNELS:
        reference = SOFTMAX_KERNELS[gate.REFERENCE]
        times = gate.measure_paired(
            request.config,
            info,
            "device",
            lambda rounds: interleaved_device_times_us(
                [lambda: fn(x), lambda: reference(x)], rounds=rounds, refresh=refresh
            ),
            rounds=gate.device_rounds(request.config, ROUNDS),
            gpu_model=info["gpu"],
        )
        # Where a launch is too short for the device clock, the gate reads graph replay: timed
        # here for the shapes no call-mode case times, and under --gate-quick (which runs no
        # graph-replay case) for the shapes whose baseline it gates.
        short = info["paired_F_softmax_us"]["device"] < gate.GRAPH_MEASURED_BELOW_US
        graph = short and (B, V, dtype) not in CALL_SHAPES
        quick = gate.quick_of(request.config)  # runs no call-mode case: every short shape here
        if quick.times_graph(gate.case_key(info), short) if quick else graph:
            measure = graph_pair(kernel, fn, x)
            gate.measure_paired(request.config, info, "graph", measure, rounds=CALL_ROUNDS, gpu_model=info["gpu"])
    else:
        times = device_times_us(lambda: fn(x), refresh=refresh)
    copy_bytes, copy_times = copy_times_us
    copy_TBps = copy_bytes / (np.median(copy_times) * 1e-6) / 1e12
    # The input at the least comes from memory after each flush: reading it faster than a copy
    # streams is a kernel that did not do the work.
    read_bytes = matrix_bytes(B, V, dtype, passes=1)
    info.update(physically_possible(read_bytes, times, copy_TBps, what=f"{kernel} at ({B}, {V}) {dtype}"))
    if copy_goal(kernel, B, V, dtype) is not None:
        info["copy_same_bytes_us"] = copy_same_bytes_us(B, V, dtype)
    benchmark.extra_info.update(mode="device", **info)
    report_times_us(benchmark, times)


@pytest.mark.parametrize("mode, kernel, B, V, dtype", call_cases())
def test_softmax_call_modes(benchmark, request, mode, kernel, B, V, dtype):
    """per_call: N back-to-back calls from Python, one synchronize; graph: one captured call
    replayed. Both allocate the output as callers do; the graph's output is checked too. The
    gated kernels are timed in interleaved rounds with F.softmax, the same way."""
    fn, x, info = prepared_case(kernel, B, V, torch_dtype(dtype))
    gated = kernel in gate.GATED_KERNELS
    if mode == "per_call":
        calls = calls_per_round(lambda: fn(x))
        info["calls_per_round"] = calls
        if gated:
            reference = SOFTMAX_KERNELS[gate.REFERENCE]

            def measure(rounds):
                return interleaved_per_call_times_us([lambda: fn(x), lambda: reference(x)], calls=calls, rounds=rounds)

            times = gate.measure_paired(request.config, info, mode, measure, rounds=CALL_ROUNDS, gpu_model=info["gpu"])
        else:
            times = per_call_times_us(lambda: fn(x), calls=calls)
    elif gated:
        measure = graph_pair(kernel, fn, x)
        times = gate.measure_paired(request.config, info, mode, measure, rounds=CALL_ROUNDS, gpu_model=info["gpu"])
    else:
        graph, out = capture_graph(lambda: fn(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        validate_output(kernel, x, out, " (graph replay)")
        times = graph_replay_times_us(graph)
    benchmark.extra_info.update(mode=mode, **info)
    report_times_us(benchmark, times)


# -- launch floors: what a call costs before any softmax work ----------------------------------------------

# An empty launch should take a few microseconds; a millisecond means something synchronises.
MAX_FLOOR_US = 1000.0
EMPTY_CUDA_SOURCE = 'extern "C" __global__ void empty_kernel() {}'


@functools.cache
def _empty_triton_kernel():
    import triton  # here: this file is collected (and its cases listed) where Triton is missing

    @triton.jit
    def empty_kernel(X):
        pass

    return empty_kernel


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
        kernel = _empty_triton_kernel()
        return lambda: kernel[(1,)](x)
    if name == "cupy_empty":
        reason = cupy_unusable_reason()
        if reason:
            pytest.skip(reason)
        kernel = _empty_cupy_kernel()
        return lambda: kernel((1,), (32,), (), stream=_cupy_stream_of_torch())
    if name == "launch_noop":
        reason = cupy_unusable_reason()  # the project's launch path compiles its kernels through CuPy
        if reason:
            pytest.skip(reason)
        from kernels.launch import launch_noop

        device = x.device.index
        return lambda: launch_noop(device)
    raise KeyError(name)


def floor_cases():
    # torch.empty_like launches no kernel (the caching allocator hands out a block), so a graph
    # of it would be empty and its device time nothing: it is a per-call floor only. A launch
    # of an empty kernel is also timed in device time, as the softmax cases are: what a
    # decode-sized case cannot go below.
    return [
        pytest.param(name, mode, id=f"floor-{mode}-{name}")
        for name in ("empty_like", "triton_empty", "cupy_empty", "launch_noop")
        for mode in MODES
        if name != "empty_like" or mode == "per_call"
    ]


@pytest.mark.parametrize("name, mode", floor_cases())
def test_launch_floor(benchmark, name, mode):
    B, V, dtype = LAB_POINT  # the floors are timed on the lab point's input
    x = device_logits(B, V, torch_dtype(dtype), "cuda", seed=B * 100003 + V, neg_inf=False)
    call = floor_call(name, x)
    result = call()  # the launch works before it is timed
    torch.cuda.synchronize()
    if name == "empty_like":
        assert result.shape == x.shape and result.dtype == x.dtype and result.device == x.device
    if mode == "per_call":
        times = per_call_times_us(call)
    elif mode == "device":
        times = device_times_us(call)
    else:
        graph, _ = capture_graph(call)
        times = graph_replay_times_us(graph)
    benchmark.extra_info.update(floor=name, mode=mode, B=B, V=V, dtype=dtype, gpu=torch.cuda.get_device_name())
    report_times_us(benchmark, times)
    assert all(0 < t < MAX_FLOOR_US for t in times), f"{name} {mode}: implausible times {times} us"


# -- the lab's gates: ratios measured in the same test ---------------------------------------------------


def lab_gate_cases():
    """(kernel, reference, floor) for every kernel whose spec sets a lab gate."""
    return [
        pytest.param(k.name, *k.spec.lab_gate, id=f"lab-gate-{k.name}-vs-{k.spec.lab_gate[0]}")
        for k in SOFTMAX_KERNELS.values()
        if k.spec.lab_gate
    ]


@pytest.mark.parametrize("kernel, reference, floor", lab_gate_cases())
def test_lab_gate(benchmark, kernel, reference, floor):
    """At the lab point: speed(kernel) >= floor x speed(reference), timed back to back."""
    B, V, dtype = LAB_POINT
    times, _ = time_case(kernel, B, V, torch_dtype(dtype))
    reference_times, _ = time_case(reference, B, V, torch_dtype(dtype))
    ratio = float(np.median(reference_times) / np.median(times))
    benchmark.extra_info.update(gate=f"{kernel} >= {floor} x {reference}", speed_ratio=ratio)
    report_times_us(benchmark, times)
    assert ratio >= floor, f"{kernel} runs at {ratio:.2f} x the speed of {reference} (floor {floor})"
