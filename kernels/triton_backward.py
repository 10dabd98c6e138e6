"""The softmax backward in Triton: dx = y * (dy - sum(y * dy)) over the last dimension, from the
softmax output y and the incoming gradient dy, in one kernel (two reads and one write).

Paths (`plan(B, V, dtype)` names the one a call takes; `DISPATCH_BOUNDARIES` holds the limit):

  row   V <= row_max_v. One program per row holds dy and y in registers: each element is read
        once and written once.
  split V > row_max_v. P = cdiv(V, CHUNK) programs share a row, each with a CHUNK of dy and y in
        registers (still one read of each), meeting twice through a per-row workspace (the
        largest |y * dy|, then the fixed-point sum); a program whose siblings are not running
        streams the row itself, so a launch cannot hang.

Every path gives a row the same bits: the sum is order-free (kernels.triton_loss_kernels), and
the path depends on V alone, never on B. dy and y may have any row stride and
different layouts (each is copied with `.contiguous()` only when its elements are not
contiguous within a row); dx is new and contiguous, or `out` (contiguous). float32, bfloat16
and float16 storage, all arithmetic in float32; dy and y share one dtype, as
`torch._softmax_backward_data` requires.

Under TRITON_INTERPRET=1 (set before the kernels are imported) the kernels run on CPU tensors.
"""

from __future__ import annotations

import torch
import triton

from .checks import check_backward_inputs, on_device, prepare_dx
from .spec import spec_of
from .triton_dispatch import DEVICE_TYPE as _DEVICE_TYPE
from .triton_dispatch import INTERPRET, SPLIT_MAX_SPINS, checked_p_block, fixed_point_bits, p_block
from .triton_launch import launch_named, tagged_workspace
from .triton_loss_kernels import (
    softmax_backward_row_kernel,
    softmax_backward_split_kernel,
)

KERNEL_NAME = "triton"
PATHS = spec_of("softmax_backward", KERNEL_NAME).path_names  # the registry's entry names them
DISPATCH_BOUNDARIES = {"row_max_v": 8192}  # two inputs in registers: a quarter of the forward's row path

# The split kernels' poll bound on a GPU is the forward's (SPLIT_MAX_SPINS). Under the
# interpreter, whose programs run one after another, 0: early chunks stream, the last combines.


def plan(B: int, V: int, dtype: torch.dtype = torch.float32, boundaries=None) -> str:
    """The path softmax_backward() takes for (B, V) rows of `dtype`: row or split."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    return "row" if V <= b["row_max_v"] else "split"


def launch_params(path: str, V: int, dtype: torch.dtype = torch.float32) -> dict:
    if path == "row":
        block = triton.next_power_of_2(V)
        # Up to 8 elements per thread and tensor: no spills on sm_90 (kernels.triton_build --training).
        warps = 4 if block <= 2048 else (8 if block <= 4096 else 16)
        return {"BLOCK": block, "num_warps": warps}
    if path == "split":
        return {"CHUNK": 4096, "num_warps": 8}
    raise ValueError(f"{KERNEL_NAME} softmax backward: unknown path {path!r} ({', '.join(PATHS)})")


# int64 words a row's chunk publishes in each kernel's split meetings (kernels/triton_loss_kernels.py)
SPLIT_WORDS_PER_CHUNK = {"softmax_backward": 4, "cross_entropy": 7}


def split_workspace(kernel: str, device: torch.device, rows: int, P: int) -> torch.Tensor:
    """The words of `kernel`'s split launches ("softmax_backward" or "cross_entropy") for `rows`
    rows of P chunks, zeroed when allocated (kernels.triton_launch.tagged_workspace)."""
    per_row = SPLIT_WORDS_PER_CHUNK[kernel] * P
    if INTERPRET:
        return tagged_workspace(kernel, -1, rows * per_row, P, at_least=64 * per_row)
    if torch.cuda.is_current_stream_capturing():
        # A graph captured here always gets words of its own (tagged_workspace would hand it
        # the cached buffer, as it does the forward's graphs).
        return torch.zeros(rows * per_row, dtype=torch.int64, device=device)
    dev = device.index if device.index is not None else torch.cuda.current_device()
    return tagged_workspace(kernel, dev, rows * per_row, P, at_least=64 * per_row)


def split_params(V: int, p: dict) -> dict:
    """P (programs per row) and the constexprs of a split launch for rows of V. P_BLOCK (the
    words a meeting reads at once, at least one a thread: kernels.triton_dispatch.p_block) may be
    given smaller under the interpreter, so that tests reach the meetings' loops."""
    P = triton.cdiv(V, p["CHUNK"])
    max_spins = p.get("max_spins", 0 if INTERPRET else SPLIT_MAX_SPINS)
    return {
        "P": P,
        "CHUNK": p["CHUNK"],
        "P_BLOCK": checked_p_block(p.get("P_BLOCK", p_block(P, p["num_warps"])), p["num_warps"]),
        "FALLBACK_BLOCK": min(p["CHUNK"], 1024),
        "MAX_SPINS": max_spins,
    }


def _launch(dy, y, dx, path: str, params: dict) -> None:
    B, V = y.shape
    if B == 0:
        return
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    y = y if y.stride(1) == 1 else y.contiguous()
    p = {**launch_params(path, V, y.dtype), **params}
    K = fixed_point_bits(V)
    strides = {"stride_dy": dy.stride(0), "stride_y": y.stride(0), "stride_dx": dx.stride(0)}
    if path == "row":
        block = max(p["BLOCK"], triton.next_power_of_2(V))
        args = {"DY": dy, "Y": y, "DX": dx, "V": V, **strides, "K": K}
        launch_named(softmax_backward_row_kernel, B, args, BLOCK=block, num_warps=p["num_warps"])
    elif path == "split":
        sp = split_params(V, p)
        P = sp.pop("P")
        ws = split_workspace("softmax_backward", y.device, B, P)
        args = {"DY": dy, "Y": y, "DX": dx, "WS": ws, "V": V, "P": P, **strides, "K": K}
        launch_named(softmax_backward_split_kernel, B * P, args, **sp, num_warps=p["num_warps"])
    else:
        raise ValueError(f"{KERNEL_NAME} softmax backward: unknown path {path!r} ({', '.join(PATHS)})")


def run_path(dy: torch.Tensor, y: torch.Tensor, path: str, *, out=None, **params) -> torch.Tensor:
    """softmax_backward(dy, y) through one named path; `params` override its launch parameters
    (row: BLOCK, num_warps; split: CHUNK, num_warps, max_spins, P_BLOCK). Tests use it to reach
    the split path at small V (CHUNK=16)."""
    check_backward_inputs(dy, y, kernel=KERNEL_NAME, device_type=_DEVICE_TYPE)
    dx = prepare_dx(y, out, kernel=KERNEL_NAME)
    on_device(lambda: _launch(dy, y, dx, path, params), y)
    return dx


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, *, out=None) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy, -1)) for (B, V) tensors: the gradient of softmax's input."""
    check_backward_inputs(dy, y, kernel=KERNEL_NAME, device_type=_DEVICE_TYPE)
    dx = prepare_dx(y, out, kernel=KERNEL_NAME)
    B, V = y.shape
    on_device(lambda: _launch(dy, y, dx, plan(B, V, y.dtype), {}), y)
    return dx


__all__ = [
    "softmax_backward",
    "run_path",
    "plan",
    "launch_params",
    "check_backward_inputs",
    "fixed_point_bits",
    "split_workspace",
    "split_params",
    "PATHS",
    "DISPATCH_BOUNDARIES",
    "SPLIT_MAX_SPINS",
    "INTERPRET",
]
