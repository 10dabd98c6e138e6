"""Suite-wide hooks and the two fixtures every test may use. The logic lives in tests/suite/
(one module per job, each with its own tests); this file only wires it into pytest."""

import os
import sys
import zlib
from pathlib import Path

import pytest

from tests.suite import coverage, gate, gpus, interpreter, manifest, markers, records

# Each xdist worker gets its own GPU before anything can initialise CUDA in it.
gpus.pin_xdist_worker(os.environ.get("PYTEST_XDIST_WORKER"))

# Without a GPU, Triton kernels run on CPU tensors through its interpreter; the variable must be
# set before any kernel module is imported.
if not gpus.visible_gpu_ids():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_collector = records.Collector()
_coverage = coverage.Tracker()
_file_times = markers.FileTimes()
_coverage_result = pytest.StashKey[coverage.CoverageResult]()
_gate_result = pytest.StashKey[gate.GateResult]()
_baseline_recorded = pytest.StashKey[str]()
_written = pytest.StashKey[list]()
_quick_line = pytest.StashKey[str]()
_balanced = pytest.StashKey[bool]()
_ORDERED = "softmax_suite_ordered_by_seconds"
_cpu_coverage = pytest.StashKey[list]()
_slow_line = pytest.StashKey[str]()


def pytest_addoption(parser):
    group = parser.getgroup("softmax-suite")
    group.addoption(
        "--allow-no-gpu",
        action="store_true",
        help="with -m cuda on a machine without a usable GPU, skip the cuda tests instead of failing the run",
    )
    group.addoption(
        "--reports-dir",
        default=None,
        metavar="DIR",
        help="write manifest.json and the figures into DIR at the end of the run (default: reports/ after a "
        "--benchmark-only run, nowhere after any other run, so that a test run leaves the tree clean)",
    )
    group.addoption("--no-reports", action="store_true", help="write no reports at the end of the run")
    group.addoption(
        "--loss-grid",
        choices=("default", "full"),
        default="default",
        help="the shapes tests/test_loss_benchmarks.py times: default (device time at N = 4096, three "
        "vocabularies, ~90 s) or full (the whole N x V grid in every clock, ~13 min)",
    )
    group.addoption(
        "--regression-gate",
        action="store_true",
        help="fail the run when fused or triton fell behind F.softmax (a training op: PyTorch's eager "
        "op), beyond the noise of both runs, "
        "against the baseline of this GPU model (tests/suite/gate.py)",
    )
    group.addoption(
        "--regression-baseline",
        default=str(gate.DEFAULT_DIR),
        help="the baselines --regression-gate compares with: a folder of <model>.json files, one such "
        "file, or a manifest (its figures converted, dispersion unknown) (default: reports/baselines/)",
    )
    group.addoption(
        "--record-baseline",
        nargs="?",
        const=str(gate.DEFAULT_DIR),
        default=None,
        metavar="DIR",
        help="write this run's paired measurements as the baseline of its GPU model, DIR/<model>.json "
        "(default: reports/baselines/), keeping the cases it did not time",
    )
    group.addoption(
        "--gate-quick",
        nargs="?",
        const="",
        default=None,
        metavar="GPU_MODEL",
        help="run only the benchmark cases the regression gate compares: the (case, mode) pairs the baseline "
        "of this GPU model (or GPU_MODEL) gates in --regression-baseline, with fewer device-time rounds; every "
        "gated case where the model has no baseline (tests/suite/gate.py)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    markers.quiet_benchmarks_in_workers(config.option, is_worker=hasattr(config, "workerinput"))
    config.stash[_balanced] = markers.parallel_cpu_by_default(
        config.option,
        config.getoption("markexpr"),
        is_worker=hasattr(config, "workerinput"),
        collect_only=config.getoption("collectonly"),
    )
    if getattr(config, "workerinput", {}).get(_ORDERED):
        config.pluginmanager.register(markers.CostOrder(), "softmax-suite-cost-order")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.stash.get(_balanced, False):
        return markers.balanced_scheduler(config, log)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    # The workers of a balanced run order their collections by the last run's seconds.
    node.workerinput[_ORDERED] = node.config.stash.get(_balanced, False)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    lines = getattr(node, "workeroutput", {}).get(markers.CPU_COVERAGE_KEY)
    if lines is not None:
        node.config.stash[_cpu_coverage] = lines


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` on a cuda run starts one worker per GPU."""
    if markers.selects_cuda(config.getoption("markexpr")):
        return len(gpus.visible_gpu_ids()) or None
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    errors = markers.platform_marker_errors(items)
    if errors:
        raise pytest.UsageError(markers.platform_marker_message(errors))
    slow = markers.deselect_slow_cpu(items, config.getoption("markexpr"))
    if slow:
        config.hook.pytest_deselected(items=slow)
    if slow and markers.selects_cpu(config.getoption("markexpr")):
        config.stash[_slow_line] = f"{len(slow)} {markers.SLOW_DESELECTED}"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        markers.skip_benchmarks(items)
        if markers.selects_cuda(config.getoption("markexpr")):
            markers.heaviest_first(items)
    message = markers.gate_cuda_items(
        items,
        markexpr=config.getoption("markexpr"),
        allow_no_gpu=config.getoption("allow_no_gpu"),
        unusable_reason=gpus.gpu_unusable_reason,
    )
    if message:
        pytest.exit(message, returncode=markers.NO_GPU_EXIT_STATUS)
    if config.getoption("gate_quick") is not None:
        try:
            config.stash[_quick_line] = gate.select_quick(config, items, gpus.describe_gpu)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None


@pytest.fixture(autouse=True)
def _seed_everything(request):
    """A fixed seed per test, different between tests: reproducible, yet no two tests share inputs.
    torch is seeded where it is imported: a test file that uses it imports it when collected, and
    a process that never needs it (a child run of the suite's own tests) is spared its import."""
    import numpy as np

    torch = sys.modules.get("torch")
    seed = zlib.crc32(request.node.nodeid.encode())
    np.random.seed(seed)
    if torch is not None:
        torch.manual_seed(seed)
    yield
    torch = sys.modules.get("torch")  # the test may have imported it
    if torch is not None and request.node.get_closest_marker("cuda") and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        if "cupy" in sys.modules:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()


@pytest.fixture
def record_manifest(request):
    """`record_manifest(section, **values)` puts values into reports/manifest.json at the end of
    the run (combined over tests as tests/suite/records.py says). Record before asserting."""

    def record(section: str, **values):
        manifest.check_section(section)
        request.node.user_properties.append((records.RECORD_KEY, (section, values)))

    return record


def pytest_sessionstart(session):
    # Read before this run can record a new baseline.
    config = session.config
    if config.getoption("regression_gate") and not hasattr(config, "workerinput"):
        try:
            config.stash[gate.SCREEN] = gate.Screen(gate.load_baselines(Path(config.getoption("regression_baseline"))))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_runtest_setup(item):
    # Once a test module has imported Triton's interpreter: its nested calls made cheaper.
    interpreter.call_device_functions_directly()


def pytest_runtest_logreport(report):
    # Runs in the controller for every worker's report too, so xdist runs lose nothing.
    _collector.add(report)
    _coverage.add(report)
    _file_times.add(report)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput"):
        # xdist workers write nothing (the controller gathers their records); they tell it what
        # the summary says of the kernels, which their tests loaded.
        config.workeroutput[markers.CPU_COVERAGE_KEY] = markers.run_cpu_coverage_lines(
            config.getoption("markexpr"), collect_only=config.getoption("collectonly")
        )
        return
    if config.getoption("collectonly"):
        return
    if config.stash.get(_balanced, False) and getattr(config, "cache", None) is not None:
        _file_times.remember(config.cache)
    covered = config.stash[_coverage_result] = _coverage.result()
    if covered.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    benchmarks = records.benchmark_records(getattr(config, "_benchmarksession", None))
    # Kernel timings name the GPU they ran on, even where this process never touched CUDA itself
    # (the cuda tests ran in xdist workers): nvidia-smi names it then.
    environment = manifest.run_environment(
        gpus.measured_gpu(_collector.gpu_work_ran or bool(benchmarks)), config.invocation_params.args
    )
    if not config.getoption("no_reports"):
        config.stash[_written] = manifest.write_reports(
            manifest.reports_destination(config),
            benchmarks=benchmarks,
            recorded=_collector.combined(),
            environment=environment,
            start_from=manifest.REPORTS_DIR / "manifest.json",
        )
    screen = config.stash.get(gate.SCREEN, None)  # absent when the baselines could not be read
    if config.getoption("regression_gate") and screen is not None:
        model = (environment.get("gpu") or {}).get("model")
        baseline, where = screen.baselines.get(model, (None, config.getoption("regression_baseline")))
        result = gate.evaluate(baseline, benchmarks, model, source=where)
        config.stash[_gate_result] = result
        if result.failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if config.getoption("record_baseline"):
        config.stash[_baseline_recorded] = gate.record_baseline(
            Path(config.getoption("record_baseline")),
            benchmarks,
            environment,
            gate_result=config.stash.get(_gate_result, None),
        )


def pytest_terminal_summary(terminalreporter, config):
    covered = config.stash.get(_coverage_result, None)
    for line in covered.lines() if covered else ():
        terminalreporter.write_line(line, red=covered.failed, bold=covered.failed)
    lines = config.stash.get(_cpu_coverage, None)
    if lines is None:
        lines = markers.run_cpu_coverage_lines(
            config.getoption("markexpr"), collect_only=config.getoption("collectonly")
        )
    for line in lines or ():
        terminalreporter.write_line(line, yellow=True)
    written = config.stash.get(_written, None)
    if written:
        terminalreporter.write_line("reports written: " + ", ".join(str(p) for p in written))
    recorded = config.stash.get(_baseline_recorded, None)
    if recorded:
        terminalreporter.write_line(recorded)
    slow = config.stash.get(_slow_line, None)
    if slow and not hasattr(config, "workerinput"):
        terminalreporter.write_line(slow)
    cost = _file_times.line()
    if cost and not hasattr(config, "workerinput"):
        terminalreporter.write_line(cost)
    quick = config.stash.get(_quick_line, None)
    if quick:
        terminalreporter.write_line(quick)
    result = config.stash.get(_gate_result, None)
    if result is not None:
        for line in result.lines():
            terminalreporter.write_line(line, red=result.failed, bold=result.failed)
