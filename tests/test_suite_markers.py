"""tests/suite/markers.py: the one-platform-marker rule, benchmarks under xdist, and what a run
does with cuda tests when the GPU cannot be used; the rules are checked in pytest subprocesses."""

import json
import os
import re
from types import SimpleNamespace

import pytest

from tests.suite import markers
from tests.suite.testing import CASES, run_pytest

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize(
    "markexpr, expected",
    [
        ("cuda", True),
        ("cuda and not slow", True),
        ("cpu or cuda", True),
        ("cpu", False),
        ("not cuda", False),
        ("", False),
        ("cudagraph", False),
    ],
)
def test_selects_cuda(markexpr, expected):
    assert markers.selects_cuda(markexpr) is expected


class FakeItem:
    def __init__(self, *marks, fixtures=()):
        self.nodeid = f"test_x[{'-'.join(marks)}]"
        self.marks = list(marks)
        self.fixturenames = list(fixtures)
        self.added = []

    def get_closest_marker(self, name):
        return SimpleNamespace(name=name) if name in self.marks else None

    def add_marker(self, mark):
        self.added.append(mark)


def skip_reasons(item):
    return [m.kwargs["reason"] for m in item.added if m.name == "skip"]


def test_gpu_gating_asks_for_the_reason_only_when_cuda_tests_were_collected():
    def must_not_be_called():
        raise AssertionError("probed the GPU for a run without cuda tests")

    assert (
        markers.gate_cuda_items(
            [FakeItem("cpu")], markexpr="cuda", allow_no_gpu=False, unusable_reason=must_not_be_called
        )
        is None
    )


def test_gpu_gating_fails_a_cuda_run_and_skips_otherwise():
    reason = lambda: "no NVIDIA GPU visible"  # noqa: E731
    items = [FakeItem("cpu"), FakeItem("cuda")]
    message = markers.gate_cuda_items(items, markexpr="cuda", allow_no_gpu=False, unusable_reason=reason)
    assert message.startswith("-m cuda was asked for, but no NVIDIA GPU visible") and "--allow-no-gpu" in message
    assert items[1].added == []
    for markexpr, allow in (("cuda", True), ("", False), ("cpu", False)):
        items = [FakeItem("cpu"), FakeItem("cuda")]
        assert markers.gate_cuda_items(items, markexpr=markexpr, allow_no_gpu=allow, unusable_reason=reason) is None
        assert skip_reasons(items[0]) == [] and skip_reasons(items[1]) == ["cuda test: no NVIDIA GPU visible"]
    items = [FakeItem("cuda")]
    assert markers.gate_cuda_items(items, markexpr="cuda", allow_no_gpu=False, unusable_reason=lambda: None) is None
    assert items[0].added == []


def test_marker_errors_name_each_test():
    items = [FakeItem("cpu"), FakeItem(), FakeItem("cpu", "cuda")]
    assert markers.platform_marker_errors(items) == [
        "test_x[]: carries neither of the markers cpu / cuda",
        "test_x[cpu-cuda]: carries both of the markers cpu / cuda",
    ]


def test_only_benchmark_cases_are_skipped_under_xdist():
    items = [FakeItem("cuda", fixtures=("benchmark", "x")), FakeItem("cuda", fixtures=("x",))]
    markers.skip_benchmarks(items)
    assert skip_reasons(items[0]) == [markers.XDIST_BENCHMARK_SKIP] and items[1].added == []


# -- the rules, in a pytest subprocess -------------------------------------------------------------


def test_a_parallel_cuda_run_starts_the_first_builds_then_the_largest_inputs_first():
    def item(name, **params):
        return SimpleNamespace(name=name, callspec=SimpleNamespace(params=params))

    items = [
        item("small", B=5, V=100),
        SimpleNamespace(name="unparametrized"),
        item("large", B=1024, V=32769),
        item("no shape", kernel="fused"),
        item("compiled small", kernel="torch_compile", path="compiled", dtype="fp32", B=5, V=100),
        item("middle", B=64, V=1000),
        item("compiled again", kernel="torch_compile", path="compiled", dtype="fp32", B=5, V=100),
        item("compiled bf16", kernel="torch_compile", path="compiled", dtype="bf16", B=5, V=100),
        item("also small", B=100, V=5),
        item("fused split", kernel="fused", path="split", dtype="fp32", B=2, V=262145),
    ]
    markers.heaviest_first(items)
    assert [i.name for i in items] == [
        # one item of each build, largest input first
        "fused split",
        "compiled small",
        "compiled bf16",
        "no shape",
        # then the rest, largest input first, in collection order among equals
        "large",
        "middle",
        "small",
        "compiled again",
        "also small",
        "unparametrized",
    ]


def test_a_test_without_exactly_one_platform_marker_is_a_collection_error():
    result = run_pytest(str(CASES / "unmarked_case.py"))
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "test_without_platform_marker: carries neither" in output
    assert "test_with_both_markers: carries both" in output


def test_a_test_that_kills_its_worker_fails_once_and_the_run_goes_on():
    # The balanced scheduler of `pytest -m cpu`, on a grid run test by test and a small file run
    # whole: each test that kills its worker is one failure, and every other test runs once.
    result = run_pytest("-m", "cpu", str(CASES / "crash_case.py"), str(CASES / "crash_small_case.py"), timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "INTERNALERROR" not in output, output
    assert "2 failed, 43 passed" in output, output
    for crashed in ("crash_case.py::test_grid[3]", "crash_small_case.py::test_small[1]"):
        # one line in the short summary, whatever the terminal's width cuts from its message
        failed_line = re.compile(rf"^FAILED tests/harness_cases/{re.escape(crashed)}(?= |$)", re.MULTILINE)
        assert len(failed_line.findall(output)) == 1, output
        assert f"crashed while running 'tests/harness_cases/{crashed}'" in output, output


class FakeWorker:
    """What the scheduler sees of an xdist worker: the tests it was sent and, once `dead`, a
    closed channel (a worker that has died but is not yet reported down)."""

    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.dead = False
        self.sent = []

    def send_runtest_some(self, indices):
        if self.dead:
            raise OSError("cannot send (already closed?)")
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


def test_work_sent_to_a_worker_not_yet_reported_down_is_run_by_another():
    # The race the crash case above meets now and then on a busy machine: a worker reports a
    # test done and dies in its next; when the report is read, the scheduler sends it more work
    # over a closed channel. The run goes on, and that work is handed out again once the worker
    # is reported down.
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True), cache=None, getvalue=lambda _: ["2*popen"])
    scheduler = markers.balanced_scheduler(config, None)
    collection = [f"tests/test_grid.py::test_case[{i}]" for i in range(40)]
    live, dying = FakeWorker("gw0"), FakeWorker("gw1")
    for worker in (live, dying):
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    finished, crashed = dying.sent[:2]
    dying.dead = True
    scheduler.mark_test_complete(dying, finished)
    assert scheduler.remove_node(dying) == collection[crashed]  # reported once, as the crash
    done = set()
    while set(live.sent) - done:  # the live worker runs what it is sent, the dead one's work too
        index = min(set(live.sent) - done)
        done.add(index)
        scheduler.mark_test_complete(live, index)
    assert sorted(done | {finished, crashed}) == list(range(40)) and len(done) == 38


def test_cuda_run_without_a_gpu_fails_with_one_clear_line():
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    result = run_pytest("-m", "cuda", str(CASES / "cuda_case.py"), env=no_gpu)
    assert result.returncode == markers.NO_GPU_EXIT_STATUS, result.stdout + result.stderr
    assert "-m cuda was asked for, but no NVIDIA GPU visible" in result.stdout + result.stderr
    # The opt-out turns the failure into visible skips.
    result = run_pytest("-m", "cuda", "--allow-no-gpu", "-rs", str(CASES / "cuda_case.py"), env=no_gpu)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "cuda test: no NVIDIA GPU visible" in result.stdout


def test_benchmarks_under_xdist_are_skipped_with_a_reason():
    result = run_pytest("-n", "2", "-rs", str(CASES / "benchmark_case.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "benchmarks do not run under xdist" in result.stdout


@pytest.mark.parametrize(
    "markexpr, expected",
    [("", True), ("cpu", True), ("cpu and not slow", True), ("cpu or cuda", True), ("cuda", False), ("not cpu", False)],
)
def test_selects_cpu(markexpr, expected):
    assert markers.selects_cpu(markexpr) is expected


def test_a_cpu_run_names_the_kernels_it_could_not_run():
    def kernel(name, *, baseline=False, interpretable=False, missing=None):
        return SimpleNamespace(
            name=name, baseline=baseline, interpretable=interpretable, unavailable_reason=lambda: missing
        )

    kernels = [
        kernel("cuda_c"),
        kernel("interpreted", interpretable=True),
        kernel("baseline_on_gpu", baseline=True),
        kernel("other_cuda_c"),
        kernel("no_package", interpretable=True, missing="needs Triton"),
    ]
    assert markers.cpu_coverage_lines(kernels) == [
        "verified on CUDA only: cuda_c, other_cuda_c",
        "not verified on this machine: no_package (needs Triton)",
    ]
    assert markers.cpu_coverage_lines(kernels[1:3]) == []


def test_without_triton_what_needs_it_skips_with_one_reason(tmp_path):
    """Triton publishes Linux wheels only. With triton not importable (hidden as a missing package
    is, in every process of the run) every test module still imports, the tests that need Triton
    skip with one reason, the rest run, and the summary says what was not verified."""
    (tmp_path / "sitecustomize.py").write_text("import sys\n\nsys.modules['triton'] = None  # import triton fails\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    selection = "contiguous-fp32 and (triton-tile or F_softmax-torch)"
    args = ("-m", "cpu", "-p", "no:xdist", "--no-reports", "-q", "-rs", "--assert=plain", "-k", selection)
    result = run_pytest(*args, env={"PYTHONPATH": path})
    out = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.OK, out[-3000:]
    reasons = set(re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", result.stdout, re.M))
    assert len(reasons) == 1 and "needs Triton" in reasons.pop(), reasons
    assert re.search(r"\b1 passed", result.stdout), out[-3000:]  # F.softmax's cell ran
    assert "not verified on this machine: triton (needs Triton" in result.stdout


def test_benchmark_timing_is_off_in_xdist_workers():
    option = SimpleNamespace(benchmark_disable=False)
    assert not markers.quiet_benchmarks_in_workers(option, is_worker=False) and not option.benchmark_disable
    assert markers.quiet_benchmarks_in_workers(option, is_worker=True) and option.benchmark_disable
    assert not markers.quiet_benchmarks_in_workers(SimpleNamespace(), is_worker=True)  # no pytest-benchmark


def test_small_files_travel_whole_and_large_files_test_by_test():
    ids = [f"tests/test_big.py::test_case[{i}]" for i in range(4)] + [
        "tests/test_small.py::test_a",
        "tests/test_small.py::test_b",
    ]
    assert markers.whole_files(ids, max_tests=3) == {"tests/test_small.py"}
    assert markers.whole_files(ids, max_tests=4) == {"tests/test_small.py", "tests/test_big.py"}


def test_work_is_ordered_by_the_last_runs_seconds_longest_first():
    big = [f"tests/test_big.py::test_case[{i}]" for i in range(markers.WHOLE_FILE_MAX_TESTS + 1)]
    small = ["tests/test_small.py::test_a", "tests/test_small.py::test_b"]
    items = [SimpleNamespace(nodeid=n) for n in big + small]
    before = list(items)
    assert not markers.costliest_first(items, {}) and items == before  # a first run: xdist's order
    seconds = {n: 0.01 for n in big} | {big[1]: 3.0, big[2]: 0.5, small[0]: 1.0, small[1]: 1.5}
    del seconds[big[3]]
    assert markers.costliest_first(items, seconds)
    # The small file is one unit of 2.5 s (its tests stay in order), each test of the large file
    # one; a test the last run did not time goes first.
    order = [i.nodeid for i in items]
    assert order[:5] == [big[3], big[1], *small, big[2]]
    assert sorted(order) == sorted(big + small)


def test_a_run_remembers_each_tests_seconds_beside_the_earlier_ones():
    class Cache(dict):
        def set(self, key, value):
            self[key] = json.loads(json.dumps(value))

    cache = Cache({markers.SECONDS_CACHE_KEY: {"tests/test_x.py::gone": 2.0, "tests/test_x.py::a": 9.0}})
    times = markers.FileTimes()
    for phase, seconds in (("setup", 0.25), ("call", 1.0), ("teardown", 0.25)):
        times.add(SimpleNamespace(nodeid="tests/test_x.py::a", duration=seconds, when=phase))
    times.remember(cache)
    assert cache[markers.SECONDS_CACHE_KEY] == {"tests/test_x.py::gone": 2.0, "tests/test_x.py::a": 1.5}
    assert times.line() == "test time 2 s; slowest files: test_x.py 2 s"


def test_a_run_that_loaded_no_kernel_registry_says_nothing_of_the_kernels():
    import kernels.registry

    loaded = {"kernels.registry": kernels.registry}
    expected = markers.cpu_coverage_lines(kernels.registry.SOFTMAX_KERNELS.values())
    assert expected and markers.run_cpu_coverage_lines("cpu", collect_only=False, modules=loaded) == expected
    assert markers.run_cpu_coverage_lines("cpu", collect_only=False, modules={}) is None
    assert markers.run_cpu_coverage_lines("cuda", collect_only=False, modules=loaded) is None
    assert markers.run_cpu_coverage_lines("cpu", collect_only=True, modules=loaded) is None


def test_the_laptop_loop_leaves_the_deeper_tier_to_its_own_run(tmp_path):
    loop = run_pytest("-m", "cpu", "-p", "no:xdist", str(CASES / "tier_case.py"), "--no-reports", "-v")
    output = loop.stdout + loop.stderr
    assert loop.returncode == 0, output
    assert "test_laptop_loop PASSED" in output and "test_deeper_tier" not in output
    assert "1 passed, 2 deselected" in output
    assert f"1 {markers.SLOW_DESELECTED}" in output
    # The run says where its time went.
    assert re.search(r"test time \d+ s; slowest files: tier_case.py \d+ s", output), output
    deep = run_pytest("-m", "cpu and slow", "-p", "no:xdist", str(CASES / "tier_case.py"), "--no-reports", "-v")
    output = deep.stdout + deep.stderr
    assert deep.returncode == 0, output
    assert "test_deeper_tier PASSED" in output and "test_laptop_loop" not in output
    assert markers.SLOW_DESELECTED not in output


def test_a_cuda_run_keeps_its_slow_tests():
    items = [
        SimpleNamespace(get_closest_marker=lambda name, marks=marks: name if name in marks else None)
        for marks in (("cpu",), ("cpu", "slow"), ("cuda", "slow"))
    ]
    kept = list(items)
    assert markers.deselect_slow_cpu(kept, "cuda") == [items[1]]
    assert kept == [items[0], items[2]]
    kept = list(items)
    assert markers.deselect_slow_cpu(kept, "cpu and slow") == [] and kept == items
