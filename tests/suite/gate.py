"""The GPU regression gate: this run's speed of the gated kernels (fused and Triton, `gated` in
their specs) relative to F.softmax against a baseline recorded on the same GPU model, judged
against the noise of both runs. The training ops' gated kernels are judged the same way, against
their op's PyTorch eager baseline (tests/suite/manifest.py LOSS_OPS) in place of F.softmax: a
case of theirs is named "<kernel>:<op>", with N for B (`gate_key`).

What is compared. A gated benchmark case times its kernel and F.softmax in interleaved rounds
(tests/suite/devicetime.py), so whatever drifts during the case moves both, and keeps the
per-round ratios t(F.softmax) / t(kernel) (above 1: the kernel is faster). A run's figure for a
case is the median of its per-round ratios; its spread is the distribution-free confidence
interval of that median (order statistics, CONFIDENCE) and the interquartile range.

Which mode gates which case (`gating_modes`). Device time (one launch, L2 flushed) where
F.softmax's device time at that shape is at least DEVICE_RELIABLE_US; below that a launch is a
few microseconds, the device clock's jitter is a tenth of it, and graph replay (200 back-to-back
replays per round) gates the case instead. Per-call time (wall clock from Python) gates the
cases it was measured for whose work dominates the call (F.softmax's device time at least
PER_CALL_RELIABLE_US), with its own, larger noise floor; a shorter call is mostly the host's
time, which moves between runs by far more than any threshold (measured: up to 57 %), and is
reported only.

The rule (`judge`). slowdown = ln(baseline ratio / this run's ratio), noise = the two runs'
log half-widths added in quadrature, each at least the mode's NOISE_FLOOR (what rounds within
one run cannot see: the next run's clocks, placement, host). A case is flagged when
slowdown - noise / 2 exceeds half the THRESHOLD, and a flagged case is measured again with
REMEASURE_FACTOR times the rounds; it fails when, on the new measurement, slowdown - noise still
exceeds half the threshold. So a drop the noise explains passes, a slowdown of half the
threshold or less passes, and a slowdown of the threshold fails wherever the noise is below
half of it. (Asking for the median itself to be past the threshold would pass a true slowdown
of exactly the threshold one run in two.) A baseline of unknown dispersion (converted from a
manifest of single medians) counts with UNKNOWN_NOISE: only large drops fail against it.

Baselines live in reports/baselines/<model-slug>.json, one per GPU model: a run on a model
without one passes with a note, and `--record-baseline` writes (or refreshes) this model's file.
Runs differ by more than each one's interval says (a ~2 us graph replay moved by 8 % between two
runs of the same kernels), so a baseline pools its runs: a record run of the same code and
software versions (`code_fingerprint`) adds its medians to each case's `runs` (the last
RUNS_KEPT); the baseline's figure is their median, and their spread (`between_runs`) counts as
noise in both runs compared. Recording with changed kernels starts the pool afresh.

The quick gate (`--gate-quick`, `QuickSelection`): a run of only the (case, mode) pairs the
baseline of this GPU model gates, device time in QUICK_DEVICE_ROUNDS rounds; the rule is the same.
"""

import argparse
import datetime
import hashlib
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kernels.spec import BASELINE, names
from tests.suite.devicetime import MODE_NAMES
from tests.suite.devicetime import MODES as CLOCKS
from tests.suite.manifest import LOSS_OPS, case_key, registry_op, write_if_changed

GATED_KERNELS = names(lambda s: s.gated)  # from the kernels' specs (kernels/spec.py)
REFERENCE = BASELINE
# Each timed training op's gated kernels, from the same specs.
GATED_TRAINING = {op: names(lambda s: s.gated, op=registry_op(op)) for op in LOSS_OPS}


def training_kernel(op: str, impl: str) -> str:
    """The gate's name for kernel `impl` of training op `op` (a LOSS_OPS key)."""
    return f"{impl}:{op}"


GATED_CASE_KERNELS = frozenset(GATED_KERNELS) | {
    training_kernel(op, impl) for op, impls in GATED_TRAINING.items() for impl in impls
}


def gate_key(record: dict) -> tuple:
    """(kernel, B, V, dtype) of a gated case: a softmax record's own; a training op's record
    (op, impl, N, ...) as (training_kernel(op, impl), N, V, dtype)."""
    if "op" in record:
        return (training_kernel(record["op"], record["impl"]), int(record["N"]), int(record["V"]), record["dtype"])
    return case_key(record)


def training_op(kernel: str) -> str | None:
    """The training op of a gated case's kernel name ("<kernel>:<op>"), None for a softmax kernel."""
    op = kernel.partition(":")[2]
    return op if op in LOSS_OPS else None


def reference_of(kernel: str) -> str:
    """What a gated case's ratios are to: F.softmax, or a training op's eager baseline."""
    op = training_op(kernel)
    return REFERENCE if op is None else LOSS_OPS[op][1]


# Every clock (tests/suite/devicetime.py), in the gate's own order, alphabetical: the order of a
# case's modes in its baseline files and of the modes in its report.
MODES = tuple(sorted(CLOCKS))

THRESHOLD = 0.10  # the slowdown relative to F.softmax the gate exists to catch
CONFIDENCE = 0.95  # of the interval around each run's median ratio
# Per run, relative: what the rounds of one run cannot see. Set from two runs of unchanged code
# on the H200 (reports/runs/h200-gate-*.log): device-time cases moved within 2 %; one 2.3 us
# graph replay moved by 10 % with an interval of 0.1 % in each run; per-call times of calls past
# DEVICE_RELIABLE_US within the 10 % floor.
NOISE_FLOOR = {"device": 0.02, "graph": 0.05, "per_call": 0.10}
# The training ops' floors (device time, the one mode they are gated in), per run. Between two
# H100 runs of the loss benchmarks (runs/h100-2026-12-07, -07b) the ratios of unchanged kernels
# moved by 0.4-2.4 %: 0.08 fails a slowdown past about 18 % (a 30 % one, the stream losing its
# occupancy, passed the single floor of 0.20 that stood before). A path whose programs wait at
# meetings for their siblings (kernels/spec.py Path.meets) moved by up to 25 % on unchanged
# code with the cases timed before it (reports/profiles.md, "depends on its neighbours"), which
# no run's rounds see: 0.20 passes such a move and fails a slowdown past about 40 %.
TRAINING_NOISE_FLOOR = 0.08
TRAINING_MEETING_FLOOR = 0.20
UNKNOWN_NOISE = {"device": 0.10, "graph": 0.10, "per_call": 0.20}  # a baseline without dispersion
REMEASURE_FACTOR = 3
DEVICE_RELIABLE_US = 20.0  # F.softmax's device time from which device time gates a shape
# ... and from which per-call time is the GPU's work rather than the host's: measured on the H200,
# per-call ratios of calls of 20-45 us (L2 flushed; a few us warm) moved by 43-47 % between two
# runs of unchanged code.
PER_CALL_RELIABLE_US = 100.0
# Shapes whose F.softmax device time is below this are also timed in graph replay where no
# call-mode case does it, so a shape near DEVICE_RELIABLE_US (F.softmax's or the kernel's own,
# up to 5 x faster there) has both measurements.
GRAPH_MEASURED_BELOW_US = 3 * DEVICE_RELIABLE_US

BASELINE_FORMAT = 1
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "reports" / "baselines"
KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
RUNS_KEPT = 5  # record runs of the same code pooled in a baseline (the newest)
CODE_SUFFIXES = (".py", ".cu", ".cuh", ".json")  # the files of kernels/ that code_fingerprint reads


# -- statistics of one run --------------------------------------------------------------------------


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the sorted values that bound a distribution-free confidence
    interval of the median of n values: the largest k with P(Binomial(n, 1/2) < k) <= alpha/2
    gives ranks k-1 and n-k (the whole range where n is too small for the level)."""
    if n < 1:
        raise ValueError("no values")
    alpha, k, below = 1 - confidence, 0, 0.0
    while k < n // 2:
        below_next = below + math.comb(n, k) / 2**n  # P(X <= k)
        if below_next > alpha / 2:
            break
        below, k = below_next, k + 1
    k = max(k, 1)
    return k - 1, n - k


def summarize(ratios: list[float]) -> dict:
    """A run's figure for one case: {ratio (median), ci [lo, hi], iqr [q1, q3], rounds}."""
    values = sorted(float(r) for r in ratios)
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"paired ratios must be finite and positive, got {ratios!r}")
    lo, hi = median_ci_ranks(len(values))
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {
        "ratio": _round(statistics.median(values)),
        "ci": [_round(values[lo]), _round(values[hi])],
        "iqr": [_round(q1), _round(q3)],
        "rounds": len(values),
    }


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def noise_floor(key: tuple, mode: str) -> float:
    """The per-run floor of a case's noise: its mode's; a training op's TRAINING_NOISE_FLOOR, or
    TRAINING_MEETING_FLOOR where its kernel's path at that shape meets (`meets`)."""
    if training_op(key[0]) is None:
        return NOISE_FLOOR[mode]
    return max(NOISE_FLOOR[mode], TRAINING_MEETING_FLOOR if meets(key) else TRAINING_NOISE_FLOOR)


def meets(key: tuple) -> bool:
    """Whether the path a training case's kernel takes at its (N, V, dtype) meets (its spec's
    Path.meets). The weighted op's rows carry class weights and label smoothing: its plan is
    asked with plain=False where the kernel's paths name that option (kernels/spec.py)."""
    from kernels.checks import torch_dtype  # torch and the kernels: only where a run is judged
    from kernels.registry import REGISTRY

    impl, _, op = key[0].partition(":")
    kernel = REGISTRY[registry_op(op)][impl]
    options = {}
    if op == "weighted_cross_entropy" and any("plain" in p.options for p in kernel.spec.paths):
        options = {"plain": False}
    return kernel.path(kernel.plan(key[1], key[2], torch_dtype(key[3]), **options)).meets


def run_noise(summary: dict, mode: str, between: float = 0.0, floor: float | None = None) -> float:
    """A run's relative noise on its ratio (log half-width of the median's interval), at least
    the floor (the mode's unless given) and the spread between runs; UNKNOWN_NOISE where the run
    recorded no dispersion."""
    ci = summary.get("ci")
    if not ci:
        return max(UNKNOWN_NOISE[mode], floor or 0.0)
    lo, hi = ci
    return max((math.log(hi) - math.log(lo)) / 2, NOISE_FLOOR[mode] if floor is None else floor, between)


def central(figure: dict) -> float:
    """A baseline figure's ratio: the median of its pooled runs, else its one run's."""
    return statistics.median(figure["runs"]) if figure.get("runs") else figure["ratio"]


def between_runs(figure: dict) -> float:
    """How far the baseline's pooled runs of one case lie from their median: the largest log
    distance (0 for a single run). It counts as noise in the baseline and in the run compared,
    which is another draw of the same spread."""
    runs = figure.get("runs") or []
    if len(runs) < 2:
        return 0.0
    middle = statistics.median(runs)
    return max(abs(math.log(r / middle)) for r in runs)


@dataclass(frozen=True)
class Judgement:
    slowdown: float  # ln(old ratio / new ratio): above 0, the kernel fell behind F.softmax
    noise: float  # both runs' noise, in the same log units

    @property
    def flagged(self) -> bool:
        return self.slowdown - self.noise / 2 > math.log1p(THRESHOLD / 2)

    @property
    def regressed(self) -> bool:
        return self.slowdown - self.noise > math.log1p(THRESHOLD / 2)

    def describe(self) -> str:
        change = math.expm1(self.slowdown)
        moved = f"{change:.1%} slower" if change >= 0 else f"{-change:.1%} faster"
        return f"{moved}, noise ±{math.expm1(self.noise):.1%}"


def judge(old: dict, new: dict, mode: str, floor: float | None = None) -> Judgement:
    """Compare this run's summary of a case with the baseline's figure, in one mode (`floor`:
    the per-run noise floor, the mode's by default)."""
    between = between_runs(old)
    return Judgement(
        slowdown=math.log(central(old) / new["ratio"]),
        noise=math.hypot(run_noise(old, mode, between, floor), run_noise(new, mode, between, floor)),
    )


# -- baselines -------------------------------------------------------------------------------------------


def model_slug(model: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': the baseline's file name."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    if not slug:
        raise ValueError(f"GPU model {model!r} has no letters or digits to name a baseline after")
    return slug


def too_short_for_device_time(case: dict) -> bool:
    """Whether one launch at this case is too short for the device clock: F.softmax's device time
    or the kernel's own (F.softmax's over the device ratio) under DEVICE_RELIABLE_US. On the H200
    the kernels' own 6-10 us launches at B = 1-8, V = 50257-128256 (F.softmax 20-46 us) moved by
    8-13 % between processes of unchanged code while each run's interval was 2-4 %."""
    f_us = case.get("F_softmax_device_us")
    if f_us is None:
        return False
    ratio = ((case.get("modes") or {}).get("device") or {}).get("ratio")
    own_us = f_us / ratio if ratio else f_us
    return min(f_us, own_us) < DEVICE_RELIABLE_US


def gating_modes(case: dict) -> tuple[str, ...]:
    """The modes that gate a baseline case: device time where F.softmax's device time and the
    kernel's own are at least DEVICE_RELIABLE_US (or unknown), else graph replay where the baseline
    has it, else
    device time; and per-call time where it was measured and F.softmax's device time is at least
    PER_CALL_RELIABLE_US. A shorter call's time is mostly the host's (Python, the launch, an
    allocation), which moved by up to 57 % between two runs of unchanged code on the H200 while
    each run's own interval was a few per cent: no baseline from another process can judge it,
    so it is reported, not gated."""
    measured = case.get("modes") or {}
    f_us = case.get("F_softmax_device_us")
    timed = "graph" if too_short_for_device_time(case) and "graph" in measured else "device"
    host_bound = f_us is None or f_us < PER_CALL_RELIABLE_US
    return tuple(m for m in (timed, "per_call") if m in measured and not (m == "per_call" and host_bound))


def code_fingerprint(versions: dict, kernels_dir: Path = KERNELS_DIR) -> str:
    """sha256 of what sets a gated case's speed besides the GPU: the sources and stored tuning
    under kernels/ and the software versions. Runs pool in a baseline only while it is unchanged."""
    h = hashlib.sha256(json.dumps(sorted(versions.items())).encode())
    for path in sorted(kernels_dir.rglob("*")):
        if path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts:
            h.update(path.relative_to(kernels_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _stamp(environment: dict, today: str) -> dict:
    versions = {k: v for k, v in (environment.get("versions") or {}).items() if v is not None}
    return {
        "date": today,
        "versions": versions,
        "command": environment.get("command"),
        "code": code_fingerprint(versions),
    }


def baseline_document(gpu: dict, cases: list[dict], *, recorded: dict, source: str) -> dict:
    return {
        "format": BASELINE_FORMAT,
        "gpu": {"model": gpu.get("model"), "compute_capability": gpu.get("compute_capability")},
        "recorded": recorded,
        "source": source,
        "rule": RULE_TEXT,
        "cases": sorted(cases, key=lambda c: (c["dtype"], c["V"], c["B"], c["kernel"])),
    }


RULE_TEXT = (
    f"gated kernels {', '.join(GATED_KERNELS)}; ratio = t({REFERENCE}) / t(kernel) per interleaved round, "
    f"median and its {CONFIDENCE:.0%} interval per run; device time gates a shape where {REFERENCE}'s device "
    f"time is >= {DEVICE_RELIABLE_US:g} us, graph replay below; per-call time gates the shapes where it is "
    f">= {PER_CALL_RELIABLE_US:g} us, as "
    f"measured at; a case fails when ln(old/new) - noise > ln(1 + {THRESHOLD:g}/2), noise = both runs' "
    "interval half-widths in quadrature, each at least "
    + ", ".join(f"{NOISE_FLOOR[m]:g} ({m})" for m in MODES)
    + f" and the spread of the baseline's pooled runs (the last {RUNS_KEPT} record runs of the same code)"
)


def baseline_from_manifest(manifest: dict, *, source: str = "manifest") -> dict:
    """A baseline from a manifest's single medians (`sweep[].frac_of_F_softmax`,
    `call_modes.entries[].x_F_softmax`): ratios of separately timed cases, dispersion unknown
    (null), which the gate treats with UNKNOWN_NOISE."""
    gpu = manifest.get("gpu") or {}
    if not gpu.get("model"):
        raise ValueError(f"{source}: the manifest names no GPU model, so its figures are no GPU's baseline")
    f_device = {case_key(e)[1:]: e["us_median"] for e in manifest.get("sweep") or [] if e["kernel"] == REFERENCE}
    cases: dict[tuple, dict] = {}

    def case(e):
        key = case_key(e)
        if key not in cases:
            cases[key] = dict(zip(("kernel", "B", "V", "dtype"), key, strict=True))
            if key[1:] in f_device:
                cases[key]["F_softmax_device_us"] = _round(f_device[key[1:]])
            cases[key]["modes"] = {}
        return cases[key]

    unknown = {"ci": None, "iqr": None, "rounds": None}
    for e in manifest.get("sweep") or []:
        if e["kernel"] in GATED_KERNELS and e.get("frac_of_F_softmax"):
            case(e)["modes"]["device"] = {"ratio": _round(e["frac_of_F_softmax"]), **unknown}
    for e in (manifest.get("call_modes") or {}).get("entries") or []:
        ratios = e.get("x_F_softmax") or {}
        if e["kernel"] in GATED_KERNELS:
            for mode in ("graph", "per_call"):
                if ratios.get(mode):
                    case(e)["modes"][mode] = {"ratio": _round(ratios[mode]), **unknown}
    stamp = (manifest.get("provenance") or {}).get("sweep") or {}
    return baseline_document(
        gpu,
        list(cases.values()),
        recorded={"date": stamp.get("date") or manifest.get("date"), "versions": stamp.get("versions") or {}},
        source=f"converted from {source} of {manifest.get('date')}: ratios of single medians of separately "
        "timed cases, dispersion unknown (counted as UNKNOWN_NOISE until a baseline is recorded with "
        "--record-baseline)",
    )


def measurements(records: list[dict]) -> dict[tuple, dict]:
    """{(kernel, B, V, dtype): {"F_softmax_device_us": .., "modes": {mode: {"first": summary,
    "remeasured": summary or None}}}} from this run's benchmark records."""
    found: dict[tuple, dict] = {}
    for r in records:
        paired = r.get("paired_ratios") or {}
        if not paired:
            continue
        entry = found.setdefault(gate_key(r), {"modes": {}})
        if r.get("tuned_at_first_use"):
            entry["tuned_at_first_use"] = r["tuned_at_first_use"]
        f_us = (r.get("paired_F_softmax_us") or {}).get("device")
        if f_us is not None:
            entry["F_softmax_device_us"] = _round(f_us)
        for mode, ratios in paired.items():
            again = (r.get("remeasured_ratios") or {}).get(mode)
            entry["modes"][mode] = {"first": summarize(ratios), "remeasured": summarize(again) if again else None}
    return found


def baseline_from_records(
    records: list[dict],
    environment: dict,
    *,
    previous: dict | None = None,
    today: str | None = None,
    keep: frozenset = frozenset(),
) -> dict | None:
    """This run's paired measurements as a baseline for its GPU model (the re-measured figure
    where a case has one); cases of `previous` (the same model's) this run did not time are
    kept, and so are its figures of the (key, mode) pairs in `keep` (this run's regressions, which
    a record run does not absorb). None when the run timed no paired case."""
    gpu = environment.get("gpu") or {}
    found = measurements(records)
    if not found or not gpu.get("model"):
        return None
    today = today or datetime.date.today().isoformat()
    recorded = _stamp(environment, today)
    cases = {case_key(c): c for c in (previous or {}).get("cases") or []}
    pooled = (previous or {}).get("recorded", {}).get("code") == recorded["code"]
    for key, entry in found.items():
        case = dict(zip(("kernel", "B", "V", "dtype"), key, strict=True))
        if "F_softmax_device_us" in entry:
            case["F_softmax_device_us"] = entry["F_softmax_device_us"]
        elif "F_softmax_device_us" in cases.get(key, {}):
            case["F_softmax_device_us"] = cases[key]["F_softmax_device_us"]
        modes = dict((cases.get(key) or {}).get("modes") or {})
        for m, v in entry["modes"].items():
            if (key, m) in keep and m in modes:
                continue
            figure = dict(v["remeasured"] or v["first"])
            earlier = ((modes.get(m) or {}).get("runs") or [modes[m]["ratio"]]) if pooled and m in modes else []
            figure["runs"] = [*earlier, figure["ratio"]][-RUNS_KEPT:]
            modes[m] = figure
        case["modes"] = {m: modes[m] for m in MODES if m in modes}
        cases[key] = case
    if pooled:
        recorded["runs_pooled"] = (previous["recorded"].get("runs_pooled") or 1) + 1
    return baseline_document(
        gpu,
        list(cases.values()),
        recorded=recorded,
        source="paired rounds (per-round ratios to F.softmax in interleaved rounds)",
    )


def check_baseline(doc, where: str) -> dict:
    """`doc` if it is a baseline this module can use, else ValueError naming what is wrong."""

    def bad(why):
        raise ValueError(f"{where}: not a usable gate baseline: {why}")

    if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT:
        bad(f"expected a JSON object with format {BASELINE_FORMAT}")
    if not isinstance((doc.get("gpu") or {}).get("model"), str):
        bad("gpu.model is missing")
    if not isinstance(doc.get("cases"), list):
        bad("cases is not a list")
    for case in doc["cases"]:
        try:
            case_key(case)
            modes = case["modes"]
        except (KeyError, TypeError, ValueError):
            bad(f"a case lacks kernel / B / V / dtype / modes: {case!r}")
        for mode, figure in modes.items():
            if mode not in MODES:
                bad(f"{case_key(case)}: unknown mode {mode!r} (one of {', '.join(MODES)})")
            ratio, ci = figure.get("ratio"), figure.get("ci")
            if not (isinstance(ratio, int | float) and ratio > 0):
                bad(f"{case_key(case)} {mode}: ratio {ratio!r} is not a positive number")
            if ci is not None and not (len(ci) == 2 and 0 < ci[0] <= ratio <= ci[1]):
                bad(f"{case_key(case)} {mode}: interval {ci!r} does not hold the ratio {ratio}")
            runs = figure.get("runs")
            if runs is not None and not (
                isinstance(runs, list) and runs and all(isinstance(r, int | float) and r > 0 for r in runs)
            ):
                bad(f"{case_key(case)} {mode}: runs {runs!r} is not a list of positive ratios")
    return doc


def read_baseline(path: Path) -> dict:
    """A baseline file, or a manifest converted into one (dispersion unknown)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a baseline ({exc})") from None
    if isinstance(doc, dict) and "experiment" in doc and "format" not in doc:
        return baseline_from_manifest(doc, source=str(path))
    return check_baseline(doc, str(path))


def load_baselines(path: Path) -> dict[str, tuple[dict, str]]:
    """{GPU model: (baseline, where it came from)} from a folder of <model-slug>.json files, or
    from one file (a baseline or a manifest)."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.exists() else []
    found: dict[str, tuple[dict, str]] = {}
    for file in files:
        doc = read_baseline(file)
        model = doc["gpu"]["model"]
        if model in found:
            raise ValueError(f"{file}: a second baseline for {model} (the first is {found[model][1]})")
        found[model] = (doc, str(file))
    return found


def serialise_baseline(doc: dict) -> bytes:
    """JSON with one line per case, so a diff of a re-recorded baseline reads case by case."""
    head = {k: v for k, v in doc.items() if k != "cases"}
    text = json.dumps(head, indent=1, allow_nan=False)[:-2]
    cases = ",\n  ".join(json.dumps(c, allow_nan=False) for c in doc["cases"])
    return f'{text},\n "cases": [\n  {cases}\n ]\n}}\n'.encode()


def write_baseline(directory: Path, doc: dict) -> Path | None:
    """Write `doc` to directory/<model-slug>.json; returns the path if its contents changed."""
    path = Path(directory) / f"{model_slug(doc['gpu']['model'])}.json"
    return path if write_if_changed(path, serialise_baseline(doc)) else None


def record_baseline(
    directory: Path, records: list[dict], environment: dict, today: str | None = None, *, gate_result=None
) -> str:
    """Write this run's paired measurements as its GPU model's baseline in `directory`, keeping
    the cases of the model's earlier baseline this run did not time, and the earlier figures of
    the cases `gate_result` (this run's GateResult) found regressed: a slowdown is accepted by
    recording without --regression-gate. Returns what happened."""
    model = (environment.get("gpu") or {}).get("model")
    if not model:
        return "no baseline recorded: this run measured no GPU"
    path = Path(directory) / f"{model_slug(model)}.json"
    previous = read_baseline(path) if path.exists() else None
    keep = frozenset((f["key"], f["mode"]) for f in gate_result.regressions) if gate_result else frozenset()
    doc = baseline_from_records(records, environment, previous=previous, today=today, keep=keep)
    if doc is None:
        return f"no baseline recorded for {model}: this run timed no gated case"
    written = write_baseline(directory, doc)
    state = "written" if written else "unchanged"
    kept = f"; {len(keep)} regressed kept at their recorded figures" if keep else ""
    return f"baseline for {model} {state}: {path} ({len(doc['cases'])} cases{kept})"


# -- the quick gate: only what the gate compares ------------------------------------------------------------

# Device-time rounds of a gated case under --gate-quick. The floor of 2 % per run, not the rounds,
# sets the noise of the device-time cases the gate can resolve: in the H200's recorded rounds the
# median's interval was within the floor in 100 of 110 device-gated cases at 100 rounds and in 95
# at 40, and the cases above it (20-45 us, where rounds alternate with the order of the pair) are
# as wide at 100 rounds as at 40. Graph replay and per call keep CALL_ROUNDS (15) rounds.
QUICK_DEVICE_ROUNDS = 40


@dataclass(frozen=True)
class QuickSelection:
    """Which benchmark cases a --gate-quick run times: the (case, mode) pairs the baseline of
    this GPU model gates (`gating_modes`), graph replay included, and nothing else. `pairs` is
    None where this model has no baseline: then every gated case runs, so that one can be
    recorded."""

    model: str | None
    source: str
    pairs: dict | None  # (kernel, B, V, dtype) -> the modes that gate it
    wants_graph: frozenset = frozenset()  # cases too short for the device clock

    def keeps(self, kernel: str, B: int, V: int, dtype: str, mode: str = "device") -> bool:
        """Whether the test item timing (kernel, B, V, dtype) in `mode` runs: a device-time item
        (`mode` "device", which times the graph replay of a graph-gated shape too) for every case
        the baseline gates; a per-call item where per-call time gates the case; no graph-replay
        item (the device-time item times it)."""
        if kernel not in GATED_CASE_KERNELS:
            return False
        if self.pairs is None:
            return True
        modes = self.pairs.get((kernel, int(B), int(V), dtype))
        if modes is None:
            return False
        return mode == "device" or (mode == "per_call" and "per_call" in modes)

    def times_graph(self, key: tuple, otherwise: bool) -> bool:
        """Whether the device-time item of `key` also times its graph replay: where graph replay
        gates it, or would once measured (a case too short for the device clock by the baseline),
        or where `otherwise`, this run's own finding that the case is short, says so: a kernel
        that became faster than its baseline (a new path) gets the graph figure its next
        recorded baseline gates it by."""
        if self.pairs is None:
            return otherwise
        return otherwise or tuple(key) in self.wants_graph or "graph" in self.pairs.get(tuple(key), ())

    def describe(self, kept: int) -> str:
        if self.pairs is None:
            return (
                f"gate quick selection: no baseline for {self.model or 'this GPU'} ({self.source}): every gated "
                f"case runs ({kept} items), {QUICK_DEVICE_ROUNDS} device-time rounds"
            )
        counts = {m: sum(m in modes for modes in self.pairs.values()) for m in MODES}
        by_mode = ", ".join(f"{counts[m]} in {MODE_NAMES[m]}" for m in MODES if counts[m])
        return (
            f"gate quick selection ({self.model}; baseline {self.source}): {kept} items for the "
            f"{sum(counts.values())} pairs it gates ({by_mode}), {QUICK_DEVICE_ROUNDS} device-time rounds"
        )


def quick_selection(baselines: dict[str, tuple[dict, str]], model: str | None, where: str = "") -> QuickSelection:
    """The QuickSelection of GPU `model` from the loaded baselines ({model: (doc, source)})."""
    doc, source = baselines.get(model, (None, where or "none found"))
    if doc is None:
        return QuickSelection(model, source, None)
    return QuickSelection(
        model,
        source,
        {case_key(c): gating_modes(c) for c in doc["cases"] if gating_modes(c)},
        frozenset(case_key(c) for c in doc["cases"] if too_short_for_device_time(c)),
    )


def split_quick_items(items, selection: QuickSelection) -> tuple[list, list]:
    """(kept, deselected) test items under --gate-quick: the gated benchmark cases
    `selection` keeps; every other item (correctness tests, ceilings, other kernels) goes."""
    kept, dropped = [], []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        marker = item.get_closest_marker("gated")
        op = marker.kwargs.get("op") if marker is not None else None
        if op is not None and {"impl", "N"} <= params.keys():  # a training op's case
            params = {**params, "kernel": training_kernel(op, params["impl"]), "B": params["N"]}
        keep = (
            marker is not None
            and {"kernel", "B", "V", "dtype"} <= params.keys()
            and selection.keeps(
                params["kernel"], params["B"], params["V"], params["dtype"], params.get("mode", "device")
            )
        )
        (kept if keep else dropped).append(item)
    return kept, dropped


QUICK = pytest.StashKey[QuickSelection]()


def select_quick(config, items: list, describe_gpu) -> str:
    """--gate-quick at collection: keep (in place) the items of this GPU model's QuickSelection
    (the model named by the option, else describe_gpu()'s), report the others deselected, keep
    the selection in the session for the benchmark cases, and return the line that says what ran."""
    where = config.getoption("regression_baseline")
    model = config.getoption("gate_quick") or (describe_gpu() or {}).get("model")
    selection = config.stash[QUICK] = quick_selection(load_baselines(Path(where)), model, where)
    items[:], deselected = split_quick_items(items, selection)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    return selection.describe(len(items))


def quick_of(config) -> QuickSelection | None:
    """The session's QuickSelection where --gate-quick is on, else None."""
    return config.stash.get(QUICK, None)


def device_rounds(config, default: int) -> int:
    """Device-time rounds of a gated case: QUICK_DEVICE_ROUNDS under --gate-quick."""
    return QUICK_DEVICE_ROUNDS if quick_of(config) is not None else default


# -- in the session: flag and re-measure ------------------------------------------------------------------


class Screen:
    """The session's baselines, read before the run, for the benchmark cases to check their
    first measurement against (and measure again where it is flagged)."""

    def __init__(self, baselines: dict[str, tuple[dict, str]]):
        self.baselines = baselines
        self._cases = {model: {case_key(c): c for c in doc["cases"]} for model, (doc, _) in baselines.items()}

    def baseline_case(self, model: str | None, key: tuple) -> dict | None:
        return self._cases.get(model, {}).get(tuple(key))

    def flags(self, model: str | None, key: tuple, mode: str, ratios: list[float]) -> bool:
        case = self.baseline_case(model, key)
        if case is None or mode not in gating_modes(case):
            return False
        return judge(case["modes"][mode], summarize(ratios), mode, noise_floor(key, mode)).flagged


SCREEN = pytest.StashKey[Screen]()


def screen_of(config) -> Screen | None:
    """The session's Screen where --regression-gate is on, else None."""
    return config.stash.get(SCREEN, None)


def measure_paired(config, case: dict, mode: str, measure, *, rounds: int, gpu_model: str | None) -> list[float]:
    """Time a kernel against F.softmax (a training op's kernel: against its eager baseline) in
    `rounds` interleaved rounds of `mode`: measure(rounds) -> (kernel times, reference times).
    The per-round ratios and the reference's median go into `case` (a benchmark's extra_info;
    paired_F_softmax_us names the reference's time whichever it is); where this session's gate
    flags the case against its baseline, it is measured again with REMEASURE_FACTOR times the
    rounds and those ratios are kept too. Returns the kernel's times of the first measurement."""
    times, reference = measure(rounds)
    ratios = [r / k for r, k in zip(reference, times, strict=True)]
    case.setdefault("paired_ratios", {})[mode] = ratios
    case.setdefault("paired_F_softmax_us", {})[mode] = statistics.median(reference)
    screen = screen_of(config)
    if screen is not None and screen.flags(gpu_model, gate_key(case), mode, ratios):
        again, reference = measure(rounds * REMEASURE_FACTOR)
        case.setdefault("remeasured_ratios", {})[mode] = [r / k for r, k in zip(reference, again, strict=True)]
    return times


# -- at the end of the session ----------------------------------------------------------------------------


def _case_name(key: tuple, mode: str) -> str:
    kernel, B, V, dtype = key
    return f"{kernel} B={B} V={V} {dtype} {mode}"


def _figure(summary: dict) -> str:
    """A run's ratio and interval; a pooled baseline's median of its runs and how far they spread."""
    runs = summary.get("runs") or []
    if len(runs) > 1:
        return f"{central(summary):.3f} (median of {len(runs)} runs, ±{math.expm1(between_runs(summary)):.1%})"
    ci = summary.get("ci")
    spread = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else " [spread unknown]"
    return f"{summary['ratio']:.3f}{spread}"


@dataclass
class GateResult:
    gpu_model: str | None
    source: str = ""
    compared: dict = field(default_factory=dict)  # mode -> cases compared
    flagged: list[dict] = field(default_factory=list)
    not_measured: int = 0  # gated baseline cases this run did not time
    largest_unflagged: dict | None = None
    note: str | None = None

    @property
    def regressions(self) -> list[dict]:
        return [f for f in self.flagged if f["verdict"] == "regressed"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def lines(self) -> list[str]:
        """What the terminal summary prints: the verdict, how cases were gated, and one line
        per flagged case (old, new, both spreads, what the re-measurement found)."""
        if self.note:
            return [f"regression gate: {self.note}"]
        total = sum(self.compared.values())
        by_mode = ", ".join(
            f"{self.compared[m]} in {MODE_NAMES[m]}"
            + (f" ({REFERENCE} under {DEVICE_RELIABLE_US:g} us in device time)" if m == "graph" else "")
            for m in MODES
            if self.compared.get(m)
        )
        lines = [
            f"regression gate ({self.gpu_model}; baseline {self.source}): {total} cases compared: {by_mode}",
            f"  a case fails when its slowdown relative to {REFERENCE} (a training op's: its eager baseline), "
            "less both runs' noise, exceeds "
            f"{THRESHOLD / 2:.0%} (half the {THRESHOLD:.0%} threshold); noise floors per run: "
            + ", ".join(f"{MODE_NAMES[m]} {NOISE_FLOOR[m]:.0%}" for m in MODES)
            + f", training ops {TRAINING_NOISE_FLOOR:.0%} ({TRAINING_MEETING_FLOOR:.0%} on paths that meet)",
            f"  {len(self.regressions)} regressed; {len(self.flagged)} flagged and re-measured with "
            f"{REMEASURE_FACTOR}x the rounds"
            + (f"; {self.not_measured} gated cases not timed in this run" if self.not_measured else ""),
        ]
        for f in self.flagged:
            verdict = "REGRESSED   " if f["verdict"] == "regressed" else "within noise"
            line = (
                f"  {verdict} {_case_name(f['key'], f['mode'])}: {_figure(f['old'])} -> {_figure(f['new'])} "
                f"x {reference_of(f['key'][0])}, {f['first'].describe()}"
            )
            if f.get("remeasured"):
                line += f"; re-measured {_figure(f['remeasured'])}, {f['second'].describe()}"
            else:
                line += "; not re-measured"
            tuned = f.get("tuned_at_first_use")
            if tuned:
                # Not a change of code: what the autotuner picked in this run (the baseline's
                # run may have picked another). A stored choice makes the config the same in
                # every run.
                line += (
                    f"; its tile config (BLOCK {tuned.get('BLOCK')}, {tuned.get('num_warps')} warps) was "
                    "tuned at first use, as no choice is stored for this GPU, and may differ between runs: "
                    "`python -m kernels.autotune` stores one"
                )
            lines.append(line)
        if self.largest_unflagged:
            u = self.largest_unflagged
            lines.append(
                f"  largest slowdown not flagged: {_case_name(u['key'], u['mode'])}, {u['judgement'].describe()}"
            )
        return lines


def evaluate(baseline: dict | None, records: list[dict], gpu_model: str | None, *, source: str = "") -> GateResult:
    """Gate this run's paired measurements (from its benchmark records) against the baseline of
    its GPU model. No GPU, no baseline or nothing timed is a note, not a failure."""
    if not gpu_model:
        return GateResult(None, note="this run measured no GPU: nothing to compare")
    if baseline is None:
        return GateResult(
            gpu_model,
            note=f"no baseline for {gpu_model} ({source or 'none found'}): passed without comparing; "
            "record one with --record-baseline",
        )
    current = measurements(records)
    result = GateResult(gpu_model, source=describe_source(baseline, source))
    for case in baseline["cases"]:
        key = case_key(case)
        for mode in gating_modes(case):
            measured = (current.get(key) or {}).get("modes", {}).get(mode)
            if measured is None:
                result.not_measured += 1
                continue
            result.compared[mode] = result.compared.get(mode, 0) + 1
            old, floor = case["modes"][mode], noise_floor(key, mode)
            first = judge(old, measured["first"], mode, floor)
            if not first.flagged:
                top = result.largest_unflagged
                if top is None or first.slowdown > top["judgement"].slowdown:
                    result.largest_unflagged = {"key": key, "mode": mode, "judgement": first}
                continue
            again = measured["remeasured"]
            second = judge(old, again, mode, floor) if again else None
            regressed = second.regressed if second else first.regressed
            result.flagged.append(
                {
                    "key": key,
                    "mode": mode,
                    "old": old,
                    "new": measured["first"],
                    "first": first,
                    "remeasured": again,
                    "second": second,
                    "verdict": "regressed" if regressed else "within noise",
                    "tuned_at_first_use": current[key].get("tuned_at_first_use"),
                }
            )
    if not result.compared:
        result.note = (
            f"this run timed none of the {result.not_measured} cases the baseline for {gpu_model} gates "
            f"({source}): nothing to compare"
        )
    result.flagged.sort(key=lambda f: (f["verdict"] != "regressed", MODES.index(f["mode"]), f["key"]))
    return result


def describe_source(doc: dict, where: str) -> str:
    """'<where>, recorded <date>' and whether its dispersion is unknown."""
    unknown = any(not m.get("ci") for c in doc.get("cases") or [] for m in c["modes"].values())
    date = (doc.get("recorded") or {}).get("date") or "undated"
    return f"{where}, recorded {date}" + (
        ", dispersion unknown: counted as " + ", ".join(f"{MODE_NAMES[m]} ±{UNKNOWN_NOISE[m]:.0%}" for m in MODES)
        if unknown
        else ""
    )


# -- python -m tests.suite.gate ----------------------------------------------------------------------------


def describe(doc: dict) -> list[str]:
    """One line per case of a baseline: the mode(s) that gate it, with the figures."""
    lines = [f"{doc['gpu']['model']}: {len(doc['cases'])} cases; {doc.get('source', '')}"]
    counts: dict[str, int] = {}
    for case in doc["cases"]:
        modes = gating_modes(case)
        for m in modes:
            counts[m] = counts.get(m, 0) + 1
        f_us = case.get("F_softmax_device_us")
        figures = "; ".join(f"{m} {_figure(case['modes'][m])}" for m in modes)
        shown = f"{f_us:.1f} us" if f_us is not None else "unknown"
        reference = reference_of(case["kernel"])
        lines.append(f"  {_case_name(case_key(case), '').strip():40s} {reference} device {shown:>10s}: {figures}")
    lines.append("gated in: " + ", ".join(f"{MODE_NAMES[m]} {counts[m]}" for m in MODES if m in counts))
    return lines


def main(argv=None) -> int:
    """List which mode gates each case of the baselines in PATH (a folder or one file), or
    convert a manifest's figures into its GPU model's baseline (--from-manifest)."""
    parser = argparse.ArgumentParser(prog="python -m tests.suite.gate", description=main.__doc__)
    parser.add_argument(
        "path", nargs="?", default=str(DEFAULT_DIR), help="baseline folder or file (default: %(default)s)"
    )
    parser.add_argument("--from-manifest", metavar="MANIFEST", help="write MANIFEST's figures as a baseline into PATH")
    args = parser.parse_args(argv)
    try:
        if args.from_manifest:
            manifest = json.loads(Path(args.from_manifest).read_text())
            doc = baseline_from_manifest(manifest, source=args.from_manifest)
            written = write_baseline(Path(args.path), doc)
            target = Path(args.path) / f"{model_slug(doc['gpu']['model'])}.json"
            print(f"{target}: {'written' if written else 'unchanged'}")
            return 0
        baselines = load_baselines(Path(args.path))
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if not baselines:
        parser.error(f"no baseline in {args.path}")
    for doc, _ in baselines.values():
        print("\n".join(describe(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
