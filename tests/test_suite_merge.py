"""tests/suite/merge.py on recorded data: the committed H200 manifest, the committed
pytest-benchmark JSON of the same run, and a made-up "NVIDIA H100 80GB HBM3" manifest derived
from the committed one with perturbed times, merged into one report with a column per model."""

import json

import pytest

from tests.suite import manifest, merge, synthetic
from tests.suite.testing import ROOT

pytestmark = pytest.mark.cpu

REPORTS = ROOT / "reports"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def inputs(committed, tmp_path_factory):
    folder = tmp_path_factory.mktemp("machines")
    (folder / "h200.json").write_text((REPORTS / "manifest.json").read_text())
    (folder / "h100.json").write_bytes(manifest.serialise(synthetic.another_model(committed, H100, seed=3)))
    return folder


def derived(m):
    return {
        "sweep": m["sweep"],
        "call_modes": m["call_modes"],
        "targets": m["targets"],
        "softmax_kernels": m["softmax_kernels"],
    }


def test_a_manifests_timings_rebuild_the_same_manifest(committed):
    records, ceilings = merge.records_from_manifest(committed)
    rebuilt = manifest.build_manifest(
        None,
        benchmarks=records,
        recorded={"ceilings": ceilings},
        environment={"gpu": committed["gpu"], "versions": committed["versions"], "command": "x"},
    )
    assert derived(rebuilt) == derived(committed)


def test_two_models_merge_side_by_side(inputs, committed, tmp_path, capsys):
    out = tmp_path / "merged"
    args = [str(inputs / "h200.json"), str(inputs / "h100.json"), "--out", str(out), "--no-model-figures"]
    assert merge.main(args) == 0
    assert f"2 GPU models: {H100}, NVIDIA H200" in capsys.readouterr().out
    merged = json.loads((out / "merged.json").read_text())
    assert list(merged["models"]) == [H100, "NVIDIA H200"]
    assert derived(merged["models"]["NVIDIA H200"]) == derived(committed)
    for slug, model in (("nvidia-h200", "NVIDIA H200"), ("nvidia-h100-80gb-hbm3", H100)):
        own = json.loads((out / slug / "manifest.json").read_text())
        manifest.validate(own)
        assert own["gpu"]["model"] == model and own == merged["models"][model]
    report = (out / "report.md").read_text()
    assert "| GPU | date | versions | copy TB/s | fp32 TFLOP/s |" in report
    assert f"| shape | {H100} | NVIDIA H200 |" in report
    h200 = {(e["kernel"], e["B"], e["V"], e["dtype"]): e for e in committed["sweep"]}
    h100 = {(e["kernel"], e["B"], e["V"], e["dtype"]): e for e in merged["models"][H100]["sweep"]}
    key = ("fused", 4096, 50257, "bfloat16")
    row = f"| bfloat16 (4096, 50257) | {h100[key]['frac_of_F_softmax']:.2f} / "
    assert row in report and f"{h200[key]['frac_of_F_softmax']:.2f} / " in report.split(row)[1].splitlines()[0]
    fused_lab = h200[("fused", 512, 600, "float32")]
    assert "| fused | " in report and f"{fused_lab['us_median']:.2f} ({fused_lab['frac_of_F_softmax']:.2f}) |" in report
    for name in ("speed_by_model.png", "bandwidth_by_model.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    # Merging again changes nothing on disk.
    assert (
        merge.write_merged(*merge.merge_inputs([inputs / "h200.json", inputs / "h100.json"]), out, model_figures=False)
        == []
    )


def test_benchmark_json_merges_with_a_manifest_of_the_same_model(committed, inputs):
    runs = REPORTS / "runs" / "h200-benchmarks.json"  # a whole benchmark run, kept as it was written
    # Its cases name their GPU; an older file whose cases do not needs --assume-model.
    older = json.loads(runs.read_text())
    for case in older["benchmarks"]:
        case.get("extra_info", {}).pop("gpu", None)
    (inputs / "older.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match="--assume-model"):
        merge.merge_inputs([inputs / "older.json"])
    models, sources = merge.merge_inputs([inputs / "h100.json", runs])
    assert sources == {H100: [str(inputs / "h100.json")], "NVIDIA H200": [str(runs)]}
    assumed, _ = merge.merge_inputs([inputs / "older.json"], assume_model="NVIDIA H200")
    assert assumed["NVIDIA H200"]["sweep"] == models["NVIDIA H200"]["sweep"]
    from_json = models["NVIDIA H200"]
    copy_case = [b for b in older["benchmarks"] if b["extra_info"].get("ceiling") == "copy"]
    assert from_json["ceilings"]["hbm_copy_TBps"] == copy_case[0]["extra_info"]["TBps"]
    # One sweep entry per device-time case of a swept shape, the same set the committed run has.
    assert {(e["kernel"], e["B"], e["V"], e["dtype"]) for e in from_json["sweep"]} == {
        (e["kernel"], e["B"], e["V"], e["dtype"]) for e in committed["sweep"]
    }
    # A later input of the same model wins case by case; what it lacks stays.
    some = dict(committed, sweep=[dict(e, us_median=e["us_median"] * 2) for e in committed["sweep"] if e["V"] == 600])
    (inputs / "later.json").write_text(json.dumps(some))
    models, _ = merge.merge_inputs([inputs / "h200.json", inputs / "later.json"])
    sweep = {(e["kernel"], e["B"], e["V"], e["dtype"]): e["us_median"] for e in models["NVIDIA H200"]["sweep"]}
    for e in committed["sweep"]:
        key = (e["kernel"], e["B"], e["V"], e["dtype"])
        assert sweep[key] == pytest.approx(e["us_median"] * (2 if e["V"] == 600 else 1))


def test_inputs_that_are_not_results_are_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="neither a manifest"):
        merge.merge_inputs([bad])
    with pytest.raises(ValueError, match="cannot read"):
        merge.merge_inputs([tmp_path / "missing.json"])
    with pytest.raises(SystemExit):
        merge.main([str(bad), "--out", str(tmp_path / "out")])


def test_the_side_by_side_figures_need_data():
    assert merge.by_model_png({"A": {"sweep": []}}, "frac_of_copy_bw") is None
