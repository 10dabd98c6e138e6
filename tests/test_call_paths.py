"""Our kernels as callers use them beyond a plain eager call: captured in CUDA graphs, traced
by torch.compile as custom operators (no graph break), and inside the compiled model.

Timing of these modes lives in test_benchmarks.py; here each mode must give the right bits.
"""

import time

import pytest
import torch

import kernels
from kernels import SOFTMAX_KERNELS
from kernels.spec import BACKENDS, names
from tests.helpers import (
    INTERPRETED,
    PORT_ATOL,
    PORT_RTOL,
    assert_backward_as_accurate_as_torch,
    assert_backward_close,
    bits,
    check_softmax,
    layouts,
    logits,
    needs_triton,
    run_poisoned,
    skip_unless_runnable,
)

DTYPES = (torch.float32, torch.bfloat16)
OPS = names(lambda s: s.custom_op)  # the kernels kernels/ops.py registers as custom operators
interpreted = pytest.mark.skipif(not INTERPRETED, reason="the Triton op runs on CPU tensors only interpreted")


def _logits(B, V, dtype, device):
    return logits(B, V, seed=B * 31 + V, dtype=dtype, device=device, scale=4.0, neg_inf=False)


def _graph_of(fn, x):
    """fn(x) captured in a CUDA graph after a warm-up on a side stream (as torch requires);
    returns (graph, output tensor the replays write)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fn(x)
    return graph, y


def _path_cases(kernels=None):
    """(kernel, path, B, V, dtype) for every path each kernel dispatches to, in each dtype of
    DTYPES it supports, at the shape its spec gives the path."""
    for kernel in kernels or SOFTMAX_KERNELS:
        k = SOFTMAX_KERNELS[kernel]
        for dtype in DTYPES:
            if dtype in k.dtypes:
                for path in k.paths_for(dtype):
                    B, V = k.path(path).gpu
                    yield pytest.param(kernel, path, B, V, dtype, id=f"{kernel}-{path}-{str(dtype)[6:]}")


def _dispatched_path_cases():
    """The kernels with several paths, which remember their launches per layout."""
    return _path_cases([name for name, k in SOFTMAX_KERNELS.items() if len(k.paths) > 1])


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("kernel, path, B, V, dtype", list(_path_cases()))
def test_graph_replay_gives_the_eager_bits(kernel, path, B, V, dtype):
    skip_unless_runnable(SOFTMAX_KERNELS[kernel])
    fn = SOFTMAX_KERNELS[kernel]
    assert fn.plan(B, V, dtype) == path, f"{kernel} at ({B}, {V}) takes {fn.plan(B, V, dtype)}, not {path}"
    x = _logits(B, V, dtype, "cuda")
    eager = fn(x)
    graph, y = _graph_of(fn, x)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager), f"{kernel}/{path}: the replay differs from the eager call"
    # A second input copied into the captured one: the graph must read it, not a stale copy.
    x.copy_(_logits(B, V, dtype, "cuda").flip(0))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, fn(x)), f"{kernel}/{path}: the replay did not follow the new input"
    if path in ("split", "held_split"):
        # Replays and eager calls share the path's zeroed counters: ten more of each interleaved.
        for _ in range(10):
            graph.replay()
            assert torch.equal(fn(x), y)
        torch.cuda.synchronize()
        check_softmax(y, x, what=f"{kernel}/{path} after replays and eager calls interleaved")


# -- the common call: no `out`, remembered per layout --------------------------------------------------


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("kernel, path, B, V, dtype", list(_dispatched_path_cases()))
def test_the_remembered_common_call_gives_the_checked_calls_bits(kernel, path, B, V, dtype):
    """A call without `out` is served, from its second time for a layout on, by a launch
    remembered for that layout (kernels.softmax_cuda / softmax_triton). In every layout, it must
    give the bits of the fully checked call into a given output, return a new tensor each time,
    and follow new data at the same layout. The checked call itself is held to the reference in
    the first layout here; in every layout it is the coverage matrix's cell at this path."""
    fn = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(fn)
    assert fn.plan(B, V, dtype) == path
    for i, layout in enumerate(layouts(dtype)):
        x = logits(B, V, seed=B + V, dtype=dtype, device="cuda", layout=layout)
        checked = run_poisoned(fn, x)
        first, second = fn(x), fn(x)
        assert first.data_ptr() != second.data_ptr() and second.is_contiguous()
        for got in (first, second):
            assert torch.equal(bits(got), bits(checked)), f"{kernel}/{path}/{layout}: the common call differs"
        other = logits(B, V, seed=B + V + 1, dtype=dtype, device="cuda", layout=layout)
        assert torch.equal(bits(fn(other)), bits(run_poisoned(fn, other))), f"{kernel}/{path}/{layout}: stale data"
        if i == 0:
            check_softmax(second, x, what=f"{kernel}/{path}/{layout} common call")


@pytest.mark.cuda
@pytest.mark.quick
@pytest.mark.parametrize("kernel, path, B, V, dtype", list(_path_cases(names(lambda s: s.backend == "triton"))))
def test_a_remembered_triton_call_goes_straight_to_the_driver(kernel, path, B, V, dtype):
    """Triton's own launcher re-binds every argument on every call, several microseconds of host
    time at shapes where the whole softmax takes a few: once a layout has been seen, each path
    must launch through kernels.launch's driver call, never through Triton's launcher again (a
    compiled kernel that needs scratch memory, clusters or PDL would silently fall back to it)."""
    from kernels import triton_launch

    fn = SOFTMAX_KERNELS[kernel]
    skip_unless_runnable(fn)
    assert fn.plan(B, V, dtype) == path
    x = _logits(B, V, dtype, "cuda")
    out = torch.empty_like(x)
    for _ in range(2):  # the first calls may tune and compile; from the second on they are remembered
        fn(x), fn(x, out=out)
    before = triton_launch.launch_count()
    for _ in range(3):
        fn(x), fn(x, out=out)
    assert triton_launch.launch_count() == before, f"{kernel}/{path}: a repeated call went through Triton's launcher"


# -- custom operators -----------------------------------------------------------------------------------


@pytest.mark.cpu
@needs_triton
@interpreted
def test_triton_op_passes_opcheck_in_the_interpreter():
    from kernels import ops

    for shape in ((3, 7), (4, 600)):
        x = _logits(*shape, torch.float32, "cpu")
        result = torch.library.opcheck(ops.triton, (x,))
        assert all(v == "SUCCESS" for v in result.values()), result
        x.requires_grad_(True)
        torch.library.opcheck(ops.triton, (x,))
    # The fake implementation must describe the real output for every input layout (strided
    # rows, a misaligned view, elements strided within a row), not only contiguous ones.
    for layout in ("row_stride", "offset:1", "col_stride"):
        x = logits(3, 40, seed=3, layout=layout, neg_inf=False)
        assert not x.is_contiguous() or x.storage_offset(), layout
        result = torch.library.opcheck(ops.triton, (x,))
        assert all(v == "SUCCESS" for v in result.values()), (layout, result)
    for dtype in (torch.bfloat16, torch.float16):  # the output takes the input's dtype
        x = _logits(3, 40, dtype, "cpu")
        result = torch.library.opcheck(ops.triton, (x,), test_utils=("test_schema", "test_faketensor"))
        assert all(v == "SUCCESS" for v in result.values()), (dtype, result)


@pytest.mark.cpu
@needs_triton
def test_the_fake_ops_refuse_what_the_kernels_refuse():
    # Traced with fake tensors (torch.compile, export), each op refuses the inputs its kernel
    # refuses, with the same errors, instead of describing an output the kernel never makes.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kernels import ops

    with FakeTensorMode():
        for name, op in ops.OPS.items():
            with pytest.raises(TypeError, match="float64"):
                op(torch.empty(2, 3, dtype=torch.float64))
            with pytest.raises(ValueError, match="2-D"):
                op(torch.empty(2, 3, 4))
            assert op(torch.empty(2, 3)).shape == (2, 3), name
        t = torch.zeros(2, dtype=torch.int64)
        with pytest.raises(TypeError, match="float64"):
            ops.cross_entropy(torch.empty(2, 3, dtype=torch.float64), t)
        with pytest.raises(TypeError, match="int64 or int32"):
            ops.cross_entropy(torch.empty(2, 3), t.to(torch.int16))


@pytest.mark.cpu
@needs_triton
@interpreted
def test_triton_op_gradient_is_the_softmax_gradient():
    from kernels import ops

    # The backward of y = softmax(x) for dy = g, within backward_error_bound of the float64
    # reference and no less accurate than PyTorch's autograd kernel on the same y and g.
    x = _logits(3, 40, torch.float32, "cpu").double().float().requires_grad_(True)
    g = torch.randn(3, 40, generator=torch.Generator().manual_seed(40))
    y = ops.triton(x)
    (y * g).sum().backward()
    assert_backward_close(x.grad, g, y.detach(), what="ops.triton backward")
    assert_backward_as_accurate_as_torch(x.grad, g, y.detach(), what="ops.triton backward")


@pytest.mark.cpu
@needs_triton
@interpreted
def test_model_traces_without_a_graph_break_through_the_triton_op():
    """Dynamo's own account of the LM head's softmax as our custom op: one graph, no break."""
    from model.torch_minigpt import GrammarMiniGPT

    model = GrammarMiniGPT.from_numpy(softmax_impl="triton")
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    explanation = torch._dynamo.explain(model)(ids)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    ops_in_graph = {
        str(node.target) for g in explanation.graphs for node in g.graph.nodes if node.op == "call_function"
    }
    assert any("softmax_suite.triton" in op for op in ops_in_graph), sorted(ops_in_graph)


@pytest.mark.cuda
@pytest.mark.parametrize("name", OPS)
def test_custom_ops_pass_opcheck_on_cuda(name):
    from kernels import ops

    op = getattr(ops, name)
    for dtype in DTYPES:
        for shape in ((3, 7), (4, 600), (2, 50257)):
            x = _logits(*shape, dtype, "cuda")
            result = torch.library.opcheck(op, (x,))
            assert all(v == "SUCCESS" for v in result.values()), (shape, dtype, result)
        for layout in layouts(dtype)[1:]:  # the fake implementation under every other layout
            x = logits(4, 600, seed=4, dtype=dtype, device="cuda", layout=layout, neg_inf=False)
            result = torch.library.opcheck(op, (x,))
            assert all(v == "SUCCESS" for v in result.values()), (layout, dtype, result)


@pytest.mark.cuda
@pytest.mark.parametrize("name", OPS)
def test_compiled_function_keeps_the_op_without_breaks(name):
    from kernels import ops

    op = getattr(ops, name)

    def f(x):
        return op(x * 2.0) + 1.0

    x = _logits(8, 781, torch.float32, "cuda")
    explanation = torch._dynamo.explain(f)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x), atol=0, rtol=0)


# -- the model, compiled --------------------------------------------------------------------------------


def _forward_us(model, ids, reps=50):
    for _ in range(5):
        model(ids)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        model(ids)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e6


@pytest.mark.cuda
def test_compiled_model_keeps_the_triton_softmax_and_its_predictions(ieee_fp32, record_manifest):
    """GrammarMiniGPT under torch.compile(mode="reduce-overhead") runs the Triton LM-head softmax
    inside the captured graph: probabilities within the port's contract (1e-5) of eager, top-1
    unchanged for every tense prompt; per-forward time eager vs compiled, with F.softmax and with
    Triton."""
    from model.grammar import TENSE_PROMPTS
    from model.tokenizer import Tokenizer
    from model.torch_minigpt import GrammarMiniGPT

    tokenizer = Tokenizer.load()
    times = {}
    for impl in ("torch", "triton"):
        model = GrammarMiniGPT.from_numpy(softmax_impl=impl).cuda()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for text in TENSE_PROMPTS:
            ids = torch.tensor([[tokenizer.bos_id] + tokenizer.encode(text)], device="cuda")
            with torch.no_grad():
                eager = model(ids)
                for _ in range(3):  # warm-up, record, replay
                    got = compiled(ids).clone()
            # The whole model compiled against eager: its layers are Inductor's code, not the
            # kernel's, so this is the port's equivalence contract (tests/helpers/tolerances.py PORT_ATOL);
            # the LM head's Triton softmax is held to TOLERANCES in tests/test_model_swap_cuda.py.
            torch.testing.assert_close(got, eager, atol=PORT_ATOL, rtol=PORT_RTOL)
            assert int(got[0, -1].argmax()) == int(eager[0, -1].argmax()), text
        ids = torch.tensor([[tokenizer.bos_id] + tokenizer.encode(TENSE_PROMPTS[0])], device="cuda")
        with torch.no_grad():
            times[f"eager_{impl}_us"] = _forward_us(model, ids)
            times[f"compiled_{impl}_us"] = _forward_us(compiled, ids)
    record_manifest(
        "model_forward",
        **times,
        shape="(1, T) with T = len('<bos> Yesterday I')",
        how_measured="wall time per forward from Python, 50 back-to-back calls, one synchronize",
    )
    assert all(t > 0 for t in times.values())


@pytest.mark.cpu
def test_a_kernel_without_a_run_path_of_its_own_refuses_what_it_cannot_do():
    # Its one path is its plain call; launch parameters or another path would be silently
    # ignored, so a test that asked for them would check nothing it meant to.
    baseline = SOFTMAX_KERNELS[kernels.BASELINE]
    x = torch.randn(3, 11)
    assert torch.equal(baseline.run_path(x, baseline.paths[0]), torch.softmax(x, dim=-1))
    with pytest.raises(ValueError, match="has no run_path"):
        baseline.run_path(x, baseline.paths[0], BLOCK=16)
    with pytest.raises(ValueError, match="has no run_path"):
        baseline.run_path(x, "split")


@pytest.mark.cpu
def test_registry_marks_baselines_and_describes_every_kernel():
    assert kernels.BASELINE in SOFTMAX_KERNELS and SOFTMAX_KERNELS[kernels.BASELINE].baseline
    assert set(kernels.OUR_KERNELS) == {k for k, v in SOFTMAX_KERNELS.items() if not v.baseline}
    for name, k in SOFTMAX_KERNELS.items():
        assert k.name == name and k.paths and torch.float32 in k.dtypes
        assert k.backend in BACKENDS
        if k.unavailable_reason():
            continue
        for B, V in ((1, 7), (512, 600), (8192, 600), (3, 50257), (2, 300007)):
            assert k.plan(B, V, torch.float32) in k.paths, (name, B, V)


@pytest.mark.cpu
def test_every_custom_operator_is_a_registered_kernel():
    from kernels import ops

    assert set(ops.OPS) == set(OPS) and set(OPS) <= set(SOFTMAX_KERNELS)
    for name in ops.OPS:
        assert callable(getattr(getattr(torch.ops, ops.NAMESPACE), name)), name
