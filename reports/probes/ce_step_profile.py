"""What one Triton cross-entropy training step runs on the GPU, kernel by kernel.

    python reports/probes/ce_step_profile.py     # on a GPU

The question. In the benchmark run the step (the custom op's forward, then loss.backward())
took more than twice the cross-entropy call's device time at (4096, 32000), and it allocated
one matrix beyond the inputs, where the call's own gradient should be handed to x.grad. This
prints, for fp32 and bf16: whether x.grad is the forward's gradient tensor (autograd took it
without a copy), the kernels of one step under torch.profiler with their device times, and
the device time (CUDA events, L2 flushed, median of 30) of the step and of the call with and
without its target validation. (Nothing else is queued between rounds here: where a step costs
the host more than the GPU, its events time the host.)
"""

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from kernels import ops
from kernels import triton_cross_entropy as tce
from tests.suite.devicetime import device_times_us


def probe(dtype, B=4096, V=32000):
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype).requires_grad_(True)
    t = torch.randint(0, V, (B,), device="cuda")
    loss, lse, grad = torch.ops.softmax_suite.cross_entropy_triton(x, t, None, -100, 0.0, "mean")
    ptr = grad.data_ptr()
    del grad, lse
    loss.backward()
    print(dtype, "x.grad is the forward's gradient:", x.grad.data_ptr() == ptr, flush=True)

    def step():
        x.grad = None
        ops.cross_entropy(x, t)[0].backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14), flush=True)
    xd = x.detach()
    timed = {
        "step": step,
        "call, validate": lambda: tce.cross_entropy(xd, t),
        "call, no validate": lambda: tce.cross_entropy(xd, t, validate=False),
    }
    for name, fn in timed.items():
        print(f"{dtype} {name}: {statistics.median(device_times_us(fn, rounds=30)):.1f} us", flush=True)


if __name__ == "__main__":
    for dtype in (torch.float32, torch.bfloat16):
        probe(dtype)
