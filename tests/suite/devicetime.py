"""The three clocks of the benchmarks, and the one way their times reach pytest-benchmark.

- Device time (`device_times_us`): CUDA events around each launch, L2 flushed before each.
  pytest-benchmark times the host; for a kernel of a few microseconds that measures Python and
  the launch, and a synchronize per call would inflate it many times over. L2 is flushed (a
  256 MiB write, larger than the H200's 60 MiB L2) as `triton.testing.do_bench` does: the lab's
  (512, 600) matrix is 1.2 MB and would otherwise be served from L2 on every repetition,
  measuring a cache instead of the memory the roofline is drawn against, and the anchors we
  compare with were measured the same way.
- Per-call wall time (`per_call_times_us`): what a Python caller pays. N back-to-back calls,
  one synchronize at the end of the round, `time.perf_counter`, no flush: launch overhead,
  argument checks and output allocation are all in it, and so is the kernel where it is longer
  than those.
- CUDA-graph replay (`capture_graph`, `graph_replay_times_us`): the same call captured once and
  replayed N times back to back between two events, per replay = total / N. What the call costs
  when a captured step replaces the host's launches.

`report_times_us` hands any list of per-round times to pytest-benchmark, so its statistics, its
JSON and --benchmark-compare are in the clock that was measured.
"""

import time

import torch

WARMUP = 3
ROUNDS = 100
FLUSH_BYTES = 256 * 1024 * 1024
# Cycles of GPU busy-wait queued ahead of the timed launches, so the host can enqueue all of
# them while the GPU waits: launch latency then never falls between a start and an end event.
QUEUE_AHEAD_CYCLES = 20_000_000

CALLS_PER_ROUND = 200
CALL_ROUNDS = 15
# A per-call round of a slow kernel (naive at large V takes milliseconds) is cut to fewer calls
# so that a case stays within seconds; fast kernels always get CALLS_PER_ROUND.
MAX_ROUND_SECONDS = 0.5
MIN_CALLS_PER_ROUND = 10


def device_times_us(fn, *, warmup: int = WARMUP, rounds: int = ROUNDS, flush_l2: bool = True) -> list[float]:
    """Run `fn` `warmup` times, then time `rounds` launches with CUDA events. Microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda") if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends, strict=True)]


def calls_per_round(fn, *, warmup: int = WARMUP, synchronize=None, clock=time.perf_counter) -> int:
    """CALLS_PER_ROUND, or fewer where one call (timed alone after warm-up) is so slow that a
    round would run past MAX_ROUND_SECONDS; never fewer than MIN_CALLS_PER_ROUND."""
    synchronize = synchronize or torch.cuda.synchronize
    for _ in range(warmup):
        fn()
    synchronize()
    start = clock()
    fn()
    synchronize()
    one_call = max(clock() - start, 1e-9)
    return max(MIN_CALLS_PER_ROUND, min(CALLS_PER_ROUND, int(MAX_ROUND_SECONDS / one_call)))


def per_call_times_us(
    fn,
    *,
    calls: int = CALLS_PER_ROUND,
    rounds: int = CALL_ROUNDS,
    warmup: int = WARMUP,
    synchronize=None,
    clock=time.perf_counter,
) -> list[float]:
    """Per-call wall time of `calls` back-to-back calls of `fn`, one value per round (µs).

    One synchronize ends each round, none between calls: a caller that launches a softmax does
    not wait for it, so the host's launch cost and the GPU's kernel time overlap as they would
    in a model. `synchronize` and `clock` are parameters so the loop can be tested on the CPU.
    """
    synchronize = synchronize or torch.cuda.synchronize
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            fn()
        synchronize()
        times.append((clock() - start) / calls * 1e6)
    return times


def capture_graph(fn, *, warmup: int = WARMUP):
    """Capture one call of `fn` into a CUDA graph; returns (graph, the call's output).

    Warm-up runs on a side stream, as torch requires before capture: lazy initialisation
    (cuBLAS handles, Triton and CuPy compiles, torch.compile's first call, allocator growth)
    must not happen inside the capture. The output lives in the graph's private memory pool
    and is rewritten by every replay, so a test can poison it, replay, and check it.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    torch.cuda.synchronize()
    return graph, output


def graph_replay_times_us(graph, *, replays: int = CALLS_PER_ROUND, rounds: int = CALL_ROUNDS) -> list[float]:
    """Per-replay device time of `replays` back-to-back replays, one value per round (µs).

    The replays are queued behind a GPU busy-wait, so the host has enqueued them all before the
    start event runs: the figure is the GPU's cost per replay, not the host's replay rate.
    """
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays)
    return times


class FedClock:
    """A pytest-benchmark timer that only moves when told how long a round took."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def report_times_us(benchmark, times_us: list[float]) -> None:
    """Feed pre-measured times (µs, one per round) to pytest-benchmark as its rounds."""
    if not hasattr(benchmark, "_timer"):
        raise RuntimeError(
            "this pytest-benchmark version has no BenchmarkFixture._timer; measured times cannot be reported through it"
        )
    clock = FedClock()
    benchmark._timer = clock
    pending = iter(times_us)

    def one_round():
        clock.seconds += next(pending) * 1e-6

    benchmark.pedantic(one_round, rounds=len(times_us), iterations=1, warmup_rounds=0)
