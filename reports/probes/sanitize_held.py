"""One launch of each kernel that holds rows or chunks in shared memory (the softmax's held and
held_split, the cross-entropy's held and held_split, the backward's held_split), for
compute-sanitizer to watch:

    compute-sanitizer --tool memcheck  python reports/probes/sanitize_held.py     # on a GPU
    compute-sanitizer --tool racecheck python reports/probes/sanitize_held.py

Shapes are small but past one chunk (several programs a row, a part tile at the row's end, a
row start off the 16-byte grid through a column slice); every result's bits are checked against
the split path's, so a run that the sanitizer passes is also a run that computed the right thing.
Exit status 1 on a mismatch.
"""

from __future__ import annotations

import sys

import torch

from kernels import softmax_triton as st
from kernels import triton_backward as tb
from kernels import triton_cross_entropy as tce


def _same(name: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    ok = bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))
    print(f"{name:<40} {'same bits' if ok else 'DIFFERENT BITS'}")
    return ok


def main() -> int:
    torch.manual_seed(0)
    dev = "cuda"
    ok = True
    # Rows of 65537 bf16: three 64 KB chunks at held_split's default, a part tile at the end.
    x = (torch.randn(4, 65537 + 3, device=dev) * 4).to(torch.bfloat16)
    for name, xs in (("aligned", x[:, :65537]), ("offset", x[:, 3:])):
        want = st.run_path(xs, "split")
        ok &= _same(f"softmax held_split {name}", st.run_path(xs, "held_split"), want)
        ok &= _same(f"softmax held_split {name} CHUNK=4096", st.run_path(xs, "held_split", CHUNK=4096), want)
    short = x[:, :20001].contiguous()
    ok &= _same("softmax held (4, 20001)", st.run_path(short, "held"), st.run_path(short, "split"))

    t = torch.randint(0, 65537, (4,), device=dev)
    t[0] = 65536  # the last entry, in the part tile
    logits = x[:, :65537].contiguous()
    want = tce.run_path(logits, t, "split")
    got = tce.run_path(logits, t, "held_split")
    ok &= _same("cross-entropy held_split loss", got.loss, want.loss)
    ok &= _same("cross-entropy held_split grad", got.grad, want.grad)
    ts = t.clamp(max=20000)
    want = tce.run_path(short, ts, "split")
    got = tce.run_path(short, ts, "held")
    ok &= _same("cross-entropy held grad (4, 20001)", got.grad, want.grad)

    y = torch.softmax(logits.float(), -1).to(torch.bfloat16)
    dy = torch.randn_like(y)
    ok &= _same("backward held_split", tb.run_path(dy, y, "held_split"), tb.run_path(dy, y, "split"))
    torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
