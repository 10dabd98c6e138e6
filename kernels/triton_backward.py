"""The softmax backward in Triton: dx = y * (dy - sum(y * dy)) over the last dimension, from the
softmax output y and the incoming gradient dy, in one kernel (two reads and one write); and the
dispatch and launch parameters the Triton cross-entropy shares.

Paths (`plan(B, V, dtype)` names the one a call takes; `DISPATCH_BOUNDARIES` holds the limits):
row for V <= row_max_v, one program a row holding dy and y; from stream_min_b rows on, reread
for float32 rows to reread_max_v, one program a row holding y * dy and reading dy and y again
for the write, stream for 16-bit rows to stream_max_v, one or two programs per SM walking the
rows, each read three times with the re-reads served by L2, and held_split past them: split's
programs, each holding its chunks of y and dy in shared memory (a Gluon kernel, cp.async; dy
and dx in step with y within 16 bytes, as contiguous tensors are); split otherwise (shorter
batches, rows out of step, GPUs before sm_80), P = cdiv(V, CHUNK) programs a row meeting
through a workspace (kernels/triton_loss_kernels.py).
Every path gives a row the same bits (the sum is order-free), so the batch threshold changes
speed, never results. dy and y may have any row stride and different layouts (each is copied
with `.contiguous()` only when its elements are not contiguous within a row); dx is new and
contiguous, or `out` (contiguous). float32, bfloat16 and float16 storage, all arithmetic in
float32; dy and y share one dtype, as `torch._softmax_backward_data` requires.
"""

from __future__ import annotations

import torch
import triton

from .checks import check_backward_inputs, on_device, prepare_dx
from .spec import spec_of
from .triton_dispatch import DEVICE_TYPE as _DEVICE_TYPE
from .triton_dispatch import (
    INTERPRET,
    fixed_point_bits,
    gpu_major,
    held_split_chunk,
    refuse_unrunnable,
    resident_cap,
    runnable_path,
)
from .triton_dispatch import launch_params as softmax_launch_params
from .triton_launch import launch_entry, stream_rows, training_cut

KERNEL_NAME = "triton"
PATHS = spec_of("softmax_backward", KERNEL_NAME).path_names  # the registry's entry names them
# held_split is a Gluon kernel with cp.async: where it cannot run (the interpreter, GPUs before
# sm_80) its rows take split, the same bits, and a call naming it is refused, naming split.
SUBSTITUTE = {"held_split": "split"}
# row_max_v: two inputs in registers, a quarter of the forward's row path (the cross-entropy's
# bound too). The stream path's bounds, measured on an H200 against the split (graph clock,
# reports/profiles.md): float32 ahead 1.36-1.52x at V = 16384-32000 and 1.09x at 40960, behind
# (0.81-0.92x) from 50257 on, where the rows in flight (dy and y, a program on each of 132 SMs:
# 53 MB at 50257) crowd the 60 MB L2; 16-bit ahead 1.50-1.66x up to 65536, 1.14x at 98304 and
# 1.04x at 128256 (left to the split); at V = 32000 ahead 1.36-1.62x from B = 128 on and
# 1.17-1.22x at B = 64 (shorter batches not measured). reread_max_v: the float32 rows whose
# products a program holds at 32 warps, 1.19-1.32x the stream in device time at (4096,
# 12288-16384) with no spill, and 1.12-1.15x at (4096, 32000-32768), 1.04x at (512, 32000) and
# 1.0x at (64, 32000), where 32 products a thread spill 32-40 bytes (launch_params); 16-bit rows
# gain 0.87-1.08x from B = 512 on, so they stream. held_split past stream's rows, on an H100
# (graph clock, of the two-read-one-write floor, B = 4096, runs/h100-2026-12-06d): bf16 0.87 at
# 50257 against stream's 0.50, 0.95 at 65536 against 0.70, 0.89 / 0.86 at 128256 / 262144
# against split's 0.60 / 0.57 (torch.compile 0.51-0.63); float32 1.00 / 0.97 / 0.91 at 65536 /
# 128256 / 262144 against split's 0.88 / 0.84 / 0.77. Below them at (4096, 32000), after the
# stream kernel's whole tiles went unmasked (runs/h100-2026-12-07): bf16 held_split (8 x 80)
# 0.966 against stream's 0.756 and torch.compile's 1.007; float32 held_split (4 x 128) 0.994
# against reread's 0.941. So rows past 24576 take held_split in every dtype (the rows between
# it and 32000 not timed), and float32 rows no longer stream (run_path still takes them there).
DISPATCH_BOUNDARIES = {
    "row_max_v": 8192,
    "reread_max_v": 24576,  # float32
    "stream_max_v": 24576,  # 16-bit
    "stream_min_b": 64,
}


def plan(B: int, V: int, dtype: torch.dtype = torch.float32, boundaries=None) -> str:
    """The path softmax_backward() takes for (B, V) rows of `dtype`: row, reread, stream,
    held_split or split (held_split's rows with dy or dx out of step with y take split)."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    if V <= b["row_max_v"]:
        return "row"
    if B < b["stream_min_b"]:
        return "split"
    if V > b["reread_max_v" if dtype == torch.float32 else "stream_max_v"]:
        return "held_split"
    return "reread" if dtype == torch.float32 else "stream"


def launch_params(
    path: str,
    V: int,
    dtype: torch.dtype = torch.float32,
    *,
    op: str = "softmax_backward",
    plain: bool = False,
    rows: str = "aligned",
) -> dict:
    """The launch parameters of the softmax backward's and (op="cross_entropy") the cross-entropy's
    entries of kernels.triton_launch.TABLES for rows of V: row, split, the backward's reread and
    stream, and cross-entropy's prep, reduce and scale. `plain`: a cross-entropy without class
    weights or label smoothing, whose split kernel holds fewer values a thread; `rows`: how the
    split cuts them (kernels.triton_launch.training_cut): "aligned" (pointers, strides and V
    divisible by 16), "groups" (on 16-byte groups, the row's partial groups apart) or
    "elements" (element by element); the streams read any but "aligned" element by element,
    the backward's in half tiles."""
    if path == "row":
        block = triton.next_power_of_2(V)
        # Up to 8 elements per thread and tensor: no spills on sm_90 (kernels.triton_build --training).
        # Past 8192 only the cross-entropy's plain rows (one tensor held): 32 warps.
        warps = 4 if block <= 2048 else (8 if block <= 4096 else (16 if block <= 8192 else 32))
        return {"BLOCK": block, "num_warps": warps}
    if path == "reread":
        # TILE 2048-8192 x 16-32 warps at (4096, 12288-32000) on an H200 (reports/profiles.md): 32
        # warps, 16 products a thread at 16384; tiles of 4096 led at 32000. A block of 32 warps
        # leaves a thread 64 registers: past 16384 (32 products a thread) ptxas spills within
        # them, and the launch states that bound as its cap, whose spill the benchmark accepted.
        block = triton.next_power_of_2(V)
        return {"BLOCK": block, "TILE": 4096, "num_warps": 32, **({"maxnreg": 64} if block > 16384 else {})}
    if path == "split":
        # (CHUNK, num_warps, register cap) measured on an H200 (reports/profiles.md): CHUNK
        # 2048-16384 x 4-16 warps x caps at V = 32000-262144, B = 1024-4096, each setting the
        # fastest of its kind or within 7 % of it, spilling at most CAPPED_SPILL_BYTES a thread
        # (kernels.triton_build --training). Under a cap of 128 the backward fits four programs
        # an SM, not two or three: 1.23-1.52x faster at V >= 128256. The plain cross-entropy
        # holds 8192 elements a program under a cap where its rows are aligned (1.11-1.17x); its
        # weighted, smoothed kernel would spill 350-740 bytes a thread there. Cut on groups, the
        # edges' extra registers move the cross-entropy's best settings (the backward's stays),
        # and the groups ran 1.09-1.94x the element-wise cut at (1024-4096, 50257 / 128257).
        # Element by element, the caps spill 350-810 bytes a thread, and 4096 x 8 under 128
        # ran 1.16-1.66x them (16-bit cross-entropy: uncapped at 4 warps).
        if rows not in ("aligned", "groups", "elements"):
            raise ValueError(f"{KERNEL_NAME} training kernels: rows {rows!r} (aligned, groups or elements)")
        if op == "softmax_backward":
            chunk, warps, cap = 4096, 8 if rows == "elements" else 4, 128
        elif plain:
            chunk, warps, cap = {
                ("aligned", True): (8192, 8, 80),
                ("aligned", False): (8192, 4, 128),
                ("groups", True): (4096, 4, 128),
                ("groups", False): (8192, 8, 80),
                ("elements", True): (4096, 8, 128),
                ("elements", False): (4096, 4, None),
            }[rows, dtype == torch.float32]
        else:  # weighted or smoothed: under 128 on aligned rows as fast as uncapped (where float16
            # spilled 8 bytes on the GPU); float32 on groups 2048 x 4 under 128, 1.07x 4096 x 4;
            # out of step not timed: 8 warps under 128, which builds without spill at every V
            # (kernels.triton_build), where ptxas took uncapped builds to 128 registers with a
            # spill at some V and not others (float32 on an H100: 24 bytes; float16 at 262144)
            chunk, warps, cap = {
                ("aligned", True): (4096, 4, 128),
                ("aligned", False): (4096, 4, 128),
                ("groups", True): (2048, 4, 128),
                ("groups", False): (4096, 4, None),
                ("elements", True): (4096, 8, 128),
                ("elements", False): (4096, 8, 128),
            }[rows, dtype == torch.float32]
        return {"CHUNK": chunk, "num_warps": warps, **({"maxnreg": cap} if cap else {})}
    if path == "stream":
        # The streams' programs walk the rows side by side, the re-reads from L2, so a launch
        # states the register cap (resident_cap) under which its programs_per_sm fit an SM at
        # once. Uncapped, the cross-entropy's weighted, smoothed rows took 180-206 registers at V
        # = 50257, one program an SM: 1.31-1.34x slower than at 80 registers
        # (runs/h100-2026-12-07b). The backward's rows not 16-byte aligned (rows != "aligned"),
        # loaded element by element, a register each, take half the tile, which keeps them under
        # the cap without a spill: on an H200 (probes/ce_stream_occupancy.py,
        # runs/h200-2026-12-07c) bf16 (4096, 24575) in tiles of 2048 at 16 warps under 64 took
        # 318 us against 367 in tiles of 4096.
        if op == "cross_entropy":
            # Tiles of 2048 at 8 warps, 8 elements a thread, at any alignment, three programs an
            # SM at any V. On an H200 at V = 50257 with class weights and smoothing
            # (runs/h200-2026-12-06b, -07c), three led two and one (bf16 974 / 1193 / 1829 us at
            # N = 4096, float32 1431 / 1869 / 2740 us, though float32's rows in flight, 80 MB,
            # outgrow L2); under the cap of 80, whole tiles of 2048 read element by element (136
            # bytes a thread spilled under Triton 3.6, outside the tile loops) led half tiles
            # (bf16 697 against 843 us, float32 1016 against 1416 us) and tiles cut on 16-byte
            # groups (the split's cut: 740 and 1267 us, their weights read element by element).
            # Rows past 256 KB, whose rows in flight outgrow L2 at any of these: on an H100 at N =
            # 4096 (runs/h100-2026-12-07h), of the floor, three programs an SM 0.398 (bf16
            # 128256), 0.399 (bf16 262144), 0.426 (float32 128256) against one of 4096 x 16 warps
            # 0.326 / 0.260 / 0.324 and two of 2048 x 8 warps 0.274 / 0.271 / 0.303.
            p = {"BLOCK": 2048, "num_warps": 8, "programs_per_sm": 3}
        else:
            half = 1 if rows == "aligned" else 2
            if dtype != torch.float32 and V <= 32768:
                # BLOCK 1024-16384 x 4-32 warps x 1-8 programs per SM at V = 16384-128256
                # (reports/profiles.md): tiles of 8192 by 16 warps, one program per SM, led in float32
                # and in 16-bit rows past 32768; shorter 16-bit rows, tiles of 4096 at two per SM. At V =
                # 32768 either holds 34 MB of rows in L2 (132 float32 rows of dy and y, 256 KB each; 264
                # 16-bit rows of 128 KB).
                p = {"BLOCK": 4096 // half, "num_warps": 16, "programs_per_sm": 2}
            else:
                p = {"BLOCK": 8192 // half, "num_warps": 16, "programs_per_sm": 1}
        cap = resident_cap(p["num_warps"], p["programs_per_sm"])
        return {**p, **({"maxnreg": cap} if cap else {})}
    if path == "held" and op == "cross_entropy":
        # 8 warps uncapped (then 104 registers, no spill: two programs an SM) ran 1.05-1.07x the
        # softmax's held launch, 16 warps under 64 registers, at bf16 V = 16385-32768 and N =
        # 1024-16384 on an H200 (probes/ce_held_row.py, reports/profiles.md). Past 32768 (a
        # buffer in parts, kernels.triton_dispatch.held_block) 8 warps take 203-207 registers,
        # one program an SM; 16 warps under 64 keep two (spilling 56-72 bytes a thread).
        return {"num_warps": 8} if V <= 32768 else {"num_warps": 16, "maxnreg": 64}
    if path == "held_split" and op == "cross_entropy":
        # The softmax's held split chunks (kernels.triton_dispatch: at most 64 KB, shared evenly
        # over the row's programs) at 8 warps. Of the floor on an H100 (probes/ce_held_row.py,
        # runs/h100-2026-12-06d) at (4096, 65537 / 128256 / 262144): 16-bit uncapped (58
        # registers at bf16 262144, no spill, three programs an SM) 0.86 / 0.93 / 0.94, under a
        # cap of 80 (which ptxas fills) 0.80 / 0.92 / 0.91, under 128 0.80 / 0.80 / 0.80;
        # float32 under 128 (76 registers, no spill) 0.85 / 0.92 / 0.91, under 80 0.85 / 0.90 /
        # 0.89, uncapped (128 registers, 40 bytes spilled) 0.71 / 0.77 / 0.78.
        # With class weights or smoothing (not dispatched: probes/ce_weighted.py times it), chunks
        # of at most 16 KB at 8 warps under 80: 72-80 registers and no spill in the sm_90 builds,
        # three programs an SM; the passes' unrolled tiles (each reading its columns' weights)
        # take 128 registers and spill at 32-64 KB chunks, 206-255 uncapped (one program an SM).
        if not plain:
            return {"CHUNK": held_split_chunk(V, dtype.itemsize, 16384, 8), "num_warps": 8, "maxnreg": 80}
        chunk = softmax_launch_params("held_split", V, dtype)["CHUNK"]
        return {"CHUNK": chunk, "num_warps": 8, **({"maxnreg": 128} if dtype == torch.float32 else {})}
    if path == "held_split":
        # A program holds a chunk of y and one of dy, at most 32 KB each, shared evenly as the
        # softmax's held split shares a row: three programs an SM. Of the floor on an H100
        # (probes/bwd_held_split.py, runs/h100-2026-12-06d) at (4096, 50257 / 65536 / 128256 /
        # 262144): bf16 at 4 warps under 128 registers 0.87 / 0.95 / 0.74 / 0.73, at 8 under 80
        # 0.77 / 0.85 / 0.89 / 0.86; float32 0.998 / 0.97 / 0.91 at 65536 / 128256 / 262144
        # under 128 (123 registers, no spill), 0.99 / 0.96 / 0.90 at 8 x 80; 16 x 64 0.70-0.79.
        # 16-bit chunks of 16384 elements (rows past 98304) spill 320 bytes a thread at 4 x 128
        # (sm_90), 64 at 8 x 80: those take 8 x 80.
        chunk = held_split_chunk(V, dtype.itemsize, 32768, 4)
        if dtype == torch.float32 or chunk < 16384:
            return {"CHUNK": chunk, "num_warps": 4, "maxnreg": 128}
        return {"CHUNK": held_split_chunk(V, dtype.itemsize, 32768, 8), "num_warps": 8, "maxnreg": 80}
    if path in ("prep", "reduce"):
        return {"BLOCK": 1024, "num_warps": 4}
    if path == "scale":
        return {"BLOCK": min(4096, triton.next_power_of_2(V)), "num_warps": 4}
    raise ValueError(
        f"{KERNEL_NAME} training kernels: unknown path {path!r} (row, reread, split, stream, prep, reduce, "
        "scale; held for cross-entropy; held_split)"
    )


def _launch(dy, y, dx, path: str, params: dict) -> None:
    B, V = y.shape
    if B == 0:
        return
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    y = y if y.stride(1) == 1 else y.contiguous()
    values = {"DY": dy, "Y": y, "DX": dx, "B": B, "V": V, "stride_dy": dy.stride(0), "stride_y": y.stride(0)}
    values.update(stride_dx=dx.stride(0), K=fixed_point_bits(V))
    cut = {}
    if path is None:  # the plan's path; held_split's rows take split out of step or where Gluon cannot run
        path = runnable_path(plan(B, V, y.dtype), gpu_major(y), SUBSTITUTE)
        if path == "held_split":
            cut = training_cut(V, y, dy, dx)
            path = "split" if cut["rows"] == "elements" else path
    if path == "split":  # chunks cut on y's rows (kernels.triton_launch.training_cut)
        cut = cut or training_cut(V, y, dy, dx)
        for (view, off), name in zip(cut["views"], ("Y", "DY", "DX"), strict=True):
            values[name], values[f"{name.lower()}_off"] = view, off
    elif path == "held_split":  # 16-byte-aligned base views (training_cut's), dy and dx in step with y
        in_step = cut or training_cut(V, y, dy, dx)
        if in_step["rows"] == "elements":
            raise ValueError(
                f"{KERNEL_NAME} softmax backward: the held_split path needs dy and dx in step with y "
                "within 16 bytes (row starts and strides); the split path takes any layout"
            )
        for (view, off), name in zip(in_step["views"], ("Y", "DY", "DX"), strict=True):
            values[name], values[f"{name.lower()}_off"] = view, off
        layout = (y.stride(0), dx.stride(0), y.element_size(), None, values["y_off"], values["dx_off"])
        aligned = all(values[n].data_ptr() % 16 == 0 for n in ("Y", "DY"))  # cp.async reads y and dy
        cut = {"layout": layout, "x_aligned": aligned}
    elif path == "stream":  # rows loaded element by element take half the tile (launch_params)
        cut = {"rows": stream_rows(y, dy, dx)}
    p = {
        **launch_params(path, V, y.dtype, rows=cut.get("rows", "aligned")),
        **{k: cut[k] for k in ("ALIGN", "head", "layout", "x_aligned") if k in cut},
        **params,
    }
    launch_entry("softmax_backward", path, values, p, V, B, -1 if INTERPRET else y.get_device())


def run_path(dy: torch.Tensor, y: torch.Tensor, path: str | None, *, out=None, **params) -> torch.Tensor:
    """softmax_backward(dy, y) through one named path; `params` override its launch parameters
    (row: BLOCK, num_warps; reread: TILE, num_warps; split: CHUNK, num_warps, max_spins, P_BLOCK;
    stream: BLOCK, num_warps, programs_per_sm; held_split, on a GPU of sm_80 on, dy and dx in
    step with y (ValueError otherwise): CHUNK, num_warps, maxnreg, max_spins; path None: plan's).
    Tests use it to reach the split path at small V (CHUNK=16)."""
    check_backward_inputs(dy, y, kernel=KERNEL_NAME, device_type=_DEVICE_TYPE)
    if path is not None:
        refuse_unrunnable(path, gpu_major(y), "softmax backward", "softmax_backward()", SUBSTITUTE)
    dx = prepare_dx(dy, y, out, kernel=KERNEL_NAME)
    on_device(lambda: _launch(dy, y, dx, path, params), y)
    return dx


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, *, out=None) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy, -1)) for (B, V) tensors: the gradient of softmax's input."""
    return run_path(dy, y, None, out=out)
