"""Does the Triton backward split's time depend on where its tensors lie in memory?

    python reports/probes/split_placement.py --out DIR     # on a GPU

The question. The benchmark timed the split at float32 (4096, 128256) in 2.49 ms when torch.compile
had run in the same process and in 3.12 ms when it had not, with the same code (reports/profiles.md).
Per padding P (MiB allocated, and kept, before the inputs), in a fresh allocator state each: dy
and y allocated after the padding, the split's workspace after them, device time of the dispatch
(CUDA events, L2 flushed, median of ROUNDS) and the outputs' bits against the first padding's.
Last, padding 0 again after a torch.compile'd function has run once in the process. Writes
DIR/split_placement.json and prints a line per measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from kernels import launch
from kernels import triton_backward as tb
from kernels.baselines import static_compile
from tests.suite.devicetime import device_times_us

PADS_MIB = (0, 1, 2, 3, 64, 130, 257, 1000)
ROUNDS = 30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="4096x128256")
    args = parser.parse_args()
    B, V = (int(n) for n in args.shape.split("x"))
    results, first = [], {}

    def measure(dtype, pad, note=""):
        launch._workspaces.clear()  # the split's workspace is allocated anew, after the inputs
        torch.cuda.empty_cache()
        padding = torch.empty(pad * 2**20 + 1, dtype=torch.int8, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(B + V + 1)
        y = torch.softmax(torch.randn(B, V, device="cuda", generator=g) * 3, -1).to(dtype)
        dy = torch.randn(B, V, device="cuda", generator=g).to(dtype)
        dx = tb.softmax_backward(dy, y)
        same = bool(torch.equal(dx, first.setdefault(dtype, dx)))
        us = statistics.median(device_times_us(lambda: tb.softmax_backward(dy, y), rounds=ROUNDS))
        row = {"dtype": str(dtype), "B": B, "V": V, "pad_MiB": pad, "note": note, "us": us, "same_bits": same}
        row |= {"y_addr_mod_2MiB": y.data_ptr() % 2**21, "dy_minus_y_MiB": (dy.data_ptr() - y.data_ptr()) / 2**20}
        results.append(row)
        print(row, flush=True)
        del padding

    for dtype in (torch.float32, torch.bfloat16):
        for pad in PADS_MIB:
            measure(dtype, pad)
    # The same after torch.compile's backward baseline has run once in this process.
    x = torch.rand(64, 1000, device="cuda")
    static_compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype))(x, x.softmax(-1))
    for dtype in (torch.float32, torch.bfloat16):
        measure(dtype, 0, "after torch.compile ran")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split_placement.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
