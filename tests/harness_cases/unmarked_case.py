import pytest


def test_without_platform_marker():
    assert 1 + 1 == 2


@pytest.mark.cpu
@pytest.mark.cuda
def test_with_both_markers():
    assert 2 + 2 == 4
