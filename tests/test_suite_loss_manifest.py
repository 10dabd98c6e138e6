"""The manifest's cross-entropy and softmax-backward timing sections (tests/suite/manifest.py,
LOSS_OPS) built from made-up records of the shape tests/test_loss_benchmarks.py records: ratios
derived within the run, goals reported per miss, valid against the schema, kept apart from the
softmax sweep."""

import json

import pytest

from tests.suite import manifest
from tests.suite.synthetic import CEILINGS, GPU_ENV, loss_record
from tests.suite.synthetic import loss_records as records

jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.cpu


def build(benchmarks, previous=None):
    return manifest.build_manifest(
        previous, benchmarks=benchmarks, recorded={"ceilings": dict(CEILINGS)}, environment=GPU_ENV, today="2026-12-01"
    )


def test_loss_sections_derive_ratios_goals_and_validate():
    built = build(records())
    jsonschema.validate(built, json.loads(manifest.SCHEMA_PATH.read_text()))
    ce = {e["impl"]: e for e in built["cross_entropy_timing"]["entries"]}
    assert ce["triton"]["frac_of_copy_bw"] == pytest.approx(0.93)
    assert ce["triton"]["x_eager"]["device"] == pytest.approx(3.0)
    assert ce["triton"]["x_compiled"]["device"] == pytest.approx(1.1)
    assert ce["triton"]["x_eager"]["per_call"] == pytest.approx(90 / 40)
    assert ce["triton"]["peak_extra_over_matrix"] == pytest.approx(1.0)
    assert "x_eager" not in ce["F_cross_entropy"] and "x_compiled" in ce["F_cross_entropy"]
    goals = built["cross_entropy_timing"]["goals"]
    assert goals["cases_checked"] == 1 and goals["cases_missed"] == 1
    assert goals["missed"][0]["why"] == "1.100 x compiled (goal 1.3)"
    assert goals["missed"][0]["impl"] == "triton"
    bwd = built["softmax_backward_timing"]
    assert bwd["entries"][0]["bytes_by_design"] == manifest.matrix_bytes(4096, 32000, "float32", passes=3)
    assert bwd["goals"]["cases_missed"] == 1 and "of copy" in bwd["goals"]["missed"][0]["why"]
    # The softmax sweep and its call modes are untouched by these records.
    assert "sweep" not in built and "call_modes" not in built


@pytest.mark.parametrize(
    "op, V, goals",
    [
        ("cross_entropy", 262144, {"frac_of_copy_bw": 0.80, "x_eager": 2.0, "x_compiled": 1.3}),
        ("cross_entropy", 262145, {"frac_of_copy_bw": 0.60, "x_eager": 2.0, "x_compiled": 1.3}),
        ("softmax_backward", 262145, {"frac_of_copy_bw": 0.85, "x_compiled": 1.0}),
    ],
)
def test_loss_goals_per_row_length(op, V, goals):
    """A cross-entropy row that fits on chip (a cluster's shared memory on sm_90) is held to 0.80
    of its floor, a longer one to 0.60; the backward to 0.85 at every length."""
    got = manifest.loss_goals(op, V)
    assert {k: got[k] for k in goals} == goals
    entry = {
        "impl": "triton",
        "N": 4096,
        "V": V,
        "dtype": "float32",
        "frac_of_copy_bw": goals["frac_of_copy_bw"] - 0.01,
    }
    (miss,) = manifest.loss_goal_report([entry], op)["missed"]
    assert miss["why"] == f"{goals['frac_of_copy_bw'] - 0.01:.3f} of copy (goal {goals['frac_of_copy_bw']})"
    entry["frac_of_copy_bw"] = goals["frac_of_copy_bw"]
    assert manifest.loss_goal_report([entry], op)["cases_missed"] == 0


def test_loss_sections_merge_with_earlier_runs_and_leave_equal_values_alone():
    first = build(records())
    again = build(records(), previous=json.loads(json.dumps(first)))
    assert manifest.serialise(again) == manifest.serialise(first)
    extra = [loss_record("cross_entropy", "triton", 16384, 262144, "bfloat16", 5000.0)]
    merged = build(extra, previous=json.loads(json.dumps(first)))
    shapes = {(e["impl"], e["N"], e["V"]) for e in merged["cross_entropy_timing"]["entries"]}
    assert ("triton", 4096, 32000) in shapes and ("triton", 16384, 262144) in shapes


def test_the_sections_baselines_are_the_registrys():
    import kernels

    assert manifest.LOSS_OPS["cross_entropy"][1] == kernels.CROSS_ENTROPY_BASELINE
    assert manifest.LOSS_OPS["softmax_backward"][1] == kernels.BACKWARD_BASELINE
    for registry in (kernels.CROSS_ENTROPY_KERNELS, kernels.SOFTMAX_BACKWARD_KERNELS):
        assert set(manifest.loss_ours(registry)) == {k for k, v in registry.items() if not v.baseline}
        assert manifest.LOSS_COMPILED in registry


def test_the_loss_benchmark_grid_is_the_issues():
    """tests/test_loss_benchmarks.py's cases, checked on the CPU: unique ids; the full grid has
    every implementation of each registry at every listed shape and dtype in device time, and
    every per-call or graph case beside a device-time case; the default grid is part of it, in
    device time, with every implementation and dtype at the smallest and the largest vocabulary."""
    import collections

    import kernels
    from tests import test_loss_benchmarks as bench

    assert set(bench.OPS.values()) == set(manifest.LOSS_OPS)
    for op, registry, vocabularies in (
        ("cross_entropy", kernels.CROSS_ENTROPY_KERNELS, (32000, 262144)),
        # weighted: the vocabularies of the two row cuts, 16-byte aligned and not
        ("weighted_cross_entropy", kernels.CROSS_ENTROPY_KERNELS, (50257, 128256)),
        ("softmax_backward", kernels.SOFTMAX_BACKWARD_KERNELS, (32000, 262144)),
    ):
        full = [tuple(p.values) for p in bench.cases(op, "full")]
        for grid in bench.GRIDS:
            ids = [p.id for p in bench.cases(op, grid)]
            assert [i for i, n in collections.Counter(ids).items() if n > 1] == []
        device = {c[1:] for c in full if c[0] == "device"}
        every_v = (32000, 50257, 128256, 151936, 262144) if op != "weighted_cross_entropy" else vocabularies
        assert device == {
            (impl, N, V, dtype)
            for impl in registry
            for N in (4096, 16384)
            for V in every_v
            for dtype in ("float32", "bfloat16")
        }
        assert {c[1:] for c in full if c[0] != "device"} <= device
        assert {c[0] for c in full} == {"device", "per_call", "graph"}
        # The gate compares the device time of the gated kernels, each case marked with its op.
        for p in bench.cases(op, "full"):
            mode, impl = p.values[:2]
            marks = [m for m in p.marks if m.name == "gated"]
            gated = mode == "device" and not registry[impl].baseline
            assert [m.kwargs for m in marks] == ([{"op": op}] if gated else []), p.id
        default = [tuple(p.values) for p in bench.cases(op)]
        assert set(default) < set(full) and {c[0] for c in default} == {"device"}
        assert {(impl, V, dtype) for impl in registry for V in vocabularies for dtype in ("float32", "bfloat16")} <= {
            (c[1], c[3], c[4]) for c in default
        }
