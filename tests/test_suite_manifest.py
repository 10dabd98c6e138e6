"""tests/suite/manifest.py on synthetic records, and the committed reports/manifest.json:
valid, complete, consistent with its own numbers, and left alone by a run that measures the same."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import spec
from tests.suite import figures, manifest, merge, records, synthetic
from tests.suite.synthetic import CEILINGS, CPU_ENV, GPU_ENV
from tests.suite.testing import manifest_schema

jsonschema = pytest.importorskip("jsonschema")  # a CPU-suite dependency; absent on bare GPU images

pytestmark = pytest.mark.cpu


def gpu_manifest(benchmarks=None, previous=None, today="2026-11-29", **recorded):
    return manifest.build_manifest(
        previous,
        benchmarks=synthetic.lab_records() if benchmarks is None else benchmarks,
        recorded={"ceilings": dict(CEILINGS), "torch_port": {"kernel_swap_changes_top1_token": False}, **recorded},
        environment=GPU_ENV,
        today=today,
    )


def test_matrix_bytes_is_one_read_and_one_write_by_default():
    assert spec.matrix_bytes(512, 600, "float32") == 2 * 512 * 600 * 4
    assert spec.matrix_bytes(3, 5, "bfloat16", passes=4) == 4 * 3 * 5 * 2
    assert spec.matrix_bytes(3, 5, "bf16", passes=1) == 3 * 5 * 2
    torch = pytest.importorskip("torch")
    assert spec.matrix_bytes(7, 11, torch.float16) == spec.matrix_bytes(7, 11, "float16")
    with pytest.raises(TypeError, match="float64"):
        spec.matrix_bytes(7, 11, torch.float64)


def test_the_harness_reads_the_kernel_specs_without_torch():
    """tests/suite and kernels.spec import no torch: the manifest, the gate and the figures
    take their kernel lists from the specs on any machine."""
    code = (
        "import sys; from tests.suite import figures, gate, manifest; import kernels.spec; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], check=True)


def test_the_schemas_kernel_lists_are_the_specs():
    """reports/manifest.schema.json lists, under softmax_kernels, the kernels the specs mark as
    the lab contract's (required), each autotuned one with its autotune choice."""
    section = manifest_schema()["properties"]["softmax_kernels"]
    assert tuple(section["required"]) == manifest.REQUIRED_KERNELS
    assert set(manifest.REQUIRED_KERNELS) <= set(section["properties"])
    for name in manifest.AUTOTUNED_KERNELS:
        assert "autotune_picked" in section["properties"][name]["required"], name
    for name, prop in section["properties"].items():
        assert name in spec.SPEC_BY_NAME, f"the schema describes {name!r}, which no spec names"
        if "required" in prop:
            assert ("autotune_picked" in prop["required"]) == (name in manifest.AUTOTUNED_KERNELS), name


def test_manifest_from_synthetic_records_validates_against_the_schema():
    built = gpu_manifest()
    jsonschema.validate(built, manifest_schema())
    kernels = built["softmax_kernels"]
    assert kernels["fused"][manifest.LAB_POINT_KEY] == pytest.approx(4.0 * (1 + 512 / 4096))
    # frac_of_F_softmax is t(F.softmax) / t(kernel) at the same point of the same run.
    assert kernels["naive"]["frac_of_F_softmax"] == pytest.approx(5.0 / 40.0)
    assert kernels["triton"]["autotune_picked"] == {"BLOCK": 1024, "num_warps": 4}
    assert built["ceilings"]["flops_per_element"] == manifest.FLOPS_PER_ELEMENT
    assert len(built["sweep"]) == 15
    lab = [e for e in built["sweep"] if (e["kernel"], e["B"]) == ("fused", 512)][0]
    assert lab["GBps"] == pytest.approx(8 * 512 * 600 / (lab["us_median"] * 1e-6) / 1e9)
    assert lab["frac_of_copy_bw"] == pytest.approx(lab["GBps"] / 4280)
    assert lab["bytes_by_design"] == 8 * 512 * 600
    assert built["provenance"]["sweep"]["device"] == "NVIDIA H200"


def test_ratios_do_not_depend_on_the_order_cases_ran_in():
    """F.softmax timed after the kernel still gives the kernel its ratio."""
    ordered = synthetic.lab_records()
    shuffled = list(reversed(ordered))
    random.Random(1).shuffle(shuffled)
    assert manifest.serialise(gpu_manifest(ordered)) == manifest.serialise(gpu_manifest(shuffled))
    for e in gpu_manifest(shuffled)["sweep"]:
        assert "frac_of_F_softmax" in e, e


def test_ratios_are_rederived_from_merged_raw_values():
    """A run that re-times only F_softmax moves every kernel's ratio at that shape with it."""
    before = gpu_manifest()
    faster_baseline = [synthetic.record("F_softmax", 512, 600, "float32", 2.5)]
    after = manifest.build_manifest(
        json.loads(json.dumps(before)), benchmarks=faster_baseline, recorded={}, environment=GPU_ENV, today="2026-12-01"
    )
    fused = [e for e in after["sweep"] if (e["kernel"], e["B"], e["V"]) == ("fused", 512, 600)][0]
    assert fused["frac_of_F_softmax"] == pytest.approx(2.5 / fused["us_median"])
    assert after["softmax_kernels"]["fused"]["frac_of_F_softmax"] == fused["frac_of_F_softmax"]


def test_targets_name_the_cases_that_miss():
    sweep = [
        synthetic.record(kernel, 32768, 4096, "float32", us)
        for kernel, us in (("F_softmax", 400.0), ("fused", 260.0), ("triton", 500.0))
    ]
    report = manifest.target_report(manifest.sweep_entries(sweep, copy_TBps=4.28))
    assert report["cases_checked"] == 2
    assert [m["kernel"] for m in report["missed"]] == ["triton"]
    why = report["missed"][0]["why"]
    assert "0.800 x F.softmax (goal 1.0)" in why and "of copy (goal 0.88)" in why and "0.520 x fused (goal 0.95)" in why


def test_a_missed_copy_goal_says_what_a_copy_of_the_same_bytes_reached():
    # Fused at 0.88 and Triton at 0.85 of the ceiling where a copy of the same matrix reaches
    # 0.90: each miss says both, and the copy time survives a merge (the next run's manifest
    # derives it again).
    B, V, dtype = 4096, 4096, "float32"
    at = {f: spec.matrix_bytes(B, V, dtype) / (f * synthetic.COPY_GBps) / 1e3 for f in (0.5, 0.85, 0.88, 0.9)}
    sweep = [
        synthetic.record("F_softmax", B, V, dtype, at[0.5]),
        synthetic.record("fused", B, V, dtype, at[0.88], copy_same_bytes_us=at[0.9]),
        synthetic.record("triton", B, V, dtype, at[0.85], copy_same_bytes_us=at[0.9]),
    ]
    entries = manifest.sweep_entries(sweep, copy_TBps=synthetic.COPY_GBps / 1e3)
    assert [e["same_bytes_copy_frac"] for e in entries if e["kernel"] != "F_softmax"] == [pytest.approx(0.9)] * 2
    report = manifest.target_report(entries)
    assert {m["kernel"]: m["why"] for m in report["missed"]} == {
        "fused": "0.880 of copy (goal 0.9; a copy of the same bytes: 0.900)",
        "triton": "0.850 of copy (goal 0.88; a copy of the same bytes: 0.900)",
    }
    built = gpu_manifest(benchmarks=sweep)
    jsonschema.validate(built, manifest_schema())
    records, _ = merge.records_from_manifest(built)
    assert next(r for r in records if r["kernel"] == "triton")["copy_same_bytes_us"] == at[0.9]


@pytest.mark.parametrize(
    "kernel, B, V, dtype, goals",
    [
        # Large: B >= 1024, V <= 262144 and >= 100 MB moved.
        ("triton", 1024, 32000, "float32", {"frac_of_F_softmax": 1.0, "frac_of_copy_bw": 0.88, "x_fused": 0.95}),
        ("fused", 1024, 32000, "float32", {"frac_of_F_softmax": 1.0, "frac_of_copy_bw": 0.90}),
        ("triton", 1023, 32000, "float32", {"frac_of_F_softmax": 1.0}),  # B one short
        ("triton", 4096, 262144, "bfloat16", {"frac_of_F_softmax": 1.0, "frac_of_copy_bw": 0.88, "x_fused": 0.95}),
        ("triton", 4096, 262145, "bfloat16", {"frac_of_F_softmax": 1.0}),  # past the largest vocabulary
        ("triton", 4096, 1000003, "float32", {"frac_of_F_softmax": 1.0}),
        # 100 MB: 12208 x 1024 x 4 bytes x 2 is 100.01 MB, 12207 rows fall 8 kB short.
        ("fused", 12208, 1024, "float32", {"frac_of_F_softmax": 1.0, "frac_of_copy_bw": 0.90}),
        ("fused", 12207, 1024, "float32", {"frac_of_F_softmax": 1.0}),
        # Decode: Triton 1.5 x F.softmax to B = 64, fused F.softmax's speed.
        ("triton", 64, 128256, "float32", {"frac_of_F_softmax": 1.5}),
        ("triton", 65, 128256, "float32", {"frac_of_F_softmax": 1.0}),
        ("fused", 1, 128256, "bfloat16", {"frac_of_F_softmax": 1.0}),
        # The lab's shape in bf16 moves 79 MB: Triton's own goal there.
        ("triton", 32768, 600, "bfloat16", {"frac_of_F_softmax": 1.0, "frac_of_copy_bw": 0.80}),
        ("fused", 32768, 600, "bfloat16", {"frac_of_F_softmax": 1.0}),
        ("triton", 32768, 600, "float32", {"frac_of_F_softmax": 1.0, "frac_of_copy_bw": 0.88, "x_fused": 0.95}),
    ],
)
def test_forward_goals_at_their_boundaries(kernel, B, V, dtype, goals):
    assert manifest.forward_goals(kernel, B, V, dtype) == goals
    assert manifest.copy_goal(kernel, B, V, dtype) == goals.get("frac_of_copy_bw")


def test_targets_judge_each_goal_at_its_shapes():
    copy_us = {  # device time at a fraction of the synthetic copy speed
        (B, V, dtype, f): spec.matrix_bytes(B, V, dtype) / (f * synthetic.COPY_GBps) / 1e3
        for B, V, dtype in ((32768, 600, "bfloat16"), (4096, 32000, "bfloat16"), (64, 32000, "float32"))
        for f in (0.95, 0.89, 0.85, 0.79, 0.5)
    }
    sweep = [
        # (32768, 600) bf16: fused at 0.79 has no copy goal there; triton at 0.79 misses 0.80.
        synthetic.record("F_softmax", 32768, 600, "bfloat16", copy_us[32768, 600, "bfloat16", 0.5]),
        synthetic.record("fused", 32768, 600, "bfloat16", copy_us[32768, 600, "bfloat16", 0.79]),
        synthetic.record("triton", 32768, 600, "bfloat16", copy_us[32768, 600, "bfloat16", 0.79]),
        # Large bf16: fused 0.95 meets; triton 0.89 meets 0.88 of copy but 0.89 / 0.95 < 0.95 x fused.
        synthetic.record("F_softmax", 4096, 32000, "bfloat16", copy_us[4096, 32000, "bfloat16", 0.5]),
        synthetic.record("fused", 4096, 32000, "bfloat16", copy_us[4096, 32000, "bfloat16", 0.95]),
        synthetic.record("triton", 4096, 32000, "bfloat16", copy_us[4096, 32000, "bfloat16", 0.89]),
        # Decode: both 1.4 x F.softmax; only Triton's goal is 1.5.
        synthetic.record("F_softmax", 64, 32000, "float32", 14.0),
        synthetic.record("fused", 64, 32000, "float32", 10.0),
        synthetic.record("triton", 64, 32000, "float32", 10.0),
    ]
    report = manifest.target_report(manifest.sweep_entries(sweep, copy_TBps=synthetic.COPY_GBps / 1e3))
    assert report["cases_checked"] == 6
    missed = {(m["kernel"], m["B"], m["V"], m["dtype"]): m["why"] for m in report["missed"]}
    assert set(missed) == {
        ("triton", 32768, 600, "bfloat16"),
        ("triton", 4096, 32000, "bfloat16"),
        ("triton", 64, 32000, "float32"),
    }
    assert missed["triton", 32768, 600, "bfloat16"] == "0.790 of copy (goal 0.8)"
    assert missed["triton", 4096, 32000, "bfloat16"] == "0.937 x fused (goal 0.95)"
    assert missed["triton", 64, 32000, "float32"] == "1.400 x F.softmax (goal 1.5)"
    assert "0.95 x fused" in report["rule"] and "(32768, 600) bfloat16" in report["rule"]


def test_a_cpu_run_keeps_the_gpu_sections():
    before = gpu_manifest()
    after = manifest.build_manifest(
        json.loads(json.dumps(before)),
        benchmarks=[],
        recorded={"torch_port": {"max_abs_diff_to_numpy_reference": 3e-7, "byte_equivalence_at_fp32_cpu": "passed"}},
        environment=CPU_ENV,
        today="2026-11-30",
    )
    for section in ("gpu", "versions", "softmax_kernels", "sweep", "ceilings", "targets"):
        assert after[section] == before[section], section
    assert after["provenance"]["sweep"] == before["provenance"]["sweep"]
    assert after["torch_port"]["kernel_swap_changes_top1_token"] is False
    assert after["torch_port"]["max_abs_diff_to_numpy_reference"] == 3e-7
    assert after["provenance"]["torch_port.max_abs_diff_to_numpy_reference"]["date"] == "2026-11-30"
    assert after["provenance"]["torch_port.max_abs_diff_to_numpy_reference"]["device"] == "cpu"


def test_a_fresh_reports_dir_carries_what_the_run_did_not_measure(tmp_path):
    committed = tmp_path / "committed.json"
    measured_on_cpu = manifest.build_manifest(
        None,
        benchmarks=[],
        recorded={"torch_port": {"max_abs_diff_to_numpy_reference": 3e-7, "byte_equivalence_at_fp32_cpu": "passed"}},
        environment=CPU_ENV,
        today="2026-11-30",
    )
    committed.write_bytes(manifest.serialise(measured_on_cpu))
    out = tmp_path / "out"
    out.mkdir()
    kwargs = {"benchmarks": [], "recorded": {"ceilings": dict(CEILINGS)}, "environment": GPU_ENV}
    manifest.write_reports(out, start_from=committed, **kwargs)
    written = json.loads((out / "manifest.json").read_text())
    assert written["torch_port"]["max_abs_diff_to_numpy_reference"] == 3e-7  # from the committed manifest
    assert written["ceilings"]["hbm_copy_TBps"] == CEILINGS["hbm_copy_TBps"]  # from this run
    assert json.loads(committed.read_text()) == measured_on_cpu  # the source is only read
    # A folder that has a manifest already is updated in place; the committed one is not consulted.
    committed.write_text("{}")
    manifest.write_reports(out, start_from=committed, **kwargs)
    assert json.loads((out / "manifest.json").read_text()) == written


def test_the_same_measurements_give_a_byte_identical_manifest(tmp_path):
    first = gpu_manifest(today="2026-11-29")
    again = gpu_manifest(previous=json.loads(manifest.serialise(first)), today="2026-12-24")
    assert manifest.serialise(again) == manifest.serialise(first)
    # Through the files (no timings, so no figures: their own tests draw them): the second run
    # does not touch manifest.json at all.
    kwargs = {"benchmarks": [], "recorded": {"ceilings": dict(CEILINGS)}, "environment": GPU_ENV}
    assert tmp_path / "manifest.json" in manifest.write_reports(tmp_path, today="2026-11-29", **kwargs)
    stat = (tmp_path / "manifest.json").stat()
    assert manifest.write_reports(tmp_path, today="2026-12-24", **kwargs) == []
    assert (tmp_path / "manifest.json").stat().st_mtime_ns == stat.st_mtime_ns


def test_a_changed_value_moves_only_its_own_provenance():
    cpu_values = {
        "torch_port": {"max_abs_diff_to_numpy_reference": 3e-7, "byte_equivalence_at_fp32_cpu": "passed"},
        "numpy_model": {"verb_form_accuracy": 1.0},
    }
    first = manifest.build_manifest(
        gpu_manifest(), benchmarks=[], recorded=cpu_values, environment=CPU_ENV, today="2026-11-30"
    )
    changed = json.loads(json.dumps(cpu_values))
    changed["torch_port"]["max_abs_diff_to_numpy_reference"] = 4e-7
    second = manifest.build_manifest(
        json.loads(json.dumps(first)), benchmarks=[], recorded=changed, environment=CPU_ENV, today="2026-12-02"
    )
    moved = {k for k in second["provenance"] if second["provenance"][k] != first["provenance"][k]}
    assert moved == {"torch_port.max_abs_diff_to_numpy_reference"}
    assert second["provenance"]["torch_port.max_abs_diff_to_numpy_reference"]["date"] == "2026-12-02"
    assert second["date"] == "2026-12-02" and first["date"] == "2026-11-30"
    # Numbers are compared as JSON writes them: 1 and 1.0 are different values.
    changed["numpy_model"]["verb_form_accuracy"] = 1
    third = manifest.build_manifest(
        json.loads(json.dumps(second)), benchmarks=[], recorded=changed, environment=CPU_ENV, today="2026-12-03"
    )
    assert {k for k in third["provenance"] if third["provenance"][k] != second["provenance"][k]} == {
        "numpy_model.verb_form_accuracy"
    }


def test_a_run_on_another_gpu_model_drops_the_old_timings():
    before = gpu_manifest(synthetic.lab_records() + synthetic.large_records())
    other = {**GPU_ENV, "gpu": {"model": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}}
    after = manifest.build_manifest(
        json.loads(json.dumps(before)),
        benchmarks=synthetic.lab_records(),
        recorded={},
        environment=other,
        today="2026-12-01",
    )
    assert len(after["sweep"]) == 15 and after["gpu"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert after["provenance"]["sweep"]["device"] == "NVIDIA A100-SXM4-80GB"


def test_a_run_on_another_gpu_model_timing_only_training_ops_keeps_nothing_of_the_old_gpu():
    """The old GPU's sweep, copy speed and cuda results do not stay under the new GPU's name,
    and the new training timings take no fraction of the old copy speed; what the CPU measured
    stays."""
    before = gpu_manifest(synthetic.lab_records() + synthetic.loss_records())
    before = manifest.build_manifest(
        before, benchmarks=[], recorded={"numpy_model": {"verb_form_accuracy": 1.0}}, environment=CPU_ENV
    )
    assert before["sweep"] and before["ceilings"] and before["cross_entropy_timing"]["entries"][0]["frac_of_copy_bw"]
    other = {**GPU_ENV, "gpu": {"model": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}}
    after = manifest.build_manifest(
        json.loads(json.dumps(before)),
        benchmarks=synthetic.loss_records()[:3],
        recorded={},
        environment=other,
        today="2026-12-01",
    )
    jsonschema.validate(after, manifest_schema())
    assert after["gpu"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert "sweep" not in after and "ceilings" not in after and "softmax_backward_timing" not in after
    assert after["torch_port"]["kernel_swap_changes_top1_token"] is None
    assert all(point[manifest.LAB_POINT_KEY] is None for point in after["softmax_kernels"].values())
    entries = after["cross_entropy_timing"]["entries"]
    assert len(entries) == 3 and not any("frac_of_copy_bw" in e for e in entries)
    assert {k for k, stamp in after["provenance"].items() if stamp["device"] == "NVIDIA H200"} == set()
    assert after["numpy_model"]["verb_form_accuracy"] == 1.0


def test_a_run_on_another_gpu_model_removes_the_figures_it_cannot_draw(tmp_path):
    old = gpu_manifest(synthetic.lab_records() + synthetic.loss_records())
    (tmp_path / "manifest.json").write_bytes(manifest.serialise(old))
    for name in figures.FIGURES:
        (tmp_path / name).write_bytes(b"the old GPU's figure")
    other = {**GPU_ENV, "gpu": {"model": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}}
    written = manifest.write_reports(tmp_path, benchmarks=synthetic.loss_records()[:3], recorded={}, environment=other)
    assert set(written) == {tmp_path / "manifest.json", *(tmp_path / name for name in figures.FIGURES)}
    assert not any((tmp_path / name).exists() for name in figures.FIGURES)  # no copy speed: no fraction drawn
    assert json.loads((tmp_path / "manifest.json").read_text())["gpu"]["model"] == "NVIDIA A100-SXM4-80GB"


def test_call_modes_are_derived_against_f_softmax_measured_the_same_way():
    built = gpu_manifest(synthetic.call_records())
    jsonschema.validate(built, manifest_schema())
    section = built["call_modes"]
    assert section["floors"] == synthetic.FLOORS
    entries = {manifest.case_key(e): e for e in section["entries"]}
    assert len(entries) == len(synthetic.CALL_SHAPES) * len(synthetic.LAUNCH_US)
    times = {
        (r["kernel"], r["B"], r["V"], r["dtype"], r["mode"]): r["us_median"]
        for r in synthetic.call_records()
        if "kernel" in r
    }
    for (kernel, B, V, dtype), e in entries.items():
        for mode in ("device", "per_call", "graph"):
            assert e[f"{mode}_us"] == times[(kernel, B, V, dtype, mode)]
            assert e["x_F_softmax"][mode] == pytest.approx(times[("F_softmax", B, V, dtype, mode)] / e[f"{mode}_us"])
    assert all(
        e["x_F_softmax"] == {"device": 1.0, "per_call": 1.0, "graph": 1.0}
        for key, e in entries.items()
        if key[0] == "F_softmax"
    )


def test_call_modes_without_a_device_time_or_a_baseline_leave_those_out():
    only_fused = [r for r in synthetic.call_records() if r.get("kernel") == "fused" and r["mode"] == "per_call"]
    entry = gpu_manifest(only_fused)["call_modes"]["entries"][0]
    assert set(entry) == {"kernel", "B", "V", "dtype", "per_call_us"}
    jsonschema.validate(gpu_manifest(only_fused), manifest_schema())


def test_byte_equivalence_records_combine_nest_and_validate():
    recorded = records.combine_recorded(
        synthetic.byte_equivalence_records()
        + [
            ("byte_equivalence", {"triton/bfloat16/batch_invariant": {"verdict": "failed", "shapes": [(8, 32000)]}}),
            (
                "byte_equivalence",
                {"F_softmax/float32/position_invariant": {"verdict": "not gated: failed", "shapes": [[1, 600]]}},
            ),
        ]
    )
    built = gpu_manifest(**recorded)
    jsonschema.validate(built, manifest_schema())
    section = built["byte_equivalence"]
    assert set(section) == {kernel for kernel, _ in synthetic.BYTE_EQUIVALENCE_CASES}
    assert section["fused"]["float32"]["deterministic"] == {"verdict": "passed", "shapes": [[1, 600], [64, 50257]]}
    assert section["triton"]["bfloat16"]["batch_invariant"] == {
        "verdict": "failed",
        "shapes": [[1, 600], [8, 32000], [64, 50257]],
    }
    assert section["F_softmax"]["float32"]["position_invariant"]["verdict"] == "not gated: failed"
    assert section["F_softmax"]["float32"]["stride_invariant"]["verdict"] == "not gated: passed"
    assert built["provenance"]["byte_equivalence.triton.bfloat16.batch_invariant"]["device"] == "NVIDIA H200"


@pytest.mark.parametrize(
    "key, value",
    [
        ("fused/float32", {"verdict": "passed", "shapes": [[1, 600]]}),
        ("fused/float32/bit_exact", {"verdict": "passed", "shapes": [[1, 600]]}),
        ("fused/float32/deterministic", {"verdict": "ok", "shapes": [[1, 600]]}),
    ],
)
def test_malformed_byte_equivalence_records_are_refused(key, value):
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        manifest.validate(gpu_manifest(byte_equivalence={key: value}))


def test_accuracy_records_nest_by_device_kernel_and_dtype_and_validate():
    built = gpu_manifest(**records.combine_recorded(synthetic.accuracy_records()))
    jsonschema.validate(built, manifest_schema())
    fused = built["accuracy"]["cuda"]["fused"]["float32"]
    assert [(e["recipe"], e["scale"], e["V"]) for e in fused] == [("randn", 4.0, 600), ("span", 1.0, 600)]
    assert fused[0]["x_F_softmax"] == pytest.approx(0.1) and fused[0]["B"] == 64
    assert built["accuracy"]["cuda"]["triton"]["float32"][0]["V"] == 262144
    assert built["provenance"]["accuracy.cuda.fused.float32"]["device"] == "NVIDIA H200"


def test_a_cpu_run_keeps_the_gpu_accuracy_and_adds_its_own_beside_it():
    """The interpreter's figures for the same kernel, dtype and case go under "cpu": the GPU's
    under "cuda" keep their values and provenance."""
    before = gpu_manifest(**records.combine_recorded(synthetic.accuracy_records("cuda")))
    cpu = records.combine_recorded(synthetic.accuracy_records("cpu"))
    cpu["accuracy"] = {k: {**v, "max_rel_err": 9e-7} for k, v in cpu["accuracy"].items()}
    after = manifest.build_manifest(
        json.loads(json.dumps(before)), benchmarks=[], recorded=cpu, environment=CPU_ENV, today="2026-12-05"
    )
    jsonschema.validate(after, manifest_schema())
    assert after["accuracy"]["cuda"] == before["accuracy"]["cuda"]
    assert after["provenance"]["accuracy.cuda.fused.float32"] == before["provenance"]["accuracy.cuda.fused.float32"]
    assert after["accuracy"]["cpu"]["fused"]["float32"][0]["max_rel_err"] == 9e-7
    assert after["provenance"]["accuracy.cpu.fused.float32"]["device"] == "cpu"
    assert after["gpu"] == before["gpu"]


def test_a_partial_accuracy_run_keeps_the_other_cases():
    before = gpu_manifest(**records.combine_recorded(synthetic.accuracy_records()))
    one = {"accuracy": {"cuda/fused/float32/span x1/600": synthetic.accuracy_figures(5e-7, 0.5)}}
    after = gpu_manifest(previous=json.loads(json.dumps(before)), today="2026-12-06", **one)
    fused = after["accuracy"]["cuda"]["fused"]["float32"]
    assert [e["max_rel_err"] for e in fused] == [before["accuracy"]["cuda"]["fused"]["float32"][0]["max_rel_err"], 5e-7]
    assert after["accuracy"]["cuda"]["triton"] == before["accuracy"]["cuda"]["triton"]


@pytest.mark.parametrize(
    "key",
    ["fused/float32/randn x4/600", "gpu/fused/float32/randn x4/600", "cuda/fused/float32/randn/600", "cuda//a/b x1/2"],
)
def test_malformed_accuracy_records_are_refused(key):
    with pytest.raises(ValueError, match="accuracy key"):
        gpu_manifest(accuracy={key: synthetic.accuracy_figures(1e-7, 0.1)})


# -- the committed manifest ----------------------------------------------------------------------------------


def nulls(value, path="manifest"):
    if value is None:
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from nulls(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from nulls(item, f"{path}[{i}]")


def test_schema_copy_is_the_contract():
    assert manifest_schema()["properties"]["experiment"]["const"] == manifest.EXPERIMENT
    jsonschema.Draft202012Validator.check_schema(manifest_schema())


def test_committed_manifest_validates(committed):
    jsonschema.validate(committed, manifest_schema())


def test_committed_manifest_is_complete(committed):
    assert list(nulls(committed)) == []
    for kernel in (*manifest.REQUIRED_KERNELS, manifest.BASELINE):
        assert kernel in committed["softmax_kernels"], kernel
    assert committed["gpu"]["model"] and committed["ceilings"]["hbm_copy_TBps"] > 0
    for section in ("softmax_kernels", "sweep", "ceilings", "gpu"):
        assert committed["provenance"][section]["device"] == committed["gpu"]["model"], section


def test_committed_ratios_are_the_ratios_of_the_recorded_times(committed):
    kernels = committed["softmax_kernels"]
    base = kernels[manifest.BASELINE][manifest.LAB_POINT_KEY]
    for name, point in kernels.items():
        assert point["frac_of_F_softmax"] == pytest.approx(base / point[manifest.LAB_POINT_KEY], rel=1e-9), name
    times = {manifest.case_key(e): e["us_median"] for e in committed["sweep"]}
    copy_GBps = committed["ceilings"]["hbm_copy_TBps"] * 1e3
    for e in committed["sweep"]:
        key = (manifest.BASELINE, e["B"], e["V"], e["dtype"])
        assert e["frac_of_F_softmax"] == pytest.approx(times[key] / e["us_median"], rel=1e-9)
        assert e["GBps"] == pytest.approx(
            spec.matrix_bytes(e["B"], e["V"], e["dtype"]) / e["us_median"] / 1e3, rel=1e-9
        )
        assert e["frac_of_copy_bw"] == pytest.approx(e["GBps"] / copy_GBps, rel=1e-9)
        assert e["us_min"] <= e["us_median"] <= e["us_max"]
    lab = {
        e["kernel"]: e["us_median"] for e in committed["sweep"] if (e["B"], e["V"], e["dtype"]) == (512, 600, "float32")
    }
    for name, point in kernels.items():
        assert point[manifest.LAB_POINT_KEY] == lab[name], name
    for e in (committed.get("call_modes") or {}).get("entries", []):
        for mode, ratio in (e.get("x_F_softmax") or {}).items():
            key = (manifest.BASELINE, e["B"], e["V"], e["dtype"])
            baseline = [c for c in committed["call_modes"]["entries"] if manifest.case_key(c) == key][0]
            assert ratio == pytest.approx(baseline[f"{mode}_us"] / e[f"{mode}_us"], rel=1e-9), (e, mode)


def test_committed_manifest_is_what_the_builder_derives_from_its_raw_values(committed):
    """Every ratio in the committed file is what the one derivation gives for its raw times."""
    copy_TBps = committed["ceilings"]["hbm_copy_TBps"]
    assert manifest.derive_sweep(committed["sweep"], copy_TBps) == committed["sweep"]
    points = manifest.kernel_points(committed["sweep"])
    assert {k: committed["softmax_kernels"][k] for k in points} == points
    if "call_modes" in committed:
        section = committed["call_modes"]
        assert manifest.derive_call_modes(section["entries"], section["floors"], committed["sweep"]) == section


def test_versions_read_without_importing_are_the_imported_ones(monkeypatch):
    import numpy
    import torch

    imported = manifest.software_versions()
    assert imported["torch"] == torch.__version__ and imported["numpy"] == numpy.__version__
    for name in ("torch", "numpy"):
        monkeypatch.delitem(sys.modules, name)  # as in a process that never imported them
    assert manifest.software_versions() == imported
    assert "torch" not in sys.modules, "reading the versions imported torch"


def test_each_sweep_entry_records_its_physical_check_and_merges_keep_it():
    checked = synthetic.record("fused", 4096, 32000, "float32", 300.0, read_TBps_over_copy=0.41)
    built = gpu_manifest(benchmarks=[checked, synthetic.record("F_softmax", 4096, 32000, "float32", 500.0)])
    jsonschema.validate(built, manifest_schema())
    entry = next(e for e in built["sweep"] if e["kernel"] == "fused")
    assert entry["read_TBps_over_copy"] == 0.41
    records, _ = merge.records_from_manifest(built)
    assert next(r for r in records if r["kernel"] == "fused")["read_TBps_over_copy"] == 0.41


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_manifest_holding_a_non_finite_number_is_not_written(value):
    # JSON has no NaN or Infinity: a figure that came out non-finite stops the write, rather
    # than leaving a file that strict readers reject.
    with pytest.raises(ValueError):
        manifest.serialise({"sweep": [{"us_median": value}]})
