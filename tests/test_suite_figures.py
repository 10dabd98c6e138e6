"""tests/suite/figures.py from synthetic manifests: each figure is drawn when the manifest has
its data, nothing when it does not, and an unchanged manifest gives byte-identical PNGs."""

import itertools
import math

import pytest

from kernels import spec
from tests.suite import figures, manifest, synthetic
from tests.suite.testing import committed_manifest

pytestmark = pytest.mark.cpu

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def full_manifest(**overrides):
    built = manifest.build_manifest(
        None,
        benchmarks=synthetic.lab_records()
        + synthetic.large_records()
        + synthetic.call_records()
        + synthetic.loss_records(),
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
    assert set(rendered) == {"roofline.png", "bandwidth.png", "call_modes.png", "loss_timing.png"}
    for name, png in rendered.items():
        assert png.startswith(PNG_MAGIC) and len(png) > 20_000, name


@pytest.mark.parametrize(
    "name, missing",
    [
        ("roofline.png", {"ceilings": {}}),
        ("bandwidth.png", {"ceilings": {}}),
        ("roofline.png", {"sweep": []}),
        ("bandwidth.png", {"sweep": [e for e in full_manifest()["sweep"] if e["B"] * e["V"] < 1e6]}),  # all < 100 MB
        ("call_modes.png", {"call_modes": {"entries": [], "floors": synthetic.FLOORS}}),
        ("loss_timing.png", {"ceilings": {}}),
        ("loss_timing.png", {"cross_entropy_timing": {}, "softmax_backward_timing": {}}),
    ],
)
def test_a_figure_without_its_data_is_not_drawn(name, missing):
    assert figures.FIGURES[name](full_manifest(**missing)) is None


def test_render_all_leaves_out_the_figures_without_their_data():
    # The one figure whose data is left draws; render_all keeps it and no other (one drawing,
    # where each case above would draw all the others too).
    without_ceilings = full_manifest(ceilings={}, cross_entropy_timing={}, softmax_backward_timing={})
    assert set(figures.render_all(without_ceilings)) == {"call_modes.png"}


def test_bandwidth_shows_only_the_kernels_and_shapes_the_goals_apply_to():
    sweep = full_manifest()["sweep"]
    outside = [e for e in sweep if e["kernel"] not in figures.BANDWIDTH_KERNELS]
    assert outside, "the synthetic sweep has kernels the bandwidth figure leaves out"
    assert figures.bandwidth_png(full_manifest(sweep=outside)) is None


def test_write_reports_writes_the_figures_atomically_and_rewrites_none_unchanged(tmp_path):
    # A run that measured nothing writes nothing.
    assert manifest.write_reports(tmp_path, benchmarks=[], recorded={}, environment=synthetic.CPU_ENV) == []
    assert list(tmp_path.iterdir()) == []
    kwargs = {
        "benchmarks": synthetic.lab_records()
        + synthetic.large_records()
        + synthetic.call_records()
        + synthetic.loss_records(),
        "recorded": {"ceilings": dict(synthetic.CEILINGS)},
        "environment": synthetic.GPU_ENV,
    }
    written = manifest.write_reports(tmp_path, today="2026-11-29", **kwargs)
    assert {p.name for p in written} == {"manifest.json", *figures.FIGURES}
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in written}  # no temporary files left behind
    for name in figures.FIGURES:
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    # The same measurements draw the same bytes: nothing is rewritten.
    assert manifest.write_reports(tmp_path, today="2026-12-01", **kwargs) == []


def test_figures_are_redrawn_from_a_manifest_on_disk(tmp_path, capsys):
    # A manifest with the call modes only: one figure to draw (each is drawn by the tests above).
    only_calls = full_manifest(ceilings={}, cross_entropy_timing={}, softmax_backward_timing={})
    (tmp_path / "manifest.json").write_bytes(manifest.serialise(only_calls))
    assert figures.main([str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.glob("*.png")] == ["call_modes.png"]
    figures.main([str(tmp_path)])
    assert capsys.readouterr().out.count("unchanged") == 1
    with pytest.raises(SystemExit):
        figures.main([str(tmp_path / "nowhere")])


# -- the figures read right ---------------------------------------------------------------------------------


def test_labels_stay_apart_and_near_their_points():
    ys = [0.0, 0.02, 0.03, 1.0, -2.0]
    placed = figures.spread_labels(ys, gap=0.1)
    ordered = sorted(range(len(ys)), key=lambda i: ys[i])
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert placed[b] - placed[a] >= 0.1 - 1e-12
    assert placed[3] == 1.0 and placed[4] == -2.0  # a label with room stays at its point
    assert abs(sum(placed[:3]) / 3 - sum(ys[:3]) / 3) < 1e-12  # a crowded group is centred on its points


def test_the_roofline_draws_every_kernel_at_the_lab_point_and_none_on_another():
    m = committed_manifest()
    points = figures.roofline_points(m, m["ceilings"]["hbm_copy_TBps"])
    lab = {e["kernel"] for e in m["sweep"] if (e["B"], e["V"], e["dtype"]) == manifest.LAB_POINT}
    assert {p["kernel"] for p in points} == lab and "torch_compile" in lab
    for p, q in itertools.combinations(points, 2):
        # Markers are ~8 px: apart by a tenth of an octave sideways or a tenth of a decade up.
        apart = abs(math.log2(p["x"] / q["x"])) >= 0.1 or abs(math.log10(p["achieved"] / q["achieved"])) >= 0.1
        assert apart, (p["kernel"], q["kernel"])
        assert abs(math.log10(p["label"][1] / q["label"][1])) >= 0.1 or p["left"] != q["left"]
    for p in points:
        assert abs(math.log2(p["x"] / p["intensity"])) < 0.5  # drawn at its own intensity
        if p["left"]:  # a label left of its point sits under the roof, where it does not cross it
            assert p["label"][1] < m["ceilings"]["hbm_copy_TBps"] * p["label"][0] / 2


def test_bandwidth_marks_misses_and_unmeasured_cells():
    cells = figures.bandwidth_cells(committed_manifest())
    fp32, bf16 = cells["float32"], cells["bfloat16"]
    # No kernel measured fp32 (32768, 128256) (16.8 GB a tensor): all four cells are shown empty.
    assert (128256, 32768) in fp32["shapes"]
    assert all((128256, 32768, k) not in fp32["measured"] for k in figures.BANDWIDTH_KERNELS)
    # bf16 (4096, 4096) moves 67 MB: below the goals' 100 MB, not a cell at all.
    assert (4096, 4096) not in bf16["shapes"] and (4096, 4096) in fp32["shapes"]
    # A measured cell holds the sweep's figure for its shape, kernel and dtype.
    (sweep_entry,) = [
        e
        for e in committed_manifest()["sweep"]
        if (e["kernel"], e["B"], e["V"], e["dtype"]) == ("fused", 32768, 4096, "bfloat16")
    ]
    assert bf16["measured"][(4096, 32768, "fused")] == sweep_entry["frac_of_copy_bw"]
    assert figures.misses_goal("fused", 32768, 4096, "bfloat16", 0.894)
    assert not figures.misses_goal("fused", 32768, 4096, "bfloat16", 0.904)
    assert not figures.misses_goal("F_softmax", 32768, 4096, "bfloat16", 0.5)  # the baselines have no goal
    assert figures.misses_goal("triton", 32768, 600, "bfloat16", 0.79)
    assert not figures.misses_goal("triton", 32768, 600, "bfloat16", 0.81)
    assert not figures.misses_goal("fused", 32768, 600, "bfloat16", 0.5)  # 79 MB: no goal for fused


def test_bandwidth_draws_what_a_copy_of_each_shapes_bytes_reached():
    B, V, dtype = 4096, 4096, "float32"
    us = spec.matrix_bytes(B, V, dtype) / synthetic.COPY_GBps / 1e3  # at the ceiling
    records = [
        synthetic.record("fused", B, V, dtype, us / 0.88, copy_same_bytes_us=us / 0.9),
        synthetic.record("triton", B, V, dtype, us / 0.85, copy_same_bytes_us=us / 0.9),
        synthetic.record("fused", 32768, 4096, dtype, us * 8),  # timed without a copy of its own
    ]
    sweep = manifest.sweep_entries(records, copy_TBps=synthetic.COPY_GBps / 1e3)
    cells = figures.bandwidth_cells(full_manifest(sweep=sweep))["float32"]
    assert cells["copy_same_bytes"] == {(V, B): pytest.approx(0.9)}
    assert figures.bandwidth_png(full_manifest(sweep=sweep)) is not None


def test_call_modes_counts_where_warm_replays_beat_cold_launches():
    entries = committed_manifest()["call_modes"]["entries"]
    below, both = figures.warm_below_cold(entries)
    # Every entry of the committed run has both clocks; warm replays beat most cold launches.
    assert both == len(entries) > 100
    assert below == sum(e["graph_us"] < e["device_us"] for e in entries) > both / 2
    assert figures.warm_below_cold([{"graph_us": 2.0, "device_us": 3.0}, {"graph_us": 4.0}]) == (1, 1)
