"""The training operations as torch.library custom operators (kernels/ops.py): opcheck, autograd
(the saved gradient scaled by grad_output; the softmax ops' backward from the registry), and
torch.compile without a graph break. On the CPU the Triton kernels run interpreted, and the
compiler is the aot_eager backend (AOTAutograd's forward and backward graphs, run eagerly):
Inductor would compile C++ for the CPU, which costs far more than these checks need; the
cuda tests compile with Inductor (tests/test_cross_entropy.py, tests/test_softmax_backward.py).
"""

import pytest
import torch

from kernels import SOFTMAX_BACKWARD_KERNELS, SOFTMAX_BACKWARD_OF, ops
from tests.helpers import TRITON_MISSING

if TRITON_MISSING:  # Triton publishes Linux wheels only: what this file tests needs it
    pytest.skip(TRITON_MISSING, allow_module_level=True)

from kernels import triton_cross_entropy as tce  # noqa: E402
from tests.helpers import (  # noqa: E402
    assert_within,
    bits,
    check_cross_entropy,
    edge_rows,
    linear_weight_grad_expected,
    logits,
    run_interpreted_in_subprocess,
    sm90_builds,
)

pytestmark = pytest.mark.cpu
interpreted = pytest.mark.skipif(
    not tce.INTERPRET, reason="needs the interpreted kernels; test_interpreted_in_a_subprocess runs them"
)
V = 23


def _weight(V):
    g = torch.Generator().manual_seed(V)
    return 0.5 + torch.rand(V, generator=g)


@interpreted
def test_ops_pass_opcheck():
    x, t = edge_rows(V, seed=1)
    w = _weight(V)
    t3 = torch.where(t == -100, 3, t)  # ignore_index 3: a class index, as PyTorch allows
    cases = [
        (torch.ops.softmax_suite.cross_entropy_triton, (x, t, None, -100, 0.0, "mean")),
        (torch.ops.softmax_suite.cross_entropy_triton, (x.clone().requires_grad_(True), t3, w, 3, 0.1, "none")),
        (torch.ops.softmax_suite.cross_entropy_grad_scale_, (torch.randn(8, V), torch.tensor(2.0))),
        (torch.ops.softmax_suite.cross_entropy_grad_scale_, (torch.randn(8, V), torch.randn(8))),
        (torch.ops.softmax_suite.cross_entropy_grad_scaled, (torch.randn(8, V), torch.rand(8) + 0.5)),
        (torch.ops.softmax_suite.softmax_backward_triton, (torch.randn(3, V), torch.softmax(torch.randn(3, V), -1))),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), (op, result)
    # The fake implementations describe the real outputs for every input layout, not only for
    # contiguous rows: padded rows, a misaligned start and elements strided within a row (the
    # fake-tensor check: what the layouts could change; the cases above trace the rest).
    for layout in ("row_stride", "offset:1", "col_stride"):
        xl = logits(8, V, seed=5, layout=layout, neg_inf=False)
        assert not xl.is_contiguous() or xl.storage_offset(), layout
        yl = logits(3, V, seed=6, layout=layout, neg_inf=False)
        yl.copy_(torch.softmax(yl, -1))  # probabilities in the same layout
        dy = logits(3, V, seed=7, layout=layout, neg_inf=False)
        for op, args in (
            (torch.ops.softmax_suite.cross_entropy_triton, (xl, t, w, -100, 0.1, "none")),
            (torch.ops.softmax_suite.softmax_backward_triton, (dy, yl)),
        ):
            result = torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
            assert all(v == "SUCCESS" for v in result.values()), (op, layout, result)
    # ... and for every storage dtype: the outputs take the inputs' dtype (lse float32).
    for dtype in (torch.bfloat16, torch.float16):
        x16, t16 = edge_rows(V, seed=1, dtype=dtype)
        y16 = torch.softmax(torch.randn(3, V), -1).to(dtype)
        for op, args in (
            (torch.ops.softmax_suite.cross_entropy_triton, (x16, t16, w.to(dtype), -100, 0.1, "mean")),
            (torch.ops.softmax_suite.softmax_backward_triton, (torch.randn(3, V).to(dtype), y16)),
        ):
            result = torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
            assert all(v == "SUCCESS" for v in result.values()), (op, dtype, result)


@interpreted
def test_softmax_ops_backward_is_the_registrys():
    assert ops.softmax_backward_for("triton") is ops.BACKWARD_OPS["triton"]
    # fused's backward is its own CUDA C kernel, registered as a custom op like Triton's.
    assert SOFTMAX_BACKWARD_OF["fused"] == "fused"
    assert ops.softmax_backward_for("fused") is ops.BACKWARD_OPS["fused"]
    x = logits(3, V, seed=2).requires_grad_(True)
    dy = torch.randn(3, V)
    y = ops.triton(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    want = SOFTMAX_BACKWARD_KERNELS["triton"](dy, y.detach())
    assert torch.equal(bits(dx), bits(want)), "the triton op's backward is not the Triton backward kernel"


@interpreted
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_gradient_is_the_forwards_times_grad_output(reduction):
    x, t = edge_rows(V, seed=3)
    w = _weight(V)
    o = {"weight": w, "label_smoothing": 0.1, "reduction": reduction}
    direct = tce.cross_entropy(x, t, **o)
    xg = x.clone().requires_grad_(True)
    loss, lse = ops.cross_entropy(xg, t, **o)
    assert not lse.requires_grad
    assert torch.equal(bits(loss.detach()), bits(direct.loss)) and torch.equal(bits(lse), bits(direct.lse))
    go = torch.rand(loss.shape) + 0.5 if reduction == "none" else torch.tensor(3.0)
    loss.backward(go)
    scaled = direct.grad * (go[:, None] if reduction == "none" else go)
    assert torch.equal(bits(xg.grad), bits(scaled)), "the backward is not the saved gradient times grad_output"
    # grad_output = 1 (loss.backward()): the saved gradient itself, its bits untouched.
    xg.grad = None
    loss, _ = ops.cross_entropy(xg, t, **o)
    loss.sum().backward()
    assert torch.equal(bits(xg.grad), bits(direct.grad))
    check_cross_entropy(direct, x, t, **o)


@interpreted
def test_a_training_step_fills_no_matrix():
    # The step's only (N, V) writes are the kernels' (the gradient): autograd does not fill zero
    # gradients for the outputs that take none (lse, the gradient), a memset of the matrix and a
    # second matrix of memory a step.
    x, t = edge_rows(V, seed=5)
    x.requires_grad_(True)
    with torch.profiler.profile(record_shapes=True) as prof:
        ops.cross_entropy(x, t)[0].backward()
    fills = [e.name for e in prof.events() if e.name in ("aten::zero_", "aten::fill_") and [*x.shape] in e.input_shapes]
    assert not fills, f"the step filled an {tuple(x.shape)} tensor: {fills}"
    assert torch.equal(bits(x.grad), bits(tce.cross_entropy(x.detach(), t).grad))


@interpreted
def test_a_bad_target_makes_the_step_nan_or_with_validate_a_value_error():
    x = logits(4, V, seed=6).requires_grad_(True)
    t = torch.tensor([0, V, 3, -100])
    loss, _ = ops.cross_entropy(x, t)  # no synchronisation: the bad row is NaN, and so the mean
    loss.backward()
    assert loss.isnan() and x.grad[1].isnan().all() and x.grad[[0, 2, 3]].isfinite().all()
    with pytest.raises(ValueError, match=f"outside \\[0, {V}\\)"):
        ops.cross_entropy(x, t, validate=True)


@interpreted
def test_a_second_backward_through_the_graph_raises_instead_of_scaling_twice():
    x, t = edge_rows(V, seed=4)
    x.requires_grad_(True)
    loss, _ = ops.cross_entropy(x, t)
    (2 * loss).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@interpreted
def test_a_training_step_compiles_without_a_graph_break():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, V)
    h = torch.randn(8, 8)
    t = edge_rows(V, seed=5)[1]

    def step(h, t):
        logits = lin(h)
        loss, lse = ops.cross_entropy(logits, t, label_smoothing=0.1)
        probs = ops.triton(logits)  # the forward op, whose backward is the Triton backward op
        # The loss scaled, so that its backward's grad_output is not 1 in either graph.
        return 2.5 * loss + 0.01 * (probs * probs).sum() + 0.001 * lse.sum().detach()

    explanation = torch._dynamo.explain(step)(h, t)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    targets_in_graph = {str(n.target) for g in explanation.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("cross_entropy_triton" in name for name in targets_in_graph), sorted(targets_in_graph)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(h, t).backward()
    got = {k: p.grad.clone() for k, p in lin.named_parameters()}
    lin.zero_grad()
    step(h, t).backward()
    for k, p in lin.named_parameters():
        assert torch.equal(bits(got[k]), bits(p.grad)), f"compiled and eager gradients of {k} differ"


@interpreted
def test_cross_entropy_op_gives_a_linear_layers_weight_gradient():
    """loss.backward() through the op and a linear layer: the weight's gradient within
    linear_weight_grad_expected's bound of the float64 one (the op's gradient bound carried
    through autograd's float32 product)."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(6, V)
    h = torch.randn(10, 6)
    t = torch.randint(0, V, (10,))
    t[4] = -100
    z = lin(h)
    loss, _ = ops.cross_entropy(z, t)
    loss.backward()
    ref, tol = linear_weight_grad_expected(h, z, t, reduction="mean")
    assert_within(lin.weight.grad, ref, tol, "weight gradient through ops.cross_entropy")


def test_interpreted_in_a_subprocess(pytestconfig):
    if tce.INTERPRET:
        pytest.skip("this process is interpreted already: the tests above ran here")
    run_interpreted_in_subprocess(__file__, pytestconfig)


@pytest.mark.slow  # the deeper tier: a build, no kernel runs
def test_loss_kernels_build_for_sm90_within_spill_budget(tmp_path):
    """The largest configuration of each training kernel, compiled for sm_90 ahead of time
    (kernels.triton_build --training --quick, in a child process: the compiled kernels are needed, so
    TRITON_INTERPRET must be unset there): no spills past the build's budget (none without a
    register cap) nor read or written inside a tile loop, within sm_90's limits; the splits
    read their launch tag before any barrier and fit two programs an SM, the streams as many as
    they launch.
    `python -m kernels.triton_build --training` builds every configuration the wrappers launch."""
    from kernels.triton_build import QUICK, resident_programs, spill_problem

    builds = sm90_builds(tmp_path, "--training", "--quick")
    built = {b["name"].split()[0] for b in builds}
    row_kernels = {"bwd-row", "bwd-split", "bwd-stream", "bwd-reread", "ce-row", "ce-split"}
    assert built >= row_kernels | {"ce-scale"}
    assert {b["name"] for b in builds} == QUICK, "every quick record is built, under its name"
    for b in builds:
        assert spill_problem(b) is None, f"{spill_problem(b)}: {b}"
        assert b["regs"] <= 255 and b["shared"] <= 232448, b
        kernel = b["name"].split()[0]
        if kernel in row_kernels and not (kernel == "bwd-stream" and b["name"].endswith("odd V")):
            # Built as launched on contiguous rows from aligned allocations: the row kernels move
            # their rows in 16-byte vectors, as on the GPU; at an odd V the splits too, cut on
            # 16-byte groups (kernels.triton_launch.training_cut). The stream reads rows where
            # they lie: at an odd V element by element.
            assert b["vector_loads"] and b["vector_stores"], b
        if kernel in ("bwd-split", "ce-split", "ce-held_split"):
            assert b["tag_read_first"], f"the launch tag is read behind a barrier: {b}"
            # A split program waits at its meetings; with one program an SM nothing fills the
            # wait (fp32 weighted, smoothed at 160 registers x 8 warps ran 1.9x slower, run (d)).
            assert resident_programs(b) >= 2, f"one program an SM: {b}"
        if kernel in ("bwd-stream", "ce-stream"):
            # A stream launch's programs walk the rows side by side, re-reading them from L2: a
            # build whose registers leave room for fewer runs the rest as a second wave (the
            # weighted stream at 180 registers, (4096, 50257): 1.31-1.34x slower on an H100).
            assert resident_programs(b) >= b["programs_per_sm"], f"fewer programs an SM than launched: {b}"


def test_outputs_are_allocated_contiguous_whatever_the_input_layout():
    from kernels.checks import prepare_output

    for x in (torch.randn(5, 3).t(), torch.randn(4, 6)[:, ::2], torch.randn(2, 3, 4)[:, 1]):
        out = prepare_output(x, None, kernel="k")
        assert out.is_contiguous() and out.shape == x.shape and out.dtype == x.dtype


def test_training_cut_sends_rows_out_of_step_in_stride_to_elements():
    from kernels.triton_launch import training_cut

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = 16 // torch.tensor([], dtype=dtype).element_size()
        y = torch.randn(4, 33).to(dtype)
        dy = torch.randn(4, 33 + 1).to(dtype)[:, :33]  # same start, row strides one element apart
        assert training_cut(33, y, dy)["rows"] == "elements", dtype
        dy = torch.randn(4, 33 + a).to(dtype)[:, :33]  # strides a group apart: in step
        assert training_cut(33, y, dy)["rows"] == "groups", dtype


def test_the_16_bit_training_settings_are_one_table():
    # float16 and bfloat16 rows take the same split settings; float32 its own.
    from kernels.triton_backward import launch_params

    for op in ("cross_entropy", "softmax_backward"):
        for rows in ("aligned", "groups", "elements"):
            for plain in (True, False):
                for V in (50257, 128256):
                    kw = {"op": op, "rows": rows} | ({"plain": plain} if op == "cross_entropy" else {})
                    half = launch_params("split", V, torch.float16, **kw)
                    assert half == launch_params("split", V, torch.bfloat16, **kw), (op, rows, plain, V)
