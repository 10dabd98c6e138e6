"""One report from the results of several machines: `python -m tests.suite.merge A B ... --out DIR`.

Each input is a manifest.json (what `pytest -m cuda --benchmark-only --reports-dir out` writes)
or a pytest-benchmark JSON (`--benchmark-json`), whose cases carry raw timings in extra_info.
Inputs are grouped by GPU model; results of one model from several files are merged as a run
merges into a manifest (raw timings, later files winning, every ratio derived again). DIR gets:

    report.md                  per-model tables side by side: machines, the lab point, speed
                               relative to F.softmax and fraction of copy bandwidth per shape,
                               call modes, goals
    speed_by_model.png         x F.softmax (device time) of fused, Triton, torch.compile per shape,
    bandwidth_by_model.png     fraction of copy bandwidth per shape: one column per GPU model
    <model-slug>/manifest.json and that model's roofline, bandwidth and call-mode figures
    merged.json                {"models": {model: manifest}, "sources": {model: [files]}}
"""

import argparse
import json
import math
from pathlib import Path

from kernels.spec import BASELINE, DTYPE_NAMES, names
from tests.suite import figures
from tests.suite.gate import model_slug
from tests.suite.manifest import (
    CALL_MODES,
    LAB_POINT,
    MODES,
    SWEEP_EXTRAS,
    TARGET_KERNELS,
    TARGET_MIN_BYTES,
    build_manifest,
    kernel_rank,
    matrix_bytes,
    serialise,
    upgrade,
    upgrade_plan,
    validate,
    write_if_changed,
)

# Drawn side by side per GPU model: the kernels the gate holds, and every other baseline than
# the one the ratios are taken to (kernels/spec.py).
SIDE_BY_SIDE_KERNELS = names(lambda s: s.gated) + names(lambda s: s.baseline and s.name != BASELINE)


# -- reading the inputs -----------------------------------------------------------------------------------


def records_from_manifest(manifest: dict) -> tuple[list[dict], dict]:
    """The raw benchmark records a manifest's timings came from (sweep, call modes, floors), and
    its measured ceilings, so manifests can be merged the way a run merges into one. A manifest
    of earlier key names is read through `manifest.upgrade` (its key map, RENAMED_KEYS)."""
    manifest = upgrade(manifest)
    records = []
    for e in manifest.get("sweep") or []:
        r = {k: e[k] for k in ("kernel", "B", "V", "dtype", "us_median", "us_min", "us_max")}
        r.update(mode="device", bytes=e["bytes_by_design"])
        r.update({k: e[k] for k in SWEEP_EXTRAS if k in e})
        records.append(r)
    calls = manifest.get("call_modes") or {}
    for e in calls.get("entries") or []:
        for mode in CALL_MODES:
            if f"{mode}_us" in e:
                us = e[f"{mode}_us"]
                records.append(
                    {
                        **{k: e[k] for k in ("kernel", "B", "V", "dtype")},
                        "mode": mode,
                        "us_median": us,
                        "us_min": us,
                        "us_max": us,
                    }
                )
    for name, values in (calls.get("floors") or {}).items():
        for mode in MODES:  # floors are also timed in device time
            if f"{mode}_us" in values:
                us = values[f"{mode}_us"]
                records.append({"floor": name, "mode": mode, "us_median": us, "us_min": us, "us_max": us})
    ceilings = {k: v for k, v in (manifest.get("ceilings") or {}).items() if k in ("hbm_copy_TBps", "fp32_TFLOPS")}
    return records, ceilings


def records_from_benchmark_json(doc: dict) -> tuple[list[dict], dict, set]:
    """Records, ceilings and the GPU models named, from a pytest-benchmark JSON of our cases."""
    records, ceilings, models = [], {}, set()
    for bench in doc.get("benchmarks") or []:
        info = dict(bench.get("extra_info") or {})
        stats = bench.get("stats") or {}
        if info.get("gpu"):
            models.add(info["gpu"])
        if info.get("ceiling") == "copy" and "TBps" in info:
            ceilings["hbm_copy_TBps"] = info["TBps"]
        elif info.get("ceiling") == "fp32" and "TFLOPS" in info:
            ceilings["fp32_TFLOPS"] = info["TFLOPS"]
        if ("kernel" in info or "floor" in info) and stats.get("rounds"):
            info.setdefault("mode", "device")
            us = {f"us_{k}": stats[k] * 1e6 for k in ("median", "min", "max")}
            records.append(upgrade_plan({**info, **us}))
    return records, ceilings, models


def load_input(path: Path, assume_model: str | None = None) -> tuple[str, list[dict], dict, dict]:
    """(GPU model, records, ceilings, environment) from a manifest or a pytest-benchmark JSON."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    if isinstance(doc, dict) and "experiment" in doc and "sweep" in doc:
        records, ceilings = records_from_manifest(doc)
        gpu = dict(doc.get("gpu") or {})
        versions, date = doc.get("versions") or {}, doc.get("date")
    elif isinstance(doc, dict) and "benchmarks" in doc:
        records, ceilings, models = records_from_benchmark_json(doc)
        if len(models) > 1:
            raise ValueError(f"{path}: cases from several GPU models ({', '.join(sorted(models))})")
        gpu = {"model": next(iter(models), None), "compute_capability": None}
        versions = {"python": (doc.get("machine_info") or {}).get("python_version")}
        date = (doc.get("datetime") or "")[:10] or None
    else:
        raise ValueError(f"{path}: neither a manifest (with a sweep) nor a pytest-benchmark JSON")
    gpu["model"] = gpu.get("model") or assume_model
    if not gpu["model"]:
        raise ValueError(f"{path}: names no GPU model; give it with --assume-model 'NVIDIA H200'")
    if not records:
        raise ValueError(f"{path}: holds no kernel timings")
    environment = {"gpu": gpu, "versions": versions, "command": f"merged from {path.name}", "date": date}
    return gpu["model"], records, ceilings, environment


def merge_inputs(paths, assume_model: str | None = None) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """({GPU model: manifest}, {GPU model: its input files}): each manifest built from the raw
    timings of every input of that model (in the order given: a later file's value for the same
    case wins)."""
    merged: dict[str, dict] = {}
    sources: dict[str, list[str]] = {}
    for path in paths:
        model, records, ceilings, environment = load_input(path, assume_model)
        today = environment.pop("date") or "1970-01-01"
        previous = merged.get(model)
        if previous:  # what this input does not say (a benchmark JSON: versions, capability) stays
            known = {k: v for k, v in environment["versions"].items() if v}
            environment["versions"] = {**(previous.get("versions") or {}), **known}
            gpu = {k: v for k, v in environment["gpu"].items() if v}
            environment["gpu"] = {**(previous.get("gpu") or {}), **gpu}
        recorded = {"ceilings": dict(ceilings)} if ceilings else {}
        merged[model] = build_manifest(
            previous, benchmarks=records, recorded=recorded, environment=environment, today=today
        )
        sources.setdefault(model, []).append(str(path))
    return dict(sorted(merged.items())), sources


# -- the report ---------------------------------------------------------------------------------------------


def _sweep(manifest: dict) -> dict[tuple, dict]:
    return {(e["kernel"], e["B"], e["V"], e["dtype"]): e for e in manifest.get("sweep") or []}


def _num(value, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the first column left, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "|".join("---:" for _ in header[1:]) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def report_markdown(models: dict[str, dict], sources: dict[str, list[str]]) -> str:
    """Per-model tables side by side, one column per GPU model."""
    names = list(models)
    out = [
        "# Results by GPU model",
        "",
        "Merged by `python -m tests.suite.merge` from: "
        + "; ".join(f"{m}: {', '.join(sources.get(m, []))}" for m in names)
        + ". Speeds are relative to F.softmax measured on the same machine in the same run (above 1: "
        "faster); times are medians in µs.",
        "",
        "## Machines",
        "",
    ]
    rows = []
    for m in names:
        man = models[m]
        c, v = man.get("ceilings") or {}, man.get("versions") or {}
        rows.append(
            [
                m,
                man.get("date") or "–",
                ", ".join(f"{k} {v[k]}" for k in ("torch", "triton", "cupy") if v.get(k)) or "–",
                _num(c.get("hbm_copy_TBps"), ".2f"),
                _num(c.get("fp32_TFLOPS"), ".1f"),
            ]
        )
    out += _table(["GPU", "date", "versions", "copy TB/s", "fp32 TFLOP/s"], rows)
    B, V, dtype = LAB_POINT
    out += ["", f"## The lab point, ({B}, {V}) {dtype}: µs (× F.softmax)", ""]
    kernels = sorted({e["kernel"] for m in names for e in models[m].get("sweep") or []}, key=kernel_rank)
    rows = []
    for k in kernels:
        cells = []
        for m in names:
            e = _sweep(models[m]).get((k, B, V, dtype))
            cells.append(f"{e['us_median']:.2f} ({_num(e.get('frac_of_F_softmax'), '.2f')})" if e else "–")
        rows.append([k, *cells])
    out += _table(["kernel", *names], rows)
    shapes = sorted(
        {(e["dtype"], e["V"], e["B"]) for m in names for e in models[m].get("sweep") or []},
        key=lambda s: (DTYPE_NAMES.index(s[0]) if s[0] in DTYPE_NAMES else 9, s[1], s[2]),
    )
    pair = " / ".join(TARGET_KERNELS)
    out += ["", f"## × F.softmax in device time, {pair}", ""]
    rows = []
    for dtype_, V_, B_ in shapes:
        cells = []
        for m in names:
            sweep = _sweep(models[m])
            cells.append(
                " / ".join(
                    _num((sweep.get((k, B_, V_, dtype_)) or {}).get("frac_of_F_softmax"), ".2f") for k in TARGET_KERNELS
                )
            )
        rows.append([f"{dtype_} ({B_}, {V_})", *cells])
    out += _table(["shape", *names], rows)
    out += ["", f"## Fraction of copy bandwidth, {pair}, shapes moving >= {TARGET_MIN_BYTES / 1e6:.0f} MB", ""]
    rows = []
    for dtype_, V_, B_ in shapes:
        if matrix_bytes(B_, V_, dtype_) < TARGET_MIN_BYTES:
            continue
        cells = []
        for m in names:
            sweep = _sweep(models[m])
            cells.append(
                " / ".join(
                    _num((sweep.get((k, B_, V_, dtype_)) or {}).get("frac_of_copy_bw"), ".3f") for k in TARGET_KERNELS
                )
            )
        rows.append([f"{dtype_} ({B_}, {V_})", *cells])
    out += _table(["shape", *names], rows)
    out += ["", "## Call modes: range of × F.softmax over the call-mode shapes", ""]
    rows = []
    for k in TARGET_KERNELS:
        for mode in MODES:
            cells = []
            for m in names:
                ratios = [
                    e["x_F_softmax"][mode]
                    for e in (models[m].get("call_modes") or {}).get("entries") or []
                    if e["kernel"] == k and mode in (e.get("x_F_softmax") or {})
                ]
                cells.append(f"{min(ratios):.2f}-{max(ratios):.2f} ({len(ratios)})" if ratios else "–")
            rows.append([f"{k}, {mode.replace('_', ' ')}", *cells])
    out += _table(["kernel, mode", *names], rows)
    out += ["", "## Goals (`targets`)", ""]
    rows = [
        [
            m,
            str((models[m].get("targets") or {}).get("cases_checked", "–")),
            str((models[m].get("targets") or {}).get("cases_missed", "–")),
        ]
        for m in names
    ]
    out += _table(["GPU", "cases checked", "cases missing a goal"], rows)
    out += [
        "",
        "Figures: `speed_by_model.png`, `bandwidth_by_model.png` (one column per GPU model); each model's "
        "own figures in its folder.",
        "",
    ]
    return "\n".join(out)


def by_model_png(models: dict[str, dict], metric: str) -> bytes | None:
    """One column per GPU model, one row per dtype: per sweep shape, `metric` of each kernel of
    SIDE_BY_SIDE_KERNELS ("frac_of_F_softmax": device-time speed relative to F.softmax, with a
    line at 1; "frac_of_copy_bw": fraction of copy bandwidth, shapes of >= 100 MB)."""
    names = list(models)
    per = {}
    for m in names:
        for e in models[m].get("sweep") or []:
            if e["kernel"] not in SIDE_BY_SIDE_KERNELS or e.get(metric) is None:
                continue
            if metric == "frac_of_copy_bw" and matrix_bytes(e["B"], e["V"], e["dtype"]) < TARGET_MIN_BYTES:
                continue
            per.setdefault(e["dtype"], {}).setdefault(m, {})[(e["V"], e["B"], e["kernel"])] = e[metric]
    if not per:
        return None
    dtypes = [d for d in DTYPE_NAMES if d in per] + sorted(set(per) - set(DTYPE_NAMES))
    plt = figures._pyplot()
    fig, axes = plt.subplots(len(dtypes), len(names), figsize=(7 * len(names), 3.8 * len(dtypes)), squeeze=False)
    for row, dtype in enumerate(dtypes):
        shapes = sorted({(v, b) for m in names for v, b, _ in per[dtype].get(m, {})})
        top = max(v for m in names for v in per[dtype].get(m, {}).values())
        for col, m in enumerate(names):
            ax = axes[row, col]
            values = per[dtype].get(m, {})
            width = 0.8 / len(SIDE_BY_SIDE_KERNELS)
            for k, kernel in enumerate(SIDE_BY_SIDE_KERNELS):
                xs = [i - 0.4 + width * (k + 0.5) for i, (v, b) in enumerate(shapes) if (v, b, kernel) in values]
                ys = [values[(v, b, kernel)] for v, b in shapes if (v, b, kernel) in values]
                ax.bar(xs, ys, width=width * 0.92, color=figures._color(kernel), label=kernel)
            for i, (v, b) in enumerate(shapes):
                if not any((v, b, kernel) in values for kernel in SIDE_BY_SIDE_KERNELS):
                    ax.text(i, 0.02 * top, "not measured", rotation=90, fontsize=6, ha="center", color="grey")
            if metric == "frac_of_F_softmax":
                ax.axhline(1.0, color="black", lw=1, ls="--")
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels([f"{v} x {b}" for v, b in shapes], fontsize=6, rotation=90)
            ax.set_xlim(-0.6, len(shapes) - 0.4)
            ax.set_ylim(0, top * 1.08)
            ax.grid(True, axis="y", alpha=0.3)
            ax.set_title(f"{m}, {dtype}", fontsize=9)
            if col == 0:
                ax.set_ylabel("x F.softmax (device time)" if metric == "frac_of_F_softmax" else "fraction of copy")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(SIDE_BY_SIDE_KERNELS), fontsize=8, frameon=False)
    fig.supxlabel("shape: V x B", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    return figures._png(fig)


def write_merged(
    models: dict[str, dict], sources: dict[str, list[str]], out_dir: Path, *, model_figures: bool = True
) -> list[Path]:
    """Write the merged report into out_dir (each model's own figures too, unless
    model_figures is False); returns the files that changed."""
    out_dir = Path(out_dir)
    written = []

    def put(path: Path, data: bytes | None):
        if data is not None and write_if_changed(path, data):
            written.append(path)

    for model, manifest in models.items():
        folder = out_dir / model_slug(model)
        validate(manifest)
        put(folder / "manifest.json", serialise(manifest))
        for name, png in figures.render_all(manifest).items() if model_figures else ():
            put(folder / name, png)
    merged = {"models": models, "sources": sources}
    put(out_dir / "merged.json", (json.dumps(merged, indent=1, allow_nan=False) + "\n").encode())
    put(out_dir / "report.md", report_markdown(models, sources).encode())
    put(out_dir / "speed_by_model.png", by_model_png(models, "frac_of_F_softmax"))
    put(out_dir / "bandwidth_by_model.png", by_model_png(models, "frac_of_copy_bw"))
    return written


def main(argv=None) -> int:
    """Merge the results of several machines (manifests or pytest-benchmark JSON) into one
    report with per-model tables and figures side by side."""
    parser = argparse.ArgumentParser(prog="python -m tests.suite.merge", description=main.__doc__)
    parser.add_argument("inputs", nargs="+", help="manifest.json or pytest-benchmark JSON files")
    parser.add_argument("--out", required=True, help="folder for the merged report")
    parser.add_argument(
        "--assume-model",
        help="GPU model of inputs that name none (pytest-benchmark JSON from before extra_info had it)",
    )
    parser.add_argument("--no-model-figures", action="store_true", help="skip each model's own three figures")
    args = parser.parse_args(argv)
    try:
        models, sources = merge_inputs([Path(p) for p in args.inputs], args.assume_model)
    except ValueError as exc:
        parser.error(str(exc))
    written = write_merged(models, sources, Path(args.out), model_figures=not args.no_model_figures)
    print(f"{len(models)} GPU models: {', '.join(models)}")
    for path in written:
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
