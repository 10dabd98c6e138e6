"""What a run hands over for the manifest: values tests record through the `record_manifest`
fixture, combined over tests, and the raw timings of benchmark cases read from pytest-benchmark.

A benchmark case puts raw facts in `benchmark.extra_info` and nothing derived: kernel, B, V,
dtype, mode ("device", "per_call" or "graph"), bytes (what the kernel moves by design), plan
(the dispatch path, the kernel's plan(B, V, dtype)), size_class (fused's), autotune_picked
(and tuned_at_first_use where no choice is stored for the GPU); a launch-floor case puts
`floor` (its name) and mode instead of the kernel and shape; a softmax-backward or
cross-entropy case puts `op` and `impl` instead of the kernel (tests/suite/manifest.py:
LOSS_OPS). Ratios (to F.softmax, to copy bandwidth) are derived once,
from the whole run, by tests/suite/manifest.py.
"""

import copy
import math

RECORD_KEY = "manifest"


def _failed(value) -> bool:
    """A verdict that failed: "failed", or "not gated: failed" for a measured baseline."""
    return isinstance(value, str) and (value == "failed" or value.endswith(": failed"))


def _combine(old, new):
    if isinstance(old, dict) and isinstance(new, dict):
        merged = dict(old)
        for key, value in new.items():
            merged[key] = _combine(merged[key], value) if key in merged else _plain(value)
        return merged
    if isinstance(old, list | tuple) and isinstance(new, list | tuple):
        merged = list(old)
        for item in _plain(list(new)):
            if item not in merged:
                merged.append(item)
        return merged
    if old is None or new is None:  # nothing measured on one side
        return _plain(new if old is None else old)
    if isinstance(old, bool) and isinstance(new, bool):
        return old or new
    if isinstance(old, int | float) and isinstance(new, int | float):
        if math.isnan(old) or math.isnan(new):
            return math.nan
        return max(old, new)
    if _failed(old) and not _failed(new):
        return old
    return _plain(new)


def _plain(value):
    """Tuples as lists, as JSON and xdist's transport would make them, so that a shape recorded
    as (B, V) and one recorded as [B, V] are the same shape."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return copy.copy(value)


def combine_recorded(records) -> dict[str, dict]:
    """Merge (section, {key: value}) records from many tests into {section: {key: value}}.

    Several tests measure the same quantity (each seed and shape of an equivalence test), so
    numbers combine by max (they are worst-case errors; NaN is worse than any), verdict strings
    by a failure winning, booleans by any() (one changed top-1 token anywhere means the swap
    changed something), lists by union in first-seen order, and dicts key by key with these
    same rules: {"verdict": ..., "shapes": [[B, V], ...]} keeps the worst verdict and every shape.
    """
    merged: dict[str, dict] = {}
    for section, values in records:
        target = merged.setdefault(section, {})
        for key, value in values.items():
            target[key] = _combine(target[key], value) if key in target else _plain(value)
    return merged


def benchmark_records(bench_session) -> list[dict]:
    """Our cases from pytest-benchmark's session, read defensively (its attributes are private):
    extra_info plus the round statistics in microseconds. Cases without a kernel or floor name
    (the ceilings, the lab gates) are not records."""
    records = []
    for bench in getattr(bench_session, "benchmarks", None) or []:
        info = dict(getattr(bench, "extra_info", None) or {})
        stats = getattr(bench, "stats", None)
        if not ("kernel" in info or "floor" in info or "op" in info) or not stats or not getattr(stats, "rounds", 0):
            continue
        info.setdefault("mode", "device")
        records.append({**info, "us_median": stats.median * 1e6, "us_min": stats.min * 1e6, "us_max": stats.max * 1e6})
    return records


class Collector:
    """Gathers recorded values from test reports. Lives in the process that writes the reports:
    under xdist that is the controller, which sees every worker's reports."""

    def __init__(self):
        self.recorded: list = []
        self.gpu_work_ran = False

    def add(self, report) -> None:
        if report.when == "call" and "cuda" in report.keywords:
            self.gpu_work_ran = True
        for name, value in getattr(report, "user_properties", ()):
            if name == RECORD_KEY:
                self.recorded.append(value)

    def combined(self) -> dict[str, dict]:
        return combine_recorded(self.recorded)
