"""Our softmax kernels as PyTorch custom operators, so `torch.compile` traces a model that calls
them without a graph break and CUDA graphs (mode="reduce-overhead") capture them.

    torch.ops.softmax_suite.fused(x)     the CUDA C fused kernel (CUDA tensors)
    torch.ops.softmax_suite.triton(x)    the Triton kernel (CUDA tensors; CPU tensors under
                                         TRITON_INTERPRET=1)

Each takes a (B, V) tensor and returns a new contiguous one. The fake implementation gives
the compiler the output's metadata without running anything. Both have a backward
(dx = y * (g - sum(g * y))), so a model that trains through them works too.

Eager callers should keep using `kernels.SOFTMAX_KERNELS`: the custom-op dispatcher adds
several microseconds per call, which is what the direct wrappers exist to avoid.
"""

from __future__ import annotations

import torch

from . import SOFTMAX_KERNELS
from .checks import FLOAT_DTYPES

NAMESPACE = "softmax_suite"


def _check(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} softmax: expected a 2-D (B, V) tensor, got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} softmax: dtype {x.dtype} is not supported")


def _define(name: str):
    kernel = SOFTMAX_KERNELS[name]

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
        g = grad.float()
        yf = y.float()
        return (yf * (g - (g * yf).sum(dim=-1, keepdim=True))).to(y.dtype)

    op.register_autograd(backward, setup_context=setup_context)
    return op


# One operator per kernel whose spec asks for it (kernels/spec.py, custom_op).
OPS = {k.name: _define(k.name) for k in SOFTMAX_KERNELS.values() if k.spec.custom_op}
fused = OPS["fused"]
triton = OPS["triton"]

__all__ = ["OPS", "fused", "triton", "NAMESPACE"]
