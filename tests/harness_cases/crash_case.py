import os

import pytest


@pytest.mark.cpu
@pytest.mark.parametrize("i", range(40))
def test_grid(i):
    if i == 3:
        os._exit(1)  # the worker dies, as it does when a kernel aborts the interpreter


@pytest.mark.cpu
def test_after_the_grid():
    assert True
