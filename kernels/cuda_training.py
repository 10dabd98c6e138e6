"""CUDA C training kernels, compiled at run time through CuPy and launched through
`kernels.launch`, like the forward's (`kernels.softmax_cuda`): `softmax_backward_fused`, one
kernel of two reads and one write per element (kernels/cuda/softmax_backward.cu), and
`cross_entropy_fused`, F.cross_entropy with class-index targets and in the same pass over the
logits its gradient, one read and one write per element (kernels/cuda/cross_entropy.cu).

Both take float32 / bfloat16 / float16 on a CUDA device and compute in float32. Rows may have
any stride (a tensor whose elements are strided within a row is copied first); outputs are
new contiguous tensors unless `out` is given. Each row's result is bitwise independent of the
batch, of the row's position and alignment, of the strides and of the size class, because
every row sum is taken in 64-bit fixed point (see the .cu files). Which size class a shape
takes: `kernels.cuda_training_plans` (`backward_class_description` / `backward_path`,
`cross_entropy_class_description` / `cross_entropy_path`).

Cross-entropy runs three kernels: a one-block prologue over the targets (which counts and
weighs the rows and finds any target out of range), the fused pass, and for "mean" / "sum" a
one-block reduction of the per-row losses, order-free as well. A target outside [0, V) that is
not ignore_index raises ValueError from here, never a device assert: the wrapper reads the
prologue's finding back (a synchronisation), once the call's kernels are queued, or before the
fused pass when the gradient is to be written over the logits. Inside a CUDA graph capture, or
with validate=False, that read is skipped and such a row's loss and gradient come out NaN.
"""

from __future__ import annotations

import math

import torch

from .checks import (
    FLOAT_DTYPES,
    check_backward_inputs,
    check_cross_entropy_inputs,
    check_out,
    prepare_dx,
)
from .cuda_training_plans import (
    BACKWARD_SOURCE,
    CROSS_ENTROPY_SOURCE,
    TrainingClass,
    kernel_source,
    select_training_class,
    training_classes,
)
from .launch import KernelLauncher, device_info

# One cache of device facts, compiled modules and launchers for every CUDA C kernel.
from .softmax_cuda import ClassLaunch, check_columns, class_launch, cuda_launcher

TRAINING_DTYPES = FLOAT_DTYPES
HELPER_THREADS = 1024  # CE_HELPER_THREADS of cross_entropy.cu
_BWD = "fused softmax backward"
_CE = "fused cross-entropy"

_BWD_ARGS = ("ptr", "i64", "ptr", "i64", "ptr", "i64", "i32")
_CE_ARGS = ("ptr", "i64", "ptr", "i64", "ptr", "i64", "i32", "i64", "ptr", "ptr", "f32", "ptr", "ptr")
_PROLOGUE_ARGS = ("ptr", "i64", "i32", "i64", "ptr", "i32", "ptr", "ptr")
_REDUCE_ARGS = ("ptr", "i64", "ptr", "i32", "ptr")
_SOURCES = {"bwd": BACKWARD_SOURCE, "ce": CROSS_ENTROPY_SOURCE}


def _launcher(device_index: int, op: str, name: str, *, block: int, arg_kinds) -> KernelLauncher:
    return cuda_launcher(device_index, _SOURCES[op], name, block=block, arg_kinds=arg_kinds, source=kernel_source)


_dispatch: dict = {}  # (op, dtype, V, device) -> the dispatched size class's ClassLaunch


def _resolve(op: str, what: str, dev: int, V: int, dtype, size_class: TrainingClass | None) -> ClassLaunch:
    if size_class is None:
        key = (op, dtype, V, dev)
        entry = _dispatch.get(key)
        if entry is None:
            chosen = select_training_class(op, V, dtype, clusters=device_info(dev)[2] >= 9)
            entry = _dispatch[key] = _make_launch(op, dev, dtype, chosen)
        return entry
    if size_class not in training_classes(op, dtype):
        raise ValueError(f"{what}: {size_class} is not a size class of this kernel for {dtype}")
    if size_class.capacity is not None and V > size_class.capacity:
        raise ValueError(f"{what}: V = {V} does not fit {size_class.describe()}")
    if size_class.cluster > 1 and device_info(dev)[2] < 9:
        raise ValueError(f"{what}: {size_class.describe()} needs thread-block clusters (sm_90 or newer)")
    return _make_launch(op, dev, dtype, size_class)


def _make_launch(op: str, dev: int, dtype, size_class: TrainingClass) -> ClassLaunch:
    kinds = _BWD_ARGS if op == "bwd" else _CE_ARGS
    launcher = _launcher(dev, op, size_class.kernel_name(dtype), block=size_class.threads, arg_kinds=kinds)
    return class_launch(dev, size_class, launcher)


# -- input checks --------------------------------------------------------------------------------


def _check_cuda(t: torch.Tensor, name: str, what: str) -> None:
    if not t.is_cuda:
        raise ValueError(f"{what}: {name} must be a cuda tensor, got one on {t.device}")


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its rows are unit-stride (any row stride), else a contiguous copy."""
    return t if t.shape[1] == 1 or t.stride(1) == 1 else t.contiguous()


# -- softmax backward ----------------------------------------------------------------------------


def softmax_backward_fused(
    y: torch.Tensor,
    dy: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    size_class: TrainingClass | None = None,
    grid_cap: int | None = None,
) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy, -1)) over rows of (B, V) tensors y (the softmax's output) and
    dy (the gradient of it); float32 / bfloat16 / float16, y and dy of one dtype.

    `out`, if given, receives dx (contiguous, y's shape and dtype). `size_class` (one of
    `training_classes("bwd", dtype)`) and `grid_cap`: as kernels.softmax_cuda.softmax_fused takes them.
    """
    # Everything but the device first (kernels.checks), so a problem reads the same on any machine.
    check_backward_inputs(dy, y, kernel="fused", device_type=None)
    check_columns(y, _BWD)
    dx = prepare_dx(dy, y, out, kernel="fused")
    _check_cuda(y, "y", _BWD)
    y, dy = _unit_rows(y), _unit_rows(dy)
    B, V = y.shape
    if B == 0:
        return dx
    dev = y.get_device()
    entry = _resolve("bwd", _BWD, dev, V, y.dtype, size_class)
    entry.launcher(
        dev, entry.grid(B, grid_cap), y.data_ptr(), y.stride(0), dy.data_ptr(), dy.stride(0), dx.data_ptr(), B, V
    )
    return dx


# -- cross-entropy -------------------------------------------------------------------------------


class TargetError(ValueError):
    """A target that is neither ignore_index nor a class index in [0, V)."""


def _check_cross_entropy(logits, target, weight, ignore_index, label_smoothing, reduction, inplace, out):
    # kernels.checks' rules without the device, then the wrapper's own options, the device last.
    options = dict(weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    check_cross_entropy_inputs(logits, target, **options, kernel="fused", device_type=None)
    check_columns(logits, _CE)
    if inplace:
        if out is not None:
            raise ValueError(f"{_CE}: inplace=True writes the gradient over the logits; out must be None")
        if logits.shape[1] > 1 and logits.stride(1) != 1:
            raise ValueError(f"{_CE}: inplace=True needs logits with unit stride within rows")
        if logits.requires_grad:
            raise ValueError(f"{_CE}: inplace=True would overwrite logits that require grad")
    elif out is not None:
        check_out(out, logits, _CE, name="the logits", targets=target)
        if out.shape[1] > 1 and out.stride(1) != 1:
            raise ValueError(f"{_CE}: out must have unit stride within its rows")
    _check_cuda(logits, "logits", _CE)


def _raise_for_targets(stats: torch.Tensor, target: torch.Tensor, V: int, ignore_index: int) -> None:
    """The prologue's finding, read back (a synchronisation); TargetError naming the first bad row."""
    if torch.cuda.is_current_stream_capturing():
        return  # no read-back inside a graph capture: such rows come out NaN
    row = int(stats[0].item())
    if row < target.shape[0]:
        value = int(target[row].item())
        raise TargetError(
            f"{_CE}: target {value} at row {row} is out of range: class indices lie in [0, {V}) "
            f"(or equal ignore_index = {ignore_index})"
        )


def cross_entropy_fused(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    inplace: bool = False,
    out: torch.Tensor | None = None,
    size_class: TrainingClass | None = None,
    grid_cap: int | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """F.cross_entropy(logits, target, weight=, ignore_index=, label_smoothing=, reduction=) and
    its gradient with respect to the logits, in one pass: returns (loss, grad_logits, lse).

    loss: logits' dtype; a 0-d tensor for "mean" / "sum" (the weighted mean divides by the sum
        of the non-ignored rows' target weights, NaN when there are none, as PyTorch), shape (N,)
        for "none" (0 for ignored rows).
    grad_logits: d loss / d logits for "mean" / "sum"; for "none", the gradient of loss.sum()
        (multiply row i by the upstream gradient of loss[i] for another). In logits' dtype; the
        logits tensor itself with inplace=True (its values are then gone), `out` if given (unit
        stride within rows), else a new contiguous tensor. An upstream gradient other than 1
        for "mean" / "sum" is the caller's to apply.
    lse: float32 (N,), log(sum(exp(logits), -1)) per row, as torch.logsumexp (ignored rows too).

    weight: optional per-class weights (V,) of any float dtype (used in float32). A target
    neither equal to ignore_index nor in [0, V) raises TargetError (a ValueError); validate=False
    skips that check and its synchronisation (see the module's docstring).
    """
    _check_cross_entropy(logits, target, weight, ignore_index, label_smoothing, reduction, inplace, out)
    x = logits if inplace else _unit_rows(logits)
    N, V = x.shape
    dev = x.get_device()
    t = target.to(torch.int64).contiguous()
    w = None if weight is None else weight.to(torch.float32).contiguous()
    grad = x if inplace else (torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out)
    loss_rows = torch.empty(N, dtype=torch.float32, device=x.device)
    lse = torch.empty(N, dtype=torch.float32, device=x.device)
    if N == 0:
        if reduction == "none":
            return loss_rows.to(x.dtype), grad, lse
        return torch.full((), math.nan if reduction == "mean" else 0.0, dtype=x.dtype, device=x.device), grad, lse

    mean = int(reduction == "mean")
    params = torch.empty(4, dtype=torch.float32, device=x.device)
    stats = torch.empty(2, dtype=torch.int64, device=x.device)
    w_ptr = 0 if w is None else w.data_ptr()
    prologue = _launcher(dev, "ce", "ce_prologue", block=HELPER_THREADS, arg_kinds=_PROLOGUE_ARGS)
    prologue(dev, 1, t.data_ptr(), N, V, ignore_index, w_ptr, mean, params.data_ptr(), stats.data_ptr())
    if inplace and validate:  # the logits are about to be overwritten: no launch on a bad target
        _raise_for_targets(stats, t, V, ignore_index)

    entry = _resolve("ce", _CE, dev, V, x.dtype, size_class)
    entry.launcher(
        dev,
        entry.grid(N, grid_cap),
        x.data_ptr(),
        x.stride(0),
        grad.data_ptr(),
        grad.stride(0),
        t.data_ptr(),
        N,
        V,
        ignore_index,
        w_ptr,
        params.data_ptr(),
        float(label_smoothing),
        loss_rows.data_ptr(),
        lse.data_ptr(),
    )
    if reduction == "none":
        loss = loss_rows
    else:
        loss = torch.empty((), dtype=torch.float32, device=x.device)
        reduce = _launcher(dev, "ce", "ce_reduce", block=HELPER_THREADS, arg_kinds=_REDUCE_ARGS)
        reduce(dev, 1, loss_rows.data_ptr(), N, params.data_ptr(), mean, loss.data_ptr())
    loss = loss if loss.dtype == x.dtype else loss.to(x.dtype)
    if validate and not inplace:  # once every launch is queued: the GPU never waits for the host between them
        _raise_for_targets(stats, t, V, ignore_index)
    return loss, grad, lse


# -- the registry's calling conventions ------------------------------------------------------------
# kernels.SOFTMAX_BACKWARD_KERNELS and kernels.CROSS_ENTROPY_KERNELS call their entries as
# fn(dy, y, *, out=None) and fn(logits, targets, *, weight, ignore_index, label_smoothing,
# reduction, out=None) -> (loss, lse, grad); these adapt the two wrappers to that.


def registry_softmax_backward(dy: torch.Tensor, y: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The registry's calling convention (kernels.SOFTMAX_BACKWARD_KERNELS): dy first. The
    wrapper applies the suite-wide input checks of kernels.checks, so every backward rejects bad
    input alike."""
    return softmax_backward_fused(y, dy, out=out)


def registry_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The registry's calling convention (kernels.CROSS_ENTROPY_KERNELS): (loss, lse, grad); the
    wrapper applies the suite-wide input checks of kernels.checks. validate: as
    cross_entropy_fused's."""
    options = dict(weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    loss, grad, lse = cross_entropy_fused(logits, targets, **options, out=out, validate=validate)
    return loss, lse, grad
