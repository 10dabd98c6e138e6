"""The CUDA C training kernels at size classes beside their dispatch: the loop class (rows past
every on-chip class) at other block sizes and loads in flight, and the cross-entropy's 16-bit
rows held as the forward holds them.

    python reports/probes/fused_training_variants.py --out DIR [--v 262144]      # on a GPU

Two questions from the counters (reports/profiles.md). First, the loop class (clusters of 8 CTAs
of 1024 threads, two 16-byte vectors a thread in flight per step of each pass) waited on long
scoreboard 5.8 cycles an instruction at fp32 (4096, 262144), DRAM 44 %; on an H100 the fused
cross-entropy ran there at 0.42 (bf16) and 0.65 (fp32) of its one-read-one-write floor. Its sm_90
builds (nvcc 13) hold four vectors a thread in 64 registers without spilling, at 1024 and at 512
threads (eight spill). Do more loads in flight, or smaller CTAs, move the rows faster? The
backward's loop class has the same shape and is timed beside it.

Second (answered on an H100, runs/h100-2026-12-07: adopted as kernels.cuda_training_plans's
_CE_LONG), the cross-entropy's rows past 16384 held as the forward holds them, 64 packed elements
a thread in 16-bit storage. Third, rows of 262144 held on chip the same way, which take the loop
class (0.69 / 0.73 of the floor in bf16 / float32 on an H100, runs/h100-2026-12-08): clusters of
8 CTAs of 512 threads x 64 packed elements (sm_90 build, nvcc 13: 64 registers, no spill) or of
1024 threads x 32 float32 elements (64 registers, 44 bytes spilled: the float32 long classes'
allowance). Do they lead the loop? Likewise the softmax backward's 16-bit rows of 262144 (0.75 of
its floor on that H100): 8 CTAs of 1024 threads x 32 packed elements of y and of dy (62
registers, no spill); and its 16-bit rows of 50257 (0.75 there, on 4 CTAs of 512 threads x 32,
a class of 65536 it fills to 77 %), on 7 CTAs of 256 x 32 as the forward's and the
cross-entropy's seven-CTA classes hold them (63 registers, no spill).

Per shape: the op as dispatched, then each variant, in the graph clock of
probes/triton_rows_sweep.py, as a fraction of the op's floor (cross-entropy one read and one
write, the backward two reads and one write) against this GPU's copy; every variant's bits
against the dispatch's (the sums are order-free: any class gives the same bits).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from kernels import cuda_training as ct
from kernels import cuda_training_plans as plans
from kernels import softmax_cuda

sys.path.insert(0, str(Path(__file__).parent))
from bwd_held_row import backward_case  # noqa: E402
from triton_rows_sweep import bits, edge_logits, floor_rows, shapes_main  # noqa: E402

LOOP_SHAPES = [(4096, 262144, dt) for dt in (torch.bfloat16, torch.float32)]
LOOP_VARIANTS = ((1024, 2), (1024, 4), (512, 4))  # (threads, vectors a step); the dispatch's is named
# Rows held on chip past each op's classes: per op, per (dtype, V), (threads, elements, cluster),
# packed in 16-bit storage (held_class puts each in its op's table).
ON_CHIP = {
    "ce": {(torch.bfloat16, 262144): ((512, 64, 8),), (torch.float32, 262144): ((1024, 32, 8),)},
    "bwd": {(torch.bfloat16, 262144): ((1024, 32, 8),), (torch.bfloat16, 50257): ((256, 32, 7),)},
}
# LOOP_SHAPES: N = 4096, the loop's question and the on-chip ones at once
SHAPES = [*((1024, V, dt) for dt, V in ON_CHIP["ce"]), (4096, 50257, torch.bfloat16), *LOOP_SHAPES]


@contextmanager
def plans_set(**values):
    """kernels.cuda_training_plans with `values` for its globals inside the block, its kernels
    built and launched afresh (the launchers are keyed by kernel name, which does not say, for
    one, the loop's vectors a step)."""
    kept = {name: getattr(plans, name) for name in values}
    for name, value in values.items():
        setattr(plans, name, value)
    softmax_cuda._launchers.clear()
    ct._dispatch.clear()
    try:
        yield
    finally:
        for name, value in kept.items():
            setattr(plans, name, value)
        softmax_cuda._launchers.clear()
        ct._dispatch.clear()


def loop_launch(threads: int, vectors: int):
    """The loop class built and launched at `threads` x `vectors` inside the block."""
    return plans_set(LOOP_SHAPE={4: (threads, vectors), 2: (threads, vectors)})


def held_class(op: str, width: int, threads: int, elems: int, cluster: int):
    """`op` dispatching a class of `threads` x `elems` x `cluster` (packed for 16-bit storage)
    for the rows of storage `width` bytes it holds, inside the block. The cross-entropy takes its
    rows past 16384 from _CE_LONG, where the class goes first; the backward from the table both
    ops share, where it goes in its place (for the rows no shorter class holds)."""
    new = (threads * elems * cluster, threads, elems, cluster, width == 2)
    if op == "ce":
        return plans_set(_CE_LONG={**plans._CE_LONG, width: (new, *plans._CE_LONG[width])})
    warpvec, rows = plans._TABLES[width]
    rows = tuple(sorted((*rows, new), key=lambda r: r[0]))
    return plans_set(_TABLES={**plans._TABLES, width: (warpvec, rows)})


def measure(N: int, V: int, dtype: torch.dtype, copy: float) -> list[dict]:
    x = edge_logits(N, V, dtype)
    t = torch.randint(0, V, (N,), device="cuda", generator=torch.Generator(device="cuda").manual_seed(V))
    want = ct.cross_entropy_fused(x, t, reduction="none")
    dy, y, _, _, _ = backward_case(N, V, dtype)
    dx_want = ct.softmax_backward_fused(y, dy)
    # The main kernels' launches alone, on buffers made once (the prologue's params of a plain
    # "none" reduction: scale 1, V classes of weight 1).
    params = torch.tensor([1.0, V, 1.0, N], device="cuda")
    grad, dx = torch.empty_like(x), torch.empty_like(y)
    loss, lse = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
    dev = x.get_device()

    def ce(e):
        e.launcher(
            dev, e.grid(N, None), x.data_ptr(), x.stride(0), grad.data_ptr(), grad.stride(0), t.data_ptr(),
            N, V, -100, 0, params.data_ptr(), 0.0, loss.data_ptr(), lse.data_ptr(),
        )  # fmt: skip

    def bwd(e):
        e.launcher(dev, e.grid(N, None), y.data_ptr(), y.stride(0), dy.data_ptr(), dy.stride(0), dx.data_ptr(), N, V)

    ops = {  # rows held on chip
        op: {f"{op} dispatch": nullcontext()}
        | {f"{op} {t} x {e} x {c}": held_class(op, x.element_size(), t, e, c) for t, e, c in classes[(dtype, V)]}
        for op, classes in ON_CHIP.items()
        if (dtype, V) in classes
    }
    if (N, V, dtype) in LOOP_SHAPES:  # the loop class of both ops
        shape = plans.LOOP_SHAPE[x.element_size()]
        runs = {f"loop {th} x {ve}" + (" (dispatch)" if (th, ve) == shape else ""): (th, ve)
                for th, ve in LOOP_VARIANTS}  # fmt: skip
        for op in ("ce", "bwd"):
            ops.setdefault(op, {}).update({f"{op} {name}": loop_launch(*tv) for name, tv in runs.items()})
    rows = []
    for op, cases in ops.items():
        variants, same = {}, {}
        for name, context in cases.items():
            with context:
                if op == "ce":
                    got = ct.cross_entropy_fused(x, t, reduction="none")
                    same[name] = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want, strict=True))
                else:
                    same[name] = bool(torch.equal(bits(ct.softmax_backward_fused(y, dy)), bits(dx_want)))
                entry = ct._resolve(op, op, dev, V, dtype, None)  # the call's class, with its build
                print(f"{name}: {entry.size_class.describe()}", flush=True)
            variants[name] = (lambda e=entry: ce(e)) if op == "ce" else (lambda e=entry: bwd(e))
        rows += floor_rows(variants, same, N, V, dtype, copy, passes=2 if op == "ce" else 3)
    return rows


if __name__ == "__main__":
    sys.exit(shapes_main("fused_training_variants", measure, SHAPES, __doc__))
