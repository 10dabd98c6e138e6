"""Device-time benchmarks of every softmax in the registry, the ceilings they are judged against,
and the lab's speed gates. Each case validates its kernel's output before timing it.

    pytest -m cuda --benchmark-only            # everything, then reports/ is rewritten
    pytest -m cuda --benchmark-only -k lab     # the lab's grid only
"""

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import SOFTMAX_KERNELS, SUPPORTED_DTYPES
from kernels.reference import softmax_ref
from tests.devicetime import device_times_us, report_device_times

pytestmark = pytest.mark.cuda

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LAB_GRID = [(64, 600), (512, 600), (4096, 600)]
SWEEP_B = (64, 512, 4096, 32768)
SWEEP_V = (600, 4096, 32000, 50257, 128256)
SWEEP_KERNELS = ("F_softmax", "fused", "triton", "torch_compile")
MAX_TENSOR_BYTES = 16e9  # (32768, 128256) in fp32 is 16.8 GB per tensor: skipped

# How many times each kernel moves the matrix through device memory by design, at rows that fit
# on chip (V = 600): naive reads it three times (max, sum, normalise) and writes it once; smem
# does the same with a block per row; the fused kernels, Triton and PyTorch's warp softmax
# read once and write once. The roofline places each kernel at its own intensity from these.
MATRIX_PASSES = {"naive": 4, "smem": 4, "fused": 2, "triton": 2, "F_softmax": 2, "torch_compile": 2}


@functools.cache
def compiled_softmax():
    return torch.compile(lambda x: F.softmax(x, dim=-1))


def run_kernel(name: str):
    if name == "torch_compile":
        compiled = compiled_softmax()
        return lambda x, out=None: compiled(x) if out is None else out.copy_(compiled(x))
    return SOFTMAX_KERNELS[name]


def cases():
    """(kernel, B, V, dtype) for the lab grid (every kernel) and the large-vocabulary sweep."""
    seen = []
    for B, V in LAB_GRID:
        for kernel in ("F_softmax", "naive", "smem", "fused", "triton"):
            seen.append((kernel, B, V, "float32"))
    for dtype in DTYPES:
        for V in SWEEP_V:
            for B in SWEEP_B:
                if B * V * DTYPES[dtype].itemsize > MAX_TENSOR_BYTES:
                    continue
                for kernel in SWEEP_KERNELS:
                    if (kernel, B, V, dtype) not in seen:
                        seen.append((kernel, B, V, dtype))
    return [pytest.param(*c, id=f"{'lab' if (c[1], c[2]) in LAB_GRID and c[3] == 'float32' else 'sweep'}"
                               f"-{c[0]}-B{c[1]}-V{c[2]}-{c[3]}") for c in seen]


def make_logits(B: int, V: int, dtype: torch.dtype) -> torch.Tensor:
    """randn·3 with a few large outliers per row, so a wrong max-subtraction shows."""
    x = torch.randn(B, V, device="cuda") * 3
    cols = torch.randint(0, V, (B, 2), device="cuda")
    x.scatter_(1, cols, torch.tensor([30.0, -30.0], device="cuda").expand(B, 2).contiguous())
    return x.to(dtype)


def validate_output(name: str, x: torch.Tensor, out: torch.Tensor) -> None:
    """Every element written and finite; a sample of rows equal to the float64 reference."""
    assert torch.isfinite(out).all(), f"{name}: output has NaN/inf (an element was not written?)"
    B = x.shape[0]
    rows = torch.unique(torch.tensor([0, B - 1, *np.random.randint(0, B, 14)]))
    ref = softmax_ref(x[rows].float().cpu().numpy())
    got = out[rows].float().cpu().numpy()
    atol, rtol = (1e-6, 1e-4) if x.dtype == torch.float32 else (2e-3, 1.6e-2)
    np.testing.assert_allclose(got, ref, atol=atol, rtol=rtol, err_msg=f"{name} on rows {rows.tolist()}")


# -- ceilings, measured in the same run ------------------------------------------------------------

@pytest.fixture(scope="session")
def copy_times_us():
    """Device-to-device copy of 2 GiB (bytes counted: read + write)."""
    src = torch.randn(2**29, device="cuda")
    dst = torch.empty_like(src)
    return src.numel() * 4 * 2, device_times_us(lambda: dst.copy_(src), flush_l2=False, rounds=30)


@pytest.fixture(scope="session")
def copy_TBps(copy_times_us):
    nbytes, times = copy_times_us
    return nbytes / (np.median(times) * 1e-6) / 1e12


def test_ceiling_copy_bandwidth(benchmark, copy_times_us, copy_TBps, record_manifest):
    nbytes, times = copy_times_us
    record_manifest("ceilings", hbm_copy_TBps=copy_TBps,
                    how_measured="hbm_copy_TBps: median of 30 device-to-device copies of 2 GiB (torch "
                                 "copy_, bytes read + written, CUDA events); fp32_TFLOPS: median of 10 "
                                 "8192^3 fp32 matrix products (torch.mm, TF32 off, cuBLAS SGEMM, 2n^3 FLOPs)")
    benchmark.extra_info.update(ceiling="copy", bytes=nbytes, TBps=copy_TBps)
    report_device_times(benchmark, times)
    assert 0.5 < copy_TBps < 10, f"implausible copy bandwidth {copy_TBps:.2f} TB/s"


def test_ceiling_fp32_matmul(benchmark, record_manifest):
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 8192
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    times = device_times_us(lambda: torch.mm(a, b), flush_l2=False, rounds=10)
    tflops = 2 * n**3 / (np.median(times) * 1e-6) / 1e12
    record_manifest("ceilings", fp32_TFLOPS=tflops)
    benchmark.extra_info.update(ceiling="fp32", TFLOPS=tflops)
    report_device_times(benchmark, times)
    assert 5 < tflops < 120, f"implausible fp32 rate {tflops:.1f} TFLOP/s"


# -- the kernels -------------------------------------------------------------------------------------------

_medians_us: dict[tuple, float] = {}  # same-run medians, for ratios in extra_info and the gates


def time_case(name: str, B: int, V: int, dtype: torch.dtype) -> tuple[list[float], dict]:
    fn = run_kernel(name)
    x = make_logits(B, V, dtype)
    out = torch.full_like(x, float("nan"))
    validate_output(name, x, fn(x, out=out))
    info = {}
    if name == "triton":
        from kernels import softmax_triton
        info["autotune_picked"] = softmax_triton.autotune_picked(V, dtype=dtype)
        info["plan"] = softmax_triton.plan(B, V, dtype)
    elif name == "fused":
        from kernels import softmax_cuda
        info["plan"] = softmax_cuda.fused_plan(B, V, dtype)
    del out
    # Timed as callers use them: each call allocates its output from torch's caching allocator
    # (free after warm-up). Passing `out` would add a copy to F.softmax, which has no out=.
    times = device_times_us(lambda: fn(x))
    return times, info


@pytest.mark.parametrize("kernel, B, V, dtype", cases())
def test_softmax_speed(benchmark, kernel, B, V, dtype, copy_TBps):
    torch_dtype = DTYPES[dtype]
    if kernel in SUPPORTED_DTYPES and torch_dtype not in SUPPORTED_DTYPES[kernel]:
        pytest.skip(f"{kernel} does not support {dtype}")
    times, info = time_case(kernel, B, V, torch_dtype)
    median = float(np.median(times))
    _medians_us[(kernel, B, V, dtype)] = median
    min_bytes = 2 * B * V * torch_dtype.itemsize
    passes = MATRIX_PASSES.get(kernel, 2)
    benchmark.extra_info.update(
        kernel=kernel, B=B, V=V, dtype=dtype, **info,
        bytes=passes * B * V * torch_dtype.itemsize, min_bytes=min_bytes,
        GBps=min_bytes / (median * 1e-6) / 1e9,
        frac_of_copy_bw=min_bytes / (median * 1e-6) / 1e12 / copy_TBps)
    baseline = _medians_us.get(("F_softmax", B, V, dtype))
    if baseline is not None:
        benchmark.extra_info["frac_of_F_softmax"] = baseline / median
    report_device_times(benchmark, times)


# -- the lab's gates: ratios measured in the same test ---------------------------------------------------

@pytest.mark.parametrize("kernel, reference, floor", [("fused", "F_softmax", 0.30), ("triton", "fused", 0.80)],
                         ids=["lab-gate-fused-vs-F_softmax", "lab-gate-triton-vs-fused"])
def test_lab_gate(benchmark, kernel, reference, floor):
    """At (512, 600) fp32: speed(kernel) >= floor x speed(reference), timed back to back."""
    times, _ = time_case(kernel, 512, 600, torch.float32)
    reference_times, _ = time_case(reference, 512, 600, torch.float32)
    ratio = float(np.median(reference_times) / np.median(times))
    benchmark.extra_info.update(gate=f"{kernel} >= {floor} x {reference}", speed_ratio=ratio)
    report_device_times(benchmark, times)
    assert ratio >= floor, f"{kernel} runs at {ratio:.2f} x the speed of {reference} (floor {floor})"
