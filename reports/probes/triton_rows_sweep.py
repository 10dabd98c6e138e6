"""The Triton rows path (many short rows, a [ROWS, BLOCK_V] block per program): launch parameters.

    python reports/probes/triton_rows_sweep.py --out DIR     # on a GPU

The question. `launch_params("rows", V)` gives every dtype ROWS = 2048 // BLOCK_V rows per
program, so a 16-bit program moves half the bytes of a float32 one; at (32768, 600) bf16 the
path ran at 0.53 of copy. Per (dtype, B, V): F.softmax, the dispatch, and the rows path at
ROWS x num_warps, each timed in CUDA graphs of (L2 flush, call) pairs less a graph of the flushes alone
(`graph_times_us`: through `run_path` a call costs more on the host than the kernel takes,
which event timing of single launches would add), median of ROUNDS; fraction of a
copy ceiling measured in the same run; every output's bits against the dispatch's (ROWS and
warps change how rows are grouped, never how a row is combined). Writes DIR/triton_rows.json
and prints a table last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import SOFTMAX_KERNELS
from kernels.softmax_triton import launch_params, plan, run_path
from kernels.spec import matrix_bytes
from tests.suite.devicetime import FLUSH_BYTES, device_times_us

SHAPES = [(B, V, dt) for dt in (torch.bfloat16, torch.float32) for B, V in ((8192, 600), (32768, 600), (32768, 2000))]
ROWS = (1, 2, 4, 8, 16)
WARPS = (1, 2, 4, 8)
ROUNDS = 20
CALLS = 10  # flush + call pairs per graph


def training_inputs(shapes: str):
    """Per "BxV" item of `shapes` and dtype (fp32, bf16): (B, V, dtype, logits x, targets t,
    softmax y of x, upstream gradient dy), seeded by the shape; the training probes' inputs."""
    for item in shapes.split(","):
        B, V = (int(v) for v in item.split("x"))
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(B + V)
            x = (torch.randn(B, V, device="cuda", generator=g) * 3).to(dtype)
            t = torch.randint(0, V, (B,), device="cuda", generator=g)
            y = torch.softmax(x.float(), -1).to(dtype)
            yield B, V, dtype, x, t, y, torch.randn(B, V, device="cuda", generator=g).to(dtype)


def graph_times_us(fns: list) -> list[list[float]]:
    """Device time per call of each of `fns`, free of host launch cost: a CUDA graph of CALLS
    (L2 flush, call) pairs per function and one of CALLS flushes alone, replayed in interleaved
    rounds; per call = (pairs - flushes) / CALLS, one value per round."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    graphs = []
    for fn in [lambda: None, *fns]:  # the first graph holds the flushes alone
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(CALLS):
                flush.zero_()
                fn()
        graphs.append(g)
    times = [[] for _ in graphs]
    for r in range(ROUNDS):
        order = list(range(len(graphs)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[i].replay()
            end.record()
            end.synchronize()
            times[i].append(start.elapsed_time(end) * 1e3)
    return [[(t - f) / CALLS for t, f in zip(ts, times[0], strict=True)] for ts in times[1:]]


def copy_TBps() -> float:
    src = torch.randn(2**29, device="cuda")
    dst = torch.empty_like(src)
    t = device_times_us(lambda: dst.copy_(src), flush_l2=False, rounds=20)
    return 2 * src.numel() * 4 / (statistics.median(t) * 1e-6) / 1e12


def timed_variants(variants: dict, B: int, V: int, dtype, copy: float, **extra) -> list[dict]:
    """Time each of `variants` ({name: call}, F.softmax first) at (B, V) with graph_times_us:
    per variant its median µs, fraction of `copy` (TB/s) and ratio to the first."""
    names = list(variants)
    times = graph_times_us([variants[n] for n in names])
    bytes_moved = matrix_bytes(B, V, str(dtype).removeprefix("torch."))
    f_us = statistics.median(times[0])
    rows = []
    for name, t in zip(names, times, strict=True):
        us = statistics.median(t)
        of_copy = bytes_moved / (us * 1e-6) / 1e12 / copy
        rows.append(
            {"B": B, "V": V, "dtype": str(dtype), "variant": name, "us": us, "of_copy": of_copy}
            | {"x_F_softmax": f_us / us, **extra}
        )
    return rows


def write_results(path: Path, copy: float, results: list[dict]) -> None:
    """The results as JSON at `path`, and a table of them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"copy_TBps": copy, "results": results}, indent=1))
    print(f"copy {copy:.3f} TB/s")
    for r in results:
        print(
            f"{r['dtype']:15s} ({r['B']}, {r['V']}) {r['variant']:28s} {r['us']:8.2f} us "
            f"{r['of_copy']:.3f} of copy {r['x_F_softmax']:.2f}x F"
        )


def floor_rows(variants: dict, same: dict, B: int, V: int, dtype, copy: float, passes: int = 2) -> list[dict]:
    """Time each of `variants` ({name: call}) at (B, V) with graph_times_us: per variant its
    median µs, its fraction of the floor (`passes` times the matrix moved at `copy` TB/s) and
    whether its bits were the reference's (`same`: {name: bool}), each printed as a line."""
    floor = matrix_bytes(B, V, str(dtype).removeprefix("torch."), passes=passes)
    rows = []
    for name, ts in zip(variants, graph_times_us(list(variants.values())), strict=True):
        us = statistics.median(ts)
        r = {"B": B, "V": V, "dtype": str(dtype), "variant": name, "us": us}
        rows.append(r | {"of_floor": floor / (us * 1e-6) / 1e12 / copy, "bits": same[name]})
        print(
            f"{r['dtype']:15s} ({B:5d}, {V:6d}) {name:24s} {us:9.1f} us {rows[-1]['of_floor']:.3f} of floor "
            f"bits {'same' if same[name] else 'DIFFER'}",
            flush=True,
        )
    return rows


def run_shapes(out: Path, name: str, measure, shapes) -> None:
    """measure(B, V, dtype, copy) -> rows for each (B, V, dtype) of `shapes`, against a copy
    ceiling measured first in the same run; all rows written to out/<name>.json."""
    out.mkdir(parents=True, exist_ok=True)
    copy = copy_TBps()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.3f} TB/s", flush=True)
    rows = []
    for B, V, dtype in shapes:
        rows += measure(B, V, dtype, copy)
    (out / f"{name}.json").write_text(json.dumps({"copy_TBps": copy, "rows": rows}, indent=1))


def shapes_main(name: str, measure, shapes, doc: str) -> int:
    """The command line of a probe over `shapes`: --out DIR, and --v to time the shapes of
    those V only; run_shapes writes DIR/<name>.json."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--v", type=int, nargs="+", help="time the shapes of these V only")
    args = ap.parse_args()
    run_shapes(args.out, name, measure, [s for s in shapes if not args.v or s[1] in args.v])
    return 0


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's elements as integers of its width: equal bits, NaN payloads included."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def with_edge_rows(x: torch.Tensor) -> torch.Tensor:
    """x with a NaN in row 1 and row 2 all -inf but its last entry (where B > 2), in place."""
    if x.shape[0] > 2:
        x[1, 7] = float("nan")
        x[2].fill_(-float("inf"))
        x[2, -1] = 0.0
    return x


def paths_agree(x: torch.Tensor, first: str, second: str) -> bool:
    """Whether run_path gives x the same bits through `first` and `second` (outputs poisoned
    with NaN first)."""
    ys = []
    for path in (first, second):
        y = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
        run_path(x, path, out=y)
        ys.append(y)
    torch.cuda.synchronize()
    return torch.equal(bits(ys[0]), bits(ys[1]))


def edge_logits(B: int, V: int, dtype: torch.dtype) -> torch.Tensor:
    """randn * 3 on the GPU, with a NaN row and a row of -inf with one finite entry (whose bits
    every variant must keep too), where B > 2."""
    return with_edge_rows(torch.randn(B, V, device="cuda", dtype=torch.float32).mul_(3).to(dtype))


def baseline_variants(x: torch.Tensor) -> dict:
    """{name: call} of F.softmax and Triton's dispatch at x: the first variants every probe here
    times (timed_variants takes the first as the ratio's reference)."""
    B, V = x.shape
    triton = SOFTMAX_KERNELS["triton"]
    return {"F.softmax": lambda: F.softmax(x, -1), f"dispatch ({plan(B, V, x.dtype)})": lambda: triton(x)}


def path_variants(x: torch.Tensor, reference: torch.Tensor, runs: dict) -> dict:
    """{name: call} of each named (path, launch parameters) in `runs`, the name marked BITS
    DIFFER where its output (poisoned with NaN first) is not `reference` bit for bit."""
    variants = {}
    for name, (path, params) in runs.items():
        y = torch.full_like(x, float("nan"))
        run_path(x, path, out=y, **params)
        same = torch.equal(bits(y), bits(reference))
        variants[name + ("" if same else " BITS DIFFER")] = lambda p=path, q=params: run_path(x, p, **q)
    return variants


def sweep_shapes(shapes, path: Path, variants_of) -> None:
    """For each (B, V, dtype) of `shapes`: edge_logits, the baseline_variants and
    variants_of(x, reference) ({name: call}; reference: the dispatch's output), timed against a
    copy ceiling measured first in the same run; the results written to `path` (write_results)."""
    copy = copy_TBps()
    triton = SOFTMAX_KERNELS["triton"]
    results = []
    for B, V, dtype in shapes:
        x = edge_logits(B, V, dtype)
        variants = baseline_variants(x)
        variants.update(variants_of(x, triton(x)))
        results += timed_variants(variants, B, V, dtype, copy)
        del x, variants
        torch.cuda.empty_cache()
    write_results(path, copy, results)


def rows_variants(x: torch.Tensor, reference: torch.Tensor, params_by_name: dict) -> dict:
    """path_variants of the rows path at each named set of launch parameters."""
    return path_variants(x, reference, {name: ("rows", params) for name, params in params_by_name.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    copy = copy_TBps()
    triton = SOFTMAX_KERNELS["triton"]
    results = []
    for B, V, dtype in SHAPES:
        x = torch.randn(B, V, device="cuda", dtype=torch.float32).mul_(3).to(dtype)
        base = launch_params("rows", V, dtype)
        variants = baseline_variants(x)
        params = {
            f"rows {rows}x{warps}": {"ROWS": rows, "BLOCK_V": base["BLOCK_V"], "num_warps": warps}
            for rows, warps in itertools.product(ROWS, WARPS)
            if rows * base["BLOCK_V"] // (32 * warps) >= 1
        }
        variants.update(rows_variants(x, triton(x), params))
        results += timed_variants(variants, B, V, dtype, copy, base=base)
    write_results(args.out / "triton_rows.json", copy, results)


if __name__ == "__main__":
    main()
