"""Collection rules: every test carries exactly one platform marker, benchmarks do not run under
xdist, and what becomes of cuda tests on a machine whose GPU cannot be used."""

import os
import re
import sys
from collections.abc import Callable

import pytest

PLATFORM_MARKERS = ("cpu", "cuda")

XDIST_BENCHMARK_SKIP = (
    "benchmarks do not run under xdist (-n): run them in a single process, e.g. pytest -m cuda --benchmark-only"
)
NO_GPU_EXIT_STATUS = 3


def platform_marker_errors(items) -> list[str]:
    """Node ids of tests that carry neither or both of the cpu / cuda markers."""
    errors = []
    for item in items:
        found = [m for m in PLATFORM_MARKERS if item.get_closest_marker(m) is not None]
        if len(found) != 1:
            what = "neither" if not found else "both"
            errors.append(f"{item.nodeid}: carries {what} of the markers cpu / cuda")
    return errors


def platform_marker_message(errors: list[str]) -> str:
    return "every test must carry exactly one of the markers cpu / cuda:\n  " + "\n  ".join(errors)


def selects_cuda(markexpr: str) -> bool:
    """Whether a -m expression asks for cuda tests (e.g. 'cuda', 'cuda and not slow')."""
    return re.search(r"(?<![\w-])cuda(?![\w-])", markexpr or "") is not None and not re.search(
        r"not\s+cuda(?![\w-])", markexpr
    )


def selects_cpu(markexpr: str) -> bool:
    """Whether a -m expression lets cpu tests run (no expression: every test runs)."""
    markexpr = (markexpr or "").strip()
    if not markexpr:
        return True
    return re.search(r"(?<![\w-])cpu(?![\w-])", markexpr) is not None and not re.search(r"not\s+cpu(?![\w-])", markexpr)


def cpu_coverage_lines(kernels) -> list[str]:
    """What a CPU run leaves to the GPU, for its summary: the kernels of ours that no CPU case
    runs (they do not run under Triton's interpreter), and those whose backend is missing."""
    lines = []
    cuda_only = [k.name for k in kernels if not k.baseline and not k.interpretable]
    if cuda_only:
        lines.append("verified on CUDA only: " + ", ".join(cuda_only))
    missing: dict[str, list[str]] = {}
    for k in kernels:
        reason = k.unavailable_reason() if k.interpretable else None
        if reason:
            missing.setdefault(reason, []).append(k.name)
    for reason, names in missing.items():
        lines.append(f"not verified on this machine: {', '.join(names)} ({reason})")
    return lines


# The key under which an xdist worker hands run_cpu_coverage_lines to the controller.
CPU_COVERAGE_KEY = "softmax_suite_cpu_coverage"


def run_cpu_coverage_lines(markexpr: str | None, *, collect_only: bool, modules=sys.modules) -> list[str] | None:
    """cpu_coverage_lines of the kernel registry for this process's run, or None where the run
    says nothing of the kernels: it selects no cpu test, only collects, or never loaded the
    registry (it ran none of the kernels' cases: a child run of the suite's own tests, which the
    registry would cost the import of torch). Under xdist the workers, which loaded it, compute
    the lines for the controller."""
    if not selects_cpu(markexpr) or collect_only or "kernels.registry" not in modules:
        return None
    from kernels import SOFTMAX_KERNELS

    return cpu_coverage_lines(SOFTMAX_KERNELS.values())


def skip_benchmarks(items) -> None:
    """Under xdist pytest-benchmark would silently run each case once; say so instead."""
    skip = pytest.mark.skip(reason=XDIST_BENCHMARK_SKIP)
    for item in items:
        if "benchmark" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


def gate_cuda_items(
    items, *, markexpr: str, allow_no_gpu: bool, unusable_reason: Callable[[], str | None]
) -> str | None:
    """Skip the cuda tests when the GPU cannot be used, or return the message to exit with.

    `unusable_reason` is only called when cuda tests were collected: it may initialise CUDA.
    A run that asked for cuda (`-m cuda`) on a machine without a usable GPU must fail loudly,
    not report everything skipped; `--allow-no-gpu` turns that into skips.
    """
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return None
    reason = unusable_reason()
    if reason is None:
        return None
    if selects_cuda(markexpr) and not allow_no_gpu:
        return f"-m cuda was asked for, but {reason}. Pass --allow-no-gpu to skip the cuda tests instead."
    skip = pytest.mark.skip(reason=f"cuda test: {reason}")
    for item in cuda_items:
        item.add_marker(skip)
    return None


def quiet_benchmarks_in_workers(option, *, is_worker: bool) -> bool:
    """In an xdist worker the benchmark cases are skipped with the reason (skip_benchmarks);
    pytest-benchmark is turned off there too, which spares every parallel run its own warning
    that it disabled itself under xdist. Returns whether it changed anything."""
    if not is_worker or not hasattr(option, "benchmark_disable"):
        return False
    option.benchmark_disable = True
    return True


def heaviest_first(items) -> None:
    """Order a parallel cuda run's items so that the costs paid once per worker start at once.

    First, one item of each build (kernel, path, dtype: what a first launch compiles, for
    torch.compile 10-13 s of a cold worker, for a Triton path or a fused size class a few
    seconds), largest input first; then every other item, largest input first (stable). xdist
    hands items out in this order, so the first builds and the few cases at a million elements
    or more spread over the workers at the start instead of one worker meeting several of them
    at the end (the wall time of `pytest -m "cuda and quick" -n 8` is the busiest worker's).
    Each worker orders its collection the same way, as xdist requires."""

    def params(item) -> dict:
        return getattr(getattr(item, "callspec", None), "params", {})

    def elements(item) -> int:
        B, V = params(item).get("B"), params(item).get("V")
        return B * V if isinstance(B, int) and isinstance(V, int) else 0

    def build(item):
        p = params(item)
        return (p["kernel"], p.get("path"), str(p.get("dtype"))) if "kernel" in p else None

    seen = set()
    first = []
    for item in sorted(items, key=lambda item: -elements(item)):
        key = build(item)
        if key is not None and key not in seen:
            seen.add(key)
            first.append(item)
    chosen = {id(item) for item in first}
    items[:] = first + sorted((item for item in items if id(item) not in chosen), key=lambda item: -elements(item))


# The two CPU tiers: the laptop loop, and the deeper tier (slow: every ahead-of-time build, long
# interpreted rows, the child runs of the whole suite) that CI runs after it.
CPU_TIERS = ("cpu", "cpu and slow")
SLOW_DESELECTED = "slow cpu tests deselected (the deeper tier): pytest -m 'cpu and slow' runs them"


def deselect_slow_cpu(items, markexpr: str | None) -> list:
    """Take the cpu tests marked slow out of a run whose -m expression does not name slow, so
    that `pytest -m cpu` is the laptop loop and `pytest -m "cpu and slow"` the deeper tier; a
    cuda run keeps its slow tests. Returns the items taken out (for pytest_deselected)."""
    if re.search(r"(?<![\w-])slow(?![\w-])", markexpr or ""):
        return []
    slow = [item for item in items if item.get_closest_marker("slow") and item.get_closest_marker("cpu")]
    if slow:
        chosen = {id(item) for item in slow}
        items[:] = [item for item in items if id(item) not in chosen]
    return slow


# A plain `pytest -m cpu` runs on this many xdist workers (the CI machine has two cores).
CPU_WORKERS = 2
_BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parallel_cpu_by_default(
    option, markexpr: str | None, *, is_worker: bool, collect_only: bool, environ=os.environ
) -> bool:
    """Spread a plain `pytest -m cpu` over CPU_WORKERS xdist workers, small files whole and the
    tests of large files one by one (`balanced_scheduler`; the coverage matrix checks its own
    cells across workers). An explicit -n (or -p no:xdist), another marker expression,
    --collect-only, or an xdist worker itself keeps pytest's own choice. Each worker gets one
    BLAS thread: two workers with two threads each thrash on two cores. Returns whether it
    changed anything: the caller then asks xdist for `balanced_scheduler`."""
    if is_worker or collect_only or (markexpr or "").strip() not in CPU_TIERS:
        return False
    if not hasattr(option, "numprocesses") or option.numprocesses is not None:
        return False
    option.numprocesses = CPU_WORKERS
    option.dist = "load"
    for name in _BLAS_THREAD_VARIABLES:
        environ.setdefault(name, "1")
    return True


# A file of at most this many selected tests goes to one worker whole: the suite's small files
# share a module-scoped result between their tests (a child pytest run, drawn figures), which
# two workers would each compute. Larger files are the per-case grids, spread test by test.
WHOLE_FILE_MAX_TESTS = 32


def whole_files(nodeids, max_tests: int = WHOLE_FILE_MAX_TESTS) -> set[str]:
    """The test files of `nodeids` that hold at most `max_tests` of them."""
    counts: dict[str, int] = {}
    for nodeid in nodeids:
        file = nodeid.split("::", 1)[0]
        counts[file] = counts.get(file, 0) + 1
    return {file for file, n in counts.items() if n <= max_tests}


# Where a plain `pytest -m cpu` keeps the seconds of each test for the next run (pytest's cache,
# .pytest_cache/, outside the tree git sees).
SECONDS_CACHE_KEY = "softmax-suite/test-seconds"


def costliest_first(items: list, seconds: dict[str, float]) -> bool:
    """Order `items` (in place) by the units `balanced_scheduler` hands out, each small file
    whole and each test of a larger file alone: the units the last run did not time first (in
    their collected order), then the rest by their last seconds, longest first, so that the run
    does not end on one long test while the other worker waits. A unit keeps its tests' order.
    Every worker orders its collection alike (the same cache), as xdist requires. Returns whether
    seconds were known, so the order is this one and not xdist's (by tests per unit)."""
    if not seconds:
        return False
    whole = whole_files(item.nodeid for item in items)
    units: dict[str, list] = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        units.setdefault(file if file in whole else item.nodeid, []).append(item)

    def cost(unit):
        known = [seconds.get(item.nodeid) for item in unit]
        return -1.0 if None in known else sum(known)

    order = sorted(units.values(), key=lambda unit: (cost(unit) >= 0, -cost(unit)))
    items[:] = [item for unit in order for item in unit]
    return True


class CostOrder:
    """The plugin each worker of a balanced run registers: once the markers have deselected
    what the run leaves out, its collection is put in `costliest_first` order."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        cache = getattr(config, "cache", None)
        if cache is not None:
            costliest_first(items, cache.get(SECONDS_CACHE_KEY, {}))


def ordered_by_seconds(config) -> bool:
    """Whether this run's collections are ordered by the last run's seconds (`costliest_first`)."""
    cache = getattr(config, "cache", None)
    return bool(cache is not None and cache.get(SECONDS_CACHE_KEY, None))


def balanced_scheduler(config, log):
    """The xdist scheduler of a plain `pytest -m cpu`: each small file (whole_files) is one unit
    of work, each test of a larger file is one. Units are handed out longest first by the last
    run's seconds (`costliest_first`; on a first run, largest first: xdist's loadscope order), so
    long tests start early and the many short cases of the grids come last, where a worker that
    finishes early takes the next one: both workers end within about one test of each other.
    (Whole files, one per worker, left one worker idle while the other ran the last long file;
    xdist's own loadgroup does not group under pytest 9.2.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Balanced(LoadScopeScheduling):
        whole: set[str] = set()

        def schedule(self):
            if self.collection is None and self.registered_collections:
                self.whole = whole_files(next(iter(self.registered_collections.values())))
                if ordered_by_seconds(config):
                    config.option.loadscopereorder = False  # the workers' collections are in order
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return file if file in self.whole else nodeid

        # A worker that dies (a kernel that aborts the interpreter) is replaced. Loadscope would
        # hand the test it died in, with the rest of its unit, to another worker, which then dies
        # too; would put back units already run; and would give a replacement one test at most,
        # which a worker never runs while it waits to learn the next. Here the test that killed a
        # worker is reported failed once, as xdist's load scheduler does, only units with tests
        # left go back in the queue, and every worker holds two tests while there is work.
        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            pending = [nid for unit in workload.values() for nid, done in unit.items() if not done]
            if not pending:
                return None
            crashed = pending[0]  # a worker runs its tests in order: the first not completed
            for scope, unit in workload.items():
                if crashed in unit:
                    unit[crashed] = True
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _assign_work_unit(self, node):
            # A worker that died a moment ago is not yet reported down, and sending it work
            # fails: the unit stays in its assigned work, which remove_node puts back in the
            # queue when the report comes.
            try:
                super()._assign_work_unit(node)
            except OSError:
                pass

        def _reschedule(self, node):
            if node not in self.registered_collections or node.shutting_down:
                return  # a replacement gets work once its collection is in (schedule() again)
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)

    return Balanced(config, log)


class FileTimes:
    """Seconds each test file took (setup, call and teardown of its tests, summed over xdist
    workers), for the one summary line that shows where a run's time went, and each test's, for
    the next run's order (`remember`, `costliest_first`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.tests: dict[str, float] = {}

    def add(self, report) -> None:
        file = report.nodeid.split("::", 1)[0]
        seconds = float(getattr(report, "duration", 0.0) or 0.0)
        self.seconds[file] = self.seconds.get(file, 0.0) + seconds
        self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + seconds

    def remember(self, cache) -> None:
        """Keep this run's seconds per test in pytest's cache (beside the earlier runs' of the
        tests this one did not run), where the next balanced run orders its work by them."""
        if self.tests:
            kept = dict(cache.get(SECONDS_CACHE_KEY, {}) or {})
            kept.update({nodeid: round(seconds, 3) for nodeid, seconds in self.tests.items()})
            cache.set(SECONDS_CACHE_KEY, kept)

    def line(self, top: int = 5) -> str | None:
        if not self.seconds:
            return None
        total = sum(self.seconds.values())
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:top]
        files = ", ".join(f"{file.rsplit('/', 1)[-1]} {seconds:.0f} s" for file, seconds in slowest)
        return f"test time {total:.0f} s; slowest files: {files}"
