"""Where a Triton softmax goes and with what: the dispatch policy, each path's launch
parameters, and the memory geometry of a launch (alignment, chunk layout, workspace size).

Nothing here launches anything; `kernels.triton_launch` turns these facts into launches and
`kernels.softmax_triton` is the public entry. Paths (`plan(B, V, dtype)` names the one a call
takes; `DISPATCH_BOUNDARIES` holds the limits):

  tile   V <= tile_max_v and B < rows_min_b. The autotuned kernel: one program per row, the
         row read in BLOCK-wide tiles (one read and one write when V <= BLOCK).
  rows   V <= tile_max_v and B >= rows_min_b. Many short rows: a [ROWS, BLOCK_V] block per
         program, so each program moves enough bytes to hide memory latency; from V = 513 one
         row a program, cut into a power-of-two head and a short tail (rows_cut).
  row    tile_max_v < V <= row_max_v, except where held, stream or a short batch's split applies.
         One program holds the whole row in registers.
  split  V > row_max_v, or V > short_split_min_v with B <= short_split_max_b, except where
         held, stream or held_split applies. P programs share a row, each holding its chunk
         in registers (one read, one write), and meet twice through tagged words of a per-row
         workspace. For a short batch the chunks shrink so that the launch spreads over the
         GPU (launch_params).
  held   held_min_v < V <= held_max_v, 16-bit storage, B >= stream_min_b. One program holds
         the whole row in shared memory (a Gluon kernel: cp.async in, three reads out), two
         programs an SM where registers hold one. The interpreter, and a GPU below sm_80, have
         no cp.async: there these rows take stream (runnable_path), whose bits are the same.
  stream the other rows of stream_min_v < V <= stream_max_v, 16-bit storage, B >= stream_min_b (with
         the bounds above, held_max_v = stream_max_v: the rows to held_min_v). A grid of a few
         programs per SM walks the rows, each read three times in tiles (max, sum, write);
         the grid bounds the rows in flight so the re-reads come from L2. That holds only
         while the rows in flight fit L2: longer 16-bit rows take held_split.
  held_split V > stream_max_v, 16-bit storage, B >= stream_min_b. Split's programs and
         meetings, each program holding its chunk in shared memory as held holds a row (cp.async
         in, three reads out): no register per element, so three programs an SM. Where held
         cannot run, split, with the same bits. float32 rows stay on split, which it leads by
         1-5 % only where a row fills its chunks and trails by 1-2 % elsewhere
         (reports/profiles.md).

Every path gives a row the same bits (the kernels' sums are order-free), so the B threshold
changes speed, never results.
"""

from __future__ import annotations

import torch
import triton

from .launch import device_info
from .spec import SPEC_BY_NAME
from .triton_kernels import softmax_tile_kernel

KERNEL_NAME = "triton"
PATHS = SPEC_BY_NAME[KERNEL_NAME].path_names  # the registry's entry names them

# Triton builds its kernels for the interpreter when TRITON_INTERPRET=1 was set before they
# were decorated; they then take CPU tensors. Every Triton module of kernels/ asks here.
INTERPRET = type(softmax_tile_kernel).__name__ == "InterpretedFunction"
DEVICE_TYPE = "cpu" if INTERPRET else "cuda"

DISPATCH_BOUNDARIES = {
    "tile_max_v": 2048,  # V above this leaves the tile/rows kernels
    "rows_min_b": 8192,  # with V <= tile_max_v, B from here on takes the multi-row kernel
    "row_max_v": 32768,  # V above this: split (or held or stream, below)
    # A batch of at most short_split_max_b rows longer than short_split_min_v splits them too, so
    # that the launch spreads over the GPU rather than holding a few SMs. Measured on an H100
    # (probes/triton_short_batch_split.py, device time of row over split at the short-batch
    # chunks, V = 20480-32768): float32 1.16-1.33x at B <= 8, 1.01-1.06x at 64; bfloat16
    # 1.02-1.14x at B <= 8, 0.91-0.94x at 64; at B = 16 (V to 28672) float32 1.12-1.14x,
    # bfloat16 1.00-1.01x. At V = 16384 row was faster at every B (1.05-1.61x).
    "short_split_min_v": 16384,
    "short_split_max_b": 16,
    # 16-bit rows of stream_min_v < V <= stream_max_v stream (or are held, below) from
    # stream_min_b rows on. Measured on an H200 against row and split
    # (probes/triton_long_path_choice.py), bf16 at B = 1024, 4096 and 32768: stream over row
    # 1.04-1.12x at V = 32000, over split 1.12-1.21x at 32769; split over stream 1.00-1.05x at
    # 50257 and 1.14-1.31x at 65536, where the rows in flight crowd the 60 MB L2; row over
    # stream 1.22-1.35x at V = 16384. The held path took the region past 40960 from split, and
    # held_split the rows past 49152 (below).
    "stream_min_v": 16384,
    "stream_max_v": 49152,
    "stream_min_b": 1024,
    # Of those, rows of held_min_v < V <= held_max_v are held whole in shared memory (a buffer of
    # whole tiles, in up to three parts: held_block). Measured on an H100 (probes/triton_held_row.py,
    # device time, of copy, held / stream): bf16 (4096, 32000) 0.96 / 0.78, (32768, 32000) 1.00 /
    # 0.78, (1024, 32000) 0.85 / 0.74, (4096, 24577) 0.88 / 0.76; past 40960 held / split, at
    # 16 warps under 64 registers (two programs an SM): (4096, 50257) 0.851 / 0.776, (8192,
    # 50257) 0.865 / 0.783, (1024, 50257) 0.759 / 0.733, fp16 alike, (4096, 40960) 0.967 / 0.868
    # (a power-of-two buffer there, one program an SM: 0.57-0.75); at (4096, 57344), a buffer of
    # 112 KB, split led, 0.850 / 0.816. At V = 16385 held at 8 warps under 64 led stream (0.91 /
    # 0.79 at B = 4096, 0.74 / 0.68 at 1024), not yet adopted (runs/h100-2026-12-06, -06b).
    # held_split (its chunks balanced) against held (probes/triton_held_split.py,
    # runs/h100-2026-12-06c): bf16 (4096, 32769) 0.790 / 0.859, (4096, 40961) 0.856 / 0.893,
    # (4096, 45057) 0.876 / 0.876, 50257 at B = 1024 / 4096 / 8192 / 32768 0.780 / 0.900 / 0.923 /
    # 0.944 against 0.764 / 0.844 / 0.863 / 0.865: held ends at 49152, and stream_max_v with it.
    "held_min_v": 24576,
    "held_max_v": 49152,
}

# The split path's launch parameters, from the H200 sweeps of reports/profiles.md (CHUNK
# 2048-8192 x 4-8 warps x register caps at B = 1024 and 4096; CHUNK 512-8192 at B <= 64).
# maxnreg is the register cap handed to ptxas: it sets the programs resident per SM (96: five
# of four warps), hence the bytes in flight. At 96 a thread spills 32-40 bytes, and the split ran
# 1.06-1.09x (float32) and 1.15x (bfloat16) faster than at 128, which spills none (V = 128256
# and 262144, B = 4096, reports/profiles.md).
SPLIT_PARAMS = {"CHUNK": 8192, "num_warps": 4, "maxnreg": 96}
# The local memory a thread of a build under a register cap may spill into, in bytes (its stack
# frame: what the driver reports as the kernel's local size): a cap is chosen where the
# benchmark shows the occupancy it buys worth more than the spill costs (kernels.triton_build,
# the sm_90 build tests), and no spill may be touched inside a tile loop (triton_build.
# spill_problem). The largest such spill is the cross-entropy stream's where rows are not
# 16-byte aligned, outside its tile loops: weighted and smoothed, 136 bytes under Triton 3.6,
# whose build ran 1.2-1.4x the half tiles that spill none (kernels.triton_backward.launch_params,
# runs/h200-2026-12-07c), 176 under Triton 3.9; smoothed alone, 88 under 3.6 and 216 under 3.9
# (built, not timed). A build without a cap may spill nothing.
CAPPED_SPILL_BYTES = 216
# An sm_90 SM's registers, allocated to a warp 256 at a time (8 a thread), and its most warps.
SM_REGISTERS, SM_WARPS = 65536, 64


def resident_cap(num_warps: int, programs: int) -> int | None:
    """The register cap under which `programs` programs of `num_warps` warps fit an SM at once
    (a multiple of 8), None where ptxas's own limit of 255 allows them already."""
    cap = SM_REGISTERS // (programs * num_warps * 32) // 8 * 8
    return None if cap >= 255 else cap


# A short batch: chunks halve until the launch has SPLIT_FILL programs per SM, down to
# SPLIT_MIN_CHUNK (below it a row's meetings, over hundreds of siblings, cost more than the
# idle SMs would give: 1024-element chunks were 15-100 % slower than 2048 at V = 262144).
SPLIT_FILL = 1
SPLIT_MIN_CHUNK = 2048

# Poll bound for the split kernel on a GPU: ~2^20 atomic reads (order of a second) is far
# beyond the time siblings need to be scheduled; it exists only so a launch cannot hang.
SPLIT_MAX_SPINS = 1 << 20
INT32_MAX = 2**31 - 1


def fixed_point_bits(n: int) -> int:
    """K = 62 - ceil(log2 n): n terms each below 2^K in magnitude sum to at most 2^62, so a
    fixed-point sum of n terms cannot overflow an int64."""
    return 62 - (max(int(n), 1) - 1).bit_length()


def fixed_point_scale(V: int) -> float:
    """2^K for a row of V exponentials (each term <= SCALE): the forward's SCALE."""
    return float(2 ** fixed_point_bits(V))


# --------------------------------------------------------------------------- dispatch


def plan(B: int, V: int, dtype: torch.dtype = torch.float32, boundaries=None) -> str:
    """Name of the path softmax() takes on a GPU for a (B, V) input: tile, rows, row, split, held,
    stream or held_split."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    if V <= b["tile_max_v"]:
        return "rows" if B >= b["rows_min_b"] else "tile"
    if dtype != torch.float32 and B >= b["stream_min_b"] and V > b["stream_min_v"]:
        if V > b["stream_max_v"]:
            return "held_split"
        return "held" if b["held_min_v"] < V <= b["held_max_v"] else "stream"
    if V > b["row_max_v"] or (B <= b["short_split_max_b"] and V > b["short_split_min_v"]):
        return "split"
    return "row"


# The path whose kernel runs a path's rows where that path's own cannot: held and held_split
# need cp.async (sm_80 on) and 64 KB of shared memory per program, and Gluon, which the
# interpreter cannot run.
SUBSTITUTE = {"held": "stream", "held_split": "split"}
HELD_MIN_MAJOR = 8


def runnable_path(path: str, major: int | None, substitute: dict | None = None) -> str:
    """The path softmax() launches for `path` on a GPU of compute capability `major` (None: the
    interpreter): `path` itself, or its SUBSTITUTE where that kernel cannot run there (another
    op passes its own `substitute`). Every path gives a row the same bits, so this changes
    speed only."""
    substitute = SUBSTITUTE if substitute is None else substitute
    if path in substitute and (major is None or major < HELD_MIN_MAJOR):
        return substitute[path]
    return path


def gpu_major(t: torch.Tensor) -> int | None:
    """The compute capability major of t's GPU, runnable_path's `major` (None: the interpreter)."""
    return None if INTERPRET else device_info(t.get_device())[2]


def refuse_unrunnable(path: str, major: int | None, what: str, caller: str, substitute: dict | None = None) -> None:
    """ValueError where a caller names a `path` that cannot run here (runnable_path), saying what
    `caller` (the op's entry) takes there instead; `what` names the op in the message."""
    instead = runnable_path(path, major, substitute)
    if instead != path:
        where = "under Triton's interpreter" if major is None else f"on a GPU of compute capability {major}.x"
        raise ValueError(
            f"{KERNEL_NAME} {what}: the {path} path cannot run {where} ({caller} takes {instead} there, "
            "with the same bits)"
        )


def paths_for(dtype: torch.dtype) -> tuple:
    """The paths softmax() takes for some input of `dtype` (run_path reaches all of PATHS), as
    the registry's entry lists them (tests hold `plan` to it)."""
    return SPEC_BY_NAME[KERNEL_NAME].paths_for(dtype)


def rows_cut(V: int, cut: bool, block_v: int = 1) -> tuple[int, int]:
    """(HEAD, TAIL) of the rows kernel for rows of V: cut, a head of the largest power of two <= V
    and a tail of the next power of two (at least 16) >= what is left, none if nothing is;
    otherwise one block of max(block_v, next_power_of_2(V)) lanes."""
    if not cut:
        return max(block_v, triton.next_power_of_2(V)), 0
    head = 1 << (max(V, 1).bit_length() - 1)
    return head, (0 if head >= V else max(triton.next_power_of_2(V - head), 16))


def launch_params(
    path: str, V: int, dtype: torch.dtype = torch.float32, *, B: int | None = None, sms: int | None = None
) -> dict:
    """The launch parameters a path other than tile uses for rows of length V, picked from sweeps
    on an H200 (reports/profiles.md; tile's config is the stored or tuned choice of
    kernels/triton_store.py). split also depends on the batch: with B rows on a GPU of `sms`
    multiprocessors, its chunks shrink (down to SPLIT_MIN_CHUNK) until the launch has SPLIT_FILL
    programs per multiprocessor, so a short batch still spreads over the GPU."""
    if path == "row":
        block = triton.next_power_of_2(V)
        if block <= 4096:
            warps = 4 if dtype == torch.float32 else 8
        else:
            # 16-bit rows of 8193-16384 at 16 warps: two programs per SM instead of one at 32
            # (1.6-1.7x at bf16 V = 16384, reports/profiles.md); float32 rows gain nothing there.
            warps = 16 if block <= (8192 if dtype == torch.float32 else 16384) else 32
        return {"BLOCK": block, "num_warps": warps}
    if path == "rows":
        block_v = triton.next_power_of_2(V)
        if block_v >= 1024:
            # One row a program, a warp per 1024 lanes: at (32768, 600) 1.24x (bf16) and 1.15x
            # (fp32) the two rows of four warps this took before (probes/triton_rows_sweep.py).
            # The row cut into a head and a tail (rows_cut): bf16 (32768, 600) 1.11x, (32768,
            # 1100) 1.45x, fp32 1.01-1.03x, same bits (probes/triton_rows_tail.py).
            head, tail = rows_cut(V, True, block_v)
            warps = min(32, triton.next_power_of_2(max(1, round((head + tail) / 1024))))  # a block's 1024 threads
            return {"ROWS": 1, "BLOCK_V": block_v, "CUT": True, "num_warps": warps}
        return {"ROWS": 2048 // block_v, "BLOCK_V": block_v, "CUT": False, "num_warps": 4 if block_v >= 512 else 2}
    if path == "split":
        p = dict(SPLIT_PARAMS)
        if B is not None and sms is not None:
            while p["CHUNK"] > SPLIT_MIN_CHUNK and B * triton.cdiv(V, p["CHUNK"]) < SPLIT_FILL * sms:
                p["CHUNK"] //= 2
        return p
    if path == "held":
        # 16 warps under a cap of 64 registers: two programs an SM (32768 registers each). Of copy
        # at bf16 (4096, 32000) on an H100 (probes/triton_held_row.py): 16 x 64 0.96, 8 warps
        # uncapped 0.96, 8 x 64 0.85, 4 x 128 0.89; at (4096, 24577) 0.81, 0.80, 0.76, 0.70.
        return {"num_warps": 16, "maxnreg": 64}  # the buffer: kernels.triton_dispatch.held_block
    if path == "held_split":
        # Chunks of at most 64 KB at 8 warps under a cap of 80 registers: three programs an SM.
        # Of copy on an H100 (probes/triton_held_split.py), bf16 (4096, 262144): 8 x 80 0.957,
        # 8 x 128 0.834, 16 x 64 0.787, chunks of 32 KB at 8 x 64 0.881, of 96 KB 0.741 (split
        # 0.806). Shared evenly (held_split_chunk): bf16 (4096, 65537) 0.877 against 0.770 with
        # a last chunk of one group.
        return {"CHUNK": held_split_chunk(V, dtype.itemsize, 65536, 8, B=B, sms=sms), "num_warps": 8, "maxnreg": 80}
    if path == "stream":
        # BLOCK 2048-16384 x 4-16 warps x 1-8 programs per SM at B = 512 and 4096, V = 50257
        # and 128256 (reports/profiles.md): 4096 x 16 x 8 led or tied in bfloat16. Programs
        # beyond what fits an SM at once run as a second wave.
        return {"BLOCK": 4096, "num_warps": 16, "programs_per_sm": 8}
    if path == "tile":
        raise ValueError(f"{KERNEL_NAME} softmax: tile's config is its autotuned choice (autotune_picked), not fixed")
    raise ValueError(f"{KERNEL_NAME} softmax: unknown path {path!r} ({', '.join(PATHS)})")


# --------------------------------------------------------------------------- memory geometry


def vector_align(V: int, stride_x: int, stride_y: int, element_size: int) -> int:
    """Largest power of two <= 16 bytes' worth of elements dividing V and both row strides:
    the ALIGN the one-program-per-row kernels are told."""
    a = 16 // element_size
    while a > 1 and (V % a or stride_x % a or stride_y % a):
        a //= 2
    return a


def aligned_base(t: torch.Tensor, a: int):
    """(view, head): a view of t's storage starting `head` elements before t, at an address
    that is a multiple of `a` elements, so kernels can index t as view + head + offset with
    group-aligned offsets. (t, 0) when t starts too close to its storage's beginning."""
    es = t.element_size()
    ptr = t.data_ptr()
    if ptr % es:
        return t, 0
    head = (ptr // es) % a
    if head == 0 or t.storage_offset() < head:
        return t, 0
    return t.as_strided(t.shape, t.stride(), t.storage_offset() - head), head


def chunk_layout(
    V: int, stride_x: int, stride_y: int, element_size: int, *, CHUNK: int, align=None, x_head=0, y_head=0, num_warps=4
) -> dict:
    """The tensor-free part of split_layout: for rows `x_head` / `y_head` elements past a
    group boundary (the heads aligned_base found), programs per row P, the groups' widths and
    the split kernel's P_BLOCK and FALLBACK_BLOCK. The ahead-of-time builds use it directly."""
    a = align or 16 // element_size  # group width in elements
    if CHUNK % a:
        raise ValueError(f"{KERNEL_NAME} softmax: CHUNK {CHUNK} is not a multiple of align {a}")
    # A row starting h elements past a group boundary spans cdiv(V + h, CHUNK) chunks; h is the
    # same for every row when the stride is a multiple of the group width.
    head = x_head % a if stride_x % a == 0 else a - 1
    P = triton.cdiv(V + head, CHUNK)
    y_align = a
    while y_align > 1 and ((y_head - x_head) % y_align or (stride_y - stride_x) % y_align):
        y_align //= 2
    return {
        "P": P,
        "ALIGN": a,
        "Y_ALIGN": y_align,
        "P_BLOCK": p_block(P, num_warps),
        "FALLBACK_BLOCK": fallback_block(CHUNK, num_warps),
    }


def split_layout(x: torch.Tensor, y: torch.Tensor, *, CHUNK: int, align: int | None = None, num_warps: int = 4) -> dict:
    """Where the split kernel's chunks (or the stream kernel's tiles, CHUNK = BLOCK) fall for
    x -> y: the 16-byte-aligned base views and heads, programs per row P (split) and the output
    alignment. One function for the launches and tests.

    P_BLOCK: see p_block. FALLBACK_BLOCK, the tile of split's streaming fallback (taken only when siblings are not
    scheduled in time), is one element a thread on a GPU, so it costs the kernel no registers;
    under the interpreter, where every early chunk takes it, it is wide for speed. The fallback
    computes the same exact max and sum either way."""
    a = align or 16 // x.element_size()
    if CHUNK % a:
        raise ValueError(f"{KERNEL_NAME} softmax: CHUNK {CHUNK} is not a multiple of align {a}")
    xb, xo = aligned_base(x, a)
    yb, yo = aligned_base(y, a)
    lay = chunk_layout(
        x.shape[1], x.stride(0), y.stride(0), x.element_size(), CHUNK=CHUNK, align=a, x_head=xo, y_head=yo,
        num_warps=num_warps,
    )  # fmt: skip
    return {"xb": xb, "xo": xo, "yb": yb, "yo": yo, **lay}


# The most shared memory a held row's buffer takes (every GPU from sm_80 gives a program more).
HELD_MAX_BYTES = 128 * 1024


def held_split_chunk(V: int, element_size: int, most_bytes: int, num_warps: int, *, B=None, sms=None) -> int:
    """A held split's chunk, in elements, for rows of V: the least whole tiles (held_block) that
    cover the row in as many programs as chunks of `most_bytes` would take at any head, so the
    programs share it evenly (a last chunk of a few groups would hold an SM's slot through both
    meetings for nothing). With B rows on a GPU of `sms` multiprocessors, a short batch first
    halves the largest chunk as split's do (SPLIT_FILL programs an SM), down to one tile."""
    tile = 16 // element_size * 32 * num_warps
    chunk = most_bytes // element_size
    if B is not None and sms is not None:
        while chunk > tile and B * triton.cdiv(V, chunk) < SPLIT_FILL * sms:
            chunk //= 2
    span = V + 16 // element_size - 1  # the row and the most its head may add
    return held_block(triton.cdiv(span, triton.cdiv(span, chunk)), tile, element_size)


def held_longest_row(element_size: int) -> int:
    """The longest row the held kernel takes: HELD_MAX_BYTES of elements (a power of two, so
    held_block's rounding up never passes it)."""
    return HELD_MAX_BYTES // element_size


def held_block(V: int, tile: int, element_size: int) -> int:
    """The held kernel's buffer, in elements: V rounded up to whole tiles, and further to a count
    of tiles with at most three bits set (the buffer is allocated in up to three powers of two:
    kernels/triton_kernels.py, _held_part). A bf16 row of 50257 at 4096-element tiles takes
    53248 (8 + 4 + 1 tiles), 104 KB, so that two programs share an SM's 228 KB where a power of
    two (128 KB) would leave one. ValueError past HELD_MAX_BYTES."""
    n = -(-max(V, 1) // tile)
    while n.bit_count() > 3:
        n += n & -n  # up to the next count with one bit fewer below its top bits
    if n * tile * element_size > HELD_MAX_BYTES:
        raise ValueError(
            f"{KERNEL_NAME}: the held path holds rows of at most {held_longest_row(element_size)} elements of "
            f"{element_size} bytes in shared memory, got V = {V}"
        )
    return n * tile


def p_block(P: int, num_warps: int) -> int:
    """The split kernel's P_BLOCK: how many of a row's published words a program reads at once.
    At least 32 * num_warps, so no word is read by two warps and every decision on them is the
    program's, not a warp's (kernels/triton_kernels.py); otherwise 2P (both meetings in one
    read each) up to 256, and a row of more programs is met in several reads."""
    return max(32 * num_warps, min(triton.next_power_of_2(2 * P), 256))


def checked_p_block(P_BLOCK: int, num_warps: int) -> int:
    """P_BLOCK as a launch may use it (a power of two, and >= 32 * num_warps on a GPU)."""
    if P_BLOCK & (P_BLOCK - 1) or (not INTERPRET and P_BLOCK < 32 * num_warps):
        # The interpreter runs one thread of a program: there smaller blocks test the loop.
        raise ValueError(f"{KERNEL_NAME} softmax: P_BLOCK {P_BLOCK} must be a power of two >= 32 * num_warps")
    return P_BLOCK


def fallback_block(CHUNK: int, num_warps: int) -> int:
    """The split kernel's FALLBACK_BLOCK (see split_layout)."""
    return min(CHUNK, 1024 if INTERPRET else 32 * num_warps)


def split_workspace_words(B: int, P: int) -> int:
    """int64 words a split launch of B rows and P programs per row uses (3 per program). A
    workspace must be zeroed when allocated and then serve launches of that P only: each launch
    tags its words one past the tags the last launch left (kernels/triton_kernels.py)."""
    return B * 3 * P
