"""The three clocks of the benchmarks, and the one way their times reach pytest-benchmark.

- Device time (`device_times_us`): CUDA events around each launch, L2 flushed before each, and
  where the case says so (`fresh_contents`) new input values in the same storage every round,
  so that no kernel can replay an answer it remembered from an earlier round.
  pytest-benchmark times the host; for a kernel of a few microseconds that measures Python and
  the launch, and a synchronize per call would inflate it many times over. L2 is flushed (a
  256 MiB write, larger than the H200's 60 MiB L2) as `triton.testing.do_bench` does: the lab's
  (512, 600) matrix is 1.2 MB and would otherwise be served from L2 on every repetition,
  measuring a cache instead of the memory the roofline is drawn against, and the anchors we
  compare with were measured the same way. The launches queue behind a GPU busy-wait; where the
  GPU still reached a start event before the host had queued what it times, the host's time
  would count as the kernel's, so the measurement is taken again behind a longer wait
  (QUEUE_AHEAD_ATTEMPTS), and HostBehindWarning says where that never sufficed or where the
  call itself waits for the GPU. After any interval the GPU caught up with (a call that reads
  a result back leaves it idle), a new busy-wait goes ahead of the next one.
- Per-call wall time (`per_call_times_us`): what a Python caller pays. N back-to-back calls,
  one synchronize at the end of the round, `time.perf_counter`, no flush: launch overhead,
  argument checks and output allocation are all in it, and so is the kernel where it is longer
  than those.
- CUDA-graph replay (`capture_graph`, `graph_replay_times_us`): the same call captured once and
  replayed N times back to back between two events, per replay = total / N. What the call costs
  when a captured step replaces the host's launches.

Each clock also times several calls in interleaved rounds (`interleaved_*`): every round times
each call once, in an order that reverses from one round to the next, so whatever drifts during
a case (clocks, temperature, a neighbour on the host) moves all of them alike. The regression
gate takes the ratio of F.softmax's time to a kernel's per round (`paired_ratios`); the
single-call functions are the same loops with one call.

`report_times_us` hands any list of per-round times to pytest-benchmark, so its statistics, its
JSON and --benchmark-compare are in the clock that was measured.
"""

import itertools
import time

# torch is imported by the clocks that run (below, in each function that times): the rest
# (report_times_us, paired_ratios, FedClock) also serves processes that never touch torch, such
# as the child runs of the suite's own tests, which its import would cost a second each.

# The clocks by the names records give them (a benchmark record's "mode"), in the order above; the
# call modes are the two that time whole calls back to back with L2 warm.
MODES = ("device", "per_call", "graph")
CALL_MODES = MODES[1:]
MODE_NAMES = {"device": "device time", "graph": "graph replay", "per_call": "per call"}  # for people

WARMUP = 3
ROUNDS = 100
FLUSH_BYTES = 256 * 1024 * 1024
# Cycles of GPU busy-wait queued ahead of the timed launches, so the host can enqueue all of
# them while the GPU waits: launch latency then never falls between a start and an end event.
QUEUE_AHEAD_CYCLES = 20_000_000
# Where the GPU still reached a start event before the host had queued that interval's launches
# (a busy host, a slow call: the wait would be timed as the kernel's), the measurement is taken
# again behind twice the busy-wait, up to this many times in all; then HostBehindWarning. A call
# caught up with in every round, the first too, waits for the GPU itself (it synchronizes, as a
# read-back does): no wait helps, so it is warned of at once.
QUEUE_AHEAD_ATTEMPTS = 4


class HostBehindWarning(UserWarning):
    """Device times that may hold host time: in some rounds the GPU reached the start event
    before the host had queued the launches it times, however long the busy-wait ahead of them."""


def _host_behind(what: str, late: list[int], rounds: int, cycles: int) -> None:
    """Warn of `late[i]` of call i's `rounds` intervals that the GPU reached before the host."""
    import warnings

    calls = "" if len(late) == 1 else f" (of each call's {rounds}, in the order given: {', '.join(map(str, late))})"
    warnings.warn(
        f"{what}: in {sum(late)} of {rounds * len(late)} timed intervals{calls} the GPU caught up with "
        f"the host before the call's launches were queued, behind a busy-wait of up to {cycles:,} "
        "cycles; these times may include host time (does the call synchronize, or is the host busy?)",
        HostBehindWarning,
        stacklevel=3,
    )


CALLS_PER_ROUND = 200
CALL_ROUNDS = 15
# A per-call round of a slow kernel (naive at large V takes milliseconds) is cut to fewer calls
# so that a case stays within seconds; fast kernels always get CALLS_PER_ROUND.
MAX_ROUND_SECONDS = 0.5
MIN_CALLS_PER_ROUND = 10


def device_times_us(
    fn, *, warmup: int = WARMUP, rounds: int = ROUNDS, flush_l2: bool = True, refresh=None
) -> list[float]:
    """Run `fn` `warmup` times, then time `rounds` launches with CUDA events. Microseconds."""
    return interleaved_device_times_us([fn], warmup=warmup, rounds=rounds, flush_l2=flush_l2, refresh=refresh)[0]


# The step fresh_contents adds each round: twice bfloat16's spacing below 16, so that rounded to
# any of the suite's dtypes every value smaller than 16 in magnitude (logits of randn * a few)
# takes a new value every round, never one of an earlier round; a few hundred rounds shift the
# inputs by tens, which softmax (shift-invariant) and its timing do not notice.
FRESH_STEP = 2.0**-3


def fresh_contents(x):
    """A refresh for interleaved_device_times_us: each call writes x0 + k * FRESH_STEP into x
    (x0 its values now, k the call's number), one pass over the input like the copy the kernels
    are measured against, outside the timed events. No two rounds see the same contents at the
    same address, however many rounds a case (or the gate's re-measurement) runs."""
    import torch

    target = x.detach()  # the same storage; a leaf that requires grad takes no in-place write
    start = target.clone()
    calls = itertools.count(1)

    def refresh():
        torch.add(start, next(calls) * FRESH_STEP, out=target)

    return refresh


def round_order(fns: list, round_index: int) -> list[tuple[int, object]]:
    """(index, fn) in the order round `round_index` times them: as given in even rounds,
    reversed in odd ones, so neither call always runs first."""
    order = list(enumerate(fns))
    return order if round_index % 2 == 0 else order[::-1]


def interleaved_device_times_us(
    fns: list, *, warmup: int = WARMUP, rounds: int = ROUNDS, flush_l2: bool = True, refresh=None
) -> list[list[float]]:
    """Device time of each of `fns` in `rounds` interleaved rounds (one launch of each per round,
    L2 flushed before every launch, `refresh()` called before each round's launches, outside
    the timed events); one list of times per function, in µs."""
    import torch

    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda") if flush_l2 else None
    for attempt in range(QUEUE_AHEAD_ATTEMPTS):
        events = [
            [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
            for _ in fns
        ]
        cycles = QUEUE_AHEAD_CYCLES << attempt
        torch.cuda._sleep(cycles)
        late = [0] * len(fns)
        for r in range(rounds):
            if refresh is not None:
                refresh()
            for i, fn in round_order(fns, r):
                start, end = events[i][r]
                if flush is not None:
                    flush.zero_()
                start.record()
                fn()
                caught_up = start.query()  # the GPU is past the start: it may have waited for fn's launches
                late[i] += caught_up
                end.record()
                if caught_up:  # the GPU waits for the host now: queue ahead of the next interval again
                    torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        if not any(late):
            break
        if rounds in late:  # a call that synchronizes
            _host_behind("device time", late, rounds, cycles)
            break
    else:
        _host_behind("device time", late, rounds, cycles)
    return [[start.elapsed_time(end) * 1e3 for start, end in per_fn] for per_fn in events]


def calls_per_round(fn, *, warmup: int = WARMUP, synchronize=None, clock=time.perf_counter) -> int:
    """CALLS_PER_ROUND, or fewer where one call (timed alone after warm-up) is so slow that a
    round would run past MAX_ROUND_SECONDS; never fewer than MIN_CALLS_PER_ROUND."""
    import torch

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
    return interleaved_per_call_times_us(
        [fn], calls=calls, rounds=rounds, warmup=warmup, synchronize=synchronize, clock=clock
    )[0]


def interleaved_per_call_times_us(
    fns: list,
    *,
    calls: int = CALLS_PER_ROUND,
    rounds: int = CALL_ROUNDS,
    warmup: int = WARMUP,
    synchronize=None,
    clock=time.perf_counter,
) -> list[list[float]]:
    """per_call_times_us for each of `fns` in interleaved rounds: every round times `calls`
    back-to-back calls of each function, each run ending in its own synchronize."""
    import torch

    synchronize = synchronize or torch.cuda.synchronize
    for fn in fns:
        for _ in range(warmup):
            fn()
    synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for i, fn in round_order(fns, r):
            start = clock()
            for _ in range(calls):
                fn()
            synchronize()
            times[i].append((clock() - start) / calls * 1e6)
    return times


def capture_graph(fn, *, warmup: int = WARMUP):
    """Capture one call of `fn` into a CUDA graph; returns (graph, the call's output).

    Warm-up runs on a side stream, as torch requires before capture: lazy initialisation
    (cuBLAS handles, Triton and CuPy compiles, torch.compile's first call, allocator growth)
    must not happen inside the capture. The output lives in the graph's private memory pool
    and is rewritten by every replay, so a test can poison it, replay, and check it.
    """
    import torch

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
    return interleaved_graph_replay_times_us([graph], replays=replays, rounds=rounds)[0]


def interleaved_graph_replay_times_us(
    graphs: list, *, replays: int = CALLS_PER_ROUND, rounds: int = CALL_ROUNDS
) -> list[list[float]]:
    """graph_replay_times_us for each of `graphs` in interleaved rounds."""
    import torch

    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in graphs]
    behind = [0] * len(graphs)
    for r in range(rounds):
        for i, graph in round_order(graphs, r):
            for attempt in range(QUEUE_AHEAD_ATTEMPTS):  # as interleaved_device_times_us, a round at a time
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                cycles = QUEUE_AHEAD_CYCLES << attempt
                torch.cuda._sleep(cycles)
                start.record()
                for _ in range(replays):
                    graph.replay()
                late = start.query()
                end.record()
                torch.cuda.synchronize()
                if not late:
                    break
            behind[i] += late
            times[i].append(start.elapsed_time(end) * 1e3 / replays)
    if any(behind):
        _host_behind("graph replay", behind, rounds, cycles)
    return times


def paired_ratios(reference_us: list[float], kernel_us: list[float]) -> list[float]:
    """Per round, the reference's time over the kernel's (above 1: the kernel is faster), from
    two lists measured in the same interleaved rounds."""
    if len(reference_us) != len(kernel_us) or not kernel_us:
        raise ValueError(f"paired rounds: {len(reference_us)} reference times against {len(kernel_us)} kernel times")
    return [r / k for r, k in zip(reference_us, kernel_us, strict=True)]


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


# -- what a measured time can be ----------------------------------------------------------------------

# How far above the same run's copy ceiling a kernel's rate over the bytes it must read may be
# measured before it is impossible rather than noise: a pure read streams a little faster than
# a copy's mixed reads and writes, and a median over rounds still jitters.
PHYSICAL_SLACK = 1.5


def physically_possible(read_bytes: int, times_us: list[float], copy_TBps: float, *, what: str = "") -> dict:
    """Fails when `read_bytes` (what the kernel must read from memory after the L2 flush: the
    input, at the least) arrive faster than PHYSICAL_SLACK x the copy ceiling, in the median of
    `times_us`: the kernel did not do the work it was timed on (it replayed a remembered answer,
    or left the work on another stream). Returns the extra_info keys that say the check ran."""
    times = sorted(times_us)
    median_us = times[len(times) // 2]
    rate_TBps = read_bytes / (median_us * 1e-6) / 1e12 if median_us > 0 else float("inf")
    ratio = rate_TBps / copy_TBps
    assert ratio <= PHYSICAL_SLACK, (
        f"{what}: physically impossible: it read {read_bytes} bytes at {rate_TBps:.3g} TB/s, "
        f"{ratio:.2f} x this run's copy ceiling of {copy_TBps:.3g} TB/s (allowed {PHYSICAL_SLACK})"
    )
    return {"physical_check": "read rate <= copy ceiling x slack", "read_TBps_over_copy": ratio}
