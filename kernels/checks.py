"""Input checks shared by every softmax wrapper, so a bad tensor fails here with a clear
message instead of deep inside a kernel."""

import torch

from .spec import DTYPE_NAMES, dtype_name


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a name ("bfloat16"), an id ("bf16") or a torch dtype; TypeError for
    any dtype the suite does not know."""
    return getattr(torch, dtype_name(dtype))


FLOAT_DTYPES = tuple(torch_dtype(name) for name in DTYPE_NAMES)


def check_softmax_input(x, *, kernel: str, dtypes=FLOAT_DTYPES, device_type: str = "cuda"):
    """Validate a (B, V) softmax input; raise TypeError / ValueError naming `kernel`."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{kernel} softmax: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{kernel} softmax: expected a 2-D (B, V) tensor, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        got = str(x.dtype).removeprefix("torch.")
        raise TypeError(f"{kernel} softmax: dtype {got} is not supported (supported: {names})")
    if x.shape[1] == 0:
        raise ValueError(f"{kernel} softmax: V = 0, softmax over an empty row is undefined")
    wrong_device = (
        (not x.is_cuda) if device_type == "cuda" else (device_type is not None and x.device.type != device_type)
    )
    if wrong_device:
        raise ValueError(f"{kernel} softmax: expected a {device_type} tensor, got one on {x.device}")
    return x


def prepare_output(x: torch.Tensor, out, *, kernel: str) -> torch.Tensor:
    """Return `out` checked against `x` (same shape, dtype, device, contiguous), or a new tensor."""
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{kernel} softmax: out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"{kernel} softmax: out is {tuple(out.shape)} {out.dtype} on {out.device}, "
            f"expected {tuple(x.shape)} {x.dtype} on {x.device}"
        )
    if not out.is_contiguous():
        raise ValueError(f"{kernel} softmax: out must be contiguous")
    return out
