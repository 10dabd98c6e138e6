"""The Triton softmax kernels (what `@triton.jit` compiles); dispatch lives in
`kernels.triton_dispatch`, launches in `kernels.triton_launch` (whose path table names every
kernel's arguments, checked against the signatures here), the public entry in
`kernels.softmax_triton`.

Every kernel computes, for a row x of V elements,

    m = max(x)                      exact, whatever the order of comparisons
    e = exp(x - m)                  elementwise (_exp)
    S = sum(int64(e * SCALE))       exact: integer addition does not depend on the order
    y = e / (S / SCALE)             (_row_scale, _normalise)

For float32 outputs, _exp and _normalise carry the rounding errors of x - m, of the argument of
exp2 and of the quotient along, so an output is within a few ulps of the exact softmax however
far below the max it lies (the analysis is beside the tolerance table in tests/helpers.py); for
16-bit outputs the one rounding to storage swamps those errors and the fast forms stay.
kernels/cuda/softmax_common.cuh computes the same way.

SCALE = 2^(62 - ceil(log2 V)) (from the wrapper), so S <= V * SCALE <= 2^62 never overflows,
and truncating each term costs less than V / SCALE relative to S >= SCALE (the maximum's term
is exactly SCALE): 4e-9 at V = 128256. Because neither the max nor the fixed-point sum depends
on how a row is cut into tiles, programs or chunks, a row's output bits depend only on its
values and V: not on B, on the row's position or alignment, on the row stride, or on which path
the dispatch takes. An all -inf row gives m = -inf, e = NaN and a NaN output, as F.softmax does.
The max propagates NaN (_row_max: max.NaN on sm_80+, one instruction as tl.max's), and a row
whose max is not a finite number or -inf (a NaN, or a +inf whose inf - inf is NaN) is NaN
throughout (_softmax_scale), as F.softmax gives it.

ALIGN (from the wrapper) divides V and both row strides; saying so lets Triton use ALIGN-wide
vector accesses. It changes how elements are loaded, never how they are combined. Integer
arguments are not specialised on their values, so one compiled kernel serves every V and
stride and the wrapper can launch it directly (kernels.launch).
"""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

_INTS = ["V", "B", "P", "stride_x", "stride_y", "x_off", "y_off"]


def _no_value_specialisation(fn):
    names = [n for n in _INTS if n in fn.__code__.co_varnames[: fn.__code__.co_argcount]]
    return triton.jit(do_not_specialize=names)(fn)


@triton.jit
def _exp(x, m, OUT: tl.constexpr):
    # exp(x - m) for an output of dtype OUT. float32: the fast form, 2^(s * L) with s = x - m
    # and L = log2(e) rounded, makes three errors, each computed exactly and put back to first
    # order through 2^t * (1 + c): the rounding of s (2Sum), of t = s * L (an fma) and L's own.
    # An infinite s makes c NaN and 2^t 0: c is taken to 1 and the result to 0. A NaN s (an all
    # -inf row) gives NaN through 2^t. 16-bit outputs: 2^(s * L), one flush-to-zero ex2 (tl.exp
    # adds three instructions an element to keep results below 2^-126, which the fixed-point sum
    # truncates anyway and the 16-bit outputs may flush, as the fused kernel's do).
    s = x - m
    if OUT == tl.float32:
        xs = s + m
        ms = s - xs
        err = (x - xs) - (m + ms)
        t = s * 1.4426950408889634
        t_err = tl.fma(s, -1.4426950408889634, t)  # t - s * L, exactly
        c = tl.fma(s, 1.3349758171622139e-8, err)  # (log2(e) - L) * ln(2)
        c = tl.fma(t_err, -0.6931471805599453, c)
        c = tl.where(c < 1.0, c, 1.0)
        p = tl.exp2(t)
        e = tl.fma(p, c, p)
    else:
        e = tl.exp2(s * 1.4426950408889634)
    return e


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_max(x, axis):
    # The max along `axis`, NaN if any element is NaN (tl.max would skip it).
    return tl.reduce(x, axis, _nan_max)


@triton.jit
def _row_scale(S, SCALE):
    # A row's normaliser from its fixed-point sum S: -hi with hi = S / SCALE rounded to float
    # (SCALE is a power of two: its reciprocal, built from the exponent bits, scales exactly),
    # and 1 / hi rounded once.
    hi = S.to(tl.float32)
    unit = ((254 << 23) - tl.cast(SCALE, tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return hi * -unit, tl.div_rn(SCALE, hi)


@triton.jit
def _softmax_scale(S, SCALE, m):
    # _row_scale, with 1 / hi NaN where the row's max m is NaN or +inf, so that every output
    # of such a row is NaN (its sum holds an inf - inf, which S, an integer, cannot carry).
    neg_hi, inv = _row_scale(S, SCALE)
    return neg_hi, tl.where(m < float("inf"), inv, float("nan"))


@triton.jit
def _normalise(e, neg_hi, inv, OUT: tl.constexpr):
    # e / hi for an output of dtype OUT: float32 rounds the quotient once (one correction step
    # after the product with inv); 16-bit storage takes the product.
    q = e * inv
    if OUT == tl.float32:
        q = tl.fma(tl.fma(q, neg_hi, e), inv, q)
    return q


@triton.jit
def _fixed(e, SCALE):
    # Truncation toward zero; NaN (an all -inf row) converts to some integer, and the output is
    # NaN anyway because e is.
    return (e * SCALE).to(tl.int64)


@triton.jit
def _group_mask(grp, c_start, g_lo, g_hi, ALIGN: tl.constexpr):
    # Which lanes of a tile starting at the group-aligned offset c_start hold whole groups of
    # the row (groups g_lo .. g_hi - 1); constant over each ALIGN-group, so accesses stay vectors.
    c_g = c_start // ALIGN
    return (grp >= (g_lo - c_g).to(tl.int32)) & (grp < (g_hi - c_g).to(tl.int32))


@_no_value_specialisation
def softmax_tile_kernel(X, Y, V, stride_x, stride_y, SCALE, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + tl.multiple_of(row * stride_x, ALIGN)
    y_row = Y + tl.multiple_of(row * stride_y, ALIGN)
    cols = tl.arange(0, BLOCK)
    V_A = V // ALIGN
    if V <= BLOCK:
        # The row fits one tile: one read, one write.
        mask = (cols // ALIGN) < V_A  # == cols < V, constant over ALIGN-groups
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = _row_max(x, 0)
        e = _exp(x, m, Y.dtype.element_ty)
        neg_hi, inv = _softmax_scale(tl.sum(_fixed(e, SCALE), axis=0), SCALE, m)
        tl.store(y_row + cols, _normalise(e, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=mask)
    else:
        # Three passes over tiles (max, fixed-point sum, write); the re-reads of a row of at
        # most a few KB are served by L2. Per-lane partials: no cross-warp reduction in a loop.
        # while, not range(0, V, BLOCK): Triton 3.6's interpreter cannot take a run-time
        # range bound under NumPy 2 (int() of a 1-element array).
        m_lane = tl.full([BLOCK], -float("inf"), tl.float32)
        start = 0
        while start < V:
            idx = tl.multiple_of(start, BLOCK) + cols
            x = tl.load(x_row + idx, mask=(idx // ALIGN) < V_A, other=-float("inf")).to(tl.float32)
            m_lane = _nan_max(m_lane, x)
            start += BLOCK
        m = _row_max(m_lane, 0)
        s_lane = tl.zeros([BLOCK], tl.int64)
        start = 0
        while start < V:
            idx = tl.multiple_of(start, BLOCK) + cols
            x = tl.load(x_row + idx, mask=(idx // ALIGN) < V_A, other=-float("inf")).to(tl.float32)
            s_lane += _fixed(_exp(x, m, Y.dtype.element_ty), SCALE)
            start += BLOCK
        neg_hi, inv = _softmax_scale(tl.sum(s_lane, axis=0), SCALE, m)
        start = 0
        while start < V:
            idx = tl.multiple_of(start, BLOCK) + cols
            mask = (idx // ALIGN) < V_A
            x = tl.load(x_row + idx, mask=mask, other=-float("inf")).to(tl.float32)
            y = _normalise(_exp(x, m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty)
            tl.store(y_row + idx, y.to(Y.dtype.element_ty), mask=mask)
            start += BLOCK


@_no_value_specialisation
def softmax_row_kernel(X, Y, V, stride_x, stride_y, SCALE, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    # One program holds the whole row in registers (BLOCK = next_pow2(V)).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (cols // ALIGN) < V // ALIGN  # == cols < V, constant over ALIGN-groups
    x = tl.load(X + tl.multiple_of(row * stride_x, ALIGN) + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = _row_max(x, 0)
    e = _exp(x, m, Y.dtype.element_ty)
    neg_hi, inv = _softmax_scale(tl.sum(_fixed(e, SCALE), axis=0), SCALE, m)
    y = _normalise(e, neg_hi, inv, Y.dtype.element_ty)
    tl.store(Y + tl.multiple_of(row * stride_y, ALIGN) + cols, y.to(Y.dtype.element_ty), mask=mask)


@_no_value_specialisation
def softmax_rows_kernel(
    X,
    Y,
    B,
    V,
    stride_x,
    stride_y,
    SCALE,
    ROWS: tl.constexpr,
    HEAD: tl.constexpr,
    TAIL: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    # Many short rows: a [ROWS, HEAD] block per program, so each moves enough bytes. With TAIL > 0
    # a row is cut into a head of HEAD <= V lanes (a power of two, no column mask) and a tail of
    # TAIL lanes past it, so that few lanes are masked (V = 600: 512 + 128, not 1024); the two
    # parts' max and fixed-point sum combine exactly, so a row keeps its bits either way.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = (rows < B)[:, None]
    x_off = tl.multiple_of(rows * stride_x, ALIGN)[:, None]
    y_off = tl.multiple_of(rows * stride_y, ALIGN)[:, None]
    head = tl.arange(0, HEAD)[None, :]
    if TAIL > 0:
        head_mask = live  # [ROWS, 1]: the head holds no column past V
    else:
        head_mask = live & ((head // ALIGN) < V // ALIGN)
    # Rows past B load -inf throughout and turn to NaN, but are never stored.
    x = tl.load(X + x_off + head, mask=head_mask, other=-float("inf")).to(tl.float32)
    m = _row_max(x, 1)
    if TAIL > 0:
        tail = HEAD + tl.arange(0, TAIL)[None, :]
        tail_mask = live & ((tail // ALIGN) < V // ALIGN)
        xt = tl.load(X + x_off + tail, mask=tail_mask, other=-float("inf")).to(tl.float32)
        m = _nan_max(m, _row_max(xt, 1))
    e = _exp(x, m[:, None], Y.dtype.element_ty)
    S = tl.sum(_fixed(e, SCALE), axis=1)
    if TAIL > 0:
        et = _exp(xt, m[:, None], Y.dtype.element_ty)
        S += tl.sum(_fixed(et, SCALE), axis=1)
    neg_hi, inv = _softmax_scale(S, SCALE, m)
    y = _normalise(e, neg_hi[:, None], inv[:, None], Y.dtype.element_ty)
    tl.store(Y + y_off + head, y.to(Y.dtype.element_ty), mask=head_mask)
    if TAIL > 0:
        yt = _normalise(et, neg_hi[:, None], inv[:, None], Y.dtype.element_ty)
        tl.store(Y + y_off + tail, yt.to(Y.dtype.element_ty), mask=tail_mask)


# The split kernel's meetings. A program publishes a word per partial (its chunk's max, or the
# two 32-bit halves of its fixed-point sum) with the launch's tag in the word's upper 32 bits, so
# a reader that sees the tag sees the value: no counter, no fence, no reset. Every word of a row
# carries the tag of the last launch that wrote it (its workspace is used with one P only, so
# the same programs write the same words each launch): a program reads the tag its own word
# holds and adds one.
#
# Every decision a program takes on what it read (the tag, whether all words carry it) must be
# the same in all its threads, or its warps part ways around the barriers of the reductions
# that follow. So the words are read into SLOTS-wide vectors, SLOTS >= 32 * num_warps (the
# wrapper's P_BLOCK): no lane is held by two warps, each reduction over them combines the warps
# through shared memory, and every thread gets the one result.
_LOW = tl.constexpr(0xFFFFFFFF)
_TAG_MASK = tl.constexpr(0x7FFFFFFF)  # tags wrap in 31 bits: a word stays a non-negative int64


@triton.jit
def _launch_tag(own, SLOTS: tl.constexpr):
    """This launch's tag: one past the tag of the program's own word (read in one lane and
    reduced over the program, so all threads hold it before any of them publishes)."""
    return _launch_tag_on(own, tl.arange(0, SLOTS))


@triton.jit
def _launch_tag_on(own, lanes):
    # _launch_tag over a program's `lanes` (0 .. SLOTS - 1): a Gluon kernel makes them in its layout.
    old = tl.max(tl.load(own + lanes, mask=lanes == 0, other=0, volatile=True), axis=0)
    return ((old >> 32) + 1) & _TAG_MASK


@triton.jit
def _gather(ptrs, ok, own, own_word, tag, MAX_SPINS: tl.constexpr):
    """The words at `ptrs` (where `ok`) once every one carries `tag`, or after MAX_SPINS polls.

    The own words (`own`) are taken from `own_word`, not read back. Returns (words, how many
    did not carry the tag: a reduction over the program, the same in every thread). volatile:
    read from L2, not from an L1 line another program on this SM left behind.
    """
    others = ok & ~own
    w = tl.where(own, own_word, tl.load(ptrs, mask=others, other=0, volatile=True))
    stale = tl.sum(tl.where(ok & ((w >> 32) != tag), 1, 0), axis=0)
    spins = 0
    while (stale > 0) & (spins < MAX_SPINS):
        w = tl.where(own, own_word, tl.load(ptrs, mask=others, other=0, volatile=True))
        stale = tl.sum(tl.where(ok & ((w >> 32) != tag), 1, 0), axis=0)
        spins += 1
    return w, stale


@triton.jit
def _tagged(tag_hi, v):
    """A float32 published under the launch's tag (tag_hi = tag << 32): its bits in the word's
    lower 32 bits."""
    return tag_hi | (v.to(tl.int32, bitcast=True).to(tl.int64) & _LOW)


@triton.jit
def _tagged_halves(tag_hi, s):
    """An int64 published under the launch's tag as two words, its upper and lower 32 bits
    (_meet_sum adds them back)."""
    return tag_hi | ((s >> 32) & _LOW), tag_hi | (s & _LOW)


@triton.jit
def _meet_floats(words, P, chunk, own_word, tag, SUM: tl.constexpr, SLOTS: tl.constexpr, MAX_SPINS: tl.constexpr):
    """The P chunk floats of a row (words[c]: chunk c's, _tagged) combined, SLOTS words at a
    time: their max (a NaN wins), or with SUM their sum (order-free only for terms drawn from
    {0, +inf, -inf, NaN}, the non-finite parts of the training kernels' sums); and how many
    words were still untagged when the polls ran out (0: all met)."""
    return _meet_floats_on(words, P, chunk, own_word, tag, SUM, tl.arange(0, SLOTS), MAX_SPINS)


@triton.jit
def _meet_floats_on(words, P, chunk, own_word, tag, SUM: tl.constexpr, lanes, MAX_SPINS: tl.constexpr):
    # _meet_floats over a program's `lanes` (0 .. SLOTS - 1), as _launch_tag_on.
    if SUM:
        acc = tl.cast(0.0, tl.float32)  # (a scalar without a layout, which Gluon callers need)
    else:
        acc = tl.cast(-float("inf"), tl.float32)
    stale = 0
    base = 0
    while base < P:
        c = base + lanes
        w, n = _gather(words + c, c < P, c == chunk, own_word, tag, MAX_SPINS)
        v = (w & _LOW).to(tl.int32).to(tl.float32, bitcast=True)
        if SUM:
            acc += tl.sum(tl.where(c < P, v, 0.0), axis=0)
        else:
            acc = _nan_max(acc, _row_max(tl.where(c < P, v, -float("inf")), 0))
        stale += n
        base += lanes.shape[0]
    return acc, stale


@triton.jit
def _meet_sum(words, P, chunk, own_hi, own_lo, tag, SLOTS: tl.constexpr, MAX_SPINS: tl.constexpr):
    """The sum of the P chunk sums of a row (words[2c], words[2c + 1]: the upper and lower 32
    bits of chunk c's), SLOTS words at a time, and the untagged count as in _meet_floats."""
    return _meet_sum_on(words, P, chunk, own_hi, own_lo, tag, tl.arange(0, SLOTS), MAX_SPINS)


@triton.jit
def _meet_sum_on(words, P, chunk, own_hi, own_lo, tag, lanes, MAX_SPINS: tl.constexpr):
    # _meet_sum over a program's `lanes` (0 .. SLOTS - 1), as _launch_tag_on.
    s = tl.cast(0, tl.int64)
    stale = 0
    base = 0
    while base < 2 * P:
        j = base + lanes
        upper = (j % 2) == 0
        w, n = _gather(words + j, j < 2 * P, (j // 2) == chunk, tl.where(upper, own_hi, own_lo), tag, MAX_SPINS)
        s += tl.sum(tl.where(j < 2 * P, tl.where(upper, (w & _LOW) << 32, w & _LOW), 0), axis=0)
        stale += n
        base += lanes.shape[0]
    return s, stale


@triton.jit
def _streamed_max(x_row, V, fcols):
    # A split program's fallback where its siblings did not meet in time: the row's max, read
    # whole from X (x_row: its first element) over the lanes fcols (0 .. FALLBACK_BLOCK - 1).
    m_run = (fcols * 0).to(tl.float32) - float("inf")  # -inf in the lanes' layout
    start = 0
    while start < V:
        idx = start + fcols
        m_run = _nan_max(m_run, tl.load(x_row + idx, mask=idx < V, other=-float("inf")).to(tl.float32))
        start += fcols.shape[0]
    return _row_max(m_run, 0)


@triton.jit
def _streamed_sum(x_row, V, fcols, m, SCALE, OUT: tl.constexpr):
    # The fallback's fixed-point sum of the row's exp(x - m), as _streamed_max reads it.
    s_run = (fcols * 0).to(tl.int64)
    start = 0
    while start < V:
        idx = start + fcols
        t = tl.load(x_row + idx, mask=idx < V, other=-float("inf")).to(tl.float32)
        s_run += _fixed(_exp(t, m, OUT), SCALE)
        start += fcols.shape[0]
    return tl.sum(s_run, axis=0)


@triton.jit
def _split_edges(xs, chunk, V, ALIGN: tl.constexpr):
    # A row's edges: the first ALIGN offsets of the row and the partial group at its end, each
    # element once (the tail part skips what the head part covers); only chunk 0 holds them.
    # (positions, mask)
    g_lo = (xs + ALIGN - 1) // ALIGN  # first group wholly inside the row
    g_hi = (xs + V) // ALIGN  # one past the last such group
    e = tl.arange(0, 2 * ALIGN)
    pos = tl.where(e < ALIGN, xs + e, g_hi * ALIGN + (e - ALIGN))
    pos_g = pos // ALIGN
    # (pos - pos + chunk): the chunk test as a tensor; the interpreter rejects a scalar term in a mask.
    e_mask = (
        (pos >= xs)
        & (pos < xs + V)
        & ((pos_g < g_lo) | (pos_g >= g_hi))
        & ((e < ALIGN) | (pos >= xs + ALIGN))
        & ((pos - pos + chunk) == 0)
    )
    return pos, e_mask


@triton.jit
def _split_chunk(xs, chunk, V, CHUNK: tl.constexpr, ALIGN: tl.constexpr):
    # Where a program's chunk of the row starting at element xs (from X) lies: (start, mask).
    g_lo = (xs + ALIGN - 1) // ALIGN
    g_hi = (xs + V) // ALIGN
    c_start = tl.multiple_of((xs // ALIGN) * ALIGN + chunk * CHUNK, ALIGN)
    grp = tl.arange(0, CHUNK) // ALIGN  # constant over ALIGN-groups
    return c_start, _group_mask(grp, c_start, g_lo, g_hi, ALIGN)


@_no_value_specialisation
def softmax_split_kernel(
    X,
    Y,
    WS,
    B,
    V,
    P,
    stride_x,
    stride_y,
    x_off,
    y_off,
    SCALE,
    CHUNK: tl.constexpr,
    P_BLOCK: tl.constexpr,
    FALLBACK_BLOCK: tl.constexpr,
    MAX_SPINS: tl.constexpr,
    ALIGN: tl.constexpr = 1,
    Y_ALIGN: tl.constexpr = 1,
):
    # A row too long for one program's registers is shared by P programs, each keeping its
    # chunk in registers: one read and one write. Chunks are cut on ALIGN-groups of element
    # offsets from X (the wrapper makes X 16-byte aligned and passes the tensor's head as
    # x_off), so the bulk of a row moves in vector accesses at any V or row offset; the groups
    # a row only partly covers (at most ALIGN - 1 elements at each end) are "edges", loaded and
    # stored element-wise by chunk 0. How the row is cut changes nothing in the result: the max
    # and the fixed-point sum are order-free.
    #
    # The programs of a row meet twice through the row's 3P words in WS (zeroed when the
    # wrapper allocates it, never again): word c holds chunk c's max (float bits), words
    # P + 2c and P + 2c + 1 the upper and lower 32 bits of its fixed-point sum, each under the
    # launch's tag (above). Each wait is bounded: a program whose siblings are not scheduled in
    # time streams the row itself for the same exact max / sum (slower, never deadlocks). Under
    # the interpreter, whose programs run one after another, the bound is 0: early chunks take
    # the streaming branch and the last chunk combines, so both branches run on the CPU.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs = x_off + row * stride_x
    c_start, mask = _split_chunk(xs, chunk, V, CHUNK, ALIGN)
    x_in = tl.load(X + c_start + tl.arange(0, CHUNK), mask=mask, other=-float("inf"))
    pos, e_mask = _split_edges(xs, chunk, V, ALIGN)
    xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)
    x = x_in.to(tl.float32)

    ws_row = WS + row * (3 * P)
    x_row = X + xs
    fcols = tl.arange(0, FALLBACK_BLOCK)
    tag = _launch_tag(ws_row + chunk, P_BLOCK)
    tag_hi = tag << 32

    # Meeting 1: the row's max.
    m_c = _nan_max(_row_max(x, 0), _row_max(xe, 0))
    my_max = _tagged(tag_hi, m_c)
    tl.atomic_xchg(ws_row + chunk, my_max, sem="relaxed")
    m, stale = _meet_floats(ws_row, P, chunk, my_max, tag, False, P_BLOCK, MAX_SPINS)
    if stale > 0:
        m = _streamed_max(x_row, V, fcols)

    # Meeting 2: the row's fixed-point sum, every chunk relative to the same m.
    tl.debug_barrier()  # here, not between the conversions and the additions of the sum below
    ex = _exp(x, m, Y.dtype.element_ty)
    ee = _exp(xe, m, Y.dtype.element_ty)
    s_c = tl.sum(_fixed(ex, SCALE), axis=0) + tl.sum(_fixed(ee, SCALE), axis=0)
    my_hi, my_lo = _tagged_halves(tag_hi, s_c)
    tl.atomic_xchg(ws_row + P + 2 * chunk, my_hi, sem="relaxed")
    tl.atomic_xchg(ws_row + P + 2 * chunk + 1, my_lo, sem="relaxed")
    s, stale = _meet_sum(ws_row + P, P, chunk, my_hi, my_lo, tag, P_BLOCK, MAX_SPINS)
    if stale > 0:
        s = _streamed_sum(x_row, V, fcols, m, SCALE, Y.dtype.element_ty)

    neg_hi, inv = _softmax_scale(s, SCALE, m)
    # Output element of input offset o sits at Y + o + shift.
    shift = tl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
    yx = _normalise(ex, neg_hi, inv, Y.dtype.element_ty)
    tl.store(Y + shift + c_start + tl.arange(0, CHUNK), yx.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=e_mask)


@_no_value_specialisation
def softmax_stream_kernel(
    X,
    Y,
    B,
    V,
    stride_x,
    stride_y,
    x_off,
    y_off,
    SCALE,
    BLOCK: tl.constexpr,
    ALIGN: tl.constexpr = 1,
    Y_ALIGN: tl.constexpr = 1,
):
    # Rows too long for one program's registers: a grid of a few programs per SM
    # walks the rows, reading each three times in BLOCK-wide tiles (max, fixed-point sum,
    # write). The grid bounds the rows in flight, so a row's second and third reads find it in
    # L2 and DRAM sees one read and one write. Tiles are cut on ALIGN-groups of element offsets
    # from X, as in the split kernel (the wrapper passes a 16-byte-aligned X and the tensor's
    # head as x_off), so the body moves in vector accesses at any V or row offset; the partly
    # covered groups at each end (the "edges") are loaded and stored element-wise.
    cols = tl.arange(0, BLOCK)
    grp = cols // ALIGN  # constant over ALIGN-groups
    e = tl.arange(0, 2 * ALIGN)
    row = tl.program_id(0).to(tl.int64)
    while row < B:
        xs = x_off + row * stride_x  # row start, elements from X
        g_lo = (xs + ALIGN - 1) // ALIGN  # first group wholly inside the row
        g_hi = (xs + V) // ALIGN  # one past the last such group
        base = (xs // ALIGN) * ALIGN
        end = g_hi * ALIGN
        pos = tl.where(e < ALIGN, xs + e, end + (e - ALIGN))
        pos_g = pos // ALIGN
        e_mask = (pos >= xs) & (pos < xs + V) & ((pos_g < g_lo) | (pos_g >= g_hi)) & ((e < ALIGN) | (pos >= xs + ALIGN))
        xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)

        m_lane = tl.full([BLOCK], -float("inf"), tl.float32)
        start = base
        while start < end:
            mask = _group_mask(grp, start, g_lo, g_hi, ALIGN)
            x = tl.load(X + tl.multiple_of(start, ALIGN) + cols, mask=mask, other=-float("inf"))
            m_lane = _nan_max(m_lane, x.to(tl.float32))
            start += BLOCK
        m = _nan_max(_row_max(m_lane, 0), _row_max(xe, 0))

        ee = _exp(xe, m, Y.dtype.element_ty)
        s_lane = tl.zeros([BLOCK], tl.int64)
        start = base
        while start < end:
            mask = _group_mask(grp, start, g_lo, g_hi, ALIGN)
            x = tl.load(X + tl.multiple_of(start, ALIGN) + cols, mask=mask, other=-float("inf"))
            s_lane += _fixed(_exp(x.to(tl.float32), m, Y.dtype.element_ty), SCALE)
            start += BLOCK
        s = tl.sum(s_lane, axis=0) + tl.sum(_fixed(ee, SCALE), axis=0)
        neg_hi, inv = _softmax_scale(s, SCALE, m)

        # Output element of input offset o sits at Y + o + shift.
        shift = tl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
        tl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=e_mask)
        start = base
        while start < end:
            mask = _group_mask(grp, start, g_lo, g_hi, ALIGN)
            off = tl.multiple_of(start, ALIGN) + cols
            x = tl.load(X + off, mask=mask, other=-float("inf"), eviction_policy="evict_first")
            y = _normalise(_exp(x.to(tl.float32), m, Y.dtype.element_ty), neg_hi, inv, Y.dtype.element_ty)
            tl.store(Y + shift + off, y.to(Y.dtype.element_ty), mask=mask)
            start += BLOCK
        row += tl.num_programs(0)


# Gluon's names for the cp.async copy and the block-wide barrier (Triton 3.7 renamed both).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.constexpr_function
def _held_part(block, tile, i):
    # The i-th of a buffer's parts, largest first, 0 past the last: shared memory is allocated
    # in powers of two, so a buffer of BLOCK elements (a multiple of the tile with at most three
    # bits set: kernels.triton_dispatch.held_block) is up to three allocations.
    n = block // tile
    parts = [tile << b for b in reversed(range(n.bit_length())) if n >> b & 1]
    return parts[i] if i < len(parts) else 0


@gluon.constexpr_function
def _held_part_start(block, tile, i):
    # Where the i-th part begins in the buffer.
    return sum(_held_part(block, tile, j) for j in range(i))


@gluon.jit
def _held_buffers(dtype: gl.constexpr, BLOCK: gl.constexpr, TILE: gl.constexpr):
    # A held row's buffer of BLOCK elements: its parts (a part not needed is the first again).
    layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    b0 = gl.allocate_shared_memory(dtype, [_held_part(BLOCK, TILE, 0)], layout)
    b1 = b0
    b2 = b0
    if _held_part(BLOCK, TILE, 1) > 0:
        b1 = gl.allocate_shared_memory(dtype, [_held_part(BLOCK, TILE, 1)], layout)
    if _held_part(BLOCK, TILE, 2) > 0:
        b2 = gl.allocate_shared_memory(dtype, [_held_part(BLOCK, TILE, 2)], layout)
    return (b0, b1, b2)


@gluon.jit
def _held_tile(bufs, t: gl.constexpr, TILE: gl.constexpr, BLOCK: gl.constexpr):
    # Tile t of the buffer (elements t * TILE onwards), in whichever part holds it.
    S0: gl.constexpr = _held_part(BLOCK, TILE, 0)
    S1: gl.constexpr = _held_part(BLOCK, TILE, 1)
    if t * TILE < S0:
        tile = bufs[0].slice(t * TILE, TILE)
    elif t * TILE < S0 + S1:
        tile = bufs[1].slice(t * TILE - S0, TILE)
    else:
        tile = bufs[2].slice(t * TILE - S0 - S1, TILE)
    return tile


@gluon.jit
def _held_groups(xs, V, TILE: gl.constexpr, ALIGN: gl.constexpr):
    # A held row's ALIGN-groups from a 16-byte-aligned X, as the stream kernel cuts them: the
    # first and one past the last group wholly inside the row starting xs elements past X, the
    # group-aligned start of the buffer, and a tile's lanes (their groups and their offsets).
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    g_lo = (xs + ALIGN - 1) // ALIGN
    g_hi = (xs + V) // ALIGN
    base = gl.multiple_of((xs // ALIGN) * ALIGN, ALIGN)
    cols = gl.arange(0, TILE, layout=lanes)
    return g_lo, g_hi, base, cols // ALIGN, cols


@gluon.jit
def _held_copy_part(X, bufs, i: gl.constexpr, base, g_lo, g_hi, BLOCK: gl.constexpr, TILE: gl.constexpr,
                    ALIGN: gl.constexpr):  # fmt: skip
    # Part i of the buffer by cp.async, if the buffer has one.
    PART: gl.constexpr = _held_part(BLOCK, TILE, i)
    if PART > 0:
        lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
        offs = _held_part_start(BLOCK, TILE, i) + gl.arange(0, PART, layout=lanes)
        _async_load(bufs[i], X + base + offs, mask=_group_mask(offs // ALIGN, base, g_lo, g_hi, ALIGN))


@gluon.jit
def _held_copy_in(X, bufs, base, grp, cols, g_lo, g_hi, BLOCK: gl.constexpr, ALIGN: gl.constexpr,
                  ASYNC: gl.constexpr):  # fmt: skip
    # The row's whole groups into the buffer, by cp.async (committed, not waited for) where
    # ASYNC, through registers where X is not 16-byte aligned and cp.async cannot take a group;
    # every other slot is -inf once _held_max_sum has begun (cp.async leaves zeros there).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    if ASYNC:  # one copy a part (tile by tile, each copy would wait at a barrier)
        for i in gl.static_range(3):
            _held_copy_part(X, bufs, i, base, g_lo, g_hi, BLOCK, TILE, ALIGN)
        async_copy.commit_group()
    else:
        for t in gl.static_range(BLOCK // TILE):
            mask = _group_mask(grp, base + t * TILE, g_lo, g_hi, ALIGN)
            x = gl.load(X + base + t * TILE + cols, mask=mask, other=-float("inf"))
            _held_tile(bufs, t, TILE, BLOCK).store(x)


@gluon.jit
def _held_edges(X, xs, V, g_lo, g_hi, ALIGN: gl.constexpr, ASYNC: gl.constexpr, take=True):
    # The partial groups at the row's ends, element by element into registers (the stream
    # kernel's edges: each element once), then the wait for the copy: (positions, mask, values).
    # A program that does not `take` them (a held split's chunks after the first) gets none.
    NW: gl.constexpr = gl.num_warps()
    e = gl.arange(0, 32 * NW, layout=gl.BlockedLayout([1], [32], [NW], [0]))
    pos = gl.where(e < ALIGN, xs + e, g_hi * ALIGN + (e - ALIGN))
    pos_g = pos // ALIGN
    e_mask = (
        (e < 2 * ALIGN)
        & (pos >= xs)
        & (pos < xs + V)
        & ((pos_g < g_lo) | (pos_g >= g_hi))
        & ((e < ALIGN) | (pos >= xs + ALIGN))
        & take
    )
    xe = gl.load(X + pos, mask=e_mask, other=-float("inf")).to(gl.float32)
    if ASYNC:
        async_copy.wait_group(0)
    _barrier()
    return pos, e_mask, xe


@gluon.jit
def _held_max_sum(bufs, xe, base, grp, g_lo, g_hi, SCALE, OUT: gl.constexpr, BLOCK: gl.constexpr,
                  ALIGN: gl.constexpr):  # fmt: skip
    # The first two passes over a held row: its max m (NaN-propagating) and the fixed-point sum
    # S of exp(x - m), the edges' exponentials ee among them: (m, S, ee).
    m = _held_max(bufs, xe, base, grp, g_lo, g_hi, BLOCK, ALIGN)
    _barrier()  # each pass reads the buffer afresh: the compiler may not keep a pass's loads
    S, ee = _held_sum(bufs, xe, m, SCALE, OUT, BLOCK, ALIGN)
    return m, S, ee


@gluon.jit
def _held_fill(bufs, base, grp, g_lo, g_hi, value, BLOCK: gl.constexpr, ALIGN: gl.constexpr):
    # The slots of a held buffer (starting at the group-aligned offset `base`) outside the row's
    # whole groups set to `value`, in the tiles that have any (the row's ends).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    lo = (g_lo - base // ALIGN).to(gl.int32)  # the row's whole groups, counted in the buffer
    hi = (g_hi - base // ALIGN).to(gl.int32)
    for t in gl.static_range(BLOCK // TILE):
        if (t * (TILE // ALIGN) < lo) | ((t + 1) * (TILE // ALIGN) > hi):
            mask = _group_mask(grp, base + t * TILE, g_lo, g_hi, ALIGN)
            tile = _held_tile(bufs, t, TILE, BLOCK)
            tile.store(gl.where(mask, tile.load(lanes), value))


@gluon.jit
def _held_max(bufs, xe, base, grp, g_lo, g_hi, BLOCK: gl.constexpr, ALIGN: gl.constexpr):
    # The max of a held buffer starting at the group-aligned offset `base` and of the edges xe.
    # The slots outside the row's whole groups are made -inf first (in the tiles that have any:
    # the ends), so that neither this pass nor _held_sum masks an element, and the max compares
    # the stored 16-bit values themselves, two to an instruction (a max is exact in any precision).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    _held_fill(bufs, base, grp, g_lo, g_hi, -float("inf"), BLOCK, ALIGN)
    m_lane = gl.full([TILE], -float("inf"), bufs[0].dtype, lanes)
    for t in gl.static_range(BLOCK // TILE):
        m_lane = _nan_max(m_lane, _held_tile(bufs, t, TILE, BLOCK).load(lanes))
    return _nan_max(_row_max(m_lane.to(gl.float32), 0), _row_max(xe, 0))


@gluon.jit
def _held_sum(bufs, xe, m, SCALE, OUT: gl.constexpr, BLOCK: gl.constexpr, ALIGN: gl.constexpr):
    # The fixed-point sum of exp(x - m) over a held buffer (its outside slots -inf: _held_max)
    # and the edges xe, and the edges' exponentials: (S, ee).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    s_lane = gl.zeros([TILE], gl.int64, lanes)
    for t in gl.static_range(BLOCK // TILE):
        x = _held_tile(bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
        s_lane += _fixed(_exp(x, m, OUT), SCALE)
    ee = _exp(xe, m, OUT)
    return gl.sum(s_lane, axis=0) + gl.sum(_fixed(ee, SCALE), axis=0), ee


@gluon.jit
def _held_write(Y, bufs, shift, base, grp, cols, g_lo, g_hi, m, neg_hi, inv, BLOCK: gl.constexpr,
                ALIGN: gl.constexpr):  # fmt: skip
    # The last pass over a held buffer: its outputs, written to Y + shift + (input offset).
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = Y.dtype.element_ty
    lanes: gl.constexpr = gl.BlockedLayout([ALIGN], [32], [gl.num_warps()], [0])
    for t in gl.static_range(BLOCK // TILE):
        mask = _group_mask(grp, base + t * TILE, g_lo, g_hi, ALIGN)
        x = _held_tile(bufs, t, TILE, BLOCK).load(lanes).to(gl.float32)
        y = _normalise(_exp(x, m, OUT), neg_hi, inv, OUT)
        gl.store(Y + shift + base + t * TILE + cols, y.to(OUT), mask=mask)


@gluon.jit(do_not_specialize=["V", "stride_x", "stride_y", "x_off", "y_off"])
def softmax_held_kernel(
    X,
    Y,
    V,
    stride_x,
    stride_y,
    x_off,
    y_off,
    SCALE,
    BLOCK: gl.constexpr,
    ALIGN: gl.constexpr,
    Y_ALIGN: gl.constexpr,
    ASYNC: gl.constexpr = True,
):
    # One program holds the whole row in shared memory (BLOCK elements of storage in up to three
    # parts, at most 128 KB: kernels.triton_dispatch.held_block), not in registers, so two
    # programs fit an SM where the row path fits one (to 113 KB a buffer): the row is copied in
    # by cp.async (no register holds the bytes in flight) and read from shared
    # memory three times (max, fixed-point sum, write), each exponential computed twice, from
    # the same values by the same _exp, so the bits are the other paths'. Written in Gluon,
    # Triton's lower-level language, which places tensors in shared memory itself; the
    # interpreter cannot run it (its sm_90 build is checked on the CPU, its bits on the GPU).
    # Rows are cut on ALIGN-groups from a 16-byte-aligned X as in the stream kernel; the edges
    # (partial groups at each end) are loaded element-wise into registers. ASYNC False (X not
    # 16-byte aligned, where cp.async cannot take a group) fills the buffer through registers.
    # The helpers above are shared with the cross-entropy's held kernel.
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = Y.dtype.element_ty
    row = gl.program_id(0).to(gl.int64)
    xs = x_off + row * stride_x  # row start, elements from X
    g_lo, g_hi, base, grp, cols = _held_groups(xs, V, TILE, ALIGN)
    bufs = _held_buffers(X.dtype.element_ty, BLOCK, TILE)
    _held_copy_in(X, bufs, base, grp, cols, g_lo, g_hi, BLOCK, ALIGN, ASYNC)
    pos, e_mask, xe = _held_edges(X, xs, V, g_lo, g_hi, ALIGN, ASYNC)
    m, S, ee = _held_max_sum(bufs, xe, base, grp, g_lo, g_hi, SCALE, OUT, BLOCK, ALIGN)
    neg_hi, inv = _softmax_scale(S, SCALE, m)

    # Output element of input offset o sits at Y + o + shift.
    shift = gl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
    gl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, OUT).to(OUT), mask=e_mask)
    _barrier()
    _held_write(Y, bufs, shift, base, grp, cols, g_lo, g_hi, m, neg_hi, inv, BLOCK, ALIGN)


@gluon.jit
def _held_split_max(bufs, xe, c_base, grp, g_lo, g_hi, words, P, chunk, tag, slots, x_row, V, fcols,
                    MAX_SPINS: gl.constexpr, CHUNK: gl.constexpr, ALIGN: gl.constexpr):  # fmt: skip
    # A held split's first meeting: its chunk's max (and the edges', xe) published at
    # words[chunk] under the launch's tag, the row's max met over the P words (the slots lanes),
    # or streamed from x_row (the fcols lanes) where the siblings did not arrive in time.
    my_max = _tagged(tag << 32, _held_max(bufs, xe, c_base, grp, g_lo, g_hi, CHUNK, ALIGN))
    gl.atomic_xchg(words + chunk, my_max, sem="relaxed")
    m, stale = _meet_floats_on(words, P, chunk, my_max, tag, False, slots, MAX_SPINS)
    if stale > 0:
        m = _streamed_max(x_row, V, fcols)
    return m


@gluon.jit
def _held_split_sum(bufs, xe, m, SCALE, OUT: gl.constexpr, words, P, chunk, tag, slots, x_row, V, fcols,
                    MAX_SPINS: gl.constexpr, CHUNK: gl.constexpr, ALIGN: gl.constexpr):  # fmt: skip
    # The second meeting, after a barrier (a fresh pass over the buffer): the chunk's fixed-point
    # sum of exp(x - m) at words[2 chunk] (upper 32 bits) and words[2 chunk + 1], the row's met
    # or streamed as _held_split_max's; with the edges' exponentials: (S, ee).
    _barrier()
    s_c, ee = _held_sum(bufs, xe, m, SCALE, OUT, CHUNK, ALIGN)
    my_hi, my_lo = _tagged_halves(tag << 32, s_c)
    gl.atomic_xchg(words + 2 * chunk, my_hi, sem="relaxed")
    gl.atomic_xchg(words + 2 * chunk + 1, my_lo, sem="relaxed")
    s, stale = _meet_sum_on(words, P, chunk, my_hi, my_lo, tag, slots, MAX_SPINS)
    if stale > 0:
        s = _streamed_sum(x_row, V, fcols, m, SCALE, OUT)
    return s, ee


@gluon.jit(do_not_specialize=["B", "V", "P", "stride_x", "stride_y", "x_off", "y_off"])
def softmax_held_split_kernel(
    X,
    Y,
    WS,
    B,
    V,
    P,
    stride_x,
    stride_y,
    x_off,
    y_off,
    SCALE,
    CHUNK: gl.constexpr,
    P_BLOCK: gl.constexpr,
    FALLBACK_BLOCK: gl.constexpr,
    MAX_SPINS: gl.constexpr,
    ALIGN: gl.constexpr,
    Y_ALIGN: gl.constexpr,
    ASYNC: gl.constexpr = True,
):
    # The split kernel's programs (P a row, chunks cut on ALIGN-groups, the edges chunk 0's, the
    # two tagged meetings through WS and their streaming fallback, all as softmax_split_kernel)
    # with each chunk held in shared memory as the held kernel holds a row: CHUNK elements
    # (a power of two times the tile) copied in by cp.async, read three times. A program keeps
    # no element in registers, so more of them share an SM while they wait at their meetings,
    # and a row of any length moves once each way. Gluon, so the interpreter cannot run it.
    TILE: gl.constexpr = ALIGN * 32 * gl.num_warps()
    OUT: gl.constexpr = Y.dtype.element_ty
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    pid = gl.program_id(0).to(gl.int64)
    row = pid // P
    chunk = pid - row * P
    xs = x_off + row * stride_x
    g_lo, g_hi, base, grp, cols = _held_groups(xs, V, TILE, ALIGN)
    c_base = base + chunk * CHUNK  # the chunk's first element, from X (group-aligned)
    bufs = _held_buffers(X.dtype.element_ty, CHUNK, TILE)
    _held_copy_in(X, bufs, c_base, grp, cols, g_lo, g_hi, CHUNK, ALIGN, ASYNC)
    ws_row = WS + row * (3 * P)
    slots = gl.arange(0, P_BLOCK, layout=flat)
    tag = _launch_tag_on(ws_row + chunk, slots)  # while the copy is in flight
    pos, e_mask, xe = _held_edges(X, xs, V, g_lo, g_hi, ALIGN, ASYNC, chunk == 0)

    # The two meetings: the row's max, then its fixed-point sum relative to that max.
    x_row = X + xs
    fcols = gl.arange(0, FALLBACK_BLOCK, layout=flat)
    m = _held_split_max(bufs, xe, c_base, grp, g_lo, g_hi, ws_row, P, chunk, tag, slots, x_row, V, fcols,
                        MAX_SPINS, CHUNK, ALIGN)  # fmt: skip
    s, ee = _held_split_sum(bufs, xe, m, SCALE, OUT, ws_row + P, P, chunk, tag, slots, x_row, V, fcols,
                            MAX_SPINS, CHUNK, ALIGN)  # fmt: skip

    neg_hi, inv = _softmax_scale(s, SCALE, m)
    shift = gl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
    gl.store(Y + shift + pos, _normalise(ee, neg_hi, inv, OUT).to(OUT), mask=e_mask)
    _barrier()
    _held_write(Y, bufs, shift, c_base, grp, cols, g_lo, g_hi, m, neg_hi, inv, CHUNK, ALIGN)


JIT_KERNELS = {
    "tile": softmax_tile_kernel,
    "row": softmax_row_kernel,
    "rows": softmax_rows_kernel,
    "split": softmax_split_kernel,
    "stream": softmax_stream_kernel,
    "held": softmax_held_kernel,
    "held_split": softmax_held_split_kernel,
}
