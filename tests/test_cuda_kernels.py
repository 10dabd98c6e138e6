"""The CUDA C kernels (naive, smem, fused) on the GPU, probing what is specific to them: fused's
dispatch boundaries (each V at a boundary and one either side, and each B at which it changes
path), every input layout the vector peel must handle, row loops past the grid, clusters (16-CTA
ones too), rows cut over CTAs that meet in global memory (split, loop) with their waits run out
on purpose, the -inf / ±1e30 edges, and the bitwise claim of softmax_fused.cu: a row's output
bits depend only on its values and V.

Outputs are held to tests.helpers.TOLERANCES against the float64 reference at every output:
fp32 a few ulps plus half an ulp per nat of distance from the row's max, bf16 / fp16 one unit in
the last place of the stored value, an absolute floor only below the normal range (a correct
kernel computes in fp32 and rounds once). The tail inputs and the comparison with F.softmax
are in test_accuracy.py.
"""

import pytest
import torch

from kernels import SOFTMAX_KERNELS, cuda_plans
from kernels import softmax_cuda as sc
from kernels.cuda_plans import fused_class_description, select_fused_class
from tests.helpers import (
    assert_same_bits,
    check_softmax,
    dtype_id,
    layouts,
    logits,
    run_poisoned,
)

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("cupy_importable")]

ALL_DTYPES = sc.FUSED_DTYPES
CUDA_C = [k for k in SOFTMAX_KERNELS.values() if k.backend == "cupy"]  # the kernels of kernels/cuda/*.cu
ONE_PATH_CUDA_C = [k for k in CUDA_C if len(k.paths) == 1]  # naive and smem: fused has its own cases


@pytest.fixture
def verify(record_manifest):
    """check_softmax(out, x, what), its error going into the manifest's worst error for x's dtype."""

    def run(out, x, what):
        def record(err):
            record_manifest("cuda_kernels", **{f"max_abs_err_{dtype_id(x.dtype)}": err})

        return check_softmax(out, x, what=what, record=record)

    return run


def _near_boundaries():
    vals = set()
    for b in cuda_plans.DISPATCH_BOUNDARIES:
        vals.update({b - 1, b, b + 1})
    return sorted(v for v in vals if v >= 1)


# -- fused: every dispatch boundary ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", _near_boundaries())
def test_fused_at_dispatch_boundaries(V, dtype, verify):
    x = logits(5, V, seed=V, dtype=dtype, device="cuda")  # 5 rows of odd / even length: several alignments
    verify(run_poisoned(sc.softmax_fused, x), x, f"V={V} {fused_class_description(5, V, dtype)}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    "V",
    [1, 3, 17, 100, 600, 781, 1023, 2047, 3001, 5000, 12345, 32000, 32001, 50257, 65535, 128256]
    + [151936, 200064, 202048, 262144, 300007, 1000003],
)
def test_fused_irregular_lengths(V, dtype, verify):
    B = 9 if V <= 50257 else 3
    x = logits(B, V, seed=V + 1, dtype=dtype, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x), x, f"V={V} {fused_class_description(B, V, dtype)}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [1, 7, 600, 4096, 32000, 50257, 128256, 151936, 262144, 1000000])
def test_fused_single_row(V, dtype, verify):
    x = logits(1, V, seed=V + 2, dtype=dtype, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x), x, f"B=1 V={V}")


@pytest.mark.parametrize("V", [1, 5, 32, 33, 600])
def test_fused_many_rows(V, verify):
    # B > 65535: rows must not sit in gridDim.y, and the warp path loops past its grid.
    x = logits(70000, V, seed=V + 3, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x), x, f"B=70000 V={V}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [40, 1000, 3000, 5000, 10000, 20000, 40000, 100000, 140000, 200000, 240000])
def test_fused_row_loops_past_the_grid(V, dtype, verify):
    # A grid of 48 CTAs, far below B, so each CTA (or cluster) handles several rows in turn:
    # shared memory and cluster barriers are reused across iterations. For 16-bit storage
    # V = 5000 ... 240000 run the packed row classes, whose per-pass re-widening must see each
    # row afresh; 140000 ... 240000 clusters of 13 and 16 CTAs (three of them looping).
    B = 2000 if V <= 1024 else 61
    x = logits(B, V, seed=V + 4, dtype=dtype, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x, grid_cap=48), x, f"looped V={V} {fused_class_description(B, V, dtype)}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V, parts", [(300007, 19), (50257, 17)])
def test_split_loops_past_the_grid(V, parts, dtype, verify):
    # A grid that is a multiple of the parts: each CTA walks (row, part) items of the same part
    # index, and all of a row's CTAs are resident together, so every meeting completes.
    x = logits(20, V, seed=V + 24, dtype=dtype, device="cuda")
    split = _class_of_kind(dtype, "split")
    got = run_poisoned(sc.softmax_fused, x, size_class=split, parts=parts, grid_cap=2 * parts)
    verify(got, x, f"split V={V} parts={parts}, grid of {2 * parts} CTAs")


def _class_of_kind(dtype, kind):
    (size_class,) = [p for p in cuda_plans.fused_classes(dtype) if p.kind == kind]
    return size_class


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [1, 2, 9, 255, 1000, 4097, 20000])
@pytest.mark.parametrize("parts", [1, 3])
def test_loop_path_at_short_rows(V, parts, dtype, verify):
    # The general fallback normally sees only V > 4194304; run it on short rows, where head /
    # tail peels dominate and many threads have nothing to do, alone and cut over 3 CTAs.
    loop = cuda_plans.fused_classes(dtype)[-1]
    assert loop.kind == "loop"
    x = logits(7, V, seed=V + 5, dtype=dtype, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x, size_class=loop, parts=parts), x, f"loop V={V} parts={parts}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [2, 255, 4097, 20000, 100003])
def test_split_path_at_short_rows(V, dtype, verify):
    split = _class_of_kind(dtype, "split")
    x = logits(5, V, seed=V + 21, dtype=dtype, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x, size_class=split), x, f"split V={V}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [20000, 262145, 4194305])
def test_meetings_in_memory_give_the_same_bits_however_the_row_is_cut(V, dtype):
    # The split and loop paths at several CTAs per row; with max_polls=0 every CTA but the last
    # to arrive stops waiting at once and reads the whole row itself; with a capped grid one
    # CTA holds several parts of a row and must run out its (short) wait. Every way gives the
    # dispatched bits.
    x = logits(3, V, seed=V + 22, dtype=dtype, device="cuda")
    want = run_poisoned(sc.softmax_fused, x)
    loop = _class_of_kind(dtype, "loop")
    split = _class_of_kind(dtype, "split")
    runs = {f"loop parts={p}": dict(size_class=loop, parts=p) for p in (1, 2, 7, 128)}
    runs["loop, waits run out"] = dict(size_class=loop, parts=5, max_polls=0)
    runs["loop, grid of 2 CTAs"] = dict(size_class=loop, parts=4, grid_cap=2, max_polls=16)
    if V <= split.capacity:
        first = cuda_plans.fused_parts(split, 4096, V, 132)
        for p in sorted({first, 2 * first, 64, 128}):
            if cuda_plans.slice_length(V, p) <= split.slice_capacity and p <= 128:
                runs[f"split parts={p}"] = dict(size_class=split, parts=p)
        runs["split, waits run out"] = dict(size_class=split, parts=max(first, 8), max_polls=0)
        runs["split, grid of 3 CTAs"] = dict(size_class=split, parts=max(first, 8), grid_cap=3, max_polls=16)
    for what, kwargs in runs.items():
        assert_same_bits(run_poisoned(sc.softmax_fused, x, **kwargs), want, f"V={V} {what}")


def test_split_workspace_is_left_clean_between_launches(verify):
    # The per-row words are zeroed by the last CTA out of each row, and reused by the next
    # launch on the stream: interleave shapes, batch sizes and paths, each result must hold.
    # A word left behind would show as a wrong max or sum in the launch after.
    shapes = [(3, 300007), (1, 1000000), (8, 262145), (3, 300007), (64, 262145), (2, 4194305), (5, 50257)]
    for i, (B, V) in enumerate(shapes * 2):
        x = logits(B, V, seed=i + 23, device="cuda")
        verify(run_poisoned(sc.softmax_fused, x), x, f"launch {i}: ({B}, {V}) {fused_class_description(B, V, x.dtype)}")


@pytest.mark.parametrize("V", [17000, 32000, 50257, 128256])
def test_cluster_free_fallback(V, verify):
    # What a pre-sm_90 device would run for these rows.
    size_class = select_fused_class(V, torch.float32, clusters=False)
    assert size_class.cluster == 1
    x = logits(4, V, seed=V + 6, device="cuda")
    verify(run_poisoned(sc.softmax_fused, x, size_class=size_class), x, f"no-cluster V={V} {size_class.describe()}")


def test_forced_class_too_small_for_the_row_is_rejected():
    x = logits(2, 600, seed=7, device="cuda")
    with pytest.raises(ValueError, match="does not fit"):
        sc.softmax_fused(x, size_class=cuda_plans.fused_classes(torch.float32)[0])


# -- layouts ---------------------------------------------------------------------------------------


def _layout_cases():
    for dtype in ALL_DTYPES:
        for layout in layouts(dtype):
            yield pytest.param(dtype, layout, id=f"{dtype_id(dtype)}-{layout}")


@pytest.mark.parametrize("V", [31, 600, 1537, 4099, 30001, 50257, 140001, 262145])
@pytest.mark.parametrize("dtype, layout", list(_layout_cases()))
def test_fused_every_layout(V, dtype, layout, verify):
    # Contiguous views at every 16-byte alignment class are read in place (the head/tail peel);
    # strided ones are copied first. The output is freshly allocated and aligned.
    x = logits(4, V, seed=V + 8, dtype=dtype, device="cuda", layout=layout)
    verify(run_poisoned(sc.softmax_fused, x), x, f"{layout} V={V} {fused_class_description(4, V, dtype)}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("V", [600, 4099, 50257])
def test_fused_misaligned_input_and_output(V, dtype, verify):
    # Input and output at the same offset from the 16-byte grid: vector stores are used.
    x = logits(3, V, seed=V + 9, dtype=dtype, device="cuda", layout="offset:2")
    verify(run_poisoned(sc.softmax_fused, x, out_offset=2), x, f"both offset V={V}")


@pytest.mark.parametrize("kernel", CUDA_C, ids=lambda k: k.name)
def test_non_contiguous_input(kernel, verify):
    for layout in ("row_stride", "col_stride", "offset:1"):
        x = logits(6, 1000, seed=10, device="cuda", layout=layout)
        verify(run_poisoned(kernel, x), x, f"{kernel.name} {layout}")
    xt = logits(700, 5, seed=11, device="cuda").t()  # (5, 700), column-major
    verify(run_poisoned(kernel, xt), xt, f"{kernel.name} transposed view")


# -- the bitwise claim: a row's bits depend only on its values and V --------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [7, 100, 600, 1024, 1025, 5000, 16384, 20001, 50257, 131072, 151936, 202048, 262144])
def test_fused_bits_do_not_depend_on_the_size_class(V, dtype):
    # The row sum is fixed-point, so every size class that holds the row gives the same bits.
    x = logits(6, V, seed=V + 12, dtype=dtype, device="cuda")
    default = run_poisoned(sc.softmax_fused, x)
    fitting = [p for p in cuda_plans.fused_classes(dtype) if p.capacity is None or p.capacity >= V]
    assert len(fitting) >= 3, "the split and loop classes hold any row up to 2^22, so at least three size classes fit"
    for size_class in fitting:
        assert_same_bits(
            run_poisoned(sc.softmax_fused, x, size_class=size_class), default, f"V={V} {size_class.describe()}"
        )


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [33, 781, 4099, 50257, 140001, 200064, 1000003])
def test_fused_bits_do_not_depend_on_batch_layout_or_grid(V, dtype):
    x = logits(9, V, seed=V + 13, dtype=dtype, device="cuda")
    full = run_poisoned(sc.softmax_fused, x)
    for layout in layouts(dtype):
        xl = logits(9, V, seed=V + 13, dtype=dtype, device="cuda", layout=layout)
        assert_same_bits(run_poisoned(sc.softmax_fused, xl), full, f"V={V} {layout}")
    assert_same_bits(run_poisoned(sc.softmax_fused, x, grid_cap=1), full, f"V={V} one CTA (or cluster) looping")
    for row in (0, 5, 8):
        assert_same_bits(
            run_poisoned(sc.softmax_fused, x[row : row + 1]), full[row : row + 1], f"V={V} row {row} alone"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("V", [151936, 200064, 262144, 262145, 1000000])
def test_fused_bits_do_not_depend_on_the_batch_at_long_rows(V, dtype):
    # The same rows at the B's of the vocabulary sweep and between: the split path cuts a row
    # over more CTAs the smaller the batch, the bits of each row depend on its values and V alone.
    x = logits(64, V, seed=V + 25, dtype=dtype, device="cuda")
    full = run_poisoned(sc.softmax_fused, x)
    for B in (1, 2, 7, 8, 9, 63):
        what = f"V={V} B={B} {fused_class_description(B, V, dtype)}"
        assert_same_bits(run_poisoned(sc.softmax_fused, x[:B]), full[:B], what)
        assert_same_bits(run_poisoned(sc.softmax_fused, x[64 - B :]), full[64 - B :], f"{what}, last rows")


# -- edges -----------------------------------------------------------------------------------------

EDGE_V = [5, 600, 3000, 20000, 50257, 200000, 300007]


@pytest.mark.parametrize("kernel", CUDA_C, ids=lambda k: k.name)
@pytest.mark.parametrize("V", EDGE_V)
def test_all_neg_inf_row_gives_nan(kernel, V, verify):
    x = logits(4, V, seed=V + 14, device="cuda", neg_inf_rows=[1])
    got = run_poisoned(kernel, x)
    assert torch.isnan(got[1]).all(), "an all -inf row must give NaN, as torch.softmax does"
    assert not torch.isnan(got[[0, 2, 3]]).any(), "the NaN row leaked into its neighbours"
    verify(got, x, f"{kernel.name} all -inf row, V={V}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", EDGE_V)
def test_fused_all_neg_inf_row_low_precision_too(V, dtype, verify):
    x = logits(3, V, seed=V + 15, dtype=dtype, device="cuda", neg_inf_rows=[2])
    got = run_poisoned(sc.softmax_fused, x)
    assert torch.isnan(got[2]).all() and not torch.isnan(got[:2]).any()
    verify(got, x, f"{dtype_id(dtype)} all -inf row, V={V}")


@pytest.mark.parametrize("kernel", CUDA_C, ids=lambda k: k.name)
@pytest.mark.parametrize("V", EDGE_V)
def test_huge_logits_do_not_overflow(kernel, V, verify):
    x = logits(3, V, seed=V + 16, device="cuda", neg_inf=False)
    x[0, ::7] = 1e30
    x[1, 1::3] = -1e30
    x[1, V // 2] = 1e30
    x[2, :] = -1e30
    x[2, V - 1] = -1e30 + 1e24  # a few fp32 ulps above the rest: it takes all the mass
    got = run_poisoned(kernel, x)
    assert torch.isfinite(got).all()
    verify(got, x, f"{kernel.name} ±1e30, V={V}")


@pytest.mark.parametrize("V", EDGE_V)
def test_fused_large_logits_low_precision(V, verify):
    for dtype, big in ((torch.bfloat16, 1e30), (torch.float16, 6e4)):
        x = logits(2, V, seed=V + 17, dtype=dtype, device="cuda", neg_inf=False)
        x[0, ::5] = big
        x[1, ::3] = -big
        got = run_poisoned(sc.softmax_fused, x)
        assert torch.isfinite(got).all()
        verify(got, x, f"{dtype_id(dtype)} ±{big}, V={V}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_fused_v1_is_ones(dtype):
    x = logits(70000, 1, seed=18, dtype=dtype, device="cuda")
    got = run_poisoned(sc.softmax_fused, x)
    assert torch.equal(got.float(), torch.ones(got.shape, device="cuda")), "softmax of one element is exactly 1"


# -- naive and smem --------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ONE_PATH_CUDA_C, ids=lambda k: k.name)
@pytest.mark.parametrize(
    "B, V", [(1, 1), (3, 7), (70000, 33), (5, 255), (4, 256), (6, 257), (3, 4097), (2, 50257), (2, 128256)]
)
def test_naive_and_smem(kernel, B, V, verify):
    x = logits(B, V, seed=B + V, device="cuda")
    verify(run_poisoned(kernel, x), x, f"{kernel.name} B={B} V={V}")


# -- plumbing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", CUDA_C, ids=lambda k: k.name)
def test_empty_batch(kernel):
    x = torch.empty(0, 600, device="cuda")
    y = kernel(x)
    assert y.shape == (0, 600) and y.device == x.device


@pytest.mark.parametrize("V", [600, 50257])
def test_runs_on_the_current_stream(V, verify):
    # Work queued on a side stream: the kernel must run after the producer on that stream and
    # before the consumer, without any synchronisation in between.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000)  # keeps the producer late, so a wrong stream would race
        x = logits(64, V, seed=V + 19, device="cuda")
        y = sc.softmax_fused(x)
        z = y * 1.0
    s.synchronize()
    verify(z, x, "side stream")


def test_out_of_wrong_shape_is_rejected():
    x = logits(4, 100, seed=20, device="cuda")
    with pytest.raises(ValueError):
        sc.softmax_fused(x, out=torch.empty(4, 101, device="cuda"))
    with pytest.raises(ValueError):
        sc.softmax_fused(x, out=torch.empty(100, 4, device="cuda").t())
