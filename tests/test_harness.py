"""The suite's own rules: markers, GPU gating, xdist pinning, and the manifest / figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import harness, reporting

jsonschema = pytest.importorskip("jsonschema")  # a CPU-suite dependency; absent on bare GPU images

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "harness_cases"


def run_pytest(*args, env=None, timeout=300):
    """pytest in a subprocess from the project root, with reports going nowhere near reports/."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


# -- synthetic records -------------------------------------------------------------------------

def synthetic_benchmarks():
    """Made-up timings with the shape of what the cuda benchmarks record."""
    records = []
    for kernel, us, reads in (("naive", 40.0, 3), ("smem", 9.0, 3), ("fused", 4.0, 1),
                              ("triton", 4.5, 1), ("F_softmax", 5.0, 1)):
        for B in (64, 512, 4096):
            numel = B * 600
            records.append({"kernel": kernel, "B": B, "V": 600, "dtype": "float32",
                            "us_median": us * (1 + B / 4096), "us_min": us * 0.9, "us_max": us * 1.5,
                            "bytes": 4 * numel * (reads + 1), "min_bytes": 8 * numel})
    records[3 * 3 + 1]["autotune_picked"] = {"BLOCK": 1024, "num_warps": 4}  # triton at B=512
    return records


GPU_ENV = {"gpu": {"model": "NVIDIA H200", "compute_capability": "9.0"},
           "versions": {"python": "3.12.3", "torch": "2.11.0", "triton": "3.6.0", "cupy": "14.2.0"},
           "command": "pytest -m cuda --benchmark-only"}
CPU_ENV = {"gpu": None, "versions": {"python": "3.11.7", "torch": "2.13.0", "triton": "3.9.0", "cupy": None},
           "command": "pytest -m cpu"}


def gpu_manifest():
    return reporting.build_manifest(
        None, benchmarks=synthetic_benchmarks(),
        recorded={"ceilings": {"hbm_copy_TBps": 4.28, "fp32_TFLOPS": 50.0, "how_measured": "synthetic"},
                  "torch_port": {"kernel_swap_changes_top1_token": False}},
        environment=GPU_ENV, today="2026-11-29")


def test_manifest_from_synthetic_records_validates_against_the_schema():
    manifest = gpu_manifest()
    jsonschema.validate(manifest, json.loads(reporting.SCHEMA_PATH.read_text()))
    kernels = manifest["softmax_kernels"]
    assert kernels["fused"]["us_at_B512"] == pytest.approx(4.0 * (1 + 512 / 4096))
    # frac_of_F_softmax is t(F.softmax) / t(kernel) at the same point of the same run.
    assert kernels["naive"]["frac_of_F_softmax"] == pytest.approx(5.0 / 40.0)
    assert kernels["triton"]["autotune_picked"] == {"BLOCK": 1024, "num_warps": 4}
    assert manifest["ceilings"]["flops_per_element"] == reporting.FLOPS_PER_ELEMENT
    assert len(manifest["sweep"]) == 15
    lab = [e for e in manifest["sweep"] if (e["kernel"], e["B"]) == ("fused", 512)][0]
    assert lab["GBps"] == pytest.approx(8 * 512 * 600 / (lab["us_median"] * 1e-6) / 1e9)
    assert lab["frac_of_copy_bw"] == pytest.approx(lab["GBps"] / 4280)
    assert manifest["provenance"]["sweep"]["device"] == "NVIDIA H200"


def test_targets_name_the_cases_that_miss():
    sweep = [
        {"kernel": "F_softmax", "B": 32768, "V": 4096, "dtype": "float32", "us_median": 400.0},
        {"kernel": "fused", "B": 32768, "V": 4096, "dtype": "float32", "us_median": 260.0},
        {"kernel": "triton", "B": 32768, "V": 4096, "dtype": "float32", "us_median": 500.0},
    ]
    for e in sweep:
        e.update(us_min=e["us_median"], us_max=e["us_median"], bytes=2 * 4 * 32768 * 4096, min_bytes=2 * 4 * 32768 * 4096)
    report = reporting.target_report(reporting.sweep_entries(sweep, copy_TBps=4.28))
    assert report["cases_checked"] == 2
    assert [m["kernel"] for m in report["missed"]] == ["triton"]
    assert "0.80 x F.softmax" in report["missed"][0]["why"] and "of copy" in report["missed"][0]["why"]


def test_a_cpu_run_keeps_the_gpu_sections():
    before = gpu_manifest()
    after = reporting.build_manifest(
        json.loads(json.dumps(before)), benchmarks=[],
        recorded={"torch_port": {"max_abs_diff_to_numpy_reference": 3e-7, "byte_equivalence_at_fp32_cpu": "passed"}},
        environment=CPU_ENV, today="2026-11-30")
    for section in ("gpu", "versions", "softmax_kernels", "sweep", "ceilings"):
        assert after[section] == before[section], section
    assert after["provenance"]["sweep"] == before["provenance"]["sweep"]
    assert after["torch_port"]["kernel_swap_changes_top1_token"] is False
    assert after["torch_port"]["max_abs_diff_to_numpy_reference"] == 3e-7
    assert after["provenance"]["torch_port.max_abs_diff_to_numpy_reference"]["date"] == "2026-11-30"
    assert after["provenance"]["torch_port.max_abs_diff_to_numpy_reference"]["device"] == "cpu"


def test_write_reports_writes_figures_atomically_and_nothing_for_an_empty_run(tmp_path):
    assert reporting.write_reports(tmp_path, benchmarks=[], recorded={}, environment=CPU_ENV) == []
    assert list(tmp_path.iterdir()) == []
    written = reporting.write_reports(
        tmp_path, benchmarks=synthetic_benchmarks(),
        recorded={"ceilings": {"hbm_copy_TBps": 4.28, "fp32_TFLOPS": 50.0, "how_measured": "synthetic"}},
        environment=GPU_ENV)
    assert {p.name for p in written} == {"manifest.json", "roofline.png", "bandwidth.png"}
    for png in ("roofline.png", "bandwidth.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bandwidth.png", "manifest.json", "roofline.png"]


def test_recorded_values_combine_as_worst_case():
    merged = harness.combine_recorded([
        ("torch_port", {"max_abs_diff_to_numpy_reference": 1e-7, "byte_equivalence_at_fp32_cpu": "passed"}),
        ("torch_port", {"max_abs_diff_to_numpy_reference": 4e-7, "byte_equivalence_at_fp32_cpu": "failed"}),
        ("torch_port", {"max_abs_diff_to_numpy_reference": 2e-7, "byte_equivalence_at_fp32_cpu": "passed",
                        "kernel_swap_changes_top1_token": False}),
        ("torch_port", {"kernel_swap_changes_top1_token": True}),
    ])
    assert merged == {"torch_port": {"max_abs_diff_to_numpy_reference": 4e-7,
                                     "byte_equivalence_at_fp32_cpu": "failed",
                                     "kernel_swap_changes_top1_token": True}}


@pytest.mark.parametrize("markexpr, expected", [
    ("cuda", True), ("cuda and not slow", True), ("cpu or cuda", True),
    ("cpu", False), ("not cuda", False), ("", False), ("cudagraph", False)])
def test_selects_cuda(markexpr, expected):
    assert harness.selects_cuda(markexpr) is expected


# -- the rules, in a pytest subprocess -------------------------------------------------------------

def test_a_test_without_exactly_one_platform_marker_is_a_collection_error(tmp_path):
    result = run_pytest(str(CASES / "unmarked_case.py"), "--reports-dir", str(tmp_path))
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "test_without_platform_marker: carries neither" in output
    assert "test_with_both_markers: carries both" in output


def test_cuda_run_without_a_gpu_fails_with_one_clear_line(tmp_path):
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    result = run_pytest("-m", "cuda", str(CASES / "cuda_case.py"), "--reports-dir", str(tmp_path), env=no_gpu)
    assert result.returncode not in (0, 5), result.stdout + result.stderr
    assert "-m cuda was asked for, but no NVIDIA GPU visible" in result.stdout + result.stderr
    # The opt-out turns the failure into visible skips.
    result = run_pytest("-m", "cuda", "--allow-no-gpu", "-rs", str(CASES / "cuda_case.py"),
                        "--reports-dir", str(tmp_path), env=no_gpu)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "cuda test: no NVIDIA GPU visible" in result.stdout


def test_xdist_workers_are_pinned_one_per_gpu(tmp_path):
    """With two (simulated) GPUs, `-n auto` starts two workers, each with its own GPU."""
    env = {harness.SIMULATED_GPUS_ENV: "2", "PINNING_OUT": str(tmp_path)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = run_pytest("-n", "auto", "-m", "cpu or cuda", "--allow-no-gpu", str(CASES / "pinning_case.py"),
                        "--reports-dir", str(tmp_path / "reports"), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 workers" in result.stdout
    seen = {tuple(p.read_text().split()) for p in tmp_path.glob("*.txt")}
    assert len(list(tmp_path.glob("*.txt"))) == 8
    assert {device for _, device in seen} == {"0", "1"}
    assert all(dict(seen)[worker] == worker.removeprefix("gw") for worker in dict(seen))


def test_benchmarks_under_xdist_are_skipped_with_a_reason(tmp_path):
    result = run_pytest("-n", "2", "-rs", str(CASES / "benchmark_case.py"), "--reports-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "benchmarks do not run under xdist" in result.stdout


def test_nothing_escapes_both_runs():
    result = run_pytest("--collect-only", "-q", "-m", "not cpu and not cuda", "--no-reports")
    assert result.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout + result.stderr
    assert "deselected" in result.stdout and " selected" not in result.stdout.replace("deselected", "")


def test_gpus_are_counted_and_named_through_nvidia_smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH: counting and naming never go through CUDA."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "case \"$1\" in\n"
                    "  -L) printf 'GPU 0: NVIDIA H200 (UUID: GPU-a)\\nGPU 1: NVIDIA H200 (UUID: GPU-b)\\n' ;;\n"
                    "  *) echo 'NVIDIA H200, 9.0' ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(harness.SIMULATED_GPUS_ENV, raising=False)
    harness._nvidia_smi_ids.cache_clear()
    try:
        assert harness.visible_gpu_ids() == ["0", "1"]
        assert harness.describe_gpu() == {"model": "NVIDIA H200", "compute_capability": "9.0"}
        environ = {}
        assert harness.pin_xdist_worker("gw3", environ) == "1" and environ == {"CUDA_VISIBLE_DEVICES": "1"}
    finally:
        harness._nvidia_smi_ids.cache_clear()
