"""Benchmarks of the training operations, in the three clocks of tests/test_benchmarks.py
(tests/suite/devicetime.py): cross-entropy loss + gradient as a training step pays for it
(forward and backward through autograd, the gradient landing in logits.grad), and the softmax
backward, for every implementation of kernels.CROSS_ENTROPY_KERNELS / SOFTMAX_BACKWARD_KERNELS
(ours, PyTorch eager, torch.compile). Device-time cases also record the peak memory allocated
beyond the inputs during one call. Each case validates its output before timing it; ratios are
derived by tests/suite/manifest.py (LOSS_OPS) into the manifest's cross_entropy_timing,
weighted_cross_entropy_timing and softmax_backward_timing sections, with their goals and every
miss, and drawn in reports/loss_timing.png.

Two grids (`--loss-grid`):
- default: device time only, N = 4096, V in {32000, 50257, 128256, 262144} (the smallest listed
  vocabulary, GPT-2's odd one, Llama 3's and the largest), float32 and bfloat16, 20 rounds;
  the weighted, smoothed cross-entropy at V in WEIGHTED_VS: everything the goals are stated in
  (fraction of copy, x eager, x torch.compile, peak memory). A case's cost is linear in N·V (its
  bytes), and N = 4096 rows already fill every SM many times over, so N = 16384 measures the
  same bandwidth at four times the cost; the timed work is a few seconds, the rest is building
  kernels (CuPy's two modules, Triton's, Inductor's).
- full: the issue's whole grid, N in {4096, 16384} x V in {32000, 50257, 128256, 151936,
  262144}, float32 and bfloat16, device time with ROUNDS rounds, plus per call and graph replay
  at N = 4096 (~13 min on the H200).

    pytest -m cuda --benchmark-only tests/test_loss_benchmarks.py
    pytest -m cuda --benchmark-only tests/test_loss_benchmarks.py --loss-grid=full
    pytest -m cuda --benchmark-only -k "loss-device"       # device time and peak memory only
"""

import functools
import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import BACKWARD_BASELINE, CROSS_ENTROPY_BASELINE, CROSS_ENTROPY_KERNELS, SOFTMAX_BACKWARD_KERNELS
from kernels.baselines import static_compile
from kernels.checks import torch_dtype
from kernels.registry import resolve
from tests.helpers import assert_backward_close, assert_within, cross_entropy_expected
from tests.suite import gate
from tests.suite.devicetime import (
    MODES,
    ROUNDS,
    calls_per_round,
    capture_graph,
    device_times_us,
    fresh_contents,
    graph_replay_times_us,
    interleaved_device_times_us,
    per_call_times_us,
    report_times_us,
)
from tests.suite.manifest import LOSS_OPS, matrix_bytes

pytestmark = pytest.mark.cuda

DTYPES = ("float32", "bfloat16")  # the grid: no float16
CALL_N = 4096  # per-call and graph modes at the smaller N only: the larger takes ~4 x as long per call
# grid: (N values, V values, modes, device-time rounds)
GRIDS = {
    # 50257 (GPT-2's vocabulary) is odd: rows that are not 16-byte aligned take other launches.
    "default": ((4096,), (32000, 50257, 128256, 262144), ("device",), 20),
    "full": ((4096, 16384), (32000, 50257, 128256, 151936, 262144), MODES, ROUNDS),
}
OPS = {
    "test_cross_entropy_speed": "cross_entropy",
    "test_weighted_cross_entropy_speed": "weighted_cross_entropy",
    "test_softmax_backward_speed": "softmax_backward",
}
# The weighted, smoothed cross-entropy: a weight per class (drawn in [0.5, 1.5)) and label
# smoothing, which its kernels build for apart from the plain op, at one vocabulary of each row
# cut of the Triton split (16-byte aligned rows, and rows cut on 16-byte groups).
LABEL_SMOOTHING = 0.1
WEIGHTED_VS = (50257, 128256)


def cases(op: str, grid: str = "default"):
    impls = SOFTMAX_BACKWARD_KERNELS if op == "softmax_backward" else CROSS_ENTROPY_KERNELS
    sizes_n, sizes_v, modes, _ = GRIDS[grid]
    if op == "weighted_cross_entropy":
        sizes_v = [V for V in sizes_v if V in WEIGHTED_VS]
    return [
        pytest.param(
            mode,
            impl,
            N,
            V,
            dtype,
            id=f"loss-{mode}-{op}-{impl}-N{N}-V{V}-{dtype}",
            # the gate compares the device time of the gated kernels (tests/suite/gate.py)
            marks=(pytest.mark.gated(op=op),) if mode == "device" and impl in gate.GATED_TRAINING[op] else (),
        )
        for dtype in DTYPES
        for V in sizes_v
        for N in sizes_n
        for impl in impls
        for mode in modes
        if mode == "device" or N == CALL_N
    ]


def pytest_generate_tests(metafunc):
    op = OPS.get(metafunc.function.__name__)
    if op is not None:
        grid = metafunc.config.getoption("loss_grid")
        metafunc.parametrize("mode, impl, N, V, dtype", cases(op, grid))


@pytest.fixture
def rounds(request):
    """Device-time rounds of the selected grid."""
    return GRIDS[request.config.getoption("loss_grid")][3]


# -- cross-entropy: one training step's loss and gradient ------------------------------------------


@functools.cache
def _compiled_cross_entropy():
    return static_compile(F.cross_entropy)


def cross_entropy_step(impl: str, x: torch.Tensor, t: torch.Tensor, **options):
    """A call that computes the mean loss and leaves d loss / d x in x.grad, as a training step
    does: Triton's through its custom op (gradient made in the forward, kept by the backward),
    PyTorch's through F.cross_entropy and autograd, eager or compiled; any other implementation
    of the registry, which has no autograd op (fused), by its own call, whose gradient for the
    mean is already the step's. options: F.cross_entropy's weight and label_smoothing. A
    kernel that reads its targets' check back (a `validate` keyword: the host waits for the GPU
    once a call) is stepped without it, as the Triton op steps; the case validates its output."""
    if impl not in ("triton", CROSS_ENTROPY_BASELINE, "torch_compile"):
        kernel = CROSS_ENTROPY_KERNELS[impl]
        if "validate" in inspect.signature(resolve(kernel.spec.fn)).parameters:
            options = {**options, "validate": False}

        def direct_step():
            x.grad = None
            loss, _, x.grad = kernel(x.detach(), t, **options)
            return loss

        return direct_step
    if impl == "triton":
        from kernels import ops

        def loss_fn(x, t, **options):
            return ops.cross_entropy(x, t, **options)[0]
    elif impl == CROSS_ENTROPY_BASELINE:
        loss_fn = F.cross_entropy
    else:
        loss_fn = _compiled_cross_entropy()

    def step():
        x.grad = None
        loss = loss_fn(x, t, **options)
        loss.backward()
        return loss

    return step


def _sample_rows(N: int) -> torch.Tensor:
    """The rows a validation compares: the first, the last and six drawn at random."""
    return torch.unique(torch.tensor([0, N - 1, *np.random.randint(0, N, 6)]))


def _validate_cross_entropy(impl, x, t, loss, grad, weight=None, label_smoothing=0.0):
    """Every gradient element written and finite; for our kernels, a sample of rows within
    cross_entropy_expected's bounds of the float64 reference (their gradient as rows of the
    whole batch's mean: no target is ignored here, so its denominator is the sum of the batch's
    target weights, N without weights). PyTorch's baselines are measured, not gated: TOLERANCES
    bound our kernels, and PyTorch's errors are what the ratio rule measures them against (its
    bfloat16 cross-entropy rounds the log-probabilities to bfloat16, a few % on small p)."""
    assert torch.isfinite(grad).all(), f"{impl}: gradient has NaN/inf (an element was not written?)"
    assert torch.isfinite(loss).all()
    if CROSS_ENTROPY_KERNELS[impl].baseline:
        return
    counted = x.shape[0] if weight is None else weight.double()[t].sum().item()
    rows = _sample_rows(x.shape[0])
    exp = cross_entropy_expected(
        x[rows], t[rows], weight=weight, label_smoothing=label_smoothing, reduction="mean", counted=counted
    )
    assert_within(grad[rows], exp["grad"], exp["grad_tol"], f"{impl} gradient rows {rows.tolist()}")


def _peak_extra_bytes(call) -> int:
    """Bytes allocated beyond what was live before one call, at the call's peak."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - before)


def _time(benchmark, request, mode, call, info, validate, rounds, changing, reference=None):
    """Time `call` in `mode` into `benchmark`; a gated kernel's device time in interleaved
    rounds with `reference`, its op's eager baseline, for the regression gate."""
    if mode == "device":
        info["peak_extra_bytes"] = _peak_extra_bytes(call)
        # New contents in `changing` (an input the result depends on) every round.
        refresh = fresh_contents(changing)
        if info["impl"] in gate.GATED_TRAINING[info["op"]]:
            info["gpu"] = torch.cuda.get_device_name()
            times = gate.measure_paired(
                request.config,
                info,
                "device",
                lambda n: interleaved_device_times_us([call, reference], rounds=n, refresh=refresh),
                rounds=gate.device_rounds(request.config, rounds),
                gpu_model=info["gpu"],
            )
        else:
            times = device_times_us(call, rounds=rounds, refresh=refresh)
    elif mode == "per_call":
        info["calls_per_round"] = n = calls_per_round(call)
        times = per_call_times_us(call, calls=n)
    else:
        graph, out = capture_graph(call)
        graph.replay()
        torch.cuda.synchronize()
        validate()
        # As many replays a round as per-call rounds make calls: a round stays within ~0.5 s.
        times = graph_replay_times_us(graph, replays=calls_per_round(call))
    benchmark.extra_info.update(mode=mode, **info)
    report_times_us(benchmark, times)


def _cross_entropy_case(benchmark, request, op, mode, impl, N, V, dtype, rounds):
    g = torch.Generator(device="cuda").manual_seed(N + V)
    x = (torch.randn(N, V, device="cuda", generator=g) * 3).to(torch_dtype(dtype)).requires_grad_(True)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    options = {}
    if op == "weighted_cross_entropy":
        weight = torch.rand(V, device="cuda", generator=g) + 0.5
        options = {"weight": weight.to(torch_dtype(dtype)), "label_smoothing": LABEL_SMOOTHING}
    step = cross_entropy_step(impl, x, t, **options)
    loss = step()

    def validate():
        _validate_cross_entropy(impl, x.detach(), t, loss.detach(), x.grad, **options)

    validate()
    info = {"op": op, "impl": impl, "N": N, "V": V, "dtype": dtype}
    info["bytes"] = matrix_bytes(N, V, dtype, passes=LOSS_OPS[op][2])
    if not CROSS_ENTROPY_KERNELS[impl].baseline:
        info["plan"] = CROSS_ENTROPY_KERNELS[impl].plan(N, V, torch_dtype(dtype))
    eager = cross_entropy_step(CROSS_ENTROPY_BASELINE, x, t, **options)
    _time(benchmark, request, mode, step, info, validate, rounds, changing=x, reference=eager)


def test_cross_entropy_speed(benchmark, request, mode, impl, N, V, dtype, rounds):
    _cross_entropy_case(benchmark, request, "cross_entropy", mode, impl, N, V, dtype, rounds)


def test_weighted_cross_entropy_speed(benchmark, request, mode, impl, N, V, dtype, rounds):
    _cross_entropy_case(benchmark, request, "weighted_cross_entropy", mode, impl, N, V, dtype, rounds)


# -- the softmax backward ----------------------------------------------------------------------------------


def test_softmax_backward_speed(benchmark, request, mode, impl, N, V, dtype, rounds):
    g = torch.Generator(device="cuda").manual_seed(N + V)
    y = torch.softmax(torch.randn(N, V, device="cuda", generator=g) * 3, dim=-1).to(torch_dtype(dtype))
    dy = torch.randn(N, V, device="cuda", generator=g).to(torch_dtype(dtype))
    fn = SOFTMAX_BACKWARD_KERNELS[impl]

    def call():
        return fn(dy, y)

    def validate(dx=None):
        # Ours: a sample of rows within backward_error_bound; the baselines are measured, not
        # gated (as in _validate_cross_entropy).
        dx = call() if dx is None else dx
        assert torch.isfinite(dx).all(), f"{impl}: dx has NaN/inf"
        if not fn.baseline:
            rows = _sample_rows(N)
            assert_backward_close(dx[rows], dy[rows], y[rows], what=f"{impl} rows {rows.tolist()}")

    validate()
    info = {"op": "softmax_backward", "impl": impl, "N": N, "V": V, "dtype": dtype}
    info["bytes"] = matrix_bytes(N, V, dtype, passes=LOSS_OPS["softmax_backward"][2])
    if not fn.baseline:
        info["plan"] = fn.plan(N, V, torch_dtype(dtype))
    eager = SOFTMAX_BACKWARD_KERNELS[BACKWARD_BASELINE]
    _time(benchmark, request, mode, call, info, validate, rounds, changing=dy, reference=lambda: eager(dy, y))
