"""A gated benchmark case with made-up timings, so the regression gate runs end to end without
a GPU: fused against F_softmax at (512, 600) fp32 in device time, through the same
gate.measure_paired as tests/test_benchmarks.py. F_softmax takes 10 us a round; fused runs at
GATE_CASE_RATIO x its speed in the first measurement and GATE_CASE_RATIO_AGAIN x in a
re-measurement (default: the same), each round within +-1 %."""

import os

import pytest

from kernels.spec import matrix_bytes
from tests.suite import gate, gpus
from tests.suite.devicetime import report_times_us

SPREAD = (0.99, 0.995, 1.0, 1.005, 1.01)


def made_up(ratio: float):
    def measure(rounds):
        reference = [10.0 * SPREAD[(3 * i) % len(SPREAD)] for i in range(rounds)]
        kernel = [10.0 / ratio * SPREAD[i % len(SPREAD)] for i in range(rounds)]
        return kernel, reference

    return measure


@pytest.mark.cpu
def test_gated_case(benchmark, request):
    first = float(os.environ["GATE_CASE_RATIO"])
    again = float(os.environ.get("GATE_CASE_RATIO_AGAIN", first))
    measurements = iter([made_up(first), made_up(again)])
    info = {"kernel": "fused", "B": 512, "V": 600, "dtype": "float32", "bytes": matrix_bytes(512, 600, "float32")}
    times = gate.measure_paired(
        request.config,
        info,
        "device",
        lambda rounds: next(measurements)(rounds),
        rounds=40,
        gpu_model=(gpus.describe_gpu() or {}).get("model"),
    )
    benchmark.extra_info.update(mode="device", **info)
    report_times_us(benchmark, times)
    assert len(info["paired_ratios"]["device"]) == 40
