import pytest


@pytest.mark.cpu
def test_laptop_loop():
    assert sum(range(4)) == 6


@pytest.mark.cpu
@pytest.mark.slow
def test_deeper_tier():
    assert sorted([3, 1, 2]) == [1, 2, 3]


@pytest.mark.cuda
@pytest.mark.slow
def test_slow_cuda():
    assert max(1, 2) == 2
