import pytest
import torch

from tests.helpers import INTERPRETED, TRITON_MISSING
from tests.suite import interpreter

if TRITON_MISSING or not INTERPRETED:
    pytest.skip(TRITON_MISSING or "needs Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.cpu


@triton.jit
def _twice(v):
    return v * 2


@triton.jit
def _nested_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    v = _twice(tl.load(X + i))
    tl.store(Y + i, v + tl.sum(v, axis=0))  # tl.sum: a device function of another module


def test_nested_device_functions_run_directly_and_compute_the_same():
    # Applied by the suite's hooks before this test: otherwise the interpreted cases cost a
    # third more and nothing else says so.
    assert interpreter.call_device_functions_directly()
    x = torch.arange(8, dtype=torch.float32)
    for _ in range(2):  # the first call of each module's functions scans, the second does not
        y = torch.full_like(x, float("nan"))
        _nested_kernel[(1,)](x, y, N=8)
        assert torch.equal(y, x * 2 + 56)
