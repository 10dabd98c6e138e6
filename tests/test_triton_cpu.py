"""Triton softmax on CPU: the kernels under TRITON_INTERPRET=1, sm_90 builds ahead of time, and
the stored-autotune bookkeeping.

The interpreter must be switched on before `kernels.softmax_triton` is imported. Where the
test process already imported it interpreted (no GPU: conftest sets TRITON_INTERPRET=1), the
kernel tests run here. Elsewhere (a GPU machine) they are skipped in this process and
`test_interpreter_tests_in_a_subprocess` runs this file again in a child with the variable set.

The interpreter runs a launch's programs one after another in Python, so its cost grows with
B and with the number of tiles or chunks per row: cases are chosen to cover each parameter's
values and their pairs, not the full product of all of them.
"""

import dataclasses
import inspect
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import SOFTMAX_KERNELS
from tests.helpers import TRITON_MISSING

if TRITON_MISSING:  # Triton publishes Linux wheels only: every test here needs it
    pytest.skip(TRITON_MISSING, allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels import softmax_triton as st  # noqa: E402
from kernels import triton_build, triton_kernels, triton_launch  # noqa: E402
from kernels import triton_dispatch as dispatch  # noqa: E402
from kernels import triton_store as store  # noqa: E402
from kernels.spec import LAB_SHAPES  # noqa: E402
from tests.helpers import (  # noqa: E402
    bits,
    check_softmax,
    dtype_id,
    layouts,
    logits,
    run_poisoned,
    triton_path_runner,
)
from tests.helpers import sm90_builds as run_sm90_builds  # noqa: E402

pytestmark = pytest.mark.cpu

# Each path's launch parameters for the CPU, from the registry's entry (kernels/spec.py): scaled
# down so that rows of tens of elements take the path's real loop.
# Every path binds here (its launch's arguments are checked); the interpreter runs RUN's.
SCALED = {path.name: dict(path.cpu) for path in SOFTMAX_KERNELS[dispatch.KERNEL_NAME].spec.paths}
RUN = {name: SCALED[name] for name in SOFTMAX_KERNELS[dispatch.KERNEL_NAME].interpreted_paths}

REPO = Path(__file__).resolve().parents[1]
interpreted = pytest.mark.skipif(
    not dispatch.INTERPRET, reason="needs the interpreted module; test_interpreter_tests_in_a_subprocess runs it"
)

V_SHAPES = (1, 7, 255, 600, 781, 1025, 2049, 5000)
DTYPES = SOFTMAX_KERNELS[dispatch.KERNEL_NAME].dtypes
SM90_SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90


def _config_id(cfg):
    return f"BLOCK{cfg.kwargs['BLOCK']}-w{cfg.num_warps}"


# ------------------------------------------------------------------ every autotune config


GRID_ROWS = 16


def _config_cases():
    """One config of each BLOCK (num_warps taking turns, so every num_warps appears), at each V
    of V_SHAPES (B alternating 1 and 3), at its own tile boundary (V = BLOCK - 1, BLOCK: one
    tile; BLOCK + 1: the multi-pass loop with a one-element last tile), and at B = GRID_ROWS
    with the narrowest tile.
    num_warps does not change what the interpreter computes, so the other configs of a BLOCK
    would run the same program: the GPU cases launch every config."""
    by_block: dict[int, list] = {}
    for cfg in store.CONFIGS:
        by_block.setdefault(cfg.kwargs["BLOCK"], []).append(cfg)
    cases = {}
    for i, (block, configs) in enumerate(sorted(by_block.items())):
        cfg = configs[i % len(configs)]
        for j, V in enumerate(V_SHAPES):
            cases[(cfg, (1, 3)[(i + j) % 2], V)] = None
        for V in (block - 1, block, block + 1):
            cases[(cfg, 3, V)] = None
    # A grid of 16 rows with the narrowest tile, at the V of one to four tiles: the interpreter
    # pays for every lane of every program, and the grid is the same for every config (the
    # longer rows run at B = 1 and 3 above).
    narrowest = min((cfg for cfg, _, _ in cases), key=lambda cfg: cfg.kwargs["BLOCK"])
    for V in V_SHAPES:
        if V <= 4 * narrowest.kwargs["BLOCK"]:
            cases[(narrowest, GRID_ROWS, V)] = None
    return [pytest.param(cfg, B, V, id=f"{_config_id(cfg)}-B{B}-V{V}") for cfg, B, V in cases]


CONFIG_CASES = _config_cases()


def test_config_cases_cover_every_block_v_and_batch_size():
    chosen = {p.values[0] for p in CONFIG_CASES}
    assert {c.kwargs["BLOCK"] for c in chosen} == {c.kwargs["BLOCK"] for c in store.CONFIGS}
    assert {c.num_warps for c in chosen} == {c.num_warps for c in store.CONFIGS}
    seen = {(p.values[0].kwargs["BLOCK"], p.values[2]) for p in CONFIG_CASES}
    for cfg in store.CONFIGS:
        block = cfg.kwargs["BLOCK"]
        assert {(block, V) for V in (*V_SHAPES, block - 1, block, block + 1)} <= seen
    assert {p.values[2] for p in CONFIG_CASES if p.values[1] == GRID_ROWS} >= {V for V in V_SHAPES if V <= 1024}


@interpreted
@pytest.mark.parametrize("cfg,B,V", CONFIG_CASES)
def test_every_autotune_config_matches_reference(cfg, B, V):
    x = logits(B, V, seed=B * 100003 + V)
    out = run_poisoned(triton_path_runner("tile", config=store.config_dict(cfg)), x)
    check_softmax(out, x, what=f"tile {_config_id(cfg)}")


# ------------------------------------------------------------------ every dispatch path

PATH_SHAPES = [(1, 1), (3, 7), (5, 16), (2, 17), (9, 33), (4, 100), (3, 600)]


@interpreted
@pytest.mark.parametrize("path", sorted(RUN))
@pytest.mark.parametrize("B,V", PATH_SHAPES)
def test_each_path_matches_reference(path, B, V):
    params = RUN[path]
    if path == "split" and V >= 600:
        # At the scaled chunk a row of 600 has 38 chunks, and the interpreter's cost grows with
        # B * P^2: the longest row runs alone, in chunks of 64 (10 a row; B > 1 is covered at
        # V <= 100, and more programs than a meeting's slots by the meeting tests below).
        B, params = 1, {**params, "CHUNK": 64}
    x = logits(B, V, seed=7 * B + V)
    out = run_poisoned(triton_path_runner(path, **params), x)
    check_softmax(out, x, what=f"{path} ({B}, {V})")


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_each_path_at_every_overflow_maximum(dtype):
    # Rows whose max lies at each of OVERFLOW_MAXIMA, negative ones included (a lane max started
    # at 0 instead of -inf is right for every row whose max is positive): every path against the
    # reference and with the tile path's bits.
    x = logits(8, 40, seed=11, dtype=dtype, recipe="overflow")
    assert (x.float().amax(dim=1) < 0).any()
    want = run_poisoned(triton_path_runner("tile", **SCALED["tile"]), x)
    for path, params in RUN.items():
        out = run_poisoned(triton_path_runner(path, **params), x)
        check_softmax(out, x, what=f"{path} at the overflow maxima {dtype_id(dtype)}")
        assert torch.equal(bits(out), bits(want)), f"{path}: not the tile path's bits"


@interpreted
@pytest.mark.parametrize("align", [1, 2, 4])
def test_vector_alignment_hint_keeps_results(align):
    # V = 64 and strides divisible by 4: every hint the wrapper might pass is true here.
    x = logits(6, 64, seed=align)
    for path, params in RUN.items():
        check_softmax(run_poisoned(triton_path_runner(path, align=align, **params), x), x, what=f"{path} align {align}")


@interpreted
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_alignment_hints_are_true_for_every_layout(dtype):
    # The interpreter ignores tl.multiple_of, so a false hint passes every value check here and
    # breaks only a GPU's vector accesses: the facts each launch is told are checked directly.
    # One-program-per-row paths: ALIGN divides V and both row strides. Chunked paths: chunks
    # start on ALIGN-groups by construction; the output's shift from the input (per row:
    # y_off - x_off + row * (stride_y - stride_x)) is a multiple of Y_ALIGN.
    es = torch.tensor([], dtype=dtype).element_size()
    for V in (64, 70, 71):
        for layout in (lay for lay in layouts(dtype) if lay != "col_stride"):
            x = logits(5, V, seed=V, dtype=dtype, layout=layout)
            for out_offset in (0, 1, 3):
                y = torch.empty(out_offset + x.numel(), dtype=dtype)[out_offset:].view(x.shape)
                for path, params in SCALED.items():
                    launch = st.bind(x, y, path, **params)
                    a, v = launch.constexprs["ALIGN"], launch.values
                    what = f"{path} V={V} {layout} out+{out_offset}: ALIGN {a}"
                    assert a & (a - 1) == 0 and a * es <= 16, what
                    if not triton_launch.PATH_TABLE[path].chunked:
                        assert V % a == 0 and v["stride_x"] % a == 0 and v["stride_y"] % a == 0, what
                        continue
                    ya = launch.constexprs["Y_ALIGN"]
                    assert (v["y_off"] - v["x_off"]) % ya == 0, f"{what}, Y_ALIGN {ya}"
                    assert (v["stride_y"] - v["stride_x"]) % ya == 0, f"{what}, Y_ALIGN {ya}"
                    for name, t, off in (("X", x, v["x_off"]), ("Y", y, v["y_off"])):
                        # the base view: the tensor moved back by its head, onto a 16-byte boundary
                        assert v[name].data_ptr() == t.data_ptr() - off * es, f"{what}: {name} base"
                        assert off == 0 or v[name].data_ptr() % 16 == 0, f"{what}: {name} base off its boundary"


@interpreted
def test_split_combines_published_partials_and_falls_back():
    # Programs run one after another in the interpreter (poll bound 0): the last chunk of a row
    # finds every partial published and combines them, earlier chunks stream the row. Both must
    # agree with the reference, including a chunk that is entirely -inf.
    x = logits(4, 64, seed=3)
    x[1, 16:32] = -float("inf")
    out = run_poisoned(triton_path_runner("split", CHUNK=16, num_warps=2, max_spins=0), x)
    check_softmax(out, x)


@interpreted
@pytest.mark.parametrize(
    "dtype, max_spins",
    [(torch.float32, 0), (torch.bfloat16, 0), (torch.bfloat16, 3), (torch.float16, 3)],
    ids=["fp32-spins0", "bf16-spins0", "bf16-spins3", "fp16-spins3"],
)
def test_split_gives_the_tile_paths_bits_on_both_sides_of_the_meetings(dtype, max_spins):
    # The row's bits must be those of every other path whether the meetings combine or stream.
    x = logits(3, 70, seed=12, dtype=dtype)
    out = run_poisoned(triton_path_runner("split", CHUNK=16, num_warps=2, max_spins=max_spins), x)
    check_softmax(out, x, what="split")
    assert torch.equal(bits(out), bits(st.run_path(x, "tile"))), "bits differ from the tile path"


@interpreted
@pytest.mark.parametrize("p_block", [2, 4])
def test_split_meets_in_blocks_when_a_row_has_more_programs_than_slots(p_block):
    # A row of P = 5 chunks met P_BLOCK words at a time (the last block partly masked).
    x = logits(3, 70, seed=13)
    out = run_poisoned(triton_path_runner("split", CHUNK=16, num_warps=2, P_BLOCK=p_block, max_spins=2), x)
    assert torch.equal(bits(out), bits(st.run_path(x, "tile")))


@interpreted
def test_split_workspace_tags_stay_in_step_over_batches_and_chunk_counts():
    # The words a launch publishes carry a tag one past the last launch's; each P has its own
    # workspace, so launches of other B and P in between must not put a row's words out of step.
    x = logits(4, 50, seed=2)
    want = st.run_path(x, "tile")
    for chunk in (16, 32, 16):
        for B in (4, 1, 3):
            out = run_poisoned(triton_path_runner("split", CHUNK=chunk, num_warps=2), x[:B])
            assert torch.equal(bits(out), bits(want[:B])), f"CHUNK {chunk} B {B}"


@interpreted
def test_split_tags_wrap_around():
    # Words left at the largest tag: the next launch tags its words 0 and still meets.
    x = logits(2, 50, seed=4)
    y = torch.full_like(x, float("nan"))
    launch = st.bind(x, y, "split", CHUNK=16, num_warps=2, max_spins=0)
    ws = torch.full((dispatch.split_workspace_words(2, launch.geometry["P"]),), 0x7FFFFFFF << 32, dtype=torch.int64)
    launch.values["WS"] = ws
    launch()
    assert torch.equal(bits(y), bits(st.run_path(x, "tile")))
    assert torch.equal(ws >> 32, torch.zeros_like(ws)), "every word carries the wrapped tag 0"


# ------------------------------------------------------------------ the path table


def _swapped(names, a, b):
    names = list(names)
    i, j = names.index(a), names.index(b)
    names[i], names[j] = names[j], names[i]
    return names


@pytest.mark.parametrize("path", sorted(triton_launch.PATH_TABLE))
def test_path_table_rejects_reordered_renamed_or_missing_arguments(path):
    # Two arguments of one width swapped would pass every width check of a launch and compute
    # garbage: the table is checked against the kernel's own signature, by name and order.
    entry = triton_launch.PATH_TABLE[path]
    kernel = entry.kernel.fn.__name__
    types = dict(entry.args)
    swapped = _swapped(entry.arg_names, "stride_x", "stride_y")
    message = rf"path '{path}': the argument spec \(.*stride_y, stride_x.*\) does not match {kernel}"
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(entry, args=tuple((n, types[n]) for n in swapped))
    with pytest.raises(ValueError, match="does not match"):
        dataclasses.replace(entry, args=tuple(("stride" if n == "stride_x" else n, t) for n, t in entry.args))
    with pytest.raises(ValueError, match="does not match"):
        dataclasses.replace(entry, args=entry.args[:-1])
    with pytest.raises(ValueError, match="constexprs"):
        dataclasses.replace(entry, constexprs=entry.constexprs[::-1])
    assert dataclasses.replace(entry).arg_names == entry.arg_names  # the table itself passes


@triton.jit
def _tile_kernel_with_swapped_strides(X, Y, V, stride_y, stride_x, SCALE, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    pass


@triton.jit
def _kernel_with_an_unknown_argument(X, Y, Z, V, stride_x, stride_y, SCALE, BLOCK: tl.constexpr, ALIGN: tl.constexpr):
    pass


def test_path_table_rejects_a_kernel_that_reorders_its_arguments():
    tile = triton_launch.PATH_TABLE["tile"]
    with pytest.raises(ValueError, match=r"_tile_kernel_with_swapped_strides\(X, Y, V, stride_y, stride_x, SCALE\)"):
        dataclasses.replace(tile, kernel=_tile_kernel_with_swapped_strides)
    args = (*tile.args[:2], ("Z", "*T"), *tile.args[2:])
    with pytest.raises(ValueError, match="arguments a launch cannot pass: Z"):
        dataclasses.replace(tile, kernel=_kernel_with_an_unknown_argument, args=args)


def test_named_launches_of_the_training_kernels_check_names_and_order():
    # The backward and cross-entropy kernels launch from their table entries like the softmax's:
    # a dict of arguments by name, held to the kernel's signature before anything is launched.
    from kernels.triton_launch import TABLES

    entry = TABLES["softmax_backward"]["row"]
    t = torch.zeros(1, 4)
    args = {"DY": t, "Y": t, "DX": t, "V": 4, "stride_dy": 4, "stride_y": 4, "stride_dx": 4, "K": 30}
    swapped = {n: args[n] for n in _swapped(args, "stride_y", "stride_dx")}
    p = {"BLOCK": 4, "num_warps": 1}
    with pytest.raises(ValueError, match=r"arguments \(DY, Y, DX, V, stride_dy, stride_dx, stride_y, K\) do not match"):
        entry.bind_values(swapped, p, 4, 1)
    with pytest.raises(ValueError, match="do not match softmax_backward_row_kernel"):
        entry.bind_values({k: v for k, v in args.items() if k != "K"}, p, 4, 1)


@pytest.mark.parametrize("path", sorted(triton_launch.PATH_TABLE))
def test_ahead_of_time_signature_comes_from_the_table(path):
    entry = triton_launch.PATH_TABLE[path]
    sig = entry.signature("bf16")
    assert list(sig) == list(inspect.signature(entry.kernel.fn).parameters), "every parameter, in the kernel's order"
    assert all(sig[n] == ("*i64" if n == "WS" else "*bf16") for n in entry.arg_names if n in ("X", "Y", "WS"))
    assert sig["SCALE"] == "fp32" and all(sig[c] == "constexpr" for c in entry.constexprs)


@interpreted
@pytest.mark.parametrize("path", sorted(SCALED))
@pytest.mark.parametrize("head", [0, 1])
def test_remembered_launch_passes_what_a_first_launch_would(path, head):
    # The fast path (one driver call, GPU only) repeats a launch for tensors of the same layout:
    # generated from the same table, it must pass exactly the arguments and grid a first launch
    # of those tensors would, in the spec's order. A recording launcher stands in for the driver.
    def rows(B, seed):
        flat = logits(1, B * 40 + head + 3, seed=seed)[0]
        return flat[head:].as_strided((B, 37), (40, 1)), torch.empty(B, 37)

    x, y = rows(5, 1)
    first = st.bind(x, y, path, **SCALED[path])
    calls = []
    again = first.replay(lambda dev, grid, *args: calls.append((grid, args)), x, y)
    for B, seed in ((5, 2), (3, 3), (9, 4)):
        x2, y2 = rows(B, seed)
        assert x2.data_ptr() % 16 == x.data_ptr() % 16 and y2.data_ptr() % 16 == y.data_ptr() % 16
        again(x2, y2)
        want = st.bind(x2, y2, path, **SCALED[path])
        assert calls[-1] == (want.grid, want.words()), f"{path} B={B}: {calls[-1]} != {(want.grid, want.words())}"
        assert len(want.words()) == len(first.path.arg_kinds)


# Split at any row offset: (head, pad) place rows `head` elements into a buffer with row stride
# V + pad; the chunk grid is `align` elements wide.
SPLIT_HEAD_PAD = [(0, 0), (1, 0), (3, 0), (1, 1), (2, 5), (5, 3)]
SPLIT_SHAPES = [(1, 1), (1, 7), (4, 33), (3, 61), (2, 100)]
SPLIT_ALIGNS = [1, 2, 4, 8]
SPLIT_DTYPES = [torch.float32, torch.bfloat16]


def _split_offset_design():
    """Every (head, pad) with every shape; the group width and the dtype are chosen so that
    every pair of values of any two of the four parameters occurs in some case."""
    rows = []
    covered = set()
    for i, hp in enumerate(SPLIT_HEAD_PAD):
        for j, shape in enumerate(SPLIT_SHAPES):
            align = SPLIT_ALIGNS[(i + j) % len(SPLIT_ALIGNS)]
            new = {d: {(d, ("align", align)), (d, ("hp", hp)), (d, ("shape", shape))} - covered for d in SPLIT_DTYPES}
            dtype = max(SPLIT_DTYPES, key=lambda d: (len(new[d]), -SPLIT_DTYPES.index(d)))
            covered |= new[dtype]
            rows.append((shape, hp, align, dtype))
    return rows


SPLIT_OFFSET_CASES = _split_offset_design()


def test_split_offset_cases_cover_every_pair_of_parameters():
    values = [SPLIT_SHAPES, SPLIT_HEAD_PAD, SPLIT_ALIGNS, SPLIT_DTYPES]
    for a, b in itertools.combinations(range(4), 2):
        seen = {(case[a], case[b]) for case in SPLIT_OFFSET_CASES}
        missing = set(itertools.product(values[a], values[b])) - seen
        assert not missing, f"parameters {a} and {b}: pairs never run: {missing}"


def _offset_views(B, V, *, head, pad, seed, dtype):
    """x: (B, V) rows `head` elements into a flat buffer with row stride V + pad (pad = 0:
    contiguous rows, starting off a 16-byte boundary)."""
    flat = logits(1, (B - 1) * (V + pad) + V + head + 5, seed=seed, dtype=dtype)[0]
    return flat[head:].as_strided((B, V), (V + pad, 1))


@interpreted
@pytest.mark.parametrize(
    "B,V,head,pad,align,dtype",
    [
        pytest.param(B, V, h, p, a, d, id=f"B{B}-V{V}-h{h}-p{p}-a{a}-{dtype_id(d)}")
        for (B, V), (h, p), a, d in SPLIT_OFFSET_CASES
    ],
)
def test_split_group_aligned_chunks_at_any_row_offset(B, V, head, pad, align, dtype):
    # Chunks cut on `align`-element groups of the buffer: rows start anywhere inside a group,
    # the partial groups at both row ends go through the edge loads/stores of chunk 0, and the
    # last chunk of a row may be empty. Every element must be written once with the right
    # value, nothing outside the output window touched (run_poisoned's guards), the input kept,
    # and the output, 3 + head elements past a 16-byte boundary, is aligned unlike the input.
    x = _offset_views(B, V, head=head, pad=pad, seed=B * 1000 + V * 10 + head, dtype=dtype)
    out = run_poisoned(triton_path_runner("split", CHUNK=16, num_warps=2, align=align), x, out_offset=3 + head)
    check_softmax(out, x, what=f"split head {head} pad {pad} align {align}")


@interpreted
def test_aligned_base_view_points_at_a_group_boundary():
    flat = torch.randn(64)
    for head in range(5):
        view, h = dispatch.aligned_base(flat[head : head + 40], 4)
        assert view.data_ptr() % 16 == 0 and h == head % 4
        assert view.data_ptr() + h * 4 == flat[head:].data_ptr()


def test_rows_are_cut_into_a_power_of_two_head_and_a_short_tail():
    assert [dispatch.rows_cut(V, True) for V in (1, 7, 16, 33, 600, 1024, 1100, 2000)] == [
        (1, 0),
        (4, 16),
        (16, 0),
        (32, 16),
        (512, 128),
        (1024, 0),
        (1024, 128),
        (1024, 1024),
    ]
    assert dispatch.rows_cut(600, False) == (1024, 0) and dispatch.rows_cut(40, False, 256) == (256, 0)
    # The GPU cuts the rows it takes one a program (from V = 513), a warp per 1024 lanes or so.
    for V, warps in ((512, 4), (513, 1), (600, 1), (1100, 1), (2000, 2), (2048, 2)):
        p = dispatch.launch_params("rows", V)
        assert (p["CUT"], p["num_warps"]) == (V > 512, warps), (V, p)


def test_every_path_launches_a_power_of_two_warps_at_any_v():
    # The interpreter takes any num_warps; a GPU build only powers of two, at most 32 (1024
    # threads a block). run_path reaches every path at any V, the rows path at V = 6001 included;
    # the training kernels' row path takes rows to the cross-entropy's plain_row_max_v.
    from kernels import triton_backward

    lengths = (*range(1, 70, 7), 600, 1100, 1500, 3000, 6001, 8193, 12289, 16385, 32768, 50257, 262144)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    launches = [
        (path, V, dtype, dispatch.launch_params(path, V, dtype, B=4, sms=132))
        for path, V, dtype in itertools.product(dispatch.PATHS[1:], lengths, dtypes)
    ]
    launches += [
        (f"{op} {path}", V, dtype, triton_backward.launch_params(path, V, dtype, op=op))
        for op, path, V, dtype in itertools.product(
            ("softmax_backward", "cross_entropy"), ("row", "split", "prep", "reduce", "scale"), lengths, dtypes
        )
    ]
    for path, V, dtype, p in launches:
        warps = p.get("num_warps", 1)
        assert 1 <= warps <= 32 and warps & (warps - 1) == 0, (path, V, dtype, warps)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rows_cut_or_whole_give_the_same_bits(dtype):
    # A row of the rows path is either one block of lanes (masked past V) or a head and a tail;
    # its max and fixed-point sum combine exactly, so the bits are the same, and right.
    for B, V, rows in ((5, 7, 4), (3, 40, 2), (3, 600, 1), (2, 1100, 1)):
        x = logits(B, V, seed=V, dtype=dtype)
        whole = run_poisoned(triton_path_runner("rows", ROWS=rows, CUT=False, num_warps=2), x)
        cut = run_poisoned(triton_path_runner("rows", ROWS=rows, CUT=True, num_warps=2), x)
        check_softmax(cut, x, what=f"rows cut, V={V}")
        assert torch.equal(bits(cut), bits(whole)), f"V={V}: the cut row's bits differ from the whole row's"


def test_plan_changes_at_each_boundary():
    b = dispatch.DISPATCH_BOUNDARIES
    short, held = b["short_split_max_b"], b["short_split_max_b"] + 1
    assert st.plan(64, b["tile_max_v"]) == "tile"
    assert st.plan(64, b["tile_max_v"] + 1) == "row"
    assert st.plan(1, b["tile_max_v"] + 1) == "row", "a short batch of rows to short_split_min_v is held"
    assert st.plan(b["rows_min_b"] - 1, 600) == "tile"
    assert st.plan(b["rows_min_b"], 600) == "rows"
    assert st.plan(b["rows_min_b"], b["tile_max_v"] + 1) == "row"
    assert st.plan(held, b["row_max_v"]) == "row"
    long = b["row_max_v"] + 1
    for B in (1, b["stream_min_b"] - 1, b["stream_min_b"], 1 << 20):
        assert st.plan(B, long) == "split", "float32 long rows split at every batch size"
    assert b["tile_max_v"] < b["stream_min_v"] < b["row_max_v"] < b["stream_max_v"]
    assert b["stream_min_v"] <= b["held_min_v"] < b["held_max_v"] <= b["stream_max_v"]
    assert b["tile_max_v"] < b["short_split_min_v"] < b["row_max_v"]
    assert short < b["stream_min_b"] <= b["rows_min_b"]
    for dtype in DTYPES:
        # A short batch splits its rows past short_split_min_v; one row more keeps them whole.
        for B in (1, short):
            assert st.plan(B, b["short_split_min_v"], dtype) == "row"
            assert st.plan(B, b["short_split_min_v"] + 1, dtype) == "split"
            assert st.plan(B, b["row_max_v"], dtype) == "split"
        assert st.plan(held, b["short_split_min_v"] + 1, dtype) == "row"
    for B in (held, b["stream_min_b"], 1 << 20):
        assert st.plan(B, b["stream_min_v"] + 1) == "row", "float32 rows to row_max_v are held whole"
    for dtype in (torch.bfloat16, torch.float16):
        assert st.plan(held, b["row_max_v"], dtype) == "row"
        assert st.plan(b["stream_min_b"] - 1, b["row_max_v"], dtype) == "row"
        assert st.plan(b["stream_min_b"], b["stream_min_v"], dtype) == "row"
        assert st.plan(b["stream_min_b"], b["stream_min_v"] + 1, dtype) == "stream"
        assert st.plan(b["stream_min_b"], b["held_min_v"], dtype) == "stream"
        assert st.plan(b["stream_min_b"], b["held_min_v"] + 1, dtype) == "held"
        assert st.plan(b["stream_min_b"] - 1, b["held_min_v"] + 1, dtype) == "row"
        assert st.plan(b["stream_min_b"], b["held_max_v"], dtype) == "held"
        past_held = "stream" if b["held_max_v"] < b["stream_max_v"] else "held_split"
        assert st.plan(b["stream_min_b"], b["held_max_v"] + 1, dtype) == past_held
        assert st.plan(b["stream_min_b"], b["row_max_v"], dtype) == "held"
        assert st.plan(1, long, dtype) == "split"
        assert st.plan(b["stream_min_b"] - 1, long, dtype) == "split"
        assert st.plan(b["stream_min_b"], long, dtype) == ("held" if long <= b["held_max_v"] else "stream")
        assert st.plan(b["stream_min_b"], b["stream_max_v"], dtype) == (
            "held" if b["stream_max_v"] <= b["held_max_v"] else "stream"
        )
        assert st.plan(b["stream_min_b"], b["stream_max_v"] + 1, dtype) == "held_split"
        assert st.plan(b["stream_min_b"] - 1, b["stream_max_v"] + 1, dtype) == "split"
        assert st.plan(1 << 20, 262144, dtype) == "held_split", "rows too long for L2 split, each chunk held"
        assert st.plan(b["stream_min_b"] - 1, 262144, dtype) == "split", "a shorter batch keeps its chunks in registers"
    for B, V in LAB_SHAPES:
        assert st.plan(B, V, torch.float32) == "tile", "the lab shapes must run the autotuned kernel"
    assert SOFTMAX_KERNELS["triton"].plan is not None
    assert (
        {
            st.plan(B, V, dtype)
            for B in (1, b["rows_min_b"])
            for V in (1, b["tile_max_v"] + 1, b["held_min_v"], b["held_max_v"], long, b["stream_max_v"] + 1)
            for dtype in (torch.float32, torch.bfloat16)
        }
        == set(SOFTMAX_KERNELS["triton"].paths)
        == set(dispatch.PATHS)
    )
    for dtype in DTYPES:
        batches = (1, b["stream_min_b"], b["rows_min_b"])
        lengths = (1, 3000, b["held_min_v"], b["held_max_v"], long, b["stream_max_v"] + 1)
        planned = {st.plan(B, V, dtype) for B in batches for V in lengths}
        assert planned == set(dispatch.paths_for(dtype)), dtype


def test_remembered_launches_are_keyed_wherever_the_plan_turns_on_b():
    # A remembered common call is reused for batches of the same class (triton_launch.batch_class):
    # on either side of a B threshold where the plan changes path, the classes must differ.
    b = dispatch.DISPATCH_BOUNDARIES
    vs = {v + d for v in b.values() for d in (-1, 0, 1) if v > 1} | {600, 32000, 50257, 262144}
    turns = 0
    for dtype in DTYPES:
        for B in (b["rows_min_b"], b["stream_min_b"], b["short_split_max_b"] + 1):
            for V in sorted(vs):
                if st.plan(B - 1, V, dtype) != st.plan(B, V, dtype):
                    turns += 1
                    assert triton_launch.batch_class(B - 1, V, dtype, 0) != triton_launch.batch_class(B, V, dtype, 0)
    assert turns >= 14, "the boundaries' neighbourhood holds every B switch of the plan"


def test_plan_accepts_scaled_boundaries():
    small = {"tile_max_v": 8, "rows_min_b": 4, "stream_min_v": 16, "row_max_v": 32}
    small |= {"stream_max_v": 40, "stream_min_b": 3, "short_split_min_v": 24, "short_split_max_b": 1}
    small |= {"held_min_v": 24, "held_max_v": 32}
    assert [st.plan(2, v, boundaries=small) for v in (8, 9, 32, 33)] == ["tile", "row", "row", "split"]
    assert [st.plan(1, v, boundaries=small) for v in (9, 24, 25, 33)] == ["row", "row", "split", "split"]
    assert st.plan(4, 8, boundaries=small) == "rows"
    bf16 = [st.plan(3, v, torch.bfloat16, boundaries=small) for v in (16, 17, 24, 25, 32, 33, 40, 41)]
    assert bf16 == ["row", "stream", "stream", "held", "held", "stream", "stream", "held_split"]
    assert [st.plan(2, v, torch.bfloat16, boundaries=small) for v in (17, 33, 41)] == ["row", "split", "split"]
    assert st.plan(3, 33, torch.float32, boundaries=small) == "split"


H200_SMS = 132


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_split_chunks_shrink_for_short_batches(dtype):
    # A short batch halves the chunks until the launch has SPLIT_FILL programs per SM, never
    # below SPLIT_MIN_CHUNK; a batch that fills the GPU keeps SPLIT_PARAMS.
    b = dispatch.DISPATCH_BOUNDARIES
    full = dispatch.SPLIT_PARAMS
    assert st.launch_params("split", 262144, dtype) == full
    for V in (b["row_max_v"] + 1, 50257, 128256, 151936, 200064, 202048, 262144, 1000003):
        for B in (1, 2, 8, 64, 1023):
            p = st.launch_params("split", V, dtype, B=B, sms=H200_SMS)
            programs = B * -(-V // p["CHUNK"])
            assert dispatch.SPLIT_MIN_CHUNK <= p["CHUNK"] <= full["CHUNK"], p
            assert programs >= dispatch.SPLIT_FILL * H200_SMS or p["CHUNK"] == dispatch.SPLIT_MIN_CHUNK, (B, V, p)
            if p["CHUNK"] < full["CHUNK"]:  # no larger chunk would have filled the GPU
                assert B * -(-V // (2 * p["CHUNK"])) < dispatch.SPLIT_FILL * H200_SMS, (B, V, p)
            assert {k: v for k, v in p.items() if k != "CHUNK"} == {k: v for k, v in full.items() if k != "CHUNK"}
            assert p["CHUNK"] // (32 * p["num_warps"]) >= 16 // torch.tensor([], dtype=dtype).element_size(), p
        assert st.launch_params("split", V, dtype, B=4096, sms=H200_SMS) == full
    # At the fill threshold (B * cdiv(V, CHUNK) == SPLIT_FILL * SMs) the full chunk fills the
    # GPU and stays; a chunk's worth less of each row shrinks it.
    target = dispatch.SPLIT_FILL * H200_SMS
    for B in (1, 2, 4):
        V = full["CHUNK"] * target // B
        assert st.launch_params("split", V, dtype, B=B, sms=H200_SMS) == full, (B, V)
        assert st.launch_params("split", V - full["CHUNK"], dtype, B=B, sms=H200_SMS)["CHUNK"] < full["CHUNK"], B
    # Decode at today's vocabularies covers the GPU (one row of 262144: 128 programs on 132 SMs).
    for V in (262144, 1000003):
        assert -(-V // st.launch_params("split", V, dtype, B=1, sms=H200_SMS)["CHUNK"]) >= 0.95 * H200_SMS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_held_split_chunks_cover_a_row_evenly_in_whole_tiles(dtype):
    # held_split's chunk: whole tiles (at most three bits set in their count: the buffer's
    # parts), at most 64 KB, as many programs a row as the largest chunk would take at any head,
    # shared so evenly that the row wastes at most an eighth and a tile a program; short
    # batches halve the chunk as split's do. A chunk of part tiles is refused.
    es = dtype.itemsize
    a = 16 // es
    entry = triton_launch.PATH_TABLE["held_split"]
    for V in (49153, 50257, 65536, 65537, 128256, 200064, 262144, 262145, 1000003):
        for B in (None, 1, 2, 64, 1024, 4096):
            p = st.launch_params("held_split", V, dtype, B=B, sms=None if B is None else H200_SMS)
            tile = a * 32 * p["num_warps"]
            chunk, tiles = p["CHUNK"], p["CHUNK"] // tile
            assert chunk % tile == 0 and tiles.bit_count() <= 3 and chunk * es <= 65536, (V, B, p)
            largest = 65536 // es
            if B is not None:
                while largest > tile and B * -(-V // largest) < dispatch.SPLIT_FILL * H200_SMS:
                    largest //= 2
            most = -(-(V + a - 1) // largest)
            for head in range(a):
                P = entry.geometry(p, V, V, V, es, None, head, head)["P"]
                assert P == -(-(V + head) // chunk) <= most, (V, B, head, p)
            assert most * chunk <= (V + a - 1) * 9 // 8 + most * tile, (V, B, p)
    with pytest.raises(ValueError, match="multiple of its tile"):
        entry.geometry({"CHUNK": 3000, "num_warps": 8}, 65536, 65536, 65536, es, None, 0, 0)
    with pytest.raises(ValueError, match="at most three bits"):
        entry.geometry({"CHUNK": 15 * a * 32 * 8, "num_warps": 8}, 65536, 65536, 65536, es, None, 0, 0)


# ------------------------------------------------------------------ public softmax() on CPU


@interpreted
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("B,V", [(1, 1), (3, 7), (8, 600), (2, 2049), (2, 5000)])
def test_public_softmax(B, V, dtype):
    x = logits(B, V, seed=B + V, dtype=dtype)
    out = run_poisoned(SOFTMAX_KERNELS["triton"], x)
    what = f"triton ({B}, {V}) via {st.plan(B, V, dtype)}"
    check_softmax(out, x, what=what)


def test_a_path_that_cannot_run_takes_its_substitute_and_naming_it_is_refused():
    # held and held_split need cp.async (sm_80 on) and are Gluon kernels: softmax() takes stream
    # and split for their rows under the interpreter and on older GPUs; every other path runs
    # everywhere.
    for path in dispatch.PATHS:
        want = {"held": "stream", "held_split": "split"}.get(path, path)
        assert dispatch.runnable_path(path, None) == dispatch.runnable_path(path, 7) == want, path
        assert dispatch.runnable_path(path, 8) == dispatch.runnable_path(path, 9) == path, path
    if dispatch.INTERPRET:
        with pytest.raises(ValueError, match="held path cannot run under Triton's interpreter"):
            st.run_path(logits(2, 40, seed=1, dtype=torch.bfloat16), "held")
        with pytest.raises(ValueError, match="held_split path cannot run under Triton's interpreter"):
            st.run_path(logits(2, 40, seed=1, dtype=torch.bfloat16), "held_split")


def test_held_buffer_is_the_row_in_whole_tiles_in_at_most_three_parts():
    # Shared memory is allocated in powers of two: held_block rounds V up to whole tiles, then to
    # the least count of tiles with at most three bits set, which the kernel allocates as those
    # powers of two (_held_part, largest first); past HELD_MAX_BYTES it refuses the row.
    part = triton_kernels._held_part.fn  # a constexpr function: the plain Python inside
    for tile, es in ((4096, 2), (2048, 2), (2048, 4)):
        cap = dispatch.held_longest_row(es)
        for V in range(1, cap + 1, 7 if tile == 2048 else 1):
            block = dispatch.held_block(V, tile, es)
            n = block // tile
            assert block % tile == 0 and block >= V and n.bit_count() <= 3, (V, tile, block)
            least = -(-V // tile)
            assert all(m.bit_count() > 3 for m in range(least, n)), f"V = {V}: {block} is not the least buffer"
            parts = [part(block, tile, i) for i in range(4)]
            assert sum(parts) == block and parts[3] == 0, (V, parts)
            assert all(p & (p - 1) == 0 and p % tile == 0 for p in parts if p), (V, parts)
            assert parts == sorted(parts, reverse=True), parts
        with pytest.raises(ValueError, match=f"held path holds rows of at most {cap} elements"):
            dispatch.held_block(cap + 1, tile, es)
    # A bf16 row of 50257 in 8 + 4 + 1 tiles of 4096: 104 KB, two programs an SM (228 KB).
    assert dispatch.held_block(50257, 4096, 2) == 53248
    assert [part(53248, 4096, i) for i in range(3)] == [32768, 16384, 4096]
    assert dispatch.held_block(32000, 4096, 2) == 32768


@interpreted
def test_empty_batch_returns_without_launch():
    before = triton_launch.launch_count()
    for V in (5, 600, 40000):
        x = torch.empty(0, V)
        y = st.softmax(x)
        assert y.shape == (0, V) and y.dtype == x.dtype
        for path in dispatch.PATHS:
            assert st.run_path(x, path).shape == (0, V)
    assert triton_launch.launch_count() == before, "a kernel was launched for B = 0"
    st.run_path(logits(1, 5, seed=0), "tile")
    assert triton_launch.launch_count() == before + 1, "launch_count counts the launches it should have seen"


@interpreted
@pytest.mark.parametrize("layout", layouts(torch.float32))
def test_every_layout_through_the_public_entry(layout):
    x = logits(4, 250, seed=21, layout=layout)
    out = run_poisoned(SOFTMAX_KERNELS["triton"], x)
    check_softmax(out, x, what=layout)
    assert torch.equal(bits(out), bits(st.softmax(x.contiguous()))), f"{layout}: bits differ from the contiguous input"


@interpreted
def test_output_buffer_is_used_and_checked():
    x = logits(3, 20, seed=2)
    out = torch.full_like(x, float("nan"))
    assert st.softmax(x, out=out) is out
    with pytest.raises(ValueError, match="out"):
        st.softmax(x, out=torch.empty(3, 21))
    with pytest.raises(ValueError, match="out"):
        st.softmax(x, out=torch.empty(3, 20, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        st.softmax(x, out=torch.empty(20, 3).t())
    with pytest.raises(TypeError, match="out"):
        st.softmax(x, out=np.empty((3, 20), np.float32))


@pytest.mark.parametrize(
    "bad,exc,msg",
    [
        (lambda: torch.randn(5), ValueError, "2-D"),
        (lambda: torch.randn(2, 3, 4), ValueError, "2-D"),
        (lambda: torch.randn(2, 0), ValueError, "V = 0"),
        (lambda: torch.randn(2, 3, dtype=torch.float64), TypeError, "float64"),
        (lambda: torch.ones(2, 3, dtype=torch.int32), TypeError, "int32"),
        (lambda: np.ones((2, 3), np.float32), TypeError, "torch.Tensor"),
    ],
)
def test_bad_inputs_raise_clear_errors(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        st.softmax(bad())


@pytest.mark.skipif(dispatch.INTERPRET, reason="only the compiled module insists on CUDA tensors")
def test_cpu_tensor_rejected_without_interpreter():
    with pytest.raises(ValueError, match="cuda"):
        st.softmax(torch.randn(2, 3))


def test_interpreter_tests_in_a_subprocess(pytestconfig):
    """On a machine whose test process runs the compiled module, run the interpreter tests in a
    child process that has TRITON_INTERPRET=1 from the start (the variable is read when the
    kernels are decorated, at import: this needs a fresh interpreter)."""
    if dispatch.INTERPRET:
        pytest.skip("this process is interpreted already: the tests above ran here")
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(Path(__file__)),
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        "not test_interpreter_tests_in_a_subprocess and not aot and not sm90",
        "-W",
        "ignore::RuntimeWarning",
    ]
    try:
        pytestconfig.getoption("no_reports")
        cmd.append("--no-reports")  # the parent session writes the reports, not the child
    except ValueError:
        pass
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert re.search(r"\d+ passed", proc.stdout), tail


# ------------------------------------------------------------------ ahead-of-time sm_90 builds

# A kernel's SASS as cuobjdump lists it: a row loop around a tile loop, a spill written before
# both, read back in the tile loop (0x30), written again in the row loop (0x60).
TILE_LOOP_SPILL = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   LDL R5, [R1] ;
        /*0040*/                   FADD R4, R4, R5 ;
        /*0050*/              @P0  BRA 0x30 ;
        /*0060*/                   STL [R1+0x4], R4 ;
        /*0070*/             @!P1  BRA 0x20 ;
        /*0080*/                   EXIT ;
"""


def test_a_spill_is_judged_by_its_bytes_and_where_it_is_touched():
    lines = triton_build.sass_instructions(TILE_LOOP_SPILL)
    assert [op for _, op, _ in lines][:3] == ["LDC", "STL", "LDG.E"] and len(lines) == 9
    assert triton_build.innermost_loops(lines) == [(3, 5)]  # the tile loop, not the row loop
    assert triton_build.loop_local_accesses(TILE_LOOP_SPILL) == 1
    assert triton_build.loop_local_accesses(TILE_LOOP_SPILL.replace("LDL R5, [R1]", "MOV R5, R6")) == 0
    capped = {"maxnreg": 80, "stack": 16, "local": 0, "spill_bytes": 16, "loop_local": 0}
    assert triton_build.spill_problem(capped) is None
    assert "inside its innermost loops" in triton_build.spill_problem({**capped, "loop_local": 1})
    over = {**capped, "stack": dispatch.CAPPED_SPILL_BYTES + 8}
    assert "spills past" in triton_build.spill_problem(over)
    assert "spills past 0 bytes" in triton_build.spill_problem({**capped, "maxnreg": None})


@pytest.fixture(scope="session")
def sm90_builds(tmp_path_factory):
    return run_sm90_builds(tmp_path_factory.mktemp("sm90_tmp"))


def test_sm90_aot_builds_spill_within_budget_and_fit_shared_memory(sm90_builds, request):
    print()
    for r in sm90_builds:
        extra = {k: v for k, v in r.items() if k in ("BLOCK", "ROWS", "BLOCK_V", "CHUNK")}
        print(
            f"  {r['name']:<10} {json.dumps(extra):<34} warps {r['num_warps']:>2}: {r['regs']:>3} regs, "
            f"shared {r['shared']:>6} B, stack {r['stack']}, spill bytes {r['spill_bytes']}, "
            f"vector loads {r['vector_loads']}, stores {r['vector_stores']}"
        )
    tile = [r for r in sm90_builds if r["name"].startswith("tile")]
    assert len(tile) == len(store.CONFIGS)
    assert {r["name"].split()[0] for r in sm90_builds} == set(dispatch.PATHS), "every path's kernel is built"
    try:
        record = request.getfixturevalue("record_manifest")
    except pytest.FixtureLookupError:
        record = None
    if record is not None:
        record(
            "triton_sm90_aot",
            max_registers=max(r["regs"] for r in sm90_builds),
            max_spill_bytes=max(r["spill_bytes"] + r["local"] for r in sm90_builds),
            max_shared_bytes=max(r["shared"] for r in sm90_builds),
        )
    for r in sm90_builds:
        assert triton_build.spill_problem(r) is None, f"{triton_build.spill_problem(r)}: {r}"
        assert r["shared"] <= SM90_SHARED_LIMIT, r
        assert r["regs"] <= 255, r
        per_thread = r.get("BLOCK", r.get("CHUNK", r.get("ROWS", 1) * r.get("BLOCK_V", 1))) // (32 * r["num_warps"])
        if r["ALIGN"] > 1 and per_thread >= r["ALIGN"]:
            # (held's loads are cp.async copies of whole 16-byte groups)
            vector_loads = r["vector_loads"] or r["cp_async_bytes"] == 16
            assert vector_loads, f"{r['name']} with ALIGN > 1 should issue vector loads: {r}"
            assert r["vector_stores"], f"{r['name']} with ALIGN > 1 should issue vector stores: {r}"
        if r["name"].split()[0] in ("split", "held_split"):
            assert r["tag_read_first"], f"the launch tag is read behind a barrier: {r}"


# ------------------------------------------------------------------ stored choice and staleness

GPU = "Test GPU 9000"
KEY_600 = store.choice_key(600, torch.float32)


def test_stored_choice_round_trip(tmp_path):
    path = tmp_path / "tune.json"
    assert store.stored_choice(600, torch.float32, GPU, path=path) is None  # no file yet
    store.write_stored({KEY_600: {"BLOCK": 512, "num_warps": 4, "num_stages": 3}}, GPU, path=path)
    assert store.stored_choice(600, torch.float32, GPU, path=path) == {"BLOCK": 512, "num_warps": 4, "num_stages": 3}
    assert store.stored_choice(600, torch.bfloat16, GPU, path=path) is None
    # A choice serves its bucket of row lengths (513 ... 1024), not one V.
    assert KEY_600 == store.choice_key(513, torch.float32) == store.choice_key(1024, torch.float32) == "1024|float32"
    assert store.stored_choice(513, torch.float32, GPU, path=path)["BLOCK"] == 512
    assert store.stored_choice(1025, torch.float32, GPU, path=path) is None
    assert store.stored_choice(512, torch.float32, GPU, path=path) is None
    data = json.loads(path.read_text())
    entry = data["entries"][store.fingerprint(GPU)]
    assert entry["kernel_source_sha256"] == store.kernel_source_hash()
    assert entry["configs_sha256"] == store.configs_hash()


def test_the_environment_names_the_stored_file(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.json"
    monkeypatch.setenv(store.STORED_PATH_ENV, str(path))
    assert store.stored_path() == path
    store.write_stored({KEY_600: {"BLOCK": 256, "num_warps": 2}}, GPU)
    assert path.exists()
    assert store.stored_choice(600, torch.float32, GPU)["BLOCK"] == 256
    monkeypatch.delenv(store.STORED_PATH_ENV)
    assert store.stored_path() == store.STORED_PATH


def test_measuring_again_drops_a_carried_over_note(tmp_path):
    path = tmp_path / "tune.json"
    store.write_stored({KEY_600: {"BLOCK": 1024, "num_warps": 4}}, GPU, path=path)
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    entry.update(choices_measured_with_kernel_source_sha256="0" * 64, note="carried over")
    path.write_text(json.dumps(data))
    store.write_stored({KEY_600: {"BLOCK": 512, "num_warps": 4}}, GPU, path=path)
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert not set(entry) & {"choices_measured_with_kernel_source_sha256", "note"}
    assert entry["choices"][KEY_600]["BLOCK"] == 512


def test_changed_source_configs_or_gpu_invalidate_the_stored_choice(tmp_path):
    path = tmp_path / "tune.json"
    store.write_stored({KEY_600: {"BLOCK": 1024, "num_warps": 8}}, GPU, path=path)
    assert store.stored_choice(600, torch.float32, GPU, path=path) is not None
    # Another GPU name: different fingerprint.
    assert store.stored_choice(600, torch.float32, "Other GPU", path=path) is None
    # Edited kernel: the hash of the source differs.
    assert store.stored_choice(600, torch.float32, GPU, path=path, source_hash="0" * 64) is None
    # A different config list (one config dropped) changes the config hash ...
    assert store.configs_hash(store.CONFIGS[:-1]) != store.configs_hash()
    assert (
        store.stored_choice(600, torch.float32, GPU, path=path, config_hash=store.configs_hash(store.CONFIGS[:-1]))
        is None
    )
    # ... and the hash used when none is passed is that of CONFIGS.
    assert store.configs_hash() == store.configs_hash(list(store.CONFIGS))


_KEYED_KERNEL = """
import triton
import triton.language as tl

SCALE = tl.constexpr({scale})


@triton.jit
def _helper(x):
    return x + {add}


@triton.jit
def kernel(X, N: tl.constexpr):
    {first}
    offs = tl.arange(0,{space}N)
    tl.store(X + offs, _helper(tl.load(X + offs)) * SCALE)
"""


def _key_of(tmp_path, name: str, **parts) -> str:
    """The autotune key of `kernel` in a module written from _KEYED_KERNEL with `parts`."""
    import importlib.util

    path = tmp_path / f"keyed_{name}.py"
    path.write_text(_KEYED_KERNEL.format(**{"scale": 2, "add": 1, "first": "# a comment", "space": "", **parts}))
    spec = importlib.util.spec_from_file_location(f"keyed_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return store.kernel_source_hash(module.kernel)


def test_the_autotune_key_follows_what_compiles(tmp_path):
    """The stored choice is keyed on what the tile kernel compiles: a comment, a docstring or
    formatting keeps the key; a change in a jit helper it calls or a constant it reads does not."""
    base = _key_of(tmp_path, "base")
    assert _key_of(tmp_path, "docstring", first='"""A docstring."""  # another comment', space=" ") == base
    assert _key_of(tmp_path, "helper", add=2) != base
    assert _key_of(tmp_path, "constant", scale=3) != base
    assert store.kernel_source_hash(triton_kernels.JIT_KERNELS["row"]) != store.kernel_source_hash()
    assert store.kernel_source_hash() == store.kernel_source_hash(triton_kernels.JIT_KERNELS["tile"])


def test_the_autotuner_tunes_each_row_length():
    # The tile kernel's autotuner keys on V: one tuning per row length, as the stored choices
    # are kept per V bucket (a key of [] would reuse the first V's choice for every V).
    assert store.tile_autotuned.keys == ["V"]


def test_write_keeps_other_gpus_and_drops_stale_entries(tmp_path):
    path = tmp_path / "tune.json"
    store.write_stored({KEY_600: {"BLOCK": 256, "num_warps": 2}}, "Other GPU", path=path)
    data = json.loads(path.read_text())
    # A stale entry for GPU (old kernel source) that the next write must replace.
    data["entries"]["stale"] = {"gpu": GPU, "choices": {KEY_600: {"BLOCK": 2048, "num_warps": 8}}}
    path.write_text(json.dumps(data))
    store.write_stored({KEY_600: {"BLOCK": 512, "num_warps": 4}}, GPU, path=path)
    entries = json.loads(path.read_text())["entries"]
    assert "stale" not in entries
    assert {e["gpu"] for e in entries.values()} == {GPU, "Other GPU"}
    assert store.stored_choice(600, torch.float32, "Other GPU", path=path)["BLOCK"] == 256
    assert store.stored_choice(600, torch.float32, GPU, path=path)["BLOCK"] == 512


def test_unknown_file_format_is_ignored(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(
        json.dumps(
            {
                "format": 999,
                "entries": {store.fingerprint(GPU): {"gpu": GPU, "choices": {KEY_600: {"BLOCK": 256, "num_warps": 2}}}},
            }
        )
    )
    assert store.stored_choice(600, torch.float32, GPU, path=path) is None


def test_a_tile_config_tuned_here_is_told_apart_from_a_stored_one(tmp_path, monkeypatch):
    # As on a GPU without a stored choice: the first call tunes, and the benchmark notes the
    # config as tuned at first use; once a choice is stored for the GPU, that one is used and
    # nothing is noted.
    monkeypatch.setenv(store.STORED_PATH_ENV, str(tmp_path / "tune.json"))
    monkeypatch.setattr(store, "INTERPRET", False)
    monkeypatch.setattr(store, "device_info", lambda dev: (GPU, 132, 9))
    monkeypatch.setattr(store, "cuda_device_index", lambda device: 0)
    monkeypatch.setattr(store.tile_autotuned, "best_config", store.CONFIGS[-1], raising=False)
    store.clear_memo()
    try:
        assert store.tuned_at_first_use(600) is None  # nothing tuned yet
        store.record_tuned(0, 600, torch.float32)
        tuned = store.config_dict(store.CONFIGS[-1])
        assert store.tuned_at_first_use(600) == tuned == store.autotune_picked(600)
        assert store.tuned_at_first_use(600, torch.bfloat16) is None
        stored = {"BLOCK": 512, "num_warps": 4, "num_stages": 3}
        assert stored != tuned
        store.write_stored({KEY_600: stored}, GPU)
        assert store.tuned_at_first_use(600) is None
        assert store.autotune_picked(600) == stored
    finally:
        store.forget_tuned_here(0)
        store.clear_memo()


@interpreted
def test_interpreter_uses_fixed_config():
    assert store.autotune_picked(600) == dict(store.INTERPRETER_CONFIG, num_stages=3)
    assert store.INTERPRETER_CONFIG in [{"BLOCK": c.kwargs["BLOCK"], "num_warps": c.num_warps} for c in store.CONFIGS]


def tile_buckets() -> list[int]:
    top = store.v_bucket(dispatch.DISPATCH_BOUNDARIES["tile_max_v"])
    return [b for b in (2**k for k in range(top.bit_length())) if store.v_bucket(1) <= b <= top]


def test_tune_shapes_reach_every_bucket_of_the_tile_path():
    """The offline tuner times every bucket of row lengths the tile path takes, at shapes the
    dispatch sends down the tile path, so no V of that path autotunes on a tuned GPU."""
    assert sorted({store.v_bucket(V) for _, V in store.TUNE_SHAPES}) == tile_buckets()
    assert all(st.plan(B, V) == "tile" for B, V in store.TUNE_SHAPES)
    assert set(LAB_SHAPES) <= set(store.TUNE_SHAPES)
    assert [store.v_bucket(V) for V in (1, 16, 17, 600, 1024, 1025)] == [16, 16, 32, 1024, 1024, 2048]


def test_repo_autotune_file_matches_the_current_tile_kernel():
    """The stored choices in kernels/triton_autotune.json stay valid only while the tile kernel
    and its config list are unchanged: every entry's fingerprint must still be recomputable, and
    each holds a choice for every bucket of the tile path in every dtype."""
    if not store.STORED_PATH.exists():
        pytest.skip("no stored autotune file in the repo")
    entries = store.read_stored(store.STORED_PATH).get("entries", {})
    assert entries, "the stored file holds no entries"
    for key, entry in entries.items():
        assert entry["kernel_source_sha256"] == store.kernel_source_hash(), "what the tile kernel compiles changed"
        assert entry["configs_sha256"] == store.configs_hash(), "tile config list changed"
        assert key == store.fingerprint(entry["gpu"])
        for bucket in tile_buckets():
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                assert store.stored_choice(bucket, dtype, entry["gpu"], path=store.STORED_PATH) is not None, (
                    bucket,
                    dtype,
                )


def test_the_schema_lists_the_autotune_configs():
    """reports/manifest.schema.json enumerates the values autotune_picked may hold: the BLOCKs and
    warp counts of CONFIGS (or null before any GPU run), checked here rather than copied."""
    schema = json.loads((REPO / "reports" / "manifest.schema.json").read_text())
    picked = schema["properties"]["softmax_kernels"]["properties"][dispatch.KERNEL_NAME]["properties"][
        "autotune_picked"
    ]
    enums = {key: picked["properties"][key]["enum"] for key in ("BLOCK", "num_warps")}
    assert enums["BLOCK"] == [None, *sorted({c.kwargs["BLOCK"] for c in store.CONFIGS})]
    assert enums["num_warps"] == [None, *sorted({c.num_warps for c in store.CONFIGS})]


# ------------------------------------------------------------------ guards and helpers


@interpreted
def test_row_strides_past_32_bits_are_a_value_error():
    # The kernels index with 32-bit row strides: a wider one is refused, not wrapped around.
    x = torch.randn(1, 8).as_strided((1, 8), (2**31, 1))
    with pytest.raises(ValueError, match="32 bits"):
        st.softmax(x)
    out = torch.empty(1, 8).as_strided((1, 8), (2**31, 1))
    with pytest.raises(ValueError, match="32 bits"):
        st.softmax(torch.randn(1, 8), out=out)
    x = torch.randn(1, 8).as_strided((1, 8), (2**31 - 1, 1))  # the widest that fits
    check_softmax(st.softmax(x), x, what="row stride 2^31 - 1")


def test_split_workspaces_grow_with_the_batch():
    # A workspace first sized for a few rows grows for a larger batch at the same P: a launch
    # would otherwise write past its end (the interpreter does not notice; a GPU faults).
    P = 3
    per_row = triton_launch.SPLIT_WORDS_PER_CHUNK["softmax"] * P
    small = triton_launch.split_workspace("softmax", -1, 2, P)
    assert small.numel() >= 2 * per_row
    rows = small.numel() // per_row + 7
    assert triton_launch.split_workspace("softmax", -1, rows, P).numel() >= rows * per_row


@triton.jit
def _normalise_probe(E, H, Q, N: tl.constexpr):
    i = tl.arange(0, N)
    e = tl.load(E + i)
    hi = tl.load(H + i)
    tl.store(Q + i, triton_kernels._normalise(e, -hi, tl.div_rn(1.0, hi), tl.float32))


@interpreted
def test_normalise_rounds_the_quotient_once():
    # Every path divides through _normalise, so a change to it keeps the paths' bits equal to
    # each other: checked here against e / hi in float64 rounded once to float32.
    g = np.random.default_rng(3)
    e = g.random(4096).astype(np.float32)
    hi = (1 + 599 * g.random(4096)).astype(np.float32)
    q = torch.empty(4096)
    _normalise_probe[(1,)](torch.from_numpy(e), torch.from_numpy(hi), q, N=4096)
    want = (e.astype(np.float64) / hi.astype(np.float64)).astype(np.float32)
    wrong = int((q.numpy().view(np.int32) != want.view(np.int32)).sum())
    assert wrong == 0, f"{wrong} of 4096 quotients not rounded once"
