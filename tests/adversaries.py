"""Softmax kernels that game a verifier rather than compute: each is accurate wherever a lax
suite looks, and wrong, or not doing the work, somewhere a kernel under test could hide it.

Registered through the public seam like the broken kernels (tests/broken_kernels.py, whose
one-path wrapper they reuse), and checked by the same child run of tests/test_new_kernels.py:

    SOFTMAX_SUITE_EXTRA_KERNELS=tests.adversaries:CORPUS pytest -m cpu -k gaming_

The classes, each the way a verifier was beaten in public:
  memo_by_address      answers from a cache keyed on the input's address and shape
  memo_by_sample       answers from a cache keyed on a few sampled entries and the shape
  kept_buffer          returns (without `out`) one buffer it keeps, rewritten at every call
  batch_switch         sums in the other order once a batch reaches BATCH_SWITCH rows
  short_rows_only      normalises over the first SHORT_ROW entries alone: right on short rows
  lower_precision      computes in bfloat16 and widens the result back to float32
  side_stream          (CUDA) writes the output on a stream of its own, after a delay, so the
                       call returns before the work is done
  honest_control       the float32 softmax in PyTorch ops, with none of the above

The memos, like any kernel that remembers, give the right answer the first time they see an
input; the cases that catch them call twice.
"""

from __future__ import annotations

import torch

from kernels.checks import check_softmax_input, prepare_output
from kernels.spec import KernelSpec, Path
from tests.broken_kernels import DEVICE_TYPE, _spec, tail_faulted_softmax
from tests.broken_loss_kernels import standard

# Past the CPU matrix's batches (a handful of rows) and below the default sweep's largest.
BATCH_SWITCH = 1000
# Past the longest row the public-entry CPU case used (2049), below the ones a CPU case now uses.
SHORT_ROW = 4096
# The side stream's head start: long enough that the caller's stream reads a poisoned output.
SIDE_STREAM_CYCLES = 50_000_000


def honest(x):
    return tail_faulted_softmax(x)


def _memo(name, key_of):
    memo: dict = {}

    def launch(x, y, BLOCK):
        key = key_of(x)
        if key not in memo:
            memo[key] = honest(x)
        y.copy_(memo[key])

    return _spec(name, launch, backend="torch")


def _address_key(x):
    return (x.data_ptr(), tuple(x.shape), tuple(x.stride()))


def _sample_key(x):
    # Corners and the first column: what a verifier that perturbs rows "somewhere" would change.
    return (tuple(x.shape), x[0, 0].item(), x[-1, -1].item(), x[:, 0].sum().item())


def _batch_switch(x, y, BLOCK):
    if x.shape[0] < BATCH_SWITCH:
        y.copy_(honest(x))
        return
    # The same float32 arithmetic, the row's exponentials summed from the other end: as accurate,
    # other bits.
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    y.copy_(e / e.flip(-1).cumsum(-1)[:, -1:])


def _short_rows_only(x, y, BLOCK):
    head = x[:, :SHORT_ROW]
    y.zero_()
    y[:, :SHORT_ROW] = honest(head)


def _lower_precision(x, y, BLOCK):
    y.copy_(torch.softmax(x.to(torch.bfloat16), dim=-1).float())


def _side_stream(x, y, BLOCK):
    if not x.is_cuda:
        y.copy_(honest(x))
        return
    side = torch.cuda.Stream(device=x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        torch.cuda._sleep(SIDE_STREAM_CYCLES)
        y.copy_(honest(x))
    # No wait of the caller's stream on `side`: a timer or a reader on it sees nothing pending.


def _kept_buffer(name) -> KernelSpec:
    kept: list = []

    def run_path(x, path, *, out=None, BLOCK=None):
        check_softmax_input(x, kernel=name, dtypes=(torch.float32,), device_type=DEVICE_TYPE)
        if out is not None:
            return prepare_output(x, out, kernel=name).copy_(honest(x))
        if not kept or kept[0].shape != x.shape or kept[0].device != x.device:
            kept[:] = [torch.empty_like(x)]
        return kept[0].copy_(honest(x))

    def softmax(x, *, out=None):
        return run_path(x, "tile", out=out)

    path = Path("tile", gpu=(5, 100), cpu={"BLOCK": 16})
    return KernelSpec(name, softmax, (path,), ("float32",), backend="torch", run_path=run_path, interpretable=True)


CORPUS = (
    _memo("gaming_memo_by_address", _address_key),
    _memo("gaming_memo_by_sample", _sample_key),
    _kept_buffer("gaming_kept_buffer"),
    _spec("gaming_batch_switch", _batch_switch, backend="torch"),
    _spec("gaming_short_rows_only", _short_rows_only, backend="torch"),
    _spec("gaming_lower_precision", _lower_precision, backend="torch"),
    _spec("gaming_side_stream", _side_stream, backend="torch"),
    _spec("gaming_honest_control", lambda x, y, BLOCK: y.copy_(honest(x)), backend="torch"),
)
HONEST = ("gaming_honest_control",)

# The property each breaks, and the registry-wide cpu cases meant to catch it (a prefix of the
# test's name; others may fail too).
BROKEN_PROPERTY = {
    "gaming_memo_by_address": "new contents in reused storage give a new answer",
    "gaming_memo_by_sample": "an input changed where a sample does not look gives a new answer",
    "gaming_kept_buffer": "an earlier output stays as it was after later calls",
    "gaming_batch_switch": "a row's bits do not depend on the batch size",
    "gaming_short_rows_only": "rows longer than the fixed grid's are right",
    "gaming_lower_precision": "the output is within the float32 tolerance",
    "gaming_side_stream": "the output is complete when the call returns on the caller's stream",
}
CAUGHT_BY = {
    "gaming_memo_by_address": ("test_new_contents_in_reused_storage",),
    "gaming_memo_by_sample": ("test_perturbed_copy_in_new_storage",),
    "gaming_kept_buffer": ("test_earlier_outputs_and_inputs_unchanged",),
    "gaming_batch_switch": ("test_cpu_batch_sweep",),
    "gaming_short_rows_only": ("test_cpu_rows_past_several_thousand",),
    "gaming_lower_precision": ("test_cpu_path_under_layout",),
}
CUDA_CAUGHT_BY = {
    "gaming_side_stream": ("test_adversaries.py", ("test_cuda_complete_on_the_callers_stream",)),
}
# Honest on CPU tensors: only a CUDA stream lets it return before its work is done.
CUDA_ONLY = ("gaming_side_stream",)


# -- the training ops: a cross-entropy that remembers, a backward that keeps its dx, and one of each
#    that sums in the other order once a batch reaches TRAINING_BATCH_SWITCH rows ------------------

TRAINING_BATCH_SWITCH = 8  # past the few rows a CPU case alone would hold


def _memo_cross_entropy():
    memo: dict = {}

    def cross_entropy(logits, target, *, out=None, **options):
        key = (logits.data_ptr(), tuple(logits.shape), options.get("reduction", "mean"))
        if key not in memo:
            memo[key] = standard(logits, target, **options)
        loss, lse, grad = memo[key]
        out = torch.empty_like(logits) if out is None else out
        return loss, lse, out.copy_(grad)

    return cross_entropy


def _kept_dx_backward():
    kept: list = []

    def backward(dy, y, *, out=None):
        dx = y * (dy - (y * dy).sum(-1, keepdim=True))
        if out is not None:
            return out.copy_(dx)
        if not kept or kept[0].shape != dx.shape:
            kept[:] = [torch.empty_like(dx)]
        return kept[0].copy_(dx)

    return backward


def _batch_switch_backward(dy, y, *, out=None):
    t = y.float() * dy.float()
    s = (t.flip(-1) if dy.shape[0] >= TRAINING_BATCH_SWITCH else t).sum(-1, keepdim=True)
    dx = (y.float() * (dy.float() - s)).to(y.dtype)
    return dx if out is None else out.copy_(dx)


def _batch_switch_cross_entropy(logits, target, *, weight=None, ignore_index=-100, out=None, **options):
    if logits.shape[0] < TRAINING_BATCH_SWITCH:
        return standard(logits, target, weight=weight, ignore_index=ignore_index, out=out, **options)
    # The classes in reverse order: the same loss and gradient, summed the other way round.
    V = logits.shape[1]
    flipped = torch.where(target == ignore_index, target, V - 1 - target)
    w = None if weight is None else weight.flip(0)
    loss, lse, grad = standard(logits.flip(-1), flipped, weight=w, ignore_index=ignore_index, **options)
    grad = grad.flip(-1)
    return loss, lse, grad if out is None else out.copy_(grad)


GAMING_CROSS_ENTROPY = {"gaming_memo_cross_entropy": _memo_cross_entropy()}
GAMING_BACKWARD = {"gaming_kept_dx_backward": _kept_dx_backward()}
BATCH_SWITCH_CROSS_ENTROPY = {"gaming_batch_switch_cross_entropy": _batch_switch_cross_entropy}
BATCH_SWITCH_BACKWARD = {"gaming_batch_switch_backward": _batch_switch_backward}
