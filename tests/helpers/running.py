"""Running a kernel into a NaN-poisoned output (`run_poisoned`: it must write all of its output
and nothing else), whole or through one named path of its dispatch."""

from __future__ import annotations

import importlib
import math

import torch

GUARD_BYTES = 64  # NaN on both sides of the output, a multiple of 16 so the output stays aligned


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor, for bitwise comparisons (NaN payloads included)."""
    return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def run_poisoned(fn, x: torch.Tensor, *, out_offset: int = 0, **kwargs) -> torch.Tensor:
    """fn(x, out=out, **kwargs) into an `out` filled with NaN and framed by NaN guards; returns
    `out`. Asserts that fn wrote into the `out` it was given, wrote nothing outside it and left
    x unchanged. `out_offset` starts the output that many elements past a 16-byte boundary."""
    guard = GUARD_BYTES // x.element_size()
    n = x.numel()
    buf = torch.full((guard + out_offset + n + guard,), math.nan, dtype=x.dtype, device=x.device)
    start = guard + out_offset
    out = buf[start : start + n].view(x.shape)
    x_before = bits(x).clone()
    result = fn(x, out=out, **kwargs)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    name = getattr(fn, "name", getattr(fn, "__name__", repr(fn)))
    assert isinstance(result, torch.Tensor) and result.data_ptr() == out.data_ptr() and result.shape == out.shape, (
        f"{name} did not return the out tensor it was given"
    )
    outside = torch.cat([buf[:start], buf[start + n :]])
    assert torch.isnan(outside).all(), f"{name} wrote {int((~torch.isnan(outside)).sum())} elements outside out"
    assert torch.equal(bits(x), x_before), f"{name} changed its input"
    return out


def path_runner(kernel, path: str, **params):
    """fn(x, *, out) that runs a registry kernel through the named path with launch parameters
    `params` (kernel.run_path), in run_poisoned's calling convention."""

    def run(x, *, out=None):
        return kernel.run_path(x, path, out=out, **params)

    run.__name__ = f"{kernel.name} via {path}"
    return run


def cpu_path_runner(kernel, path: str):
    """path_runner with the launch parameters the kernel's spec gives the path for the CPU (the
    Triton interpreter): scaled down so that rows of tens of elements span several tiles."""
    return path_runner(kernel, path, **kernel.path(path).cpu)


def triton_path_runner(path: str, **params):
    """fn(x, *, out) that runs kernels.softmax_triton's run_path through the named path with
    launch parameters `params`, in run_poisoned's calling convention (only where Triton is
    installed: the module imports it)."""
    st = importlib.import_module("kernels.softmax_triton")

    def call(x, *, out):
        return st.run_path(x, path, out=out, **params)

    call.__name__ = f"triton {path}"
    return call
