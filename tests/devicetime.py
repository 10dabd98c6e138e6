"""Device-side timing for the benchmarks.

pytest-benchmark times the host. For a kernel of a few microseconds that measures Python and
the launch, and a synchronize per call would inflate it many times over. Here every launch is
bracketed by CUDA events instead, and pytest-benchmark is handed a clock that advances by exactly
those event times, so its statistics, JSON and --benchmark-compare are all in device time.

L2 is flushed before every timed launch (a 256 MiB write, larger than the H200's 60 MiB L2), as
`triton.testing.do_bench` does: the lab's (512, 600) matrix is 1.2 MB and would otherwise be
served from L2 on every repetition, measuring a cache instead of the memory the roofline is
drawn against, and the anchors we compare with were measured the same way.
"""

import torch

WARMUP = 3
ROUNDS = 100
FLUSH_BYTES = 256 * 1024 * 1024
# Cycles of GPU busy-wait queued ahead of the timed launches, so the host can enqueue all of
# them while the GPU waits: launch latency then never falls between a start and an end event.
QUEUE_AHEAD_CYCLES = 20_000_000


def device_times_us(fn, *, warmup: int = WARMUP, rounds: int = ROUNDS, flush_l2: bool = True) -> list[float]:
    """Run `fn` `warmup` times, then time `rounds` launches with CUDA events. Microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda") if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
    for start, end in zip(starts, ends):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]


class DeviceClock:
    """A pytest-benchmark timer that only moves when told how long a launch took on the device."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def report_device_times(benchmark, times_us: list[float]) -> None:
    """Feed pre-measured device times to pytest-benchmark, one round per launch."""
    if not hasattr(benchmark, "_timer"):
        raise RuntimeError("this pytest-benchmark version has no BenchmarkFixture._timer; "
                           "device times cannot be reported through it")
    clock = DeviceClock()
    benchmark._timer = clock
    pending = iter(times_us)

    def one_launch():
        clock.seconds += next(pending) * 1e-6

    benchmark.pedantic(one_launch, rounds=len(times_us), iterations=1, warmup_rounds=0)
