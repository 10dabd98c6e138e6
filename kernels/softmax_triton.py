"""Row softmax in Triton: the public entry points (the registry's entry in kernels/spec.py names
`softmax`, `plan` and `run_path` here), over `kernels.triton_dispatch` (which path, with what
parameters), `kernels.triton_launch` (the launch table and the launches made from it) and
`kernels.triton_store` (the tile kernel's autotuning); their other names are imported from them.

All arithmetic is float32 whatever the storage dtype. The input may have any row stride; a
tensor whose elements are not contiguous within a row is copied with `.contiguous()` first.
The output is always contiguous. Under TRITON_INTERPRET=1 (set before this module is imported)
the kernels run on CPU tensors through Triton's interpreter.
"""

from __future__ import annotations

import torch

from . import triton_launch as _launch
from . import triton_store as _store
from .checks import FLOAT_DTYPES, check_softmax_input, on_device, prepare_output
from .triton_dispatch import DEVICE_TYPE as _DEVICE_TYPE
from .triton_dispatch import INTERPRET, KERNEL_NAME, gpu_major, plan, runnable_path
from .triton_dispatch import launch_params as _path_params
from .triton_launch import BoundLaunch
from .triton_store import autotune_picked


def launch_params(
    path: str, V: int, dtype: torch.dtype = torch.float32, *, B: int | None = None, sms: int | None = None
) -> dict:
    """The launch parameters `path` uses for rows of length V: tile's stored or tuned config
    ({"config": ...}, `autotune_picked`), the others' from kernels.triton_dispatch.launch_params."""
    if path == "tile":
        return {"config": autotune_picked(V, dtype)}
    return _path_params(path, V, dtype, B=B, sms=sms)


def clear_autotune_memo() -> None:
    """Forget what this process resolved or tuned and the launches made with it (the next call
    reads the stored file again)."""
    _store.clear_memo()
    _launch.clear()
    _common.clear()


def bind(x: torch.Tensor, y: torch.Tensor, path: str, **params) -> BoundLaunch:
    """The launch `run_path(x, path, out=y, **params)` would make, every argument by name
    (`.values`, `.constexprs`, `.options`, `.grid`), not yet launched: call it to launch, or
    `.warmup()` to compile it on a GPU. A test may replace a value (e.g. the split workspace)."""
    return _launch.bind(x, y, path, params)


# The common call (contiguous rows, a new output): (dtype, V, device, row stride, address mod 16,
# batch class) -> the remembered launch, keyed on the input alone; cleared when a new stored
# autotune choice is written.
_common: dict = {}
_common_generation = [_store.generation]


def _softmax(x: torch.Tensor, y: torch.Tensor, path: str, params: dict, common_key=None) -> torch.Tensor:
    if x.shape[0] == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    again = _launch.run(x, y, path, params)
    if again is not None and common_key is not None and y.data_ptr() % 16 == 0:
        _common[common_key] = again
    return y


def run_path(x: torch.Tensor, path: str, *, out=None, **params) -> torch.Tensor:
    """softmax(x) through one named path; `params` override that path's launch parameters
    (tile: config; row: num_warps; rows: ROWS, BLOCK_V, CUT, num_warps; split: CHUNK, num_warps,
    P_BLOCK, maxnreg, max_spins; held: BLOCK, num_warps, maxnreg; stream: BLOCK, num_warps,
    programs_per_sm; any: align). Tests use it to reach every path at small V (e.g. split,
    CHUNK=16); held, a Gluon kernel, only on a GPU of sm_80 on (ValueError elsewhere).
    """
    check_softmax_input(x, kernel=KERNEL_NAME, dtypes=FLOAT_DTYPES, device_type=_DEVICE_TYPE)
    y = prepare_output(x, out, kernel=KERNEL_NAME)
    return on_device(lambda: _softmax(x, y, path, params), x)


_batch_class = _launch.batch_class


def softmax(x: torch.Tensor, *, out=None) -> torch.Tensor:
    """Softmax over the last dimension of a (B, V) float32 / bfloat16 / float16 tensor."""
    common = None
    if out is None and not INTERPRET:
        # The common call (rows of unit column stride, a new output, which is 16-byte aligned):
        # everything the launch needs is keyed on the input alone.
        if _common_generation[0] != _store.generation:  # a new stored autotune choice
            _common.clear()
            _common_generation[0] = _store.generation
        try:
            B, V = x.shape
            sx, sc = x.stride()
            dev = x.get_device()
            if sc == 1 and dev >= 0:
                common = (x.dtype, V, dev, sx, x.data_ptr() & 15, _batch_class(B, V, x.dtype, dev))
            again = _common.get(common)
        except (AttributeError, TypeError, ValueError):
            common = again = None  # not a 2-D tensor: the checks below say what is wrong
        if again is not None and B > 0:
            y = torch.empty_like(x, memory_format=torch.contiguous_format)
            again(x, y)
            return y
    check_softmax_input(x, kernel=KERNEL_NAME, dtypes=FLOAT_DTYPES, device_type=_DEVICE_TYPE)
    y = prepare_output(x, out, kernel=KERNEL_NAME)
    B, V = x.shape
    path = runnable_path(plan(B, V, x.dtype), gpu_major(x))
    return on_device(lambda: _softmax(x, y, path, {}, common), x)
