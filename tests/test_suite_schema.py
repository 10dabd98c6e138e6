"""reports/manifest.schema.json describes every section the suite can write, and nothing else.

The sections are derived from the writer, not listed here: those `build_manifest` writes itself
(built from a synthetic run that records every kind of raw value it derives sections from), and
those tests record through the `record_manifest` fixture, read from the source of every test
module. The committed manifest validates against the schema, and the fixture refuses a section
the schema does not describe.
"""

import ast
import json
from pathlib import Path

import pytest

from tests.suite import manifest, records, synthetic
from tests.suite.testing import manifest_schema

jsonschema = pytest.importorskip("jsonschema")  # a CPU-suite dependency; absent on bare GPU images

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
LAB_SCHEMA = ROOT / "reports" / "lab.manifest.schema.json"
FIXTURE = "record_manifest"


def loss_op_records() -> list[dict]:
    """One device-time record per operation the manifest has a timing section for."""
    out = []
    for op, (_, baseline, passes) in manifest.LOSS_OPS.items():
        for impl in ("ours", baseline):
            out.append(
                {
                    "op": op,
                    "impl": impl,
                    "N": 64,
                    "V": 600,
                    "dtype": "float32",
                    "mode": "device",
                    "us_median": 5.0,
                    "us_min": 4.5,
                    "us_max": 7.5,
                    "bytes": manifest.matrix_bytes(64, 600, "float32", passes=passes),
                }
            )
    return out


def built_sections() -> set[str]:
    """The sections build_manifest writes from a run that measured every kind of thing."""
    benchmarks = synthetic.lab_records() + synthetic.large_records() + synthetic.call_records() + loss_op_records()
    recorded = records.combine_recorded(
        [("ceilings", dict(synthetic.CEILINGS)), *synthetic.byte_equivalence_records(), *synthetic.accuracy_records()]
    )
    built = manifest.build_manifest(
        None, benchmarks=benchmarks, recorded=recorded, environment=synthetic.GPU_ENV, today="2026-01-01"
    )
    jsonschema.validate(built, manifest_schema())
    return set(built)


def _is_fixture_lookup(node) -> bool:
    """request.getfixturevalue("record_manifest")"""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "getfixturevalue"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == FIXTURE
    )


def recorded_sections(path: Path) -> dict[str, list[str]]:
    """{section: [where]} for every call of the record_manifest fixture in a module: called by
    its name, through request.getfixturevalue, or through a name bound to that lookup. A section
    given as a name must be a module-level string constant; anything else is reported as
    unresolvable (the section is then '?')."""
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    aliases = {FIXTURE}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_fixture_lookup(node.value):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        direct = isinstance(node.func, ast.Name) and node.func.id in aliases
        if not (direct or _is_fixture_lookup(node.func)):
            continue
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            section = first.value
        elif isinstance(first, ast.Name) and first.id in constants:
            section = constants[first.id]
        else:
            section = "?"
        found.setdefault(section, []).append(where)
    return found


def all_recorded_sections() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        for section, where in recorded_sections(path).items():
            found.setdefault(section, []).extend(where)
    return found


def test_the_source_scan_finds_each_way_of_recording(tmp_path):
    """The scan itself can fail: it finds the fixture called by name, through a lookup, through
    a name bound to a lookup and with a module constant, and flags a section it cannot resolve."""
    module = tmp_path / "test_probe.py"
    module.write_text(
        "SECTION = 'by_constant'\n"
        "def test_a(record_manifest, request, section):\n"
        "    record_manifest('by_name', x=1)\n"
        "    record_manifest(SECTION, x=1)\n"
        "    request.getfixturevalue('record_manifest')('by_lookup', x=1)\n"
        "    record = request.getfixturevalue('record_manifest')\n"
        "    record('by_alias', x=1)\n"
        "    record_manifest(section, x=1)\n"
    )
    found = recorded_sections(module)
    assert set(found) == {"by_name", "by_constant", "by_lookup", "by_alias", "?"}, found


def test_every_section_the_suite_writes_is_in_the_schema_and_nothing_else():
    recorded = all_recorded_sections()
    assert "?" not in recorded, f"record_manifest with a section the scan cannot resolve: {recorded.get('?')}"
    built = built_sections()
    described = set(manifest_schema()["properties"])
    missing = {s: recorded.get(s, ["build_manifest"]) for s in (built | set(recorded)) - described}
    assert not missing, f"sections written but not described in {manifest.SCHEMA_PATH.name}: {missing}"
    stale = described - built - set(recorded)
    assert not stale, f"{manifest.SCHEMA_PATH.name} describes sections nothing writes: {sorted(stale)}"
    refuses = manifest_schema().get("additionalProperties") is False
    assert refuses, "the schema must refuse sections it does not describe"
    assert manifest.schema_sections() == described


def test_the_committed_manifest_validates_and_uses_todays_key_names():
    committed = json.loads((ROOT / "reports" / "manifest.json").read_text())
    jsonschema.validate(committed, manifest_schema())
    assert manifest.upgrade(committed) == committed, "reports/manifest.json holds keys of an earlier schema"


def test_the_lab_point_key_is_the_contracts_at_the_lab_point():
    B, V, dtype = manifest.LAB_POINT
    point = manifest_schema()["$defs"]["kernel_point"]
    assert manifest.LAB_POINT_KEY == f"us_at_B{B}", "the contract's key names B = 512: the lab point moved"
    assert f"V = {V}, {dtype}" in point["description"]
    assert manifest.LAB_POINT_KEY in point["required"] and manifest.LAB_POINT_KEY in point["properties"]
    assert set(point["properties"]).isdisjoint(manifest.RENAMED_KEYS["softmax_kernels"])


def test_the_committed_manifest_holds_the_lab_contract():
    """The lab's own schema (a verbatim copy: reports/lab.manifest.schema.json) accepts the
    committed manifest, and every key it requires, at any depth, ours requires by the same name."""
    lab = json.loads(LAB_SCHEMA.read_text())
    committed = json.loads((ROOT / "reports" / "manifest.json").read_text())
    jsonschema.validate(committed, lab)
    jsonschema.validate(committed, manifest_schema())

    def resolved(root, node):
        parts = [node]
        if "$ref" in node:
            parts.append(root["$defs"][node["$ref"].rsplit("/", 1)[1]])
        parts += [resolved(root, child) for child in node.get("allOf", [])]
        return {
            "required": {key for part in parts for key in part.get("required", [])},
            "properties": {key: child for part in parts for key, child in (part.get("properties") or {}).items()},
        }

    def required(root, node, path=()):
        node = resolved(root, node)
        for key in sorted(node["required"]):
            yield (*path, key)
        for key, child in node["properties"].items():
            yield from required(root, child, (*path, key))

    ours = manifest_schema()
    ours_required = set(required(ours, ours))
    missing = [".".join(keys) for keys in required(lab, lab) if keys not in ours_required]
    assert not missing, f"the lab contract's keys {missing} are not required by {manifest.SCHEMA_PATH.name}"


def test_the_fixture_refuses_a_section_the_schema_does_not_describe():
    manifest.check_section("sweep")
    with pytest.raises(ValueError, match="not described in manifest.schema.json"):
        manifest.check_section("no_such_section")


def test_an_old_manifest_is_read_under_todays_names():
    """manifest.upgrade maps the keys earlier manifests used (RENAMED_KEYS) and moves fused's
    size-class descriptions out of the sweep's plan, which names the path."""
    old = {
        "softmax_kernels": {"fused": {"us_at_B512_V600_fp32": 4.0, "frac_of_F_softmax": 1.2, "frac_of_hbm_peak": 0.1}},
        "torch_port": {"allclose_to_numpy_at_fp32_cpu": "passed"},
        "provenance": {"torch_port.allclose_to_numpy_at_fp32_cpu": {"date": "then"}, "gpu": {"date": "now"}},
        "sweep": [
            {"kernel": "fused", "plan": "warp(rows/block=8, elems/lane=24, 16-byte vectors)"},
            {"kernel": "fused", "plan": "row(cluster=1, threads=128, elems/thread=32)"},
            {"kernel": "triton", "plan": "tile"},
        ],
    }
    new = manifest.upgrade(old)
    assert new["softmax_kernels"]["fused"] == {
        manifest.LAB_POINT_KEY: 4.0,
        "frac_of_F_softmax": 1.2,
        "frac_of_copy_bw": 0.1,
    }
    assert new["torch_port"] == {"byte_equivalence_at_fp32_cpu": "passed"}
    assert new["provenance"] == {"torch_port.byte_equivalence_at_fp32_cpu": {"date": "then"}, "gpu": {"date": "now"}}
    # Where the new name has provenance of its own, the old name's goes.
    both = dict(old["provenance"], **{"torch_port.byte_equivalence_at_fp32_cpu": {"date": "now"}})
    assert manifest.upgrade(dict(old, provenance=both))["provenance"] == {
        "torch_port.byte_equivalence_at_fp32_cpu": {"date": "now"},
        "gpu": {"date": "now"},
    }
    assert [(e["plan"], e.get("size_class")) for e in new["sweep"]] == [
        ("warpvec", "warpvec(rows/block=8, elems/lane=24, 16-byte vectors)"),
        ("row", "row(cluster=1, threads=128, elems/thread=32)"),
        ("tile", None),
    ]
    assert old["torch_port"] == {"allclose_to_numpy_at_fp32_cpu": "passed"}, "upgrade must not change its input"
