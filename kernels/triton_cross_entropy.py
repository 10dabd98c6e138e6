"""Cross-entropy over the vocabulary in Triton: from logits (N, V) and integer targets (N,), the
loss, the per-row log-sum-exp and, in the same pass, the gradient with respect to the logits
(one read of the logits, one write of the gradient; written over the logits with
`inplace=True`). PyTorch's semantics (`F.cross_entropy` with class-index targets):
`ignore_index`, `label_smoothing`, `reduction` ("mean" / "sum" / "none") and class `weight`,
including the weighted mean's denominator (the sum of the non-ignored rows' target weights) and
its combination with label smoothing.

    result = cross_entropy(logits, targets, reduction="mean")
    result.loss      () for "mean" / "sum", (N,) for "none"; the logits' dtype
    result.lse       (N,) float32: log-sum-exp of each row (-inf for a row of -inf)
    result.grad      (N, V), the logits' dtype: d loss / d logits (for "none": of loss.sum())

Launches, in order on the stream (kernels/triton_loss_kernels.py): prep, one program over the
targets and class weights; row, held, held_split, stream or split (`plan`: row, stream and
split for rows with class weights or label smoothing; plain rows held whole further, 16-bit
plain rows of held_min_v < V <= held_max_v in shared memory, and longer plain rows split with
each program's chunk in shared memory); for "mean" / "sum", reduce, one program summing the
rows' losses in fixed point.

A target out of range. With `validate=True` (the default) the wrapper reads the prep kernel's
three integers back and raises a ValueError naming the bad values: one synchronisation per
call and no extra pass over any tensor. It reads them once the call's kernels are queued, so
the host waits for the call to finish but the GPU never waits for the host between them; with
`inplace=True` it reads them before the row kernel, which would overwrite the logits. It is
skipped during CUDA-graph capture, where a synchronisation is not allowed; the kernel then
writes NaN for such a row's loss and gradient (never reads outside the row), so a bad target
is never a silent number.

Batch-invariant bits: every row sum and the sum over rows are order-free (64-bit fixed point,
kernels.triton_loss_kernels), and the path depends on V alone, so a row's loss, lse and
gradient do not depend on the batch, the row's position, the row stride or the path, and a
"sum" / "mean" loss does not depend on the order of the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .checks import check_cross_entropy_inputs, check_out, on_device
from .spec import spec_of
from .triton_backward import DISPATCH_BOUNDARIES as _BACKWARD_BOUNDARIES
from .triton_backward import launch_params
from .triton_dispatch import DEVICE_TYPE as _DEVICE_TYPE
from .triton_dispatch import INTERPRET, aligned_base, fixed_point_bits, gpu_major, refuse_unrunnable, runnable_path
from .triton_launch import launch_entry, training_cut

KERNEL_NAME = "triton"
PATHS = spec_of("cross_entropy", KERNEL_NAME).path_names  # the registry's entry names them
# A row with neither class weights nor label smoothing holds one tensor in registers, as the
# softmax's row path does, up to plain_row_max_v (BLOCK 32768 at 32 warps: 64 registers, no
# spill; on an H200 at (4096, 32000) 1.38x the split in fp32 and 1.46x in bf16, at (4096, 16384)
# 1.08-1.12x, the same bits: reports/profiles.md); with either, rows split past the backward's
# row_max_v. 16-bit plain rows of held_min_v < V <= held_max_v are held in shared memory instead,
# two programs an SM where the row kernel fits one: on an H200 (probes/ce_held_row.py, graph
# clock, bf16, N = 4096) 1.48x the row path at V = 16385, 1.58x at 24577, 1.33x at 32000, and
# 1.31-1.33x at N = 1024 and 16384 (at N = 64 both take 15 us); rows to 16384 were not measured.
# Past 32768 the buffer is allocated in parts (kernels.triton_dispatch.held_block: two programs
# an SM to 57344); on an H100 at V = 50257, bf16, held (16 warps under 64 registers) over the
# split it replaces: 1.82x at N = 4096 (0.775 of the floor against 0.427), 1.69x at 1024, 1.87x
# at 16384, 1.08x at 64; at N = 4096 1.93x at 40961 and 1.29x at 57344 (0.776 of the floor), the
# same bits (runs/h100-2026-12-06, -06b). Longer plain rows take held_split: split's programs,
# each holding its chunk in shared memory (launch_params). On an H100 (graph clock, of the
# floor, runs/h100-2026-12-06d), bf16 at N = 4096: 0.82 / 0.83 / 0.87 at 40961 / 50257 / 57344
# against held's 0.80 / 0.77 / 0.78, 0.86 / 0.93 / 0.94 at 65537 / 128256 / 262144 against
# split's 0.43 / 0.58 / 0.57; 0.90 at (1024, 262144), 0.95 at (16384, 128256), 0.54 at (64,
# 262144) against 0.43, held's 0.71 / 0.86 at 50257 and N = 1024 / 16384 against 0.69 / 0.80;
# fp16 (4096, 128256) 0.94 against 0.60; float32 past row's rows, 0.85 / 0.92 / 0.91 at 65537 /
# 128256 / 262144 against split's 0.60 / 0.77 / 0.75. The same bits throughout.
# Rows with class weights or label smoothing past the row path's stream (a few programs an SM
# walking the rows, each read three times, no meetings): 16-bit rows of any length, float32
# rows to float32_stream_max_v, split beyond. On an H200 at V = 50257 (graph clock,
# runs/h200-2026-12-06b/ce_weighted.log), stream at three programs an SM over the split: bf16
# 1.74x at N = 4096 (974 against 1697 us), 1.48x at 1024, 1.80x at 16384; float32 1.19x at
# 4096; 1.46x / 1.16x torch.compile's step. On an H100 at N = 4096
# (runs/h100-2026-12-07h/ce_stream_occupancy.log), of the floor, stream against split: bf16
# 0.398 / 0.261 at 128256 and 0.399 / 0.256 at 262144 (1.53x, 1.56x), float32 0.426 / 0.433 at
# 128256, where the split stays. The same bits throughout.
DISPATCH_BOUNDARIES = {
    "row_max_v": _BACKWARD_BOUNDARIES["row_max_v"],
    "plain_row_max_v": 32768,
    "held_min_v": 16384,
    "held_max_v": 40960,
    "float32_stream_max_v": 65536,
}
# Where the held kernel cannot run (Triton's interpreter, a GPU before sm_80) its rows take split,
# which holds rows of any length (row's plain rows end at plain_row_max_v, short of held_max_v),
# with the same bits (kernels.triton_dispatch.runnable_path).
SUBSTITUTE = {"held": "split", "held_split": "split"}
# Paths whose programs share a row and meet; one whose meeting runs out of time reads the whole
# row again, so over the logits (inplace=True) the dispatch takes stream instead.
MEETING_PATHS = ("split", "held_split")


def plan(N: int, V: int, dtype: torch.dtype = torch.float32, boundaries=None, *, plain: bool = True) -> str:
    """The path cross_entropy() takes on a GPU for (N, V) logits of `dtype`, row, held,
    held_split, stream or split;
    `plain`: no class weights and no label smoothing (the registry asks for that case). It
    depends on V, the dtype and the options, never on N, and every path gives a row the same
    bits."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    if V <= b["row_max_v"]:
        return "row"
    if not plain:
        return "split" if dtype == torch.float32 and V > b["float32_stream_max_v"] else "stream"
    if dtype != torch.float32 and V > b["held_min_v"]:
        return "held" if V <= b["held_max_v"] else "held_split"
    return "row" if V <= b["plain_row_max_v"] else "held_split"


class CrossEntropyResult(NamedTuple):
    loss: torch.Tensor
    lse: torch.Tensor
    grad: torch.Tensor


def _run(logits, targets, grad, weight, ignore_index, label_smoothing, reduction, validate, path, params, plain):
    N, V = logits.shape
    device = logits.device
    lse = torch.empty(N, dtype=torch.float32, device=device)
    if N == 0:
        loss = torch.full((), float("nan") if reduction == "mean" else 0.0, dtype=logits.dtype, device=device)
        return CrossEntropyResult(
            loss if reduction != "none" else torch.empty(0, dtype=logits.dtype, device=device), lse, grad
        )
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    targets = targets if targets.is_contiguous() else targets.contiguous()
    has_weight = weight is not None
    w = (weight if weight.is_contiguous() else weight.contiguous()) if has_weight else lse  # lse: unused pointer
    prep = torch.empty(4, dtype=torch.float32, device=device)
    bad = torch.empty(3, dtype=torch.int64, device=device)
    KN, KV = fixed_point_bits(N), fixed_point_bits(V)
    dev = -1 if INTERPRET else logits.get_device()
    values = {"X": x, "T": targets, "W": w, "G": grad, "LSE": lse, "PREP": prep, "BAD": bad, "N": N, "V": V}
    values.update(stride_x=x.stride(0), stride_g=grad.stride(0), ignore_index=ignore_index, KN=KN, KV=KV, KW=KV)
    values.update(eps=float(label_smoothing), inv_v=1.0 / V, SCALE=float(2.0**KV))
    flags = {"HAS_WEIGHT": has_weight, "MEAN": reduction == "mean"}
    launch_entry("cross_entropy", "prep", values, {**launch_params("prep", V), **flags}, V, 1, dev)
    checking = validate and (INTERPRET or not torch.cuda.is_current_stream_capturing())
    # Over the logits (inplace=True) a bad target is reported before they are lost; otherwise
    # after the launches, so that the GPU never idles mid-call while the host reads `bad`.
    if checking and grad is logits:
        _raise_for_bad_targets(bad, V, ignore_index)
    values["LOSS"] = row_loss = torch.empty(N, dtype=torch.float32, device=device)
    cut = {}
    if path == "split":  # chunks cut on the logits' rows (kernels.triton_launch.training_cut)
        cut = training_cut(V, x, grad)
        (values["X"], values["x_off"]), (values["G"], values["g_off"]) = cut["views"]
    elif path in ("held", "held_split"):  # groups of 16-byte-aligned base views, as the softmax's held paths
        a = 16 // x.element_size()
        (values["X"], values["x_off"]), (values["G"], values["g_off"]) = aligned_base(x, a), aligned_base(grad, a)
        layout = (x.stride(0), grad.stride(0), x.element_size(), None, values["x_off"], values["g_off"])
        cut = {"layout": layout, "x_aligned": values["X"].data_ptr() % 16 == 0}  # as TritonPath.bind
    p = {
        **launch_params(path, V, logits.dtype, op="cross_entropy", plain=plain, rows=cut.get("rows", "aligned")),
        **{k: cut[k] for k in ("ALIGN", "head", "layout", "x_aligned") if k in cut},
        **params,
        **flags,
        "HAS_SMOOTHING": float(label_smoothing) > 0.0,
    }
    launch_entry("cross_entropy", path, values, p, V, N, dev)
    if reduction == "none":
        loss = row_loss if logits.dtype == torch.float32 else row_loss.to(logits.dtype)
    else:
        values["OUT"] = loss = torch.empty((), dtype=logits.dtype, device=device)
        launch_entry("cross_entropy", "reduce", values, {**launch_params("reduce", V), **flags}, V, 1, dev)
    if checking and grad is not logits:
        _raise_for_bad_targets(bad, V, ignore_index)
    return CrossEntropyResult(loss, lse, grad)


def _raise_for_bad_targets(bad: torch.Tensor, V: int, ignore_index: int) -> None:
    # The prep kernel's count, least and largest of the targets neither in [0, V) nor ignored.
    count, lo, hi = bad.tolist()
    if count:
        raise ValueError(
            f"{KERNEL_NAME} cross-entropy: {count} target(s) outside [0, {V}) that are not ignore_index "
            f"({ignore_index}): values from {lo} to {hi}"
        )


def _cross_entropy(logits, targets, path, params, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                   reduction="mean", out=None, inplace=False, validate=True):  # fmt: skip
    options = dict(weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    check_cross_entropy_inputs(logits, targets, **options, kernel=KERNEL_NAME, device_type=_DEVICE_TYPE)
    if inplace:
        if out is not None:
            raise ValueError(f"{KERNEL_NAME} cross-entropy: give either out or inplace=True, not both")
        if logits.stride(1) != 1:
            raise ValueError(f"{KERNEL_NAME} cross-entropy: inplace=True needs rows of unit column stride")
        grad = logits
    elif out is None:
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    else:
        check_out(out, logits, f"{KERNEL_NAME} cross-entropy", name="the logits", targets=targets)
        if out.stride(1) != 1:
            raise ValueError(f"{KERNEL_NAME} cross-entropy: out must have rows of unit column stride")
        grad = out
    plain = weight is None and not float(label_smoothing) > 0.0  # no class weights, no smoothing
    if path is None:
        path = runnable_path(plan(*logits.shape, logits.dtype, plain=plain), gpu_major(logits), SUBSTITUTE)
        if inplace and path in MEETING_PATHS:
            path = "stream"  # the same bits, no meetings (MEETING_PATHS)
    elif inplace and path in MEETING_PATHS:
        raise ValueError(
            f"{KERNEL_NAME} cross-entropy: the {path} path cannot write over the logits (inplace=True): a "
            "program whose meeting runs out of time re-reads the whole row, which siblings may have "
            "overwritten; cross_entropy() takes stream in place"
        )
    elif path == "held" and not plain:
        raise ValueError(
            f"{KERNEL_NAME} cross-entropy: the {path} path takes neither class weights nor label smoothing"
        )
    else:
        refuse_unrunnable(path, gpu_major(logits), "cross-entropy", "cross_entropy()", SUBSTITUTE)
    run = lambda: _run(  # noqa: E731
        logits, targets, grad, weight, int(ignore_index), label_smoothing, reduction, validate, path, params, plain
    )
    return on_device(run, logits)


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    out: torch.Tensor | None = None,
    inplace: bool = False,
    validate: bool = True,
) -> CrossEntropyResult:
    """Loss, per-row log-sum-exp and gradient of `F.cross_entropy(logits, targets, ...)`.

    out: where to write the gradient (same shape and dtype, rows of unit column stride).
    inplace: write the gradient over the logits (peak memory: the logits alone). Rows that
        would split take the stream path then (the same bits, no meetings); `out` may share no
        memory with the logits.
    validate: raise a ValueError for a target outside [0, V) that is not ignore_index (one
        synchronisation per call; see the module's docstring).
    """
    options = {"weight": weight, "ignore_index": ignore_index, "label_smoothing": label_smoothing, "out": out}
    return _cross_entropy(logits, targets, None, {}, reduction=reduction, inplace=inplace, validate=validate, **options)


def run_path(logits, targets, path: str, *, params: dict | None = None, **options) -> CrossEntropyResult:
    """cross_entropy through one named path with launch parameters `params` (row: BLOCK,
    num_warps; split: CHUNK, num_warps, max_spins, P_BLOCK; held: num_warps, maxnreg; held_split
    (the split's rows, each program's chunk held; with class weights or smoothing not
    dispatched): CHUNK, num_warps, maxnreg, max_spins; held takes plain rows only; held and
    held_split run on a GPU of sm_80 on: ValueError elsewhere; stream (weighted or smoothed
    rows, float32 ones to float32_stream_max_v, and in place the rows that would split: a few
    programs an SM walking the rows, each read three times): BLOCK, num_warps, programs_per_sm,
    maxnreg);
    `options` as cross_entropy takes them."""
    return _cross_entropy(logits, targets, path, params or {}, **options)


def _scale(grad: torch.Tensor, grad_output: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    N, V = grad.shape
    if N == 0:
        return out
    for name, t in (("gradient", grad), ("output", out)):
        if t.stride(1) != 1:
            raise ValueError(f"{KERNEL_NAME} cross-entropy: the {name} must have rows of unit column stride")
    if grad_output.dim() not in (0, 1) or (grad_output.dim() == 1 and grad_output.shape[0] != N):
        raise ValueError(f"{KERNEL_NAME} cross-entropy: grad_output of shape {tuple(grad_output.shape)} for {N} rows")
    go = grad_output.reshape(-1)
    values = {"G": grad, "OUT": out, "GO": go, "B": N, "V": V, "stride_g": grad.stride(0), "stride_out": out.stride(0)}
    values["stride_go"] = 0 if grad_output.dim() == 0 else go.stride(0)
    p = {**launch_params("scale", V), "IN_PLACE": out is grad}
    dev = -1 if INTERPRET else grad.get_device()
    run = lambda: launch_entry("cross_entropy", "scale", values, p, V, N, dev)  # noqa: E731
    on_device(run, grad)
    return out


def scale_gradient_(grad: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """grad *= grad_output in place (a scalar, or one value per row), touching only the rows whose
    factor is not 1: the backward of cross-entropy, with the gradient the forward computed."""
    return _scale(grad, grad_output, grad)


def scaled_gradient(grad: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """grad * grad_output into a new tensor (every row read and written): the functional form."""
    return _scale(grad, grad_output, torch.empty(grad.shape, dtype=grad.dtype, device=grad.device))
