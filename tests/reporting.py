"""Turn what a pytest run measured into reports/manifest.json, roofline.png and bandwidth.png.

Plain functions on plain records, so they are tested on synthetic data on the CPU; conftest.py
only gathers the records and calls `write_reports`.

A benchmark record is a dict with kernel, B, V, dtype, us_median, us_min, us_max, bytes
(the bytes the kernel moves by design), min_bytes (one read and one write of the matrix) and,
for Triton, autotune_picked. Recorded values are {section: {key: value}} from `record_manifest`.
"""

import datetime
import json
import math
import os
import platform
import tempfile
from pathlib import Path

EXPERIMENT = "24-triton-and-pytorch"
SEED = 42
LAB_POINT = (512, 600, "float32")
KERNEL_ORDER = ("naive", "smem", "fused", "triton", "F_softmax", "torch_compile")
REQUIRED_KERNELS = ("naive", "smem", "fused", "triton")
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "reports" / "manifest.schema.json"

# The roofline's FLOPs convention: per element one compare (max), one subtract, one exp, one
# add (sum) and one multiply by the reciprocal of the sum. exp is counted as one operation
# although the hardware spends several instructions on it.
FLOPS_PER_ELEMENT = 5

# Datasheet figures for the H200 SXM, kept beside the measured ceilings for reference only.
DATASHEET = {"NVIDIA H200": {"hbm_TBps": 4.8, "fp32_TFLOPS": 67.0}}


# -- small utilities ---------------------------------------------------------------------------

def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same folder and rename, so a reader (or a crash)
    never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; reports are for everyone
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(path: Path) -> dict | None:
    """The manifest already on disk, or None if there is none or it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def case_key(record: dict) -> tuple:
    return (record["kernel"], int(record["B"]), int(record["V"]), record["dtype"])


def software_versions() -> dict:
    """Versions of what the suite runs on, without importing CUDA-touching code paths."""
    versions = {"python": platform.python_version()}
    for name in ("torch", "triton", "cupy", "numpy"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # a missing or broken package is recorded as absent, not fatal
            versions[name] = None
    return versions


# -- building the manifest -----------------------------------------------------------------------

def sweep_entries(benchmarks: list[dict], copy_TBps: float | None) -> list[dict]:
    """One manifest entry per timed case, with GB/s and the fractions of copy bandwidth and of
    F.softmax computed from the same run's numbers."""
    by_key = {case_key(r): r for r in benchmarks}
    entries = []
    for r in sorted(benchmarks, key=lambda r: (r["dtype"], r["V"], r["B"], _kernel_rank(r["kernel"]))):
        seconds = r["us_median"] * 1e-6
        entry = {
            "kernel": r["kernel"], "B": int(r["B"]), "V": int(r["V"]), "dtype": r["dtype"],
            "us_median": r["us_median"], "us_min": r["us_min"], "us_max": r["us_max"],
            "GBps": r["min_bytes"] / seconds / 1e9,
            "bytes_by_design": r["bytes"],
        }
        if copy_TBps:
            entry["frac_of_copy_bw"] = entry["GBps"] / (copy_TBps * 1e3)
        baseline = by_key.get(("F_softmax", entry["B"], entry["V"], entry["dtype"]))
        if baseline is not None:
            entry["frac_of_F_softmax"] = baseline["us_median"] / r["us_median"]
        for extra in ("plan", "autotune_picked"):
            if r.get(extra) is not None:
                entry[extra] = r[extra]
        entries.append(entry)
    return entries


def _kernel_rank(name: str) -> int:
    return KERNEL_ORDER.index(name) if name in KERNEL_ORDER else len(KERNEL_ORDER)


# Large-vocabulary goals for our two fast kernels: at least F.softmax's speed at every shape, and
# a fraction of the measured copy bandwidth wherever a shape moves at least 100 MB.
TARGET_KERNELS = ("fused", "triton")
TARGET_MIN_BYTES = 100e6
TARGET_COPY_FRACTION = {600: 0.90, 4096: 0.95, 32000: 0.95, 50257: 0.95, 128256: 0.95}


def target_report(sweep: list[dict]) -> dict:
    """Which sweep cases of fused / triton meet the large-vocabulary goals, and which miss."""
    checked, misses = 0, []
    for e in sweep:
        if e["kernel"] not in TARGET_KERNELS or "frac_of_F_softmax" not in e:
            continue
        checked += 1
        why = []
        if e["frac_of_F_softmax"] < 1.0:
            why.append(f"{e['frac_of_F_softmax']:.2f} x F.softmax")
        floor = TARGET_COPY_FRACTION.get(e["V"])
        moved = 2 * e["B"] * e["V"] * (4 if e["dtype"] == "float32" else 2)
        if floor and moved >= TARGET_MIN_BYTES and e.get("frac_of_copy_bw", 1.0) < floor:
            why.append(f"{e['frac_of_copy_bw']:.3f} of copy (goal {floor})")
        if why:
            misses.append({"kernel": e["kernel"], "B": e["B"], "V": e["V"], "dtype": e["dtype"],
                           "why": "; ".join(why)})
    return {"rule": ">= 1.0 x F.softmax at every shape; >= 0.95 of copy bandwidth for V >= 4096 and "
                    ">= 0.90 for V = 600 where a shape moves >= 100 MB",
            "cases_checked": checked, "cases_missed": len(misses), "missed": misses}


def kernel_points(sweep: list[dict]) -> dict:
    """The lab contract's per-kernel figures at (B, V) = (512, 600), fp32."""
    B, V, dtype = LAB_POINT
    points = {}
    for e in sweep:
        if (e["B"], e["V"], e["dtype"]) != (B, V, dtype):
            continue
        point = {"us_at_B512": e["us_median"], "frac_of_F_softmax": e.get("frac_of_F_softmax")}
        if "frac_of_copy_bw" in e:
            point["frac_of_hbm_peak"] = e["frac_of_copy_bw"]
        if "autotune_picked" in e:
            point["autotune_picked"] = e["autotune_picked"]
        points[e["kernel"]] = point
    return points


def empty_manifest() -> dict:
    """A schema-valid manifest with nothing measured (nulls are placeholders)."""
    point = {"us_at_B512": None, "frac_of_F_softmax": None}
    return {
        "experiment": EXPERIMENT, "date": datetime.date.today().isoformat(), "seed": SEED,
        "gpu": {"model": None, "compute_capability": None},
        "versions": {"python": platform.python_version(), "torch": None, "triton": None, "cupy": None},
        "softmax_kernels": {
            **{k: dict(point) for k in REQUIRED_KERNELS},
            "triton": {**point, "autotune_picked": {"BLOCK": None, "num_warps": None}},
        },
        "torch_port": {"byte_equivalence_at_fp32_cpu": None, "max_abs_diff_to_numpy_reference": None,
                       "kernel_swap_changes_top1_token": None},
        "provenance": {},
    }


def provenance_stamp(environment: dict, today: str) -> dict:
    """When, where ("cpu" or the GPU's name) and with what a section was measured."""
    versions = {k: v for k, v in (environment.get("versions") or {}).items() if v is not None}
    return {"date": today, "device": (environment.get("gpu") or {}).get("model") or "cpu",
            "versions": versions, "command": environment.get("command")}


def build_manifest(previous: dict | None, *, benchmarks: list[dict], recorded: dict[str, dict],
                   environment: dict, today: str | None = None) -> dict:
    """Merge this run's measurements into the previous manifest.

    What this run did not measure keeps its earlier value and provenance: a laptop
    `pytest -m cpu` must not wipe numbers measured on a GPU. `environment` has `gpu`
    ({model, compute_capability} or None on a CPU run), `versions` and `command`.
    """
    today = today or datetime.date.today().isoformat()
    manifest = empty_manifest()
    if previous:
        for key, value in previous.items():
            manifest[key] = value
    manifest["experiment"], manifest["seed"], manifest["date"] = EXPERIMENT, SEED, today
    provenance = manifest.setdefault("provenance", {})
    stamp = provenance_stamp(environment, today)

    # A NaN or inf cannot go into JSON; it is stored as null and the test that recorded it fails.
    recorded = {section: {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                          for k, v in values.items()} for section, values in recorded.items()}
    ceilings_measured = recorded.pop("ceilings", None)
    gpu_measured = bool(benchmarks) or any(s.startswith("cuda") for s in recorded) or bool(ceilings_measured) \
        or any(k.startswith("cuda") or k == "kernel_swap_changes_top1_token"
               for k in recorded.get("torch_port", {}))

    if ceilings_measured:
        ceilings = dict(manifest.get("ceilings") or {})
        ceilings.update(ceilings_measured)
        ceilings["flops_per_element"] = FLOPS_PER_ELEMENT
        sheet = DATASHEET.get(stamp["device"])
        if sheet:
            ceilings["datasheet"] = sheet
        manifest["ceilings"] = ceilings
        provenance["ceilings"] = stamp

    if benchmarks:
        copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
        new_entries = sweep_entries(benchmarks, copy_TBps)
        merged = {case_key(e): e for e in manifest.get("sweep") or []}
        merged.update({case_key(e): e for e in new_entries})
        manifest["sweep"] = sorted(merged.values(),
                                   key=lambda e: (e["dtype"], e["V"], e["B"], _kernel_rank(e["kernel"])))
        manifest["targets"] = target_report(manifest["sweep"])
        provenance["targets"] = stamp
        points = kernel_points(new_entries)
        if points:
            kernels = manifest["softmax_kernels"]
            for name, point in points.items():
                kernels[name] = point
            provenance["softmax_kernels"] = stamp
        provenance["sweep"] = stamp

    for section, values in recorded.items():
        target = manifest.setdefault(section, {})
        for key, value in values.items():
            target[key] = value
            provenance[f"{section}.{key}"] = stamp

    if gpu_measured and environment.get("gpu"):
        manifest["gpu"] = environment["gpu"]
        manifest["versions"] = {k: environment["versions"].get(k) for k in ("python", "torch", "triton", "cupy")}
        provenance["gpu"] = stamp
    return manifest


def validate(manifest: dict, schema_path: Path = SCHEMA_PATH) -> None:
    """Validate against the project's copy of the schema (jsonschema is a CPU-suite dependency;
    where it is missing, e.g. on a bare GPU image, validation is left to the CPU suite)."""
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(manifest, json.loads(Path(schema_path).read_text()))


# -- figures -------------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def render_roofline(manifest: dict, path: Path) -> bool:
    """Roofline at the lab point: x = FLOPs per byte the kernel moves by design, y = TFLOP/s.
    Returns False (and writes nothing) when the manifest lacks the measurements."""
    ceilings = manifest.get("ceilings") or {}
    copy_TBps, fp32_TFLOPS = ceilings.get("hbm_copy_TBps"), ceilings.get("fp32_TFLOPS")
    B, V, dtype = LAB_POINT
    points = [e for e in manifest.get("sweep") or [] if (e["B"], e["V"], e["dtype"]) == (B, V, dtype)
              and e["kernel"] != "torch_compile"]
    if not (copy_TBps and fp32_TFLOPS and points):
        return False
    flops = FLOPS_PER_ELEMENT * B * V
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    x = [2.0 ** k for k in range(-6, 9)]
    ax.plot(x, [min(copy_TBps * xi, fp32_TFLOPS) for xi in x], color="black", lw=1.5,
            label=f"roofline: copy {copy_TBps:.2f} TB/s, fp32 {fp32_TFLOPS:.1f} TFLOP/s (measured)")
    labels: list[list] = []  # [x, y, names]: kernels that land on one spot share one label
    for i, e in enumerate(sorted(points, key=lambda e: _kernel_rank(e["kernel"]))):
        intensity = flops / e["bytes_by_design"]
        achieved = flops / (e["us_median"] * 1e-6) / 1e12
        ax.scatter([intensity], [achieved], s=50, color=f"C{i}", zorder=3,
                   label=f"{e['kernel']}: {e['us_median']:.2f} us")
        for label in labels:
            if abs(math.log(label[0] / intensity)) < 0.1 and abs(math.log(label[1] / achieved)) < 0.15:
                label[2].append(e["kernel"])
                break
        else:
            labels.append([intensity, achieved, [e["kernel"]]])
    for x, y, names in labels:
        ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved by design)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"softmax, (B, V) = ({B}, {V}) fp32, {manifest['gpu'].get('model')}")
    ax.text(0.01, 0.01, f"{FLOPS_PER_ELEMENT} FLOPs per element (max, subtract, exp, sum, scale); "
            "2.4 MB per pass sits in L2, L2 flushed between launches",
            transform=ax.transAxes, fontsize=7, va="bottom")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    _save(fig, path)
    return True


def render_bandwidth(manifest: dict, path: Path) -> bool:
    """Achieved GB/s (one read + one write of the matrix) per shape, one panel per dtype."""
    sweep = manifest.get("sweep") or []
    copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
    if not sweep:
        return False
    dtypes = sorted({e["dtype"] for e in sweep}, key=lambda d: d != "float32")
    plt = _pyplot()
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(11, 4.2 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        entries = [e for e in sweep if e["dtype"] == dtype]
        shapes = sorted({(e["V"], e["B"]) for e in entries})
        where = {s: i for i, s in enumerate(shapes)}
        kernels = sorted({e["kernel"] for e in entries}, key=_kernel_rank)
        for kernel in kernels:
            mine = sorted((e for e in entries if e["kernel"] == kernel), key=lambda e: where[(e["V"], e["B"])])
            ax.plot([where[(e["V"], e["B"])] for e in mine], [e["GBps"] for e in mine], marker="o",
                    ms=4, lw=1, label=kernel, color=f"C{_kernel_rank(kernel)}")
        if copy_TBps:
            ax.axhline(copy_TBps * 1e3, color="black", ls="--", lw=1, label=f"copy {copy_TBps:.2f} TB/s")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"V={v}\nB={b}" for v, b in shapes], fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel("GB/s (read + write once)")
        ax.set_title(f"{dtype}: achieved bandwidth per shape ({manifest['gpu'].get('model')})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    _save(fig, path)
    return True


def _save(fig, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    _pyplot().close(fig)
    write_atomic(Path(path), buffer.getvalue())


# -- the entry point the conftest calls -----------------------------------------------------------------

def write_reports(out_dir: Path, *, benchmarks: list[dict], recorded: dict[str, dict],
                  environment: dict, today: str | None = None) -> list[Path]:
    """Update manifest.json (and the figures, when this run measured kernels) in `out_dir`.
    Returns the paths written. Nothing is written when the run measured nothing."""
    if not benchmarks and not recorded:
        return []
    out_dir = Path(out_dir)
    manifest_path = out_dir / "manifest.json"
    manifest = build_manifest(read_manifest(manifest_path), benchmarks=benchmarks, recorded=recorded,
                              environment=environment, today=today)
    validate(manifest)
    write_atomic(manifest_path, (json.dumps(manifest, indent=1, allow_nan=False) + "\n").encode())
    written = [manifest_path]
    if benchmarks:
        for name, render in (("roofline.png", render_roofline), ("bandwidth.png", render_bandwidth)):
            if render(manifest, out_dir / name):
                written.append(out_dir / name)
    return written
