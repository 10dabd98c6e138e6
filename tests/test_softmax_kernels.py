"""Every kernel of the registry against the float64 NumPy reference and against each other.

The contract: within 1e-4 of the reference and of each other in fp32, on fresh random inputs
with outliers, into outputs poisoned with NaN. Kernel-specific dispatch boundaries are tested
beside each kernel (test_cuda_kernels.py, test_triton_*.py); this file holds what they share.
"""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import SOFTMAX_KERNELS, SUPPORTED_DTYPES
from kernels.reference import softmax_ref
from tests.inputs import make_logits

KERNELS = list(SOFTMAX_KERNELS)
LAB_SHAPES = [(64, 600), (512, 600), (4096, 600)]
IRREGULAR_SHAPES = [(1, 1), (3, 7), (1, 255), (64, 781), (7, 1025), (5, 2049), (3, 5000), (2, 50257), (2, 128256)]
ATOL, RTOL = 1e-6, 1e-4  # probabilities: 1e-4 relative, and absolute slack for the tiny ones


def run_poisoned(kernel, x):
    out = torch.full_like(x, float("nan"))
    result = SOFTMAX_KERNELS[kernel](x, out=out)
    assert result.data_ptr() == out.data_ptr(), f"{kernel} did not write into the out tensor it was given"
    return out


def assert_matches_reference(got: torch.Tensor, x: torch.Tensor, *, atol=ATOL, rtol=RTOL, what=""):
    ref = softmax_ref(x.double().cpu().numpy())
    np.testing.assert_allclose(got.double().cpu().numpy(), ref, atol=atol, rtol=rtol, err_msg=what)


# -- on the CPU: the reference and the registry itself ---------------------------------------------

@pytest.mark.cpu
class TestReference:
    def test_matches_the_definition(self):
        x = np.random.randn(5, 9) * 4
        expected = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(softmax_ref(x), expected, rtol=1e-13)
        assert softmax_ref(x).dtype == np.float64

    def test_edges_follow_torch(self):
        x = np.array([[0.0, -np.inf, 1.0], [-np.inf] * 3, [1e30, -1e30, 1e30], [5.0, 5.0, 5.0]])
        np.testing.assert_array_equal(np.isnan(softmax_ref(x)), np.isnan(F.softmax(torch.tensor(x), -1).numpy()))
        np.testing.assert_allclose(softmax_ref(x)[[0, 2, 3]], F.softmax(torch.tensor(x), -1).numpy()[[0, 2, 3]],
                                   rtol=1e-15)
        assert softmax_ref(x)[0, 1] == 0.0
        np.testing.assert_array_equal(softmax_ref(np.zeros((0, 4))).shape, (0, 4))

    def test_is_float64_accurate_where_float32_is_not(self):
        # A row of a million nearly equal logits: a float32 sum loses the last digits.
        x = np.full((1, 1_000_000), 0.25) + np.linspace(0, 1e-3, 1_000_000)
        np.testing.assert_allclose(softmax_ref(x).sum(), 1.0, rtol=1e-12)


@pytest.mark.cpu
def test_registry_is_complete_and_uniform():
    assert set(SOFTMAX_KERNELS) == {"naive", "smem", "fused", "triton", "F_softmax"}
    assert set(SUPPORTED_DTYPES) == set(SOFTMAX_KERNELS)
    for name, fn in SOFTMAX_KERNELS.items():
        assert callable(fn), name
        assert torch.float32 in SUPPORTED_DTYPES[name], name


@pytest.mark.cpu
@pytest.mark.parametrize("bad, error, message", [
    (lambda: torch.randn(8), ValueError, "2-D"),
    (lambda: torch.randn(2, 3, 4), ValueError, "2-D"),
    (lambda: torch.randn(2, 3, dtype=torch.float64), TypeError, "float64"),
    (lambda: torch.ones(2, 3, dtype=torch.int64), TypeError, "int64"),
    (lambda: torch.randn(2, 0), ValueError, "V = 0"),
    (lambda: [[1.0, 2.0]], TypeError, "torch.Tensor"),
], ids=["1d", "3d", "float64", "int64", "empty-row", "list"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_bad_input_is_rejected_before_any_kernel_runs(kernel, bad, error, message):
    # Shape and dtype are checked before the device, so these need no GPU.
    with pytest.raises(error, match=message):
        SOFTMAX_KERNELS[kernel](bad())


@pytest.mark.cpu
def test_baseline_entry_on_cpu_writes_into_out():
    x = make_logits(3, 781)
    out = run_poisoned("F_softmax", x)
    assert_matches_reference(out, x)


# -- on the GPU: every kernel, every shape -----------------------------------------------------------

def skip_if_unavailable(kernel):
    if kernel in ("naive", "smem", "fused"):
        from tests.harness import cupy_unusable_reason

        reason = cupy_unusable_reason()
        if reason:
            pytest.skip(reason)


@pytest.mark.cuda
@pytest.mark.parametrize("B, V", LAB_SHAPES + IRREGULAR_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_reference(kernel, B, V):
    skip_if_unavailable(kernel)
    x = make_logits(B, V, device="cuda")
    out = run_poisoned(kernel, x)
    assert_matches_reference(out, x, what=f"{kernel} at ({B}, {V})")


@pytest.mark.cuda
@pytest.mark.parametrize("B, V", LAB_SHAPES + [(3, 7), (64, 781), (5, 2049), (2, 50257)], ids=lambda v: str(v))
def test_kernels_agree_with_each_other(B, V):
    for kernel in KERNELS:
        skip_if_unavailable(kernel)
    x = make_logits(B, V, device="cuda")
    outputs = {kernel: run_poisoned(kernel, x) for kernel in KERNELS}
    for a, b in itertools.combinations(KERNELS, 2):
        torch.testing.assert_close(outputs[a], outputs[b], atol=ATOL, rtol=RTOL, msg=lambda m: f"{a} vs {b}: {m}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kernel", [k for k in KERNELS if len(SUPPORTED_DTYPES[k]) > 1])
def test_low_precision_error_is_no_worse_than_torch(kernel, dtype):
    """Judged against the reference's own error, not a fixed atol: the kernel's error vs float64
    may be at most twice that of F.softmax in the same dtype (which rounds its output once)."""
    x = make_logits(64, 4099, device="cuda", dtype=dtype)
    ref = torch.from_numpy(softmax_ref(x.double().cpu().numpy()))
    ours = (run_poisoned(kernel, x).double().cpu() - ref).abs().max().item()
    torch_error = (F.softmax(x, dim=-1).double().cpu() - ref).abs().max().item()
    assert ours <= 2 * torch_error + 1e-7, f"{kernel} {dtype}: error {ours:.3g} vs F.softmax {torch_error:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", KERNELS)
class TestEdges:
    def test_empty_batch(self, kernel):
        skip_if_unavailable(kernel)
        out = SOFTMAX_KERNELS[kernel](torch.empty(0, 600, device="cuda"))
        assert out.shape == (0, 600) and out.is_cuda

    def test_single_column_gives_ones(self, kernel):
        skip_if_unavailable(kernel)
        x = torch.randn(70, 1, device="cuda") * 100
        assert torch.equal(run_poisoned(kernel, x), torch.ones_like(x))

    def test_infinities_and_huge_magnitudes_like_torch(self, kernel):
        skip_if_unavailable(kernel)
        x = make_logits(6, 781, device="cuda", neg_inf=False)
        x[0, ::3] = float("-inf")            # -inf entries: probability 0
        x[1, :] = float("-inf")              # a row of -inf: NaN, as F.softmax gives
        x[2, :5] = 1e30                       # huge magnitudes must not overflow
        x[3, :5] = -1e30
        x[4, 7] = 1e30
        out = run_poisoned(kernel, x)
        expected = F.softmax(x, dim=-1)
        assert torch.isnan(out[1]).all() and torch.isnan(expected[1]).all()
        keep = [0, 2, 3, 4, 5]
        torch.testing.assert_close(out[keep], expected[keep], atol=ATOL, rtol=RTOL)
        assert (out[0, ::3] == 0).all()

    def test_wrong_device_and_bad_out_are_rejected(self, kernel):
        skip_if_unavailable(kernel)
        fn = SOFTMAX_KERNELS[kernel]
        if kernel != "F_softmax":
            with pytest.raises(ValueError, match="cuda"):
                fn(torch.randn(4, 10))
        x = torch.randn(4, 10, device="cuda")
        with pytest.raises(ValueError, match="out"):
            fn(x, out=torch.empty(4, 11, device="cuda"))
        with pytest.raises(ValueError, match="out"):
            fn(x, out=torch.empty(10, 4, device="cuda").t())

    def test_non_contiguous_input(self, kernel):
        skip_if_unavailable(kernel)
        wide = make_logits(32, 1601, device="cuda")
        x = wide[:, 1:782]                    # rows start misaligned and are strided
        assert not x.is_contiguous()
        assert_matches_reference(run_poisoned(kernel, x), x, what=f"{kernel} on a strided view")
