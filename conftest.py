"""Suite-wide hooks: GPU gating, xdist GPU pinning, the cpu/cuda marker rule, seeding, and the
session-finish report. The logic lives in tests/harness.py and tests/reporting.py."""

import os
import sys
import zlib
from pathlib import Path

import pytest

from tests import harness

# Each xdist worker gets its own GPU before anything can initialise CUDA in it.
harness.pin_xdist_worker(os.environ.get("PYTEST_XDIST_WORKER"))

# Without a GPU, Triton kernels run on CPU tensors through its interpreter; the variable must be
# set before any kernel module is imported.
if not harness.visible_gpu_ids():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    group = parser.getgroup("softmax-suite")
    group.addoption("--allow-no-gpu", action="store_true",
                    help="with -m cuda on a machine without a usable GPU, skip the cuda tests instead of failing the run")
    group.addoption("--reports-dir", default=str(Path(__file__).parent / "reports"),
                    help="folder for manifest.json and the figures (default: reports/)")
    group.addoption("--no-reports", action="store_true", help="write no reports at the end of the run")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` on a cuda run starts one worker per GPU."""
    if harness.selects_cuda(config.getoption("markexpr")):
        return len(harness.visible_gpu_ids()) or None
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    errors = harness.platform_marker_errors(items)
    if errors:
        raise pytest.UsageError("every test must carry exactly one of the markers cpu / cuda:\n  "
                                + "\n  ".join(errors))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-benchmark would silently run each case once; say so instead.
        skip_bench = pytest.mark.skip(reason="benchmarks do not run under xdist (-n): run them in a "
                                             "single process, e.g. pytest -m cuda --benchmark-only")
        for item in items:
            if "benchmark" in getattr(item, "fixturenames", ()):
                item.add_marker(skip_bench)
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    reason = harness.gpu_unusable_reason()
    if reason is None:
        return
    if harness.selects_cuda(config.getoption("markexpr")) and not config.getoption("allow_no_gpu"):
        # A GPU job on a CPU box must fail loudly, not report everything skipped.
        pytest.exit(f"-m cuda was asked for, but {reason}. Pass --allow-no-gpu to skip the cuda tests instead.",
                    returncode=3)
    skip = pytest.mark.skip(reason=f"cuda test: {reason}")
    for item in cuda_items:
        item.add_marker(skip)


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
    the run (combined over tests as harness.combine_recorded says). Record before asserting."""
    def record(section: str, **values):
        request.node.user_properties.append((harness.RECORD_KEY, (section, values)))
    return record


_recorded: list = []
_cuda_tests_ran = False


def pytest_runtest_logreport(report):
    # Runs in the controller for every worker's report too, so xdist runs lose nothing.
    global _cuda_tests_ran
    if report.when == "call" and "cuda" in report.keywords:
        _cuda_tests_ran = True
    for name, value in getattr(report, "user_properties", ()):
        if name == harness.RECORD_KEY:
            _recorded.append(value)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput") or config.getoption("no_reports") or config.getoption("collectonly"):
        return  # xdist workers write nothing; the controller gathers their records
    from tests import reporting

    benchmarks = _benchmark_records(config)
    written = reporting.write_reports(
        Path(config.getoption("reports_dir")), benchmarks=benchmarks,
        recorded=harness.combine_recorded(_recorded), environment=_environment(config))
    if written:
        config._softmax_reports_written = written


def pytest_terminal_summary(terminalreporter, config):
    written = getattr(config, "_softmax_reports_written", None)
    if written:
        terminalreporter.write_line("reports written: " + ", ".join(str(p) for p in written))


def _benchmark_records(config) -> list[dict]:
    """Our cases from pytest-benchmark's session, read defensively (its attributes are private)."""
    bench_session = getattr(config, "_benchmarksession", None)
    records = []
    for bench in getattr(bench_session, "benchmarks", None) or []:
        info = dict(getattr(bench, "extra_info", None) or {})
        stats = getattr(bench, "stats", None)
        if "kernel" not in info or not stats or not getattr(stats, "rounds", 0):
            continue
        records.append({**info, "us_median": stats.median * 1e6, "us_min": stats.min * 1e6,
                        "us_max": stats.max * 1e6})
    return records


def _environment(config) -> dict:
    from tests import reporting

    gpu = None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        major, minor = torch.cuda.get_device_capability()
        gpu = {"model": torch.cuda.get_device_name(), "compute_capability": f"{major}.{minor}"}
    elif _cuda_tests_ran:  # under xdist only the workers touched the GPU
        gpu = harness.describe_gpu()
    command = "pytest " + " ".join(config.invocation_params.args)
    return {"gpu": gpu, "versions": reporting.software_versions(), "command": command.strip()}
