"""The benchmark parametrization of tests/test_benchmarks.py, checked on the CPU: every call-mode
case has a device-time case beside it, nothing is timed twice, skips say why."""

import collections

import pytest

from kernels.spec import SPEC_BY_NAME, in_grid, matrix_bytes
from tests import test_benchmarks as bench

pytestmark = pytest.mark.cpu


def values(params):
    return [tuple(p.values) for p in params]


def skip_reason(param):
    reasons = [m.kwargs["reason"] for m in param.marks if m.name == "skip"]
    return reasons[0] if reasons else None


def test_case_ids_are_unique():
    ids = [p.id for p in bench.device_cases() + bench.call_cases() + bench.floor_cases()]
    assert [i for i, n in collections.Counter(ids).items() if n > 1] == []


def test_every_call_mode_case_has_a_device_time_case():
    device = set(values(bench.device_cases()))
    calls = values(bench.call_cases())
    assert {c[1:] for c in calls} <= device
    assert {mode for mode, *_ in calls} == {"per_call", "graph"}
    assert len(calls) == 2 * len({c[1:] for c in calls})


def test_the_call_grid_covers_every_kernel_shape_and_dtype():
    calls = {c[1:] for c in values(bench.call_cases())}
    for kernel in in_grid("calls"):
        for B in (1, 8, 64, 512):
            for V in (600, 32000, 50257, 128256):
                for dtype in ("float32", "bfloat16"):
                    if bench.supports(kernel, dtype):
                        assert (kernel, B, V, dtype) in calls
        for B, V in bench.LAB_GRID:
            assert (kernel, B, V, "float32") in calls
    assert set(in_grid("calls")) == {k for k, _, _, _ in calls}


def test_each_grid_times_the_kernels_its_specs_name():
    device = values(bench.device_cases())
    assert {k for k, B, V, dtype in device if bench.is_lab(B, V, dtype)} >= set(in_grid("lab"))
    assert {k for k, B, V, dtype in device} == set(in_grid("lab")) | set(in_grid("sweep")) | set(in_grid("calls"))
    for kernel in in_grid("sweep"):
        assert (kernel, 32768, 50257, "bfloat16") in device, kernel


def test_kernels_are_only_timed_in_the_dtypes_they_support():
    for kernel, _, _, dtype in values(bench.device_cases()):
        assert bench.supports(kernel, dtype), (kernel, dtype)
    fp32_only = [k for k in in_grid("calls") if not bench.supports(k, "bfloat16")]
    assert fp32_only, "some kernel of the call grid is float32 only"
    calls = {c[1:] for c in values(bench.call_cases())}
    assert not any((k, 8, 600, "bfloat16") in calls for k in fp32_only)


def test_row_serial_kernels_skip_long_rows_with_a_reason():
    for param in bench.device_cases() + bench.call_cases():
        kernel, B, V, dtype = param.values[-4:]
        reason = skip_reason(param)
        limit = SPEC_BY_NAME[kernel].bench_max_v
        if limit is not None and V > limit[0] and not bench.is_lab(B, V, dtype):
            assert reason and kernel in reason and f"V = {V}" in reason, param.id
        else:
            assert reason is None, param.id


def test_ids_name_mode_kernel_and_shape():
    ids = {p.id for p in bench.call_cases()}
    assert "call-per_call-fused-B8-V50257-float32" in ids and "call-graph-triton-B1-V128256-bfloat16" in ids
    device_ids = {p.id for p in bench.device_cases()}
    assert "lab-fused-B512-V600-float32" in device_ids and "sweep-fused-B8-V50257-float32" in device_ids
    assert {p.id for p in bench.floor_cases()} == {
        "floor-per_call-empty_like",
        "floor-device-triton_empty",
        "floor-device-cupy_empty",
        "floor-device-launch_noop",
        "floor-per_call-triton_empty",
        "floor-graph-triton_empty",
        "floor-per_call-cupy_empty",
        "floor-graph-cupy_empty",
        "floor-per_call-launch_noop",
        "floor-graph-launch_noop",
    }


def test_the_old_sweep_is_still_timed():
    device = set(values(bench.device_cases()))
    for dtype in bench.DTYPES:
        for V in bench.SWEEP_V:
            for B in bench.SWEEP_B:
                if matrix_bytes(B, V, dtype, passes=1) <= bench.MAX_TENSOR_BYTES:
                    assert all((k, B, V, dtype) in device for k in in_grid("sweep") if bench.supports(k, dtype))


def test_the_gated_kernels_cases_and_only_theirs_carry_the_gated_marker():
    from tests.suite import gate

    for param in bench.device_cases() + bench.call_cases():
        kernel = param.values[-4]
        gated = any(m.name == "gated" for m in param.marks)
        assert gated == (kernel in gate.GATED_KERNELS), param.id
    assert {p.values[-4] for p in bench.device_cases() if any(m.name == "gated" for m in p.marks)} == set(
        gate.GATED_KERNELS
    )
