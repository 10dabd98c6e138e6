"""The CUDA C kernels (naive, smem, fused) on the GPU, probing what is specific to them: fused's
dispatch boundaries (each V at a boundary and one either side), row alignments the vector
peel must handle, row loops past the grid, clusters, and the -inf / ±1e30 edges.

fp32 is held to the float64 reference at atol 1e-6 / rtol 1e-4. bf16 / fp16 outputs are held to
one unit in the last place of their own format (rtol = the format's eps), plus the spacing of
the smallest values they can hold: a correct kernel computes in fp32 and rounds once.
"""

import functools

import numpy as np
import pytest
import torch

from kernels import softmax_cuda as sc
from kernels.reference import softmax_ref
from tests import inputs

pytestmark = pytest.mark.cuda

FP32_ATOL, FP32_RTOL = 1e-6, 1e-4
LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DTYPE_IDS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@pytest.fixture(autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy", reason="the CUDA C kernels are launched through CuPy")


make_logits = functools.partial(inputs.make_logits, device="cuda")


def tolerances(dtype):
    if dtype == torch.float32:
        return FP32_ATOL, FP32_RTOL
    fi = torch.finfo(dtype)
    # One ulp relative to the exact value, and below the normal range the subnormal spacing
    # (fp16), or the fp32 flush-to-zero threshold the kernel's arithmetic has (bf16).
    atol = max(fi.smallest_normal * fi.eps, torch.finfo(torch.float32).tiny)
    return atol, fi.eps


def check(got, x, *, what="", record=None, equal_nan=False):
    ref = softmax_ref(x.float().cpu().numpy())
    got64 = got.double().cpu().numpy()
    atol, rtol = tolerances(x.dtype)
    if record is not None:
        finite = np.isfinite(ref)
        err = float(np.max(np.abs(got64[finite] - ref[finite]), initial=0.0))
        record("cuda_kernels", **{f"max_abs_err_{DTYPE_IDS[x.dtype]}": err})
    np.testing.assert_allclose(got64, ref, atol=atol, rtol=rtol, equal_nan=equal_nan, err_msg=what)


def run_poisoned(fn, x):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    res = fn(x, out=out)
    assert res.data_ptr() == out.data_ptr(), "the kernel did not write into the out tensor given"
    torch.cuda.synchronize()
    return out


def _near_boundaries():
    vals = set()
    for b in sc.DISPATCH_BOUNDARIES:
        vals.update({b - 1, b, b + 1})
    return sorted(v for v in vals if v >= 1)


# -- fused: every dispatch boundary ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", _near_boundaries())
def test_fused_at_dispatch_boundaries(V, dtype, record_manifest):
    x = make_logits(5, V, dtype)  # 5 rows of odd / even length: several row alignments
    got = run_poisoned(sc.softmax_fused, x)
    check(got, x, what=f"V={V} {sc.fused_plan(5, V, dtype)}", record=record_manifest)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", [1, 3, 17, 100, 600, 781, 1023, 2047, 3001, 5000, 12345, 32000, 32001,
                               50257, 65535, 128256, 262144, 300007])
def test_fused_irregular_lengths(V, dtype, record_manifest):
    B = 9 if V <= 50257 else 3
    x = make_logits(B, V, dtype)
    got = run_poisoned(sc.softmax_fused, x)
    check(got, x, what=f"V={V} {sc.fused_plan(B, V, dtype)}", record=record_manifest)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", [1, 7, 600, 4096, 32000, 50257, 128256])
def test_fused_single_row(V, dtype, record_manifest):
    x = make_logits(1, V, dtype)
    check(run_poisoned(sc.softmax_fused, x), x, what=f"B=1 V={V}", record=record_manifest)


@pytest.mark.parametrize("V", [1, 5, 32, 33, 600])
def test_fused_many_rows(V, record_manifest):
    # B > 65535: rows must not sit in gridDim.y, and the warp path loops past its grid.
    x = make_logits(70000, V)
    check(run_poisoned(sc.softmax_fused, x), x, what=f"B=70000 V={V}", record=record_manifest)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", [40, 1000, 3000, 5000, 10000, 20000, 40000, 100000, 140000])
def test_fused_row_loops_past_the_grid(V, dtype, monkeypatch, record_manifest):
    # Caps the grid far below B so each CTA (or cluster) handles several rows in turn: shared
    # memory and cluster barriers are reused across iterations. For 16-bit storage V = 5000 ...
    # 100000 run the packed row classes, whose per-pass re-widening must see each row afresh.
    monkeypatch.setattr(sc, "_ROW_GRID_CAP", 24)
    monkeypatch.setattr(sc, "_WARP_BLOCKS_PER_SM", 1)
    B = 2000 if V <= 1024 else 61  # the warp path's grid is one block (4 rows) per SM
    x = make_logits(B, V, dtype)
    check(run_poisoned(sc.softmax_fused, x), x, what=f"looped V={V} {sc.fused_plan(B, V, dtype)}", record=record_manifest)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", [1, 2, 9, 255, 1000, 4097, 20000])
def test_online_path_at_short_rows(V, dtype, monkeypatch, record_manifest):
    # The general fallback normally sees only V > 131072; run it on short rows, where head /
    # tail peels dominate and many threads have nothing to do.
    monkeypatch.setattr(sc, "_PLAN_OVERRIDE", sc.ALL_FUSED_PLANS[-1])
    assert sc.ALL_FUSED_PLANS[-1].kind == "online"
    x = make_logits(7, V, dtype)
    check(run_poisoned(sc.softmax_fused, x), x, what=f"online V={V}", record=record_manifest)


@pytest.mark.parametrize("V", [17000, 32000, 50257, 128256])
def test_cluster_free_fallback(V, monkeypatch, record_manifest):
    # What a pre-sm_90 device would run for these rows.
    monkeypatch.setattr(sc, "_PLAN_OVERRIDE", sc._select_plan(V, clusters_ok=False))
    x = make_logits(4, V)
    check(run_poisoned(sc.softmax_fused, x), x, what=f"no-cluster V={V}", record=record_manifest)


# -- alignment -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", [31, 600, 1537, 4099, 30001, 50257, 140001])
@pytest.mark.parametrize("offset", [1, 3, 6])
def test_fused_misaligned_input(V, dtype, offset, record_manifest):
    # A contiguous view at a storage offset: every row starts off the 16-byte grid and the
    # (freshly allocated, aligned) output differs from it in alignment.
    B = 4
    base = make_logits(B, V + 8, dtype).reshape(-1)  # (B*(V+8),): room for any offset <= 8
    x = base[offset:offset + B * V].view(B, V)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    check(run_poisoned(sc.softmax_fused, x), x, what=f"offset={offset} V={V}", record=record_manifest)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", [600, 4099, 50257])
def test_fused_misaligned_input_and_output(V, dtype, record_manifest):
    # Input and output both at the same offset from the 16-byte grid: vector stores are used.
    B = 3
    x = make_logits(B, V + 8, dtype).reshape(-1)[2:2 + B * V].view(B, V)
    out_base = torch.full((B * V + 8,), float("nan"), dtype=dtype, device="cuda")
    out = out_base[2:2 + B * V].view(B, V)
    res = sc.softmax_fused(x, out=out)
    torch.cuda.synchronize()
    assert res.data_ptr() == out.data_ptr()
    check(out, x, what=f"both offset V={V}", record=record_manifest)
    assert torch.isnan(out_base[:2]).all() and torch.isnan(out_base[2 + B * V:]).all(), \
        "the kernel wrote outside the output view"


@pytest.mark.parametrize("fn", [sc.softmax_naive, sc.softmax_smem, sc.softmax_fused], ids=lambda f: f.__name__)
def test_non_contiguous_input(fn, record_manifest):
    wide = make_logits(6, 1001)
    x = wide[:, 1:]  # (6, 1000) with row stride 1001
    assert not x.is_contiguous()
    check(run_poisoned(fn, x), x, what="x[:, 1:] view", record=record_manifest)
    xt = make_logits(700, 5).t()  # (5, 700), column-major
    check(run_poisoned(fn, xt), xt, what="transposed view", record=record_manifest)


# -- edges -----------------------------------------------------------------------------------------

EDGE_V = [5, 600, 3000, 20000, 50257, 200000]


@pytest.mark.parametrize("fn", [sc.softmax_naive, sc.softmax_smem, sc.softmax_fused], ids=lambda f: f.__name__)
@pytest.mark.parametrize("V", EDGE_V)
def test_all_neg_inf_row_gives_nan(fn, V, record_manifest):
    x = make_logits(4, V)
    x[1] = float("-inf")
    got = run_poisoned(fn, x)
    assert torch.isnan(got[1]).all(), "an all -inf row must give NaN, as torch.softmax does"
    assert not torch.isnan(got[[0, 2, 3]]).any(), "the NaN row leaked into its neighbours"
    check(got, x, what=f"all -inf row, V={V}", record=record_manifest, equal_nan=True)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("V", EDGE_V)
def test_fused_all_neg_inf_row_low_precision_too(V, dtype):
    x = make_logits(3, V, dtype)
    x[2] = float("-inf")
    got = run_poisoned(sc.softmax_fused, x)
    assert torch.isnan(got[2]).all() and not torch.isnan(got[:2]).any()


@pytest.mark.parametrize("fn", [sc.softmax_naive, sc.softmax_smem, sc.softmax_fused], ids=lambda f: f.__name__)
@pytest.mark.parametrize("V", EDGE_V)
def test_huge_logits_do_not_overflow(fn, V, record_manifest):
    x = make_logits(3, V, neg_inf=False)
    x[0, ::7] = 1e30
    x[1, 1::3] = -1e30
    x[1, V // 2] = 1e30
    x[2, :] = -1e30
    x[2, V - 1] = -1e30 + 1e24  # a few fp32 ulps above the rest: it takes all the mass
    got = run_poisoned(fn, x)
    assert torch.isfinite(got).all()
    check(got, x, what=f"±1e30, V={V}", record=record_manifest)


@pytest.mark.parametrize("V", EDGE_V)
def test_fused_large_logits_low_precision(V, record_manifest):
    for dtype, big in ((torch.bfloat16, 1e30), (torch.float16, 6e4)):
        x = make_logits(2, V, dtype, neg_inf=False)
        x[0, ::5] = big
        x[1, ::3] = -big
        got = run_poisoned(sc.softmax_fused, x)
        assert torch.isfinite(got).all()
        check(got, x, what=f"{dtype} ±{big}, V={V}", record=record_manifest)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS.get)
def test_fused_v1_is_ones(dtype):
    x = make_logits(70000, 1, dtype)
    got = run_poisoned(sc.softmax_fused, x)
    torch.testing.assert_close(got.float(), torch.ones(got.shape, device="cuda"), atol=0, rtol=2**-22)


# -- naive and smem --------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [sc.softmax_naive, sc.softmax_smem], ids=lambda f: f.__name__)
@pytest.mark.parametrize("B, V", [(1, 1), (3, 7), (70000, 33), (5, 255), (4, 256), (6, 257), (3, 4097),
                                  (2, 50257), (2, 128256)])
def test_naive_and_smem(fn, B, V, record_manifest):
    x = make_logits(B, V)
    check(run_poisoned(fn, x), x, what=f"{fn.__name__} B={B} V={V}", record=record_manifest)


# -- plumbing --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [sc.softmax_naive, sc.softmax_smem, sc.softmax_fused], ids=lambda f: f.__name__)
def test_empty_batch(fn):
    x = torch.empty(0, 600, device="cuda")
    y = fn(x)
    assert y.shape == (0, 600) and y.device == x.device


@pytest.mark.parametrize("V", [600, 50257])
def test_runs_on_the_current_stream(V, record_manifest):
    # Work queued on a side stream: the kernel must run after the producer on that stream and
    # before the consumer, without any synchronisation in between.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000)  # keeps the producer late, so a wrong stream would race
        x = make_logits(64, V)
        y = sc.softmax_fused(x)
        z = y * 1.0
    s.synchronize()
    check(z, x, what="side stream", record=record_manifest)


def test_out_of_wrong_shape_is_rejected():
    x = make_logits(4, 100)
    with pytest.raises(ValueError):
        sc.softmax_fused(x, out=torch.empty(4, 101, device="cuda"))
    with pytest.raises(ValueError):
        sc.softmax_fused(x, out=torch.empty(100, 4, device="cuda").t())
