"""The Triton kernels of the softmax backward and of cross-entropy (what `@triton.jit` compiles);
dispatch and launches live in `kernels.triton_backward` and `kernels.triton_cross_entropy`.

Order-free sums. Every sum over a row (or over the rows of a batch) that reaches an output is
taken in 64-bit fixed point, so its bits do not depend on how the elements are cut into tiles,
programs or rows, nor on the batch size or the row's position:

  * sums of exponentials exp(x - max) in [0, 1] use the forward's scale, 2^K with
    K = 62 - ceil(log2 n) for n terms (each term truncated toward zero), so n * 2^K <= 2^62;
  * sums of signed terms of any magnitude (y * dy, per-row losses, class weights) first
    take the largest finite |term| (exact in any order; for cross-entropy's w (x - max), the
    bound max|w| (max - min) instead), read its binary exponent E from the float's bits
    (|term| < 2^E), and add trunc(term * 2^(K - E)) in int64: every term is then
    below 2^K in magnitude and n of them stay below 2^62. The result is the integer sum times
    2^(E - K), both powers of two built from exponent bits (no rounding). Non-finite terms
    (±inf, NaN) are kept out of the integer sum and added separately in float: a sum of values
    drawn from {0, +inf, -inf, NaN} is the same in any order (+inf and -inf give NaN, NaN
    stays NaN), and added to the finite part it gives what IEEE addition of all terms gives.

Truncation costs at most one unit of 2^(E - K) per term: over the whole sum, below 2 n^2 2^-62
times the largest term (3e-8 at n = 262144), about the float32 rounding of the result. The
exponential, the fixed-point terms and the normalisation are the forward's own helpers
(kernels/triton_kernels.py: _exp, _fixed, _row_scale, _normalise), so the probabilities these
kernels form are the Triton softmax's bits.

All arithmetic is float32 whatever the storage dtype. Offsets are int64 (row * stride is formed
from an int64 row index), so tensors past 2^31 elements are addressed correctly.
"""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .triton_kernels import (
    _barrier,
    _exp,
    _fixed,
    _group_mask,
    _held_buffers,
    _held_copy_in,
    _held_edges,
    _held_fill,
    _held_groups,
    _held_max_sum,
    _held_split_max,
    _held_split_sum,
    _held_tile,
    _launch_tag,
    _launch_tag_on,
    _meet_floats,
    _meet_floats_on,
    _meet_sum,
    _meet_sum_on,
    _nan_max,
    _normalise,
    _row_max,
    _row_scale,
    _split_chunk,
    _split_edges,
    _tagged,
    _tagged_halves,
)

# ------------------------------------------------------------------------------ order-free sums
#
# For a block of terms t whose largest finite magnitude is amax (or a bound of it):
#
#   up, down = _fixed_point_scale(amax, K)     2^shift and 2^-shift, amax < 2^(K - shift)
#   total = float(sum(_fixed_finite(t, up))) * down + sum(_non_finite(t))
#
# (`_order_free_sum` for a block held whole), and the sums of exponentials, which lie in [0, 1],
# use the fixed scale SCALE = 2^K: sum(int64(e * SCALE)).

INF = tl.constexpr(float("inf"))


@triton.jit
def _fixed_point_scale(amax, K):
    # From amax's exponent bits: shift = min(K - e, 126) with amax < 2^e, and 2^shift, 2^-shift.
    biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    shift = tl.minimum(K - tl.where(biased == 0, -126, biased - 126), 126)
    up = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    down = ((127 - shift) << 23).to(tl.float32, bitcast=True)
    return up, down


@triton.jit
def _finite_abs(t):
    # |t| where t is finite, 0 elsewhere: the terms whose largest sets an order-free sum's scale.
    return tl.where(tl.abs(t) < INF, tl.abs(t), 0.0)


@triton.jit
def _fixed_finite(t, up):
    # The finite terms at scale `up`, truncated to int64; the non-finite ones as 0.
    return tl.where(tl.abs(t) < INF, t * up, 0.0).to(tl.int64)


@triton.jit
def _abs_max(acc, t):
    # The running max of |t|, NaN-propagating: below inf exactly while every term so far is
    # finite, and then the largest finite |t| (one instruction an element, where _finite_abs's
    # max and _non_finite's sum take four).
    return _nan_max(acc, tl.abs(t))


@triton.jit
def _non_finite(t):
    # The non-finite terms (inf, NaN), the finite ones as 0.
    return tl.where(tl.abs(t) < INF, 0.0, t)


@triton.jit
def _order_free_sum(t, up, down):
    # The sum of a whole block of terms at the scale of _fixed_point_scale: the same bits in any
    # order of the terms.
    return tl.sum(_fixed_finite(t, up), axis=0).to(tl.float32) * down + tl.sum(_non_finite(t), axis=0)


@triton.jit
def _exact_terms(t):
    # The largest finite |t| of a block and the sum of its non-finite terms, whatever they are.
    return tl.max(_finite_abs(t), axis=0), tl.sum(_non_finite(t), axis=0)


@triton.jit
def _block_terms(t):
    # _exact_terms and whether every term is finite: (amax, F, finite). Almost always every term
    # is: one NaN-propagating max of |t|, an instruction an element, says so, and the selects of
    # _finite_abs and _non_finite (four instructions an element) are spent only where it says
    # not. (The split kernel, its registers full, keeps to _exact_terms.)
    amax = _row_max(tl.abs(t), 0)
    finite = amax < INF
    F = tl.cast(0.0, tl.float32)
    if not finite:
        amax, F = _exact_terms(t)
    return amax, F, finite


@triton.jit
def _block_fixed_sum(t, up, finite):
    # The int64 sum of a block's finite terms at scale `up`; `finite`: every term is, so none
    # needs its select.
    if finite:
        S = tl.sum((t * up).to(tl.int64), axis=0)
    else:
        S = tl.sum(_fixed_finite(t, up), axis=0)
    return S


# ------------------------------------------------------------------------------ softmax backward
#
# dx = y * (dy - s), s = sum(y * dy) over the row. Two reads (dy, y) and one write (dx).


@triton.jit
def _products(y_row, dy_row, idx, V):
    # y * dy at the offsets idx of one row (0 past V; V None: every offset is in the row), in
    # float32: the terms of s.
    if V is None:
        t = tl.load(y_row + idx).to(tl.float32) * tl.load(dy_row + idx).to(tl.float32)
    else:
        y = tl.load(y_row + idx, mask=idx < V, other=0.0).to(tl.float32)
        t = y * tl.load(dy_row + idx, mask=idx < V, other=0.0).to(tl.float32)
    return t


@triton.jit
def _write_dx(y_row, dy_row, dx_row, idx, s, V):
    # dx = y (dy - s) at the offsets idx of one row, read again from L2 for the last time (V as
    # in _products).
    if V is None:
        y = tl.load(y_row + idx, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + idx, eviction_policy="evict_first").to(tl.float32)
        tl.store(dx_row + idx, (y * (dy - s)).to(dx_row.dtype.element_ty))
    else:
        y = tl.load(y_row + idx, mask=idx < V, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + idx, mask=idx < V, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(dx_row + idx, (y * (dy - s)).to(dx_row.dtype.element_ty), mask=idx < V)


# Rows walked in tiles of `cols`: the whole tiles unmasked (a masked load zeroes its registers
# first, two or three instructions a vector), then the part tile past the last whole one.


@triton.jit
def _streamed_terms(y_row, dy_row, V, cols):
    # _block_terms over a row walked in tiles of `cols` (read once more where a term is not
    # finite).
    BLOCK: tl.constexpr = cols.shape[0]
    whole = tl.multiple_of(V - V % BLOCK, BLOCK)
    n_run = (cols * 0).to(tl.float32)
    start = 0
    while start < whole:
        n_run = _abs_max(n_run, _products(y_row, dy_row, tl.multiple_of(start, BLOCK) + cols, None))
        start += BLOCK
    n_run = _abs_max(n_run, _products(y_row, dy_row, whole + cols, V))
    amax = _row_max(n_run, 0)
    finite = amax < INF
    F = tl.cast(0.0, tl.float32)
    if not finite:
        amax, F = _streamed_exact_terms(y_row, dy_row, V, cols)
    return amax, F, finite


@triton.jit
def _streamed_exact_terms(y_row, dy_row, V, cols):
    # The largest finite |y dy| and the sum of the non-finite terms of a row walked in tiles of
    # `cols`, whatever its terms.
    a_run = (cols * 0).to(tl.float32)
    f_run = (cols * 0).to(tl.float32)
    start = 0
    while start < V:
        t = _products(y_row, dy_row, start + cols, V)
        a_run = tl.maximum(a_run, _finite_abs(t))
        f_run += _non_finite(t)
        start += cols.shape[0]
    return tl.max(a_run, axis=0), tl.sum(f_run, axis=0)


@triton.jit
def _streamed_fixed_sum(y_row, dy_row, V, up, finite, cols):
    # _block_fixed_sum over a row walked in tiles of `cols`.
    BLOCK: tl.constexpr = cols.shape[0]
    s_run = (cols * 0).to(tl.int64)
    start = 0
    if finite:
        whole = tl.multiple_of(V - V % BLOCK, BLOCK)
        while start < whole:
            s_run += (_products(y_row, dy_row, tl.multiple_of(start, BLOCK) + cols, None) * up).to(tl.int64)
            start += BLOCK
        s_run += (_products(y_row, dy_row, whole + cols, V) * up).to(tl.int64)
    else:
        while start < V:
            s_run += _fixed_finite(_products(y_row, dy_row, start + cols, V), up)
            start += BLOCK
    return tl.sum(s_run, axis=0)


@triton.jit
def _streamed_dx(y_row, dy_row, dx_row, V, s, cols):
    # The write pass over a row walked in tiles of `cols`.
    BLOCK: tl.constexpr = cols.shape[0]
    whole = tl.multiple_of(V - V % BLOCK, BLOCK)
    start = 0
    while start < whole:
        _write_dx(y_row, dy_row, dx_row, tl.multiple_of(start, BLOCK) + cols, s, None)
        start += BLOCK
    _write_dx(y_row, dy_row, dx_row, whole + cols, s, V)


@triton.jit
def softmax_backward_row_kernel(DY, Y, DX, V, stride_dy, stride_y, stride_dx, K, BLOCK: tl.constexpr):
    # One program holds the whole row in registers (BLOCK = next_pow2(V)): one read of each input.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < V
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    t = y * dy
    amax, F, finite = _block_terms(t)
    up, down = _fixed_point_scale(amax, K)
    s = _block_fixed_sum(t, up, finite).to(tl.float32) * down + F
    tl.store(DX + row * stride_dx + cols, (y * (dy - s)).to(DX.dtype.element_ty), mask=mask)


@triton.jit
def softmax_backward_reread_kernel(
    DY, Y, DX, V, stride_dy, stride_y, stride_dx, K, BLOCK: tl.constexpr, TILE: tl.constexpr
):
    # Rows too long to hold dy and y, short enough to hold their products (BLOCK = next_pow2(V)):
    # one program a row keeps only t = y dy in registers, one value an element, and reads dy and
    # y again for the write. The row was read a moment before, so the second read finds it in L2:
    # DRAM sees two reads and one write in two passes, with no meeting and no third pass.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    dy_row = DY + row * stride_dy
    y_row = Y + row * stride_y
    t = _products(y_row, dy_row, cols, V)
    amax, F, finite = _block_terms(t)
    up, down = _fixed_point_scale(amax, K)
    s = _block_fixed_sum(t, up, finite).to(tl.float32) * down + F
    _streamed_dx(y_row, dy_row, DX + row * stride_dx, V, s, tl.arange(0, TILE))


@triton.jit
def _backward_meet_scale(ws, P, chunk, tag, a_c, f_c, y_row, dy_row, V, K, P_BLOCK: tl.constexpr,
                         FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr):  # fmt: skip
    # Meeting 1 of the backward's split: from this chunk's largest finite |y dy| (a_c) and sum
    # of non-finite terms (f_c), the row's order-free scale (up, down) and non-finite sum F;
    # a program whose siblings do not arrive in time streams the row (y_row, dy_row) itself.
    return _backward_meet_scale_on(ws, P, chunk, tag, a_c, f_c, y_row, dy_row, V, K, tl.arange(0, P_BLOCK),
                                   tl.arange(0, FALLBACK_BLOCK), MAX_SPINS)  # fmt: skip


@triton.jit
def _backward_meet_scale_on(ws, P, chunk, tag, a_c, f_c, y_row, dy_row, V, K, slots, fcols,
                            MAX_SPINS: tl.constexpr):  # fmt: skip
    # _backward_meet_scale over a program's meeting lanes `slots` (0 .. P_BLOCK - 1) and fallback
    # lanes `fcols` (0 .. FALLBACK_BLOCK - 1): a Gluon kernel makes them in its layouts.
    tag_hi = tag << 32
    my_a = _tagged(tag_hi, a_c)
    my_f = _tagged(tag_hi, f_c)
    tl.atomic_xchg(ws + chunk, my_a, sem="relaxed")
    tl.atomic_xchg(ws + P + chunk, my_f, sem="relaxed")
    amax, stale = _meet_floats_on(ws, P, chunk, my_a, tag, False, slots, MAX_SPINS)
    F = tl.cast(0.0, tl.float32)
    if stale == 0:
        F, stale = _meet_floats_on(ws + P, P, chunk, my_f, tag, True, slots, MAX_SPINS)
    if stale > 0:
        amax, F = _streamed_exact_terms(y_row, dy_row, V, fcols)
    up, down = _fixed_point_scale(amax, K)
    return up, down, F


@triton.jit
def _backward_meet_sum(ws, P, chunk, tag, s_c, up, y_row, dy_row, V, P_BLOCK: tl.constexpr,
                       FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr):  # fmt: skip
    # Meeting 2: the row's fixed-point sum at scale `up` from this chunk's (s_c), or streamed.
    return _backward_meet_sum_on(ws, P, chunk, tag, s_c, up, y_row, dy_row, V, tl.arange(0, P_BLOCK),
                                 tl.arange(0, FALLBACK_BLOCK), MAX_SPINS)  # fmt: skip


@triton.jit
def _backward_meet_sum_on(ws, P, chunk, tag, s_c, up, y_row, dy_row, V, slots, fcols, MAX_SPINS: tl.constexpr):
    # _backward_meet_sum over the lanes of _backward_meet_scale_on.
    tag_hi = tag << 32
    my_hi, my_lo = _tagged_halves(tag_hi, s_c)
    tl.atomic_xchg(ws + 2 * P + 2 * chunk, my_hi, sem="relaxed")
    tl.atomic_xchg(ws + 2 * P + 2 * chunk + 1, my_lo, sem="relaxed")
    S, stale = _meet_sum_on(ws + 2 * P, P, chunk, my_hi, my_lo, tag, slots, MAX_SPINS)
    if stale > 0:
        S = _streamed_fixed_sum(y_row, dy_row, V, up, False, fcols)
    return S


@gluon.jit(do_not_specialize=["V", "P", "stride_dy", "stride_y", "stride_dx", "y_off", "dy_off", "dx_off"])
def softmax_backward_held_split_kernel(
    DY, Y, DX, WS, V, P, stride_dy, stride_y, stride_dx, y_off, dy_off, dx_off, K,
    CHUNK: gl.constexpr, P_BLOCK: gl.constexpr, FALLBACK_BLOCK: gl.constexpr, MAX_SPINS: gl.constexpr,
    ALIGN: gl.constexpr, ASYNC: gl.constexpr,
):  # fmt: skip
    # The backward's split (its chunks, edges, two meetings on the same 4 P words, fallback) with
    # each program's chunk of y and of dy held in shared memory, as the softmax's held split
    # holds x (kernels/triton_kernels.py): copied in by cp.async on ALIGN-groups of 16-byte
    # aligned base views, Y's rows cut as the forward's, DY and DX in step with them (the
    # wrapper checks). The slots outside the row's whole groups are zeros (cp.async leaves
    # them so; the copy through registers is made so by _held_fill), whose products add
    # nothing. Read three times: the products' largest |y dy| (and, where one is not finite,
    # once more for _exact_terms'), their fixed-point sum, and dx = y (dy - s).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    pid = gl.program_id(0).to(gl.int64)
    row = pid // P
    chunk = pid - row * P
    ys = y_off + row * stride_y  # row start, elements from Y
    g_lo, g_hi, base, grp, cols = _held_groups(ys, V, TILE, ALIGN)
    c_base = base + chunk * CHUNK
    # DY's and DX's element of Y's offset o sit at DY + o + dy_shift, DX + o + dx_shift.
    dy_shift = gl.multiple_of(dy_off + row * stride_dy - ys, ALIGN)
    dx_shift = gl.multiple_of(dx_off + row * stride_dx - ys, ALIGN)
    y_bufs = _held_buffers(Y.dtype.element_ty, CHUNK, TILE)
    dy_bufs = _held_buffers(DY.dtype.element_ty, CHUNK, TILE)
    _held_copy_in(Y, y_bufs, c_base, grp, cols, g_lo, g_hi, CHUNK, ALIGN, ASYNC)
    _held_copy_in(DY + dy_shift, dy_bufs, c_base, grp, cols, g_lo, g_hi, CHUNK, ALIGN, ASYNC)
    ws = WS + row * (4 * P)
    slots = gl.arange(0, P_BLOCK, layout=flat)
    tag = _launch_tag_on(ws + chunk, slots)  # while the copies are in flight
    pos, e_mask, ye = _held_edges(Y, ys, V, g_lo, g_hi, ALIGN, ASYNC, chunk == 0)
    dye = gl.load(DY + dy_shift + pos, mask=e_mask, other=0.0).to(gl.float32)
    te = gl.where(e_mask, ye * dye, 0.0)
    if not ASYNC:
        _held_fill(y_bufs, c_base, grp, g_lo, g_hi, 0.0, CHUNK, ALIGN)
        _held_fill(dy_bufs, c_base, grp, g_lo, g_hi, 0.0, CHUNK, ALIGN)
        _barrier()

    n_lane = gl.zeros([TILE], gl.float32, lanes)
    for t in gl.static_range(CHUNK // TILE):
        n_lane = _abs_max(n_lane, _held_products(y_bufs, dy_bufs, t, TILE, CHUNK, lanes))
    a_c = _nan_max(_row_max(n_lane, 0), _row_max(gl.abs(te), 0))
    finite = a_c < INF
    f_c = gl.to_tensor(0.0)  # the sum of no non-finite terms
    if not finite:  # a non-finite product: the chunk's exact terms, read again
        a_lane = gl.zeros([TILE], gl.float32, lanes)
        f_lane = gl.zeros([TILE], gl.float32, lanes)
        for t in gl.static_range(CHUNK // TILE):
            tt = _held_products(y_bufs, dy_bufs, t, TILE, CHUNK, lanes)
            a_lane = gl.maximum(a_lane, _finite_abs(tt))
            f_lane += _non_finite(tt)
        a_e, f_e = _exact_terms(te)
        a_c = gl.maximum(gl.max(a_lane, axis=0), a_e)
        f_c = gl.sum(f_lane, axis=0) + f_e
    y_row = Y + ys
    dy_row = DY + dy_shift + ys
    fcols = gl.arange(0, FALLBACK_BLOCK, layout=flat)
    up, down, F = _backward_meet_scale_on(ws, P, chunk, tag, a_c, f_c, y_row, dy_row, V, K, slots, fcols, MAX_SPINS)

    _barrier()
    s_lane = gl.zeros([TILE], gl.int64, lanes)
    if finite:
        for t in gl.static_range(CHUNK // TILE):
            s_lane += (_held_products(y_bufs, dy_bufs, t, TILE, CHUNK, lanes) * up).to(gl.int64)
    else:
        for t in gl.static_range(CHUNK // TILE):
            s_lane += _fixed_finite(_held_products(y_bufs, dy_bufs, t, TILE, CHUNK, lanes), up)
    s_c = gl.sum(s_lane, axis=0) + gl.sum(_fixed_finite(te, up), axis=0)
    S = _backward_meet_sum_on(ws, P, chunk, tag, s_c, up, y_row, dy_row, V, slots, fcols, MAX_SPINS)
    s = S.to(gl.float32) * down + F

    gl.store(DX + dx_shift + pos, (ye * (dye - s)).to(DX.dtype.element_ty), mask=e_mask)
    _barrier()
    for t in gl.static_range(CHUNK // TILE):
        mask = _group_mask(grp, c_base + t * TILE, g_lo, g_hi, ALIGN)
        y = _held_tile(y_bufs, t, TILE, CHUNK).load(lanes).to(gl.float32)
        dy = _held_tile(dy_bufs, t, TILE, CHUNK).load(lanes).to(gl.float32)
        gl.store(DX + dx_shift + c_base + t * TILE + cols, (y * (dy - s)).to(DX.dtype.element_ty), mask=mask)


@gluon.jit
def _held_products(y_bufs, dy_bufs, t: gl.constexpr, TILE: gl.constexpr, BLOCK: gl.constexpr, lanes: gl.constexpr):
    # y dy over tile t of a held chunk of each, in float32.
    y = _held_tile(y_bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
    return y * _held_tile(dy_bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)


@triton.jit
def _chunk_cut(off, row, stride, chunk, V, CHUNK: tl.constexpr, ALIGN: tl.constexpr):
    # Where chunk `chunk` of row `row` lies, counted from a base view `off` elements before row
    # 0: (the row's start, the chunk's offsets from the base view, its columns in the row, their
    # mask). ALIGN > 1: the forward split's cut (kernels/triton_kernels.py), chunks over whole
    # ALIGN-groups so that a row of any V or offset moves in vectors, and chunk 0 also holds the
    # partial groups at the row's two ends (_split_edges: every `if ALIGN > 1` block of the
    # split kernels). ALIGN = 1: CHUNK elements from the row's start and no edges, the cut for
    # rows whose pointers, strides and V are multiples of 16 bytes, which Triton's launcher then
    # moves in vectors, and for tensors whose rows are out of step, element by element; every
    # offset is 0 there (kernels.triton_launch.training_cut).
    start = off + row * stride
    if ALIGN > 1:
        c_start, mask = _split_chunk(start, chunk, V, CHUNK, ALIGN)
        offs = c_start + tl.arange(0, CHUNK)
        cols = offs - start
    else:
        cols = chunk * CHUNK + tl.arange(0, CHUNK)
        offs = start + cols
        mask = cols < V
    return start, offs, cols, mask


@triton.jit
def _at(T, off, row, stride, start, offs, cols, ALIGN: tl.constexpr):
    # Pointers to tensor T's elements of the chunk, T's row `row` lying `off` elements past its
    # base view with row stride `stride`. ALIGN > 1: T's row is in step with the cut tensor's (row
    # start `start`, offsets `offs`) within a 16-byte group (the wrapper checks), so the shift
    # between them is a multiple of ALIGN, told to Triton (where the value is formed: a hint on
    # an argument is lost) so that both move in vectors. ALIGN = 1: the row's columns `cols`.
    if ALIGN > 1:
        return T + tl.multiple_of(off + row * stride - start, ALIGN) + offs
    else:
        return T + row * stride + cols


@triton.jit
def _row_at(T, off, row, stride, ALIGN: tl.constexpr):
    # Tensor T's row `row` (as in _at): where the streaming fallbacks read it.
    if ALIGN > 1:
        return T + off + row * stride
    else:
        return T + row * stride


@triton.jit
def softmax_backward_split_kernel(
    DY, Y, DX, WS, V, P, stride_dy, stride_y, stride_dx, y_off, dy_off, dx_off, K,
    CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    # A row too long for one program's registers is shared by P programs, each keeping a CHUNK of
    # dy and y in registers: still two reads and one write. The programs of a row meet twice
    # through the row's 4 P words in WS, on tagged words as the forward's split kernel meets
    # (kernels/triton_kernels.py: a word carries the launch's tag in its upper 32 bits, so one
    # read tells whether it is this launch's; no counter, no fence, no reset; a workspace
    # serves one P and is zeroed only when allocated):
    #   [0, P)     each chunk's largest finite |y dy| (float bits)
    #   [P, 2P)    each chunk's sum of non-finite y dy (float bits)
    #   [2P, 4P)   each chunk's fixed-point sum, upper and lower 32 bits
    # Each wait is bounded: a program whose siblings are not scheduled in time streams the row
    # itself for the same exact values (slower, never a deadlock). Under the interpreter, whose
    # programs run one after another, the bound is 0: early chunks stream, the last combines.
    # Chunks are cut as _chunk_cut says, on Y's rows (from its base view, y_off elements before
    # Y's first); dy and dx are read and written in step with them (_at).
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    ys, offs, cols, mask = _chunk_cut(y_off, row, stride_y, chunk, V, CHUNK, ALIGN)
    y = tl.load(_at(Y, y_off, row, stride_y, ys, offs, cols, ALIGN), mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(_at(DY, dy_off, row, stride_dy, ys, offs, cols, ALIGN), mask=mask, other=0.0).to(tl.float32)
    # The tag before any reduction: its read then overlaps the chunk's (a meeting's barrier
    # would keep it waiting behind them: 1.07-1.08x slower at (4096, 128256), run (d)).
    ws = WS + row * (4 * P)
    tag = _launch_tag(ws + chunk, P_BLOCK)
    t = y * dy
    a_c, f_c = _exact_terms(t)
    if ALIGN > 1:  # the row's edges (chunk 0's): max and sums are order-free
        pos, e_mask = _split_edges(ys, chunk, V, ALIGN)
        ye = tl.load(_at(Y, y_off, row, stride_y, ys, pos, 0, ALIGN), mask=e_mask, other=0.0).to(tl.float32)
        dye = tl.load(_at(DY, dy_off, row, stride_dy, ys, pos, 0, ALIGN), mask=e_mask, other=0.0).to(tl.float32)
        te = ye * dye
        a_e, f_e = _exact_terms(te)
        a_c = tl.maximum(a_c, a_e)
        f_c += f_e
    y_row = _row_at(Y, y_off, row, stride_y, ALIGN)
    dy_row = _row_at(DY, dy_off, row, stride_dy, ALIGN)
    up, down, F = _backward_meet_scale(ws, P, chunk, tag, a_c, f_c, y_row, dy_row, V, K,
                                       P_BLOCK, FALLBACK_BLOCK, MAX_SPINS)  # fmt: skip
    s_c = tl.sum(_fixed_finite(t, up), axis=0)
    if ALIGN > 1:
        s_c += tl.sum(_fixed_finite(te, up), axis=0)
    S = _backward_meet_sum(ws, P, chunk, tag, s_c, up, y_row, dy_row, V, P_BLOCK, FALLBACK_BLOCK, MAX_SPINS)
    s = S.to(tl.float32) * down + F
    tl.store(_at(DX, dx_off, row, stride_dx, ys, offs, cols, ALIGN), (y * (dy - s)).to(DX.dtype.element_ty), mask=mask)
    if ALIGN > 1:
        dx_e = _at(DX, dx_off, row, stride_dx, ys, pos, 0, ALIGN)
        tl.store(dx_e, (ye * (dye - s)).to(DX.dtype.element_ty), mask=e_mask)


@triton.jit
def softmax_backward_stream_kernel(
    DY, Y, DX, B, V, stride_dy, stride_y, stride_dx, K, BLOCK: tl.constexpr,
):  # fmt: skip
    # Long rows in a long batch: a grid of a few programs per SM walks the rows, reading each
    # three times in BLOCK-wide tiles (the largest finite |y dy| and the non-finite terms; the
    # fixed-point sum; the write). The grid bounds the rows in flight, so the second and third
    # reads find the row in L2: DRAM sees two reads and one write, as with the split, without
    # its meetings. The terms and sums are the row kernel's, so are the bits.
    cols = tl.arange(0, BLOCK)
    row = tl.program_id(0).to(tl.int64)
    while row < B:
        dy_row = DY + row * stride_dy
        y_row = Y + row * stride_y
        amax, F, finite = _streamed_terms(y_row, dy_row, V, cols)
        up, down = _fixed_point_scale(amax, K)
        s = _streamed_fixed_sum(y_row, dy_row, V, up, finite, cols).to(tl.float32) * down + F
        _streamed_dx(y_row, dy_row, DX + row * stride_dx, V, s, cols)
        row += tl.num_programs(0)


# ------------------------------------------------------------------------------ cross-entropy
#
# Per row i with target t (PyTorch's semantics; w = class weights, 1 without; e = label smoothing),
# every term relative to the row's max m, so that no large values cancel (a row of logits near
# 1e30 keeps its loss, log 2, and a confident row its small one):
#   L     = log(sum exp(x - m))                 lse = m + L
#   loss  = (1 - e) * w_t * ((m - x_t) + L) + e / V * (W_all * L - q)      W_all = sum w
#           q = sum_j w_j (x_j - m)
#   dloss/dx_j = (1 - e) * w_t * (p_j - [j == t]) + e / V * (W_all * p_j - w_j)       p = softmax
# times GSCALE (1 / sum of the rows' w_t for reduction="mean", 1 otherwise). A row whose target
# is ignore_index has loss 0 and gradient 0 times its probabilities (0, or NaN throughout a row
# whose max is not finite: a NaN, a +inf or no finite logit), as PyTorch gives; a target outside
# [0, V) gives NaN (the wrapper raises a ValueError before launching unless told not to look).
#
# L = log1p(z) with z = (S - 2^K) / 2^K: S the fixed-point sum of the row's exponentials, in
# which the max's own term is exactly 2^K, so S - 2^K (the other terms) is an exact integer.
# p_t - 1 at the target is -(S - E_t) / S likewise, E_t the target's own term: 1 - p_t (the
# gradient's only large entry, and the one that decides training on confident rows) is an exact
# integer difference rounded once, not 1 minus a probability near 1. q is an order-free sum whose
# scale comes from its bound max|w| * (m - min x) (PREP[3] = max|w|), known once the max and the
# min are: no pass of its own.
#
# The row's max propagates NaN (a reduction with a NaN-propagating combine: max.NaN on sm_80+,
# the same one instruction as tl.max's), so a row holding a NaN has m = NaN as in PyTorch.


@triton.jit
def _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, q, eps, inv_v, ignored, valid, HAS_SMOOTHING: tl.constexpr):
    # A row's lse, its loss and whether its max is finite, from the max, the exponentials' sum S
    # and (smoothing) q, per the derivation above. log1p(z) as log(1 + z) z / ((1 + z) - 1), the
    # rounding of 1 + z divided back out (exact for 1 + z == 1), with one log and one division a
    # row.
    fin = tl.abs(m) < INF
    unit = ((254 << 23) - tl.cast(SCALE, tl.int32, bitcast=True)).to(tl.float32, bitcast=True)  # 2^-K
    z = (S_fix - tl.cast(SCALE, tl.int64)).to(tl.float32) * unit
    one_z = 1.0 + z
    L = tl.where(one_z == 1.0, z, tl.log(one_z) * tl.fdiv(z, one_z - 1.0))
    lse = tl.where(fin, m + L, m)  # +-inf rows give +-inf, NaN rows NaN, as torch.logsumexp
    if HAS_SMOOTHING:
        loss = (1.0 - eps) * w_t * ((m - x_t) + L) + (eps * inv_v) * (w_all * L - q)
    else:
        loss = w_t * ((m - x_t) + L)
    loss = tl.where(ignored, 0.0, tl.where(valid & fin, loss, float("nan")))
    return lse, loss, fin


@triton.jit
def _ce_gradient(e, S_fix, E_t, SCALE, fin, cols, t_safe, w_t, w_all, w_j, eps, inv_v, scale, ignored, valid,
                 OUT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, VALID_ROW: tl.constexpr = False):  # fmt: skip
    # The gradient of a row's (part of the row's) entries, per the derivation above: p_j - [j == t]
    # with p_t - 1 = -(S - E_t) / S, smoothing, the reduction's scale (PREP[2], read by
    # _ce_target); NaN throughout a row whose max is not finite (its probabilities are), 0 or NaN
    # on an ignored row. VALID_ROW: the caller knows the row valid (so not ignored), and the
    # selects that stand for the other rows go.
    hi, inv = _ce_inverse(S_fix, SCALE, fin)
    pm1 = tl.where(fin, -((S_fix - E_t).to(tl.float32) / S_fix.to(tl.float32)), float("nan"))
    p = _normalise(e, hi, inv, OUT)
    pq = tl.where(cols == t_safe.to(tl.int32), pm1, p)  # t_safe < V < 2^31: one 32-bit compare an element
    if HAS_SMOOTHING:
        g = (1.0 - eps) * w_t * pq + (eps * inv_v) * (w_all * p - w_j)
    else:
        g = w_t * pq
    g = g * scale
    if not VALID_ROW:
        g = tl.where(ignored, tl.where(fin, 0.0, float("nan")), tl.where(valid, g, float("nan")))
    return g


@triton.jit
def _ce_inverse(S_fix, SCALE, fin):
    # _row_scale's (-hi, 1 / hi) for a row's probabilities, 1 / hi NaN where the row's max is
    # not finite (so are all its probabilities).
    neg_hi, inv = _row_scale(S_fix, SCALE)
    return neg_hi, tl.where(fin, inv, float("nan"))


@triton.jit
def _ce_target_entry(x_t, m, S_fix, E_t, SCALE, fin, t, w_t, w_all, scale, ignored, valid, OUT: tl.constexpr):
    # A plain row's gradient at its target t (column t of _ce_gradient), which the plain factors
    # below leave to be written apart.
    return _ce_gradient(_exp(x_t, m, OUT), S_fix, E_t, SCALE, fin, t, t, w_t, w_all, 1.0, 0.0, 0.0, scale, ignored,
                        valid, OUT, False)  # fmt: skip


@triton.jit
def _ce_plain_factors(scale, fin, ignored, valid):
    # For a plain row (no class weights, no smoothing), _ce_gradient's entries away from the
    # target as one fma of its probabilities p: fma(p, k, c) is p * scale rounded once on a
    # valid row (c = -0.0 keeps a -0.0), +0.0 on an ignored row (p is finite where the max is),
    # NaN where _ce_gradient gives NaN, without a select an element.
    k = tl.where(ignored, tl.where(fin, 0.0, float("nan")), tl.where(valid, scale, float("nan")))
    return k, tl.where(ignored, 0.0, -0.0)


@triton.jit
def _ce_target(T, W, PREP, row, V, ignore_index, HAS_WEIGHT: tl.constexpr):
    # A row's target: whether it is ignored, whether it is a class (t in [0, V)), the target made
    # safe to index with, its weight, the sum of all weights (the prep kernel's PREP[0]; V
    # without weights) and the gradient's scale (PREP[2]). Read before the row, so that their
    # latency passes while the row loads rather than after its reductions.
    t = tl.load(T + row).to(tl.int64)
    scale = tl.load(PREP + 2)
    ignored = t == ignore_index
    valid = (t != ignore_index) & (t >= 0) & (t < V)
    t_safe = tl.where(valid, t, 0)
    if HAS_WEIGHT:
        w_t = tl.load(W + t_safe).to(tl.float32)
        w_all = tl.load(PREP + 0)
    else:
        w_t = 1.0
        w_all = V * 1.0  # V may be the constexpr 1
    return ignored, valid, t_safe, w_t, w_all, scale


@triton.jit
def _ce_weights(W, cols, mask, HAS_WEIGHT: tl.constexpr):
    # The class weights of the columns `cols` (0 outside `mask`; 1 inside without weights; mask
    # None: every column is in the row).
    if HAS_WEIGHT:
        if mask is None:
            w = tl.load(W + cols).to(tl.float32)
        else:
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        if mask is None:
            w = 1.0
        else:
            w = tl.where(mask, 1.0, 0.0)
    return w


@triton.jit
def cross_entropy_row_kernel(
    X, T, W, G, LOSS, LSE, PREP, V, stride_x, stride_g, ignore_index, eps, inv_v, KW, SCALE,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
):  # fmt: skip
    # One program holds the whole row in registers (BLOCK = next_pow2(V)): one read, one write.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < V
    ignored, valid, t_safe, w_t, w_all, scale = _ce_target(T, W, PREP, row, V, ignore_index, HAS_WEIGHT)
    w_max = 1.0  # the smoothing sum's bound on |w| (PREP[3]), also read before the row
    if HAS_SMOOTHING:
        w_max = tl.load(PREP + 3)
    w_j = _ce_weights(W, cols, mask, HAS_WEIGHT)
    # The sums: exponentials at the fixed scale, and (label smoothing) q order-free.
    x = tl.load(X + row * stride_x + cols, mask=mask, other=-INF).to(tl.float32)
    # The target's logit, read again as a scalar while the row loads (the same bits as in the
    # row; a reduction would cost the interpreter more than the load costs the GPU).
    x_t = tl.load(X + row * stride_x + t_safe).to(tl.float32)
    m = tl.reduce(x, 0, _nan_max)
    e = _exp(x, m, G.dtype.element_ty)
    e_fix = (e * SCALE).to(tl.int64)
    S_fix = tl.sum(e_fix, axis=0)
    E_t = _fixed(_exp(x_t, m, G.dtype.element_ty), SCALE)
    q = 0.0
    if HAS_SMOOTHING:
        up, down = _fixed_point_scale(w_max * (m - tl.min(tl.where(mask, x, INF), axis=0)), KW)
        q = _order_free_sum(tl.where(mask, w_j * (x - m), 0.0), up, down)
    # The row's results.
    lse, loss, fin = _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, q, eps, inv_v, ignored, valid, HAS_SMOOTHING)
    tl.store(LSE + row, lse)
    tl.store(LOSS + row, loss)
    OUT: tl.constexpr = G.dtype.element_ty
    if HAS_WEIGHT or HAS_SMOOTHING:
        g = _ce_gradient(e, S_fix, E_t, SCALE, fin, cols, t_safe, w_t, w_all, w_j, eps, inv_v, scale,
                         ignored, valid, OUT, HAS_SMOOTHING)  # fmt: skip
    else:  # a plain row as the held kernels write it: one fma an element, the target's entry apart
        neg_hi, inv = _ce_inverse(S_fix, SCALE, fin)
        k, c = _ce_plain_factors(scale, fin, ignored, valid)
        g_t = _ce_target_entry(x_t, m, S_fix, E_t, SCALE, fin, t_safe, w_t, w_all, scale, ignored, valid, OUT)
        g = tl.where(cols == t_safe.to(tl.int32), g_t, tl.fma(_normalise(e, neg_hi, inv, OUT), k, c))
    tl.store(G + row * stride_g + cols, g.to(OUT), mask=mask)


@triton.jit
def _ce_meet_extremes(ws, P, chunk, tag, m_c, neg_mn_c, x_row, V, P_BLOCK: tl.constexpr,
                      FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr, HAS_SMOOTHING: tl.constexpr):  # fmt: skip
    # Meeting 1 of the cross-entropy's split: from this chunk's max (m_c) and minus its min
    # (neg_mn_c, with smoothing), the row's max m (NaN-propagating) and min mn (inf without
    # smoothing); a program whose siblings do not arrive in time streams the row itself.
    tag_hi = tag << 32
    my_m = _tagged(tag_hi, m_c)
    my_mn = _tagged(tag_hi, neg_mn_c)
    tl.atomic_xchg(ws + chunk, my_m, sem="relaxed")
    tl.atomic_xchg(ws + P + chunk, my_mn, sem="relaxed")
    m, stale = _meet_floats(ws, P, chunk, my_m, tag, False, P_BLOCK, MAX_SPINS)
    mn = tl.full([], INF, tl.float32)
    if HAS_SMOOTHING:
        if stale == 0:
            neg_mn, stale = _meet_floats(ws + P, P, chunk, my_mn, tag, False, P_BLOCK, MAX_SPINS)
            mn = -neg_mn
    if stale > 0:
        m, mn = _ce_streamed_extremes(x_row, V, tl.arange(0, FALLBACK_BLOCK), HAS_SMOOTHING)
    return m, mn


@triton.jit
def _ce_streamed_extremes(x_row, V, cols, HAS_SMOOTHING: tl.constexpr):
    # A row's max (NaN-propagating) and, with smoothing, its min (inf without), read in tiles
    # over the lanes `cols` (0 .. BLOCK - 1; a Gluon kernel makes them in its layout): the
    # whole tiles unmasked, then the part tile.
    BLOCK: tl.constexpr = cols.shape[0]
    whole = tl.multiple_of(V - V % BLOCK, BLOCK)
    m_lane = (cols * 0).to(tl.float32) - INF
    mn_lane = (cols * 0).to(tl.float32) + INF
    start = 0
    while start < whole:
        x = tl.load(x_row + tl.multiple_of(start, BLOCK) + cols).to(tl.float32)
        m_lane = _nan_max(m_lane, x)
        if HAS_SMOOTHING:
            mn_lane = tl.minimum(mn_lane, x)
        start += BLOCK
    idx = whole + cols
    x = tl.load(x_row + idx, mask=idx < V, other=-INF).to(tl.float32)
    m_lane = _nan_max(m_lane, x)
    if HAS_SMOOTHING:
        mn_lane = tl.minimum(mn_lane, tl.where(idx < V, x, INF))
    return _row_max(m_lane, 0), tl.min(mn_lane, axis=0)


@triton.jit
def _ce_meet_sums(ws, P, chunk, tag, s_c, q_c, f_c, x_row, W, m, up, V, SCALE, OUT: tl.constexpr,
                  P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr,
                  HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr):  # fmt: skip
    # Meeting 2: the row's fixed-point sum of exp(x - m) (S_fix) and, with smoothing, of finite
    # w (x - m) at scale `up` (Q_fix) and of the non-finite ones (F), from this chunk's s_c, q_c,
    # f_c (every word written by every launch, so all stay in step), or streamed.
    tag_hi = tag << 32
    s_hi, s_lo = _tagged_halves(tag_hi, s_c)
    q_hi, q_lo = _tagged_halves(tag_hi, q_c)
    my_f = _tagged(tag_hi, f_c)
    tl.atomic_xchg(ws + 2 * P + 2 * chunk, s_hi, sem="relaxed")
    tl.atomic_xchg(ws + 2 * P + 2 * chunk + 1, s_lo, sem="relaxed")
    tl.atomic_xchg(ws + 4 * P + 2 * chunk, q_hi, sem="relaxed")
    tl.atomic_xchg(ws + 4 * P + 2 * chunk + 1, q_lo, sem="relaxed")
    tl.atomic_xchg(ws + 6 * P + chunk, my_f, sem="relaxed")
    S_fix, stale = _meet_sum(ws + 2 * P, P, chunk, s_hi, s_lo, tag, P_BLOCK, MAX_SPINS)
    Q_fix = tl.zeros([], tl.int64)
    F = tl.zeros([], tl.float32)
    if HAS_SMOOTHING:
        if stale == 0:
            Q_fix, stale = _meet_sum(ws + 4 * P, P, chunk, q_hi, q_lo, tag, P_BLOCK, MAX_SPINS)
        if stale == 0:
            F, stale = _meet_floats(ws + 6 * P, P, chunk, my_f, tag, True, P_BLOCK, MAX_SPINS)
    if stale > 0:
        fcols = tl.arange(0, FALLBACK_BLOCK)
        S_fix, Q_fix, F = _ce_streamed_sums(x_row, W, V, m, up, SCALE, OUT, fcols, HAS_WEIGHT, HAS_SMOOTHING)
    return S_fix, Q_fix, F


@triton.jit
def _ce_streamed_sums(x_row, W, V, m, up, SCALE, OUT: tl.constexpr, cols, HAS_WEIGHT: tl.constexpr,
                      HAS_SMOOTHING: tl.constexpr, finite=False):  # fmt: skip
    # A row's fixed-point sum of exp(x - m) and, with smoothing, of finite w (x - m) at scale
    # `up` and of the non-finite ones (0 without), read in tiles over the lanes `cols` as
    # _ce_streamed_extremes reads them: (S_fix, Q_fix, F). `finite`: every w (x - m) is known
    # finite (_ce_terms_finite), so the whole tiles' terms need no select to set others apart.
    BLOCK: tl.constexpr = cols.shape[0]
    whole = tl.multiple_of(V - V % BLOCK, BLOCK)
    if finite:  # a loop of its own, compiled without the selects
        s_lane, q_lane, f_lane = _ce_whole_tile_sums(x_row, W, whole, m, up, SCALE, OUT, cols, HAS_WEIGHT,
                                                     HAS_SMOOTHING, True)  # fmt: skip
    else:
        s_lane, q_lane, f_lane = _ce_whole_tile_sums(x_row, W, whole, m, up, SCALE, OUT, cols, HAS_WEIGHT,
                                                     HAS_SMOOTHING, False)  # fmt: skip
    s, q, f = _ce_sum_terms(x_row, W, whole + cols, V, m, up, SCALE, OUT, HAS_WEIGHT, HAS_SMOOTHING, False)
    return tl.sum(s_lane + s, axis=0), tl.sum(q_lane + q, axis=0), tl.sum(f_lane + f, axis=0)


@triton.jit
def _ce_whole_tile_sums(x_row, W, whole, m, up, SCALE, OUT: tl.constexpr, cols, HAS_WEIGHT: tl.constexpr,
                        HAS_SMOOTHING: tl.constexpr, FINITE: tl.constexpr):  # fmt: skip
    # _ce_sum_terms summed lane by lane over the whole tiles before `whole`.
    BLOCK: tl.constexpr = cols.shape[0]
    s_lane = (cols * 0).to(tl.int64)
    q_lane = (cols * 0).to(tl.int64)
    f_lane = (cols * 0).to(tl.float32)
    start = 0
    while start < whole:
        s, q, f = _ce_sum_terms(x_row, W, tl.multiple_of(start, BLOCK) + cols, None, m, up, SCALE, OUT, HAS_WEIGHT,
                                HAS_SMOOTHING, FINITE)  # fmt: skip
        s_lane += s
        q_lane += q
        f_lane += f
        start += BLOCK
    return s_lane, q_lane, f_lane


@triton.jit
def _ce_sum_terms(x_row, W, idx, V, m, up, SCALE, OUT: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                  HAS_SMOOTHING: tl.constexpr, FINITE: tl.constexpr):  # fmt: skip
    # The terms of _ce_streamed_sums at the offsets idx of one row (V None: every one is in
    # it): the exponentials at SCALE and, with smoothing, w (x - m) at `up`, finite and not
    # (FINITE: every term is known finite, the last 0).
    if V is None:
        x = tl.load(x_row + idx).to(tl.float32)
        wd = _ce_weights(W, idx, None, HAS_WEIGHT) * (x - m)
    else:
        x = tl.load(x_row + idx, mask=idx < V, other=-INF).to(tl.float32)
        wd = tl.where(idx < V, _ce_weights(W, idx, idx < V, HAS_WEIGHT) * (x - m), 0.0)
    s = _fixed(_exp(x, m, OUT), SCALE)
    q = (idx * 0).to(tl.int64)
    f = (idx * 0).to(tl.float32)
    if HAS_SMOOTHING:
        if FINITE:
            q = (wd * up).to(tl.int64)
        else:
            q = _fixed_finite(wd, up)
            f = _non_finite(wd)
    return s, q, f


@triton.jit
def _ce_terms_finite(w_all, w_max, m, mn):
    # Whether every smoothing term w_j (x_j - m) of a row is finite, known before its sum: the
    # weights are all finite when their sum w_all is (a sum that overflows says no, safely), and
    # then |w_j (x_j - m)| <= w_max (m - mn) in floats (rounding is monotone), finite unless the
    # row holds an inf or a NaN (m or mn not finite) or the bound overflows.
    return (tl.abs(w_all) < INF) & (tl.abs(w_max * (m - mn)) < INF)


@triton.jit
def cross_entropy_split_kernel(
    X, T, W, G, LOSS, LSE, PREP, WS, V, P, stride_x, stride_g, x_off, g_off, ignore_index, eps, inv_v, KW, SCALE,
    CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    # A row too long for one program's registers is shared by P programs, each keeping a CHUNK of
    # the logits in registers: one read and one write. They meet twice, on tagged words as the
    # softmax backward's split kernel does, through 7 P words a row in WS (every word written by
    # every launch, the smoothing sums' as zeros without smoothing, so all stay in step):
    #   [0, P)     chunk max (float bits)
    #   [P, 2P)    minus the chunk min (float bits; the smoothing sum's scale)
    #   [2P, 4P)   chunk's fixed-point sum of exp(x - m), upper and lower 32 bits
    #   [4P, 6P)   chunk's fixed-point sum of finite w (x - m), likewise
    #   [6P, 7P)   chunk's sum of non-finite w (x - m) (float bits)
    # Waits are bounded; a program whose siblings do not arrive in time streams the row itself.
    # Every chunk writes its part of the gradient; chunk row % P writes the row's loss and lse
    # (any chunk has them, with the same bits): under the interpreter, where a row's last chunk
    # is the one that combines, some rows' losses then come from the meetings and some from the
    # streaming fallback, and tests see both. Chunks are cut as the backward's (_chunk_cut), on
    # X's rows from its base view (x_off elements before X's first); the gradient is written in
    # step with them (_at).
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs, offs, cols, mask = _chunk_cut(x_off, row, stride_x, chunk, V, CHUNK, ALIGN)
    ignored, valid, t_safe, w_t, w_all, scale = _ce_target(T, W, PREP, row, V, ignore_index, HAS_WEIGHT)
    w_max = 1.0  # the smoothing sum's bound on |w| (PREP[3]), read before the meetings
    if HAS_SMOOTHING:
        w_max = tl.load(PREP + 3)
    # The columns' class weights: on rows cut on groups, read once and held through both
    # meetings; on the others, read again where each use needs them (from L2), which frees their
    # registers during the meetings: 1.3-1.6x at (4096, 128256) weighted, smoothed, against
    # 0.9x on groups, whose edges' registers then spill more (run (d), reports/profiles.md).
    if ALIGN > 1:
        w_j = _ce_weights(W, cols, mask, HAS_WEIGHT)
    x_row = _row_at(X, x_off, row, stride_x, ALIGN)
    x = tl.load(_at(X, x_off, row, stride_x, xs, offs, cols, ALIGN), mask=mask, other=-INF).to(tl.float32)
    # The target's logit, before the first meeting: with inplace=True no sibling has written
    # its gradient over the logits yet (none passes the meetings before this program arrives).
    x_t = tl.load(x_row + t_safe).to(tl.float32)
    ws = WS + row * (7 * P)
    tag = _launch_tag(ws + chunk, P_BLOCK)  # before any reduction, as the backward's split
    m_c = tl.reduce(x, 0, _nan_max)
    mn_c = tl.min(tl.where(mask, x, INF), axis=0)  # the smoothing's only
    if ALIGN > 1:  # the row's edges (chunk 0's): extremes and sums are order-free
        pos, e_mask = _split_edges(xs, chunk, V, ALIGN)
        e_cols = pos - xs
        xe = tl.load(_at(X, x_off, row, stride_x, xs, pos, 0, ALIGN), mask=e_mask, other=-INF).to(tl.float32)
        m_c = _nan_max(m_c, tl.reduce(xe, 0, _nan_max))
        mn_c = tl.minimum(mn_c, tl.min(tl.where(e_mask, xe, INF), axis=0))

    # Meeting 1: the row's max (NaN-propagating) and min.
    neg_mn = tl.zeros([], tl.float32)
    if HAS_SMOOTHING:
        neg_mn = -mn_c
    m, mn = _ce_meet_extremes(ws, P, chunk, tag, m_c, neg_mn, x_row, V, P_BLOCK, FALLBACK_BLOCK, MAX_SPINS,
                              HAS_SMOOTHING)  # fmt: skip
    up = 1.0  # the smoothing sum's scale: unused without smoothing
    if HAS_SMOOTHING:
        up, down = _fixed_point_scale(w_max * (m - mn), KW)

    # Meeting 2: the fixed-point sums, every chunk relative to the same m and scale.
    e = _exp(x, m, G.dtype.element_ty)
    s_c = tl.sum((e * SCALE).to(tl.int64), axis=0)
    if ALIGN > 1:
        ee = _exp(xe, m, G.dtype.element_ty)
        s_c += tl.sum((ee * SCALE).to(tl.int64), axis=0)
    q_c = tl.zeros([], tl.int64)
    f_c = tl.zeros([], tl.float32)
    if HAS_SMOOTHING:
        if ALIGN == 1:
            w_j = _ce_weights(W, cols, mask, HAS_WEIGHT)
        wd = tl.where(mask, w_j * (x - m), 0.0)
        q_c = tl.sum(_fixed_finite(wd, up), axis=0)
        f_c = tl.sum(_non_finite(wd), axis=0)
        if ALIGN > 1:
            wde = tl.where(e_mask, _ce_weights(W, e_cols, e_mask, HAS_WEIGHT) * (xe - m), 0.0)
            q_c += tl.sum(_fixed_finite(wde, up), axis=0)
            f_c += tl.sum(_non_finite(wde), axis=0)
    S_fix, Q_fix, F = _ce_meet_sums(ws, P, chunk, tag, s_c, q_c, f_c, x_row, W, m, up, V, SCALE, G.dtype.element_ty,
                                    P_BLOCK, FALLBACK_BLOCK, MAX_SPINS, HAS_WEIGHT, HAS_SMOOTHING)  # fmt: skip

    # The row's results: the row kernel's arithmetic.
    E_t = _fixed(_exp(x_t, m, G.dtype.element_ty), SCALE)
    q = 0.0
    if HAS_SMOOTHING:
        q = Q_fix.to(tl.float32) * down + F
    lse, loss, fin = _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, q, eps, inv_v, ignored, valid, HAS_SMOOTHING)
    if chunk == row % P:  # one chunk a row, a different one from row to row (see above)
        tl.store(LSE + row, lse)
        tl.store(LOSS + row, loss)
    if ALIGN == 1:
        w_j = _ce_weights(W, cols, mask, HAS_WEIGHT)
    g = _ce_gradient(e, S_fix, E_t, SCALE, fin, cols, t_safe, w_t, w_all, w_j, eps, inv_v, scale, ignored, valid,
                     G.dtype.element_ty, HAS_SMOOTHING)  # fmt: skip
    tl.store(_at(G, g_off, row, stride_g, xs, offs, cols, ALIGN), g.to(G.dtype.element_ty), mask=mask)
    if ALIGN > 1:
        w_e = _ce_weights(W, e_cols, e_mask, HAS_WEIGHT)
        ge = _ce_gradient(ee, S_fix, E_t, SCALE, fin, e_cols, t_safe, w_t, w_all, w_e, eps, inv_v, scale, ignored,
                          valid, G.dtype.element_ty, HAS_SMOOTHING)  # fmt: skip
        tl.store(_at(G, g_off, row, stride_g, xs, pos, 0, ALIGN), ge.to(G.dtype.element_ty), mask=e_mask)


@triton.jit
def cross_entropy_stream_kernel(
    X, T, W, G, LOSS, LSE, PREP, N, V, stride_x, stride_g, ignore_index, eps, inv_v, KW, SCALE,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
):  # fmt: skip
    # Long rows in a long batch, as the softmax backward's stream kernel walks them: a grid of a
    # few programs per SM, each taking a row at a time in BLOCK-wide tiles, three times (the max
    # and, with smoothing, the min; the fixed-point sums; the gradient), without the split's
    # meetings. The grid bounds the rows in flight so that the second and third reads can find
    # the row in L2; at (4096, 50257) on an H100 its 396 rows (40 MB in bf16) did not stay there:
    # DRAM moved about three reads and a write. One program an SM kept them there (one read),
    # and in bf16 ran no faster: latency, not DRAM, bounds it (reports/profiles.md). The terms
    # and sums are the row kernel's, so are the bits. The target's logit is read before the
    # row's first write (inplace=True).
    cols = tl.arange(0, BLOCK)
    OUT: tl.constexpr = G.dtype.element_ty
    w_max = 1.0  # the smoothing sum's bound on |w| (PREP[3])
    if HAS_SMOOTHING:
        w_max = tl.load(PREP + 3)
    row = tl.program_id(0).to(tl.int64)
    while row < N:
        ignored, valid, t_safe, w_t, w_all, scale = _ce_target(T, W, PREP, row, V, ignore_index, HAS_WEIGHT)
        x_row = X + row * stride_x
        x_t = tl.load(x_row + t_safe).to(tl.float32)
        # Pass 1: the row's max and, for the smoothing sum's scale, its min.
        m, mn = _ce_streamed_extremes(x_row, V, cols, HAS_SMOOTHING)
        up = 1.0
        down = 1.0
        if HAS_SMOOTHING:
            up, down = _fixed_point_scale(w_max * (m - mn), KW)
        # Pass 2: the exponentials' fixed-point sum and, with smoothing, q's.
        finite = False
        if HAS_SMOOTHING:
            finite = _ce_terms_finite(w_all, w_max, m, mn)
        S_fix, Q_fix, F = _ce_streamed_sums(x_row, W, V, m, up, SCALE, OUT, cols, HAS_WEIGHT, HAS_SMOOTHING, finite)
        q = 0.0
        if HAS_SMOOTHING:
            q = Q_fix.to(tl.float32) * down + F
        E_t = _fixed(_exp(x_t, m, OUT), SCALE)
        lse, loss, fin = _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, q, eps, inv_v, ignored, valid,
                                         HAS_SMOOTHING)  # fmt: skip
        tl.store(LSE + row, lse)
        tl.store(LOSS + row, loss)
        # Pass 3: the gradient, tile by tile (each tile read before it is written over):
        # the whole tiles unmasked (a loop of its own for the valid rows, without the selects for
        # the others), then the part tile.
        g_row = G + row * stride_g
        whole = tl.multiple_of(V - V % BLOCK, BLOCK)
        if valid:
            _ce_whole_tile_gradients(x_row, g_row, W, whole, cols, m, S_fix, E_t, SCALE, fin, t_safe, w_t, w_all,
                                     eps, inv_v, scale, ignored, valid, HAS_WEIGHT, HAS_SMOOTHING, True)  # fmt: skip
        else:
            _ce_whole_tile_gradients(x_row, g_row, W, whole, cols, m, S_fix, E_t, SCALE, fin, t_safe, w_t, w_all,
                                     eps, inv_v, scale, ignored, valid, HAS_WEIGHT, HAS_SMOOTHING, False)  # fmt: skip
        _ce_gradient_tile(x_row, g_row, W, whole + cols, V, m, S_fix, E_t, SCALE, fin, t_safe, w_t, w_all, eps,
                          inv_v, scale, ignored, valid, HAS_WEIGHT, HAS_SMOOTHING, False)  # fmt: skip
        row += tl.num_programs(0)


@triton.jit
def _ce_whole_tile_gradients(x_row, g_row, W, whole, cols, m, S_fix, E_t, SCALE, fin, t_safe, w_t, w_all, eps,
                             inv_v, scale, ignored, valid, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                             VALID_ROW: tl.constexpr):  # fmt: skip
    # The stream kernel's gradient over the whole tiles before `whole`, unmasked.
    BLOCK: tl.constexpr = cols.shape[0]
    start = 0
    while start < whole:
        _ce_gradient_tile(x_row, g_row, W, tl.multiple_of(start, BLOCK) + cols, None, m, S_fix, E_t, SCALE, fin,
                          t_safe, w_t, w_all, eps, inv_v, scale, ignored, valid, HAS_WEIGHT, HAS_SMOOTHING,
                          VALID_ROW)  # fmt: skip
        start += BLOCK


@triton.jit
def _ce_gradient_tile(x_row, g_row, W, idx, V, m, S_fix, E_t, SCALE, fin, t_safe, w_t, w_all, eps, inv_v, scale,
                      ignored, valid, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                      VALID_ROW: tl.constexpr):  # fmt: skip
    # The stream kernel's gradient at the offsets idx of one row (V None: every one is in it).
    OUT: tl.constexpr = g_row.dtype.element_ty
    if V is None:
        x = tl.load(x_row + idx, eviction_policy="evict_first").to(tl.float32)
        w_j = _ce_weights(W, idx, None, HAS_WEIGHT)
    else:
        x = tl.load(x_row + idx, mask=idx < V, other=-INF, eviction_policy="evict_first").to(tl.float32)
        w_j = _ce_weights(W, idx, idx < V, HAS_WEIGHT)
    g = _ce_gradient(_exp(x, m, OUT), S_fix, E_t, SCALE, fin, idx, t_safe, w_t, w_all, w_j, eps, inv_v, scale,
                     ignored, valid, OUT, HAS_SMOOTHING, VALID_ROW)  # fmt: skip
    if V is None:
        tl.store(g_row + idx, g.to(OUT))
    else:
        tl.store(g_row + idx, g.to(OUT), mask=idx < V)


@gluon.jit(do_not_specialize=["V", "stride_x", "stride_g", "x_off", "g_off"])
def cross_entropy_held_kernel(
    X, T, G, LOSS, LSE, PREP, V, stride_x, stride_g, x_off, g_off, ignore_index, SCALE,
    BLOCK: gl.constexpr, ALIGN: gl.constexpr, G_ALIGN: gl.constexpr, ASYNC: gl.constexpr,
):  # fmt: skip
    # A plain row (no class weights, no smoothing) held whole in shared memory, as the softmax's
    # held kernel holds it (kernels/triton_kernels.py: cp.async in on ALIGN-groups of a
    # 16-byte-aligned X, the partial groups at each end element-wise in registers, two or three
    # programs an SM where the row kernel's registers fit one), then the row kernel's
    # arithmetic: the max, the fixed-point sum, the loss and lse, and the gradient written in a
    # third pass. The target's logit is read from X before the row's wait, so with
    # inplace=True (G over X) every read of the row precedes its first write.
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = G.dtype.element_ty
    row = gl.program_id(0).to(gl.int64)
    ignored, valid, t_safe, w_t, w_all, scale = _ce_target(T, T, PREP, row, V, ignore_index, False)
    xs = x_off + row * stride_x  # row start, elements from X
    g_lo, g_hi, base, grp, cols = _held_groups(xs, V, TILE, ALIGN)
    bufs = _held_buffers(X.dtype.element_ty, BLOCK, TILE)
    _held_copy_in(X, bufs, base, grp, cols, g_lo, g_hi, BLOCK, ALIGN, ASYNC)
    x_t = gl.load(X + xs + t_safe).to(gl.float32)
    pos, e_mask, xe = _held_edges(X, xs, V, g_lo, g_hi, ALIGN, ASYNC)
    m, S_fix, ee = _held_max_sum(bufs, xe, base, grp, g_lo, g_hi, SCALE, OUT, BLOCK, ALIGN)
    E_t = _fixed(_exp(x_t, m, OUT), SCALE)
    lse, loss, fin = _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, 0.0, 0.0, 0.0, ignored, valid, False)
    gl.store(LSE + row, lse)
    gl.store(LOSS + row, loss)

    shift = gl.multiple_of(g_off + row * stride_g - xs, G_ALIGN)
    _ce_held_gradient(G, bufs, shift, xs, base, grp, cols, g_lo, g_hi, pos, e_mask, ee, t_safe, S_fix, E_t, SCALE,
                      fin, m, w_t, w_all, scale, ignored, valid, BLOCK, ALIGN)  # fmt: skip
    _ce_target_gradient(G, shift, xs, t_safe, x_t, m, S_fix, E_t, SCALE, fin, w_t, w_all, scale, ignored, valid)


@gluon.jit
def _ce_held_gradient(G, bufs, shift, xs, base, grp, cols, g_lo, g_hi, pos, e_mask, ee, t_safe, S_fix, E_t, SCALE,
                      fin, m, w_t, w_all, scale, ignored, valid, BLOCK: gl.constexpr, ALIGN: gl.constexpr):  # fmt: skip
    # The gradient of a held buffer (from the group-aligned offset `base`) and of the edges
    # (ee at pos), element of input offset o at G + o + shift (columns are offsets from xs). The
    # whole groups are written as if none held the target (_ce_plain_factors); the target's
    # entry is written again after the barrier that ends this (_ce_target_gradient), which
    # orders the two writes.
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = G.dtype.element_ty
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    t32 = t_safe.to(gl.int32)
    ge = _ce_gradient(ee, S_fix, E_t, SCALE, fin, (pos - xs).to(gl.int32), t32, w_t, w_all, 1.0, 0.0, 0.0, scale,
                      ignored, valid, OUT, False)  # fmt: skip
    gl.store(G + shift + pos, ge.to(OUT), mask=e_mask)
    neg_hi, inv = _ce_inverse(S_fix, SCALE, fin)
    k, c = _ce_plain_factors(scale, fin, ignored, valid)
    _barrier()
    for t in gl.static_range(BLOCK // TILE):
        mask = _group_mask(grp, base + t * TILE, g_lo, g_hi, ALIGN)
        x = _held_tile(bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
        g = gl.fma(_normalise(_exp(x, m, OUT), neg_hi, inv, OUT), k, c)
        gl.store(G + shift + base + t * TILE + cols, g.to(OUT), mask=mask)
    _barrier()


@gluon.jit
def _ce_target_gradient(G, shift, xs, t_safe, x_t, m, S_fix, E_t, SCALE, fin, w_t, w_all, scale, ignored, valid):
    # The target's entry of a plain row's gradient, after _ce_held_gradient wrote it over.
    OUT: gl.constexpr = G.dtype.element_ty
    g_t = _ce_target_entry(x_t, m, S_fix, E_t, SCALE, fin, t_safe.to(gl.int32), w_t, w_all, scale, ignored, valid,
                           OUT)  # fmt: skip
    gl.store(G + shift + xs + t_safe, g_t.to(OUT))


@gluon.jit
def _ce_held_min(bufs, xe, e_mask, base, grp, g_lo, g_hi, BLOCK: gl.constexpr, ALIGN: gl.constexpr):
    # The min of a held buffer's row elements (from the group-aligned offset `base`) and of the
    # edges xe: the smoothing sum's bound, as the split takes it.
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    mn_lane = gl.full([TILE], INF, gl.float32, lanes)
    for t in gl.static_range(BLOCK // TILE):
        mask = _group_mask(grp, base + t * TILE, g_lo, g_hi, ALIGN)
        x = _held_tile(bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
        mn_lane = gl.minimum(mn_lane, gl.where(mask, x, INF))
    return gl.minimum(gl.min(mn_lane, axis=0), gl.min(gl.where(e_mask, xe, INF), axis=0))


@gluon.jit
def _ce_held_q(bufs, xe, e_mask, pos, W, xs, base, grp, cols, g_lo, g_hi, m, up, BLOCK: gl.constexpr,
               ALIGN: gl.constexpr, HAS_WEIGHT: gl.constexpr):  # fmt: skip
    # The smoothing sum's parts over a held buffer and the edges, as the split's: the fixed-point
    # sum of the finite w (x - m) at scale `up` and the float sum of the non-finite ones, each
    # element's class weight read from W at its column (element offset - xs).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    q_lane = gl.zeros([TILE], gl.int64, lanes)
    f_lane = gl.zeros([TILE], gl.float32, lanes)
    # Columns and groups counted from the buffer's start in 32 bits (V < 2^31): at 64 KB chunks
    # of float32 under 128 registers, 0 bytes of spill where 64-bit offsets took 456 (Triton 3.6).
    lo = (g_lo - base // ALIGN).to(gl.int32)
    hi = (g_hi - base // ALIGN).to(gl.int32)
    c0 = (base - xs).to(gl.int32)
    for t in gl.static_range(BLOCK // TILE):
        g = grp + t * (TILE // ALIGN)
        mask = (g >= lo) & (g < hi)
        x = _held_tile(bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
        c = c0 + t * TILE + cols
        wd = gl.where(mask, _ce_weights(W, c, mask, HAS_WEIGHT) * (x - m), 0.0)
        q_lane += _fixed_finite(wd, up)
        f_lane += _non_finite(wd)
    wde = gl.where(e_mask, _ce_weights(W, pos - xs, e_mask, HAS_WEIGHT) * (xe - m), 0.0)
    q = gl.sum(q_lane, axis=0) + gl.sum(_fixed_finite(wde, up), axis=0)
    return q, gl.sum(f_lane, axis=0) + gl.sum(_non_finite(wde), axis=0)


@gluon.jit
def _ce_held_gradient_weighted(G, W, bufs, shift, xs, base, grp, cols, g_lo, g_hi, pos, e_mask, ee, t_safe, S_fix,
                               E_t, SCALE, fin, m, w_t, w_all, eps, inv_v, scale, ignored, valid, BLOCK: gl.constexpr,
                               ALIGN: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_SMOOTHING: gl.constexpr):  # fmt: skip
    # The gradient of a held buffer and of the edges with class weights or smoothing: the split's
    # _ce_gradient an element (the target's entry among them), each column's weight from W.
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = G.dtype.element_ty
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    c_e = pos - xs
    w_e = _ce_weights(W, c_e, e_mask, HAS_WEIGHT)
    ge = _ce_gradient(ee, S_fix, E_t, SCALE, fin, c_e, t_safe, w_t, w_all, w_e, eps, inv_v, scale, ignored, valid,
                      OUT, HAS_SMOOTHING)  # fmt: skip
    gl.store(G + shift + pos, ge.to(OUT), mask=e_mask)
    for t in gl.static_range(BLOCK // TILE):
        mask = _group_mask(grp, base + t * TILE, g_lo, g_hi, ALIGN)
        x = _held_tile(bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
        c = base + t * TILE + cols - xs
        w_j = _ce_weights(W, c, mask, HAS_WEIGHT)
        g = _ce_gradient(_exp(x, m, OUT), S_fix, E_t, SCALE, fin, c, t_safe, w_t, w_all, w_j, eps, inv_v, scale,
                         ignored, valid, OUT, HAS_SMOOTHING)  # fmt: skip
        gl.store(G + shift + base + t * TILE + cols, g.to(OUT), mask=mask)


@gluon.jit(do_not_specialize=["V", "P", "stride_x", "stride_g", "x_off", "g_off"])
def cross_entropy_held_split_kernel(
    X, T, W, G, LOSS, LSE, PREP, WS, V, P, stride_x, stride_g, x_off, g_off, ignore_index, eps, inv_v, KW, SCALE,
    CHUNK: gl.constexpr, P_BLOCK: gl.constexpr, FALLBACK_BLOCK: gl.constexpr, MAX_SPINS: gl.constexpr,
    HAS_WEIGHT: gl.constexpr, HAS_SMOOTHING: gl.constexpr, ALIGN: gl.constexpr, G_ALIGN: gl.constexpr,
    ASYNC: gl.constexpr,
):  # fmt: skip
    # A row too long to hold whole, cut as the softmax's held split cuts it
    # (kernels/triton_kernels.py): P programs, each holding its chunk in shared memory, meeting
    # through the split kernel's seven words a chunk (every word written by every launch, the
    # smoothing's with zeros without smoothing, so the tags stay in step with the split's), then
    # the split's arithmetic: lse and loss by one chunk, and the chunk's gradient. A plain row
    # (no class weights, no smoothing) takes the held kernel's gradient, one fma an element, the
    # target's entry written again, after a barrier, by the program that wrote it over; with
    # weights or smoothing, each element's weight is read from W (L2) where the smoothing sum
    # and the gradient need it, and the row's min meets beside its max. The target's logit is
    # read before the first meeting (inplace=True: no sibling writes before every program has
    # arrived).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = G.dtype.element_ty
    PLAIN: gl.constexpr = not (HAS_WEIGHT or HAS_SMOOTHING)
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    pid = gl.program_id(0).to(gl.int64)
    row = pid // P
    chunk = pid - row * P
    ignored, valid, t_safe, w_t, w_all, scale = _ce_target(T, W, PREP, row, V, ignore_index, HAS_WEIGHT)
    w_max = 1.0  # the smoothing sum's bound on |w| (PREP[3]), read before the meetings
    if HAS_SMOOTHING:
        w_max = gl.load(PREP + 3)
    xs = x_off + row * stride_x  # row start, elements from X
    g_lo, g_hi, base, grp, cols = _held_groups(xs, V, TILE, ALIGN)
    c_base = base + chunk * CHUNK  # the chunk's first element, from X (group-aligned)
    bufs = _held_buffers(X.dtype.element_ty, CHUNK, TILE)
    _held_copy_in(X, bufs, c_base, grp, cols, g_lo, g_hi, CHUNK, ALIGN, ASYNC)
    x_row = X + xs
    x_t = gl.load(x_row + t_safe).to(gl.float32)
    ws = WS + row * (7 * P)
    slots = gl.arange(0, P_BLOCK, layout=flat)
    tag = _launch_tag_on(ws + chunk, slots)  # while the copy is in flight
    tag_hi = tag << 32
    pos, e_mask, xe = _held_edges(X, xs, V, g_lo, g_hi, ALIGN, ASYNC, chunk == 0)
    fcols = gl.arange(0, FALLBACK_BLOCK, layout=flat)

    # The softmax held split's two meetings on the max's and the sum's words, and with
    # smoothing the split's three more: the min (after the max), q and the non-finite sum
    # (published before the sum's meeting); without, those words written with zeros.
    zero = gl.cast(0.0, gl.float32)
    if not HAS_SMOOTHING:
        q_hi, q_lo = _tagged_halves(tag_hi, zero.to(gl.int64))
        gl.atomic_xchg(ws + P + chunk, _tagged(tag_hi, zero), sem="relaxed")
        gl.atomic_xchg(ws + 4 * P + 2 * chunk, q_hi, sem="relaxed")
        gl.atomic_xchg(ws + 4 * P + 2 * chunk + 1, q_lo, sem="relaxed")
        gl.atomic_xchg(ws + 6 * P + chunk, _tagged(tag_hi, zero), sem="relaxed")
    m = _held_split_max(bufs, xe, c_base, grp, g_lo, g_hi, ws, P, chunk, tag, slots, x_row, V, fcols, MAX_SPINS,
                        CHUNK, ALIGN)  # fmt: skip
    q = 0.0
    if HAS_SMOOTHING:
        _barrier()
        my_mn = _tagged(tag_hi, -_ce_held_min(bufs, xe, e_mask, c_base, grp, g_lo, g_hi, CHUNK, ALIGN))
        gl.atomic_xchg(ws + P + chunk, my_mn, sem="relaxed")
        neg_mn, stale = _meet_floats_on(ws + P, P, chunk, my_mn, tag, False, slots, MAX_SPINS)
        mn = -neg_mn
        if stale > 0:
            _, mn = _ce_streamed_extremes(x_row, V, fcols, True)
        up, down = _fixed_point_scale(w_max * (m - mn), KW)
        q_c, f_c = _ce_held_q(bufs, xe, e_mask, pos, W, xs, c_base, grp, cols, g_lo, g_hi, m, up, CHUNK, ALIGN,
                              HAS_WEIGHT)  # fmt: skip
        q_hi, q_lo = _tagged_halves(tag_hi, q_c)
        my_f = _tagged(tag_hi, f_c)
        gl.atomic_xchg(ws + 4 * P + 2 * chunk, q_hi, sem="relaxed")
        gl.atomic_xchg(ws + 4 * P + 2 * chunk + 1, q_lo, sem="relaxed")
        gl.atomic_xchg(ws + 6 * P + chunk, my_f, sem="relaxed")
    S_fix, ee = _held_split_sum(bufs, xe, m, SCALE, OUT, ws + 2 * P, P, chunk, tag, slots, x_row, V, fcols,
                                MAX_SPINS, CHUNK, ALIGN)  # fmt: skip
    if HAS_SMOOTHING:
        Q_fix, stale = _meet_sum_on(ws + 4 * P, P, chunk, q_hi, q_lo, tag, slots, MAX_SPINS)
        F = zero
        if stale == 0:
            F, stale = _meet_floats_on(ws + 6 * P, P, chunk, my_f, tag, True, slots, MAX_SPINS)
        if stale > 0:
            _, Q_fix, F = _ce_streamed_sums(x_row, W, V, m, up, SCALE, OUT, fcols, HAS_WEIGHT, True)
        q = Q_fix.to(gl.float32) * down + F

    # The row's results: the split's arithmetic.
    E_t = _fixed(_exp(x_t, m, OUT), SCALE)
    lse, loss, fin = _ce_row_outputs(m, S_fix, SCALE, x_t, w_t, w_all, q, eps, inv_v, ignored, valid, HAS_SMOOTHING)
    if chunk == row % P:  # one chunk a row, a different one from row to row (as the split's)
        gl.store(LSE + row, lse)
        gl.store(LOSS + row, loss)
    shift = gl.multiple_of(g_off + row * stride_g - xs, G_ALIGN)
    if PLAIN:
        _ce_held_gradient(G, bufs, shift, xs, c_base, grp, cols, g_lo, g_hi, pos, e_mask, ee, t_safe, S_fix, E_t,
                          SCALE, fin, m, w_t, w_all, scale, ignored, valid, CHUNK, ALIGN)  # fmt: skip
        # The target's entry, by the program whose chunk holds its group (chunk 0 for the edges).
        t_grp = (xs + t_safe) // ALIGN
        if chunk == gl.where((t_grp >= g_lo) & (t_grp < g_hi), (t_grp * ALIGN - base) // CHUNK, 0):
            _ce_target_gradient(G, shift, xs, t_safe, x_t, m, S_fix, E_t, SCALE, fin, w_t, w_all, scale, ignored,
                                valid)  # fmt: skip
    else:
        _barrier()  # the sum's pass ended; this one reads the buffer afresh
        _ce_held_gradient_weighted(G, W, bufs, shift, xs, c_base, grp, cols, g_lo, g_hi, pos, e_mask, ee, t_safe,
                                   S_fix, E_t, SCALE, fin, m, w_t, w_all, eps, inv_v, scale, ignored, valid, CHUNK,
                                   ALIGN, HAS_WEIGHT, HAS_SMOOTHING)  # fmt: skip


@triton.jit
def cross_entropy_prep_kernel(
    T, W, PREP, BAD, N, V, ignore_index, KN, KV, BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, MEAN: tl.constexpr
):
    # One program, before the row kernel: the mean's denominator (the rows' w_t summed, or their
    # count), the sum of all class weights, and the targets that are neither in [0, V) nor
    # ignore_index (count, least and largest), each in any order with the same bits.
    #   PREP[0] = sum of class weights   PREP[1] = sum of the rows' w_t   PREP[2] = gradient scale
    #   PREP[3] = largest finite |class weight| (1 without weights: the smoothing sum's bound)
    #   BAD[0] = bad targets, BAD[1] = least, BAD[2] = largest of them
    cols = tl.arange(0, BLOCK)
    bad_l = tl.zeros([BLOCK], tl.int64)
    lo_l = tl.full([BLOCK], 2**62, tl.int64)
    hi_l = tl.full([BLOCK], -(2**62), tl.int64)
    cnt_l = tl.zeros([BLOCK], tl.int64)
    wmax_l = tl.zeros([BLOCK], tl.float32)
    winf_l = tl.zeros([BLOCK], tl.float32)
    start = 0
    while start < N:
        idx = start + cols
        t = tl.load(T + idx, mask=idx < N, other=ignore_index).to(tl.int64)
        bad = (t != ignore_index) & ((t < 0) | (t >= V))
        bad_l += bad.to(tl.int64)
        lo_l = tl.minimum(lo_l, tl.where(bad, t, 2**62))
        hi_l = tl.maximum(hi_l, tl.where(bad, t, -(2**62)))
        ok = (t != ignore_index) & (t >= 0) & (t < V)
        cnt_l += ok.to(tl.int64)
        if HAS_WEIGHT:
            w = tl.where(ok, tl.load(W + tl.where(ok, t, 0), mask=ok, other=0.0).to(tl.float32), 0.0)
            wmax_l = tl.maximum(wmax_l, _finite_abs(w))
            winf_l += _non_finite(w)
        start += BLOCK
    tl.store(BAD + 0, tl.sum(bad_l, axis=0))
    tl.store(BAD + 1, tl.min(lo_l, axis=0))
    tl.store(BAD + 2, tl.max(hi_l, axis=0))
    if HAS_WEIGHT:
        # The rows' target weights, order-free.
        up, down = _fixed_point_scale(tl.max(wmax_l, axis=0), KN)
        fix_l = tl.zeros([BLOCK], tl.int64)
        start = 0
        while start < N:
            idx = start + cols
            t = tl.load(T + idx, mask=idx < N, other=ignore_index).to(tl.int64)
            ok = (t != ignore_index) & (t >= 0) & (t < V)
            w = tl.where(ok, tl.load(W + tl.where(ok, t, 0), mask=ok, other=0.0).to(tl.float32), 0.0)
            fix_l += _fixed_finite(w, up)
            start += BLOCK
        w_rows = tl.sum(fix_l, axis=0).to(tl.float32) * down + tl.sum(winf_l, axis=0)
        # The sum of all class weights (label smoothing's W_all), order-free.
        amax_l = tl.zeros([BLOCK], tl.float32)
        inf_l = tl.zeros([BLOCK], tl.float32)
        start = 0
        while start < V:
            idx = start + cols
            w = tl.load(W + idx, mask=idx < V, other=0.0).to(tl.float32)
            amax_l = tl.maximum(amax_l, _finite_abs(w))
            inf_l += _non_finite(w)
            start += BLOCK
        amax = tl.max(amax_l, axis=0)
        up, down = _fixed_point_scale(amax, KV)
        all_l = tl.zeros([BLOCK], tl.int64)
        start = 0
        while start < V:
            idx = start + cols
            w = tl.load(W + idx, mask=idx < V, other=0.0).to(tl.float32)
            all_l += _fixed_finite(w, up)
            start += BLOCK
        w_all = tl.sum(all_l, axis=0).to(tl.float32) * down + tl.sum(inf_l, axis=0)
        w_max = amax
    else:
        w_rows = tl.sum(cnt_l, axis=0).to(tl.float32)
        w_all = V * 1.0
        w_max = w_rows * 0.0 + 1.0
    tl.store(PREP + 3, w_max)
    tl.store(PREP + 0, w_all)
    tl.store(PREP + 1, w_rows)
    if MEAN:
        tl.store(PREP + 2, 1.0 / w_rows)
    else:  # 1 whatever the weights (w_rows * 0 + 1 would be NaN where a target's weight is inf)
        tl.store(PREP + 2, tl.full((), 1.0, tl.float32))


@triton.jit
def cross_entropy_reduce_kernel(LOSS, PREP, OUT, N, KN, BLOCK: tl.constexpr, MEAN: tl.constexpr):
    # One program, after the row kernel: the rows' losses summed in fixed point (any order, same
    # bits), divided by the denominator for reduction="mean" (0 / 0 = NaN when every row is
    # ignored, as PyTorch gives).
    cols = tl.arange(0, BLOCK)
    amax_l = tl.zeros([BLOCK], tl.float32)
    inf_l = tl.zeros([BLOCK], tl.float32)
    start = 0
    while start < N:
        idx = start + cols
        v = tl.load(LOSS + idx, mask=idx < N, other=0.0)
        amax_l = tl.maximum(amax_l, _finite_abs(v))
        inf_l += _non_finite(v)
        start += BLOCK
    up, down = _fixed_point_scale(tl.max(amax_l, axis=0), KN)
    fix_l = tl.zeros([BLOCK], tl.int64)
    start = 0
    while start < N:
        idx = start + cols
        v = tl.load(LOSS + idx, mask=idx < N, other=0.0)
        fix_l += _fixed_finite(v, up)
        start += BLOCK
    total = tl.sum(fix_l, axis=0).to(tl.float32) * down + tl.sum(inf_l, axis=0)
    if MEAN:
        total = total / tl.load(PREP + 1)
    tl.store(OUT, total.to(OUT.dtype.element_ty))


@triton.jit
def cross_entropy_scale_kernel(
    G, OUT, GO, B, V, stride_g, stride_out, stride_go, BLOCK: tl.constexpr, IN_PLACE: tl.constexpr
):
    # The backward of cross-entropy: the gradient saved by the forward times grad_output (a
    # scalar, stride_go = 0, or one value per row). In place (OUT = G), each program reads its
    # row's grad_output first and touches the row only where it is not 1 (loss.backward()), so
    # that case moves no gradient bytes at all; out of place, every row is written.
    row = tl.program_id(0).to(tl.int64)
    go = tl.load(GO + row * stride_go).to(tl.float32)
    if (go != 1.0) | (not IN_PLACE):
        g_row = G + row * stride_g
        o_row = OUT + row * stride_out
        cols = tl.arange(0, BLOCK)
        start = 0
        while start < V:
            idx = start + cols
            mask = idx < V
            g = tl.load(g_row + idx, mask=mask, other=0.0).to(tl.float32)
            tl.store(o_row + idx, (g * go).to(OUT.dtype.element_ty), mask=mask)
            start += BLOCK


JIT_KERNELS = {
    "softmax_backward_row": softmax_backward_row_kernel,
    "softmax_backward_reread": softmax_backward_reread_kernel,
    "softmax_backward_split": softmax_backward_split_kernel,
    "softmax_backward_stream": softmax_backward_stream_kernel,
    "cross_entropy_row": cross_entropy_row_kernel,
    "cross_entropy_split": cross_entropy_split_kernel,
    "cross_entropy_stream": cross_entropy_stream_kernel,
    "cross_entropy_held": cross_entropy_held_kernel,
    "cross_entropy_held_split": cross_entropy_held_split_kernel,
    "softmax_backward_held_split": softmax_backward_held_split_kernel,
    "cross_entropy_prep": cross_entropy_prep_kernel,
    "cross_entropy_reduce": cross_entropy_reduce_kernel,
    "cross_entropy_scale": cross_entropy_scale_kernel,
}
