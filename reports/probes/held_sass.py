"""The held kernels' (and the weighted stream's) instructions per element, pass by pass, from
their sm_90 SASS (no GPU).

    python reports/probes/held_sass.py [V]                  # default V = 32000, bf16
    python reports/probes/held_sass.py --stream [V ...]     # the weighted stream's tile loops

The second form takes the cross-entropy's stream kernel (class weights and smoothing, the
dispatch's launch) in bf16 and float32 at each V (default 50257 65536): its passes are loops
over tiles, so each loop body (a backward branch's span) is what a thread issues for one tile,
given per element of the tile a thread takes, with its global loads (LDG), stores (STG),
exponentials (MUFU) and float-to-integer conversions (F2I).

The held kernels (a 16-bit row whole in shared memory: the softmax's and the cross-entropy's)
are unrolled over the row's tiles, so the SASS between two block-wide barriers is what a thread
issues for its share of one pass. Per such stretch of 60 instructions or more: instructions per
element of the buffer (a thread's count over the buffer's elements it holds: held_block's, V
rounded up) and the most frequent opcodes. On an
H200 a bf16 row at the speed of copy gives a SM about 4.6 elements a cycle; four schedulers issue
four warp instructions a cycle, so a kernel of about 28 instructions an element cannot keep up
whatever its memory does (reports/profiles.md, "Held kernels: fewer instructions an element").
"""

from __future__ import annotations

import collections
import sys
import tempfile

import torch

from kernels import softmax_triton as st
from kernels import triton_backward as tb
from kernels.spec import dtype_name
from kernels.triton_build import compile_path, innermost_loops, sass_instructions, sass_listing
from kernels.triton_dispatch import held_block
from kernels.triton_launch import TABLES


def sass(op: str, path: str, p: dict, V: int, dtype: str) -> str:
    """The SASS of TABLES[op][path] built for sm_90 as its launch at V specialises it."""
    compiled = compile_path(TABLES[op][path], p, V, dtype)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return sass_listing(f.name)


def passes(text: str, per_thread: int) -> list[tuple[float, list]]:
    """(instructions per element, top opcodes) of each barrier-delimited stretch of 60 or more."""
    out, stretch = [], []
    for op in [op.split(".")[0] for _, op, _ in sass_instructions(text)] + ["BAR"]:
        stretch.append(op)
        if op in ("BAR", "BRA"):
            if len(stretch) >= 60:
                out.append((len(stretch) / per_thread, collections.Counter(stretch).most_common(8)))
            stretch = []
    return out


WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}  # bytes; 4 unmarked


def access_bytes(op: str) -> int:
    """Bytes a thread moves with one LDG / STG opcode (LDG.E.EF.U16: 2)."""
    return next((WIDTH[part] for part in op.split(".")[1:] if part in WIDTH), 4)


def loops(text: str, per_thread: int, itemsize: int) -> list[tuple[float, dict]]:
    """(instructions per element, counts of LDG / STG / MUFU / F2I) of each loop of 20 or more
    instructions that holds no other loop, a loop being the span of a branch back. An iteration
    may take several tiles (the compiler unrolls): counted from its bytes, those stored where it
    stores (the gradient), else those loaded, halved where it also takes exponentials (the
    logits and their class weights), against a tile's per_thread elements of itemsize bytes."""
    lines = sass_instructions(text)
    out = []
    for a, b in [(a, b) for a, b in innermost_loops(lines) if b - a >= 20]:
        ops = [op for _, op, _ in lines[a : b + 1]]
        counts = {k: sum(o.split(".")[0] == k for o in ops) for k in ("LDG", "STG", "MUFU", "F2I")}
        loaded = sum(access_bytes(o) for o in ops if o.startswith("LDG"))
        stored = sum(access_bytes(o) for o in ops if o.startswith("STG"))
        moved = stored if stored else loaded // 2 if counts["MUFU"] else loaded
        tiles = max(1, round(moved / (per_thread * itemsize)))
        out.append((len(ops) / (per_thread * tiles), {**counts, "tiles": tiles}))
    return out


def stream_main(Vs: list[int]) -> int:
    for dtype in (torch.bfloat16, torch.float32):
        for V in Vs:
            p = {**tb.launch_params("stream", V, dtype, op="cross_entropy"), "HAS_WEIGHT": True, "HAS_SMOOTHING": True}
            per_thread = p["BLOCK"] // (32 * p["num_warps"])
            name = dtype_name(dtype)
            print(
                f"cross-entropy stream, weighted and smoothed, {name} V = {V}, {p['BLOCK']} x {p['num_warps']} warps:"
            )
            text = sass("cross_entropy", "stream", p, V, name)
            for per_element, counts in loops(text, per_thread, dtype.itemsize):
                print(f"  {per_element:5.2f} an element: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--stream"]:
        return stream_main([int(v) for v in sys.argv[2:]] or [50257, 65536])
    V = int(sys.argv[1]) if len(sys.argv) > 1 else 32000
    dtype = torch.bfloat16
    kernels = {
        "softmax held": ("softmax", st.launch_params("held", V, dtype)),
        "cross-entropy held": ("cross_entropy", tb.launch_params("held", V, dtype, op="cross_entropy")),
    }
    for name, (op, p) in kernels.items():
        tile = 8 * 32 * p["num_warps"]  # 16-byte groups of bf16, 32 a warp
        per_thread = held_block(V, tile, 2) // (32 * p["num_warps"])  # elements of the buffer a thread holds
        print(f"{name}, bf16 V = {V}, {p['num_warps']} warps, {per_thread} elements a thread:")
        total = 0.0
        for per_element, top in passes(sass(op, "held", p, V, "bfloat16"), per_thread):
            total += per_element
            print(f"  {per_element:5.2f} an element: " + ", ".join(f"{o} {n}" for o, n in top))
        print(f"  {total:5.2f} an element in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
