"""tests/suite/records.py: how recorded values combine over tests, and what a benchmark case
hands over to the manifest."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.suite import manifest, records
from tests.suite.testing import CASES, run_pytest

pytestmark = pytest.mark.cpu


def test_recorded_values_combine_as_worst_case():
    merged = records.combine_recorded(
        [
            ("torch_port", {"max_abs_diff_to_numpy_reference": 1e-7, "byte_equivalence_at_fp32_cpu": "passed"}),
            ("torch_port", {"max_abs_diff_to_numpy_reference": 4e-7, "byte_equivalence_at_fp32_cpu": "failed"}),
            (
                "torch_port",
                {
                    "max_abs_diff_to_numpy_reference": 2e-7,
                    "byte_equivalence_at_fp32_cpu": "passed",
                    "kernel_swap_changes_top1_token": False,
                },
            ),
            ("torch_port", {"kernel_swap_changes_top1_token": True}),
        ]
    )
    assert merged == {
        "torch_port": {
            "max_abs_diff_to_numpy_reference": 4e-7,
            "byte_equivalence_at_fp32_cpu": "failed",
            "kernel_swap_changes_top1_token": True,
        }
    }


def test_nan_is_the_worst_error_in_either_order():
    for first, second in ((1.0, math.nan), (math.nan, 1.0)):
        merged = records.combine_recorded([("s", {"err": first}), ("s", {"err": second})])
        assert math.isnan(merged["s"]["err"])


def test_lists_combine_by_union_in_first_seen_order():
    merged = records.combine_recorded(
        [
            ("s", {"shapes": [[8, 600], [1, 600]]}),
            ("s", {"shapes": [(1, 600), (64, 32000)]}),
            ("s", {"shapes": [[8, 600]]}),
        ]
    )
    assert merged["s"]["shapes"] == [[8, 600], [1, 600], [64, 32000]]


def test_verdict_dicts_keep_the_worst_verdict_and_every_shape():
    key = "fused/float32/batch_invariant"
    merged = records.combine_recorded(
        [
            ("byte_equivalence", {key: {"verdict": "passed", "shapes": [[1, 600]]}}),
            ("byte_equivalence", {key: {"verdict": "failed", "shapes": [[64, 50257]]}}),
            ("byte_equivalence", {key: {"verdict": "passed", "shapes": [[1, 600], [8, 600]]}}),
            (
                "byte_equivalence",
                {"F_softmax/float32/deterministic": {"verdict": "not gated: failed", "shapes": [[1, 7]]}},
            ),
            (
                "byte_equivalence",
                {"F_softmax/float32/deterministic": {"verdict": "not gated: passed", "shapes": [[2, 7]]}},
            ),
        ]
    )["byte_equivalence"]
    assert merged[key] == {"verdict": "failed", "shapes": [[1, 600], [64, 50257], [8, 600]]}
    assert merged["F_softmax/float32/deterministic"] == {"verdict": "not gated: failed", "shapes": [[1, 7], [2, 7]]}


def test_combining_does_not_alias_the_recorded_values():
    shapes = [[1, 600]]
    merged = records.combine_recorded([("s", {"v": {"shapes": shapes}}), ("s", {"v": {"shapes": [[2, 600]]}})])
    assert shapes == [[1, 600]] and merged["s"]["v"]["shapes"] == [[1, 600], [2, 600]]


def test_a_missing_value_does_not_hide_a_measured_one():
    merged = records.combine_recorded([("s", {"err": None}), ("s", {"err": 2e-7}), ("s", {"err": None})])
    assert merged == {"s": {"err": 2e-7}}


def fake_bench(extra_info, median_s=None):
    stats = (
        None if median_s is None else SimpleNamespace(rounds=15, median=median_s, min=median_s / 2, max=median_s * 2)
    )
    return SimpleNamespace(extra_info=extra_info, stats=stats)


def test_benchmark_records_are_raw_values_in_microseconds():
    session = SimpleNamespace(
        benchmarks=[
            fake_bench({"kernel": "fused", "B": 8, "V": 600, "dtype": "float32", "bytes": 38400}, 4e-6),
            fake_bench({"kernel": "fused", "B": 8, "V": 600, "dtype": "float32", "mode": "per_call"}, 9e-6),
            fake_bench({"floor": "triton_empty", "mode": "graph"}, 2e-6),
            fake_bench({"ceiling": "copy", "TBps": 4.2}, 1e-3),  # recorded through record_manifest instead
            fake_bench({"kernel": "triton", "B": 8, "V": 600, "dtype": "float32"}),  # never ran
        ]
    )
    got = records.benchmark_records(session)
    assert [(r.get("kernel") or r["floor"], r["mode"]) for r in got] == [
        ("fused", "device"),
        ("fused", "per_call"),
        ("triton_empty", "graph"),
    ]
    assert got[0]["us_median"] == pytest.approx(4.0) and got[0]["us_min"] == pytest.approx(2.0)
    assert got[0]["us_max"] == pytest.approx(8.0) and got[0]["bytes"] == 38400
    assert records.benchmark_records(None) == []


def test_the_collector_sees_recorded_values_and_gpu_work():
    collector = records.Collector()
    cpu = SimpleNamespace(
        when="call", keywords={"cpu": 1}, user_properties=[(records.RECORD_KEY, ("s", {"err": 1e-7})), ("other", 1)]
    )
    setup = SimpleNamespace(when="setup", keywords={"cuda": 1}, user_properties=[])
    collector.add(cpu)
    collector.add(setup)
    assert not collector.gpu_work_ran
    # Through xdist a (section, values) tuple may arrive as a list.
    collector.add(
        SimpleNamespace(when="call", keywords={"cuda": 1}, user_properties=[(records.RECORD_KEY, ["s", {"err": 3e-7}])])
    )
    assert collector.gpu_work_ran
    assert collector.combined() == {"s": {"err": 3e-7}}


def _reports_tree() -> dict:
    return {p: p.read_bytes() for p in sorted(manifest.REPORTS_DIR.rglob("*")) if p.is_file()}


def test_a_plain_run_writes_nothing_and_reports_dir_writes_there(tmp_path):
    """A run that records a figure the committed manifest does not hold leaves reports/ as it was,
    on a first and a second run; with --reports-dir the same run writes its manifest there."""
    before = _reports_tree()
    for _ in range(2):
        proc = run_pytest(str(CASES / "record_case.py"), "-p", "no:xdist", "-q")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "reports written" not in proc.stdout, proc.stdout
        assert _reports_tree() == before, "a plain run rewrote files under reports/"
    proc = run_pytest(str(CASES / "record_case.py"), "-p", "no:xdist", "-q", "--reports-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["torch_port"]["max_abs_diff_to_numpy_reference"] == 0.5
    assert _reports_tree() == before


def test_a_plain_run_still_validates_what_it_recorded():
    proc = run_pytest(str(CASES / "record_case.py"), "-p", "no:xdist", "-q", env={"RECORD_CASE_INVALID": "1"})
    assert proc.returncode != 0, proc.stdout
    assert "ValidationError" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, None),
        ({"benchmark_only": True}, manifest.REPORTS_DIR),
        ({"reports_dir": "elsewhere"}, "elsewhere"),
        ({"benchmark_only": True, "reports_dir": "elsewhere"}, "elsewhere"),
        ({"benchmark_only": True, "no_reports": True}, None),
    ],
)
def test_only_the_benchmark_run_or_reports_dir_write_reports(options, expected):
    values = {"no_reports": False, "reports_dir": None, "benchmark_only": False, **options}
    config = SimpleNamespace(getoption=lambda name, default=None: values.get(name, default))
    got = manifest.reports_destination(config)
    assert got == (None if expected is None else Path(expected))
