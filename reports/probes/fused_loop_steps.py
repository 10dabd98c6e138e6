"""The CUDA C training kernels' loop class (rows past every on-chip class) at other block sizes
and loads in flight.

    python reports/probes/fused_loop_steps.py --out DIR [--v 262144]      # on a GPU

The question (reports/profiles.md, "Counters of the training kernels that miss"): the fused
cross-entropy's loop class (clusters of 8 CTAs of 1024 threads, two 16-byte vectors a thread in
flight per step of each pass) waited on long scoreboard 5.8 cycles an instruction at fp32
(4096, 262144), DRAM 44 %; on an H100 it ran at 0.42 (bf16) and 0.65 (fp32) of the one-read-
one-write floor. The backward's loop class has the same shape. Its sm_90 builds (nvcc 13) hold
four vectors a thread in 64 registers without spilling, at 1024 and at 512 threads (eight spill).
Do more loads in flight, or smaller CTAs (two an SM), move the rows faster?

Per shape: each op as dispatched, then its loop class at each (threads, vectors a step) of
VARIANTS (LOOP_THREADS and LOOP_VECTORS of kernels/cuda_training_plans.py, set for the build),
in the graph clock of probes/triton_rows_sweep.py, as a fraction of the op's floor (cross-entropy
one read and one write, the backward two reads and one write) against this GPU's copy; every
variant's bits against the dispatch's (the sums are order-free: any class gives the same bits).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from kernels import cuda_training as ct
from kernels import cuda_training_plans as plans
from kernels import softmax_cuda

sys.path.insert(0, str(Path(__file__).parent))
from bwd_held_row import backward_case  # noqa: E402
from triton_rows_sweep import bits, edge_logits, floor_rows, shapes_main  # noqa: E402

SHAPES = [
    *((4096, V, dt) for dt in (torch.bfloat16, torch.float32) for V in (151936, 262144)),
    (1024, 262144, torch.bfloat16),
]
VARIANTS = ((1024, 4), (512, 4), (512, 2))  # (threads, vectors a step); the dispatch is (1024, 2)


@contextmanager
def loop_launch(threads: int, vectors: int):
    """The loop class built and launched at `threads` x `vectors` inside the block."""
    kept = plans.LOOP_THREADS, plans.LOOP_VECTORS
    plans.LOOP_THREADS, plans.LOOP_VECTORS = threads, vectors
    softmax_cuda._launchers.clear()  # keyed by kernel name, which does not say the vectors
    ct._dispatch.clear()
    try:
        yield
    finally:
        plans.LOOP_THREADS, plans.LOOP_VECTORS = kept
        softmax_cuda._launchers.clear()
        ct._dispatch.clear()


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

    rows = []
    for op, what in (("ce", "fused cross-entropy"), ("bwd", "fused softmax backward")):
        variants, same = {}, {}
        for threads, vectors in ((1024, 2), *VARIANTS):
            name = f"{op} loop {threads} x {vectors}" + (" (dispatch)" if (threads, vectors) == (1024, 2) else "")
            with loop_launch(threads, vectors):
                size_class = plans.loop_class(op)
                if op == "ce":
                    got = ct.cross_entropy_fused(x, t, reduction="none", size_class=size_class)
                    same[name] = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want, strict=True))
                else:
                    same[name] = bool(torch.equal(bits(ct.softmax_backward_fused(y, dy, size_class=size_class)),
                                                  bits(dx_want)))  # fmt: skip
                entry = ct._resolve(op, what, dev, V, dtype, size_class)  # keeps this build's launcher
            variants[name] = (lambda e=entry: ce(e)) if op == "ce" else (lambda e=entry: bwd(e))
        rows += floor_rows(variants, same, N, V, dtype, copy, passes=2 if op == "ce" else 3)
    return rows


if __name__ == "__main__":
    sys.exit(shapes_main("fused_loop_steps", measure, SHAPES, __doc__))
