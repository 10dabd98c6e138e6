"""Every kernel of the registry against the float64 NumPy reference and against each other.

The contract: within tests.helpers.TOLERANCES of the reference (every output: fp32 a few ulps
plus half an ulp per nat of distance from the row's max, 16-bit storage one ulp of the stored
value; every row summing to 1; log-probabilities in nats) and so of each other, and no less
accurate than F.softmax on the same input, on fresh random inputs with outliers, into outputs
poisoned with NaN. Kernel-specific dispatch boundaries are tested beside each kernel
(test_cuda_kernels.py, test_triton_*.py), every path under every layout in
test_coverage_matrix.py, the inputs that exercise the tail in test_accuracy.py; this file holds
what all kernels share.
"""

import itertools
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import SOFTMAX_KERNELS, SUPPORTED_DTYPES
from kernels.reference import softmax_ref
from kernels.registry import EXTRA_KERNELS_ENV, KernelSpec, build, extra_specs
from kernels.spec import BASELINE, LAB_SHAPES, SPECS, Path
from tests.helpers import (
    accuracy_gated,
    assert_as_accurate_as_torch,
    assert_outputs_agree,
    assert_rows_sum_to_one,
    bits,
    check_softmax,
    cpu_path_runner,
    dtype_id,
    logits,
    on_each_device,
    row_sum_tolerance,
    run_poisoned,
    skip_if_unavailable,
    skip_unless_runnable,
    skip_unless_runs_on,
)

KERNELS = list(SOFTMAX_KERNELS)
LAB_SHAPES = list(LAB_SHAPES)
IRREGULAR_SHAPES = [(1, 1), (3, 7), (1, 255), (64, 781), (7, 1025), (5, 2049), (3, 5000), (2, 50257), (2, 128256)]
LONG_ROWS = (50257, 128256)
# randn * 4 with outliers and -inf, four rows: the odd rows' mass is spread over many entries.
WIDE_SCALE = 4.0


def kernel_dtype_cases(*, only_ours=False):
    return [
        pytest.param(name, dtype, id=f"{name}-{dtype_id(dtype)}")
        for name, k in SOFTMAX_KERNELS.items()
        for dtype in k.dtypes
        if not (only_ours and k.baseline)
    ]


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
        np.testing.assert_allclose(
            softmax_ref(x)[[0, 2, 3]], F.softmax(torch.tensor(x), -1).numpy()[[0, 2, 3]], rtol=1e-15
        )
        assert softmax_ref(x)[0, 1] == 0.0
        np.testing.assert_array_equal(softmax_ref(np.zeros((0, 4))).shape, (0, 4))

    def test_is_float64_accurate_where_float32_is_not(self):
        # A row of a million nearly equal logits: a float32 sum loses the last digits.
        x = np.full((1, 1_000_000), 0.25) + np.linspace(0, 1e-3, 1_000_000)
        np.testing.assert_allclose(softmax_ref(x).sum(), 1.0, rtol=1e-12)


@pytest.mark.cpu
def test_registry_is_the_specs_and_nothing_else():
    """The registry holds exactly the kernels of kernels/spec.py, then those the environment
    adds (SOFTMAX_SUITE_EXTRA_KERNELS), each built from its own spec, by op: one registry for
    the three ops, whose views are the softmax, backward and cross-entropy dicts."""
    specs = (*SPECS, *extra_specs(os.environ.get(EXTRA_KERNELS_ENV)))
    assert set(kernels.REGISTRY) == set(kernels.OPS)
    for op, view in (
        ("softmax", SOFTMAX_KERNELS),
        ("softmax_backward", kernels.SOFTMAX_BACKWARD_KERNELS),
        ("cross_entropy", kernels.CROSS_ENTROPY_KERNELS),
    ):
        assert kernels.REGISTRY[op] is view
        assert [k.spec for k in view.values()] == [s for s in specs if s.op == op], op
        assert all(k.op == op for k in view.values())
    assert kernels.BASELINE == BASELINE and SOFTMAX_KERNELS[BASELINE].baseline
    assert kernels.OUR_KERNELS == tuple(s.name for s in specs if s.op == "softmax" and not s.baseline)


@pytest.mark.cpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_is_uniform(kernel):
    k = SOFTMAX_KERNELS[kernel]
    assert k.name == kernel and callable(k)
    assert SUPPORTED_DTYPES[kernel] == k.dtypes and torch.float32 in k.dtypes
    assert k.paths == tuple(p.name for p in k.spec.paths) and len(set(k.paths)) == len(k.paths)
    if k.spec.lab_gate:
        assert k.spec.lab_gate[0] in SOFTMAX_KERNELS, f"{kernel}'s lab gate names an unknown kernel"
    skip_if_unavailable(k)
    for dtype in k.dtypes:
        assert set(k.paths_for(dtype)) <= set(k.paths), dtype
        for B, V in LAB_SHAPES + IRREGULAR_SHAPES:
            assert k.plan(B, V, dtype) in k.paths_for(dtype), (B, V, dtype)


@pytest.mark.cpu
def test_extra_kernels_are_named_module_and_attribute(tmp_path, monkeypatch):
    """The environment's kernels: 'module:attr' of a KernelSpec or a sequence of them; anything
    else is an error that names the entry."""
    (tmp_path / "extra_softmax_specs.py").write_text(
        "from kernels.spec import KernelSpec, Path\n"
        "ONE = KernelSpec('extra_one', 'kernels.baselines:torch_softmax', (Path('torch', gpu=(5, 100)),))\n"
        "TWO = [KernelSpec(f'extra_{i}', 'kernels.baselines:torch_softmax', (Path('torch', gpu=(5, 100)),))"
        " for i in (2, 3)]\n"
        "NOT_A_SPEC = 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = extra_specs(" extra_softmax_specs:ONE, extra_softmax_specs:TWO,")
    assert [s.name for s in found] == ["extra_one", "extra_2", "extra_3"]
    registry = build((*SPECS, *found))["softmax"]
    assert list(registry)[-3:] == ["extra_one", "extra_2", "extra_3"]
    x = logits(3, 50, seed=3)
    check_softmax(run_poisoned(registry["extra_2"], x), x)
    assert extra_specs("") == [] and extra_specs(None) == []
    with pytest.raises(TypeError, match="NOT_A_SPEC"):
        extra_specs("extra_softmax_specs:NOT_A_SPEC")
    with pytest.raises(ImportError, match="no_such_module_here"):
        extra_specs("no_such_module_here:SPEC")
    with pytest.raises(ImportError, match="extra_softmax_specs:MISSING"):
        extra_specs("extra_softmax_specs:MISSING")
    with pytest.raises(ImportError, match="not 'package.module:attribute'"):
        extra_specs("extra_softmax_specs")
    with pytest.raises(ValueError, match="registered twice"):
        build((*SPECS, found[0], found[0]))


@pytest.mark.cpu
@pytest.mark.parametrize(
    "bad, message",
    [
        ({"name": "two words"}, "identifier"),
        ({"paths": ()}, "paths"),
        ({"paths": (Path("a", gpu=(1, 1)), Path("a", gpu=(1, 1)))}, "distinct"),
        ({"dtypes": ("float64",)}, "dtypes"),
        ({"backend": "opencl"}, "backend"),
        ({"grids": ("everything",)}, "grids"),
        ({"paths": (Path("a", gpu=(1, 1)), Path("b", gpu=(1, 2)))}, "plan"),
        (
            {"paths": (Path("a", gpu=(1, 1)), Path("b", gpu=(1, 2))), "plan": "m:p", "interpretable": True},
            "run_path",
        ),
        ({"tolerances": {"fp32": (1e-6, 1e-4)}}, "tolerances"),
        ({"paths": (Path("a", gpu=(1, 1), dtypes=("bfloat16",)),)}, "path's dtypes"),
        ({"paths": ("a",)}, "Path"),
        ({"op": "layernorm"}, "op must be one of"),
        ({"op": "cross_entropy"}, "softmax facts"),  # the default grids time a softmax
        ({"op": "softmax_backward", "grids": (), "custom_op": True}, "softmax facts"),
    ],
)
def test_a_spec_that_cannot_be_verified_is_refused(bad, message):
    fields = {"name": "k", "fn": "m:f", "paths": (Path("a", gpu=(1, 1)),), **bad}
    with pytest.raises(ValueError, match=message):
        KernelSpec(**fields)


@on_each_device
@pytest.mark.parametrize("kernel", KERNELS)
def test_an_out_sharing_memory_with_the_input_is_refused(kernel, device):
    """Where a row's programs meet, one whose meeting runs out of time re-reads the row whole,
    after siblings may have written their part of out: over the input, a silent wrong answer.
    So out gets memory of its own, refused before anything is written; the next rows of the
    same storage are fine."""
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runs_on(k, device)
    buf = torch.randn(9, 40, device=device)
    x = buf[:4]
    check_softmax(k(x, out=buf[4:8]), x, what=f"{kernel} out beside x")
    before = buf.clone()
    for out in (x, buf[1:5]):  # the input itself; rows over three of its four
        with pytest.raises(ValueError, match="out shares memory with the input"):
            k(x, out=out)
        assert torch.equal(buf, before), f"{kernel} wrote before refusing"


@pytest.mark.cpu
@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda: torch.randn(8), ValueError, "2-D"),
        (lambda: torch.randn(2, 3, 4), ValueError, "2-D"),
        (lambda: torch.randn(2, 3, dtype=torch.float64), TypeError, "float64"),
        (lambda: torch.ones(2, 3, dtype=torch.int64), TypeError, "int64"),
        (lambda: torch.randn(2, 0), ValueError, "V = 0"),
        (lambda: [[1.0, 2.0]], TypeError, "torch.Tensor"),
    ],
    ids=["1d", "3d", "float64", "int64", "empty-row", "list"],
)
@pytest.mark.parametrize("kernel", KERNELS)
def test_bad_input_is_rejected_before_any_kernel_runs(kernel, bad, error, message):
    # Shape and dtype are checked before the device, so these need no GPU.
    skip_if_unavailable(SOFTMAX_KERNELS[kernel])
    with pytest.raises(error, match=message):
        SOFTMAX_KERNELS[kernel](bad())


@pytest.mark.cpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_an_output_on_another_device_is_rejected(kernel):
    # Checked before the device is touched: x on the CPU, out on the meta device (or, for the
    # CUDA-only kernels, the device check of x names "cuda" first).
    k = SOFTMAX_KERNELS[kernel]
    skip_if_unavailable(k)
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="out|cuda"):
        k(x, out=torch.empty(4, 10, device="meta"))


@pytest.mark.cpu
@pytest.mark.parametrize("kernel", [k for k in KERNELS if not SOFTMAX_KERNELS[k].baseline])
def test_an_input_on_another_device_is_rejected(kernel):
    # Ours check the input's device before reading it: a tensor on the meta device (no data) is
    # a ValueError naming the device it must be on, not a crash in a copy or a launch.
    k = SOFTMAX_KERNELS[kernel]
    skip_if_unavailable(k)
    with pytest.raises(ValueError, match="cpu|cuda"):
        k(torch.empty(2, 3, device="meta"))


@pytest.mark.cpu
def test_baseline_entry_on_cpu_writes_into_out():
    x = logits(3, 781, seed=1)
    out = run_poisoned(SOFTMAX_KERNELS[BASELINE], x)
    check_softmax(out, x)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES[BASELINE], ids=dtype_id)
@pytest.mark.parametrize("V", LONG_ROWS)
def test_long_rows_sum_to_one_on_cpu(V, dtype):
    x = logits(4, V, seed=V, dtype=dtype, scale=WIDE_SCALE)
    out = run_poisoned(SOFTMAX_KERNELS[BASELINE], x)
    check_softmax(out, x, what=f"{BASELINE} V={V}")


@pytest.mark.cpu
@pytest.mark.parametrize("V", LONG_ROWS)
def test_row_sum_check_catches_a_sequential_float32_sum(V):
    """The check the long-row cases rely on must fail a kernel that adds a row's exponentials
    one at a time in fp32 (the drift that once hid in naive): modelled here with NumPy on the
    very inputs those cases use, whose spread rows move the sum by several tolerances."""
    x = logits(4, V, seed=V, scale=WIDE_SCALE).numpy()
    e = np.exp(x - x.max(axis=1, keepdims=True)).astype(np.float32)
    s = np.add.accumulate(e, axis=1, dtype=np.float32)[:, -1:]  # strictly left to right
    sequential = torch.from_numpy(e * (np.float32(1) / s))
    drift = (sequential.double().sum(dim=1) - 1).abs().max().item()
    assert drift > 2 * row_sum_tolerance(V), f"drift {drift:.3g} is too close to the tolerance to be a test"
    with pytest.raises(AssertionError, match="do not sum to 1"):
        assert_rows_sum_to_one(sequential)
    # The same values summed pairwise (NumPy's float32 sum) pass: the check is not just tight.
    pairwise = torch.from_numpy(e * (np.float32(1) / e.sum(axis=1, keepdims=True, dtype=np.float32)))
    assert_rows_sum_to_one(pairwise)


# -- on the GPU: every kernel, every shape -----------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("B, V", LAB_SHAPES + IRREGULAR_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_reference(kernel, B, V):
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    x = logits(B, V, seed=B * 7919 + V, device="cuda")
    out = run_poisoned(k, x)
    what = f"{kernel} at ({B}, {V}) via {k.plan(B, V, x.dtype)}"
    check_softmax(out, x, what=what, kernel=k)


@pytest.mark.cuda
@pytest.mark.parametrize("V", LONG_ROWS)
@pytest.mark.parametrize("kernel, dtype", kernel_dtype_cases())
def test_long_wide_range_rows_sum_to_one(kernel, dtype, V):
    # Rows whose mass is spread over thousands of entries: an inexact sum over a long row
    # shows as a drift of every row's total (see test_row_sum_check_catches_a_sequential_float32_sum).
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    x = logits(4, V, seed=V, dtype=dtype, device="cuda", scale=WIDE_SCALE)
    out = run_poisoned(k, x)
    what = f"{kernel} V={V} via {k.plan(4, V, dtype)}"
    check_softmax(out, x, what=what, kernel=k)


@pytest.mark.cuda
@pytest.mark.parametrize("B, V", LAB_SHAPES + [(3, 7), (64, 781), (5, 2049), (2, 50257)], ids=lambda v: str(v))
def test_kernels_agree_with_each_other(B, V):
    gated = [kernel for kernel in KERNELS if accuracy_gated(SOFTMAX_KERNELS[kernel])]
    for kernel in gated:
        skip_unless_runnable(SOFTMAX_KERNELS[kernel])
    x = logits(B, V, seed=B + V, device="cuda")
    outputs = {kernel: run_poisoned(SOFTMAX_KERNELS[kernel], x) for kernel in gated}
    for a, b in itertools.combinations(gated, 2):
        assert_outputs_agree(outputs[a], outputs[b], x, what=f"{a} vs {b}")


@pytest.mark.cuda
@pytest.mark.parametrize("kernel, dtype", kernel_dtype_cases(only_ours=True))
def test_error_is_no_worse_than_torch(kernel, dtype):
    """Judged against the reference's own error as well as TOLERANCES' bound: the kernel's
    largest error may be at most k times that of F.softmax in the same dtype on the same input
    (tests/helpers/comparisons.py: the ratio rule; test_accuracy.py runs it on the tail inputs)."""
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    x = logits(64, 4099, seed=4099, device="cuda", dtype=dtype)
    assert_as_accurate_as_torch(run_poisoned(k, x), x, what=f"{kernel} (64, 4099)", kernel=k)


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("kernel", KERNELS)
class TestEdges:
    def test_empty_batch(self, kernel):
        skip_unless_runnable(SOFTMAX_KERNELS[kernel])
        out = SOFTMAX_KERNELS[kernel](torch.empty(0, 600, device="cuda"))
        assert out.shape == (0, 600) and out.is_cuda

    def test_single_column_gives_ones(self, kernel):
        skip_unless_runnable(SOFTMAX_KERNELS[kernel])
        x = logits(70, 1, seed=70, device="cuda", scale=100.0)
        assert torch.equal(run_poisoned(SOFTMAX_KERNELS[kernel], x), torch.ones_like(x))

    def test_infinities_and_huge_magnitudes_like_torch(self, kernel):
        skip_unless_runnable(SOFTMAX_KERNELS[kernel])
        x = logits(6, 781, seed=6, device="cuda", neg_inf=False, neg_inf_rows=[1])  # row 1: NaN, as F.softmax
        x[0, ::3] = float("-inf")  # -inf entries: probability 0
        x[2, :5] = 1e30  # huge magnitudes must not overflow
        x[3, :5] = -1e30
        x[4, 7] = 1e30
        out = run_poisoned(SOFTMAX_KERNELS[kernel], x)
        assert torch.isnan(F.softmax(x, dim=-1)[1]).all()
        gated = accuracy_gated(SOFTMAX_KERNELS[kernel])
        check_softmax(out, x, what=f"{kernel} with ±inf and ±1e30", gated=gated)  # NaN exactly in row 1
        assert (out[0, ::3] == 0).all()

    def test_wrong_device_and_bad_out_are_rejected(self, kernel):
        k = SOFTMAX_KERNELS[kernel]
        skip_unless_runnable(k)
        if kernel != kernels.BASELINE:  # F.softmax runs on any device
            with pytest.raises(ValueError, match="cuda"):
                k(torch.randn(4, 10))
        x = torch.randn(4, 10, device="cuda")
        with pytest.raises(ValueError, match="out"):
            k(x, out=torch.empty(4, 11, device="cuda"))
        with pytest.raises(ValueError, match="out"):
            k(x, out=torch.empty(10, 4, device="cuda").t())
        # An output of the right shape and dtype on another device: never a silent copy or a
        # write through a foreign pointer.
        others = ["cpu"] + [f"cuda:{i}" for i in range(1, torch.cuda.device_count())]
        for device in others:
            with pytest.raises(ValueError, match="out"):
                k(x, out=torch.empty(4, 10, device=device))

    def test_non_contiguous_input(self, kernel):
        skip_unless_runnable(SOFTMAX_KERNELS[kernel])
        wide = logits(32, 1601, seed=32, device="cuda")
        x = wide[:, 1:782]  # rows start misaligned and are strided
        assert not x.is_contiguous()
        k = SOFTMAX_KERNELS[kernel]
        check_softmax(run_poisoned(k, x), x, what=f"{kernel} on a strided view", kernel=k)


@pytest.mark.cpu
def test_inputs_are_reproducible_and_owned_by_the_caller():
    """`logits` keeps its host draws for reuse: the same arguments give the same values in every
    layout and dtype, and a caller that writes into its tensor changes no later call's input."""
    from tests.helpers import logits

    first = logits(6, 70, seed=11, dtype=torch.float64)
    want = first.clone()
    first.fill_(0.0)
    again = logits(6, 70, seed=11, dtype=torch.float64)
    assert torch.equal(again, want) and again.data_ptr() != first.data_ptr()
    strided = logits(6, 70, seed=11, dtype=torch.float64, layout="col_stride")
    assert not strided.is_contiguous() and torch.equal(strided, want)
    assert torch.equal(logits(6, 70, seed=11, dtype=torch.bfloat16), want.to(torch.bfloat16))
    assert not torch.equal(logits(6, 70, seed=12, dtype=torch.float64), want)


# -- a NaN or +inf inside a row ----------------------------------------------------------------------

# F.softmax (and the reference) give a row holding a NaN, or a +inf (inf - inf), NaN throughout.
# A max that skips NaN (tl.max, fmaxf) or a sum that cannot carry one (an integer sum) gives NaN
# at that entry alone and finite values beside it: a silent wrong answer. Every path of every
# kernel is held to it, the NaN and +inf placed late in a row (another tile, chunk or program
# than the row's start).


def _nan_row_cases(where):
    return [
        pytest.param(name, path, id=f"{name}-{path}")
        for name, k in SOFTMAX_KERNELS.items()
        if where == "cuda" or k.interpretable
        for path in (k.paths if where == "cuda" else k.interpreted_paths)
    ]


def _check_nan_rows(kernel, path, x, run):
    B, V = x.shape
    nan_row, inf_row = (B - 2, B - 1)
    x[nan_row, V // 2 + 1] = float("nan")
    x[inf_row, V - 1] = float("inf")
    assert torch.isnan(F.softmax(x.float(), dim=-1)[nan_row:]).all(), "F.softmax's own convention"
    out = run_poisoned(run, x)
    what = f"{kernel} via {path}, ({B}, {V}) {dtype_id(x.dtype)}"
    assert torch.isnan(out[nan_row]).all(), f"{what}: a row holding a NaN must be NaN throughout"
    assert torch.isnan(out[inf_row]).all(), f"{what}: a row holding a +inf must be NaN throughout"
    assert not torch.isnan(out[:nan_row]).any(), f"{what}: the other rows must stay numbers"


@pytest.mark.cpu
@pytest.mark.parametrize("kernel, path", _nan_row_cases("cpu"))
def test_broadcast_rows_and_columns(kernel, path):
    # Inputs with a stride of 0: one value across a row (expanded columns) and one row across the
    # batch (expanded rows). Each row is right, and every copy of a row has the row's own bits.
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    run = cpu_path_runner(k, path)
    for dtype in k.dtypes:
        columns = logits(4, 1, seed=5, dtype=dtype, neg_inf=False).expand(4, 37)
        out = run_poisoned(run, columns)
        check_softmax(out, columns.contiguous(), what=f"{kernel} via {path}, expanded columns")
        row = logits(1, 37, seed=6, dtype=dtype, neg_inf=False)
        out = run_poisoned(run, row.expand(5, 37))
        alone = run_poisoned(run, row)
        assert torch.equal(bits(out), bits(alone.expand(5, 37))), f"{kernel} via {path}: expanded rows differ"


@pytest.mark.cpu
@pytest.mark.parametrize("kernel, path", _nan_row_cases("cpu"))
def test_a_row_holding_a_nan_or_inf_is_nan_like_torch_cpu(kernel, path):
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    for dtype in k.dtypes:
        x = logits(4, 37, seed=7, dtype=dtype, neg_inf=False)
        _check_nan_rows(kernel, path, x, cpu_path_runner(k, path))


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("kernel, path", _nan_row_cases("cuda"))
def test_a_row_holding_a_nan_or_inf_is_nan_like_torch(kernel, path):
    """At the path's own GPU shape, in the first dtype whose dispatch takes it."""
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    dtype = next(d for d in k.dtypes if path in k.paths_for(d))
    B, V = k.path(path).gpu
    B = max(B, 3)
    assert k.plan(B, V, dtype) == path, f"({B}, {V}) does not reach {kernel}'s {path}"
    x = logits(B, V, seed=7, device="cuda", dtype=dtype, neg_inf=False)
    _check_nan_rows(kernel, path, x, k)


@pytest.mark.cpu
def test_compiled_baselines_compile_each_shape_for_itself():
    """The torch.compile baselines time what a fixed-shape program runs: every shape compiled
    for itself (Dynamo's defaults compile a size-generic graph from the second shape on), and
    room for the suite's shapes (past Dynamo's default limit of 8 the function runs eagerly)."""
    import torch._dynamo

    from kernels.baselines import RECOMPILE_LIMIT, static_compile

    graphs = []

    def backend(gm, example_inputs):
        graphs.append([tuple(t.shape) for t in example_inputs])
        return gm.forward

    softmax = static_compile(lambda x: F.softmax(x, dim=-1), backend=backend)
    shapes = [(2, 3), (2, 5), (4, 5)]
    for shape in shapes:
        x = torch.randn(shape)
        torch.testing.assert_close(softmax(x), F.softmax(x, dim=-1), rtol=0, atol=0)
    assert graphs == [[shape] for shape in shapes], graphs
    assert all(isinstance(n, int) for seen in graphs for shape in seen for n in shape), graphs
    config = torch._dynamo.config
    assert min(config.recompile_limit, config.accumulated_recompile_limit) >= RECOMPILE_LIMIT
