"""Softmax kernels behind one registry.

Every entry of `SOFTMAX_KERNELS` is a `Kernel`: callable as `kernel(x, *, out=None) -> Tensor`
for a (B, V) tensor, computing softmax over V, and describing itself (dtypes, dispatch paths,
which path a shape takes). Tests and benchmarks iterate over this dict, so a kernel cannot
exist untested; a new kernel is one `Kernel(...)` line below. Importing this package touches
neither CUDA nor CuPy: each backend is imported on first call.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .checks import (
    FLOAT_DTYPES,
    check_backward_inputs,
    check_cross_entropy_inputs,
    check_softmax_input,
    prepare_dx,
    prepare_output,
)
from .cuda_plans import PATHS as FUSED_PATHS

BASELINE = "F_softmax"


@dataclass(frozen=True)
class Kernel:
    name: str
    fn: Callable  # fn(x, *, out=None) -> Tensor
    dtypes: tuple
    paths: tuple  # every dispatch path the kernel has
    plan: Callable[[int, int, torch.dtype], str]  # the path a (B, V) input of dtype takes on the GPU
    backend: str = "torch"  # what launches it: "cupy" (CUDA C), "triton" or "torch"
    interpretable: bool = False  # runs on CPU tensors under TRITON_INTERPRET=1
    baseline: bool = False  # a reference we measure against, not one of ours
    dtype_paths: Callable[[torch.dtype], tuple] | None = None  # where dispatch depends on dtype

    def __call__(self, x, *, out=None):
        return self.fn(x, out=out)

    def paths_for(self, dtype: torch.dtype) -> tuple:
        """The paths the dispatch takes for some input of `dtype` (all of `paths` by default)."""
        return self.paths if self.dtype_paths is None else self.dtype_paths(dtype)


def _lazy(module: str, attr: str):
    """A module attribute resolved on first use (then kept), so importing kernels imports no
    backend and a call costs no import machinery."""
    resolved = []

    def call(*args, **kwargs):
        if not resolved:
            resolved.append(getattr(importlib.import_module(module, __name__), attr))
        return resolved[0](*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = f"{module.lstrip('.')}.{attr}"
    return call


def torch_softmax(x, *, out=None):
    """The baseline: `F.softmax` over the last dimension."""
    check_softmax_input(x, kernel="F_softmax", device_type=None)
    y = F.softmax(x, dim=-1)
    if out is None:
        return y
    return prepare_output(x, out, kernel="F_softmax").copy_(y)


@functools.cache
def _compiled_softmax():
    return torch.compile(functools.partial(F.softmax, dim=-1))


def compiled_softmax(x, *, out=None):
    """The second baseline: `torch.compile(F.softmax)` (Inductor's generated kernel)."""
    check_softmax_input(x, kernel="torch_compile", device_type="cuda")
    y = _compiled_softmax()(x)
    if out is None:
        return y
    return prepare_output(x, out, kernel="torch_compile").copy_(y)


def _one_path(name):
    return lambda B, V, dtype=torch.float32: name


_FP32 = (torch.float32,)

SOFTMAX_KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel("naive", _lazy(".softmax_cuda", "softmax_naive"), _FP32, ("thread",), _one_path("thread"), "cupy"),
        Kernel("smem", _lazy(".softmax_cuda", "softmax_smem"), _FP32, ("block",), _one_path("block"), "cupy"),
        Kernel(
            "fused",
            _lazy(".softmax_cuda", "softmax_fused"),
            FLOAT_DTYPES,
            FUSED_PATHS,
            _lazy(".cuda_plans", "fused_path"),
            "cupy",
        ),
        Kernel(
            "triton",
            _lazy(".softmax_triton", "softmax"),
            FLOAT_DTYPES,
            ("tile", "rows", "row", "split", "stream"),  # kernels.softmax_triton.PATHS (a test holds them equal)
            _lazy(".softmax_triton", "plan"),
            "triton",
            interpretable=True,
            dtype_paths=_lazy(".softmax_triton", "paths_for"),
        ),
        Kernel(
            BASELINE, torch_softmax, FLOAT_DTYPES, ("torch",), _one_path("torch"), interpretable=True, baseline=True
        ),
        Kernel("torch_compile", compiled_softmax, FLOAT_DTYPES, ("compiled",), _one_path("compiled"), baseline=True),
    )
}

# What each kernel accepts; tests draw their dtype parameters from here.
SUPPORTED_DTYPES = {name: k.dtypes for name, k in SOFTMAX_KERNELS.items()}
# Ours, as opposed to the baselines we measure them against.
OUR_KERNELS = tuple(name for name, k in SOFTMAX_KERNELS.items() if not k.baseline)


def softmax(name: str):
    """The registered softmax called `name` (KeyError naming the choices otherwise)."""
    try:
        return SOFTMAX_KERNELS[name]
    except KeyError:
        raise KeyError(f"no softmax kernel {name!r}; registered: {', '.join(SOFTMAX_KERNELS)}") from None


# ============================================================================================
# The softmax backward and cross-entropy: separate specs and dicts beside the forward registry,
# iterated the same way by every test and benchmark of these operations.
# ============================================================================================

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


def _torch_cross_entropy_grad(loss_fn, logits, targets, weight, ignore_index, label_smoothing, reduction, out):
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
    check_cross_entropy_inputs(
        logits,
        targets,
        weight=weight,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
        kernel=CROSS_ENTROPY_BASELINE,
        device_type=None,
    )
    return _torch_cross_entropy_grad(
        _f_cross_entropy, logits, targets, weight, ignore_index, label_smoothing, reduction, out
    )


@functools.cache
def _compiled_cross_entropy():
    return torch.compile(_f_cross_entropy)


def compiled_cross_entropy(
    logits, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", out=None
):
    """The second baseline: torch.compile(F.cross_entropy), forward and backward."""
    check_cross_entropy_inputs(
        logits,
        targets,
        weight=weight,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
        kernel="torch_compile",
        device_type="cuda",
    )
    return _torch_cross_entropy_grad(
        _compiled_cross_entropy(), logits, targets, weight, ignore_index, label_smoothing, reduction, out
    )


SOFTMAX_BACKWARD_KERNELS: dict[str, BackwardKernel] = {
    k.name: k
    for k in (
        BackwardKernel(
            "triton",
            _lazy(".triton_backward", "softmax_backward"),
            FLOAT_DTYPES,
            ("row", "split", "tile"),  # kernels.triton_backward.PATHS (a test holds them equal)
            _lazy(".triton_backward", "plan"),
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
SOFTMAX_BACKWARD_OF: dict[str, str] = {"triton": "triton", "fused": BACKWARD_BASELINE}

CROSS_ENTROPY_KERNELS: dict[str, CrossEntropyKernel] = {
    k.name: k
    for k in (
        CrossEntropyKernel(
            "triton",
            _lazy(".triton_cross_entropy", "cross_entropy"),
            FLOAT_DTYPES,
            ("row", "split", "tile"),  # kernels.triton_cross_entropy.PATHS (a test holds them equal)
            _lazy(".triton_cross_entropy", "plan"),
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


__all__ = [
    "SOFTMAX_KERNELS",
    "SUPPORTED_DTYPES",
    "OUR_KERNELS",
    "BASELINE",
    "Kernel",
    "softmax",
    "torch_softmax",
    "compiled_softmax",
    "check_softmax_input",
    "prepare_output",
    "SOFTMAX_BACKWARD_KERNELS",
    "SOFTMAX_BACKWARD_OF",
    "CROSS_ENTROPY_KERNELS",
    "BACKWARD_BASELINE",
    "CROSS_ENTROPY_BASELINE",
    "BackwardKernel",
    "CrossEntropyKernel",
]
