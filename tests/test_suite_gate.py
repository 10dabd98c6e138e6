"""tests/suite/gate.py on synthetic manifests, and --regression-gate end to end in a pytest
subprocess with made-up timings and a stand-in nvidia-smi."""

import json
import os

import pytest

from tests.suite import gate, manifest, synthetic
from tests.suite.testing import CASES, run_pytest

pytestmark = pytest.mark.cpu


def built(records, environment=synthetic.GPU_ENV):
    return manifest.build_manifest(None, benchmarks=records, recorded={}, environment=environment)


def with_time(records, kernel, mode, factor, shape=None):
    """A copy of `records` with one kernel's time in one mode multiplied by `factor`."""
    changed = []
    for r in records:
        r = dict(r)
        if r.get("kernel") == kernel and r["mode"] == mode and (shape is None or (r["B"], r["V"]) == shape):
            r["us_median"] *= factor
        changed.append(r)
    return changed


@pytest.fixture(scope="module")
def committed():
    return built(synthetic.call_records())


def test_the_same_speed_passes(committed):
    result = gate.compare(committed, built(synthetic.call_records()))
    assert not result.failed and result.note is None
    # Device mode at every call shape, per-call mode at every call shape, for fused and triton.
    assert result.compared == 2 * 2 * len(synthetic.CALL_SHAPES)
    assert "0 regressed" in result.lines()[0] and "NVIDIA H200" in result.lines()[0]


def test_a_regression_within_the_tolerance_passes(committed):
    slower = with_time(synthetic.call_records(), "triton", "per_call", 1.08)
    assert not gate.compare(committed, built(slower)).failed


def test_a_regression_fails_and_names_each_case(committed):
    slower = with_time(synthetic.call_records(), "fused", "per_call", 1.25, shape=(64, 32000))
    slower = with_time(slower, "triton", "device", 1.5, shape=(512, 128256))
    result = gate.compare(committed, built(slower))
    assert result.failed
    assert [(r["kernel"], r["B"], r["V"], r["dtype"], r["mode"]) for r in result.regressions] == [
        ("triton", 512, 128256, "bfloat16", "device"),
        ("triton", 512, 128256, "float32", "device"),
        ("fused", 64, 32000, "bfloat16", "per_call"),
        ("fused", 64, 32000, "float32", "per_call"),
    ]
    for r in result.regressions:
        assert r["new_ratio"] < 0.9 * r["old_ratio"]
    lines = result.lines()
    assert "4 regressed" in lines[0]
    old, new = result.regressions[0]["old_ratio"], result.regressions[0]["new_ratio"]
    assert lines[1] == f"  REGRESSED triton B=512 V=128256 bfloat16 device: {old:.3f} -> {new:.3f} x F.softmax"


def test_a_faster_f_softmax_is_a_regression_of_the_ratio(committed):
    """The gate compares speed relative to F.softmax: absolute times may all move together."""
    faster_baseline = with_time(synthetic.call_records(), "F_softmax", "device", 0.8)
    result = gate.compare(committed, built(faster_baseline))
    assert {r["mode"] for r in result.regressions} == {"device"}
    everything_slower = [dict(r, us_median=r["us_median"] * 1.4) for r in synthetic.call_records()]
    assert not gate.compare(committed, built(everything_slower)).failed


def test_another_gpu_model_is_no_baseline(committed):
    other = {**synthetic.GPU_ENV, "gpu": {"model": "NVIDIA B200", "compute_capability": "10.0"}}
    slower = with_time(synthetic.call_records(), "fused", "device", 3.0)
    result = gate.compare(committed, built(slower, other))
    assert not result.failed and result.compared == 0
    assert result.lines() == [
        "regression gate: no baseline for NVIDIA B200 (the committed manifest is for NVIDIA H200)"
    ]
    assert gate.compare(None, built(slower)).note.startswith("no baseline for NVIDIA H200")


def test_a_run_without_gpu_timings_compares_nothing(committed):
    assert gate.compare(committed, built([], synthetic.CPU_ENV)).note == "this run measured no GPU: nothing to compare"
    f_only = [r for r in synthetic.call_records() if r.get("kernel") == "F_softmax"]
    result = gate.compare(committed, built(f_only))
    assert not result.failed and "timed no fused / triton case" in result.note


# -- end to end -----------------------------------------------------------------------------------------------


def test_regression_gate_option_end_to_end(tmp_path):
    fake_smi = tmp_path / "bin" / "nvidia-smi"
    fake_smi.parent.mkdir()
    fake_smi.write_text(
        "#!/bin/sh\ncase \"$1\" in\n  -L) echo 'GPU 0: NVIDIA H200 (UUID: GPU-a)' ;;\n"
        "  *) echo 'NVIDIA H200, 9.0' ;;\nesac\n"
    )
    fake_smi.chmod(0o755)
    baseline = tmp_path / "baseline.json"
    # Committed: fused at 2.0 x F.softmax (5 us against 10 us).
    records = [
        synthetic.record("F_softmax", 512, 600, "float32", 10.0),
        synthetic.record("fused", 512, 600, "float32", 5.0),
    ]
    baseline.write_bytes(manifest.serialise(built(records)))

    def run(fused_us, baseline_path=baseline):
        env = {"PATH": f"{fake_smi.parent}:{os.environ['PATH']}", "GATE_CASE_FUSED_US": str(fused_us)}
        return run_pytest(
            str(CASES / "gate_case.py"),
            "--regression-gate",
            "--regression-baseline",
            str(baseline_path),
            "--reports-dir",
            str(tmp_path / "reports"),
            env=env,
        )

    failed = run(8.0)  # 1.25 x: more than 10% below 2.0
    output = failed.stdout + failed.stderr
    assert failed.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "2 passed" in output
    assert "REGRESSED fused B=512 V=600 float32 device: 2.000 -> 1.250 x F.softmax" in output

    passed = run(5.3)  # 1.89 x: within 10%
    assert passed.returncode == pytest.ExitCode.OK, passed.stdout + passed.stderr
    assert "1 cases compared with the committed manifest, 0 regressed" in passed.stdout

    other = json.loads(baseline.read_text())
    other["gpu"]["model"] = "NVIDIA A100-SXM4-80GB"
    (tmp_path / "other.json").write_text(json.dumps(other))
    elsewhere = run(8.0, tmp_path / "other.json")
    assert elsewhere.returncode == pytest.ExitCode.OK, elsewhere.stdout + elsewhere.stderr
    assert "no baseline for NVIDIA H200" in elsewhere.stdout
