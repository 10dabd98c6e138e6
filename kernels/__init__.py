"""Softmax, softmax-backward and cross-entropy kernels behind one registry.

`REGISTRY[op]` maps each kernel's name to a `Kernel` for the three ops of `kernels.spec.OPS`;
`SOFTMAX_KERNELS`, `SOFTMAX_BACKWARD_KERNELS` and `CROSS_ENTROPY_KERNELS` are its views. A
softmax `Kernel` is callable as `kernel(x, *, out=None) -> Tensor` for a (B, V) tensor,
computing softmax over V, and describes itself (dtypes, dispatch paths, which path a shape
takes, the facts of its `KernelSpec`). Tests and benchmarks iterate over these dicts, so a
kernel cannot exist untested; a new kernel of any op is one `KernelSpec(...)` in
`kernels/spec.py` (README, "Adding a kernel").

Importing this package imports neither torch, CUDA nor CuPy: `kernels.spec` is plain Python
(the report harness reads it without torch), the registry is built on first use of one of its
names, and each backend is imported on a kernel's first call.
"""

from __future__ import annotations

import importlib

from .spec import (
    BACKWARD_BASELINE,
    BASELINE,
    CROSS_ENTROPY_BASELINE,
    LAB_POINT,
    LAB_SHAPES,
    OPS,
    SPECS,
    KernelSpec,
    Path,
    matrix_bytes,
)

# name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "REGISTRY": ".registry",
    "SOFTMAX_KERNELS": ".registry",
    "SOFTMAX_BACKWARD_KERNELS": ".registry",
    "SOFTMAX_BACKWARD_OF": ".registry",
    "CROSS_ENTROPY_KERNELS": ".registry",
    "SUPPORTED_DTYPES": ".registry",
    "OUR_KERNELS": ".registry",
    "EXTRA_KERNELS_ENV": ".registry",
    "Kernel": ".registry",
    "torch_softmax": ".baselines",
    "compiled_softmax": ".baselines",
    "check_softmax_input": ".checks",
    "prepare_output": ".checks",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


# The names from kernels.spec, then every lazy one.
__all__ = [
    "BACKWARD_BASELINE",
    "BASELINE",
    "CROSS_ENTROPY_BASELINE",
    "LAB_POINT",
    "LAB_SHAPES",
    "OPS",
    "SPECS",
    "KernelSpec",
    "Path",
    "matrix_bytes",
    *_LAZY,
]
