"""The manifest's cross-entropy and softmax-backward timing sections (tests/suite/manifest.py,
LOSS_OPS) built from made-up records of the shape tests/test_loss_benchmarks.py records: ratios
derived within the run, goals reported per miss, valid against the schema, kept apart from the
softmax sweep."""

import json

import pytest

from tests.suite import manifest
from tests.suite.synthetic import CEILINGS, GPU_ENV

jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.cpu


def loss_record(op, impl, N, V, dtype, us, *, mode="device", peak=None):
    passes = manifest.LOSS_OPS[op][2]
    r = {"op": op, "impl": impl, "N": N, "V": V, "dtype": dtype, "mode": mode, "us_median": us}
    r.update(us_min=us * 0.9, us_max=us * 1.2, bytes=manifest.matrix_bytes(N, V, dtype, passes=passes))
    if peak is not None:
        r["peak_extra_bytes"] = peak
    return r


def records():
    N, V = 4096, 32000
    logits = manifest.matrix_bytes(N, V, "float32", passes=1)
    copy_us = 2 * logits / (CEILINGS["hbm_copy_TBps"] * 1e12) * 1e6  # one read + one write at copy speed
    out = [
        loss_record("cross_entropy", "triton", N, V, "float32", copy_us / 0.93, peak=logits),
        loss_record("cross_entropy", "F_cross_entropy", N, V, "float32", copy_us / 0.93 * 3.0, peak=3 * logits),
        loss_record("cross_entropy", "torch_compile", N, V, "float32", copy_us / 0.93 * 1.1, peak=logits),
        loss_record("softmax_backward", "triton", N, V, "float32", 1.5 * copy_us / 0.8),
        loss_record("softmax_backward", "softmax_backward_data", N, V, "float32", 1.5 * copy_us / 0.7),
    ]
    for impl, us in (("triton", 40.0), ("F_cross_entropy", 90.0), ("torch_compile", 60.0)):
        out.append(loss_record("cross_entropy", impl, N, V, "float32", us * 1e3, mode="per_call"))
        out.append(loss_record("cross_entropy", impl, N, V, "float32", us * 1e3 * 0.9, mode="graph"))
    return out


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
    assert "x compiled (goal 1.2)" in goals["missed"][0]["why"] and "copy" not in goals["missed"][0]["why"]
    bwd = built["softmax_backward_timing"]
    assert bwd["entries"][0]["bytes_by_design"] == manifest.matrix_bytes(4096, 32000, "float32", passes=3)
    assert bwd["goals"]["cases_missed"] == 1 and "of copy" in bwd["goals"]["missed"][0]["why"]
    # The softmax sweep and its call modes are untouched by these records.
    assert "sweep" not in built and "call_modes" not in built


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
    assert {manifest.LOSS_OURS, manifest.LOSS_COMPILED} <= set(kernels.CROSS_ENTROPY_KERNELS)
    assert {manifest.LOSS_OURS, manifest.LOSS_COMPILED} <= set(kernels.SOFTMAX_BACKWARD_KERNELS)


def test_the_loss_benchmark_grid_is_the_issues():
    """tests/test_loss_benchmarks.py's cases, checked on the CPU: unique ids, every implementation
    of each registry at every listed shape and dtype in device time, and every per-call or graph
    case beside a device-time case."""
    import collections

    import kernels
    from tests import test_loss_benchmarks as bench

    for op, registry in (
        ("cross_entropy", kernels.CROSS_ENTROPY_KERNELS),
        ("softmax_backward", kernels.SOFTMAX_BACKWARD_KERNELS),
    ):
        cases = [tuple(p.values) for p in bench.cases(op)]
        ids = [p.id for p in bench.cases(op)]
        assert [i for i, n in collections.Counter(ids).items() if n > 1] == []
        device = {c[1:] for c in cases if c[0] == "device"}
        assert device == {
            (impl, N, V, dtype)
            for impl in registry
            for N in (4096, 16384)
            for V in (32000, 50257, 128256, 151936, 262144)
            for dtype in ("float32", "bfloat16")
        }
        assert {c[1:] for c in cases if c[0] != "device"} <= device
        assert {c[0] for c in cases} == {"device", "per_call", "graph"}
