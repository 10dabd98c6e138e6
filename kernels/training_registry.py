"""The training side of the registry: softmax backward and cross-entropy kernels, in dicts of
their own beside the forward registry (kernels.registry), each with its baselines, iterated the
same way by every test and benchmark of these operations. The CUDA C kernels (kernels/
cuda_training.py) and the Triton ones (kernels/triton_backward.py, kernels/
triton_cross_entropy.py) are imported on their first call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .checks import FLOAT_DTYPES, check_backward_inputs, check_cross_entropy_inputs, prepare_dx
from .cuda_training_plans import PATHS as CUDA_TRAINING_PATHS
from .registry import _lazy, triton_missing

# The dispatch paths of the Triton softmax backward and cross-entropy (each has these three; their
# modules, kernels/triton_backward.py and triton_cross_entropy.py, take the names from here).
TRITON_TRAINING_PATHS = ("row", "split")


def _one_path(name):
    return lambda B, V, dtype=torch.float32: name


BACKWARD_BASELINE = "softmax_backward_data"
CROSS_ENTROPY_BASELINE = "F_cross_entropy"


@dataclass(frozen=True)
class BackwardKernel:
    """A softmax backward: `kernel(dy, y, *, out=None) -> dx` for (B, V) tensors, where y is the
    softmax output and dy the gradient of it; dx = y * (dy - sum(y * dy, -1))."""

    name: str
    fn: Callable  # fn(dy, y, *, out=None) -> Tensor
    dtypes: tuple
    paths: tuple
    plan: Callable[[int, int, torch.dtype], str]
    backend: str = "torch"
    interpretable: bool = False
    baseline: bool = False

    def __call__(self, dy, y, *, out=None):
        return self.fn(dy, y, out=out)

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run the kernel at all (its backend's package is missing)."""
        return triton_missing() if self.backend == "triton" else None


@dataclass(frozen=True)
class CrossEntropyKernel:
    """Cross-entropy over the last dimension with class-index targets:
    `kernel(logits, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0,
    reduction="mean", out=None) -> (loss, lse, grad)`, PyTorch's F.cross_entropy semantics; lse
    is the per-row log-sum-exp (float32) and grad the gradient of the loss with respect to the
    logits (of loss.sum() for reduction="none"), written into `out` when given."""

    name: str
    fn: Callable
    dtypes: tuple
    paths: tuple
    plan: Callable[[int, int, torch.dtype], str]
    backend: str = "torch"
    interpretable: bool = False
    baseline: bool = False

    def __call__(self, logits, targets, **options):
        return self.fn(logits, targets, **options)

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run the kernel at all (its backend's package is missing)."""
        return triton_missing() if self.backend == "triton" else None


def torch_softmax_backward(dy, y, *, out=None):
    """The baseline: PyTorch's own softmax backward kernel, torch._softmax_backward_data."""
    check_backward_inputs(dy, y, kernel=BACKWARD_BASELINE, device_type=None)
    dx = torch._softmax_backward_data(dy, y, -1, y.dtype)
    return dx if out is None else prepare_dx(y, out, kernel=BACKWARD_BASELINE).copy_(dx)


@functools.cache
def _compiled_softmax_backward():
    return torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype))


def compiled_softmax_backward(dy, y, *, out=None):
    """The second baseline: Inductor's kernel for torch._softmax_backward_data."""
    check_backward_inputs(dy, y, kernel="torch_compile", device_type="cuda")
    dx = _compiled_softmax_backward()(dy, y)
    return dx if out is None else prepare_dx(y, out, kernel="torch_compile").copy_(dx)


def _torch_cross_entropy_grad(
    loss_fn, logits, targets, weight, ignore_index, label_smoothing, reduction, out, *, kernel, device_type
):
    """A PyTorch baseline's (loss, lse, grad): the inputs checked as `kernel`, then `loss_fn`'s
    forward, its autograd backward, torch.logsumexp."""
    check_cross_entropy_inputs(
        logits,
        targets,
        weight=weight,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
        kernel=kernel,
        device_type=device_type,
    )
    x = logits.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(x, targets, weight, ignore_index, label_smoothing, reduction)
        (grad,) = torch.autograd.grad(loss, x, torch.ones_like(loss))
    lse = torch.logsumexp(logits.detach().float(), dim=-1)
    if out is not None:
        grad = out.copy_(grad)
    return loss.detach(), lse, grad


def _f_cross_entropy(x, targets, weight, ignore_index, label_smoothing, reduction):
    return F.cross_entropy(
        x, targets, weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction
    )


def torch_cross_entropy(
    logits, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", out=None
):
    """The baseline: F.cross_entropy forward, its autograd backward, torch.logsumexp."""
    return _torch_cross_entropy_grad(
        _f_cross_entropy,
        logits,
        targets,
        weight,
        ignore_index,
        label_smoothing,
        reduction,
        out,
        kernel=CROSS_ENTROPY_BASELINE,
        device_type=None,
    )


@functools.cache
def _compiled_cross_entropy():
    return torch.compile(_f_cross_entropy)


def compiled_cross_entropy(
    logits, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", out=None
):
    """The second baseline: torch.compile(F.cross_entropy), forward and backward."""
    return _torch_cross_entropy_grad(
        _compiled_cross_entropy(),
        logits,
        targets,
        weight,
        ignore_index,
        label_smoothing,
        reduction,
        out,
        kernel="torch_compile",
        device_type="cuda",
    )


SOFTMAX_BACKWARD_KERNELS: dict[str, BackwardKernel] = {
    k.name: k
    for k in (
        BackwardKernel(
            "fused",
            _lazy("kernels.cuda_training:registry_softmax_backward", "softmax backward"),
            FLOAT_DTYPES,
            CUDA_TRAINING_PATHS,
            _lazy("kernels.cuda_training_plans:backward_path", "plan"),
            "cupy",
        ),
        BackwardKernel(
            "triton",
            _lazy("kernels.triton_backward:softmax_backward", "softmax backward"),
            FLOAT_DTYPES,
            TRITON_TRAINING_PATHS,
            _lazy("kernels.triton_backward:plan", "plan"),
            "triton",
            interpretable=True,
        ),
        BackwardKernel(
            BACKWARD_BASELINE,
            torch_softmax_backward,
            FLOAT_DTYPES,
            ("torch",),
            _one_path("torch"),
            interpretable=True,
            baseline=True,
        ),
        BackwardKernel(
            "torch_compile",
            compiled_softmax_backward,
            FLOAT_DTYPES,
            ("compiled",),
            _one_path("compiled"),
            baseline=True,
        ),
    )
}

# The backward each forward softmax op (kernels/ops.py) runs: forward kernel -> an entry of
# SOFTMAX_BACKWARD_KERNELS. A forward kernel's own backward replaces the baseline here.
SOFTMAX_BACKWARD_OF: dict[str, str] = {"triton": "triton", "fused": "fused"}

CROSS_ENTROPY_KERNELS: dict[str, CrossEntropyKernel] = {
    k.name: k
    for k in (
        CrossEntropyKernel(
            "fused",
            _lazy("kernels.cuda_training:registry_cross_entropy", "cross-entropy"),
            FLOAT_DTYPES,
            CUDA_TRAINING_PATHS,
            _lazy("kernels.cuda_training_plans:cross_entropy_path", "plan"),
            "cupy",
        ),
        CrossEntropyKernel(
            "triton",
            _lazy("kernels.triton_cross_entropy:cross_entropy", "cross-entropy"),
            FLOAT_DTYPES,
            TRITON_TRAINING_PATHS,
            _lazy("kernels.triton_cross_entropy:plan", "plan"),
            "triton",
            interpretable=True,
        ),
        CrossEntropyKernel(
            CROSS_ENTROPY_BASELINE,
            torch_cross_entropy,
            FLOAT_DTYPES,
            ("torch",),
            _one_path("torch"),
            interpretable=True,
            baseline=True,
        ),
        CrossEntropyKernel(
            "torch_compile", compiled_cross_entropy, FLOAT_DTYPES, ("compiled",), _one_path("compiled"), baseline=True
        ),
    )
}
