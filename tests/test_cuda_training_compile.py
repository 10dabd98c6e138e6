"""The CUDA C training kernels (softmax backward, fused cross-entropy) without a GPU: both
translation units compile for sm_90 with no register spills and every kernel of the dispatch
table present, and for sm_80 without their cluster entry points; the table is consistent; the
slicing and the "owner" arithmetic (which thread holds a row's target column) replayed in Python
cover every element exactly once; the wrappers reject bad inputs before touching CUDA; the
float64 references match PyTorch's autograd.

Each nvcc build runs once per session (one test per source and architecture). Run with -s to
see the per-kernel ptxas report.
"""

import math
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import cuda_build as cb
from kernels import cuda_training as ct
from kernels import cuda_training_plans as tp
from kernels.checks import FLOAT_DTYPES
from kernels.reference import cross_entropy_ref, softmax_backward_ref
from tests.helpers import (
    assert_backward_close,
    assert_builds_clean,
    assert_cross_entropy_close,
    cross_entropy_expected,
    cross_entropy_inputs,
    dtype_id,
    slice_geometry,
    softmax_and_grad,
)

pytestmark = pytest.mark.cpu

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: the offline sm_90 build cannot run")
DTYPES = FLOAT_DTYPES
DTYPE_IDS = [dtype_id(dt) for dt in DTYPES]
SOURCE_IDS = [p.name for p in tp.TRAINING_SOURCES]
OPS = {tp.BACKWARD_SOURCE.name: "bwd", tp.CROSS_ENTROPY_SOURCE.name: "ce"}


# -- nvcc / ptxas --------------------------------------------------------------------------------


def _build(path, arch):
    # Spills are reported, not fatal: each kernel's is checked against its class's allowance.
    res = cb.compile_offline(path, nvcc=NVCC, arch=arch, source=tp.module_source(path), spills_fatal=False)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"nvcc failed for {path.name} on {arch}:\n{log[-6000:]}"
    return cb.parse_ptxas_report(log)


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("path", tp.TRAINING_SOURCES, ids=SOURCE_IDS)
def test_builds_for_sm90_without_spills(path):
    report = _build(path, cb.TARGET_ARCH)
    print(f"\n{path.name} ({cb.TARGET_ARCH}):\n{cb.format_ptxas_report(report)}")
    expected = tp.expected_kernels(path)
    assert_builds_clean(report, expected, path.name, spills=tp.spill_allowances(path))
    assert set(report) == set(expected), f"{path.name}: unexpected entry points {sorted(set(report) - set(expected))}"


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("path", tp.TRAINING_SOURCES, ids=SOURCE_IDS)
def test_builds_for_gpus_without_clusters(path):
    # Before sm_90 the cluster entry points (the loop's cluster ones too) are left out, and
    # select_training_class(clusters=False) never picks them: the sm_80 build holds every other size class.
    op = OPS[path.name]
    report = _build(path, "sm_80")
    built = set(report)
    assert_builds_clean(report, sorted(built), f"{path.name} (sm_80)", spills=tp.spill_allowances(path))
    helpers = set(tp.CROSS_ENTROPY_HELPERS) if op == "ce" else set()
    assert (
        built == {p.kernel_name(dt) for dt in DTYPES for p in tp.training_classes(op, dt) if p.cluster == 1} | helpers
    )
    for dt in DTYPES:
        for V in (1, 100, 600, 16384, 16385, 50257, 131072, 200000):
            assert tp.select_training_class(op, V, dt, clusters=False).kernel_name(dt) in built, (V, dt)


def test_every_planned_kernel_is_instantiated_once():
    for path in tp.TRAINING_SOURCES:
        op = OPS[path.name]
        src = tp.module_source(path)
        assert not re.search(r"^\s*#include", src, re.MULTILINE), f"{path.name}: a header was not inlined"
        names = [p.kernel_name(dt) for dt in DTYPES for p in tp.training_classes(op, dt)]
        assert len(names) == len(set(names)), f"{path.name}: two size classes share a kernel name"
        for name in names:
            assert src.count(f"({name},") == 1, f"{name} is not instantiated exactly once"


def test_expand_includes_rejects_a_missing_header(tmp_path):
    cu = tmp_path / "broken.cu"
    cu.write_text('#include "no_such_header.cuh"\n')
    with pytest.raises(RuntimeError, match="no_such_header"):
        tp.expand_includes(cu)


# -- the dispatch table --------------------------------------------------------------------------


@pytest.mark.parametrize("op", tp.OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_boundaries_are_the_plan_capacities(op, dtype):
    bounds = tp.boundaries(op, dtype)
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    assert set(bounds) <= set(tp.all_boundaries(op))
    for v in bounds:
        assert tp.select_training_class(op, v, dtype).capacity == v, v
        assert tp.select_training_class(op, v, dtype) != tp.select_training_class(op, v + 1, dtype), (
            f"no path change at V = {v}"
        )
    last = tp.select_training_class(op, bounds[-1] + 1, dtype)
    assert last.kind == "loop" and last.cluster == tp.LOOP_CLUSTER
    assert {p.kind for p in tp.training_classes(op, dtype)} == set(tp.PATHS)


@pytest.mark.parametrize("op", tp.OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("V", [1, 2, 31, 33, 129, 256, 257, 600, 1025, 4097, 16384, 16385, 50257, 131072, 262144])
def test_plan_holds_the_row(op, dtype, V):
    for clusters in (True, False):
        size_class = tp.select_training_class(op, V, dtype, clusters=clusters)
        assert clusters or size_class.cluster == 1
        if size_class.capacity is not None:
            assert V <= size_class.capacity
            assert -(-V // size_class.cluster) <= size_class.row_threads * size_class.elems  # each slice fits its CTA
        smaller = [b for b in tp.boundaries(op, dtype) if b < V]
        if smaller and size_class.kind != "loop" and clusters:
            assert tp.select_training_class(op, smaller[-1], dtype).capacity < V  # the first fit is taken


def test_packed_rows_only_for_16_bit_storage():
    for op in tp.OPS:
        assert not any(p.packed for p in tp.training_classes(op, torch.float32))
        packed = {p for dt in (torch.bfloat16, torch.float16) for p in tp.training_classes(op, dt) if p.packed}
        assert packed, "no packed 16-bit class"
        for p in packed:
            assert p.kind in ("row", "cluster")
            with pytest.raises(ValueError):
                p.instantiation(torch.float32)


def test_long_rows_without_clusters_use_one_block():
    for op in tp.OPS:
        for V in (16385, 50257, 131072, 262144):
            size_class = tp.select_training_class(op, V, clusters=False)
            assert size_class.kind == "loop" and size_class.cluster == 1
        assert tp.select_training_class(op, 50257).kind == "cluster"
        assert tp.select_training_class(op, 262144).kind == "loop" and tp.select_training_class(op, 262144).cluster == 8
        assert tp.select_training_class(op, 16384, clusters=False).kind == "row"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "bf16", "float16"])
def test_plan_names(dtype):
    assert tp.backward_class_description(4096, 100, dtype).startswith("warp(")
    assert tp.backward_class_description(8, 4096, dtype).startswith("row(cluster=1")
    assert tp.cross_entropy_class_description(8, 50257, dtype).startswith("cluster(cluster=")
    threads = 1024 if dtype in (torch.float32, "float32") else 512  # the loop's CTAs, by storage width
    assert tp.cross_entropy_class_description(2, 262144, dtype) == f"loop(cluster=8, threads={threads}, three passes)"
    assert tp.backward_class_description(0, 600, dtype).startswith("empty")
    assert tp.cross_entropy_path(4, 200, dtype) == "warpvec"
    assert tp.backward_path(4, 300000, dtype) == "loop"
    for B, V in ((1, 7), (64, 600), (3, 50257)):
        assert tp.backward_path(B, V, dtype) in tp.PATHS and tp.cross_entropy_path(B, V, dtype) in tp.PATHS


def test_plan_functions_reject_bad_arguments():
    with pytest.raises(TypeError, match="softmax backward: dtype torch.float64"):
        tp.backward_class_description(4, 8, torch.float64)
    with pytest.raises(TypeError, match="cross-entropy: dtype int8"):
        tp.cross_entropy_path(4, 8, "int8")
    with pytest.raises(ValueError):
        tp.cross_entropy_class_description(4, 0)


# -- the kernels' index arithmetic, replayed ----------------------------------------------------------
# ce_row_body / bwd_row_body: CTA `rank` of a cluster owns the slice [rank * chunk, ...), thread
# t holds body vectors t, t + NT, ... after a scalar head up to the first 16-byte boundary, and
# one tail element. The loop bodies walk vectors base + u * NT + t. The owner of column c is
#   l < head: l;  l >= tail0: l - tail0;  else ((l - head) / VEC) % NT   (l = c - slice start).


def _holders(size_class, V, row_offset, vec):
    """(rank, thread) holding each column as the kernel's loads place them (every column must
    be held exactly once: asserted here), and the owner formula's (rank, thread) per column."""
    C = size_class.cluster
    chunk = (-(-V // C) + 7) // 8 * 8 if C > 1 else V
    nt = size_class.row_threads
    cols, ranks, threads = [], [], []
    owner_rank = np.full(V, -1)
    owner_thread = np.full(V, -1)
    for rank in range(C):
        start = min(rank * chunk, V)
        length = min(V - start, chunk)
        head, nvec, tail0, tail = slice_geometry(row_offset + start, length, vec)
        assert head < vec and tail < vec and head <= nt and tail <= nt
        if size_class.kind != "loop":
            assert nvec <= (size_class.elems // vec) * nt, f"slice of {length} overflows {size_class}"
        vi = np.repeat(np.arange(nvec), vec)
        body = start + head + vi * vec + np.tile(np.arange(vec), nvec)
        ends = np.concatenate([np.arange(head), np.arange(tail)])
        cols += [body, start + np.arange(head), start + tail0 + np.arange(tail)]
        threads += [vi % nt, ends]
        ranks.append(np.full(len(body) + head + tail, rank))
        ll = np.arange(length)
        own = np.where(ll < head, ll, np.where(ll >= tail0, ll - tail0, ((ll - head) // vec) % nt))
        owner_rank[start : start + length] = rank
        owner_thread[start : start + length] = own
    cols, ranks, threads = np.concatenate(cols), np.concatenate(ranks), np.concatenate(threads)
    counts = np.bincount(cols, minlength=V)
    assert (counts == 1).all(), f"{size_class.describe()}: columns held {counts.min()} to {counts.max()} times"
    held_rank = np.empty(V, dtype=np.int64)
    held_thread = np.empty(V, dtype=np.int64)
    held_rank[cols] = ranks
    held_thread[cols] = threads
    return (held_rank, held_thread), (owner_rank, owner_thread)


@pytest.mark.parametrize("vec", [4, 8], ids=["fp32", "16-bit"])
def test_every_column_is_held_once_and_its_owner_holds_it(vec):
    dtype = torch.float32 if vec == 4 else torch.bfloat16
    Vs = sorted(
        {v + d for v in tp.all_boundaries("ce") if v > 128 for d in (-1, 0, 1)} | {300, 1000, 3001, 50257, 140001}
    )
    for op in tp.OPS:
        for V in Vs:
            for size_class in {
                tp.select_training_class(op, V, dtype),
                tp.select_training_class(op, V, dtype, clusters=False),
            }:
                if size_class.kind == "warp":
                    continue
                for offset in range(vec):  # every alignment a row can start at
                    (hr, ht), (orank, othread) = _holders(size_class, V, offset + 5 * V, vec)
                    wrong = np.flatnonzero((hr != orank) | (ht != othread))
                    assert not wrong.size, (
                        f"{op} V={V} {size_class.describe()} offset {offset}: "
                        f"owner formula wrong at columns {wrong[:5]}"
                    )


def test_short_slices_and_warp_rows():
    # Rows shorter than a vector or than the head; and the lane-strided warp rows, whose owner
    # of column t is lane t % 32, element t // 32 of it.
    for vec in (4, 8):
        for V in range(1, 3 * vec + 2):
            for offset in range(vec):
                (hr, ht), (orank, othread) = _holders(tp.TrainingClass("ce", "row", 64, 8), V, offset, vec)
                assert (ht == othread).all() and (hr == orank).all()
        cluster = tp.TrainingClass("ce", "cluster", 32, 8, 8)
        for V in (1, 7, 9, 63, 65, 200, 2047, 2048):
            for offset in range(vec):
                (hr, ht), (orank, othread) = _holders(cluster, V, offset, vec)
                assert (ht == othread).all() and (hr == orank).all()
    for V in (1, 5, 32, 33, 100, 128):
        size_class = tp.select_training_class("ce", V)
        assert size_class.kind == "warp" and V <= 32 * size_class.elems


# -- input checks that need no GPU -------------------------------------------------------------------


def _bwd(*args, **kw):
    return ct.softmax_backward_fused(*args, **kw)


def test_backward_rejects_bad_inputs():
    y = torch.rand(4, 8)
    with pytest.raises(TypeError, match="torch.Tensor"):
        _bwd([[1.0]], y)
    with pytest.raises(ValueError, match="2-D"):
        _bwd(y.flatten(), y.flatten())
    with pytest.raises(TypeError, match="float64"):
        _bwd(y.double(), y.double())
    with pytest.raises(ValueError, match="one shape"):
        _bwd(y, torch.rand(4, 9))
    with pytest.raises(TypeError, match="share a dtype"):
        _bwd(y, y.half())
    with pytest.raises(ValueError, match="V = 0"):
        _bwd(torch.empty(4, 0), torch.empty(4, 0))
    with pytest.raises(ValueError, match="out"):
        _bwd(y, y, out=torch.empty(4, 9))
    with pytest.raises(ValueError, match="contiguous"):
        _bwd(y, y, out=torch.empty(8, 4).t())
    with pytest.raises(ValueError, match="cuda"):
        _bwd(y, y)


def _ce(logits=None, target=None, **kw):
    logits = torch.randn(4, 10) if logits is None else logits
    target = torch.tensor([1, 2, 3, -100]) if target is None else target
    return ct.cross_entropy_fused(logits, target, **kw)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"logits": torch.randn(10)}, ValueError, "2-D"),
        ({"logits": torch.randn(4, 10, dtype=torch.float64)}, TypeError, "float64"),
        ({"logits": torch.empty(4, 0)}, ValueError, "V = 0"),
        ({"target": [1, 2, 3, 4]}, TypeError, "torch.Tensor"),
        ({"target": torch.tensor([1, 2, 3])}, ValueError, "one class index per row"),
        ({"target": torch.tensor([[1, 2, 3, 4]])}, ValueError, "1-D"),
        ({"target": torch.tensor([1.0, 2.0, 3.0, 4.0])}, TypeError, "int64"),
        ({"weight": torch.ones(9)}, ValueError, r"shape \(10,\)"),
        ({"weight": torch.ones(10, dtype=torch.int64)}, TypeError, "weight dtype"),
        ({"weight": [1.0] * 10}, TypeError, "weight must be"),
        ({"ignore_index": 1.5}, TypeError, "ignore_index"),
        ({"ignore_index": True}, TypeError, "ignore_index"),
        ({"label_smoothing": 1.5}, ValueError, r"\[0, 1\]"),
        ({"label_smoothing": -0.1}, ValueError, r"\[0, 1\]"),
        ({"label_smoothing": "0.1"}, TypeError, "label_smoothing"),
        ({"reduction": "avg"}, ValueError, "reduction"),
        ({"inplace": True, "out": torch.empty(4, 10)}, ValueError, "out must be None"),
        ({"inplace": True, "logits": torch.randn(10, 4).t()}, ValueError, "unit stride"),
        ({"inplace": True, "logits": torch.randn(4, 10, requires_grad=True)}, ValueError, "require grad"),
        ({"out": torch.empty(4, 11)}, ValueError, "out is"),
        ({"out": torch.empty(10, 4).t()}, ValueError, "unit stride"),
        ({}, ValueError, "cuda"),
    ],
)
def test_cross_entropy_rejects_bad_inputs(kwargs, error, match):
    with pytest.raises(error, match=match):
        _ce(**kwargs)


def test_target_error_is_a_value_error():
    assert issubclass(ct.TargetError, ValueError)


# -- the float64 references, against PyTorch's autograd in float64 ------------------------------------


def test_softmax_backward_ref_matches_autograd():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 37, generator=g, dtype=torch.float64) * 3
    x[1, ::4] = -math.inf
    dy = torch.randn(6, 37, generator=g, dtype=torch.float64)
    xr = x.clone().requires_grad_(True)
    y = torch.softmax(xr, -1)
    y.backward(dy)
    got = softmax_backward_ref(y=y.detach().numpy(), dy=dy.numpy())
    np.testing.assert_allclose(got, xr.grad.numpy(), rtol=1e-12, atol=1e-15)


def _torch_ce(x, t, weight, ignore_index, eps):
    xr = x.clone().requires_grad_(True)
    loss = F.cross_entropy(xr, t, weight=weight, ignore_index=ignore_index, label_smoothing=eps, reduction="none")
    loss.sum().backward()
    return loss.detach().numpy(), xr.grad.numpy()


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_cross_entropy_ref_matches_autograd(weighted, eps, ignore_index):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 7, generator=g, dtype=torch.float64) * 3
    x[0] = -math.inf  # a row of -inf: NaN everywhere but the ignored loss
    x[1, 3] = -math.inf  # -inf logits: infinite smoothing loss
    x[2, 4] = 1e30
    x[3, 5] = 40.0  # a confident row
    x[7, 1] = math.nan  # an ignored row holding a NaN: loss 0, gradient NaN throughout (PyTorch's)
    t = torch.tensor([-100, 2, 4, 5, 0, 6, 2, -100, 1])
    t[t == -100] = ignore_index
    w = torch.rand(7, generator=g, dtype=torch.float64) + 0.25 if weighted else None
    loss, lse, grad = cross_entropy_ref(
        x.numpy(),
        t.numpy(),
        weight=None if w is None else w.numpy(),
        ignore_index=ignore_index,
        label_smoothing=eps,
        reduction="none",
    )
    want_loss, want_grad = _torch_ce(x, t, w, ignore_index, eps)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, torch.logsumexp(x, -1).numpy(), rtol=1e-14)


def test_cross_entropy_ref_keeps_confident_digits_and_rejects_bad_targets():
    x = np.array([[30.0, 0.0, 0.0]])
    loss, _, grad = cross_entropy_ref(x, np.array([0]), reduction="none")
    tiny = 2 * math.exp(-30.0)
    assert loss[0] == pytest.approx(math.log1p(tiny), rel=1e-12)
    assert grad[0, 0] == pytest.approx(-tiny / (1 + tiny), rel=1e-12)
    with pytest.raises(ValueError, match="outside"):
        cross_entropy_ref(x, np.array([3]))
    with pytest.raises(ValueError, match="outside"):
        cross_entropy_ref(x, np.array([-1]))


# -- the comparisons the cuda tests use can fail ----------------------------------------------------
# A float64 result rounded once into the output dtype is what a perfect kernel would give: it
# passes. Each corruption below is a bug a kernel could have: it must be rejected.


def _rounded(a: np.ndarray, dtype) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_comparison_accepts_rounding_and_rejects_bugs(dtype):
    y, dy = softmax_and_grad(6, 301, seed=3, dtype=dtype)
    yd, dyd = y.double().numpy(), dy.double().numpy()
    ref = softmax_backward_ref(y=yd, dy=dyd)
    assert_backward_close(_rounded(ref, dtype), dy, y, what="rounded reference")
    lost = yd * (dyd - (yd * dyd)[:, :-1].sum(axis=1, keepdims=True))  # the sum misses the last element
    bugs = {
        "a term lost from the sum": lost,
        "no sum at all": yd * dyd,
        "one element not written": np.where(np.arange(301) == 17, np.nan, ref),
        "rows swapped": ref[[1, 0, 2, 3, 4, 5]],
    }
    for name, bad in bugs.items():
        with pytest.raises(AssertionError):
            assert_backward_close(_rounded(bad, dtype), dy, y, what=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_cross_entropy_comparison_accepts_rounding_and_rejects_bugs(dtype, reduction):
    x, t = cross_entropy_inputs(9, 301, seed=4, dtype=dtype, neg_inf=False)  # -inf would make the loss inf
    w = torch.rand(301, generator=torch.Generator().manual_seed(5)) + 0.5
    opts = {"weight": w, "label_smoothing": 0.1, "reduction": reduction}
    exp = cross_entropy_expected(x, t, **opts)
    good = (_rounded(exp["loss"], dtype), _rounded(exp["grad"], dtype), _rounded(exp["lse"], torch.float32))
    assert_cross_entropy_close(good, x, t, what="rounded reference", **opts)
    rows = np.arange(9)
    tt = t.numpy()
    valid = tt != -100
    no_target = exp["grad"].copy()
    no_target[rows[valid], tt[valid]] += (
        0.9 * w.numpy()[tt[valid]] / (1.0 if reduction == "none" else w.numpy()[tt[valid]].sum())
    )
    ignored_row = int(np.flatnonzero(~valid)[0])
    leaky = exp["grad"].copy()
    leaky[ignored_row] = exp["grad"][0]  # an ignored row given a gradient
    unscaled = exp["grad"] * (1.0 if reduction == "none" else w.numpy()[tt[valid]].sum())
    lse_bad = exp["lse"].copy()
    lse_bad[3] = x.double().numpy()[3].max()  # the max alone
    bugs = {
        "the target's -1 missing": (exp["loss"], no_target, exp["lse"]),
        "an ignored row's gradient": (exp["loss"], leaky, exp["lse"]),
        "a lost lse term": (exp["loss"], exp["grad"], lse_bad),
        "the loss 1e-3 off": (
            exp["loss"] * (1 + 1e-2 if dtype != torch.float32 else 1 + 1e-3),
            exp["grad"],
            exp["lse"],
        ),
    }
    if reduction == "mean":
        bugs["the mean's 1 / W missing"] = (exp["loss"], unscaled, exp["lse"])
    for name, (lo, gr, ls) in bugs.items():
        bad = (_rounded(lo, dtype), _rounded(gr, dtype), _rounded(ls, torch.float32))
        with pytest.raises(AssertionError):
            assert_cross_entropy_close(bad, x, t, what=name, **opts)
