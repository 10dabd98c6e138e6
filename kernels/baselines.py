"""The baselines every speed ratio and accuracy rule is measured against, for each op of the
registry (kernels/spec.py names them): PyTorch's own kernel and Inductor's (torch.compile) for
the softmax, its backward and the cross-entropy. Each checks its inputs as the suite's kernels
do, so a bad input gets the same clear error whichever kernel is called."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .checks import (
    check_backward_inputs,
    check_cross_entropy_inputs,
    check_out,
    check_softmax_input,
    prepare_dx,
    prepare_output,
)
from .spec import BACKWARD_BASELINE, BASELINE, CROSS_ENTROPY_BASELINE


def torch_softmax(x, *, out=None):
    """The baseline: `F.softmax` over the last dimension."""
    check_softmax_input(x, kernel=BASELINE, device_type=None)
    y = F.softmax(x, dim=-1)
    if out is None:
        return y
    return prepare_output(x, out, kernel=BASELINE).copy_(y)


# Dynamo's recompile limits while a compiled baseline is in use: the suite times each compiled
# baseline at a hundred or so (shape, dtype, option) combinations.
RECOMPILE_LIMIT = 1024


def static_compile(fn, *, backend="inductor"):
    """torch.compile(fn) as a fixed-shape program gets it: every shape, dtype and option it is
    called with compiled for itself (dynamic=False). Under Dynamo's defaults the second shape a
    compiled function meets would get a kernel generic in its sizes, and the ninth would run
    eagerly, so a suite timing many shapes would time neither the kernel a fixed-shape user runs
    nor torch.compile at all. Dynamo's recompile limits (process-wide) are raised to at least
    RECOMPILE_LIMIT here, once, rather than around each call, which would add tens of
    microseconds to the baseline's per-call time."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    return torch.compile(fn, dynamic=False, backend=backend)


@functools.cache
def _compiled_softmax():
    return static_compile(functools.partial(F.softmax, dim=-1))


def compiled_softmax(x, *, out=None):
    """The second baseline: `torch.compile(F.softmax)` (Inductor's kernel for x's shape)."""
    check_softmax_input(x, kernel="torch_compile", device_type="cuda")
    y = _compiled_softmax()(x)
    if out is None:
        return y
    return prepare_output(x, out, kernel="torch_compile").copy_(y)


def torch_softmax_backward(dy, y, *, out=None):
    """The baseline: PyTorch's own softmax backward kernel, torch._softmax_backward_data."""
    check_backward_inputs(dy, y, kernel=BACKWARD_BASELINE, device_type=None)
    dx = torch._softmax_backward_data(dy, y, -1, y.dtype)
    return dx if out is None else prepare_dx(dy, y, out, kernel=BACKWARD_BASELINE).copy_(dx)


@functools.cache
def _compiled_softmax_backward():
    return static_compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype))


def compiled_softmax_backward(dy, y, *, out=None):
    """The second baseline: Inductor's kernel for torch._softmax_backward_data."""
    check_backward_inputs(dy, y, kernel="torch_compile", device_type="cuda")
    dx = _compiled_softmax_backward()(dy, y)
    return dx if out is None else prepare_dx(dy, y, out, kernel="torch_compile").copy_(dx)


def _cross_entropy_baseline(name: str, loss_fn, kernel: str, device_type):
    """A PyTorch baseline's cross_entropy(logits, targets, ...) -> (loss, lse, grad): the inputs
    checked as `kernel`, then `loss_fn()`'s forward, its autograd backward, torch.logsumexp."""

    def cross_entropy(
        logits, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", out=None
    ):
        options = {"weight": weight, "ignore_index": ignore_index, "label_smoothing": label_smoothing}
        check_cross_entropy_inputs(
            logits, targets, **options, reduction=reduction, kernel=kernel, device_type=device_type
        )
        if out is not None:
            check_out(out, logits, f"{kernel} cross-entropy", name="the logits", targets=targets)
        x = logits.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = loss_fn()(x, targets, weight, ignore_index, label_smoothing, reduction)
            (grad,) = torch.autograd.grad(loss, x, torch.ones_like(loss))
        lse = torch.logsumexp(logits.detach().float(), dim=-1)
        if out is not None:
            grad = out.copy_(grad)
        return loss.detach(), lse, grad

    cross_entropy.__name__ = cross_entropy.__qualname__ = name
    return cross_entropy


def _f_cross_entropy(x, targets, weight, ignore_index, label_smoothing, reduction):
    return F.cross_entropy(
        x, targets, weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction
    )


@functools.cache
def _compiled_cross_entropy():
    return static_compile(_f_cross_entropy)


# The baseline: F.cross_entropy forward, its autograd backward, torch.logsumexp.
torch_cross_entropy = _cross_entropy_baseline(
    "torch_cross_entropy", lambda: _f_cross_entropy, CROSS_ENTROPY_BASELINE, None
)
# The second baseline: torch.compile(F.cross_entropy), forward and backward.
compiled_cross_entropy = _cross_entropy_baseline(
    "compiled_cross_entropy", _compiled_cross_entropy, "torch_compile", "cuda"
)
