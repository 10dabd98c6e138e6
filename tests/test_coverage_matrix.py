"""Every dispatch path of every registered kernel, under every input layout, in every dtype.

A cell is (kernel, path, layout, dtype): the paths come from the registry (`Kernel.paths`), the
layouts from tests.helpers.layouts (contiguous, rows with a stride > V, a storage offset in
every other 16-byte alignment class, elements strided within a row). The cuda cases reach each
path through the public entry at a shape the kernel's own `plan` sends there; the cpu cases run
the kernels that work under the Triton interpreter (Triton reaches each path with run_path and
scaled-down parameters). Each case records the cell it ran (tests/suite/coverage.py); the last
tests say which cells the session must run, and the session's end checks them against the cells
every process ran (xdist workers included), so a path added to a kernel fails the run until a
case covers it.
"""

import itertools

import pytest
import torch

from kernels import SOFTMAX_KERNELS
from kernels import softmax_cuda as sc
from kernels import softmax_triton as st
from tests.helpers import (
    SCALED_TRITON_PARAMS,
    bits,
    check_softmax,
    dtype_id,
    layouts,
    logits,
    needs_cupy,
    run_poisoned,
    skip_unless_runnable,
)
from tests.suite import coverage

WIDE_V = 16384  # rows longer than this are drawn wide-range (randn * 4): their sums are long
# Row lengths tried when looking for a shape that takes a path: odd sizes, and one either side
# of every boundary the kernels publish.
_BOUNDARIES = set(sc.DISPATCH_BOUNDARIES) | {v for k, v in st.DISPATCH_BOUNDARIES.items() if k.endswith("_v")}
V_CANDIDATES = sorted(
    {7, 33, 100, 600, 781, 1025, 2049, 5000, 20001, 50257, 140001} | {v + d for v in _BOUNDARIES for d in (-1, 1)}
)
B_CANDIDATES = sorted({5} | {b + 1 for k, b in st.DISPATCH_BOUNDARIES.items() if k.endswith("_b")})
CPU_SHAPE = (3, 37)  # the rows path's block of 4 rows is partly masked; 37 spans several scaled tiles and chunks


def cells(kernels, *, dispatched=True) -> set:
    """Every (kernel, path, layout, dtype): paths as the dispatch takes them for each dtype, or
    (dispatched=False) every path in every dtype, as run_path reaches them."""
    return {
        (k.name, path, layout, dtype_id(dtype))
        for k in kernels
        for dtype in k.dtypes
        for path in (k.paths_for(dtype) if dispatched else k.paths)
        for layout in layouts(dtype)
    }


missing_cells = coverage.missing_cells


def shape_for(kernel, path, dtype):
    """The smallest (B, V) of the candidates that `kernel.plan` sends down `path` (rows of at
    least 100 first, long enough for vector accesses and their head / tail peel), or None."""
    candidates = itertools.product(B_CANDIDATES, V_CANDIDATES)
    for B, V in sorted(candidates, key=lambda s: (s[1] < 100, s[0] * s[1], s)):
        if kernel.plan(B, V, dtype) == path:
            return B, V
    return None


def _cuda_cases():
    cases = []
    for k in SOFTMAX_KERNELS.values():
        for dtype in k.dtypes:
            for path in k.paths_for(dtype):
                shape = shape_for(k, path, dtype)
                if shape is None:
                    continue  # test_every_cell_has_a_case names it
                for layout in layouts(dtype):
                    cases.append(
                        pytest.param(
                            k.name,
                            path,
                            layout,
                            dtype,
                            *shape,
                            id=f"{k.name}-{path}-{layout}-{dtype_id(dtype)}-B{shape[0]}-V{shape[1]}",
                        )
                    )
    return cases


def _cpu_cases():
    return [
        pytest.param(k.name, path, layout, dtype, id=f"{k.name}-{path}-{layout}-{dtype_id(dtype)}")
        for k in SOFTMAX_KERNELS.values()
        if k.interpretable
        for path in k.paths
        for dtype in k.dtypes
        for layout in layouts(dtype)
    ]


CUDA_CASES = _cuda_cases()
CPU_CASES = _cpu_cases()


def seed_of(*parts) -> int:
    # A seed from the cell's names, the same in every process (str hashes are salted per process).
    return sum((i + 1) * ord(c) for i, c in enumerate("/".join(map(str, parts))))


# -- the cases ---------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("kernel, path, layout, dtype, B, V", CUDA_CASES)
def test_cuda_path_under_layout(request, kernel, path, layout, dtype, B, V):
    k = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(k)
    assert k.plan(B, V, dtype) == path
    x = logits(
        B,
        V,
        seed=seed_of(kernel, path, layout, dtype),
        dtype=dtype,
        device="cuda",
        layout=layout,
        scale=4.0 if V > WIDE_V else 3.0,
    )
    out = run_poisoned(k, x)
    coverage.record_cell(request.node, "cuda", (kernel, path, layout, dtype_id(dtype)))
    what = f"{kernel} via {path}, {layout}, ({B}, {V})"
    check_softmax(out, x, what=what)


@pytest.mark.cpu
@pytest.mark.skipif(not st.INTERPRET, reason="the kernels run on CPU tensors only under the Triton interpreter")
@pytest.mark.parametrize("kernel, path, layout, dtype", CPU_CASES)
def test_cpu_path_under_layout(request, kernel, path, layout, dtype):
    k = SOFTMAX_KERNELS[kernel]
    B, V = CPU_SHAPE
    x = logits(B, V, seed=seed_of(kernel, path, layout, dtype), dtype=dtype, layout=layout)
    if kernel == "triton":

        def fn(x, *, out):
            return st.run_path(x, path, out=out, **SCALED_TRITON_PARAMS[path])
    else:
        assert k.plan(B, V, dtype) == path
        fn = k
    out = run_poisoned(fn, x)
    coverage.record_cell(request.node, "cpu", (kernel, path, layout, dtype_id(dtype)))
    what = f"{kernel} via {path}, {layout}"
    check_softmax(out, x, what=what)
    if kernel == "triton":
        # The kernels' sums are order-free: a row's bits depend on its values and V alone, not
        # on the path or the layout.
        expected = st.run_path(x.contiguous(), "tile")
        assert torch.equal(bits(out), bits(expected)), f"{what}: bits differ from the tile path on a contiguous copy"


# -- the matrix is complete --------------------------------------------------------------------------


@pytest.mark.cpu
def test_every_cell_has_a_case():
    cuda_cells = {(c.values[0], c.values[1], c.values[2], dtype_id(c.values[3])) for c in CUDA_CASES}
    gaps = missing_cells(cells(SOFTMAX_KERNELS.values()), cuda_cells)
    assert not gaps, f"cells no cuda case covers (no candidate shape takes the path?):{gaps}"
    cpu_cells = {(c.values[0], c.values[1], c.values[2], dtype_id(c.values[3])) for c in CPU_CASES}
    gaps = missing_cells(cells((k for k in SOFTMAX_KERNELS.values() if k.interpretable), dispatched=False), cpu_cells)
    assert not gaps, f"cells no cpu case covers:{gaps}"


@pytest.mark.cpu
def test_a_missing_cell_is_named():
    expected = cells(SOFTMAX_KERNELS.values())
    dropped = ("fused", "loop", "offset:3", "bf16")
    assert dropped in expected
    assert missing_cells(expected, expected) == ""
    assert missing_cells(expected, expected - {dropped}) == "\n  fused / loop / offset:3 / bf16"


# -- every expected cell ran: declared here, checked at the session's end (tests/suite/coverage.py) --


def expected_cells(platform: str) -> set:
    """The cells a run of the whole matrix must run on `platform`: on the CPU every path of the
    interpretable kernels; on a GPU every dispatched path, less the kernels whose backend this
    machine lacks (their cases skip with that reason)."""
    if platform == "cpu":
        return cells((k for k in SOFTMAX_KERNELS.values() if k.interpretable), dispatched=False)
    from tests.suite.gpus import cupy_unusable_reason

    return cells(k for k in SOFTMAX_KERNELS.values() if not (needs_cupy(k) and cupy_unusable_reason()))


def _expect_every_cell(request, platform, case_name):
    """Where this run selected the whole matrix, tell the session which cells must run; the
    selected cases must hold each of them."""
    cases = CPU_CASES if platform == "cpu" else CUDA_CASES
    selected = [item for item in request.session.items if getattr(item, "originalname", None) == case_name]
    if len(selected) != len(cases):
        pytest.skip("only part of the matrix was selected in this run")
    expected = expected_cells(platform)
    coverage.expect(request.node, platform, expected)
    params = (item.callspec.params for item in selected)
    selected_cells = {(p["kernel"], p["path"], p["layout"], dtype_id(p["dtype"])) for p in params}
    gaps = missing_cells(expected, selected_cells)
    assert not gaps, f"cells no selected {platform} case runs:{gaps}"


@pytest.mark.cpu
@pytest.mark.skipif(not st.INTERPRET, reason="the kernels run on CPU tensors only under the Triton interpreter")
def test_every_cpu_cell_ran(request):
    _expect_every_cell(request, "cpu", "test_cpu_path_under_layout")


@pytest.mark.cuda
@pytest.mark.quick
def test_every_cuda_cell_ran(request):
    _expect_every_cell(request, "cuda", "test_cuda_path_under_layout")
