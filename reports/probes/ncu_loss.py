"""Three launches of the Triton softmax backward or cross-entropy at one shape, for Nsight
Compute to profile the third:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section LaunchStats -k regex:split --launch-skip 2 --launch-count 1 \\
        env PYTHONPATH=. python reports/probes/ncu_loss.py ce fp32 4096 32000

The first argument is ce (cross-entropy, no target validation), wce (the same with class
weights and label smoothing, as tests/test_loss_benchmarks.py draws them) or bwd (softmax
backward). A fifth, BLOCK,warps,programs_per_sm,maxnreg (maxnreg 0: uncapped), launches the
cross-entropy's stream path with those parameters in place of the dispatch.
"""

import sys

import torch

from kernels import triton_backward as tb
from kernels import triton_cross_entropy as tce
from tests.test_loss_benchmarks import LABEL_SMOOTHING

if __name__ == "__main__":
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[2]]
    B, V = int(sys.argv[3]), int(sys.argv[4])
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
    if sys.argv[1] in ("ce", "wce"):
        t = torch.randint(0, V, (B,), device="cuda")
        o = {}
        if sys.argv[1] == "wce":
            o = {"weight": (torch.rand(V, device="cuda") + 0.5).to(dtype), "label_smoothing": LABEL_SMOOTHING}
        stream = None
        if len(sys.argv) > 5:
            b, w, p, c = (int(v) for v in sys.argv[5].split(","))
            stream = {"BLOCK": b, "num_warps": w, "programs_per_sm": p, "maxnreg": c or None}
        for _ in range(3):
            if stream:
                tce.run_path(x, t, "stream", params=stream, validate=False, **o)
            else:
                tce.cross_entropy(x, t, validate=False, **o)
    else:
        y = torch.softmax(x.float(), -1).to(dtype)
        for _ in range(3):
            tb.softmax_backward(x, y)
    torch.cuda.synchronize()
