"""One kernel tree against another in CUDA-graph replay: does a gate flag come from the kernel?

    python reports/probes/graph_replay_ab.py TREE     # TREE holds a kernels/ package (a checkout)

Imports `kernels` from TREE and, for the Triton softmax and F.softmax at V = 600 (B = 1, 8, 64,
4096; bf16 and fp32), captures 100 back-to-back calls in one CUDA graph and times 30 replays in
alternating rounds; prints each one's µs per call and their ratio. Run it for two trees in
alternation (A B A B A B) to see the spread between processes beside the difference between trees.
"""

import statistics
import sys

import torch
import torch.nn.functional as F

tree = sys.argv[1]
sys.path.insert(0, tree)
from kernels import SOFTMAX_KERNELS  # noqa: E402

tri = SOFTMAX_KERNELS["triton"]
for dtype in (torch.bfloat16, torch.float32):
    for B in (1, 8, 64, 4096):
        x = torch.randn(B, 600, device="cuda", dtype=dtype)
        fns = {"triton": lambda x=x: tri(x), "F": lambda x=x: F.softmax(x, -1)}
        graphs = {}
        for name, fn in fns.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(100):
                    fn()
            graphs[name] = g
        times = {n: [] for n in graphs}
        for _ in range(30):
            for n, g in graphs.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                times[n].append(s.elapsed_time(e) * 1000 / 100)
        med = {n: statistics.median(t) for n, t in times.items()}
        ratio = med["F"] / med["triton"]
        triton_us, f_us = med["triton"], med["F"]
        print(f"{tree:10s} {str(dtype):15s} B={B:5d} triton {triton_us:.3f} us  F {f_us:.3f} us  ratio {ratio:.3f}")
