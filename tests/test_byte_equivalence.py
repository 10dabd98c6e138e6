"""Byte-equivalence: a row's softmax bits depend only on that row's values and V.

Not on B, not on the row's index or the 16-byte alignment class of its start address, not on the
row stride, not on the launch (repeats; CUDA-graph replay against eager), and not on the dispatch
path another B would choose. Every comparison is of raw bits (int16 / int32 / uint64 views), on
outputs poisoned with NaN first, so an unwritten element shows as NaN and fails too.

cuda: every kernel of the registry at each of its dispatch paths and boundaries (V +/- 1), odd
      and even V up to 128256 and past fused's last row class, and B from 1 to past every
      B-dependent threshold (Triton's rows_min_b, fused's warp grid cap) where memory allows.
cpu:  the Triton paths under the interpreter with launch parameters scaled down so small V
      reaches each of them, the dispatch switch between tile and rows, and the NumPy float64
      reference. (The graph property needs a GPU.)

Each (kernel, dtype, property) is one test that measures every shape, records its verdict in
the manifest (section "byte_equivalence", key "kernel/dtype/property") and then asserts. The
baselines (F.softmax, torch.compile) are measured the same way but not gated: their verdict is
recorded as "not gated: ..." and the test passes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
from kernels.reference import softmax_ref
from kernels.spec import dtype_name
from tests.helpers import (
    INTERPRETED,
    VECTOR_BYTES,
    array_bit_difference,
    cpu_path_runner,
    device_logits,
    needs_triton,
    skip_if_unavailable,
    skip_unless_runnable,
    triton_module,
)
from tests.helpers import logits as seeded_logits

SECTION = "byte_equivalence"
REPEATS = 20
BIT_VIEWS = {2: torch.int16, 4: torch.int32, 8: torch.int64}

# V every kernel is measured at: odd and even, small, the lab's 600, both sides of F.softmax's
# own 1024 switch and of 2048, and the large vocabularies.
COMMON_V = (1, 2, 7, 600, 781, 1024, 1025, 2048, 2049, 32769, 50257, 128256)
COMPILED_V = (7, 600, 2049, 50257)  # torch.compile recompiles per shape class: fewer, to stay fast
# B from one row to past every B-dependent switch: Triton's rows_min_b (8192) and fused's warp
# grid (SMs x 32 blocks x 4 or 8 rows, 16896 / 33792 rows on an H200), past which rows loop.
COMMON_B = (1, 7, 64, 8191, 8192, 8193, 70000)
LARGE_B = (8191, 8192, 8193, 70000)
LARGE_B_V = (7, 600, 1025, 2048)  # warp-per-row (fused) and tile/rows (Triton) row lengths
ELEMENT_BUDGET = 1 << 27  # elements per (B, V) tensor: 512 MB in fp32
SMALL_B = 8  # batch for the position and stride cases at every V


# -- comparing bits ---------------------------------------------------------------------------


def bit_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when `got` holds exactly the bits of `want` and neither holds NaN; else the count
    and the first differing indices. (No input here has an all -inf row, so NaN only comes from
    the poison: an element the kernel did not write.)"""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
    for name, t in (("result", got), ("reference result", want)):
        nan = torch.isnan(t)
        if bool(nan.any()):
            return f"{int(nan.sum())} NaN elements in the {name} (unwritten?), first at {nan.nonzero()[:4].tolist()}"
    bits = BIT_VIEWS[got.element_size()]
    differ = got.contiguous().view(bits) != want.contiguous().view(bits)
    if not bool(differ.any()):
        return None
    return (
        f"{int(differ.sum())} of {differ.numel()} elements differ in their bits, "
        f"first at {differ.nonzero()[:4].tolist()}"
    )


def reference_bit_difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """bit_difference for the float64 NumPy reference's outputs: array_bit_difference, once
    both are float64 and neither holds NaN."""
    if got.shape != want.shape or got.dtype != np.float64 or want.dtype != np.float64:
        return f"got {got.shape} {got.dtype}, expected {want.shape} float64"
    if np.isnan(got).any() or np.isnan(want).any():
        return f"{int(np.isnan(got).sum())} NaN elements in the result, {int(np.isnan(want).sum())} in the reference"
    return array_bit_difference(got, want)


def poisoned(B, V, dtype, device, *, offset=0):
    """A NaN (B, V) output, `offset` elements into its buffer."""
    return torch.full((offset + B * V,), float("nan"), dtype=dtype, device=device)[offset:].view(B, V)


def record_then_assert(record_manifest, kernel: str, dtype_name: str, prop: str, shapes, failures, *, gated: bool):
    """Record the verdict (before asserting), then assert where the kernel is gated."""
    verdict = "failed" if failures else "passed"
    shapes = [list(s) for s in dict.fromkeys(tuple(s) for s in shapes)]
    record_manifest(
        SECTION,
        **{
            f"{kernel}/{dtype_name}/{prop}": {
                "verdict": verdict if gated else f"not gated: {verdict}",
                "shapes": shapes,
            }
        },
    )
    if gated:
        shown = "\n  ".join(failures[:12]) + ("\n  ..." if len(failures) > 12 else "")
        assert not failures, f"{kernel} {dtype_name} is not {prop} in {len(failures)} case(s):\n  {shown}"


# -- the properties, for any run(x, out) -------------------------------------------------------
# Each returns (shapes measured, failures); a failure names the case and what differs.


def measure_deterministic(run, shapes, dtype, device, *, path_of, repeats=REPEATS, seed=0):
    """The same input launched `repeats` times gives the same bits every time."""
    failures = []
    for B, V in shapes:
        x = device_logits(B, V, dtype, device, seed=seed + B * 7919 + V)
        first = run(x, poisoned(B, V, dtype, device))
        for launch in range(1, repeats):
            diff = bit_difference(run(x, poisoned(B, V, dtype, device)), first)
            if diff:
                failures.append(f"(B={B}, V={V}, {path_of(B, V)}) launch {launch} vs launch 0: {diff}")
                break
    return list(shapes), failures


def measure_batch_invariant(run, batches, dtype, device, *, path_of, seed=1):
    """batches: [(V, (B, ...))]. Rows 0..b-1 of one (max B, V) buffer computed as a batch of b
    (a view: same addresses, only B changes) give the bits of the same rows in the largest
    batch; so does a single middle or last row computed alone at its own address."""
    shapes, failures = [], []
    for V, bs in batches:
        b_max = max(bs)
        x = device_logits(b_max, V, dtype, device, seed=seed + V)
        full = run(x, poisoned(b_max, V, dtype, device))
        shapes.append((b_max, V))
        for b in sorted(set(bs) - {b_max}):
            shapes.append((b, V))
            diff = bit_difference(run(x[:b], poisoned(b, V, dtype, device)), full[:b])
            if diff:
                failures.append(
                    f"V={V}: rows of a batch of {b} ({path_of(b, V)}) vs the same rows in a batch of "
                    f"{b_max} ({path_of(b_max, V)}): {diff}"
                )
        for r in sorted({b_max // 2, b_max - 1} - {0}):
            shapes.append((1, V))
            diff = bit_difference(run(x[r : r + 1], poisoned(1, V, dtype, device))[0], full[r])
            if diff:
                failures.append(
                    f"V={V}: row {r} alone ({path_of(1, V)}) vs in a batch of {b_max} ({path_of(b_max, V)}): {diff}"
                )
        del x, full
    return shapes, failures


def placements(dtype):
    """(input offset, output offset) in elements: every 16-byte alignment class of the input
    with the output in the same class, and two with the classes apart."""
    classes = VECTOR_BYTES // torch.empty((), dtype=dtype).element_size()
    return [(o, o) for o in range(classes)] + [(0, 1), (1, 0)]


def measure_position_invariant(run, cases, dtype, device, *, path_of, seed=2):
    """The rows of a batch starting at every alignment class of its buffer (input and output),
    and the same rows moved to other batch indices (the batch rolled by 1 and by B // 2 rows),
    give each row the bits it gets in the batch at offset 0. With V odd the rows of one batch
    already start in every class; the offsets cover even V."""
    shapes, failures = [], []
    for B, V in cases:
        x = device_logits(B, V, dtype, device, seed=seed + 31 * B + V)
        want = run(x, poisoned(B, V, dtype, device))
        shapes.append((B, V))
        for in_offset, out_offset in placements(dtype):
            placed = torch.empty(in_offset + B * V, dtype=dtype, device=device)[in_offset:].view(B, V)
            placed.copy_(x)
            diff = bit_difference(run(placed, poisoned(B, V, dtype, device, offset=out_offset)), want)
            if diff:
                failures.append(
                    f"(B={B}, V={V}, {path_of(B, V)}) input offset {in_offset}, output offset "
                    f"{out_offset} elements vs both at 0: {diff}"
                )
        for k in sorted({1, B // 2} - {0}):
            # Row r moves to index (r + k) % B.
            got = run(torch.roll(x, k, dims=0), poisoned(B, V, dtype, device)).roll(-k, dims=0)
            diff = bit_difference(got, want)
            if diff:
                failures.append(f"(B={B}, V={V}, {path_of(B, V)}) every row moved {k} indices on: {diff}")
        del x, want
    return shapes, failures


def strided_layouts(B, V, dtype):
    """(name, row stride, column stride) of the non-contiguous layouts compared with contiguous."""
    classes = VECTOR_BYTES // torch.empty((), dtype=dtype).element_size()
    pads = sorted({1, classes, 67})
    return [(f"row stride V+{p}", V + p, 1) for p in pads] + [("column-major", 1, B)]


def measure_stride_invariant(run, cases, dtype, device, *, path_of, seed=3):
    """The same values with a row stride past V (the padding NaN, so reading it shows) and
    column-major give the bits of the contiguous layout."""
    shapes, failures = [], []
    for B, V in cases:
        x = device_logits(B, V, dtype, device, seed=seed + B * 17 + V)
        want = run(x, poisoned(B, V, dtype, device))
        shapes.append((B, V))
        for name, row_stride, col_stride in strided_layouts(B, V, dtype):
            size = (B - 1) * row_stride + (V - 1) * col_stride + 1
            strided = torch.full((size,), float("nan"), dtype=dtype, device=device).as_strided(
                (B, V), (row_stride, col_stride)
            )
            strided.copy_(x)
            diff = bit_difference(run(strided, poisoned(B, V, dtype, device)), want)
            if diff:
                failures.append(f"(B={B}, V={V}, {path_of(B, V)}) {name} vs contiguous: {diff}")
    return shapes, failures


def measure_graph_invariant(run, shapes, dtype, *, path_of, seed=4):
    """The call captured in a CUDA graph (warmed up on a side stream first, static input and
    output) and replayed gives the eager bits, for the captured input and for new values
    copied into the static input afterwards."""
    failures = []
    for B, V in shapes:
        inputs = [device_logits(B, V, dtype, "cuda", seed=seed + B * 13 + V + k) for k in range(2)]
        eager = [run(x, poisoned(B, V, dtype, "cuda")) for x in inputs]
        static_x = inputs[0].clone()
        static_out = poisoned(B, V, dtype, "cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                run(static_x, static_out)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                run(static_x, static_out)
        except RuntimeError as exc:  # torch's and CuPy's CUDA errors: a call that cannot be captured fails
            failures.append(f"(B={B}, V={V}, {path_of(B, V)}) capture raised {type(exc).__name__}: {exc}")
            continue
        for k, x in enumerate(inputs):
            static_x.copy_(x)
            static_out.fill_(float("nan"))
            graph.replay()
            diff = bit_difference(static_out, eager[k])
            if diff:
                failures.append(f"(B={B}, V={V}, {path_of(B, V)}) replay on input {k} vs eager: {diff}")
        del graph
    return list(shapes), failures


# -- the registry on a GPU ---------------------------------------------------------------------


def runner(name: str):
    """run(x, out) -> out for a registry kernel. It returns the `out` it was given, not what the
    kernel returns: a result written elsewhere leaves NaN."""
    fn = kernels.SOFTMAX_KERNELS[name]

    def run(x, out):
        fn(x, out=out)
        return out

    return run


def path_namer(name: str, dtype):
    """path_of(B, V): the dispatch path the kernel takes, for failure messages."""
    plan = kernels.SOFTMAX_KERNELS[name].plan

    def path_of(B, V):
        try:
            return f"path {plan(B, V, dtype)}"
        except (TypeError, ValueError, KeyError) as exc:  # a message helper must not hide the measurement
            return f"path unknown ({type(exc).__name__})"

    return path_of


def v_boundaries(name: str, dtype) -> list[int]:
    """V at which the kernel switches path (V and V + 1 run different code)."""
    if name == "fused":
        from kernels import cuda_plans

        return list(cuda_plans.DISPATCH_BOUNDARIES_BY_DTYPE[dtype])
    if name == "triton":
        return [v for key, v in triton_module("triton_dispatch").DISPATCH_BOUNDARIES.items() if not key.endswith("_b")]
    return []


def b_thresholds(name: str) -> list[int]:
    if name == "triton":
        return [b for key, b in triton_module("triton_dispatch").DISPATCH_BOUNDARIES.items() if key.endswith("_b")]
    return []


def v_values(name: str, dtype) -> list[int]:
    if name == "torch_compile":
        return list(COMPILED_V)
    near = {v + d for v in v_boundaries(name, dtype) for d in (-1, 0, 1)}
    return sorted(v for v in set(COMMON_V) | near if v >= 1)


def b_max(V: int) -> int:
    return max(1, min(max(COMMON_B), ELEMENT_BUDGET // V))


def large_b_cases(name, dtype, bs=LARGE_B):
    vs = set(v_values(name, dtype))
    return [(B, V) for V in LARGE_B_V if V in vs for B in bs if B <= b_max(V)]


def threshold_cases(name, dtype):
    """(t, V) for each batch threshold t of the kernel and each V at which t rows take another
    path than a small batch does (Triton's 16-bit stream from stream_min_b rows)."""
    plan = kernels.SOFTMAX_KERNELS[name].plan
    return [
        (t, V)
        for t in b_thresholds(name)
        for V in v_values(name, dtype)
        if t <= b_max(V) and plan(t, V, dtype) != plan(min(64, b_max(V)), V, dtype)
    ]


def deterministic_shapes(name, dtype):
    small = [(min(64, b_max(V)), V) for V in v_values(name, dtype)]
    return small + large_b_cases(name, dtype) + threshold_cases(name, dtype)


def batch_plan(name, dtype):
    plan = []
    for V in v_values(name, dtype):
        near = {t + d for t in b_thresholds(name) for d in (-1, 0, 1)}
        plan.append((V, tuple(sorted({min(b, b_max(V)) for b in set(COMMON_B) | near}))))
    return plan


def position_cases(name, dtype):
    # 8193 rows: Triton's multi-row kernel (rows_min_b 8192) at every slot of a program;
    # 70000: fused's warp kernels loop over rows past their grid.
    small = [(min(SMALL_B, b_max(V)), V) for V in v_values(name, dtype)]
    return small + large_b_cases(name, dtype, (8193, 70000)) + threshold_cases(name, dtype)


def every_shape(name, dtype):
    shapes = deterministic_shapes(name, dtype) + position_cases(name, dtype)
    return shapes + [(b, V) for V, bs in batch_plan(name, dtype) for b in bs]


def registry_cases():
    for name, k in kernels.SOFTMAX_KERNELS.items():
        for dtype in k.dtypes:
            yield pytest.param(name, dtype, id=f"{name}-{dtype_name(dtype)}")


@pytest.fixture
def gpu_kernel(request):
    """(name, dtype, run, path_of, gated) for a registry case on the GPU."""
    name, dtype = request.param
    k = kernels.SOFTMAX_KERNELS[name]
    skip_unless_runnable(k)
    return name, dtype, runner(name), path_namer(name, dtype), not k.baseline


def _gpu_cases():
    return pytest.mark.parametrize(
        "gpu_kernel", [pytest.param(p.values, id=p.id) for p in registry_cases()], indirect=True
    )


@pytest.mark.cuda
@_gpu_cases()
def test_deterministic(gpu_kernel, record_manifest):
    name, dtype, run, path_of, gated = gpu_kernel
    shapes, failures = measure_deterministic(run, deterministic_shapes(name, dtype), dtype, "cuda", path_of=path_of)
    record_then_assert(record_manifest, name, dtype_name(dtype), "deterministic", shapes, failures, gated=gated)


@pytest.mark.cuda
@_gpu_cases()
def test_batch_invariant(gpu_kernel, record_manifest):
    name, dtype, run, path_of, gated = gpu_kernel
    shapes, failures = measure_batch_invariant(run, batch_plan(name, dtype), dtype, "cuda", path_of=path_of)
    record_then_assert(record_manifest, name, dtype_name(dtype), "batch_invariant", shapes, failures, gated=gated)


@pytest.mark.cuda
@_gpu_cases()
def test_position_invariant(gpu_kernel, record_manifest):
    name, dtype, run, path_of, gated = gpu_kernel
    shapes, failures = measure_position_invariant(run, position_cases(name, dtype), dtype, "cuda", path_of=path_of)
    record_then_assert(record_manifest, name, dtype_name(dtype), "position_invariant", shapes, failures, gated=gated)


@pytest.mark.cuda
@_gpu_cases()
def test_stride_invariant(gpu_kernel, record_manifest):
    name, dtype, run, path_of, gated = gpu_kernel
    shapes, failures = measure_stride_invariant(run, position_cases(name, dtype), dtype, "cuda", path_of=path_of)
    record_then_assert(record_manifest, name, dtype_name(dtype), "stride_invariant", shapes, failures, gated=gated)


@pytest.mark.cuda
@_gpu_cases()
def test_graph_invariant(gpu_kernel, record_manifest):
    name, dtype, run, path_of, gated = gpu_kernel
    shapes, failures = measure_graph_invariant(run, deterministic_shapes(name, dtype), dtype, path_of=path_of)
    record_then_assert(record_manifest, name, dtype_name(dtype), "graph_invariant", shapes, failures, gated=gated)


# -- once per path: the one-minute check (pytest -m "cuda and quick") ------------------------------


def quick_path_cases():
    """(kernel, path, dtype, B, V): every dispatch path of our kernels in every dtype, at the
    shape its spec gives the path (`Path.gpu`, which the coverage matrix runs too)."""
    for name, k in kernels.SOFTMAX_KERNELS.items():
        if k.baseline:  # measured, not gated: the quick check has nothing to fail on them
            continue
        for dtype in k.dtypes:
            for path in k.paths_for(dtype):
                B, V = k.path(path).gpu
                yield pytest.param(name, path, dtype, B, V, id=f"{name}-{path}-{dtype_name(dtype)}-B{B}-V{V}")


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("name, path, dtype, B, V", list(quick_path_cases()))
def test_every_property_once_per_path(name, path, dtype, B, V):
    """The five properties at one shape per dispatch path; the tests above measure each over
    many shapes. Nothing is recorded: the manifest's verdicts and shapes are theirs."""
    if kernels.SOFTMAX_KERNELS[name].backend == "cupy":
        pytest.importorskip("cupy", reason="the CUDA C kernels are launched through CuPy")
    assert kernels.SOFTMAX_KERNELS[name].plan(B, V, dtype) == path
    run, path_of = runner(name), path_namer(name, dtype)
    batches = [(V, tuple(sorted({1, max(1, B // 2), B})))]
    measured = {
        "deterministic": measure_deterministic(run, [(B, V)], dtype, "cuda", path_of=path_of),
        "batch_invariant": measure_batch_invariant(run, batches, dtype, "cuda", path_of=path_of),
        "position_invariant": measure_position_invariant(run, [(B, V)], dtype, "cuda", path_of=path_of),
        "stride_invariant": measure_stride_invariant(run, [(B, V)], dtype, "cuda", path_of=path_of),
        "graph_invariant": measure_graph_invariant(run, [(B, V)], dtype, path_of=path_of),
    }
    failures = [f"{prop}: {failure}" for prop, (_, found) in measured.items() for failure in found]
    assert not failures, f"{name} via {path}, {dtype_name(dtype)} ({B}, {V}):\n  " + "\n  ".join(failures)


@pytest.mark.cpu
@pytest.mark.parametrize(
    "name, dtype",
    [p for p in registry_cases() if len(kernels.SOFTMAX_KERNELS[p.values[0]].paths) > 1],
)
def test_gpu_shapes_reach_every_dispatch_path(name, dtype):
    # The GPU cases above are only as good as their shapes: every path of the kernel's dispatch
    # must be taken by some measured shape, for every property.
    k = kernels.SOFTMAX_KERNELS[name]
    skip_if_unavailable(k)
    paths = set(k.paths_for(dtype))
    for what, shapes in (
        ("deterministic", deterministic_shapes(name, dtype)),
        ("batch", [(b, V) for V, bs in batch_plan(name, dtype) for b in bs]),
        ("position/stride", position_cases(name, dtype)),
    ):
        reached = {k.plan(B, V, dtype) for B, V in shapes}
        assert paths <= reached, f"{name} {dtype}: the {what} shapes miss paths {sorted(paths - reached)}"
    assert max(V for _, V in every_shape(name, dtype)) >= 128256


# -- Triton under the interpreter --------------------------------------------------------------

st = triton_module()
interpreted = pytest.mark.skipif(
    not INTERPRETED,
    reason="the Triton kernels run compiled in this process (a GPU "
    "is visible); the cuda cases of this file hold them to the same properties",
)

# Each path of the Triton kernel under its launch parameters for the CPU (the registry entry's
# `Path.cpu`, scaled down so that small V reaches each path's real code): tile with V > BLOCK
# takes the multi-pass loop; split with CHUNK 16 spreads a row over P = cdiv(V + h, 16)
# programs, whose last one combines the published partials while the others, under the
# interpreter's one-after-another programs, take the streaming fallback; stream walks the rows
# with two programs, in tiles of 16. (tests/test_coverage_matrix.py holds every interpretable
# kernel to the same bits through each path; these cases probe Triton's paths further.)
TRITON = kernels.SOFTMAX_KERNELS["triton"]
# Per path: V (in registers and looping for tile; one and several split chunks), the batch for
# the position / stride cases and the batches compared for batch invariance. A reordered float32
# sum of a dozen terms often rounds to the same bits, so each case holds several rows (rows: 12,
# so rolling by 1 and 6 moves each row to another slot of its 4-row program). Split stays
# small: one of its programs costs ~7 ms in the interpreter.
INTERPRETER_V = {"tile": (13, 40), "rows": (7, 33), "row": (7, 33), "split": (17, 33), "stream": (13, 40)}
INTERPRETER_B = {"tile": 6, "rows": 12, "row": 8, "split": 2, "stream": 6}
INTERPRETER_BATCHES = {
    "tile": (1, 2, 4),
    "rows": (1, 3, 4, 5, 9),
    "row": (1, 2, 4),
    "split": (1, 2, 3),
    "stream": (1, 2, 3, 5),
}
INTERPRETER_DTYPES = TRITON.dtypes
# The interpreter runs a launch's programs one after another in NumPy: launches can differ only
# through state one leaves for the next (split's workspace tags, which change every launch), so
# a few launches show it; the GPU's REPEATS race scheduling, which the interpreter does not have.
INTERPRETER_REPEATS = 4


def interpreter_run(path):
    run_path = cpu_path_runner(TRITON, path)

    def run(x, out):
        run_path(x, out=out)
        return out

    return run


def interpreter_cases():
    # float32 on every path, and one 16-bit storage dtype a path, the two taking turns: a row's
    # bits come from float32 arithmetic either way, so a 16-bit case adds the loads and stores
    # of that storage, which bfloat16 and float16 share in every kernel; each path still meets a
    # 16-bit dtype, and each 16-bit dtype several paths.
    sixteen = [d for d in INTERPRETER_DTYPES if d != torch.float32]
    for i, path in enumerate(TRITON.interpreted_paths):
        for dtype in [d for d in INTERPRETER_DTYPES if d == torch.float32] + sixteen[i % len(sixteen) :][:1]:
            yield pytest.param(path, dtype, id=f"{path}-{dtype_name(dtype)}")


def _interpreter_key(path):
    return f"triton[interpreter:{path}]"


def _fixed_path(path):
    return lambda B, V: f"path {path}"


@pytest.mark.cpu
@needs_triton
@interpreted
@pytest.mark.parametrize("path,dtype", list(interpreter_cases()))
def test_interpreter_deterministic(path, dtype, record_manifest):
    shapes = [(1 if path == "split" else 2, V) for V in INTERPRETER_V[path]]
    run = interpreter_run(path)
    shapes, failures = measure_deterministic(
        run, shapes, dtype, "cpu", path_of=_fixed_path(path), repeats=INTERPRETER_REPEATS
    )
    record_then_assert(
        record_manifest, _interpreter_key(path), dtype_name(dtype), "deterministic", shapes, failures, gated=True
    )


@pytest.mark.cpu
@needs_triton
@interpreted
@pytest.mark.parametrize("path,dtype", list(interpreter_cases()))
def test_interpreter_batch_invariant(path, dtype, record_manifest):
    batches = [(V, INTERPRETER_BATCHES[path]) for V in INTERPRETER_V[path]]
    shapes, failures = measure_batch_invariant(interpreter_run(path), batches, dtype, "cpu", path_of=_fixed_path(path))
    record_then_assert(
        record_manifest, _interpreter_key(path), dtype_name(dtype), "batch_invariant", shapes, failures, gated=True
    )


@pytest.mark.cpu
@needs_triton
@interpreted
@pytest.mark.parametrize("path,dtype", list(interpreter_cases()))
def test_interpreter_position_invariant(path, dtype, record_manifest):
    cases = [(INTERPRETER_B[path], V) for V in INTERPRETER_V[path]]
    shapes, failures = measure_position_invariant(interpreter_run(path), cases, dtype, "cpu", path_of=_fixed_path(path))
    record_then_assert(
        record_manifest, _interpreter_key(path), dtype_name(dtype), "position_invariant", shapes, failures, gated=True
    )


@pytest.mark.cpu
@needs_triton
@interpreted
@pytest.mark.parametrize("path,dtype", list(interpreter_cases()))
def test_interpreter_stride_invariant(path, dtype, record_manifest):
    cases = [(INTERPRETER_B[path], V) for V in INTERPRETER_V[path]]
    shapes, failures = measure_stride_invariant(interpreter_run(path), cases, dtype, "cpu", path_of=_fixed_path(path))
    record_then_assert(
        record_manifest, _interpreter_key(path), dtype_name(dtype), "stride_invariant", shapes, failures, gated=True
    )


@pytest.mark.cpu
@needs_triton
@interpreted
@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=[dtype_name(d) for d in INTERPRETER_DTYPES])
def test_interpreter_dispatch_batch_invariant(dtype, record_manifest):
    """softmax() picks a row's path by B as well as V: rows of V <= tile_max_v take the tile
    kernel below rows_min_b rows and the multi-row kernel from there on; 16-bit rows of
    stream_min_v < V <= stream_max_v take the row or split path below stream_min_b rows and the
    stream or held path from there on; rows of short_split_min_v < V <= row_max_v split in a batch of
    up to short_split_max_b rows and are held whole by the row path in a longer one. A row
    must get the same bits on both sides of each switch: here the same rows go through the
    path (and parameters) `plan` picks just below and at the switch's B. (8191 tile programs
    take ~11 s in the interpreter; that each path gives a row the same bits at any B is
    test_interpreter_batch_invariant's job.) Recorded under the B each side stands for."""
    b = triton_module("triton_dispatch").DISPATCH_BOUNDARIES
    sides = [(b["rows_min_b"], V) for V in (7, 600, 1024, 1025, b["tile_max_v"])]
    for V in (b["stream_min_v"], b["stream_min_v"] + 1, b["row_max_v"] + 1, b["stream_max_v"], b["stream_max_v"] + 1):
        sides.append((b["stream_min_b"], V))
    held = b["short_split_max_b"] + 1
    sides += [(held, V) for V in (b["short_split_min_v"], b["short_split_min_v"] + 1, b["row_max_v"])]
    shapes, failures = [], []
    for above, V in sides:
        below = above - 1
        paths = st.plan(below, V, dtype), st.plan(above, V, dtype)
        if above == b["rows_min_b"]:
            assert paths == ("tile", "rows"), f"plan at V={V}: {paths}; the dispatch changed, update this test"
        elif above == held and b["short_split_min_v"] < V <= b["row_max_v"]:
            assert paths == ("split", "row"), f"plan at V={V}: {paths}; the dispatch changed, update this test"
        elif dtype == torch.float32 or not b["stream_min_v"] < V:
            assert paths[0] == paths[1], f"plan at V={V}: {paths}; the dispatch changed, update this test"
            continue  # one path on both sides
        else:
            above_path_ok = paths[1] in ("stream", "held", "held_split")
            assert above_path_ok and paths[0] in ("row", "split"), f"plan at V={V}: {paths}"
        x = device_logits(2, V, dtype, "cpu", seed=V)
        want = st.run_path(x, paths[0], out=poisoned(2, V, dtype, "cpu"))
        # (held's and held_split's Gluon kernels are not interpretable: softmax() runs their substitutes here)
        runnable = triton_module("triton_dispatch").runnable_path
        got = st.run_path(x, runnable(paths[1], None), out=poisoned(2, V, dtype, "cpu"))
        shapes += [(below, V), (above, V)]
        diff = bit_difference(got, want)
        if diff:
            failures.append(f"V={V}: rows through {paths[1]} (B >= {above}) vs {paths[0]} (B = {below}): {diff}")
    record_then_assert(
        record_manifest, "triton[interpreter]", dtype_name(dtype), "batch_invariant", shapes, failures, gated=True
    )


# -- the NumPy reference (float64) -------------------------------------------------------------

REFERENCE_SHAPES = [(1, 1), (5, 7), (9, 600), (3, 2049), (2, 9000)]


def _reference_logits(B, V, seed):
    return seeded_logits(B, V, seed=seed, dtype=torch.float64).numpy()


@pytest.mark.cpu
def test_reference_deterministic(record_manifest):
    failures = []
    for B, V in REFERENCE_SHAPES:
        x = _reference_logits(B, V, seed=V)
        first = softmax_ref(x)
        for call in range(1, REPEATS):
            diff = reference_bit_difference(softmax_ref(x), first)
            if diff:
                failures.append(f"(B={B}, V={V}) call {call} vs call 0: {diff}")
                break
    record_then_assert(record_manifest, "reference", "float64", "deterministic", REFERENCE_SHAPES, failures, gated=True)


@pytest.mark.cpu
def test_reference_batch_invariant(record_manifest):
    shapes, failures = [], []
    for B, V in REFERENCE_SHAPES:
        x = _reference_logits(B + 4, V, seed=V + 1)
        full = softmax_ref(x)
        for b in sorted({1, B, B + 4}):
            shapes.append((b, V))
            diff = reference_bit_difference(softmax_ref(x[:b]), full[:b])
            if diff:
                failures.append(f"V={V}: rows of a batch of {b} vs of {B + 4}: {diff}")
        diff = reference_bit_difference(softmax_ref(x[-1:])[0], full[-1])
        if diff:
            failures.append(f"V={V}: the last row alone vs in the batch: {diff}")
    record_then_assert(record_manifest, "reference", "float64", "batch_invariant", shapes, failures, gated=True)


@pytest.mark.cpu
def test_reference_position_invariant(record_manifest):
    # Offsets of 0..15 bytes into a raw buffer: both 16-byte classes of a float64 row and
    # start addresses that are not even 8-byte aligned (NumPy handles those unaligned).
    shapes, failures = [], []
    for B, V in REFERENCE_SHAPES:
        B = max(B, 4)
        row = _reference_logits(1, V, seed=V + 2)[0]
        batch = _reference_logits(B, V, seed=V + 3)
        batch[[0, 1, B - 1]] = row
        want = softmax_ref(batch)[0]
        shapes.append((B, V))
        for byte_offset in range(16):
            raw = bytearray(byte_offset + batch.nbytes)
            x = np.frombuffer(raw, dtype=np.float64, count=batch.size, offset=byte_offset).reshape(B, V)
            x[...] = batch
            y = softmax_ref(x)
            for i in (0, 1, B - 1):
                diff = reference_bit_difference(y[i], want)
                if diff:
                    failures.append(f"(B={B}, V={V}) row at index {i}, byte offset {byte_offset}: {diff}")
    record_then_assert(record_manifest, "reference", "float64", "position_invariant", shapes, failures, gated=True)


@pytest.mark.cpu
def test_reference_stride_invariant(record_manifest):
    """Rows with a row stride past V (NaN padding) give the contiguous bits. Column-major input
    does not, and is left out: NumPy keeps that layout through the exp, then sums the now
    non-contiguous axis one element after another instead of pairwise, so the float64 sums
    round differently (by an ulp or so: harmless for a reference held to tolerances)."""
    shapes, failures = [], []
    for B, V in REFERENCE_SHAPES:
        x = _reference_logits(B, V, seed=V + 4)
        want = softmax_ref(x)
        shapes.append((B, V))
        for pad in (1, 2, 67):
            padded = np.full((B, V + pad), np.nan)
            padded[:, :V] = x
            diff = reference_bit_difference(softmax_ref(padded[:, :V]), want)
            if diff:
                failures.append(f"(B={B}, V={V}) row stride V+{pad} vs contiguous: {diff}")
    record_then_assert(record_manifest, "reference", "float64", "stride_invariant", shapes, failures, gated=True)
