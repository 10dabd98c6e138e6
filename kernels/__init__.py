"""Softmax kernels behind one registry.

Every entry of `SOFTMAX_KERNELS` has the signature `fn(x, *, out=None) -> Tensor` for a
(B, V) tensor and computes softmax over V. Tests and benchmarks iterate over this dict, so a
kernel cannot exist untested. Importing this package touches neither CUDA nor CuPy: each
backend is imported on first call.
"""

import importlib

import torch
import torch.nn.functional as F

from .checks import check_softmax_input, prepare_output


def torch_softmax(x, *, out=None):
    """The baseline: `F.softmax` over the last dimension."""
    check_softmax_input(x, kernel="F.softmax", device_type=None)
    y = F.softmax(x, dim=-1)
    if out is None:
        return y
    return prepare_output(x, out, kernel="F.softmax").copy_(y)


def _lazy(module: str, attr: str):
    def call(x, *, out=None):
        return getattr(importlib.import_module(module, __name__), attr)(x, out=out)
    call.__name__ = attr
    call.__qualname__ = f"{module.lstrip('.')}.{attr}"
    return call


# name -> callable; the CUDA C kernels need CuPy and a GPU, Triton runs on a GPU or, under
# TRITON_INTERPRET=1, on CPU tensors.
SOFTMAX_KERNELS = {
    "naive": _lazy(".softmax_cuda", "softmax_naive"),
    "smem": _lazy(".softmax_cuda", "softmax_smem"),
    "fused": _lazy(".softmax_cuda", "softmax_fused"),
    "triton": _lazy(".softmax_triton", "softmax"),
    "F_softmax": torch_softmax,
}

# What each kernel accepts; tests draw their dtype parameters from here.
SUPPORTED_DTYPES = {
    "naive": (torch.float32,),
    "smem": (torch.float32,),
    "fused": (torch.float32, torch.bfloat16, torch.float16),
    "triton": (torch.float32, torch.bfloat16, torch.float16),
    "F_softmax": (torch.float32, torch.bfloat16, torch.float16),
}

__all__ = ["SOFTMAX_KERNELS", "SUPPORTED_DTYPES", "torch_softmax", "check_softmax_input", "prepare_output"]
