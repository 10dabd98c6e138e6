"""Input checks shared by every softmax wrapper, so a bad tensor fails here with a clear
message instead of deep inside a kernel."""

import torch

from .spec import DTYPE_NAMES, dtype_name


def on_device(fn, t: torch.Tensor):
    """fn() with t's GPU current, so that kernels launched inside go to t's device and stream
    (CPU tensors and empty batches launch nothing on a GPU: fn() as it is)."""
    if not t.is_cuda or t.shape[0] == 0 or t.get_device() == torch.cuda.current_device():
        return fn()
    with torch.cuda.device(t.get_device()):
        return fn()


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


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b reach a common byte: one storage, and the spans from each one's first to
    its last element overlap (interleaved views that touch no common element count too)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_out(out, like: torch.Tensor, what: str, *, name: str = "the input", **inputs: torch.Tensor) -> None:
    """`out` must be a tensor of `like`'s shape, dtype and device, sharing no memory with `like`
    (called `name`) or any of `inputs` (by keyword): TypeError / ValueError naming `what`. The
    kernels whose programs share a row re-read it whole where a meeting runs out of time, after
    siblings may have written their part of out: over an input, a silent wrong answer."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(
            f"{what}: out is {tuple(out.shape)} {out.dtype} on {out.device}, "
            f"expected {tuple(like.shape)} {like.dtype} on {like.device}"
        )
    for which, t in {name: like, **inputs}.items():
        if shares_memory(out, t):
            raise ValueError(f"{what}: out shares memory with {which}; give out memory of its own")


def prepare_output(
    x: torch.Tensor, out, *, kernel: str, op: str = "softmax", name: str = "the input", **inputs
) -> torch.Tensor:
    """Return `out` checked against `x` (same shape, dtype, device, contiguous, no memory shared
    with x or `inputs`: check_out), or a new tensor."""
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    check_out(out, x, f"{kernel} {op}", name=name, **inputs)
    if not out.is_contiguous():
        raise ValueError(f"{kernel} {op}: out must be contiguous")
    return out


# -- the softmax backward and cross-entropy ----------------------------------------------------------

CROSS_ENTROPY_REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32)


def check_backward_inputs(dy, y, *, kernel: str, device_type: str | None = "cuda") -> None:
    """dy and y: tensors of one shape (B, V), one supported dtype, one device; a clear TypeError or
    ValueError naming `kernel` otherwise."""
    for name, t in (("dy", dy), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{kernel} softmax backward: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{kernel} softmax backward: {name} must be 2-D (B, V), got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            names = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
            got = str(t.dtype).removeprefix("torch.")
            raise TypeError(f"{kernel} softmax backward: {name} dtype {got} is not supported (supported: {names})")
    if dy.shape != y.shape:
        raise ValueError(
            f"{kernel} softmax backward: dy {tuple(dy.shape)} and y {tuple(y.shape)} differ in shape; "
            "they must have one shape"
        )
    if dy.dtype != y.dtype:
        raise TypeError(f"{kernel} softmax backward: dy is {dy.dtype} and y is {y.dtype}; they must share a dtype")
    if dy.shape[1] == 0:
        raise ValueError(f"{kernel} softmax backward: V = 0")
    if dy.device != y.device:
        raise ValueError(f"{kernel} softmax backward: dy on {dy.device} and y on {y.device}")
    if device_type is not None and dy.device.type != device_type:
        raise ValueError(f"{kernel} softmax backward: expected {device_type} tensors, got them on {dy.device}")


def prepare_dx(dy: torch.Tensor, y: torch.Tensor, out, *, kernel: str) -> torch.Tensor:
    """prepare_output for a softmax backward's dx (sharing memory with neither y nor dy)."""
    return prepare_output(y, out, kernel=kernel, op="softmax backward", name="y", dy=dy)


def check_cross_entropy_inputs(
    logits,
    targets,
    *,
    weight=None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    kernel: str,
    device_type: str | None = "cuda",
) -> None:
    """Shapes, dtypes, devices and options, checked before anything runs (TypeError/ValueError
    naming `kernel` and the problem). Target values are checked by the wrapper (validate=True)."""
    what = f"{kernel} cross-entropy"
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{what}: logits must be a torch.Tensor, got {type(logits).__name__}")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"{what}: targets must be a torch.Tensor, got {type(targets).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"{what}: logits must be 2-D (N, V), got shape {tuple(logits.shape)}")
    if logits.dtype not in FLOAT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
        raise TypeError(f"{what}: logits dtype {str(logits.dtype).removeprefix('torch.')} is not supported ({names})")
    if logits.shape[1] == 0:
        raise ValueError(f"{what}: V = 0 classes")
    if targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise ValueError(
            f"{what}: targets must be 1-D with one class index per row ({logits.shape[0]}), "
            f"got shape {tuple(targets.shape)}"
        )
    if targets.dtype not in TARGET_DTYPES:
        raise TypeError(f"{what}: targets must be int64 or int32 class indices, got {targets.dtype}")
    if reduction not in CROSS_ENTROPY_REDUCTIONS:
        raise ValueError(f"{what}: reduction must be one of {CROSS_ENTROPY_REDUCTIONS}, got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(f"{what}: label_smoothing must be a number, got {type(label_smoothing).__name__}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"{what}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"{what}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if not -(2**63) <= ignore_index < 2**63:
        raise ValueError(f"{what}: ignore_index {ignore_index} does not fit int64")
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"{what}: weight must be a torch.Tensor or None, got {type(weight).__name__}")
        if weight.shape != (logits.shape[1],):
            raise ValueError(f"{what}: weight must have shape ({logits.shape[1]},), got {tuple(weight.shape)}")
        if weight.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{what}: weight dtype {weight.dtype} is not supported")
    for name, t in (("targets", targets), ("weight", weight)):
        if t is not None and t.device != logits.device:
            raise ValueError(f"{what}: {name} is on {t.device} and logits on {logits.device}")
    if device_type is not None and logits.device.type != device_type:
        raise ValueError(f"{what}: expected {device_type} tensors, got them on {logits.device}")
