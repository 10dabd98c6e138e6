"""The held kernels' instructions per element, pass by pass, from their sm_90 SASS (no GPU).

    python reports/probes/held_sass.py [V]        # default V = 32000, bf16

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
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from kernels import softmax_triton as st
from kernels import triton_backward as tb
from kernels.spec import DTYPE_IDS, ITEMSIZE
from kernels.triton_dispatch import held_block
from kernels.triton_launch import TABLES

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass(op: str, path: str, p: dict, V: int, dtype: str) -> str:
    """The SASS of TABLES[op][path] built for sm_90 as its launch at V specialises it."""
    entry = TABLES[op][path]
    spec = entry.aot(p, V, DTYPE_IDS[dtype], ITEMSIZE[dtype])
    options = dict(spec["options"])
    attrs = {(i,): [["tt.divisibility", 16]] for i in spec["aligned"]}
    src = GluonASTSource(fn=entry.kernel, signature=spec["signature"], constexprs=spec["constexprs"], attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", f.name], capture_output=True, text=True).stdout


def passes(text: str, per_thread: int) -> list[tuple[float, list]]:
    """(instructions per element, top opcodes) of each barrier-delimited stretch of 60 or more."""
    out, stretch = [], []
    for op in INSTRUCTION.findall(text) + ["BAR"]:
        stretch.append(op)
        if op in ("BAR", "BRA"):
            if len(stretch) >= 60:
                out.append((len(stretch) / per_thread, collections.Counter(stretch).most_common(8)))
            stretch = []
    return out


def main() -> int:
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
