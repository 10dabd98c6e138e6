"""Suite-wide hooks and the two fixtures every test may use. The logic lives in tests/suite/
(one module per job, each with its own tests); this file only wires it into pytest."""

import os
import sys
import zlib
from pathlib import Path

import pytest

from tests.suite import gate, gpus, manifest, markers, records

ROOT = Path(__file__).resolve().parent

# Each xdist worker gets its own GPU before anything can initialise CUDA in it.
gpus.pin_xdist_worker(os.environ.get("PYTEST_XDIST_WORKER"))

# Without a GPU, Triton kernels run on CPU tensors through its interpreter; the variable must be
# set before any kernel module is imported.
if not gpus.visible_gpu_ids():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_collector = records.Collector()
_baseline = pytest.StashKey[dict | None]()
_gate_result = pytest.StashKey[gate.GateResult]()
_written = pytest.StashKey[list]()


def pytest_addoption(parser):
    group = parser.getgroup("softmax-suite")
    group.addoption(
        "--allow-no-gpu",
        action="store_true",
        help="with -m cuda on a machine without a usable GPU, skip the cuda tests instead of failing the run",
    )
    group.addoption(
        "--reports-dir",
        default=str(ROOT / "reports"),
        help="folder for manifest.json and the figures (default: reports/)",
    )
    group.addoption("--no-reports", action="store_true", help="write no reports at the end of the run")
    group.addoption(
        "--regression-gate",
        action="store_true",
        help="fail the run when fused or triton, relative to F.softmax, is more than 10%% slower than "
        "in the committed manifest for the same GPU model",
    )
    group.addoption(
        "--regression-baseline",
        default=str(ROOT / "reports" / "manifest.json"),
        help="the manifest --regression-gate compares with (default: the committed reports/manifest.json)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    markers.quiet_benchmarks_in_workers(config.option, is_worker=hasattr(config, "workerinput"))
    markers.parallel_cpu_by_default(
        config.option,
        config.getoption("markexpr"),
        is_worker=hasattr(config, "workerinput"),
        collect_only=config.getoption("collectonly"),
    )


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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        markers.skip_benchmarks(items)
    message = markers.gate_cuda_items(
        items,
        markexpr=config.getoption("markexpr"),
        allow_no_gpu=config.getoption("allow_no_gpu"),
        unusable_reason=gpus.gpu_unusable_reason,
    )
    if message:
        pytest.exit(message, returncode=markers.NO_GPU_EXIT_STATUS)


@pytest.fixture(autouse=True)
def _seed_everything(request):
    """A fixed seed per test, different between tests: reproducible, yet no two tests share inputs."""
    import numpy as np
    import torch

    seed = zlib.crc32(request.node.nodeid.encode())
    np.random.seed(seed)
    torch.manual_seed(seed)
    yield
    if request.node.get_closest_marker("cuda") and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        if "cupy" in sys.modules:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()


@pytest.fixture
def record_manifest(request):
    """`record_manifest(section, **values)` puts values into reports/manifest.json at the end of
    the run (combined over tests as tests/suite/records.py says). Record before asserting."""

    def record(section: str, **values):
        request.node.user_properties.append((records.RECORD_KEY, (section, values)))

    return record


def pytest_sessionstart(session):
    # Read before this run's reports can overwrite the file.
    config = session.config
    if config.getoption("regression_gate") and not hasattr(config, "workerinput"):
        config.stash[_baseline] = manifest.read_manifest(Path(config.getoption("regression_baseline")))


def pytest_runtest_logreport(report):
    # Runs in the controller for every worker's report too, so xdist runs lose nothing.
    _collector.add(report)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput") or config.getoption("collectonly"):
        return  # xdist workers write nothing; the controller gathers their records
    benchmarks = records.benchmark_records(getattr(config, "_benchmarksession", None))
    # Kernel timings name the GPU they ran on, even where this process never touched CUDA itself
    # (the cuda tests ran in xdist workers): nvidia-smi names it then.
    environment = manifest.run_environment(
        gpus.measured_gpu(_collector.gpu_work_ran or bool(benchmarks)), config.invocation_params.args
    )
    if not config.getoption("no_reports"):
        config.stash[_written] = manifest.write_reports(
            Path(config.getoption("reports_dir")),
            benchmarks=benchmarks,
            recorded=_collector.combined(),
            environment=environment,
        )
    if config.getoption("regression_gate"):
        current = manifest.build_manifest(None, benchmarks=benchmarks, recorded={}, environment=environment)
        result = gate.compare(config.stash.get(_baseline, None), current)
        config.stash[_gate_result] = result
        if result.failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if markers.selects_cpu(config.getoption("markexpr")) and not config.getoption("collectonly"):
        from kernels import SOFTMAX_KERNELS

        for line in markers.cpu_coverage_lines(SOFTMAX_KERNELS.values()):
            terminalreporter.write_line(line, yellow=True)
    written = config.stash.get(_written, None)
    if written:
        terminalreporter.write_line("reports written: " + ", ".join(str(p) for p in written))
    result = config.stash.get(_gate_result, None)
    if result is not None:
        for line in result.lines():
            terminalreporter.write_line(line, red=result.failed, bold=result.failed)
