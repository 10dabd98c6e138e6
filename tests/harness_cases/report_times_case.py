import statistics

import pytest

from tests.suite import devicetime


@pytest.mark.cpu
def test_reported_times_are_pytest_benchmarks_rounds(benchmark):
    times = [5.0, 4.0, 9.0, 4.5, 6.0]
    devicetime.report_times_us(benchmark, times)
    assert benchmark.stats.stats.rounds == len(times)
    assert benchmark.stats.stats.median == pytest.approx(statistics.median(times) * 1e-6)
    assert benchmark.stats.stats.min == pytest.approx(4e-6) and benchmark.stats.stats.max == pytest.approx(9e-6)
