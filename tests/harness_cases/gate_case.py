"""Benchmark cases that report made-up device times for F_softmax and fused at (512, 600) fp32,
so the regression gate runs end to end without a GPU. GATE_CASE_FUSED_US sets fused's time."""

import os

import pytest

from kernels.spec import matrix_bytes
from tests.suite.devicetime import report_times_us


@pytest.mark.cpu
@pytest.mark.parametrize("kernel", ["F_softmax", "fused"])
def test_reported(benchmark, kernel):
    us = 10.0 if kernel == "F_softmax" else float(os.environ["GATE_CASE_FUSED_US"])
    benchmark.extra_info.update(
        kernel=kernel, B=512, V=600, dtype="float32", mode="device", bytes=matrix_bytes(512, 600, "float32")
    )
    report_times_us(benchmark, [us * 0.98, us, us * 1.05])
    assert benchmark.stats.stats.median == pytest.approx(us * 1e-6)
