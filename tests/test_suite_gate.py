"""tests/suite/gate.py on synthetic paired measurements: the statistics of one run, the rule,
which mode gates which case, baselines per GPU model (recorded, converted from a manifest,
checked), and --regression-gate / --record-baseline end to end in a pytest subprocess with
made-up timings and a stand-in nvidia-smi."""

import itertools
import json
import math
import os
from pathlib import Path

import pytest

from tests.suite import gate, synthetic
from tests.suite.testing import CASES, COMMITTED_MANIFEST, ROOT, committed_manifest, run_pytest

pytestmark = pytest.mark.cpu


# -- one run's statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize("n, ranks", [(1, (0, 0)), (5, (0, 4)), (15, (3, 11)), (100, (39, 60)), (300, (132, 167))])
def test_the_medians_interval_is_the_binomial_order_statistics(n, ranks):
    assert gate.median_ci_ranks(n) == ranks


def test_the_medians_interval_covers_at_least_the_confidence():
    for n in range(6, 120):
        lo, hi = gate.median_ci_ranks(n)
        # The median lies between the (lo+1)-th and (hi+1)-th smallest values unless at most lo
        # values fall below it or at most lo above it.
        outside = 2 * sum(math.comb(n, k) for k in range(lo + 1)) / 2**n
        assert 1 - outside >= gate.CONFIDENCE, n
        # ... and the next narrower interval would not.
        assert 1 - (outside + 2 * math.comb(n, lo + 1) / 2**n) < gate.CONFIDENCE, n


def test_a_summary_holds_the_median_its_interval_and_the_quartiles():
    s = gate.summarize([float(v) for v in range(1, 16)])  # 1 .. 15
    assert s == {"ratio": 8.0, "ci": [4.0, 12.0], "iqr": [4.5, 11.5], "rounds": 15}
    assert gate.summarize([2.0]) == {"ratio": 2.0, "ci": [2.0, 2.0], "iqr": [2.0, 2.0], "rounds": 1}
    for bad in ([], [1.0, math.nan], [1.0, -2.0], [0.0, 1.0]):
        with pytest.raises(ValueError, match="finite and positive"):
            gate.summarize(bad)


def test_a_runs_noise_is_its_intervals_half_width_at_least_the_floor():
    wide = {"ratio": 1.0, "ci": [0.9, 1.1]}
    assert gate.run_noise(wide, "device") == pytest.approx(math.log(1.1 / 0.9) / 2)
    tight = {"ratio": 1.0, "ci": [0.999, 1.001]}
    assert gate.run_noise(tight, "device") == gate.NOISE_FLOOR["device"]
    assert gate.run_noise(tight, "per_call") == gate.NOISE_FLOOR["per_call"] > gate.NOISE_FLOOR["device"]
    assert gate.run_noise({"ratio": 1.0, "ci": None}, "graph") == gate.UNKNOWN_NOISE["graph"]


# -- the rule -----------------------------------------------------------------------------------------------


def figure(ratio, rel=0.005):
    return {"ratio": ratio, "ci": [ratio * (1 - rel), ratio * (1 + rel)]}


# The slowdown each mode is sure to catch: half the threshold plus both runs' noise floors in
# quadrature (device time: the 10 % threshold itself; graph replay, whose floor is wider, 15 %).
CAUGHT = {"device": 1.10, "graph": 1.15}


@pytest.mark.parametrize("mode", ["device", "graph"])
def test_a_slowdown_of_the_threshold_fails_and_one_of_3_percent_passes(mode):
    old = figure(1.25)
    assert gate.judge(old, figure(1.25 / CAUGHT[mode]), mode).regressed
    assert gate.judge(old, figure(1.25 / CAUGHT[mode]), mode).flagged
    # The caught slowdown follows from the rule: threshold / 2 + the two floors in quadrature.
    assert math.log(CAUGHT[mode]) > gate.THRESHOLD / 2 + math.sqrt(2) * gate.NOISE_FLOOR[mode]
    for slower in (1.0, 1.03, 0.9):
        verdict = gate.judge(old, figure(1.25 / slower), mode)
        assert not verdict.flagged and not verdict.regressed, slower


def test_a_drop_the_noise_explains_passes():
    # 12% slower, but each run's median is only known within +-8%.
    verdict = gate.judge(figure(1.25, 0.08), figure(1.25 / 1.12, 0.08), "device")
    assert verdict.noise > 0.1 and not verdict.regressed
    assert gate.judge(figure(1.25, 0.08), figure(1.25 / 1.40, 0.08), "device").regressed


def test_more_noise_never_turns_a_pass_into_a_failure():
    for slower, rel_a, rel_b in itertools.product((1.0, 1.05, 1.08, 1.1, 1.2, 1.5), (0.0, 0.02, 0.05), (0.1, 0.2)):
        quiet = gate.judge(figure(1.0, rel_a), figure(1 / slower, rel_a), "device")
        noisy = gate.judge(figure(1.0, rel_b), figure(1 / slower, rel_b), "device")
        assert quiet.regressed or not noisy.regressed, (slower, rel_a, rel_b)
        assert quiet.flagged or not noisy.flagged
        assert not noisy.regressed or noisy.flagged  # what fails was flagged first


def test_per_call_is_gated_with_its_larger_noise():
    assert gate.judge(figure(0.8), figure(0.8 / 1.15), "device").regressed
    assert not gate.judge(figure(0.8), figure(0.8 / 1.15), "per_call").regressed
    assert gate.judge(figure(0.8), figure(0.8 / 1.35), "per_call").regressed


def test_a_baseline_of_unknown_dispersion_is_treated_conservatively():
    unknown = {"ratio": 1.25, "ci": None}
    assert not gate.judge(unknown, figure(1.25 / 1.12), "device").regressed
    assert gate.judge(figure(1.25), figure(1.25 / 1.12), "device").regressed
    assert gate.judge(unknown, figure(1.25 / 1.25), "device").regressed


def test_a_faster_f_softmax_is_a_slowdown_of_the_ratio():
    # Only the ratio counts: both times may move together (clocks, a busier host) without effect.
    assert gate.judge(figure(1.25), figure(1.0), "device").regressed
    assert not gate.judge(figure(1.25), figure(1.25), "device").flagged


@pytest.mark.parametrize(
    "f_us, measured, expected",
    [
        (45.0, ("device", "graph", "per_call"), ("device",)),  # a call of 45 us is mostly the host's
        (gate.PER_CALL_RELIABLE_US, ("device", "graph", "per_call"), ("device", "per_call")),
        (gate.DEVICE_RELIABLE_US, ("device", "graph"), ("device",)),
        (8.0, ("device", "graph", "per_call"), ("graph",)),  # a short call is the host's time: not gated
        (8.0, ("device",), ("device",)),
        (None, ("device", "graph"), ("device",)),
        (None, ("device", "per_call"), ("device",)),  # a call of unknown length is not gated
    ],
)
def test_which_mode_gates_a_case(f_us, measured, expected):
    case = {"F_softmax_device_us": f_us, "modes": {m: figure(1.0) for m in measured}}
    assert gate.gating_modes(case) == expected


@pytest.mark.parametrize(
    "f_us, device_ratio, measured, expected",
    [
        (44.0, 5.4, ("device", "graph"), ("graph",)),  # the kernel's own launch is 8 us: graph replay
        (44.0, 5.4, ("device",), ("device",)),  # ... where the baseline has it
        (44.0, 2.0, ("device", "graph"), ("device",)),  # 22 us of its own: the device clock holds
        (130.0, 7.0, ("device", "graph", "per_call"), ("graph", "per_call")),
    ],
)
def test_a_kernel_too_short_for_the_device_clock_is_gated_in_graph_replay(f_us, device_ratio, measured, expected):
    case = {"F_softmax_device_us": f_us, "modes": {m: figure(device_ratio if m == "device" else 1.0) for m in measured}}
    assert gate.gating_modes(case) == expected


def test_the_quick_selection_times_graph_replay_where_the_rule_wants_it():
    # A baseline recorded before graph replay was taken for a short case still has the quick
    # run time it, so the next recording holds it.
    short = {"kernel": "triton", "B": 1, "V": 128256, "dtype": "float32", "F_softmax_device_us": 44.0}
    long = {"kernel": "triton", "B": 4096, "V": 128256, "dtype": "float32", "F_softmax_device_us": 2000.0}
    doc = {"cases": [dict(short, modes={"device": figure(5.4)}), dict(long, modes={"device": figure(1.7)})]}
    selection = gate.quick_selection({"NVIDIA H200": (doc, "test")}, "NVIDIA H200")
    assert selection.times_graph(gate.case_key(short), False)
    assert not selection.times_graph(gate.case_key(long), False)


# -- baselines --------------------------------------------------------------------------------------------


def test_model_slugs_name_the_files():
    assert gate.model_slug("NVIDIA H200") == "nvidia-h200"
    assert gate.model_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gate.model_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"
    with pytest.raises(ValueError):
        gate.model_slug(" -- ")


def test_a_manifest_converts_into_a_baseline_of_unknown_dispersion():
    m = committed_manifest()
    doc = gate.check_baseline(gate.baseline_from_manifest(m), "converted")
    assert doc["gpu"]["model"] == m["gpu"]["model"]
    sweep = {(e["kernel"], e["B"], e["V"], e["dtype"]): e for e in m["sweep"]}
    cases = {gate.case_key(c): c for c in doc["cases"]}
    assert set(cases) == {k for k in sweep if k[0] in gate.GATED_KERNELS}
    for key, case in cases.items():
        assert case["modes"]["device"]["ratio"] == pytest.approx(sweep[key]["frac_of_F_softmax"], rel=1e-5)
        assert case["F_softmax_device_us"] == pytest.approx(sweep[("F_softmax", *key[1:])]["us_median"], rel=1e-5)
        assert all(figure["ci"] is None for figure in case["modes"].values())
    calls = [e for e in m["call_modes"]["entries"] if e["kernel"] in gate.GATED_KERNELS]
    for e in calls:
        case = cases[(e["kernel"], e["B"], e["V"], e["dtype"])]
        assert case["modes"]["per_call"]["ratio"] == pytest.approx(e["x_F_softmax"]["per_call"], rel=1e-5)
        assert case["modes"]["graph"]["ratio"] == pytest.approx(e["x_F_softmax"]["graph"], rel=1e-5)
    with pytest.raises(ValueError, match="names no GPU model"):
        gate.baseline_from_manifest({**m, "gpu": {"model": None}})


def test_the_committed_baselines_are_one_per_model_and_usable():
    found = gate.load_baselines(gate.DEFAULT_DIR)
    assert "NVIDIA H200" in found
    for model, (doc, where) in found.items():
        assert Path(where).name == f"{gate.model_slug(model)}.json"
        assert sum(len(gate.gating_modes(c)) for c in doc["cases"]) > 100


def test_a_run_records_its_paired_measurements_as_a_baseline():
    records = synthetic.gated_records(remeasured=lambda k, B, V, d, m: 2.0 if (k, B, V) == ("fused", 1, 600) else None)
    doc = gate.check_baseline(gate.baseline_from_records(records, synthetic.GPU_ENV, today="2026-12-01"), "recorded")
    assert doc["gpu"] == synthetic.GPU_ENV["gpu"] and doc["recorded"]["date"] == "2026-12-01"
    assert len(doc["cases"]) == 2 * len(synthetic.CALL_SHAPES)
    by_key = {gate.case_key(c): c for c in doc["cases"]}
    plain = by_key[("triton", 64, 32000, "bfloat16")]
    assert set(plain["modes"]) == set(gate.MODES)
    assert plain["modes"]["device"]["rounds"] == 100 and plain["modes"]["graph"]["rounds"] == 15
    assert plain["modes"]["device"]["ratio"] == pytest.approx(synthetic.GATED_BASE_RATIO["device"], rel=0.002)
    assert plain["F_softmax_device_us"] == pytest.approx(synthetic.f_softmax_device_us(64, 32000, "bfloat16"), 1e-5)
    # A case that was re-measured keeps the figure of its longer, second measurement.
    again = by_key[("fused", 1, 600, "float32")]["modes"]["device"]
    assert again["rounds"] == 300 and again["ratio"] == pytest.approx(1.25 / 2.0, rel=0.002)
    # Cases of the previous baseline this run did not time are kept; timed ones are replaced.
    previous = gate.baseline_from_manifest(committed_manifest())
    some = [r for r in records if (r["B"], r["V"]) == (1, 600)]
    merged = gate.baseline_from_records(some, synthetic.GPU_ENV, previous=previous)
    keys = {gate.case_key(c) for c in merged["cases"]}
    assert keys == {gate.case_key(c) for c in previous["cases"]} | {gate.case_key(r) for r in some}
    replaced = {gate.case_key(c): c for c in merged["cases"]}[("fused", 1, 600, "float32")]
    assert replaced["modes"]["device"]["ci"] is not None  # the converted one had none
    assert gate.baseline_from_records([], synthetic.GPU_ENV) is None
    assert gate.baseline_from_records(records, synthetic.CPU_ENV) is None


def test_record_runs_of_the_same_code_pool_and_changed_code_starts_afresh():
    first = gate.baseline_from_records(synthetic.gated_records(), synthetic.GPU_ENV)
    slower = gate.baseline_from_records(
        synthetic.gated_records(lambda *_: 1.08), synthetic.GPU_ENV, previous=first, today="2026-12-02"
    )
    key = ("triton", 64, 32000, "bfloat16")
    old = {gate.case_key(c): c for c in first["cases"]}[key]["modes"]["device"]
    pooled = {gate.case_key(c): c for c in slower["cases"]}[key]["modes"]["device"]
    assert old["runs"] == [old["ratio"]] and slower["recorded"]["runs_pooled"] == 2
    assert pooled["runs"] == [old["ratio"], pooled["ratio"]]
    assert pooled["ratio"] == pytest.approx(old["ratio"] / 1.08, rel=0.005)
    assert gate.central(pooled) == pytest.approx((old["ratio"] + pooled["ratio"]) / 2)
    assert gate.between_runs(pooled) == pytest.approx(math.log(gate.central(pooled) / pooled["ratio"]))
    again = slower
    for _ in range(gate.RUNS_KEPT + 2):
        again = gate.baseline_from_records(synthetic.gated_records(), synthetic.GPU_ENV, previous=again)
    assert len({gate.case_key(c): c for c in again["cases"]}[key]["modes"]["device"]["runs"]) == gate.RUNS_KEPT
    # Another software version (or other kernel sources, the same fingerprint) starts afresh.
    other = {**synthetic.GPU_ENV, "versions": {**synthetic.GPU_ENV["versions"], "torch": "2.12.0"}}
    fresh = gate.baseline_from_records(synthetic.gated_records(), other, previous=slower)
    assert {gate.case_key(c): c for c in fresh["cases"]}[key]["modes"]["device"]["runs"] == [old["ratio"]]
    assert "runs_pooled" not in fresh["recorded"]


def test_the_code_fingerprint_follows_sources_tuning_and_versions_only(tmp_path):
    (tmp_path / "k.py").write_text("x = 1\n")
    (tmp_path / "tuned.json").write_text("{}")
    versions = {"torch": "2.11.0"}
    before = gate.code_fingerprint(versions, tmp_path)
    (tmp_path / "README.md").write_text("words")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "k.py").write_text("cached")
    assert gate.code_fingerprint(versions, tmp_path) == before
    assert gate.code_fingerprint({"torch": "2.12.0"}, tmp_path) != before
    for name, text in (("k.py", "x = 2\n"), ("tuned.json", "{ }"), ("k.cu", "")):
        (tmp_path / name).write_text(text)
        assert gate.code_fingerprint(versions, tmp_path) != before, name
    assert len(gate.code_fingerprint({})) == 64  # the product's own kernels/


def test_the_spread_between_pooled_runs_counts_as_noise():
    # The H200's triton B=8 V=600 bf16 graph replay: 1.985 in one run of unchanged kernels, 1.84
    # in another, then 1.724. Against the first run alone that fails; against the pool it does not.
    one, pooled = figure(1.985, 0.001), {**figure(1.84, 0.001), "runs": [1.985, 1.84]}
    now = figure(1.724, 0.001)
    assert gate.judge(one, now, "graph").regressed
    assert not gate.judge(pooled, now, "graph").regressed
    # A slowdown past the pool's spread still fails, and tight pools keep the floors.
    assert gate.judge(pooled, figure(1.91 / 1.25, 0.001), "graph").regressed
    tight = {**figure(1.25), "runs": [1.25, 1.252, 1.249]}
    assert gate.judge(tight, figure(1.25 / 1.10), "device").regressed
    assert not gate.judge(tight, figure(1.25 / 1.03), "device").flagged
    for spread in (0.0, 0.02, 0.05, 0.1):
        wider = {**figure(1.25), "runs": [1.25 * (1 - spread), 1.25, 1.25 * (1 + spread)]}
        verdict = gate.judge(wider, figure(1.25 / 1.4), "device")
        assert verdict.noise >= gate.judge(figure(1.25), figure(1.25 / 1.4), "device").noise
        assert verdict.regressed, spread
    # In device time a 9 % drop beats both runs' floors alone; a pool whose runs lie 4 % either
    # side of their median explains it.
    spread = {**figure(1.25, 0.001), "runs": [1.20, 1.25, 1.30]}
    assert gate.judge(figure(1.25, 0.001), figure(1.25 / 1.09, 0.001), "device").regressed
    assert not gate.judge(spread, figure(1.25 / 1.09, 0.001), "device").regressed
    assert "median of 2 runs" in gate._figure(pooled)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(format=7), "format 1"),
        (lambda d: d["gpu"].pop("model"), "gpu.model"),
        (lambda d: d["cases"][0].pop("B"), "lacks kernel"),
        (lambda d: d["cases"][0]["modes"].update(warm={"ratio": 1.0}), "unknown mode 'warm'"),
        (lambda d: d["cases"][0]["modes"]["device"].update(ratio=-1), "not a positive number"),
        (lambda d: d["cases"][0]["modes"]["device"].update(ci=[5.0, 6.0]), "does not hold the ratio"),
        (lambda d: d["cases"][0]["modes"]["device"].update(runs=[]), "not a list of positive ratios"),
        (lambda d: d["cases"][0]["modes"]["device"].update(runs=[1.0, "1.1"]), "not a list of positive ratios"),
    ],
)
def test_a_broken_baseline_is_named(tmp_path, change, message):
    doc = gate.baseline_from_records(synthetic.gated_records(), synthetic.GPU_ENV)
    change(doc)
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as raised:
        gate.load_baselines(tmp_path)
    assert str(path) in str(raised.value)


def test_baselines_load_from_a_folder_a_file_or_a_manifest(tmp_path):
    h200 = gate.baseline_from_records(synthetic.gated_records(), synthetic.GPU_ENV)
    h100 = json.loads(json.dumps(h200))
    h100["gpu"]["model"] = "NVIDIA H100 80GB HBM3"
    assert gate.write_baseline(tmp_path, h200) == tmp_path / "nvidia-h200.json"
    assert gate.write_baseline(tmp_path, h200) is None  # unchanged: not rewritten
    gate.write_baseline(tmp_path, h100)
    assert set(gate.load_baselines(tmp_path)) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    assert set(gate.load_baselines(tmp_path / "nvidia-h200.json")) == {"NVIDIA H200"}
    converted = gate.load_baselines(COMMITTED_MANIFEST)["NVIDIA H200"][0]
    assert "converted from" in converted["source"]
    assert gate.load_baselines(tmp_path / "nowhere") == {}
    (tmp_path / "copy.json").write_text(json.dumps(h100))
    with pytest.raises(ValueError, match="a second baseline for NVIDIA H100"):
        gate.load_baselines(tmp_path)


# -- gating a run ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline():
    return gate.baseline_from_records(synthetic.gated_records(), synthetic.GPU_ENV)


MODEL = synthetic.GPU_ENV["gpu"]["model"]


def planted(kernel, B, V, dtype, factor):
    """factor at one kernel's cases of V = 128256 fp32 (as if one path of it were slower)."""

    def slower(k, b, v, d, mode):
        return factor if (k, v, d) == (kernel, V, dtype) else 1.0

    return slower


def test_unchanged_code_passes_and_says_how_cases_are_gated(baseline):
    result = gate.evaluate(baseline, synthetic.gated_records(), MODEL, source="b.json")
    assert not result.failed and result.flagged == [] and result.note is None
    n = len(synthetic.CALL_SHAPES) * 2
    short = sum(synthetic.f_softmax_device_us(B, V, d) < gate.DEVICE_RELIABLE_US for B, V, d in synthetic.CALL_SHAPES)
    assert 0 < short < len(synthetic.CALL_SHAPES)
    # Per call gates only the calls whose work dominates them (the others are the host's time).
    long_calls = sum(
        synthetic.f_softmax_device_us(B, V, d) >= gate.PER_CALL_RELIABLE_US for B, V, d in synthetic.CALL_SHAPES
    )
    assert result.compared == {"device": n - 2 * short, "graph": 2 * short, "per_call": 2 * long_calls}
    lines = result.lines()
    assert lines[0].startswith(f"regression gate ({MODEL}; baseline b.json, recorded ")
    assert f"{n - 2 * short} in device time, {2 * short} in graph replay" in lines[0]
    assert "0 regressed; 0 flagged" in lines[2]
    assert lines[-1].startswith("  largest slowdown not flagged: ")


def test_a_slowdown_of_the_threshold_in_one_path_fails_naming_exactly_its_cases(baseline):
    slower = planted("triton", None, 128256, "float32", 1.10)
    result = gate.evaluate(baseline, synthetic.gated_records(slower, remeasured=slower), MODEL, source="b.json")
    assert result.failed
    named = {(f["key"], f["mode"]) for f in result.regressions}
    expected = set()
    for B, V, dtype in synthetic.CALL_SHAPES:
        if (V, dtype) == (128256, "float32"):
            # Device time catches 10 %; graph replay (the short shapes) only from CAUGHT["graph"].
            if synthetic.f_softmax_device_us(B, V, dtype) >= gate.DEVICE_RELIABLE_US:
                expected.add((("triton", B, V, dtype), "device"))
    assert expected and named == expected  # per call stays within its larger noise
    line = next(line for line in result.lines() if "REGRESSED" in line)
    assert line.startswith("  REGRESSED    triton B=")
    assert "x F_softmax, 10.0% slower, noise ±" in line and "re-measured" in line


def test_a_flagged_case_says_when_its_tile_config_was_tuned_in_this_run(baseline):
    """On a GPU without a stored autotune choice, the tile path's config is whatever the first call
    tuned, which can differ from the baseline's run: the verdict stands, and its line says so."""
    slower = planted("triton", None, 128256, "float32", 1.10)
    records = synthetic.gated_records(slower, remeasured=slower)
    picked = {"BLOCK": 1024, "num_warps": 8, "num_stages": 3}
    for r in records:
        if r["kernel"] == "triton" and r["B"] == synthetic.CALL_SHAPES[-1][0]:
            r["tuned_at_first_use"] = picked
    result = gate.evaluate(baseline, records, MODEL, source="b.json")
    assert result.failed
    noted = [line for line in result.lines() if "tuned at first use" in line]
    assert noted and all(f"B={synthetic.CALL_SHAPES[-1][0]} " in line for line in noted)
    assert all("BLOCK 1024, 8 warps" in line and "python -m kernels.autotune" in line for line in noted)
    others = [
        line for line in result.lines() if "REGRESSED" in line and f"B={synthetic.CALL_SHAPES[-1][0]} " not in line
    ]
    assert others and not any("tuned at first use" in line for line in others)


def test_training_ops_are_gated_against_their_eager_baseline():
    """A gated training kernel's case is "<kernel>:<op>" at N rows, its ratios to the op's eager
    baseline, its noise at least TRAINING_NOISE_FLOOR a run, TRAINING_MEETING_FLOOR where its
    path meets: unchanged code passes, and so does a 25 % move of a path that meets (what the
    cases run before a split moved it by); the same 25 % on a path without meetings (the
    weighted stream's lost occupancy) fails, and so does 1.5x on a split, each exactly its
    cases, named with the baseline they were measured against."""
    records = synthetic.gated_records() + synthetic.gated_training_records()
    doc = gate.baseline_from_records(records, synthetic.GPU_ENV)
    training = {k for k in (gate.case_key(c) for c in doc["cases"]) if ":" in k[0]}
    assert {k[0] for k in training} == {
        gate.training_kernel(op, impl) for op, impls in gate.GATED_TRAINING.items() for impl in impls
    }
    assert {"fused:cross_entropy", "triton:weighted_cross_entropy", "triton:softmax_backward"} <= {
        k[0] for k in training
    }
    assert {k[1] for k in training} == {4096}
    assert not gate.evaluate(doc, records, MODEL).failed
    weighted = "triton:weighted_cross_entropy"
    # the weighted rows stream at 50257, float32 ones split at 128256 where 16-bit ones stream;
    # plain 16-bit rows of 128256 are held in parts that meet; the fused kernel's clusters wait
    # on no word in memory
    assert [gate.meets((weighted, 4096, V, "float32")) for V in (50257, 128256)] == [False, True]
    assert not gate.meets((weighted, 4096, 128256, "bfloat16"))
    assert gate.meets(("triton:cross_entropy", 4096, 128256, "bfloat16"))
    assert not any(gate.meets(k) for k in training if k[0].startswith("fused:"))

    both = ("float32", "bfloat16")

    def at(factor, at_v, dtypes=both):
        def slower(impl, op, V, dtype):
            hit = (impl, op, V) == ("triton", "weighted_cross_entropy", at_v) and dtype in dtypes
            return factor if hit else 1.0

        return synthetic.gated_records() + synthetic.gated_training_records(slower, remeasured=slower)

    assert not gate.evaluate(doc, at(1.25, 128256, ("float32",)), MODEL).failed
    for factor, V, dtypes in ((1.25, 50257, both), (1.25, 128256, ("bfloat16",)), (1.5, 128256, both)):
        result = gate.evaluate(doc, at(factor, V, dtypes), MODEL, source="b.json")
        assert {f["key"] for f in result.regressions} == {(weighted, 4096, V, d) for d in dtypes}
        line = next(line for line in result.lines() if "REGRESSED" in line)
        assert line.startswith(f"  REGRESSED    {weighted} B=4096 V={V}")
        assert f"x F_cross_entropy, {factor - 1:.1%} slower" in line
    # The same 1.25x in a softmax kernel is a regression, whatever its path: the training ops'
    # floors are their own.
    softmax = gate.evaluate(doc, synthetic.gated_records(planted("triton", None, 128256, "float32", 1.25)), MODEL)
    assert softmax.failed
    assert any(
        "triton:softmax_backward" in line and "softmax_backward_data device" in line for line in gate.describe(doc)
    )


def test_a_triton_path_meets_where_its_kernel_takes_a_meeting_workspace():
    """Path.meets, which sets a training case's noise floor, is the kernels' own fact: a Triton
    path meets exactly where its launch entry takes the per-row workspace its programs meet in."""
    from kernels.registry import REGISTRY
    from kernels.triton_launch import TABLES

    checked = 0
    for op, kernels in REGISTRY.items():
        k = kernels.get("triton")
        if k is None or k.unavailable_reason():
            continue
        for path in k.spec.paths:
            assert path.meets == ("WS" in TABLES[op][path.name].arg_names), (op, path.name)
            checked += path.meets
    assert checked == 6  # split and held_split of the softmax, its backward and the cross-entropy


def test_a_slowdown_of_3_percent_passes(baseline):
    slower = planted("triton", None, 128256, "float32", 1.03)
    result = gate.evaluate(baseline, synthetic.gated_records(slower, remeasured=slower), MODEL)
    assert not result.failed and result.flagged == []


def test_a_flagged_case_that_measures_normal_again_is_within_noise(baseline):
    first = planted("fused", None, 600, "bfloat16", 1.3)
    result = gate.evaluate(
        baseline, synthetic.gated_records(first, remeasured=planted("fused", None, 600, "bfloat16", 1.0)), MODEL
    )
    assert not result.failed and result.flagged
    assert {f["verdict"] for f in result.flagged} == {"within noise"}
    lines = result.lines()
    assert f"0 regressed; {len(result.flagged)} flagged and re-measured" in lines[2]
    shown = [line for line in lines if line.startswith("  within noise fused B=")]
    assert len(shown) == len(result.flagged)
    old, new = result.flagged[0]["old"], result.flagged[0]["new"]
    assert f"{old['ratio']:.3f} [{old['ci'][0]:.3f}, {old['ci'][1]:.3f}] -> {new['ratio']:.3f}" in shown[0]
    assert "30.0% slower" in shown[0] and "re-measured" in shown[0] and "0.0% slower" in shown[0]


def test_a_run_without_a_baseline_or_a_gpu_compares_nothing(baseline):
    records = synthetic.gated_records(planted("fused", None, 600, "float32", 3.0))
    none = gate.evaluate(None, records, "NVIDIA B200", source="reports/baselines")
    assert not none.failed and "no baseline for NVIDIA B200" in none.lines()[0]
    assert "--record-baseline" in none.lines()[0]
    assert gate.evaluate(baseline, records, None).note == "this run measured no GPU: nothing to compare"
    nothing = gate.evaluate(baseline, [], MODEL, source="b.json")
    assert not nothing.failed and "timed none of the" in nothing.note


def test_a_partial_run_counts_the_gated_cases_it_did_not_time(baseline):
    some = [r for r in synthetic.gated_records() if r["V"] == 600]
    result = gate.evaluate(baseline, some, MODEL)
    assert result.not_measured > 0 and sum(result.compared.values()) > 0
    assert f"{result.not_measured} gated cases not timed in this run" in result.lines()[2]


def test_the_case_remeasures_only_what_the_screen_flags(baseline):
    config = type("Config", (), {"stash": pytest.Stash()})()
    calls = []

    def measure(ratio):
        def run(rounds):
            calls.append(rounds)
            ratios = synthetic.ratios_around(ratio, rounds)
            return [10.0 / r for r in ratios], [10.0] * rounds

        return run

    case = {"kernel": "fused", "B": 512, "V": 128256, "dtype": "float32"}
    ratio = synthetic.GATED_BASE_RATIO["device"]
    # Without --regression-gate there is no screen: one measurement.
    gate.measure_paired(config, dict(case), "device", measure(ratio / 2), rounds=100, gpu_model=MODEL)
    assert calls == [100]
    config.stash[gate.SCREEN] = gate.Screen({MODEL: (baseline, "b.json")})
    info = dict(case)
    times = gate.measure_paired(config, info, "device", measure(ratio), rounds=100, gpu_model=MODEL)
    assert calls == [100, 100] and len(times) == 100 and "remeasured_ratios" not in info
    assert info["paired_ratios"]["device"] == pytest.approx(synthetic.ratios_around(ratio, 100))
    assert info["paired_F_softmax_us"] == {"device": 10.0}
    gate.measure_paired(config, info, "device", measure(ratio / 1.2), rounds=100, gpu_model=MODEL)
    assert calls == [100, 100, 100, 300] and len(info["remeasured_ratios"]["device"]) == 300
    # Not a gating mode of this case (graph replay gates only the short shapes), another GPU: no.
    gate.measure_paired(config, dict(case), "graph", measure(ratio / 2), rounds=15, gpu_model=MODEL)
    gate.measure_paired(config, dict(case), "device", measure(ratio / 2), rounds=15, gpu_model="NVIDIA L4")
    assert calls[4:] == [15, 15]


def test_the_command_line_lists_the_gating_modes_and_converts_a_manifest(tmp_path, capsys):
    assert gate.main([str(tmp_path), "--from-manifest", str(COMMITTED_MANIFEST)]) == 0
    written = tmp_path / "nvidia-h200.json"
    assert f"{written}: written" in capsys.readouterr().out
    assert gate.main([str(written)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200: " in out and "gated in: device time " in out
    assert "triton B=32768 V=600 float32" in out
    with pytest.raises(SystemExit):
        gate.main([str(tmp_path / "empty")])


# -- end to end ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_smi(tmp_path_factory):
    """A stand-in nvidia-smi that names one NVIDIA H200, first on PATH."""
    folder = tmp_path_factory.mktemp("bin")
    smi = folder / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\ncase \"$1\" in\n  -L) echo 'GPU 0: NVIDIA H200 (UUID: GPU-a)' ;;\n"
        "  *) echo 'NVIDIA H200, 9.0' ;;\nesac\n"
    )
    smi.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def run_gate(path, tmp_path, ratio, again=None, *args):
    env = {"PATH": path, "GATE_CASE_RATIO": str(ratio)}
    if again is not None:
        env["GATE_CASE_RATIO_AGAIN"] = str(again)
    proc = run_pytest(str(CASES / "gate_case.py"), *args, env=env)
    return proc, proc.stdout + proc.stderr


def test_regression_gate_and_record_baseline_end_to_end(tmp_path, fake_smi):
    folder = tmp_path / "baselines"
    # No baseline for this model yet: the gate passes and says so, and the run records one.
    gated = ("--regression-gate", "--regression-baseline", str(folder))
    proc, out = run_gate(fake_smi, tmp_path, 2.0, None, *gated, "--record-baseline", str(folder))
    assert proc.returncode == 0, out
    assert "regression gate: no baseline for NVIDIA H200" in out and "--record-baseline" in out
    assert f"baseline for NVIDIA H200 written: {folder / 'nvidia-h200.json'} (1 cases)" in out
    recorded = json.loads((folder / "nvidia-h200.json").read_text())
    (case,) = recorded["cases"]
    assert case["modes"]["device"]["ratio"] == pytest.approx(2.0, rel=0.01) and case["modes"]["device"]["rounds"] == 40
    assert case["F_softmax_device_us"] == pytest.approx(10.0)

    # Beside it, another model's baseline (ratio 1.0) under which neither run below would be
    # flagged: the runs are gated by the baseline of the GPU they ran on (nvidia-smi names an
    # H200), not by whichever file the folder holds first.
    other = dict(recorded, gpu={"model": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"})
    other["cases"] = [json.loads(json.dumps(case))]
    for figure in other["cases"][0]["modes"].values():
        figure.update(ratio=1.0, ci=[0.99, 1.01], iqr=[0.995, 1.005], runs=[1.0])
    assert gate.write_baseline(folder, other).name == "nvidia-a100-sxm4-80gb.json"

    # 60% slower, and again; recorded in the same run, the regression is not absorbed.
    proc, out = run_gate(fake_smi, tmp_path, 1.25, None, *gated, "--record-baseline", str(folder))
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "1 passed" in out and "1 cases compared: 1 in device time" in out
    assert "1 regressed; 1 flagged and re-measured" in out
    assert "REGRESSED    fused B=512 V=600 float32 device: 2.000 [" in out
    assert "(1 cases; 1 regressed kept at their recorded figures)" in out
    kept = json.loads((folder / "nvidia-h200.json").read_text())["cases"][0]["modes"]["device"]
    assert kept == case["modes"]["device"]

    proc, out = run_gate(fake_smi, tmp_path, 1.6, 2.0, *gated)  # slow once, normal when measured again
    assert proc.returncode == pytest.ExitCode.OK, out
    assert "0 regressed; 1 flagged and re-measured" in out and "within noise fused B=512 V=600 float32" in out


def test_a_malformed_baseline_stops_the_run_with_its_name(tmp_path, fake_smi):
    bad = tmp_path / "nvidia-h200.json"
    bad.write_text('{"format": 1, "gpu": {}}')
    proc, out = run_gate(fake_smi, tmp_path, 2.0, None, "--regression-gate", "--regression-baseline", str(tmp_path))
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert f"{bad}: not a usable gate baseline: gpu.model is missing" in out


def test_gate_options_and_marker_are_documented():
    readme = (ROOT / "README.md").read_text()
    for text in ("--regression-gate", "--record-baseline", "--gate-quick", '-m "cuda and gated"', "reports/baselines/"):
        assert text in readme, text
    assert "gated:" in (ROOT / "pytest.ini").read_text()


# -- the quick gate (--gate-quick) -----------------------------------------------------------------------------


def quick_baseline() -> dict:
    """Three cases: a long call (device time and per call gate it), a short one (graph replay
    gates it) and a training op's (device time, against its eager baseline)."""
    figure = {"ratio": 1.2, "ci": [1.19, 1.21], "iqr": [1.195, 1.205], "rounds": 100}
    cases = [
        {"kernel": "fused", "B": 512, "V": 600, "dtype": "float32", "F_softmax_device_us": 150.0},
        {"kernel": "triton", "B": 1, "V": 600, "dtype": "float32", "F_softmax_device_us": 7.0},
    ]
    for case in cases:
        case["modes"] = {m: dict(figure) for m in gate.MODES}
    training = {"kernel": "triton:cross_entropy", "B": 4096, "V": 128256, "dtype": "float32"}
    cases.append({**training, "F_softmax_device_us": 9000.0, "modes": {"device": dict(figure)}})
    return gate.baseline_document(synthetic.GPU_ENV["gpu"], cases, recorded={"date": "2026-12-01"}, source="test")


def test_the_quick_selection_is_the_pairs_the_baseline_gates():
    doc = quick_baseline()
    selection = gate.quick_selection({MODEL: (doc, "b.json")}, MODEL)
    assert selection.pairs == {
        ("fused", 512, 600, "float32"): ("device", "per_call"),
        ("triton", 1, 600, "float32"): ("graph",),
        ("triton:cross_entropy", 4096, 128256, "float32"): ("device",),
    }
    # The device-time item of every gated case (it gives F.softmax's device time), timing the
    # graph replay where that gates the case; per-call items where per call gates; no graph item.
    assert selection.keeps("fused", 512, 600, "float32") and selection.keeps("triton", 1, 600, "float32")
    assert selection.keeps("fused", 512, 600, "float32", "per_call")
    assert not selection.keeps("triton", 1, 600, "float32", "per_call")
    assert not selection.keeps("fused", 512, 600, "float32", "graph")
    assert not selection.keeps("fused", 4096, 50257, "bfloat16")  # not in the baseline
    assert not selection.keeps("naive", 512, 600, "float32")  # not a gated kernel
    assert selection.times_graph(("triton", 1, 600, "float32"), False)
    assert not selection.times_graph(("fused", 512, 600, "float32"), False)
    # A case this run finds short is timed in graph replay too, whatever its baseline held.
    assert selection.times_graph(("fused", 512, 600, "float32"), True)
    assert selection.keeps("triton:cross_entropy", 4096, 128256, "float32")
    assert not selection.keeps("triton:cross_entropy", 4096, 32000, "bfloat16")  # not in the baseline
    assert not selection.keeps("F_cross_entropy:cross_entropy", 4096, 128256, "float32")  # a baseline
    assert selection.describe(4).startswith(f"gate quick selection ({MODEL}; baseline b.json): 4 items for the 4 pairs")
    assert "2 in device time, 1 in graph replay, 1 in per call" in selection.describe(4)


def test_without_a_baseline_the_quick_selection_runs_every_gated_case():
    selection = gate.quick_selection({MODEL: (quick_baseline(), "b.json")}, "NVIDIA L4", "baselines/")
    assert selection.pairs is None
    assert selection.keeps("fused", 4096, 50257, "bfloat16", "graph") and selection.keeps("triton", 1, 600, "float32")
    assert not selection.keeps("naive", 512, 600, "float32")
    assert selection.times_graph(("fused", 1, 600, "float32"), True) is True
    assert selection.times_graph(("fused", 1, 600, "float32"), False) is False
    assert "no baseline for NVIDIA L4 (baselines/): every gated case runs" in selection.describe(9)


def quick_run(path, tmp_path, *args):
    folder = tmp_path / "baselines"
    folder.mkdir(exist_ok=True)
    gate.write_baseline(folder, quick_baseline())
    proc = run_pytest(
        str(CASES / "gate_quick_case.py"),
        "-s",
        f"--regression-baseline={folder}",
        *args,
        env={"PATH": path},
    )
    out = proc.stdout + proc.stderr
    return proc, out, sorted(line for line in out.splitlines() if line.startswith("TIMED"))


def test_gate_quick_runs_only_what_the_gate_compares_end_to_end(tmp_path, fake_smi):
    proc, out, timed = quick_run(fake_smi, tmp_path, "--gate-quick")  # the model from nvidia-smi
    assert proc.returncode == 0, out
    rounds = gate.QUICK_DEVICE_ROUNDS
    assert timed == [
        f"TIMED device fused 512 600 float32 rounds={rounds} graph=False",
        f"TIMED device triton 1 600 float32 rounds={rounds} graph=True",
        f"TIMED device triton:cross_entropy 4096 128256 float32 rounds={rounds}",
        "TIMED per_call fused 512 600 float32",
    ]
    assert "4 passed, 10 deselected" in out
    assert f"gate quick selection (NVIDIA H200; baseline {tmp_path / 'baselines' / 'nvidia-h200.json'}): 4 items" in out
    # Another model, named on the command line, has no baseline: every gated kernel's case runs,
    # the training ops' device-time items among them, and no item that is not gated.
    proc, out, timed = quick_run(fake_smi, tmp_path, "--gate-quick=NVIDIA L4")
    assert proc.returncode == 0, out
    assert len(timed) == 11 and not any("naive" in t or "not gated" in t or "per_call triton:" in t for t in timed)
    assert sum("device triton:cross_entropy" in t for t in timed) == 2
    assert "no baseline for NVIDIA L4" in out


# -- the rule on the H200's recorded rounds ------------------------------------------------------------------

RECORDED_RUN = ROOT / "reports" / "runs" / "h200-gated-benchmarks.json"


@pytest.fixture(scope="module")
def recorded():
    """The paired rounds of `pytest -m "cuda and gated" --benchmark-only` on the H200 (100
    device-time rounds, 15 in graph replay and per call) and the baseline they make."""
    records = [b["extra_info"] for b in json.loads(RECORDED_RUN.read_text())["benchmarks"]]
    environment = {"gpu": {"model": records[0]["gpu"], "compute_capability": "9.0"}}
    return records, gate.baseline_from_records(records, environment, today="2026-12-01")


def rounds_of(records, pick, factor=lambda key, mode: 1.0) -> list[dict]:
    """The records with each mode's rounds cut to pick(rounds) and divided by factor(key, mode)."""
    out = []
    for r in records:
        r = dict(r)
        r["paired_ratios"] = {
            m: [x / factor(gate.case_key(r), m) for x in pick(v)] for m, v in r.get("paired_ratios", {}).items()
        }
        r.pop("remeasured_ratios", None)
        out.append(r)
    return out


def held_cases(baseline) -> set:
    """The gated cases that Triton's held path times (16-bit rows of 24577-49152, B >= 1024)."""
    from kernels.softmax_triton import plan

    return {
        gate.case_key(c)
        for c in baseline["cases"]
        if c["kernel"] == "triton" and plan(c["B"], c["V"], getattr(__import__("torch"), c["dtype"])) == "held"
    }


@pytest.mark.skipif(not RECORDED_RUN.exists(), reason=f"{RECORDED_RUN} is not in this checkout")
def test_on_the_recorded_rounds_quick_runs_pass_and_a_planted_slowdown_fails_exactly_its_cases(recorded):
    records, baseline = recorded
    model = baseline["gpu"]["model"]
    first, second = (lambda v: v[: len(v) // 2]), (lambda v: v[len(v) // 2 :])
    quick = lambda v: v[: gate.QUICK_DEVICE_ROUNDS]  # noqa: E731
    # Unchanged: a quick run's first 40 device-time rounds (and the 15 of the others), or either
    # half of the run, against the baseline of the whole run flags nothing.
    for pick in (quick, first, second):
        result = gate.evaluate(baseline, rounds_of(records, pick), model)
        assert not result.failed and result.flagged == [], result.lines()
        assert sum(result.compared.values()) > 150
    # Halves of the run against each other (two "runs" of unchanged code): nothing flagged.
    for one, other in ((first, second), (second, first)):
        half = gate.baseline_from_records(rounds_of(records, one), {"gpu": baseline["gpu"]})
        result = gate.evaluate(half, rounds_of(records, other), model)
        assert result.flagged == [], result.lines()
    # 10 % in the held path: exactly its cases regress (device time gates both); 3 % passes.
    planted = held_cases(baseline)
    assert planted == {("triton", B, 32000, "bfloat16") for B in (4096, 32768)}
    assert all(gate.gating_modes(c) == ("device",) for c in baseline["cases"] if gate.case_key(c) in planted)
    for slowdown, regressed in ((1.10, planted), (1.03, set())):
        slower = rounds_of(records, quick, lambda key, mode, s=slowdown: s if key in planted else 1.0)
        for r in slower:  # the re-measurement finds the same slowdown
            r["remeasured_ratios"] = {m: v * 3 for m, v in r["paired_ratios"].items()}
        result = gate.evaluate(baseline, slower, model)
        assert {f["key"] for f in result.regressions} == regressed, result.lines()
        assert result.failed == bool(regressed)
        assert all(f["verdict"] == "regressed" for f in result.flagged), result.lines()
