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

from .checks import FLOAT_DTYPES, check_softmax_input, prepare_output
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
]
