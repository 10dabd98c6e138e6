"""Gated benchmark items shaped like tests/test_benchmarks.py's (a device-time item per case,
per-call and graph-replay items per call shape) and tests/test_loss_benchmarks.py's (a gated
device-time item per training case, its per-call item not gated), so tests/test_suite_gate.py
can check on the CPU which of them `--gate-quick` keeps for a baseline. Each item prints what it
would time: the device-time rounds and, for a device-time item, whether it also times the graph
replay."""

import pytest

from tests.suite import gate

SHAPES = [("fused", 512, 600, "float32"), ("triton", 1, 600, "float32"), ("fused", 4096, 50257, "bfloat16")]
KERNELS_SHAPES = [*SHAPES, ("naive", 512, 600, "float32")]


@pytest.mark.cpu
@pytest.mark.gated
@pytest.mark.parametrize("kernel, B, V, dtype", KERNELS_SHAPES)
def test_softmax_speed(request, kernel, B, V, dtype):
    quick = gate.quick_of(request.config)
    graph = quick.times_graph((kernel, B, V, dtype), False) if quick else False
    print(f"\nTIMED device {kernel} {B} {V} {dtype} rounds={gate.device_rounds(request.config, 100)} graph={graph}")


@pytest.mark.cpu
@pytest.mark.gated
@pytest.mark.parametrize("mode", ["per_call", "graph"])
@pytest.mark.parametrize("kernel, B, V, dtype", SHAPES)
def test_softmax_call_modes(mode, kernel, B, V, dtype):
    print(f"\nTIMED {mode} {kernel} {B} {V} {dtype}")


@pytest.mark.cpu
@pytest.mark.parametrize(
    "mode, impl, N, V, dtype",
    [
        pytest.param("device", "triton", 4096, 128256, "float32", marks=pytest.mark.gated(op="cross_entropy")),
        pytest.param("device", "triton", 4096, 32000, "bfloat16", marks=pytest.mark.gated(op="cross_entropy")),
        pytest.param("per_call", "triton", 4096, 128256, "float32"),
    ],
)
def test_cross_entropy_speed(request, mode, impl, N, V, dtype):
    rounds = gate.device_rounds(request.config, 20)
    print(f"\nTIMED {mode} {gate.training_kernel('cross_entropy', impl)} {N} {V} {dtype} rounds={rounds}")


@pytest.mark.cpu
def test_not_gated():
    print("\nTIMED not gated")
