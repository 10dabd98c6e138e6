import pytest


@pytest.mark.cpu
def test_timed(benchmark):
    assert benchmark(sum, range(10)) == 45
