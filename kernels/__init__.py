"""Softmax kernels behind one registry.

Every entry of `SOFTMAX_KERNELS` is a `Kernel`: callable as `kernel(x, *, out=None) -> Tensor`
for a (B, V) tensor, computing softmax over V, and describing itself (dtypes, dispatch paths,
which path a shape takes, the facts of its `KernelSpec`). Tests and benchmarks iterate over this
dict, so a kernel cannot exist untested; a new kernel is one `KernelSpec(...)` in
`kernels/spec.py` (README, "Adding a kernel").

Importing this package imports neither torch, CUDA nor CuPy: `kernels.spec` is plain Python
(the report harness reads it without torch), the registry is built on first use of one of its
names, and each backend is imported on a kernel's first call.
"""

from __future__ import annotations

import importlib

from .spec import BASELINE, LAB_POINT, LAB_SHAPES, SPECS, KernelSpec, Path, matrix_bytes

# name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "SOFTMAX_KERNELS": ".registry",
    "SUPPORTED_DTYPES": ".registry",
    "OUR_KERNELS": ".registry",
    "EXTRA_KERNELS_ENV": ".registry",
    "Kernel": ".registry",
    "torch_softmax": ".registry",
    "compiled_softmax": ".registry",
    "check_softmax_input": ".checks",
    "prepare_output": ".checks",
    # the training side: softmax backward and cross-entropy (kernels/training_registry.py)
    "SOFTMAX_BACKWARD_KERNELS": ".training_registry",
    "SOFTMAX_BACKWARD_OF": ".training_registry",
    "CROSS_ENTROPY_KERNELS": ".training_registry",
    "BACKWARD_BASELINE": ".training_registry",
    "CROSS_ENTROPY_BASELINE": ".training_registry",
    "BackwardKernel": ".training_registry",
    "CrossEntropyKernel": ".training_registry",
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


__all__ = [
    "SOFTMAX_KERNELS",
    "SUPPORTED_DTYPES",
    "OUR_KERNELS",
    "BASELINE",
    "EXTRA_KERNELS_ENV",
    "LAB_POINT",
    "LAB_SHAPES",
    "SPECS",
    "Kernel",
    "KernelSpec",
    "Path",
    "matrix_bytes",
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
