"""tests/suite/coverage.py: cells recorded by the cases of a coverage matrix are checked against
the expected ones once, at the end of the session, in the process that sees every report, so
the check holds under xdist (`-n 2`, cases spread over workers) as in one process."""

import re
from types import SimpleNamespace

import pytest

from tests.suite import coverage
from tests.suite.testing import CASES, run_pytest

pytestmark = pytest.mark.cpu


def report(*properties):
    return SimpleNamespace(user_properties=list(properties))


def node():
    return SimpleNamespace(user_properties=[])


def test_expected_cells_no_case_ran_are_named():
    tracker = coverage.Tracker()
    a, b = node(), node()
    coverage.record_cell(a, "cpu", ("triton", "tile", "contiguous", "fp32"))
    coverage.expect(b, "cpu", [("triton", "tile", "contiguous", "fp32"), ("triton", "rows", "offset:1", "bf16")])
    for n in (a, b, a):  # a report per phase: repeats are harmless
        tracker.add(report(*n.user_properties))
    tracker.add(report(("manifest", ("section", {})), ("something else", 1)))
    result = tracker.result()
    assert result.failed
    assert result.lines() == [
        "coverage matrix (cpu): 1 of 2 expected cells did not run:\n  triton / rows / offset:1 / bf16"
    ]
    coverage.record_cell(a, "cpu", ("triton", "rows", "offset:1", "bf16"))
    tracker.add(report(*a.user_properties))
    assert not tracker.result().failed
    assert tracker.result().lines() == ["coverage matrix (cpu): all 2 expected cells ran"]


def test_cells_of_another_platform_do_not_count():
    tracker = coverage.Tracker()
    a = node()
    coverage.record_cell(a, "cuda", ("fused", "warp", "contiguous", "fp32"))
    coverage.expect(a, "cpu", [("fused", "warp", "contiguous", "fp32")])
    tracker.add(report(*a.user_properties))
    assert tracker.result().missing == {"cpu": "\n  fused / warp / contiguous / fp32"}


def test_without_an_expectation_nothing_is_checked():
    tracker = coverage.Tracker()
    a = node()
    coverage.record_cell(a, "cpu", ("fused", "warp", "contiguous", "fp32"))
    tracker.add(report(*a.user_properties))
    assert not tracker.result().failed and tracker.result().lines() == []


def run_matrix(*args, skip=""):
    proc = run_pytest(
        str(CASES / "coverage_case.py"), "--no-reports", "-v", *args, env={"COVERAGE_CASE_SKIP": skip}, timeout=180
    )
    return proc, proc.stdout + proc.stderr


def test_every_cell_ran_is_checked_across_xdist_workers():
    proc, out = run_matrix("-n", "2", "--dist", "load")
    assert proc.returncode == 0, out
    workers = set(re.findall(r"\[(gw\d)\] .*PASSED .*test_cell", out))
    assert workers == {"gw0", "gw1"}, out  # the cells ran in both workers
    assert re.search(r"PASSED .*test_every_cell_ran", out), out  # it ran, it did not skip
    assert "coverage matrix (cpu): all 4 expected cells ran" in out

    proc, out = run_matrix("-n", "2", "--dist", "load", skip="b,d")
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "3 passed, 2 skipped" in out
    assert (
        "coverage matrix (cpu): 2 of 4 expected cells did not run:\n  kern / b / contiguous / fp32\n  kern / d /" in out
    )


def test_a_partial_selection_is_not_checked():
    deselect = ("--deselect", "tests/harness_cases/coverage_case.py::test_cell[a]")
    proc, out = run_matrix("-p", "no:xdist", *deselect, skip="c")
    assert proc.returncode == 0, out
    assert "only part of the matrix was selected" in out and "coverage matrix" not in out
