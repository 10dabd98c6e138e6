"""tests/suite/devicetime.py: the per-call loop and the hand-over to pytest-benchmark on the CPU
with stand-in clocks; device time and graph replay on the GPU."""

import statistics

import pytest

from tests.suite import devicetime, gpus, testing


class StepClock:
    """A perf_counter stand-in that advances by `step` seconds per call of the timed function."""

    def __init__(self, step):
        self.now, self.step = 100.0, step

    def __call__(self):
        return self.now

    def tick(self):
        self.now += self.step


class Calls:
    def __init__(self, clock=None):
        self.calls, self.syncs, self.clock = 0, [], clock

    def fn(self):
        self.calls += 1
        if self.clock:
            self.clock.tick()

    def synchronize(self):
        self.syncs.append(self.calls)


@pytest.mark.cpu
def test_per_call_rounds_sync_once_each_and_divide_by_the_calls():
    clock = StepClock(7e-6)
    calls = Calls(clock)
    times = devicetime.per_call_times_us(
        calls.fn, calls=50, rounds=4, warmup=3, synchronize=calls.synchronize, clock=clock
    )
    assert calls.calls == 3 + 4 * 50
    # One synchronize after the warm-up, then one at the end of every round and none between calls.
    assert calls.syncs == [3, 53, 103, 153, 203]
    assert times == pytest.approx([7.0] * 4)


@pytest.mark.cpu
@pytest.mark.parametrize(
    "one_call_s, expected", [(1e-6, devicetime.CALLS_PER_ROUND), (2.0**-6, 32), (1.0, devicetime.MIN_CALLS_PER_ROUND)]
)
def test_slow_calls_get_fewer_calls_per_round(one_call_s, expected):
    clock = StepClock(one_call_s)
    calls = Calls(clock)
    assert devicetime.calls_per_round(calls.fn, warmup=2, synchronize=calls.synchronize, clock=clock) == expected
    assert calls.calls == 3


@pytest.mark.cpu
def test_interleaved_rounds_alternate_the_order_and_keep_each_calls_times():
    clock, order = StepClock(0.0), []

    def timed(name, seconds):
        def fn():
            order.append(name)
            clock.now += seconds

        return fn

    syncs = []
    kernel, reference = timed("k", 5e-6), timed("F", 8e-6)
    times = devicetime.interleaved_per_call_times_us(
        [kernel, reference], calls=2, rounds=3, warmup=1, synchronize=lambda: syncs.append(len(order)), clock=clock
    )
    assert times == [pytest.approx([5.0] * 3), pytest.approx([8.0] * 3)]
    # Warm-up of each, then per round both, in an order that reverses every round.
    assert "".join(order) == "kF" + "kkFF" + "FFkk" + "kkFF"
    assert syncs == [2, 4, 6, 8, 10, 12, 14]  # after the warm-up and after each call's run
    assert devicetime.paired_ratios([10.0, 9.0], [5.0, 4.5]) == [2.0, 2.0]
    with pytest.raises(ValueError, match="2 reference times against 1 kernel times"):
        devicetime.paired_ratios([10.0, 9.0], [5.0])


class QueuedGpu:
    """torch.cuda's timing seams on one stream, on a simulated timeline: the host's clock moves by
    what a call spends on the host, and the GPU runs what was queued in order, each piece when it
    is queued and the GPU is free. An event completes when the GPU reaches it."""

    CYCLES_PER_SECOND = 2e9

    def __init__(self):
        self.host, self.free_at = 0.0, 0.0

    def queue(self, seconds: float) -> float:
        self.free_at = max(self.free_at, self.host) + seconds
        return self.free_at

    def _sleep(self, cycles):
        self.queue(cycles / self.CYCLES_PER_SECOND)

    def synchronize(self):
        self.host = max(self.host, self.free_at)

    def Event(self, enable_timing=False):  # noqa: N802 (torch.cuda.Event)
        gpu = self

        class Event:
            def record(self):
                self.at = gpu.queue(0.0)

            def query(self):
                return self.at <= gpu.host

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        return Event()

    def call(self, host_s: float, kernel_s: float, *, synchronizes: bool = False):
        """A call that spends `host_s` on the host, then queues a kernel of `kernel_s`."""
        calls = []

        def fn():
            calls.append(1)
            self.host += host_s
            self.queue(kernel_s)
            if synchronizes:
                self.synchronize()

        return fn, calls


@pytest.fixture
def queued_gpu(monkeypatch):
    import torch

    gpu = QueuedGpu()
    for name in ("Event", "_sleep", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(gpu, name))
    return gpu


@pytest.mark.cpu
def test_a_slow_host_is_timed_again_behind_a_longer_wait(queued_gpu, recwarn):
    """A kernel of 20 us whose call takes 300 us on the host: 50 rounds take the host 15 ms to
    queue, past the first busy-wait (10 ms), so the GPU would catch up and time the host's
    calls. The clock notices, queues them again behind twice the wait, and times the kernel."""
    rounds, warmup = 50, 3
    wait_s = devicetime.QUEUE_AHEAD_CYCLES / queued_gpu.CYCLES_PER_SECOND
    assert rounds * 300e-6 > wait_s and rounds * 300e-6 < 2 * wait_s
    fn, calls = queued_gpu.call(300e-6, 20e-6)
    times = devicetime.device_times_us(fn, warmup=warmup, rounds=rounds, flush_l2=False)
    assert times == pytest.approx([20.0] * rounds)
    assert len(calls) == warmup + 2 * rounds  # timed twice: the second behind a longer wait
    quick, calls = queued_gpu.call(5e-6, 20e-6)
    times = devicetime.device_times_us(quick, warmup=warmup, rounds=rounds, flush_l2=False)
    assert times == pytest.approx([20.0] * rounds)
    assert len(calls) == warmup + rounds  # kept ahead at once: timed once
    assert not recwarn.list


@pytest.mark.cpu
def test_a_call_that_synchronizes_is_said_to_include_host_time(queued_gpu):
    fn, calls = queued_gpu.call(300e-6, 20e-6, synchronizes=True)
    with pytest.warns(devicetime.HostBehindWarning, match=r"device time: in [3-6] of 6 timed intervals"):
        times = devicetime.interleaved_device_times_us(
            [fn, queued_gpu.call(0.0, 1e-6)[0]], warmup=1, rounds=3, flush_l2=False
        )
    assert len(calls) == 1 + 3  # no longer wait would help: timed once
    # Each interval starts behind a busy-wait, so the kernel was queued before the GPU reached
    # it; the call's read-back then waited for the GPU on the host, which the events do not see.
    assert times[0] == pytest.approx([20.0] * 3)


@pytest.mark.cpu
def test_a_call_after_one_that_synchronizes_is_timed_on_the_gpu_alone(queued_gpu):
    """A reference that reads a result back every call (as PyTorch's cross-entropy with both
    class weights and label smoothing does) leaves the GPU idle: the kernel timed after it
    (50 us on the host, 20 us on the GPU) would start its interval at once and be timed with
    its host time. A new busy-wait is queued ahead of it; the warning names the reference."""
    reference, _ = queued_gpu.call(10e-6, 100e-6, synchronizes=True)
    kernel, _ = queued_gpu.call(50e-6, 20e-6)
    with pytest.warns(
        devicetime.HostBehindWarning, match=r"in 4 of 8 timed intervals \(of each call's 4, in the order given: 0, 4\)"
    ):
        kernel_us, _ = devicetime.interleaved_device_times_us([kernel, reference], warmup=1, rounds=4, flush_l2=False)
    assert kernel_us == pytest.approx([20.0] * 4)


@pytest.mark.cpu
def test_graph_replays_are_timed_behind_a_wait_long_enough(queued_gpu, recwarn):
    """200 replays of 100 us each on the host, 2 us each on the GPU: 20 ms to queue a round,
    past the first wait; the round is taken again behind a longer one."""

    class Graph:
        def __init__(self, host_s, gpu_s):
            self.replay = queued_gpu.call(host_s, gpu_s)[0]

    slow, fast = Graph(100e-6, 2e-6), Graph(1e-6, 3e-6)
    slow_us, fast_us = devicetime.interleaved_graph_replay_times_us([slow, fast], replays=200, rounds=2)
    assert slow_us == pytest.approx([2.0] * 2) and fast_us == pytest.approx([3.0] * 2)
    assert not recwarn.list
    with pytest.warns(devicetime.HostBehindWarning, match="graph replay: in 1 of 1"):
        devicetime.graph_replay_times_us(Graph(10e-3, 2e-6), replays=100, rounds=1)


@pytest.mark.cpu
def test_reported_times_are_pytest_benchmarks_rounds():
    """Times handed to pytest-benchmark become its rounds and statistics. pytest-benchmark is
    off in xdist workers, so this runs in a session of its own, without xdist."""
    proc = testing.run_pytest(
        str(testing.CASES / "report_times_case.py"),
        "-p",
        "no:xdist",
        "-m",
        "cpu",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout


# -- on the GPU ------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_a_graph_replay_recomputes_the_captured_output():
    import torch

    x = torch.randn(64, 600, device="cuda")
    graph, out = devicetime.capture_graph(lambda: torch.softmax(x, dim=-1))
    x.copy_(torch.randn_like(x))  # replays read the captured input's memory, whatever it holds now
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.softmax(x, dim=-1), rtol=0, atol=0)
    times = devicetime.graph_replay_times_us(graph, replays=20, rounds=3)
    assert len(times) == 3 and all(t > 0 for t in times)


@pytest.mark.cuda
def test_interleaved_device_times_keep_each_kernels_own_times():
    import torch

    big, small = torch.randn(4096, 4096, device="cuda"), torch.randn(8, 8, device="cuda")
    long_us, short_us = devicetime.interleaved_device_times_us([lambda: big @ big, lambda: small + 1], rounds=6)
    assert len(long_us) == len(short_us) == 6
    assert statistics.median(long_us) > 10 * statistics.median(short_us)
    graphs = [devicetime.capture_graph(lambda: big @ big)[0], devicetime.capture_graph(lambda: small + 1)[0]]
    long_us, short_us = devicetime.interleaved_graph_replay_times_us(graphs, replays=5, rounds=3)
    assert statistics.median(long_us) > 10 * statistics.median(short_us)


@pytest.mark.cuda
def test_a_call_slow_on_the_host_is_timed_on_the_gpu():
    """1 ms of host work before a kernel of microseconds: 30 rounds take the host longer than the
    first busy-wait, so its later rounds would time the host; the clock takes them again behind
    a longer wait and times the kernel alone."""
    import time
    import warnings

    import torch

    sharing = gpus.workers_on_this_gpu()
    if sharing > 1:
        pytest.skip(f"{sharing} xdist workers share this GPU, whose device time is then theirs too: -n auto")
    small = torch.randn(8, 8, device="cuda")

    def slow_host():
        time.sleep(1e-3)
        return small + 1

    with warnings.catch_warnings():
        warnings.simplefilter("error", devicetime.HostBehindWarning)
        times = devicetime.device_times_us(slow_host, rounds=30)
    assert max(times) < 500.0, times


@pytest.mark.cuda
def test_device_and_per_call_clocks_order_a_long_and_a_short_kernel():
    import torch

    big, small = torch.randn(4096, 4096, device="cuda"), torch.randn(8, 8, device="cuda")
    long_us = statistics.median(devicetime.device_times_us(lambda: big @ big, rounds=5))
    short_us = statistics.median(devicetime.device_times_us(lambda: small + 1, rounds=5))
    assert long_us > 10 * short_us
    per_call = statistics.median(devicetime.per_call_times_us(lambda: big @ big, calls=5, rounds=3))
    assert per_call > 0.5 * long_us  # back-to-back calls cannot beat the GPU's own time by much


@pytest.mark.cpu
def test_a_rate_past_the_copy_ceiling_is_impossible():
    """Synthetic timings: 1 GB read in 1 ms is 1 TB/s; against a copy ceiling of 4 TB/s it passes
    (and says so), against one of 0.5 TB/s it is twice the ceiling, past the slack."""
    ran = devicetime.physically_possible(10**9, [1000.0, 990.0, 5000.0], 4.0, what="k")
    assert ran["read_TBps_over_copy"] == pytest.approx(0.25) and ran["physical_check"]
    slack = devicetime.PHYSICAL_SLACK
    devicetime.physically_possible(10**9, [1000.0 / slack * 1.001], 1.0, what="k")  # just under
    with pytest.raises(AssertionError, match="physically impossible"):
        devicetime.physically_possible(10**9, [1000.0 / slack * 0.999], 1.0, what="k")  # just over
    with pytest.raises(AssertionError, match=r"k: physically impossible.*2\.00 x"):
        devicetime.physically_possible(10**9, [1000.0], 0.5, what="k")
    with pytest.raises(AssertionError, match="physically impossible"):
        devicetime.physically_possible(10**6, [0.0, 0.0, 1.0], 4.0, what="a remembered answer")


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fresh_contents_never_repeat_in_the_same_storage(dtype):
    import torch

    x = (torch.randn(4, 33, generator=torch.Generator().manual_seed(1)) * 4).clamp(-15, 15).to(getattr(torch, dtype))
    x[0, :3] = torch.tensor([-15.5, 0.0, 15.0])  # the range the step moves in every dtype
    start, address = x.clone(), x.data_ptr()
    refresh = devicetime.fresh_contents(x)
    seen = [start.clone()]
    for k in range(1, 6):
        refresh()
        assert x.data_ptr() == address
        assert torch.equal(x, (start + k * devicetime.FRESH_STEP).to(x.dtype))
        assert all((x != earlier).all() for earlier in seen), f"round {k} repeats a value of an earlier round"
        seen.append(x.clone())
    leaf = torch.zeros(3, requires_grad=True)  # a logits leaf of the loss benchmarks
    devicetime.fresh_contents(leaf)()
    assert torch.equal(leaf.detach(), torch.full((3,), devicetime.FRESH_STEP)) and leaf.requires_grad


@pytest.mark.cuda
def test_fresh_contents_leave_a_remembering_kernel_nothing_to_replay():
    """A kernel answering from a cache keyed on a sample of its input (tests/adversaries.py):
    timed on the same contents every round it replays a copy; timed as the benchmarks time, on
    new contents every round, it computes every time and costs what the honest kernel costs."""
    import torch

    from kernels.registry import Kernel
    from tests import adversaries

    sharing = gpus.workers_on_this_gpu()
    if sharing > 1:  # under `-n 16` on one GPU the least of 15 rounds still read stale ~ fresh
        pytest.skip(f"{sharing} xdist workers share this GPU, whose device time is then theirs too: -n auto")
    kernel = Kernel(next(spec for spec in adversaries.CORPUS if spec.name == "gaming_memo_by_sample"))
    # 32 MB each: the memo keeps one answer per round it sees. The three are timed in the same
    # interleaved rounds, so a busy host (the memo's key reads synchronise with it; other
    # workers share the machine) slows them alike; only x_new gets new contents each round.
    x_same, x_new = torch.randn(256, 32768, device="cuda"), torch.randn(256, 32768, device="cuda")
    with pytest.warns(devicetime.HostBehindWarning):  # the memo's key reads wait for the GPU
        times = devicetime.interleaved_device_times_us(
            [lambda: kernel(x_same), lambda: kernel(x_new), lambda: adversaries.honest(x_same)],
            rounds=15,
            refresh=devicetime.fresh_contents(x_new),
        )
    # The least of each: the round least slowed by other work on the GPU and the host (under
    # `-n 16` on one GPU the medians of all three sat at 5.2-5.4 ms, the work's own 0.2).
    stale, fresh, honest = (min(t) for t in times)
    assert stale < 0.8 * fresh and fresh > 0.8 * honest, (stale, fresh, honest)
