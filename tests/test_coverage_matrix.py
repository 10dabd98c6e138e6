"""Every dispatch path of every registered kernel, under every input layout, in every dtype:
the registry-wide verification, one hook for every kernel.

A cell is (kernel, path, layout, dtype): the paths come from the registry (`Kernel.paths`), the
layouts from tests.helpers.layouts (contiguous, rows with a stride > V, a storage offset in
every other 16-byte alignment class, elements strided within a row).

cuda: each path through the public entry at the (B, V) its spec gives (`Path.gpu`, which the
      kernel's own `plan` must send down that path), under every layout.
cpu:  every kernel that runs under the Triton interpreter (`interpretable`), each path forced
      through `Kernel.run_path` with the launch parameters its spec scales down for the CPU
      (`Path.cpu`), at rows of CPU_V elements (odd and even, several tiles long), under every
      layout and dtype: the full contract (values against the float64 reference, NaN exactly in
      all -inf rows, row sums) and, for kernels of ours, the bits of the first path on a
      contiguous copy (a row's bits depend only on its values and V: not on the path or the
      layout). Per path and dtype also: a row's bits alone and in a
      batch, and the edges (±1e30, -inf entries, an all -inf row); per kernel and dtype the
      public entry at long rows (LONG_CPU_V) and at V = 1.

Each cell case records the cell it ran (tests/suite/coverage.py); the last tests say which cells
the session must run, and the session's end checks them against the cells every process ran
(xdist workers included), so a path added to a kernel fails the run until a case covers it.
Kernels of ours that no CPU case can run are named in the terminal summary of a cpu run
("verified on CUDA only").
"""

import pytest
import torch

from kernels import SOFTMAX_KERNELS
from tests.helpers import (
    INTERPRETED,
    assert_same_bits,
    bits,
    check_softmax,
    cpu_path_runner,
    dtype_id,
    layouts,
    logits,
    needs_cupy,
    run_poisoned,
    skip_if_unavailable,
    skip_unless_runnable,
)
from tests.suite import coverage

WIDE_V = 16384  # rows longer than this are drawn wide-range (randn * 4): their sums are long
# The CPU rows: odd and even, each several tiles, chunks or programs long at the scaled-down
# launch parameters of every path (tiles of 16). The interpreter runs a launch's programs one
# after another in Python, so its cost grows with B and the tiles per row.
CPU_B = 3
CPU_V = (37, 64)
# The public entry at its own launch parameters: rows several of its GPU tiles long.
LONG_CPU_V = (1030, 2049)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="the kernels run on CPU tensors only under the Triton interpreter (TRITON_INTERPRET=1)"
)


def interpretable_kernels():
    return [k for k in SOFTMAX_KERNELS.values() if k.interpretable]


def cells(kernels, *, dispatched=True) -> set:
    """Every (kernel, path, layout, dtype): paths as the dispatch takes them for each dtype, or
    (dispatched=False) every path the interpreter runs in every dtype, as run_path reaches them
    (a Gluon path's CPU check is its sm_90 build, tests/test_triton_cpu.py)."""
    return {
        (k.name, path, layout, dtype_id(dtype))
        for k in kernels
        for dtype in k.dtypes
        for path in (k.paths_for(dtype) if dispatched else k.interpreted_paths)
        for layout in layouts(dtype)
    }


missing_cells = coverage.missing_cells


def _cuda_cells():
    cases = []
    for k in SOFTMAX_KERNELS.values():
        for dtype in k.dtypes:
            for path in k.paths_for(dtype):
                B, V = k.path(path).gpu
                for layout in layouts(dtype):
                    case_id = f"{k.name}-{path}-{layout}-{dtype_id(dtype)}-B{B}-V{V}"
                    cases.append(pytest.param(k.name, path, layout, dtype, B, V, id=case_id))
    return cases


def _cpu_cells():
    """(kernel, path, layout, dtype, V): the layouts of a path and dtype take the row lengths of
    CPU_V in turn, so each path meets every length in every dtype at a cell's cost of one."""
    return [
        pytest.param(
            k.name, path, layout, dtype, CPU_V[i % len(CPU_V)], id=f"{k.name}-{path}-{layout}-{dtype_id(dtype)}"
        )
        for k in interpretable_kernels()
        for path in k.interpreted_paths
        for dtype in k.dtypes
        for i, layout in enumerate(layouts(dtype))
    ]


def _cpu_path_cases(*, ours=False):
    return [
        pytest.param(k.name, path, dtype, id=f"{k.name}-{path}-{dtype_id(dtype)}")
        for k in interpretable_kernels()
        if not (ours and k.baseline)
        for path in k.interpreted_paths
        for dtype in k.dtypes
    ]


CUDA_CASES = _cuda_cells()
CPU_CASES = _cpu_cells()


def seed_of(*parts) -> int:
    # A seed from the cell's names, the same in every process (str hashes are salted per process).
    return sum((i + 1) * ord(c) for i, c in enumerate("/".join(map(str, parts))))


def cpu_logits(kernel, dtype, B, V, layout="contiguous"):
    """The values every path and layout of `kernel` gets at (B, V): one seed per kernel, dtype
    and shape, so outputs can be compared bit for bit across paths and layouts."""
    return logits(B, V, seed=seed_of(kernel, dtype_id(dtype), B, V), dtype=dtype, layout=layout)


_reference_outputs: dict = {}


def reference_output(k, dtype, B, V) -> torch.Tensor:
    """cpu_logits(k, dtype, B, V) through the kernel's first path at its CPU launch parameters,
    contiguous: the bits every path and layout must give (once per process)."""
    key = (k.name, dtype, B, V)
    if key not in _reference_outputs:
        x = cpu_logits(k.name, dtype, B, V)
        _reference_outputs[key] = run_poisoned(cpu_path_runner(k, k.paths[0]), x).clone()
    return _reference_outputs[key]


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
    check_softmax(out, x, what=what, kernel=k)


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize("kernel, path, layout, dtype, V", CPU_CASES)
def test_cpu_path_under_layout(request, kernel, path, layout, dtype, V):
    k = SOFTMAX_KERNELS[kernel]
    skip_if_unavailable(k)
    x = cpu_logits(kernel, dtype, CPU_B, V, layout)
    out = run_poisoned(cpu_path_runner(k, path), x)
    what = f"{kernel} via {path}, {layout}, ({CPU_B}, {V})"
    check_softmax(out, x, what=what, kernel=k)
    if not k.baseline:
        # Ours are bit-for-bit: neither the path nor the layout changes a row's bits.
        first = k.paths[0]
        assert_same_bits(out, reference_output(k, dtype, CPU_B, V), f"{what} vs {first} on a contiguous copy")
    coverage.record_cell(request.node, "cpu", (kernel, path, layout, dtype_id(dtype)))


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize("kernel, path, dtype", _cpu_path_cases(ours=True))
def test_cpu_path_batch_invariant(kernel, path, dtype):
    """A row's bits do not depend on the batch around it: each row alone (at program 0, in a
    batch of one) gives the bits it gets in the batch, and so do the first rows as a batch."""
    k = SOFTMAX_KERNELS[kernel]
    skip_if_unavailable(k)
    run = cpu_path_runner(k, path)
    B, V = 4, CPU_V[0]
    x = cpu_logits(kernel, dtype, B, V)
    full = run_poisoned(run, x)
    check_softmax(full, x, what=f"{kernel} via {path}, ({B}, {V})", kernel=k)
    assert_same_bits(run_poisoned(run, x[:2]), full[:2], f"{kernel} via {path}: rows 0-1 as a batch of 2")
    for r in range(1, B):
        alone = run_poisoned(run, x[r : r + 1].clone())
        assert_same_bits(alone, full[r : r + 1], f"{kernel} via {path}: row {r} alone vs in a batch of {B}")


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize("kernel, path, dtype", _cpu_path_cases())
def test_cpu_path_edges(kernel, path, dtype):
    """Huge magnitudes do not overflow, -inf entries get probability 0, an all -inf row gives
    NaN (as F.softmax does), two tied maxima get half each."""
    k = SOFTMAX_KERNELS[kernel]
    skip_if_unavailable(k)
    V = CPU_V[0]
    x = logits(5, V, seed=seed_of(kernel, path, dtype), dtype=dtype, neg_inf=False, neg_inf_rows=[1])
    huge = min(1e30, torch.finfo(dtype).max)
    x[0, 3], x[0, V - 1], x[0, 5] = huge, huge, -huge  # tied huge maxima, the second in the last tile
    x[2, ::3] = -float("inf")
    x[3, :7] = huge
    x[4] = x[4] + 1000.0  # far beyond exp's range unless the max is subtracted
    out = run_poisoned(cpu_path_runner(k, path), x)
    check_softmax(out, x, what=f"{kernel} via {path} with ±1e30, -inf and +1000 rows", kernel=k)
    assert out[0, 3].item() == 0.5 and out[0, V - 1].item() == 0.5, f"{kernel} via {path}: tied maxima"
    assert (out[2, ::3] == 0).all(), f"{kernel} via {path}: -inf entries must get probability 0"


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize(
    "kernel, dtype",
    [pytest.param(k.name, d, id=f"{k.name}-{dtype_id(d)}") for k in interpretable_kernels() for d in k.dtypes],
)
def test_cpu_public_entry_long_rows_and_one_column(kernel, dtype):
    """The public entry with its own launch parameters at rows several of its tiles long, and at
    V = 1, which gives exactly 1."""
    k = SOFTMAX_KERNELS[kernel]
    skip_if_unavailable(k)
    for V in LONG_CPU_V:
        x = cpu_logits(kernel, dtype, 2, V)
        check_softmax(run_poisoned(k, x), x, what=f"{kernel} at (2, {V}) via {k.plan(2, V, dtype)}", kernel=k)
    x = logits(5, 1, seed=1, dtype=dtype, scale=100.0)
    assert torch.equal(bits(run_poisoned(k, x)), bits(torch.ones_like(x))), f"{kernel}: softmax of one element is 1"


@pytest.mark.cpu
def test_gpu_shapes_take_their_paths():
    """Each path's spec shape is one the kernel's own plan sends down that path, in every dtype
    whose dispatch has it (what the cuda cases above rely on), for the kernels of every op."""
    from kernels.registry import REGISTRY

    checked = 0
    for k in (k for registry in REGISTRY.values() for k in registry.values()):
        if k.unavailable_reason():
            continue
        for dtype in k.dtypes:
            for path in k.paths_for(dtype):
                (B, V), options = k.path(path).gpu, k.path(path).options
                assert k.plan(B, V, dtype, **options) == path, (
                    f"{k.spec.op} {k.name}: ({B}, {V}) {dtype} {options} takes {k.plan(B, V, dtype, **options)}"
                )
                checked += 1
            for path in k.paths:  # and no shape of another dtype's path goes there
                (B, V), options = k.path(path).gpu, k.path(path).options
                assert k.plan(B, V, dtype, **options) in k.paths_for(dtype), f"{k.name}: ({B}, {V}) {dtype}"
        dispatched = {path for dtype in k.dtypes for path in k.paths_for(dtype)}
        assert dispatched == set(k.paths), f"{k.name}: paths no dtype dispatches to: {set(k.paths) - dispatched}"
    assert checked >= sum(len(registry) for registry in REGISTRY.values())


# -- the matrix is complete --------------------------------------------------------------------------


@pytest.mark.cpu
def test_every_cell_has_a_case():
    cuda_cells = {(c.values[0], c.values[1], c.values[2], dtype_id(c.values[3])) for c in CUDA_CASES}
    gaps = missing_cells(cells(SOFTMAX_KERNELS.values()), cuda_cells)
    assert not gaps, f"cells no cuda case covers:{gaps}"
    cpu_cells = {(c.values[0], c.values[1], c.values[2], dtype_id(c.values[3])) for c in CPU_CASES}
    gaps = missing_cells(cells(interpretable_kernels(), dispatched=False), cpu_cells)
    assert not gaps, f"cells no cpu case covers:{gaps}"


@pytest.mark.cpu
def test_a_missing_cell_is_named():
    expected = cells(SOFTMAX_KERNELS.values())
    dropped = max(expected)
    assert missing_cells(expected, expected) == ""
    assert missing_cells(expected, expected - {dropped}) == "\n  " + " / ".join(dropped)


# -- every expected cell ran: declared here, checked at the session's end (tests/suite/coverage.py) --


def expected_cells(platform: str) -> set:
    """The cells a run of the whole matrix must run on `platform`: on the CPU every path of the
    interpretable kernels; on a GPU every dispatched path, less the kernels whose backend this
    machine lacks (their cases skip with that reason)."""
    # Kernels whose backend's package or machine is missing skip with that reason, not left out.
    if platform == "cpu":
        return cells((k for k in interpretable_kernels() if not k.unavailable_reason()), dispatched=False)
    from tests.suite.gpus import cupy_unusable_reason

    return cells(
        k
        for k in SOFTMAX_KERNELS.values()
        if not (k.unavailable_reason() or (needs_cupy(k) and cupy_unusable_reason()))
    )


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
@interpreted
def test_every_cpu_cell_ran(request):
    _expect_every_cell(request, "cpu", "test_cpu_path_under_layout")


@pytest.mark.cuda
@pytest.mark.quick
def test_every_cuda_cell_ran(request):
    _expect_every_cell(request, "cuda", "test_cuda_path_under_layout")
