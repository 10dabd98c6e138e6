"""Registry-wide cases a kernel cannot pass by remembering, aliasing, switching with the batch or
being right only where the fixed grid looks (tests/adversaries.py holds one kernel per class).

Each case calls a kernel more than once, or at shapes and values the rest of the suite does not
pick: new contents in storage it has seen, a copy changed away from any sample, earlier outputs
and inputs read back after later calls, the same call twice, batches from 1 to a few thousand
rows (2^k - 1, 2^k, 2^k + 1, and every batch at which a kernel's plan changes path), rows past
several thousand elements, and Hypothesis' shapes and values. A failure names the property the
kernel broke (adversaries.BROKEN_PROPERTY words them).
"""

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kernels import CROSS_ENTROPY_KERNELS, SOFTMAX_BACKWARD_KERNELS, SOFTMAX_KERNELS
from tests.helpers import (
    INTERPRETED,
    assert_as_accurate_as_torch,
    assert_backward_close,
    bits,
    check_cross_entropy,
    check_softmax,
    dtype_id,
    logits,
    needs_triton,
    run_backward_poisoned,
    run_cross_entropy_poisoned,
    run_poisoned,
    skip_if_unavailable,
    skip_unless_runnable,
    targets,
)

try:
    from tests import adversaries
except ImportError:  # no Triton here: the corpus cannot load, and the cases needing it skip
    adversaries = None
PROPERTY = adversaries.BROKEN_PROPERTY if adversaries else {}
GAMING_CROSS_ENTROPY = adversaries.GAMING_CROSS_ENTROPY if adversaries else {}
GAMING_BACKWARD = adversaries.GAMING_BACKWARD if adversaries else {}
BATCH_SWITCH_CROSS_ENTROPY = adversaries.BATCH_SWITCH_CROSS_ENTROPY if adversaries else {}
BATCH_SWITCH_BACKWARD = adversaries.BATCH_SWITCH_BACKWARD if adversaries else {}

interpreted = pytest.mark.skipif(not INTERPRETED, reason="the kernels run on CPU tensors only under TRITON_INTERPRET=1")
B, V = 3, 37  # a few rows, each several of the CPU tiles (16) long
LONG_V = (5003,)  # past several thousand elements: longer than any other CPU case's row
DEFAULT_SWEEP_MAX_K = 12  # batches up to 2^12 + 1 rows
# The GPU sweep's largest batch holds at most this many elements (1 GiB of float32 with its
# float64 reference), so the longest rows sweep fewer batches; every threshold found below it runs.
SWEEP_ELEMENTS = 2**26


def broke(kernel: str, prop: str, detail: str) -> str:
    return f"{kernel} breaks a verifier's property: {prop} ({detail})"


def same_bits(a, b) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def tier_cases():
    """(kernel, dtype, tier): every kernel in its first dtype on the GPU, the interpretable ones on
    the CPU too (one dtype: the properties do not depend on it)."""
    cases = []
    for k in SOFTMAX_KERNELS.values():
        dtype = k.dtypes[0]
        if k.interpretable:
            marks = (pytest.mark.cpu, interpreted)
            cases.append(pytest.param(k.name, dtype, "cpu", id=f"{k.name}-{dtype_id(dtype)}-cpu", marks=marks))
        cases.append(pytest.param(k.name, dtype, "cuda", id=f"{k.name}-{dtype_id(dtype)}-cuda", marks=pytest.mark.cuda))
    return cases


TIER_CASES = tier_cases()
CPU_CASES = [p for p in TIER_CASES if p.values[2] == "cpu"]
CUDA_CASES = [p for p in TIER_CASES if p.values[2] == "cuda"]
on_both_tiers = pytest.mark.parametrize("kernel, dtype, where", TIER_CASES)
on_cpu = pytest.mark.parametrize("kernel, dtype, where", CPU_CASES)
on_cuda = pytest.mark.parametrize("kernel, dtype, where", CUDA_CASES)


def device_of(where):
    return "cuda" if where == "cuda" else "cpu"


def ready(kernel, where):
    k = SOFTMAX_KERNELS[kernel]
    (skip_unless_runnable if where == "cuda" else skip_if_unavailable)(k)
    return k


# -- the properties, one function each, run on both tiers -------------------------------------------


@on_both_tiers
def test_new_contents_in_reused_storage(kernel, dtype, where):
    k = ready(kernel, where)
    x = logits(B, V, seed=1, dtype=dtype, device=device_of(where))
    first = run_poisoned(k, x).clone()
    x.copy_(logits(B, V, seed=2, dtype=dtype, device=device_of(where)))
    again = run_poisoned(k, x)
    prop = PROPERTY.get("gaming_memo_by_address", "gaming_memo_by_address")
    check_softmax(again, x, what=broke(kernel, prop, "refilled x"))
    assert not same_bits(again, first), broke(kernel, "new contents give a new answer", "the old answer came back")


@on_both_tiers
def test_perturbed_copy_in_new_storage(kernel, dtype, where):
    k = ready(kernel, where)
    x = logits(B, V, seed=3, dtype=dtype, device=device_of(where))
    run_poisoned(k, x)
    # The same values in new storage give the same bits; then one interior entry per row moved.
    same = run_poisoned(k, x.clone())
    assert same_bits(same, run_poisoned(k, x)), broke(kernel, "same contents, same bits", "new storage")
    changed = x.clone()
    changed[:, V // 2] += 3.0
    got = run_poisoned(k, changed)
    prop = PROPERTY.get("gaming_memo_by_sample", "gaming_memo_by_sample")
    check_softmax(got, changed, what=broke(kernel, prop, "row centres moved"), kernel=k)


@on_both_tiers
def test_earlier_outputs_and_inputs_unchanged(kernel, dtype, where):
    k = ready(kernel, where)
    device = device_of(where)
    xs = [logits(B, V, seed=10 + i, dtype=dtype, device=device) for i in range(3)]
    kept = [x.clone() for x in xs]
    ys = [k(xs[0]), k(xs[1])]
    out = torch.full_like(xs[2], float("nan"))
    ys.append(k(xs[2], out=out))
    snapshot = [y.clone() for y in ys]
    k(xs[0])  # later calls, with and without out
    k(xs[1], out=torch.empty_like(xs[1]))
    prop = PROPERTY.get("gaming_kept_buffer", "gaming_kept_buffer")
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        assert same_bits(x, kept[i]), broke(kernel, "its inputs stay as they were", f"input {i} changed")
        assert same_bits(y, snapshot[i]), broke(kernel, prop, f"output {i} changed under the caller")
        check_softmax(y, x, what=broke(kernel, prop, f"output {i}"), kernel=k)
    pointers = {y.data_ptr() for y in ys} | {x.data_ptr() for x in xs}
    assert len(pointers) == 6, broke(kernel, "no aliasing between calls, with the input, or with out", "shared storage")


@on_both_tiers
def test_run_twice_bitwise(kernel, dtype, where):
    k = ready(kernel, where)
    x = logits(B, V, seed=4, dtype=dtype, device=device_of(where))
    assert same_bits(run_poisoned(k, x), run_poisoned(k, x)), broke(kernel, "run twice, same bits", "")


def default_sweep() -> list[int]:
    return sorted({n for j in range(DEFAULT_SWEEP_MAX_K + 1) for n in (2**j - 1, 2**j, 2**j + 1) if n > 0})


def plan_thresholds(k, V_, dtype, limit) -> list[int]:
    """Every batch (up to `limit`) at which the kernel's plan changes path at row length V_, with
    its neighbours: a kernel's own declared launch boundaries, whatever they are."""
    sweep, previous = default_sweep(), None
    found = []
    for n in sorted({*sweep, *range(1, 257)}.union(range(256, limit + 1, 256))):
        path = k.plan(n, V_, dtype)
        if previous is not None and path != previous:
            found += [n - 1, n, n + 1]
        previous = path
    return found


def batch_sweep(kernel, dtype, where, batches, V_):
    k = ready(kernel, where)
    x = logits(max(batches), V_, seed=5, dtype=dtype, device=device_of(where))
    full = run_poisoned(k, x)
    check_softmax(full, x, what=f"{kernel} at ({max(batches)}, {V_})", kernel=k)
    prop = PROPERTY.get("gaming_batch_switch", "gaming_batch_switch")
    for n in batches:
        got = run_poisoned(k, x[:n])
        if not same_bits(got, full[:n]):
            rows = (bits(got) != bits(full[:n])).any(dim=1).nonzero().flatten()[:4].tolist()
            raise AssertionError(broke(kernel, prop, f"rows {rows} of a batch of {n} vs of {max(batches)}"))


# -- the CPU tier -------------------------------------------------------------------------------------


# The interpreter runs a launch's programs one after another in Python: a Triton kernel's CPU
# sweep stops at 2^INTERPRETED_SWEEP_MAX_K + 1 rows (a launch costs it about a second), its GPU
# sweep goes on past every threshold.
INTERPRETED_SWEEP_MAX_K = 3


@on_cpu
def test_cpu_batch_sweep(kernel, dtype, where):
    """The default sweep at rows of a few elements, to a few thousand rows for a kernel in
    PyTorch ops, to 2^INTERPRETED_SWEEP_MAX_K + 1 for an interpreted one."""
    k = SOFTMAX_KERNELS[kernel]
    top = 2 ** (INTERPRETED_SWEEP_MAX_K if k.backend == "triton" else DEFAULT_SWEEP_MAX_K) + 1
    batch_sweep(kernel, dtype, "cpu", [n for n in default_sweep() if n <= top], 5)


@on_cpu
def test_cpu_rows_past_several_thousand(kernel, dtype, where):
    k = ready(kernel, "cpu")
    for V_ in LONG_V:
        x = logits(2, V_, seed=V_, dtype=dtype)
        prop = PROPERTY.get("gaming_short_rows_only", "gaming_short_rows_only")
        check_softmax(run_poisoned(k, x), x, what=broke(kernel, prop, f"(2, {V_})"), kernel=k)


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize("kernel", [p.values[0] for p in CPU_CASES])
@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rows=st.integers(1, 6), V_=st.integers(1, 300), seed=st.integers(0, 2**31 - 1), scale=st.floats(0.1, 30.0))
def test_cpu_random_shapes_and_values(kernel, rows, V_, seed, scale):
    """Shapes and values off the fixed grid (derandomised: a failure reproduces, and Hypothesis
    prints the failing example). Not shrunk: the examples are a few rows of at most 300 already,
    and shrinking an interpreted kernel's failure would cost tens of seconds per kernel."""
    k = ready(kernel, "cpu")
    x = logits(rows, V_, seed=seed, scale=scale, dtype=k.dtypes[0])
    check_softmax(run_poisoned(k, x), x, what=f"{kernel} at ({rows}, {V_}), scale {scale:.3g}", kernel=k)


# -- the GPU tier -------------------------------------------------------------------------------------


@on_cuda
def test_cuda_batch_sweep(kernel, dtype, where):
    """The default sweep, and every batch at which any kernel's plan changes path, at each row
    length a path of the registry is exercised at."""
    k = ready(kernel, "cuda")
    if k.baseline:
        pytest.skip("a baseline is not held to bit-for-bit batch invariance")
    lengths = sorted({p.gpu[1] for other in SOFTMAX_KERNELS.values() for p in other.spec.paths})
    for V_ in lengths:
        limit = max(2**DEFAULT_SWEEP_MAX_K + 1, 65536 * 8 // max(V_, 1))
        found = {n for other in SOFTMAX_KERNELS.values() for n in plan_thresholds(other, V_, dtype, limit)}
        batches = [n for n in sorted({*default_sweep(), *found}) if n <= 3 or n * V_ <= SWEEP_ELEMENTS]
        batch_sweep(kernel, dtype, "cuda", batches, V_)


@on_cuda
def test_cuda_complete_on_the_callers_stream(kernel, dtype, where):
    """What the caller's stream reads right after the call (no synchronisation) is the whole
    answer: work left on another stream leaves the NaN poison there."""
    k = ready(kernel, "cuda")
    x = logits(64, 4099, seed=6, dtype=dtype, device="cuda")
    out = torch.full_like(x, float("nan"))
    k(x, out=out)
    seen = out.clone()  # ordered after the caller's stream's work only
    torch.cuda.synchronize()
    prop = PROPERTY.get("gaming_side_stream", "gaming_side_stream")
    check_softmax(seen, x, what=broke(kernel, prop, "read on the caller's stream"), kernel=k)


# -- the training ops ---------------------------------------------------------------------------------


def training_cases(registry, extra):
    ours = [pytest.param(k.name, k, id=k.name) for k in registry.values() if k.interpretable]
    return ours + [pytest.param(name, fn, id=name) for name, fn in extra.items()]


def memo_free_cross_entropy(name, fn):
    """Refilled storage, an interior change and an earlier gradient read back after a later call."""
    x = logits(4, V, seed=21, dtype=torch.float32, neg_inf=False)
    t = targets(4, V, seed=21)
    first = run_cross_entropy_poisoned(fn, x, t, reduction="none")
    kept = first.grad.clone()
    x.copy_(logits(4, V, seed=22, dtype=torch.float32, neg_inf=False))
    x[:, V // 2] += 3.0
    again = run_cross_entropy_poisoned(fn, x, t, reduction="none")
    want = torch.nn.functional.cross_entropy(x.double(), t, reduction="none")
    assert torch.allclose(again.loss.double(), want, rtol=1e-5, atol=1e-6), broke(
        name, "new contents in reused storage give a new loss", f"{again.loss.tolist()} vs {want.tolist()}"
    )
    assert same_bits(first.grad, kept), broke(name, "an earlier gradient stays as it was", "changed by a later call")


def memo_free_backward(name, fn):
    dy = logits(4, V, seed=23, dtype=torch.float32, neg_inf=False)
    y = torch.softmax(logits(4, V, seed=24, dtype=torch.float64), dim=-1).float()
    first = fn(dy, y)
    kept = first.clone()
    dy2 = logits(4, V, seed=25, dtype=torch.float32, neg_inf=False)
    second = run_backward_poisoned(fn, dy2, y)
    want = y.double() * (dy2.double() - (y.double() * dy2.double()).sum(-1, keepdim=True))
    assert torch.allclose(second.double(), want, rtol=1e-4, atol=1e-6), broke(name, "a new dy gives a new dx", "")
    fn(dy2, y)
    assert same_bits(first, kept), broke(name, "an earlier dx stays as it was", "changed by a later call")
    assert first.data_ptr() not in (dy.data_ptr(), y.data_ptr()), broke(name, "dx aliases no input", "")


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize("name, fn", training_cases(CROSS_ENTROPY_KERNELS, {}))
def test_cpu_cross_entropy_remembers_nothing(name, fn):
    if hasattr(fn, "unavailable_reason"):
        skip_if_unavailable(fn)
    memo_free_cross_entropy(name, fn)


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize("name, fn", training_cases(SOFTMAX_BACKWARD_KERNELS, {}))
def test_cpu_softmax_backward_remembers_nothing(name, fn):
    if hasattr(fn, "unavailable_reason"):
        skip_if_unavailable(fn)
    memo_free_backward(name, fn)


# Slices of a 9-row batch run alone: one row, the head, and the tail, each against the batch's rows.
BATCH_SLICES = (slice(4, 5), slice(0, 3), slice(3, 9))


def batch_free_backward(name, fn):
    """A row's dx bits depend on its dy and y alone: not on the batch around it, nor on its place."""
    dy = logits(9, V, seed=26, dtype=torch.float32, neg_inf=False)
    y = torch.softmax(logits(9, V, seed=27, dtype=torch.float64), dim=-1).float()
    full = run_backward_poisoned(fn, dy, y)
    for rows in BATCH_SLICES:
        part = run_backward_poisoned(fn, dy[rows].clone(), y[rows].clone())
        what = f"rows {rows.start}-{rows.stop - 1} of 9, run alone"
        assert same_bits(part, full[rows]), broke(name, "a row's dx bits do not depend on the batch", what)


def batch_free_cross_entropy(name, fn):
    """A row's loss, log-sum-exp and gradient bits depend on its logits and target alone."""
    x = logits(9, V, seed=28, dtype=torch.float32, neg_inf=False)
    t = targets(9, V, seed=28)
    full = run_cross_entropy_poisoned(fn, x, t, reduction="none")
    for rows in BATCH_SLICES:
        part = run_cross_entropy_poisoned(fn, x[rows].clone(), t[rows].clone(), reduction="none")
        for field in ("loss", "lse", "grad"):
            what = f"{field} of rows {rows.start}-{rows.stop - 1} of 9, run alone"
            same = same_bits(getattr(part, field), getattr(full, field)[rows])
            assert same, broke(name, "a row's bits do not depend on the batch", what)


@pytest.mark.cpu
@interpreted
@pytest.mark.parametrize(
    "batch_free, name, fn",
    [
        pytest.param(batch_free, *case.values, id=f"{op}-{case.id}")
        for op, registry, batch_free in (
            ("softmax_backward", SOFTMAX_BACKWARD_KERNELS, batch_free_backward),
            ("cross_entropy", CROSS_ENTROPY_KERNELS, batch_free_cross_entropy),
        )
        for case in training_cases(registry, {})
    ],
)
def test_cpu_training_rows_do_not_depend_on_the_batch(batch_free, name, fn):
    if fn.baseline:
        pytest.skip("a baseline is not held to bit-for-bit batch invariance")
    skip_if_unavailable(fn)
    batch_free(name, fn)


def cross_entropy_semantics(name, fn, device):
    """PyTorch's answers where a kernel is most easily wrong: a mean over no counted rows is NaN
    (the sum 0, the gradient 0), and bfloat16 rows whose target holds nearly all the mass keep
    their small losses and gradients within the float64 reference's bounds (not asked of a
    baseline: F.cross_entropy in bfloat16 rounds those losses to 0)."""
    x = logits(3, V, seed=31, dtype=torch.float32, neg_inf=False).to(device)
    t = torch.full((3,), -100, device=device)
    mean = run_cross_entropy_poisoned(fn, x, t, reduction="mean")
    assert torch.isnan(mean.loss), broke(name, "a mean over no counted rows is NaN", f"got {mean.loss.item()}")
    assert not mean.grad.any(), broke(name, "the rows of an all-ignored batch have a zero gradient", "")
    total = run_cross_entropy_poisoned(fn, x, t, reduction="sum").loss.item()
    assert total == 0.0, broke(name, "a sum over no counted rows is 0", f"got {total}")
    if getattr(fn, "baseline", False):
        return
    x = logits(8, V, seed=32, dtype=torch.float32, neg_inf=False)
    t = targets(8, V, seed=32)
    rows = torch.arange(8)
    x[rows, t] = x.max(dim=1).values + torch.linspace(6.0, 12.0, 8)  # p_t from about 1 - 1e-1 to 1 - 1e-4
    x, t = x.to(device=device, dtype=torch.bfloat16), t.to(device)
    for reduction in ("none", "mean"):
        result = run_cross_entropy_poisoned(fn, x, t, reduction=reduction)
        check_cross_entropy(result, x, t, what=f"{name} bf16 confident targets, {reduction}", reduction=reduction)


@pytest.mark.cpu
@interpreted
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # the mean over no rows: 0 / 0
@pytest.mark.parametrize("name, fn", training_cases(CROSS_ENTROPY_KERNELS, {}))
def test_cpu_cross_entropy_semantics(name, fn):
    if hasattr(fn, "unavailable_reason"):
        skip_if_unavailable(fn)
    cross_entropy_semantics(name, fn, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(CROSS_ENTROPY_KERNELS))
def test_cuda_cross_entropy_semantics(name):
    fn = CROSS_ENTROPY_KERNELS[name]
    skip_unless_runnable(fn)
    cross_entropy_semantics(name, fn, "cuda")


@pytest.mark.cpu
@pytest.mark.parametrize("name", GAMING_CROSS_ENTROPY)
def test_a_remembering_cross_entropy_is_rejected(name):
    with pytest.raises(AssertionError, match="breaks a verifier's property"):
        memo_free_cross_entropy(name, GAMING_CROSS_ENTROPY[name])


@pytest.mark.cpu
@pytest.mark.parametrize("name", GAMING_BACKWARD)
def test_a_remembering_or_aliasing_backward_is_rejected(name):
    with pytest.raises(AssertionError, match="breaks a verifier's property"):
        memo_free_backward(name, GAMING_BACKWARD[name])


@pytest.mark.cpu
@pytest.mark.parametrize("name", BATCH_SWITCH_BACKWARD)
def test_a_backward_that_switches_with_the_batch_is_rejected(name):
    with pytest.raises(AssertionError, match="breaks a verifier's property"):
        batch_free_backward(name, BATCH_SWITCH_BACKWARD[name])
    # Its answers are right: only the bits across batches give it away.
    dy = logits(9, V, seed=26, dtype=torch.float32, neg_inf=False)
    y = torch.softmax(logits(9, V, seed=27, dtype=torch.float64), dim=-1).float()
    assert_backward_close(run_backward_poisoned(BATCH_SWITCH_BACKWARD[name], dy, y), dy, y, what=name)


@pytest.mark.cpu
@pytest.mark.parametrize("name", BATCH_SWITCH_CROSS_ENTROPY)
def test_a_cross_entropy_that_switches_with_the_batch_is_rejected(name):
    with pytest.raises(AssertionError, match="breaks a verifier's property"):
        batch_free_cross_entropy(name, BATCH_SWITCH_CROSS_ENTROPY[name])
    # Its answers are right: only the bits across batches give it away.
    x, t = logits(9, V, seed=28, dtype=torch.float32, neg_inf=False), targets(9, V, seed=28)
    check_cross_entropy(run_cross_entropy_poisoned(BATCH_SWITCH_CROSS_ENTROPY[name], x, t), x, t, what=name)


# -- verdicts that explain themselves -------------------------------------------------------------------


@pytest.mark.cpu
@needs_triton
@interpreted
def test_an_inaccurate_kernel_reads_its_ratio_and_the_field_that_states_a_tolerance():
    """A contributor's kernel failing accuracy is told the measured ratio to F.softmax's error
    and the KernelSpec field (`tolerances`) that states a looser rule; stated, it passes."""
    from dataclasses import replace

    from kernels.registry import Kernel

    spec = next(s for s in adversaries.CORPUS if s.name == "gaming_lower_precision")
    x = logits(B, V, seed=8)
    with pytest.raises(AssertionError, match=r"x F\.softmax's .*KernelSpec field `tolerances`") as verdict:
        check_softmax(run_poisoned(Kernel(spec), x), x, kernel=Kernel(spec))
    with pytest.raises(AssertionError, match="KernelSpec field `tolerances`"):
        assert_as_accurate_as_torch(run_poisoned(Kernel(spec), x), x, kernel=Kernel(spec))
    k = int(str(verdict.value).split("'k': ")[1].split("}")[0])
    loose = Kernel(replace(spec, tolerances={"float32": {"k": k}}))
    assert_as_accurate_as_torch(run_poisoned(loose, x), x, kernel=loose)
