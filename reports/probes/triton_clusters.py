"""Rows held whole across a thread-block cluster: Triton's `num_ctas` on Hopper.

    python reports/probes/triton_clusters.py       # sm_90 builds under the installed Triton

The question. The Triton paths that miss their goals hold too little of a row per program: the
forward split holds a chunk in 120 registers a thread at a quarter occupancy and meets its
neighbours through L2; the backward's reread path holds y dy for rows to 16384 only (at 32768
its build spills); the cross-entropy row kernel likewise. The fused CUDA kernel's cluster class
holds a long row across the shared memory of a cluster and reaches 0.89 of copy. Triton lays a
tensor across the CTAs of a cluster when compiled with num_ctas > 1 (sm_90), reducing across
them through distributed shared memory. Here the row kernels as they are (one program a row,
the whole row in registers, BLOCK = next_pow2(V)) are built for sm_90 with num_ctas in 1, 2,
4, 8 (the same code, the same sums, so it would give the dispatch's bits): does the build hold
the row without spilling, and does it reduce through the cluster's shared memory? A build
failure is a result: it is printed, not raised. No GPU needed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

import triton

from kernels.triton_kernels import softmax_row_kernel
from kernels.triton_loss_kernels import softmax_backward_reread_kernel

CTAS = "1,2,4,8"
WARPS = "16,32"
MAX_PER_THREAD = 64  # float32 row values a thread may hold; more is not tried


def variants(V: int):
    for c in (int(n) for n in CTAS.split(",")):
        for w in (int(n) for n in WARPS.split(",")):
            if triton.next_power_of_2(V) // (c * 32 * w) <= MAX_PER_THREAD:
                yield c, w


def aot() -> int:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    div = [["tt.divisibility", 16]]
    kernels = {
        "forward row": (softmax_row_kernel, "X:*T Y:*T V stride_x stride_y SCALE:fp32", (0, 1, 3, 4), "BLOCK ALIGN"),
        "backward reread": (
            softmax_backward_reread_kernel, "DY:*T Y:*T DX:*T V stride_dy stride_y stride_dx K", (0, 1, 2, 4, 5, 6),
            "BLOCK TILE",
        ),
    }  # fmt: skip
    for name, (kernel, args, aligned, constexprs) in kernels.items():
        for dt in ("fp32", "bf16"):
            for V in (32768, 131072, 262144):
                for c, w in variants(V):
                    sig = {n: (t or "i32").replace("T", dt) if t != "fp32" else "fp32"
                           for n, _, t in (a.partition(":") for a in args.split())}  # fmt: skip
                    sig.update(dict.fromkeys(constexprs.split(), "constexpr"))
                    cx = {"BLOCK": V, "ALIGN": 1} if "ALIGN" in constexprs else {"BLOCK": V, "TILE": 4096}
                    src = ASTSource(fn=kernel, signature=sig, constexprs=cx, attrs={(i,): div for i in aligned})
                    try:
                        options = {"num_warps": w, "num_ctas": c}
                        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
                    except Exception as e:  # noqa: BLE001 - a build that fails is a result here
                        print(f"{name:16s} {dt} V={V:6d} ctas={c} warps={w}: build failed: {str(e)[:120]}")
                        continue
                    ptx = k.asm["ptx"]
                    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                        f.write(ptx)
                    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
                    err = subprocess.run(
                        [get_ptxas(90).path, "-v", f"--gpu-name={arch}", f.name, "-o", f.name + ".o"],
                        capture_output=True, text=True,
                    ).stderr  # fmt: skip
                    regs = re.search(r"Used (\d+) registers", err).group(1)
                    spill = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", err))
                    dsmem = len(re.findall(r"mapa|shared::cluster", ptx))
                    print(f"{name:16s} {dt} V={V:6d} ctas={c} warps={w}: {regs} registers, spill {spill} B, "
                          f"{dsmem} cluster-shared accesses, smem {k.metadata.shared}")  # fmt: skip
    return 0


if __name__ == "__main__":
    print(f"triton {triton.__version__}")
    sys.exit(aot())
