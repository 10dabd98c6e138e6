"""Three launches of fused at one shape, for Nsight Compute to profile the third:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section LaunchStats -k regex:fused_ --launch-skip 2 --launch-count 1 \\
        env PYTHONPATH=. python reports/probes/ncu_shape.py fp32 1024 202048
"""

import sys

import torch

from kernels import softmax_cuda as sc
from kernels.cuda_plans import fused_class_description

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

if __name__ == "__main__":
    dtype, B, V = DTYPES[sys.argv[1]], int(sys.argv[2]), int(sys.argv[3])
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
    print(fused_class_description(B, V, dtype), flush=True)
    for _ in range(3):
        sc.softmax_fused(x)
    torch.cuda.synchronize()
