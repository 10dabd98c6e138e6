"""tests/suite/figures.py from synthetic manifests: each figure is drawn when the manifest has
its data, nothing when it does not, and an unchanged manifest gives byte-identical PNGs."""

import pytest

from tests.suite import figures, manifest, synthetic

pytestmark = pytest.mark.cpu

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def full_manifest(**overrides):
    built = manifest.build_manifest(
        None,
        benchmarks=synthetic.lab_records() + synthetic.large_records() + synthetic.call_records(),
        recorded={"ceilings": dict(synthetic.CEILINGS)},
        environment=synthetic.GPU_ENV,
        today="2026-11-29",
    )
    built.update(overrides)
    return built


@pytest.fixture(scope="module")
def rendered():
    return figures.render_all(full_manifest())


def test_every_figure_is_drawn_from_a_complete_manifest(rendered):
    assert set(rendered) == {"roofline.png", "bandwidth.png", "call_modes.png"}
    for name, png in rendered.items():
        assert png.startswith(PNG_MAGIC) and len(png) > 20_000, name


def test_an_unchanged_manifest_draws_the_same_bytes(rendered):
    assert figures.render_all(full_manifest()) == rendered


@pytest.mark.parametrize(
    "name, missing",
    [
        ("roofline.png", {"ceilings": {}}),
        ("bandwidth.png", {"ceilings": {}}),
        ("roofline.png", {"sweep": []}),
        ("bandwidth.png", {"sweep": [e for e in full_manifest()["sweep"] if e["B"] * e["V"] < 1e6]}),  # all < 100 MB
        ("call_modes.png", {"call_modes": {"entries": [], "floors": synthetic.FLOORS}}),
    ],
)
def test_a_figure_without_its_data_is_not_drawn(name, missing):
    incomplete = full_manifest(**missing)
    assert figures.FIGURES[name](incomplete) is None
    assert name not in figures.render_all(incomplete)


def test_bandwidth_shows_only_the_kernels_and_shapes_the_goals_apply_to():
    sweep = full_manifest()["sweep"]
    outside = [e for e in sweep if e["kernel"] not in figures.BANDWIDTH_KERNELS]
    assert outside, "the synthetic sweep has kernels the bandwidth figure leaves out"
    assert figures.bandwidth_png(full_manifest(sweep=outside)) is None


def test_write_reports_writes_the_figures_and_rewrites_none_unchanged(tmp_path):
    kwargs = {
        "benchmarks": synthetic.lab_records() + synthetic.large_records() + synthetic.call_records(),
        "recorded": {"ceilings": dict(synthetic.CEILINGS)},
        "environment": synthetic.GPU_ENV,
    }
    written = manifest.write_reports(tmp_path, today="2026-11-29", **kwargs)
    assert {p.name for p in written} == {"manifest.json", *figures.FIGURES}
    for name in figures.FIGURES:
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    assert manifest.write_reports(tmp_path, today="2026-12-01", **kwargs) == []


def test_figures_are_redrawn_from_a_manifest_on_disk(tmp_path, capsys):
    (tmp_path / "manifest.json").write_bytes(manifest.serialise(full_manifest()))
    assert figures.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(figures.FIGURES)
    figures.main([str(tmp_path)])
    assert capsys.readouterr().out.count("unchanged") == len(figures.FIGURES)
    with pytest.raises(SystemExit):
        figures.main([str(tmp_path / "nowhere")])
