import pytest
import torch

from tests.helpers import INTERPRETED, TRITON_MISSING
from tests.suite import interpreter

if TRITON_MISSING or not INTERPRETED:
    pytest.skip(TRITON_MISSING or "needs Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.triton_kernels import _nan_max, _row_max  # noqa: E402

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


@triton.jit
def _max_2d(X, Y, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr, N: tl.constexpr):
    x = tl.load(X + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :])
    tl.store(Y + tl.arange(0, N), _row_max(x, AXIS))


@triton.jit
def _max_1d(X, Y, C: tl.constexpr):
    tl.store(Y, _row_max(tl.load(X + tl.arange(0, C)), 0))


def test_the_nan_max_reduction_in_numpy_is_the_element_loops(monkeypatch):
    from triton.runtime import interpreter as triton_interpreter

    assert interpreter.call_device_functions_directly()
    reduce = triton_interpreter.ReduceOps
    assert reduce.apply_impl.vectorised and interpreter._is_nan_max(_nan_max)  # the kernels' max takes it
    max_2d, max_1d = _max_2d, _max_1d
    g = torch.Generator().manual_seed(7)
    data = torch.randn(8, 16, generator=g)
    flat = data.view(-1)
    # NaNs of several payloads and signs, signed zeros side by side, infinities.
    nans = torch.tensor([0x7FC00000, 0x7FC00001, -0x3E3EDCBB, 0x7FA00000], dtype=torch.int32).view(torch.float32)
    picks = torch.randperm(flat.numel(), generator=g)
    flat[picks[:4]] = nans
    flat[picks[4:6]] = torch.tensor([0.0, -0.0])
    flat[picks[6:8]] = torch.tensor([float("inf"), -float("inf")])
    zeros = torch.zeros(8, 16)
    zeros.view(-1)[::2] = -0.0
    launches = []
    for x in (data, zeros, data[:, :8].contiguous().fill_(-float("inf"))):
        R, C = x.shape
        launches += [(max_2d, x, R, dict(R=R, C=C, AXIS=1, N=R)), (max_2d, x, C, dict(R=R, C=C, AXIS=0, N=C))]
        launches += [(max_1d, x[3].contiguous(), 1, dict(C=C))]

    def run_all():
        outs = []
        for kernel, x, n, meta in launches:
            y = torch.full((n,), float("nan"))
            kernel[(1,)](x, y, **meta)
            outs.append(y.view(torch.int32))
        return outs

    fast = run_all()
    monkeypatch.setattr(reduce, "apply_impl", reduce.apply_impl.original)
    for got, loop in zip(fast, run_all(), strict=True):
        assert torch.equal(got, loop)


@triton.jit
def _nan_skipping_max(a, b):
    return tl.maximum(a, b)  # NaN-skipping: not the kernels' max, whatever its use


@triton.jit
def _skip_max_1d(X, Y, C: tl.constexpr):
    tl.store(Y, tl.reduce(tl.load(X + tl.arange(0, C)), 0, _nan_skipping_max))


def test_another_combine_function_takes_the_interpreters_own_loop():
    # An edited max (a planted bug that skips NaN, say) must give what it computes, not what
    # the kernels' max would: the shortcut goes by the combine function's source.
    assert interpreter.call_device_functions_directly() and not interpreter._is_nan_max(_nan_skipping_max)
    x = torch.tensor([1.0, float("nan"), 3.0, 2.0])
    y = torch.full((1,), float("nan"))
    _skip_max_1d[(1,)](x, y, C=4)
    assert y.item() == 3.0
