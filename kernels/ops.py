"""Our kernels as PyTorch custom operators, so `torch.compile` traces a model that calls them
without a graph break and CUDA graphs (mode="reduce-overhead") capture them.

    torch.ops.softmax_suite.fused(x)     the CUDA C fused softmax (CUDA tensors)
    torch.ops.softmax_suite.triton(x)    the Triton softmax (CUDA tensors; CPU tensors under
                                         TRITON_INTERPRET=1)
    torch.ops.softmax_suite.softmax_backward_triton(grad, y)
                                         the Triton softmax backward: y * (grad - sum(grad * y))
    torch.ops.softmax_suite.cross_entropy_triton(logits, targets, weight, ignore_index,
                                                 label_smoothing, reduction, validate=False)
                                         (loss, lse, grad): the Triton cross-entropy
    torch.ops.softmax_suite.cross_entropy_grad_scale_(grad, grad_output)
                                         its backward in eager mode: grad *= grad_output, in place
    torch.ops.softmax_suite.cross_entropy_grad_scaled(grad, grad_output)
                                         its backward when traced: grad * grad_output, new

Each softmax op takes a (B, V) tensor and returns a new contiguous one. The fake implementations
give the compiler the outputs' metadata without running anything.

Backward of the softmax ops. Which kernel runs it is a registry fact:
`kernels.SOFTMAX_BACKWARD_OF` maps each forward kernel to an entry of
`kernels.SOFTMAX_BACKWARD_KERNELS`. An entry of ours runs as its own custom op
(`softmax_backward_<name>`, defined here for every non-baseline entry), a baseline as the
traceable PyTorch call it wraps.

Cross-entropy. `cross_entropy_triton` computes the gradient with respect to the logits in its
forward pass and returns it as a third output (not differentiable, like lse); autograd saves it,
and the backward multiplies it by grad_output. In eager mode that happens in place
(`cross_entropy_grad_scale_`), touching no row whose grad_output is 1, so `loss.backward()` costs
one launch and no pass over the gradient; the saved gradient is consumed: a second backward
through the same graph (retain_graph=True) raises autograd's error about a saved tensor modified
in place, rather than scaling twice. Traced by torch.compile / AOTAutograd, the backward is the
functional `cross_entropy_grad_scaled` (one read and one write of the gradient): an in-place
update of a forward output inside a compiled backward is not something AOTAutograd accepts
when that output is also returned (opcheck's test_aot_dispatch_dynamic fails on it).
`cross_entropy(...)` below is the functional entry that returns (loss, lse).

Eager callers should keep using the registries: the custom-op dispatcher adds several
microseconds per call, which is what the direct wrappers exist to avoid.
"""

from __future__ import annotations

import torch

from . import CROSS_ENTROPY_KERNELS, SOFTMAX_BACKWARD_KERNELS, SOFTMAX_BACKWARD_OF, SOFTMAX_KERNELS
from .checks import CROSS_ENTROPY_REDUCTIONS, FLOAT_DTYPES, check_backward_inputs, check_cross_entropy_inputs

NAMESPACE = "softmax_suite"


def _check(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} softmax: expected a 2-D (B, V) tensor, got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} softmax: dtype {x.dtype} is not supported")


# -- the softmax backward ------------------------------------------------------------------------


def _define_backward(name: str):
    kernel = SOFTMAX_BACKWARD_KERNELS[name]

    @torch.library.custom_op(f"{NAMESPACE}::softmax_backward_{name}", mutates_args=())
    def op(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return kernel(grad, y)

    @op.register_fake
    def _(grad, y):
        check_backward_inputs(grad, y, kernel=name, device_type=None)
        return torch.empty(y.shape, dtype=y.dtype, device=y.device)

    return op


BACKWARD_OPS = {name: _define_backward(name) for name, k in SOFTMAX_BACKWARD_KERNELS.items() if not k.baseline}


def softmax_backward_for(forward: str):
    """The traceable backward (grad, y) -> dx of the softmax op of forward kernel `forward`."""
    name = SOFTMAX_BACKWARD_OF[forward]
    return BACKWARD_OPS.get(name) or SOFTMAX_BACKWARD_KERNELS[name].fn


# -- the softmax ops -----------------------------------------------------------------------------


def _define(name: str):
    kernel = SOFTMAX_KERNELS[name]
    backward_of = softmax_backward_for(name)

    @torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return kernel(x)

    @op.register_fake
    def _(x):
        _check(x, name)
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return backward_of(grad, y)

    op.register_autograd(backward, setup_context=setup_context)
    return op


# One operator per kernel whose spec asks for it (kernels/spec.py, custom_op).
OPS = {k.name: _define(k.name) for k in SOFTMAX_KERNELS.values() if k.spec.custom_op}
fused = OPS["fused"]
triton = OPS["triton"]


# -- cross-entropy -------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_grad_scale_", mutates_args=("grad",))
def cross_entropy_grad_scale_(grad: torch.Tensor, grad_output: torch.Tensor) -> None:
    from .triton_cross_entropy import scale_gradient_

    scale_gradient_(grad, grad_output)


@cross_entropy_grad_scale_.register_fake
def _(grad, grad_output):
    return None


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_grad_scaled", mutates_args=())
def cross_entropy_grad_scaled(grad: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    from .triton_cross_entropy import scaled_gradient

    return scaled_gradient(grad, grad_output)


@cross_entropy_grad_scaled.register_fake
def _(grad, grad_output):
    return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_triton", mutates_args=())
def cross_entropy_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    validate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    options = dict(weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    return tuple(CROSS_ENTROPY_KERNELS["triton"](logits, targets, **options, validate=validate))


@cross_entropy_triton.register_fake
def _(logits, targets, weight, ignore_index, label_smoothing, reduction, validate=False):
    options = dict(weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    check_cross_entropy_inputs(logits, targets, **options, kernel="triton", device_type=None)
    N = logits.shape[0]
    loss = logits.new_empty((N,) if reduction == "none" else ())
    return loss, logits.new_empty((N,), dtype=torch.float32), logits.new_empty(logits.shape)


def _ce_setup_context(ctx, inputs, output):
    _, lse, grad = output
    ctx.mark_non_differentiable(lse, grad)
    ctx.save_for_backward(grad)
    # lse and grad take no gradient: left as None, not materialised as zeros (a memset of the
    # whole (N, V) matrix a step, which then also held a second matrix of memory).
    ctx.set_materialize_grads(False)


def _ce_backward(ctx, grad_loss, grad_lse, grad_grad):
    if grad_loss is None:
        return None, None, None, None, None, None, None
    (grad,) = ctx.saved_tensors
    if type(grad) is torch.Tensor:
        # Eager: scale the saved gradient in place, skipping every row whose factor is 1.
        torch.ops.softmax_suite.cross_entropy_grad_scale_(grad, grad_loss)
        return grad, None, None, None, None, None, None
    # Traced (fake or functional tensors under torch.compile / AOTAutograd): the functional form,
    # since a compiled graph may also return the forward's gradient output that a mutation would
    # change behind its back.
    return torch.ops.softmax_suite.cross_entropy_grad_scaled(grad, grad_loss), None, None, None, None, None, None


cross_entropy_triton.register_autograd(_ce_backward, setup_context=_ce_setup_context)


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    validate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse) of F.cross_entropy(logits, targets, ...) through the Triton op; the loss is
    differentiable with respect to the logits, lse (float32, per row) is not.

    validate: read the targets' check back and raise a ValueError for a target outside [0, V)
    that is not ignore_index. Off by default: that read is a synchronisation, which would stop
    the host from queueing a training step ahead of the GPU (F.cross_entropy on a GPU does not
    stop either; it reports a bad target from the device). Unchecked, such a row's loss and
    gradient are NaN, so the step's loss is NaN, never a number."""
    if reduction not in CROSS_ENTROPY_REDUCTIONS:
        raise ValueError(
            f"triton cross-entropy: reduction must be one of {CROSS_ENTROPY_REDUCTIONS}, got {reduction!r}"
        )
    loss, lse, _ = torch.ops.softmax_suite.cross_entropy_triton(
        logits, targets, weight, int(ignore_index), float(label_smoothing), reduction, bool(validate)
    )
    return loss, lse
