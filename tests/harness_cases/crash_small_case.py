import os

import pytest


@pytest.mark.cpu
@pytest.mark.parametrize("i", range(4))
def test_small(i):
    if i == 1:
        os._exit(1)
