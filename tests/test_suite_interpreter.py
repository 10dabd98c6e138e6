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


def test_numpy_storage_types_are_remembered_and_the_same():
    from triton.runtime import interpreter as triton_interpreter

    assert interpreter.call_device_functions_directly()
    remembered = triton_interpreter._get_np_dtype
    assert remembered.remembered
    scalars = [getattr(tl, n) for n in ("int1", "int8", "int32", "int64", "uint16", "float16", "bfloat16", "float32")]
    kinds = [*scalars, tl.pointer_type(tl.float32), tl.block_type(tl.bfloat16, [4, 8])]
    kinds.append(tl.block_type(tl.pointer_type(tl.float16), [16]))
    for kind in kinds * 2:  # the second round answers from the memo
        assert remembered(kind) == remembered.original(kind), kind
