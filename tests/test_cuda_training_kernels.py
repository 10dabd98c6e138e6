"""The CUDA C training kernels on the GPU: the softmax backward (kernels.cuda_training.
softmax_backward_fused) and the fused cross-entropy (cross_entropy_fused), against the float64
references of kernels/reference.py, with tolerances derived from the kernels' float32 arithmetic
(tests.helpers.backward_error_bound, cross_entropy_expected: TOLERANCES' training rows), outputs
poisoned with NaN before the kernels write them.

Probed: every dispatch boundary and size class (forced size classes too, and the cluster-free ones a
pre-sm_90 device runs), every input layout of y, dy and the logits, rows looping past the grid,
the bitwise claims (a row's bits depend only on its values, its target and V: not on the batch,
the row's position or alignment, the strides, the size class), every option of cross-entropy
(class weights, ignore_index, label smoothing, the three reductions, in place, out=), and the
edges: all targets ignored, V = 1, confident rows, -inf and huge logits, infinite gradients,
odd V up to 262144, N * V past 2^31, targets out of range.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import cuda_training as ct
from kernels import cuda_training_plans as tp
from kernels.reference import cross_entropy_ref
from tests.helpers import (
    FP32_EPS,
    GUARD_BYTES,
    TOLERANCES,
    assert_backward_as_accurate_as_torch,
    assert_backward_close,
    assert_cross_entropy_close,
    assert_loss_reduces_its_rows,
    assert_no_less_accurate_than_torch,
    assert_same_bits,
    assert_within,
    bits,
    cross_entropy_expected,
    cross_entropy_inputs,
    dtype_id,
    fixed_point_error,
    layouts,
    softmax_and_grad,
)

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("cupy_importable")]

DTYPES = ct.TRAINING_DTYPES


def _poisoned_like(shape, dtype, *, row_stride=None, offset=0):
    """A NaN-filled output framed by NaN guards: (buffer, view, (start, end) of the view)."""
    B, V = shape
    rs = V if row_stride is None else row_stride
    guard = GUARD_BYTES // torch.tensor([], dtype=dtype).element_size()
    n = (B - 1) * rs + V if B else 0
    buf = torch.full((guard + offset + n + guard,), math.nan, dtype=dtype, device="cuda")
    view = buf[guard + offset : guard + offset + n].as_strided((B, V), (rs, 1)) if B else buf[:0].view(0, V)
    return buf, view, (guard + offset, guard + offset + n)


def _assert_untouched(buf, view, span, what):
    """Nothing outside the view's rows was written: the guards, and a row stride's gaps."""
    outside = torch.cat([buf[: span[0]], buf[span[1] :]])
    assert torch.isnan(outside).all(), f"{what}: wrote {int((~torch.isnan(outside)).sum())} elements outside out"
    if view.shape[0] > 1 and view.stride(0) > view.shape[1]:
        inner = buf[span[0] : span[1]].view(-1)
        mask = torch.ones_like(inner, dtype=torch.bool)
        for r in range(view.shape[0]):
            mask[r * view.stride(0) : r * view.stride(0) + view.shape[1]] = False
        assert torch.isnan(inner[mask]).all(), f"{what}: wrote into the gaps between rows"


def run_backward(y, dy, **kwargs):
    """softmax_backward_fused into a NaN-poisoned out; checks it wrote only out and left y, dy."""
    buf, out, span = _poisoned_like(y.shape, y.dtype)
    before = (bits(y).clone(), bits(dy).clone())
    got = ct.softmax_backward_fused(y, dy, out=out, **kwargs)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr(), "did not return the out tensor it was given"
    _assert_untouched(buf, out, span, "softmax backward")
    assert torch.equal(bits(y), before[0]) and torch.equal(bits(dy), before[1]), "changed its inputs"
    return got


def run_cross_entropy(x, t, **kwargs):
    """cross_entropy_fused with the gradient into a NaN-poisoned out (or over a copy of the
    logits with inplace=True); checks nothing else was written and the inputs were left."""
    inplace = kwargs.get("inplace", False)
    before = (bits(x).clone(), t.clone())
    if inplace:
        x = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)  # same layout
        result = ct.cross_entropy_fused(x, t, **kwargs)
        assert result[1].data_ptr() == x.data_ptr(), "inplace=True did not return the logits"
    else:
        buf, out, span = _poisoned_like(x.shape, x.dtype)
        result = ct.cross_entropy_fused(x, t, out=out, **kwargs)
        assert result[1].data_ptr() == out.data_ptr(), "did not return the out tensor it was given"
        torch.cuda.synchronize()
        _assert_untouched(buf, out, span, "cross-entropy")
        assert torch.equal(bits(x), before[0]), "changed the logits"
    torch.cuda.synchronize()
    assert torch.equal(t, before[1]), "changed the targets"
    return result


def _near(bounds):
    return sorted({b + d for b in bounds for d in (-1, 0, 1) if b + d >= 1})


BWD_BOUNDARY_V = _near(tp.all_boundaries("bwd"))
CE_BOUNDARY_V = _near(tp.all_boundaries("ce"))


def _classes_fitting(op, V, dtype):
    return [p for p in tp.training_classes(op, dtype) if p.capacity is None or p.capacity >= V]


# ================================================================================================
# softmax backward
# ================================================================================================


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", BWD_BOUNDARY_V)
def test_backward_at_dispatch_boundaries(V, dtype):
    y, dy = softmax_and_grad(5, V, seed=V, dtype=dtype, device="cuda")
    assert_backward_close(run_backward(y, dy), dy, y, what=f"V={V} {tp.backward_class_description(5, V, dtype)}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [1, 3, 17, 100, 257, 600, 781, 3001, 12345, 32001, 50257, 128256, 151936, 262144, 300007])
def test_backward_irregular_lengths(V, dtype):
    B = 9 if V <= 50257 else 3
    y, dy = softmax_and_grad(B, V, seed=V + 1, dtype=dtype, device="cuda", dy_scale=4.0)
    assert_backward_close(run_backward(y, dy), dy, y, what=f"V={V} {tp.backward_class_description(B, V, dtype)}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [7, 300, 1000, 5000, 20000, 70000, 140001])
def test_backward_every_plan_and_looping_grid(V, dtype):
    # Every size class that holds the row (forced), each with a grid of 3 CTAs (or clusters) so that
    # CTAs loop over rows; and the cluster-free size class a pre-sm_90 device would pick.
    y, dy = softmax_and_grad(11, V, seed=V + 2, dtype=dtype, device="cuda")
    for size_class in _classes_fitting("bwd", V, dtype):
        assert_backward_close(
            run_backward(y, dy, size_class=size_class, grid_cap=3 * size_class.cluster),
            dy,
            y,
            what=size_class.describe(),
        )
    size_class = tp.select_training_class("bwd", V, dtype, clusters=False)
    assert_backward_close(
        run_backward(y, dy, size_class=size_class), dy, y, what=f"no clusters: {size_class.describe()}"
    )


def _layout_pairs(dtype):
    ls = layouts(dtype)
    pairs = [(lay, "contiguous") for lay in ls] + [("contiguous", lay) for lay in ls[1:]]
    return pairs + [("offset:1", "offset:2"), ("row_stride", "offset:3"), ("col_stride", "row_stride")]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [31, 600, 1537, 4099, 30001, 50257, 140001])
def test_backward_every_layout_of_y_and_dy(V, dtype):
    # y and dy in different alignments take the element-wise path for dy; row strides change
    # the alignment from row to row. The bits equal those of contiguous inputs.
    y0, dy0 = softmax_and_grad(4, V, seed=V + 3, dtype=dtype, device="cuda")
    base = run_backward(y0, dy0)
    for ly, ld in _layout_pairs(dtype):
        y, dy = softmax_and_grad(4, V, seed=V + 3, dtype=dtype, device="cuda", layout_y=ly, layout_dy=ld)
        got = run_backward(y, dy)
        assert_backward_close(got, dy, y, what=f"y {ly}, dy {ld}, V={V}")
        assert_same_bits(got, base, f"y {ly}, dy {ld}, V={V}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [7, 100, 600, 1025, 5000, 16384, 20001, 50257, 131072, 140001])
def test_backward_bits_depend_only_on_the_row(V, dtype):
    y, dy = softmax_and_grad(9, V, seed=V + 4, dtype=dtype, device="cuda")
    full = run_backward(y, dy)
    for size_class in _classes_fitting("bwd", V, dtype):
        assert_same_bits(run_backward(y, dy, size_class=size_class), full, f"V={V} {size_class.describe()}")
    assert_same_bits(run_backward(y, dy, grid_cap=1), full, f"V={V} one CTA (or cluster) looping")
    for row in (0, 4, 8):
        assert_same_bits(
            run_backward(y[row : row + 1], dy[row : row + 1]), full[row : row + 1], f"V={V} row {row} alone"
        )
    # The same row repeated at every position of a batch.
    rep = run_backward(y[3:4].expand(6, V), dy[3:4].expand(6, V))
    assert_same_bits(rep, full[3:4].expand(6, V), f"V={V} a row broadcast over the batch (row stride 0)")


@pytest.mark.parametrize("V", [1, 5, 33, 200, 600])
def test_backward_many_rows(V):
    # B > 65535, and the warp kinds loop past their grid.
    y, dy = softmax_and_grad(70000, V, seed=V + 5, device="cuda")
    assert_backward_close(run_backward(y, dy), dy, y, what=f"B=70000 V={V}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [5, 600, 3000, 50257, 200000])
def test_backward_edges(V, dtype):
    y, dy = softmax_and_grad(6, V, seed=V + 6, dtype=dtype, device="cuda", dy_scale=3.0)
    big = 1e30 if dtype != torch.float16 else 6e4
    dy[0] = big  # S = big: dx = y * (big - big * sum(y))
    dy[1, ::3] = -big
    dy[2] = 0.0  # dx = 0 exactly
    dy[3, V // 2] = math.inf  # S = +inf: -inf where y > 0, NaN at the inf and where y == 0
    dy[4, 0] = -math.inf
    dy[4, V - 1] = math.inf  # both: S is NaN
    dy[5, V // 3] = math.nan
    got = run_backward(y, dy)
    assert_backward_close(got, dy, y, what=f"edges V={V}")
    assert (got[2] == 0).all(), "dy = 0 must give dx = 0 exactly"
    assert torch.isnan(got[4]).all() and torch.isnan(got[5]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_backward_single_column(dtype):
    y = torch.ones(70, 1, dtype=dtype, device="cuda")
    dy = torch.randn(70, 1, device="cuda").to(dtype)
    assert (run_backward(y, dy) == 0).all(), "softmax of one element has zero gradient"


@pytest.mark.parametrize("V", [4099, 50257, 262144])
def test_backward_is_no_less_accurate_than_pytorch(V):
    # fp32, the ratio rule (tests.helpers.assert_backward_as_accurate_as_torch): the worst error
    # in units of the bound at most PyTorch's own. The even rows' +30 outlier makes y ~ 1 where
    # dy dominates S = sum(y * dy), so dy - S cancels: a rounding of y * dy that enters S
    # (PyTorch's cancels there, ours must not add one) or of S itself shows there.
    y, dy = softmax_and_grad(16, V, seed=V + 7, device="cuda", dy_scale=5.0)
    assert_backward_as_accurate_as_torch(run_backward(y, dy), dy, y, what=f"V={V}")


def test_backward_plumbing():
    y, dy = softmax_and_grad(0, 600, seed=8, device="cuda")
    assert ct.softmax_backward_fused(y, dy).shape == (0, 600)
    y, dy = softmax_and_grad(4, 100, seed=9, device="cuda")
    with pytest.raises(ValueError, match="cuda"):
        ct.softmax_backward_fused(y, dy.cpu())
    with pytest.raises(ValueError, match="does not fit"):
        ct.softmax_backward_fused(y, dy, size_class=tp.training_classes("bwd", torch.float32)[0])
    # The adapter with the registry's argument order (dy first).
    assert_same_bits(ct.registry_softmax_backward(dy, y), ct.softmax_backward_fused(y, dy), "registry order")


@pytest.mark.parametrize("V", [600, 50257])
def test_backward_runs_on_the_current_stream(V):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000)  # a late producer: a kernel on the wrong stream would race it
        y, dy = softmax_and_grad(64, V, seed=V + 10, device="cuda")
        dx = ct.softmax_backward_fused(y, dy) * 1.0
    s.synchronize()
    assert_backward_close(dx, dy, y, what="side stream")


# ================================================================================================
# cross-entropy
# ================================================================================================

OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"label_smoothing": 0.1}, id="smoothing"),
    pytest.param({"weight": True}, id="weighted"),
    pytest.param({"weight": True, "label_smoothing": 0.2}, id="weighted-smoothing"),
    pytest.param({"ignore_index": 3, "label_smoothing": 0.05}, id="ignore-3"),
]


def _options(opts, V, seed):
    """Concrete options: weight=True becomes positive class weights on the GPU."""
    opts = dict(opts)
    if opts.get("weight") is True:
        g = torch.Generator().manual_seed(seed + 3)
        opts["weight"] = (torch.rand(V, generator=g) * 2 + 0.1).to("cuda")
    return opts


def check_ce(x, t, what, **opts):
    result = run_cross_entropy(x, t, **opts)
    expect_opts = {k: v for k, v in opts.items() if k in ("weight", "ignore_index", "label_smoothing", "reduction")}
    return assert_cross_entropy_close(result, x, t, what=what, **expect_opts), result


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", CE_BOUNDARY_V)
def test_ce_at_dispatch_boundaries(V, dtype):
    x, t = cross_entropy_inputs(7, V, seed=V, dtype=dtype, device="cuda")
    check_ce(x, t, f"V={V} {tp.cross_entropy_class_description(7, V, dtype)}", reduction="none")


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [100, 200, 3000, 50257, 140001])  # warp, warpvec, row, cluster, loop
def test_ce_options(V, dtype, opts, reduction):
    N = 12 if V <= 50257 else 5
    # Rows with -inf logits have an infinite smoothing loss, which would make every sum inf.
    neg_inf = not (opts.get("label_smoothing") and reduction != "none")
    x, t = cross_entropy_inputs(
        N, V, seed=V + 1, dtype=dtype, device="cuda", ignore_index=opts.get("ignore_index", -100), neg_inf=neg_inf
    )
    o = _options(opts, V, V)
    check_ce(
        x, t, f"V={V} {tp.cross_entropy_class_description(N, V, dtype)} {opts} {reduction}", reduction=reduction, **o
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [7, 300, 1000, 5000, 20000, 70000, 140001])
@pytest.mark.parametrize("opts", OPTIONS[:2] + OPTIONS[3:4])
def test_ce_every_plan_and_looping_grid(V, dtype, opts):
    x, t = cross_entropy_inputs(11, V, seed=V + 2, dtype=dtype, device="cuda")
    o = _options(opts, V, V)
    base = run_cross_entropy(x, t, reduction="none", **o)
    assert_cross_entropy_close(base, x, t, what=f"V={V} default", reduction="none", **o)
    for size_class in _classes_fitting("ce", V, dtype) + [tp.select_training_class("ce", V, dtype, clusters=False)]:
        got = run_cross_entropy(x, t, reduction="none", size_class=size_class, grid_cap=3 * size_class.cluster, **o)
        for name, a, b in zip(("loss", "grad", "lse"), got, base, strict=True):
            assert_same_bits(a, b, f"V={V} {size_class.describe()} {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [31, 600, 1537, 4099, 30001, 50257, 140001])
def test_ce_every_layout(V, dtype):
    x0, t = cross_entropy_inputs(4, V, seed=V + 3, dtype=dtype, device="cuda")
    base = run_cross_entropy(x0, t, reduction="none", label_smoothing=0.1)
    for layout in layouts(dtype):
        x, _ = cross_entropy_inputs(4, V, seed=V + 3, dtype=dtype, device="cuda", layout=layout)
        got = run_cross_entropy(x, t, reduction="none", label_smoothing=0.1)
        assert_cross_entropy_close(got, x, t, what=f"{layout} V={V}", reduction="none", label_smoothing=0.1)
        for name, a, b in zip(("loss", "grad", "lse"), got, base, strict=True):
            assert_same_bits(a, b, f"{layout} V={V} {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [33, 781, 4099, 50257, 140001])
def test_ce_bits_depend_only_on_the_row(V, dtype):
    # Per-row loss, lse and the unscaled gradient ("none"; "sum" scales by 1) of a row are the
    # same alone, anywhere in a batch, with other rows around it; the summed loss does not
    # depend on the rows' order.
    x, t = cross_entropy_inputs(9, V, seed=V + 4, dtype=dtype, device="cuda", neg_inf=False)
    opts = {"label_smoothing": 0.1, "weight": _options({"weight": True}, V, V)["weight"]}
    full = run_cross_entropy(x, t, reduction="none", **opts)
    for row in (0, 1, 5, 8):
        alone = run_cross_entropy(x[row : row + 1], t[row : row + 1], reduction="none", **opts)
        for name, a, b in zip(("loss", "grad", "lse"), alone, full, strict=True):
            assert_same_bits(a, b[row : row + 1], f"V={V} row {row} alone: {name}")
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(V)).to("cuda")
    for reduction in ("sum", "mean"):
        a = run_cross_entropy(x, t, reduction=reduction, **opts)
        b = run_cross_entropy(x[perm], t[perm], reduction=reduction, **opts)
        assert_same_bits(a[0], b[0], f"V={V} {reduction} over permuted rows")
        assert_same_bits(a[1][perm], b[1], f"V={V} {reduction} gradient over permuted rows")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [100, 3000, 50257, 140001])
def test_ce_in_place_and_row_strided_out(V, dtype):
    x, t = cross_entropy_inputs(6, V, seed=V + 5, dtype=dtype, device="cuda", layout="row_stride")
    want = run_cross_entropy(x, t, label_smoothing=0.1)
    got = run_cross_entropy(x, t, label_smoothing=0.1, inplace=True)
    for name, a, b in zip(("loss", "grad", "lse"), got, want, strict=True):
        assert_same_bits(a, b, f"in place V={V} {name}")
    buf, out, span = _poisoned_like(x.shape, dtype, row_stride=V + 3, offset=1)
    strided = ct.cross_entropy_fused(x, t, label_smoothing=0.1, out=out)
    torch.cuda.synchronize()
    _assert_untouched(buf, out, span, "row-strided out")
    assert_same_bits(strided[1], want[1], f"row-strided out V={V}")


@pytest.mark.parametrize("V", [1, 5, 33, 200, 600])
def test_ce_many_rows(V):
    x, t = cross_entropy_inputs(70000, V, seed=V + 6, device="cuda", neg_inf=False)
    check_ce(x, t, f"N=70000 V={V}", reduction="mean", label_smoothing=0.1)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [5, 600, 3000, 50257, 200000])
def test_ce_edges(V, dtype):
    x, t = cross_entropy_inputs(8, V, seed=V + 7, dtype=dtype, device="cuda", ignored=0)
    big = 1e30 if dtype != torch.float16 else 6e4
    x[0] = -math.inf  # no finite logit: loss, gradient NaN; lse -inf
    x[1, ::2] = -math.inf  # -inf logits: p = 0 there, infinite smoothing loss
    x[1, t[1]] = 0.0
    x[2, ::3] = big  # huge logits
    x[3, 1::3] = -big
    x[4, t[4]] = x[4].max() + 40.0  # confident: p_t = 1 - 4e-18 V
    x[5, t[5]] = -math.inf  # the target's logit is -inf: infinite loss
    x[6, V // 2] = math.nan  # NaN anywhere: the whole row NaN, lse NaN
    x[7, 0] = math.inf  # +inf: lse +inf, the rest NaN
    for opts in ({}, {"label_smoothing": 0.1}):
        (err, (loss, grad, lse)) = check_ce(x, t, f"edges V={V} {opts}", reduction="none", **opts)
        assert lse[0] == -math.inf and lse[7] == math.inf and torch.isnan(lse[6])
        assert loss[5] == math.inf
        assert (loss[1] == math.inf) == bool(opts), "-inf logits give an infinite smoothing loss, else a finite one"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [7, 3000, 50257, 140001])
def test_ce_confident_rows_keep_their_digits(V, dtype):
    # p_t from 1 - 1e-3 to 1 - 1e-7: the loss log1p(sum of the others) and the gradient p_t - 1
    # come from the fixed-point sum without cancellation, so they keep their relative precision
    # (a few units of fp32 rounding per unit of the others' mean distance E_t to the max) down to
    # the fixed point's resolution, V / 2 units of 2^-(62 - ceil(log2 V)), where lse - x_t and
    # softmax - 1 in fp32 would lose digits in proportion to |lse| / loss.
    N = 5
    x, t = cross_entropy_inputs(N, V, seed=V + 8, dtype=torch.float64, ignored=0, neg_inf=False)
    x = x.to(dtype).double()  # the values the kernel will see
    rows = torch.arange(N)
    others = torch.logsumexp(x.masked_fill(F.one_hot(t, V).bool(), -math.inf), dim=1)
    for r, one_minus_p in enumerate((1e-3, 1e-4, 1e-5, 1e-6, 1e-7)):
        x[r, t[r]] = others[r] - math.log(one_minus_p)
    x = x.to(dtype)
    (_, (loss, grad, _)) = check_ce(x.cuda(), t.cuda(), f"confident V={V}", reduction="none")
    xd = x.double().numpy()
    loss_ref, lse_ref, grad_ref = cross_entropy_ref(xd, t.numpy(), reduction="none")
    pm1_ref = grad_ref[rows, t]
    assert (-pm1_ref < 2e-3).all() and (-pm1_ref > 0).all()
    d = np.abs(xd - xd.max(axis=1, keepdims=True))
    p = np.exp(xd - lse_ref[:, None])
    p[rows, t] = 0.0
    E_t = (p * d).sum(axis=1) / p.sum(axis=1)
    # TOLERANCES' cross-entropy row: ce_ulps eps per unit of E_t + 2; the exp sum's rounding to
    # nearest, at most V / 2 units of 2^-K (fixed_point_error(V) is V of them; p_t - 1 divides by
    # the sum once more); one rounding into dtype, relative, and absolute where fp16 turns subnormal.
    tol = TOLERANCES[dtype]
    c = tol.ce_ulps * FP32_EPS
    storage, floor = (0.0, 0.0) if dtype == torch.float32 else (tol.storage, tol.train_floor_abs)
    loss_err = np.abs(loss.double().cpu().numpy() - loss_ref)
    pm1_err = np.abs(grad[rows, t.cuda()].double().cpu().numpy() - pm1_ref)
    loss_bound = (c * (E_t + 2) + storage) * loss_ref + fixed_point_error(V) + floor
    pm1_bound = (c * (E_t + 2) + storage) * np.abs(pm1_ref) + 2 * fixed_point_error(V) + floor
    assert (loss_err <= loss_bound).all(), f"confident rows' loss lost digits: {loss_err / loss_ref} relative"
    assert (pm1_err <= pm1_bound).all(), f"confident rows' p_t - 1 lost digits: {pm1_err / np.abs(pm1_ref)} relative"


@pytest.mark.parametrize("V", [5, 600, 50257])
def test_ce_ignored_rows_whose_probabilities_are_nan(V):
    # PyTorch's semantics (kernels.reference.cross_entropy_ref): an ignored row's loss is 0 and its
    # gradient 0 times its probabilities, so NaN throughout a row holding a NaN, a +inf or no
    # finite logit, in every reduction; the other rows are untouched by them.
    x, t = cross_entropy_inputs(6, V, seed=V + 19, device="cuda", ignored=0, neg_inf=False)
    x[1, V // 2] = math.nan
    x[2] = -math.inf
    x[3, 0] = math.inf
    t[1:4] = -100
    for reduction in ("none", "sum", "mean"):
        for eps in (0.0, 0.1):
            check_ce(x, t, f"ignored NaN rows V={V} {reduction} ls={eps}", reduction=reduction, label_smoothing=eps)


@pytest.mark.parametrize("V", [1, 2, 600])
def test_ce_all_targets_ignored(V):
    x, t = cross_entropy_inputs(5, V, seed=V + 9, device="cuda", ignored=0)
    t[:] = -100
    for reduction, want in (("mean", math.nan), ("sum", 0.0)):
        for eps in (0.0, 0.3):
            loss, grad, lse = run_cross_entropy(x, t, reduction=reduction, label_smoothing=eps)
            assert (math.isnan(want) and torch.isnan(loss)) or loss.item() == want, (reduction, loss)
            assert (grad == 0).all(), "ignored rows have a zero gradient, even when the mean divides by 0"
            assert_cross_entropy_close(
                (loss, grad, lse), x, t, what=f"all ignored, {reduction}", reduction=reduction, label_smoothing=eps
            )
    ref = F.cross_entropy(x, t, reduction="mean")
    assert torch.isnan(ref), "the reference semantics: PyTorch's mean over no rows is NaN"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_ce_one_class(dtype):
    x = (torch.randn(70, 1, device="cuda") * 30).to(dtype)
    t = torch.zeros(70, dtype=torch.int64, device="cuda")
    for eps in (0.0, 0.5):
        loss, grad, lse = run_cross_entropy(x, t, reduction="none", label_smoothing=eps)
        assert (loss == 0).all() and (grad == 0).all(), "one class: loss and gradient are exactly 0"
        assert_same_bits(lse, x.float().view(-1), "one class: lse is the logit")


@pytest.mark.parametrize("ignore_index", [-100, 0, 7])
def test_ce_ignore_index_anywhere(ignore_index):
    # An ignore_index inside [0, V) ignores the rows with that class; int32 targets work too.
    x, t = cross_entropy_inputs(40, 600, seed=11, device="cuda", ignored=4, ignore_index=ignore_index, neg_inf=False)
    t[::5] = 7
    for tt in (t, t.to(torch.int32)):
        check_ce(
            x, tt, f"ignore_index={ignore_index}", reduction="mean", ignore_index=ignore_index, label_smoothing=0.1
        )


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("opts", OPTIONS)
def test_ce_matches_pytorch(opts, reduction):
    # The loss within cross_entropy_expected's bound of the float64 reference, which is
    # F.cross_entropy's in float64 (tests/test_cross_entropy.py); a gradient no less accurate
    # than PyTorch's autograd's against float64 by the ratio rule (the confident rows' p_t - 1,
    # which PyTorch takes as softmax - 1 in fp32, are where it is far less accurate).
    V = 50257
    neg_inf = not (opts.get("label_smoothing") and reduction != "none")
    x, t = cross_entropy_inputs(
        16, V, seed=12, device="cuda", ignore_index=opts.get("ignore_index", -100), neg_inf=neg_inf
    )
    o = _options(opts, V, 12)
    loss, grad, _ = run_cross_entropy(x, t, reduction=reduction, **o)
    xr = x.clone().requires_grad_(True)
    torch_loss = F.cross_entropy(xr, t, reduction=reduction, **o)
    torch_loss.backward(torch.ones_like(torch_loss))
    exp = cross_entropy_expected(x, t, reduction=reduction, **o)
    assert_within(
        np.atleast_1d(loss.double().cpu().numpy()),
        np.atleast_1d(exp["loss"]),
        np.atleast_1d(exp["loss_tol"]),
        f"{reduction} {o}: loss",
    )
    assert_no_less_accurate_than_torch(grad, xr.grad, exp["grad"], exp["grad_tol"], x.dtype, what=f"{reduction} {o}")


def test_ce_reductions_are_consistent():
    x, t = cross_entropy_inputs(33, 3001, seed=13, device="cuda", neg_inf=False)
    w = _options({"weight": True}, 3001, 13)["weight"]
    results = {r: run_cross_entropy(x, t, reduction=r, weight=w, label_smoothing=0.1) for r in ("none", "sum", "mean")}
    for r, result in results.items():
        assert_cross_entropy_close(result, x, t, what=r, reduction=r, weight=w, label_smoothing=0.1)
    (rows, g_rows, _), (total, g_sum, _), (mean, _, _) = results.values()
    assert_same_bits(g_rows, g_sum, "none and sum share the gradient")
    # "sum" and "mean" reduce the very row losses "none" returns.
    counted = w[t[t != -100]].double().sum().item()
    assert_loss_reduces_its_rows(total, rows, reduction="sum")
    assert_loss_reduces_its_rows(mean, rows, reduction="mean", counted=counted)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("bad", [600, 601, -1, -101, 2**40])
def test_ce_target_out_of_range_is_a_value_error(bad, inplace):
    x, t = cross_entropy_inputs(9, 600, seed=14, device="cuda")
    t[4] = bad
    x_before = x.clone()
    with pytest.raises(ValueError, match=f"target {bad} at row 4"):
        ct.cross_entropy_fused(x, t, inplace=inplace)
    assert torch.equal(bits(x), bits(x_before)), "a rejected call must leave the logits as they were"
    # A bad target next to ignore_index rows and in every size class is still caught.
    for V in (100, 3000, 140001):
        xv, tv = cross_entropy_inputs(3, V, seed=15, device="cuda")
        tv[2] = V
        with pytest.raises(ct.TargetError):
            ct.cross_entropy_fused(xv, tv, reduction="none")


@pytest.mark.parametrize("unchecked", ["graph capture", "validate=False"])
def test_ce_bad_target_unchecked_gives_nan_not_a_crash(unchecked):
    # Inside a capture, or with validate=False, the host check is skipped; the kernel must read
    # nothing out of bounds and mark the row NaN.
    x, t = cross_entropy_inputs(4, 600, seed=16, device="cuda", ignored=0)
    t[1] = 10_000
    ct.cross_entropy_fused(x, t.clone().fill_(0), reduction="none")  # compile and warm up outside
    if unchecked == "graph capture":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss, grad, lse = ct.cross_entropy_fused(x, t, reduction="none")
        graph.replay()
    else:
        loss, grad, lse = ct.cross_entropy_fused(x, t, reduction="none", validate=False)
    torch.cuda.synchronize()
    assert torch.isnan(loss[1]) and torch.isnan(grad[1]).all()
    good = torch.tensor([0, 2, 3], device="cuda")
    assert_cross_entropy_close((loss[good], grad[good], lse[good]), x[good], t[good], reduction="none")


def test_ce_plumbing():
    x, t = cross_entropy_inputs(0, 600, seed=17, device="cuda")
    loss, grad, lse = ct.cross_entropy_fused(x, t)
    assert torch.isnan(loss) and grad.shape == (0, 600) and lse.shape == (0,)
    assert ct.cross_entropy_fused(x, t, reduction="sum")[0].item() == 0.0
    x, t = cross_entropy_inputs(4, 100, seed=18, device="cuda")
    with pytest.raises(ValueError, match="cuda"):
        ct.cross_entropy_fused(x.cpu(), t.cpu())
    with pytest.raises(ValueError, match="targets is on"):
        ct.cross_entropy_fused(x, t.cpu())
    with pytest.raises(ValueError, match="weight is on"):
        ct.cross_entropy_fused(x, t, weight=torch.ones(100))
    with pytest.raises(ValueError, match="does not fit"):
        ct.cross_entropy_fused(x, t, size_class=tp.training_classes("ce", torch.float32)[0])
    # The adapter with the registry's return order (loss, lse, grad).
    a = ct.registry_cross_entropy(x, t, label_smoothing=0.1)
    b = ct.cross_entropy_fused(x, t, label_smoothing=0.1)
    for u, v, name in ((a[0], b[0], "loss"), (a[1], b[2], "lse"), (a[2], b[1], "grad")):
        assert_same_bits(u, v, f"registry order: {name}")


# -- N * V past 2^31 -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("V", [50257, 262144])
def test_past_2_31_elements(V):
    # bf16 logits of N * V > 2^31 elements, the gradient written in place (one buffer): the last
    # rows, beyond every 32-bit offset, equal those rows computed alone, bit for bit, and the
    # reference. Then the softmax backward over the same rows.
    N = (2**31) // V + 7
    x = torch.empty(N, V, dtype=torch.bfloat16, device="cuda")
    x.normal_(0, 3, generator=torch.Generator(device="cuda").manual_seed(V))
    t = torch.randint(0, V, (N,), device="cuda", generator=torch.Generator(device="cuda").manual_seed(V + 1))
    assert x.numel() > 2**31
    tail = slice(N - 3, N)
    x_tail, t_tail = x[tail].clone(), t[tail].clone()
    alone = ct.cross_entropy_fused(x_tail.clone(), t_tail, reduction="none", label_smoothing=0.1, inplace=True)
    loss, grad, lse = ct.cross_entropy_fused(x, t, reduction="none", label_smoothing=0.1, inplace=True)
    for name, a, b in zip(("loss", "grad", "lse"), (loss[tail], grad[tail], lse[tail]), alone, strict=True):
        assert_same_bits(a, b, f"N*V > 2^31, V={V}: last rows {name}")
    assert_cross_entropy_close(alone, x_tail, t_tail, what=f"V={V} last rows", reduction="none", label_smoothing=0.1)
    del loss, lse
    # The softmax backward over the same storage: y = the gradient buffer, dy = itself.
    dx_tail = ct.softmax_backward_fused(grad[tail], grad[tail])
    dx = ct.softmax_backward_fused(grad, grad)
    assert_same_bits(dx[tail], dx_tail, f"backward N*V > 2^31, V={V}")
