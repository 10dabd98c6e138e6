"""The committed reports/manifest.json: valid, complete, and consistent with its own numbers."""

import json
from pathlib import Path

import pytest

from tests import reporting

jsonschema = pytest.importorskip("jsonschema")  # a CPU-suite dependency; absent on bare GPU images

pytestmark = pytest.mark.cpu

MANIFEST = Path(__file__).resolve().parent.parent / "reports" / "manifest.json"


@pytest.fixture(scope="module")
def manifest():
    return json.loads(MANIFEST.read_text())


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
    schema = json.loads(reporting.SCHEMA_PATH.read_text())
    assert schema["properties"]["experiment"]["const"] == reporting.EXPERIMENT
    jsonschema.Draft202012Validator.check_schema(schema)


def test_committed_manifest_validates(manifest):
    jsonschema.validate(manifest, json.loads(reporting.SCHEMA_PATH.read_text()))


def test_committed_manifest_is_complete(manifest):
    assert list(nulls(manifest)) == []
    for kernel in ("naive", "smem", "fused", "triton", "F_softmax"):
        assert kernel in manifest["softmax_kernels"], kernel
    assert manifest["gpu"]["model"] and manifest["ceilings"]["hbm_copy_TBps"] > 0
    for section in ("softmax_kernels", "sweep", "ceilings", "gpu"):
        assert manifest["provenance"][section]["device"] == manifest["gpu"]["model"], section


def test_fractions_are_the_ratios_of_the_recorded_times(manifest):
    kernels = manifest["softmax_kernels"]
    base = kernels["F_softmax"]["us_at_B512"]
    for name, point in kernels.items():
        assert point["frac_of_F_softmax"] == pytest.approx(base / point["us_at_B512"], rel=1e-9), name
    times = {(e["kernel"], e["B"], e["V"], e["dtype"]): e["us_median"] for e in manifest["sweep"]}
    copy_GBps = manifest["ceilings"]["hbm_copy_TBps"] * 1e3
    for e in manifest["sweep"]:
        key = ("F_softmax", e["B"], e["V"], e["dtype"])
        assert e["frac_of_F_softmax"] == pytest.approx(times[key] / e["us_median"], rel=1e-9)
        itemsize = 4 if e["dtype"] == "float32" else 2
        assert e["GBps"] == pytest.approx(2 * e["B"] * e["V"] * itemsize / e["us_median"] / 1e3, rel=1e-9)
        assert e["frac_of_copy_bw"] == pytest.approx(e["GBps"] / copy_GBps, rel=1e-9)
        assert e["us_min"] <= e["us_median"] <= e["us_max"]
    lab = {e["kernel"]: e["us_median"] for e in manifest["sweep"] if (e["B"], e["V"], e["dtype"]) == (512, 600, "float32")}
    for name, point in kernels.items():
        assert point["us_at_B512"] == lab[name], name
