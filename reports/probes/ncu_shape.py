"""Three launches of one registered softmax kernel at one shape, for Nsight Compute to profile
the third:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section LaunchStats --section ComputeWorkloadAnalysis -k regex:softmax --launch-skip 2 \\
        --launch-count 1 env PYTHONPATH=. python reports/probes/ncu_shape.py triton bf16 32768 600

The kernel is a name of kernels.SOFTMAX_KERNELS (fused, triton, ...); its plan is printed first.
"""

import sys

import torch

from kernels import SOFTMAX_KERNELS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

if __name__ == "__main__":
    kernel, dtype, B, V = SOFTMAX_KERNELS[sys.argv[1]], DTYPES[sys.argv[2]], int(sys.argv[3]), int(sys.argv[4])
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
    print(kernel.plan(B, V, dtype), flush=True)
    for _ in range(3):
        kernel(x)
    torch.cuda.synchronize()
