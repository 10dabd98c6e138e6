"""reports/manifest.json from what a run measured: built from raw records, merged with the
manifest already there, validated against reports/manifest.schema.json, and written only when
something in it changed.

Plain functions on plain records, so they are tested on synthetic data on the CPU. A benchmark
record (tests/suite/records.py) holds raw values only; every ratio in the manifest (GB/s,
fraction of copy bandwidth, speed relative to F.softmax, per call mode) is derived here, once,
from the complete set of entries, so no number depends on the order in which cases ran.
"""

import datetime
import functools
import json
import math
import os
import platform
import tempfile
from pathlib import Path

from kernels.spec import BASELINE, LAB_POINT, matrix_bytes, names
from tests.suite.devicetime import CALL_MODES, MODES

EXPERIMENT = "24-triton-and-pytorch"
SEED = 42
# From the kernels' specs (kernels/spec.py): the order tables and figures list kernels in, the
# kernels whose lab point the lab contract's softmax_kernels section requires, those whose
# autotune choice it reports, and the fast kernels held to the large-vocabulary targets.
KERNEL_ORDER = names()
REQUIRED_KERNELS = names(lambda s: s.lab_contract)
AUTOTUNED_KERNELS = names(lambda s: s.autotuned)
TARGET_KERNELS = names(lambda s: s.gated)
REPORTS_DIR = Path(__file__).resolve().parents[2] / "reports"
SCHEMA_PATH = REPORTS_DIR / "manifest.schema.json"
# softmax_kernels' key for a kernel's device time at the lab point (kernels/spec.py LAB_POINT:
# V and dtype too), spelled as the lab's contract spells it; the schema says which point it is.
LAB_POINT_KEY = "us_at_B512"
# Keys that earlier manifests wrote under other names, old -> new: what a key held is unchanged.
# `upgrade` applies the map, so that the manifests a baseline or a merge reads keep working.
RENAMED_KEYS = {
    "softmax_kernels": {"us_at_B512_V600_fp32": LAB_POINT_KEY, "frac_of_hbm_peak": "frac_of_copy_bw"},
    "torch_port": {"allclose_to_numpy_at_fp32_cpu": "byte_equivalence_at_fp32_cpu"},
}

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


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write `data` unless the file already holds exactly it: a run that measured the same
    values leaves committed reports untouched. Returns whether it wrote."""
    try:
        if Path(path).read_bytes() == data:
            return False
    except OSError:
        pass
    write_atomic(path, data)
    return True


def read_manifest(path: Path) -> dict | None:
    """The manifest already on disk, or None if there is none or it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def serialise(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1, allow_nan=False) + "\n").encode()


def _json(value) -> str:
    """A value as JSON writes it: two values are the same exactly when these strings are."""
    return json.dumps(value, sort_keys=True, allow_nan=True)


def upgrade(manifest: dict) -> dict:
    """A copy of a manifest written under earlier key names, in today's names: RENAMED_KEYS, and
    sweep entries as `upgrade_plan` says."""
    manifest = json.loads(json.dumps(manifest))

    def renamed(entry, renames):  # in place of the old key, so the order stays the writer's
        if not isinstance(entry, dict):
            return entry
        return {renames.get(k, k) if renames.get(k, k) not in entry else k: v for k, v in entry.items()}

    for section, renames in RENAMED_KEYS.items():
        values = manifest.get(section)
        if section == "softmax_kernels" and isinstance(values, dict):
            manifest[section] = {kernel: renamed(point, renames) for kernel, point in values.items()}
        elif isinstance(values, dict):
            manifest[section] = renamed(values, renames)
    # A renamed value's provenance ("section.key") follows it; where the new name has its own, the
    # old one describes nothing and goes.
    if isinstance(manifest.get("provenance"), dict):
        provenance = {}
        for key, stamp in manifest["provenance"].items():
            section, _, rest = key.partition(".")
            new_key = f"{section}.{RENAMED_KEYS.get(section, {}).get(rest, rest)}" if rest else key
            if new_key == key or new_key not in manifest["provenance"]:
                provenance[new_key] = stamp
        manifest["provenance"] = provenance
    for e in manifest.get("sweep") or []:
        upgrade_plan(e)
    return manifest


def upgrade_plan(entry: dict) -> dict:
    """A sweep entry or benchmark record whose `plan` is fused's size-class description, as
    earlier runs recorded it ("row(cluster=1, ...)"), with `plan` the path name and `size_class`
    the description, in place. A description starts with its path's name (warpvec's said "warp(...,
    16-byte vectors)" before it did: it is renamed so). Anything else is left as it is."""
    plan = entry.get("plan")
    if isinstance(plan, str) and "(" in plan:
        path, _, shape = plan.partition("(")
        if path == "warp" and "16-byte vectors" in plan:
            path = "warpvec"
        entry["plan"] = path
        entry.setdefault("size_class", f"{path}({shape}")
    return entry


def case_key(record: dict) -> tuple:
    return (record["kernel"], int(record["B"]), int(record["V"]), record["dtype"])


def kernel_rank(name: str) -> int:
    return KERNEL_ORDER.index(name) if name in KERNEL_ORDER else len(KERNEL_ORDER)


def _case_order(entry: dict) -> tuple:
    return (entry["dtype"], entry["V"], entry["B"], kernel_rank(entry["kernel"]), entry["kernel"])


def software_versions() -> dict:
    """Versions of what the suite runs on: the imported module's own version, else the installed
    distribution's (read without importing it: a pytest process that imported no torch, such as
    the xdist controller or a child run of the suite's own tests, is spared a second of import);
    None for a package that is not installed."""
    import importlib.metadata
    import sys

    versions = {"python": platform.python_version()}
    providers = None
    for name in ("torch", "triton", "cupy", "numpy"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if version is None:
            # The distribution's name may differ from the import name (cupy-cuda12x provides cupy).
            providers = importlib.metadata.packages_distributions() if providers is None else providers
            for distribution in providers.get(name, ()):
                try:
                    version = importlib.metadata.version(distribution)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
        versions[name] = None if version is None else str(version)
    return versions


def run_environment(gpu: dict | None, args) -> dict:
    """What the manifest needs to know about the run: the GPU it measured on (None on a CPU
    run), the software versions, and the command line."""
    command = "pytest " + " ".join(args)
    return {"gpu": gpu, "versions": software_versions(), "command": command.strip()}


# -- the device-time sweep -----------------------------------------------------------------------

_CASE_AND_TIMES = ("kernel", "B", "V", "dtype", "us_median", "us_min", "us_max")
# plan: the dispatch path the case took (the kernel's plan(B, V, dtype)); size_class: fused's
# size class within that path (kernels/cuda_plans.py FusedClass.describe()); copy_same_bytes_us:
# a copy of the case's own matrix (one read, one write, L2 flushed), where a copy goal applies.
SWEEP_EXTRAS = ("plan", "size_class", "autotune_picked", "read_TBps_over_copy", "copy_same_bytes_us")
_SWEEP_RAW = (*_CASE_AND_TIMES, "bytes_by_design", *SWEEP_EXTRAS)


def _records(benchmarks: list[dict], mode: str) -> list[dict]:
    return [r for r in benchmarks if "kernel" in r and r.get("mode", "device") == mode]


def raw_sweep_entry(record: dict) -> dict:
    """The raw values of one device-time record, as the sweep stores them."""
    entry = {
        "kernel": record["kernel"],
        "B": int(record["B"]),
        "V": int(record["V"]),
        "dtype": record["dtype"],
        "us_median": record["us_median"],
        "us_min": record["us_min"],
        "us_max": record["us_max"],
        "bytes_by_design": record["bytes"],
    }
    for extra in SWEEP_EXTRAS:
        if record.get(extra) is not None:
            entry[extra] = record[extra]
    return entry


def derive_sweep(entries: list[dict], copy_TBps: float | None) -> list[dict]:
    """Sweep entries with GB/s (one read + one write of the matrix), the fraction of the measured
    copy bandwidth and the speed relative to F.softmax at the same shape, recomputed from the
    raw values of these entries alone. Key order is fixed, so equal values serialise equally."""
    raw = [{k: e[k] for k in _SWEEP_RAW if k in e} for e in entries]
    baseline = {case_key(e)[1:]: e["us_median"] for e in raw if e["kernel"] == BASELINE}
    derived = []
    for e in sorted(raw, key=_case_order):
        entry = {k: e[k] for k in _CASE_AND_TIMES}
        entry["GBps"] = matrix_bytes(e["B"], e["V"], e["dtype"]) / (e["us_median"] * 1e-6) / 1e9
        entry["bytes_by_design"] = e["bytes_by_design"]
        if copy_TBps:
            entry["frac_of_copy_bw"] = entry["GBps"] / (copy_TBps * 1e3)
            if "copy_same_bytes_us" in e:
                # How near the ceiling a copy of this size gets: its ramp and tail are paid by
                # any kernel of these bytes.
                entry["same_bytes_copy_frac"] = entry["frac_of_copy_bw"] * e["us_median"] / e["copy_same_bytes_us"]
        reference = baseline.get(case_key(e)[1:])
        if reference is not None:
            entry["frac_of_F_softmax"] = reference / e["us_median"]
        for extra in SWEEP_EXTRAS:
            if extra in e:
                entry[extra] = e[extra]
        derived.append(entry)
    return derived


def sweep_entries(benchmarks: list[dict], copy_TBps: float | None) -> list[dict]:
    """One sweep entry per device-time record of one run, ratios derived within that run."""
    return derive_sweep([raw_sweep_entry(r) for r in _records(benchmarks, "device")], copy_TBps)


def kernel_points(sweep: list[dict]) -> dict:
    """The lab contract's per-kernel figures at the lab point (kernels/spec.py LAB_POINT)."""
    B, V, dtype = LAB_POINT
    points = {}
    for e in sweep:
        if (e["B"], e["V"], e["dtype"]) != (B, V, dtype):
            continue
        point = {LAB_POINT_KEY: e["us_median"], "frac_of_F_softmax": e.get("frac_of_F_softmax")}
        if "frac_of_copy_bw" in e:
            point["frac_of_copy_bw"] = e["frac_of_copy_bw"]
        if "autotune_picked" in e or e["kernel"] in AUTOTUNED_KERNELS:  # the lab contract requires theirs
            point["autotune_picked"] = e.get("autotune_picked") or {"BLOCK": None, "num_warps": None}
        points[e["kernel"]] = point
    return points


# -- large-vocabulary targets -----------------------------------------------------------------------

# The speed goals of the gated kernels (TARGET_KERNELS), device time, every figure from one run:
# - every shape: at least F.softmax's speed;
# - decode (B <= DECODE_MAX_B): Triton at least 1.5 x F.softmax;
# - large shapes (B >= LARGE_MIN_B, moving >= TARGET_MIN_BYTES, V <= LARGE_MAX_V): a fraction of
#   the measured copy bandwidth per kernel, and Triton at least 0.95 x fused at the same shape
#   (the 10^6 vocabulary is held to F.softmax's speed only);
# - the lab's shape in bfloat16, (32768, 600), which moves 79 MB: Triton at 0.80 of copy.
# QuACK's bf16 softmax reaches 0.88 of copy at large shapes on the H100: drawn as an anchor.
TARGET_MIN_BYTES = 100e6
LARGE_MIN_B, LARGE_MAX_V, DECODE_MAX_B = 1024, 262144, 64
LARGE_COPY_GOAL = {"fused": 0.90, "triton": 0.88}  # another gated kernel: the stricter of the two
TRITON_X_FUSED = 0.95
DECODE_X_F_SOFTMAX = {"triton": 1.5}
SHAPE_COPY_GOALS = {(32768, 600, "bfloat16"): {"triton": 0.80}}
QUACK_BF16_COPY_FRACTION = 0.88


def is_large(B: int, V: int, dtype: str) -> bool:
    return B >= LARGE_MIN_B and V <= LARGE_MAX_V and matrix_bytes(B, V, dtype) >= TARGET_MIN_BYTES


def copy_goal(kernel: str, B: int, V: int, dtype: str) -> float | None:
    """The fraction of copy bandwidth a gated kernel should reach at this shape, if any."""
    if kernel not in TARGET_KERNELS:
        return None
    special = SHAPE_COPY_GOALS.get((B, V, dtype), {})
    if kernel in special:
        return special[kernel]
    if is_large(B, V, dtype):
        return LARGE_COPY_GOAL.get(kernel, max(LARGE_COPY_GOAL.values()))
    return None


def forward_goals(kernel: str, B: int, V: int, dtype: str) -> dict[str, float]:
    """{measure: goal} for one sweep case of a gated kernel: frac_of_F_softmax, frac_of_copy_bw
    and x_fused (its speed over fused's at the same shape)."""
    goals = {"frac_of_F_softmax": DECODE_X_F_SOFTMAX.get(kernel, 1.0) if B <= DECODE_MAX_B else 1.0}
    copy = copy_goal(kernel, B, V, dtype)
    if copy is not None:
        goals["frac_of_copy_bw"] = copy
    if kernel == "triton" and is_large(B, V, dtype):
        goals["x_fused"] = TRITON_X_FUSED
    return goals


def target_report(sweep: list[dict]) -> dict:
    """Which sweep cases of the gated kernels meet their goals (forward_goals), and why each
    miss misses."""
    fused = {case_key(e)[1:]: e["us_median"] for e in sweep if e["kernel"] == "fused"}
    checked, misses = 0, []
    for e in sweep:
        if e["kernel"] not in TARGET_KERNELS or "frac_of_F_softmax" not in e:
            continue
        checked += 1
        goals = forward_goals(e["kernel"], e["B"], e["V"], e["dtype"])
        measured = {k: e.get(k) for k in ("frac_of_F_softmax", "frac_of_copy_bw")}
        if "x_fused" in goals and case_key(e)[1:] in fused:
            measured["x_fused"] = fused[case_key(e)[1:]] / e["us_median"]
        why = [
            f"{measured[k]:.3f} {GOAL_WORDS[k]} (goal {goal}{_same_bytes_note(e) if k == 'frac_of_copy_bw' else ''})"
            for k, goal in goals.items()
            if measured.get(k) is not None and measured[k] < goal
        ]
        if why:
            misses.append({"kernel": e["kernel"], "B": e["B"], "V": e["V"], "dtype": e["dtype"], "why": "; ".join(why)})
    large = LARGE_COPY_GOAL
    shapes = "".join(
        f"; {kernel} >= {goal} of copy at ({B}, {V}) {dtype}"
        for (B, V, dtype), goals in SHAPE_COPY_GOALS.items()
        for kernel, goal in goals.items()
    )
    return {
        "rule": f">= 1.0 x F.softmax at every shape, triton >= {DECODE_X_F_SOFTMAX['triton']} x at B <= "
        f"{DECODE_MAX_B}; where B >= {LARGE_MIN_B}, V <= {LARGE_MAX_V} and a shape moves >= "
        f"{TARGET_MIN_BYTES / 1e6:.0f} MB: fused >= {large['fused']} of copy, triton >= {large['triton']} of copy "
        f"and >= {TRITON_X_FUSED} x fused{shapes}",
        "cases_checked": checked,
        "cases_missed": len(misses),
        "missed": misses,
    }


GOAL_WORDS = {"frac_of_F_softmax": "x F.softmax", "frac_of_copy_bw": "of copy", "x_fused": "x fused"}


def _same_bytes_note(entry: dict) -> str:
    """What a copy of the missed case's own bytes reached, where it was timed."""
    frac = entry.get("same_bytes_copy_frac")
    return "" if frac is None else f"; a copy of the same bytes: {frac:.3f}"


# -- call modes: per-call wall time and CUDA-graph replay ------------------------------------------------


def raw_call_entries(benchmarks: list[dict]) -> list[dict]:
    """{kernel, B, V, dtype, per_call_us, graph_us} (medians) from per_call / graph records."""
    entries: dict[tuple, dict] = {}
    for mode in CALL_MODES:
        for r in _records(benchmarks, mode):
            entry = entries.setdefault(case_key(r), dict(zip(("kernel", "B", "V", "dtype"), case_key(r), strict=True)))
            entry[f"{mode}_us"] = r["us_median"]
    return list(entries.values())


def raw_floors(benchmarks: list[dict]) -> dict[str, dict]:
    """{floor name: {device_us, per_call_us, graph_us}} from the launch-floor records."""
    floors: dict[str, dict] = {}
    for r in benchmarks:
        if "floor" in r and r.get("mode") in MODES:
            floors.setdefault(r["floor"], {})[f"{r['mode']}_us"] = r["us_median"]
    return floors


def derive_call_modes(entries: list[dict], floors: dict[str, dict], sweep: list[dict]) -> dict:
    """The call_modes section: each entry's device time from the sweep (same kernel, shape and
    dtype) and, per mode, its speed relative to F.softmax measured the same way."""
    device = {case_key(e): e["us_median"] for e in sweep}
    raw = [{k: e[k] for k in ("kernel", "B", "V", "dtype", "per_call_us", "graph_us") if k in e} for e in entries]
    by_key = {case_key(e): e for e in raw}
    derived = []
    for e in sorted(raw, key=_case_order):
        key = case_key(e)
        entry = dict(e)
        if key in device:
            entry["device_us"] = device[key]
        baseline_key = (BASELINE, *key[1:])
        baseline = {**by_key.get(baseline_key, {})}
        if baseline_key in device:
            baseline["device_us"] = device[baseline_key]
        ratios = {
            mode: baseline[f"{mode}_us"] / entry[f"{mode}_us"]
            for mode in MODES
            if f"{mode}_us" in entry and f"{mode}_us" in baseline
        }
        if ratios:
            entry["x_F_softmax"] = ratios
        derived.append(
            {
                k: entry[k]
                for k in ("kernel", "B", "V", "dtype", "device_us", "per_call_us", "graph_us", "x_F_softmax")
                if k in entry
            }
        )
    floors = {
        name: {k: values[k] for k in ("device_us", "per_call_us", "graph_us") if k in values}
        for name, values in sorted(floors.items())
    }
    return {"entries": derived, "floors": floors}


# -- byte equivalence --------------------------------------------------------------------------------------


def nest_byte_equivalence(recorded: dict) -> dict[tuple, dict]:
    """{(kernel, dtype, property): {verdict, shapes}} from recorded "kernel/dtype/property" keys,
    shapes sorted so the same set always serialises the same way."""
    nested = {}
    for key, value in recorded.items():
        parts = key.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"byte_equivalence key {key!r} is not '<kernel>/<dtype>/<property>'")
        if not isinstance(value, dict):
            raise ValueError(f"byte_equivalence {key!r}: expected {{'verdict': ..., 'shapes': [...]}}, got {value!r}")
        nested[tuple(parts)] = {
            "verdict": value.get("verdict"),
            "shapes": sorted([int(b), int(v)] for b, v in value.get("shapes") or []),
        }
    return nested


# -- accuracy ----------------------------------------------------------------------------------------

# Where an accuracy figure was measured: on the GPU ("cuda") or on the CPU ("cpu": Triton's
# interpreter and F.softmax there). A case lives under its device, so a CPU run never overwrites
# what a GPU measured (nor the reverse).
ACCURACY_DEVICES = ("cpu", "cuda")


def nest_accuracy(recorded: dict) -> dict[tuple, dict[tuple, dict]]:
    """{(device, kernel, dtype): {(recipe, scale, V): entry}} from recorded
    "device/kernel/dtype/<recipe> x<scale>/V" keys; each entry gains recipe, scale and V."""
    nested: dict[tuple, dict[tuple, dict]] = {}
    for key, value in recorded.items():
        parts = key.split("/")
        if len(parts) != 5 or not all(parts) or parts[0] not in ACCURACY_DEVICES or " x" not in parts[3]:
            raise ValueError(
                f"accuracy key {key!r} is not '<{'|'.join(ACCURACY_DEVICES)}>/<kernel>/<dtype>/<recipe> x<scale>/<V>'"
            )
        if not isinstance(value, dict):
            raise ValueError(f"accuracy {key!r}: expected a dict of figures, got {value!r}")
        device, kernel, dtype, case, V = parts
        recipe, _, scale = case.rpartition(" x")
        case_key = (recipe, float(scale), int(V))
        nested.setdefault((device, kernel, dtype), {})[case_key] = {
            "recipe": recipe,
            "scale": float(scale),
            "V": int(V),
            **{k: _finite_or_none(v) for k, v in value.items()},
        }
    return nested


def _accuracy_case(entry: dict) -> tuple:
    return (entry["recipe"], float(entry["scale"]), int(entry["V"]))


def merge_accuracy(previous: list | None, measured: dict[tuple, dict]) -> list[dict]:
    """Previous entries of one (device, kernel, dtype), updated by this run's, in case order."""
    cases = {_accuracy_case(e): e for e in previous or []}
    cases.update(measured)
    return [cases[k] for k in sorted(cases)]


# -- the softmax backward and cross-entropy: fwd+bwd timings --------------------------------------------
#
# Benchmark records of these operations carry "op" (not "kernel", so the softmax sweep never sees
# them): op, impl (a name of kernels.CROSS_ENTROPY_KERNELS / SOFTMAX_BACKWARD_KERNELS), N, V,
# dtype, mode, bytes (moved by design: cross-entropy reads the logits and writes the gradient,
# the backward reads dy and y and writes dx) and, in device mode, peak_extra_bytes (allocated
# beyond the inputs during one call). Each section's ratios are derived here from its entries.

LOSS_OPS = {
    # op: (manifest section, PyTorch eager baseline, passes over the matrix by design)
    "cross_entropy": ("cross_entropy_timing", "F_cross_entropy", 2),
    # the same op with a weight per class and label smoothing (tests/test_loss_benchmarks.py)
    "weighted_cross_entropy": ("weighted_cross_entropy_timing", "F_cross_entropy", 2),
    "softmax_backward": ("softmax_backward_timing", "softmax_backward_data", 3),
}
LOSS_COMPILED = "torch_compile"


def registry_op(op: str) -> str:
    """The registry's operation (kernels/spec.py OPS) a timed training op runs: weights and
    smoothing are options of the cross-entropy."""
    return op.removeprefix("weighted_")


# Every implementation that is none of these is ours (the registries' own kernels, whatever
# their names): held to the goals, drawn first.
LOSS_BASELINES = frozenset({eager for _, eager, _ in LOSS_OPS.values()} | {LOSS_COMPILED})


def loss_ours(impls) -> tuple[str, ...]:
    """Our implementations among `impls`, in registry order."""
    return tuple(sorted({i for i in impls if i not in LOSS_BASELINES}, key=lambda k: (kernel_rank(k), k)))


# Our kernels' goals at every timed shape, per registry op (registry_op: weights and smoothing
# change none of them): a fraction of the one-read-one-write (cross-entropy) or
# two-read-one-write (backward) floor at the measured copy speed, speed over PyTorch eager and
# torch.compile, and for the cross-entropy the memory it takes beyond its inputs.
LOSS_GOALS = {
    "cross_entropy": {"frac_of_copy_bw": 0.80, "x_eager": 2.0, "x_compiled": 1.3, "peak_extra_over_matrix": 1.0},
    "softmax_backward": {"frac_of_copy_bw": 0.85, "x_compiled": 1.0},
}
# Rows longer than this do not fit on one chip's shared memory, even a cluster's (sm_90); the
# cross-entropy then reads them twice, and its goal is this fraction of the floor instead.
ON_CHIP_MAX_V = 262144
OFF_CHIP_COPY_GOAL = {"cross_entropy": 0.60}


def loss_goals(op: str, V: int) -> dict[str, float]:
    """{measure: goal} for our kernel of `op` (a LOSS_OPS key) at row length V."""
    goals = dict(LOSS_GOALS[registry_op(op)])
    if V > ON_CHIP_MAX_V and registry_op(op) in OFF_CHIP_COPY_GOAL:
        goals["frac_of_copy_bw"] = OFF_CHIP_COPY_GOAL[registry_op(op)]
    return goals


def _loss_key(entry: dict) -> tuple:
    return (entry["impl"], int(entry["N"]), int(entry["V"]), entry["dtype"])


def raw_loss_entries(benchmarks: list[dict], op: str) -> list[dict]:
    """{impl, N, V, dtype, bytes_by_design, device_us, per_call_us, graph_us, peak_extra_bytes}
    (medians) from one run's records of `op`."""
    entries: dict[tuple, dict] = {}
    for r in benchmarks:
        if r.get("op") != op:
            continue
        key = (r["impl"], int(r["N"]), int(r["V"]), r["dtype"])
        entry = entries.setdefault(key, dict(zip(("impl", "N", "V", "dtype"), key, strict=True)))
        entry[f"{r.get('mode', 'device')}_us"] = r["us_median"]
        if r.get("bytes") is not None:
            entry["bytes_by_design"] = int(r["bytes"])
        if r.get("peak_extra_bytes") is not None:
            entry["peak_extra_bytes"] = int(r["peak_extra_bytes"])
    return list(entries.values())


def derive_loss_section(entries: list[dict], op: str, copy_TBps: float | None) -> dict:
    """Entries with GB/s, fraction of copy bandwidth, and per mode the speed relative to PyTorch
    eager and to torch.compile at the same shape; then the goals report for our kernel."""
    _, eager, passes = LOSS_OPS[op]
    raw = {_loss_key(e): dict(e) for e in entries}
    derived = []
    for key in sorted(raw, key=lambda k: (k[3], k[2], k[1], k[0])):
        e = raw[key]
        entry = {k: e[k] for k in ("impl", "N", "V", "dtype") if k in e}
        for k in ("device_us", "per_call_us", "graph_us", "bytes_by_design", "peak_extra_bytes"):
            if k in e:
                entry[k] = e[k]
        if "device_us" in e:
            nbytes = matrix_bytes(e["N"], e["V"], e["dtype"], passes=passes)
            entry["GBps"] = nbytes / (e["device_us"] * 1e-6) / 1e9
            if copy_TBps:
                entry["frac_of_copy_bw"] = entry["GBps"] / (copy_TBps * 1e3)
        if "peak_extra_bytes" in e:
            entry["peak_extra_over_matrix"] = e["peak_extra_bytes"] / matrix_bytes(e["N"], e["V"], e["dtype"], passes=1)
        for name, label in ((eager, "x_eager"), (LOSS_COMPILED, "x_compiled")):
            other = raw.get((name, *key[1:]))
            if other is None or name == key[0]:
                continue
            ratios = {
                mode: other[f"{mode}_us"] / e[f"{mode}_us"]
                for mode in MODES
                if f"{mode}_us" in e and f"{mode}_us" in other
            }
            if ratios:
                entry[label] = ratios
        derived.append(entry)
    return {"entries": derived, "goals": loss_goal_report(derived, op)}


def loss_goal_report(entries: list[dict], op: str) -> dict:
    checked, misses = 0, []
    for e in entries:
        if e["impl"] in LOSS_BASELINES:
            continue
        checked += 1
        goals, why = loss_goals(op, e["V"]), []
        if "frac_of_copy_bw" in e and e["frac_of_copy_bw"] < goals["frac_of_copy_bw"]:
            why.append(f"{e['frac_of_copy_bw']:.3f} of copy (goal {goals['frac_of_copy_bw']})")
        for label in ("x_eager", "x_compiled"):
            goal = goals.get(label)
            got = (e.get(label) or {}).get("device")
            if goal and got is not None and got < goal:
                why.append(f"{got:.3f} x {label.removeprefix('x_')} (goal {goal})")
        goal = goals.get("peak_extra_over_matrix")
        if goal and e.get("peak_extra_over_matrix", 0.0) > goal * 1.01:
            why.append(f"peak {e['peak_extra_over_matrix']:.2f} x the matrix beyond the inputs (goal {goal})")
        if why:
            misses.append({"impl": e["impl"], "N": e["N"], "V": e["V"], "dtype": e["dtype"], "why": "; ".join(why)})
    goals, off_chip = LOSS_GOALS[registry_op(op)], OFF_CHIP_COPY_GOAL.get(registry_op(op))
    beyond = {"frac_of_copy_bw": f" ({off_chip} where V > {ON_CHIP_MAX_V})"} if off_chip else {}
    rule = ", ".join(f"{k} >= {v}{beyond.get(k, '')}" for k, v in goals.items() if k != "peak_extra_over_matrix")
    if "peak_extra_over_matrix" in goals:
        rule += f", peak memory beyond the inputs <= {goals['peak_extra_over_matrix']} x the matrix"
    return {
        "rule": f"{', '.join(loss_ours(e['impl'] for e in entries))} (device time): {rule}",
        "cases_checked": checked,
        "cases_missed": len(misses),
        "missed": misses,
    }


def _merge_loss_timings(manifest: dict, benchmarks: list[dict], touched: dict) -> None:
    copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
    for op, (section, _, _) in LOSS_OPS.items():
        new = raw_loss_entries(benchmarks, op)
        if not new:
            continue
        merged = {_loss_key(e): dict(e) for e in ((manifest.get(section) or {}).get("entries") or [])}
        for e in new:
            merged.setdefault(_loss_key(e), {}).update(e)
        manifest[section] = derive_loss_section(list(merged.values()), op, copy_TBps)
        touched[section] = (section,)


# -- building the manifest -----------------------------------------------------------------------


def empty_manifest(today: str) -> dict:
    """A schema-valid manifest with nothing measured (nulls are placeholders)."""
    point = {LAB_POINT_KEY: None, "frac_of_F_softmax": None}
    return {
        "experiment": EXPERIMENT,
        "date": today,
        "seed": SEED,
        "gpu": {"model": None, "compute_capability": None},
        "versions": {"python": platform.python_version(), "torch": None, "triton": None, "cupy": None},
        "softmax_kernels": {
            k: {**point, "autotune_picked": {"BLOCK": None, "num_warps": None}}
            if k in AUTOTUNED_KERNELS
            else dict(point)
            for k in REQUIRED_KERNELS
        },
        "torch_port": {
            "byte_equivalence_at_fp32_cpu": None,
            "max_abs_diff_to_numpy_reference": None,
            "kernel_swap_changes_top1_token": None,
        },
        "provenance": {},
    }


def provenance_stamp(environment: dict, today: str) -> dict:
    """When, where ("cpu" or the GPU's name) and with what a section was measured."""
    versions = {k: v for k, v in (environment.get("versions") or {}).items() if v is not None}
    return {
        "date": today,
        "device": (environment.get("gpu") or {}).get("model") or "cpu",
        "versions": versions,
        "command": environment.get("command"),
    }


def _value_at(manifest: dict | None, path: tuple):
    if path == ("gpu",):  # the GPU and the versions it was measured with are one fact
        return [(manifest or {}).get("gpu"), (manifest or {}).get("versions")]
    value = manifest
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def build_manifest(
    previous: dict | None,
    *,
    benchmarks: list[dict],
    recorded: dict[str, dict],
    environment: dict,
    today: str | None = None,
) -> dict:
    """Merge this run's measurements into the previous manifest.

    What this run did not measure keeps its earlier value and provenance: a laptop
    `pytest -m cpu` must not wipe numbers measured on a GPU. What it did measure gets a new
    provenance stamp only where the value actually changed (compared as JSON writes it), and
    the top-level date moves only when some stamp did, so re-measuring the same values leaves
    the manifest byte-identical. `environment` has `gpu` ({model, compute_capability} or None
    on a CPU run), `versions` and `command`.
    """
    today = today or datetime.date.today().isoformat()
    manifest = empty_manifest(today)
    if previous:
        previous = upgrade(previous)
        manifest.update(json.loads(json.dumps(previous)))
    manifest["experiment"], manifest["seed"] = EXPERIMENT, SEED
    gpu = environment.get("gpu") or {}
    touched: dict[str, tuple] = {}  # provenance key -> where its value lives in the manifest

    # A NaN or inf cannot go into JSON; it is stored as null and the test that recorded it fails.
    recorded = {section: {k: _finite_or_none(v) for k, v in values.items()} for section, values in recorded.items()}
    ceilings_measured = recorded.pop("ceilings", None)
    byte_equivalence = nest_byte_equivalence(recorded.pop("byte_equivalence", {}))
    accuracy = nest_accuracy(recorded.pop("accuracy", {}))
    gpu_measured = (
        bool(benchmarks)
        or bool(ceilings_measured)
        or bool(byte_equivalence)
        or any(device == "cuda" for device, _, _ in accuracy)
        or any(s.startswith("cuda") for s in recorded)
        or any(k.startswith("cuda") or k == "kernel_swap_changes_top1_token" for k in recorded.get("torch_port", {}))
    )

    if gpu_measured and gpu.get("model"):
        drop_other_gpus(manifest, gpu["model"], empty_manifest(today))

    if ceilings_measured:
        ceilings = dict(manifest.get("ceilings") or {})
        ceilings.update(ceilings_measured)
        ceilings["flops_per_element"] = FLOPS_PER_ELEMENT
        sheet = DATASHEET.get(gpu.get("model"))
        if sheet:
            ceilings["datasheet"] = sheet
        manifest["ceilings"] = ceilings
        touched["ceilings"] = ("ceilings",)

    if benchmarks or ceilings_measured:
        _merge_timings(manifest, benchmarks, touched)
        _merge_loss_timings(manifest, benchmarks, touched)

    for (kernel, dtype, prop), value in byte_equivalence.items():
        manifest.setdefault("byte_equivalence", {}).setdefault(kernel, {}).setdefault(dtype, {})[prop] = value
        touched[f"byte_equivalence.{kernel}.{dtype}.{prop}"] = ("byte_equivalence", kernel, dtype, prop)

    for (device, kernel, dtype), cases in accuracy.items():
        per_kernel = manifest.setdefault("accuracy", {}).setdefault(device, {}).setdefault(kernel, {})
        per_kernel[dtype] = merge_accuracy(per_kernel.get(dtype), cases)
        touched[f"accuracy.{device}.{kernel}.{dtype}"] = ("accuracy", device, kernel, dtype)

    for section, values in recorded.items():
        target = manifest.setdefault(section, {})
        for key, value in values.items():
            target[key] = value
            touched[f"{section}.{key}"] = (section, key)

    if gpu_measured and gpu:
        manifest["gpu"] = gpu
        manifest["versions"] = {k: environment["versions"].get(k) for k in ("python", "torch", "triton", "cupy")}
        touched["gpu"] = ("gpu",)

    provenance = manifest.setdefault("provenance", {})
    stamp = provenance_stamp(environment, today)
    changed = not previous
    for key, path in touched.items():
        if key in provenance and _json(_value_at(previous, path)) == _json(_value_at(manifest, path)):
            continue
        provenance[key] = stamp
        changed = True
    manifest["date"] = today if changed or "date" not in (previous or {}) else previous["date"]
    return manifest


def drop_other_gpus(manifest: dict, model: str, empty: dict) -> None:
    """Remove what the manifest holds from a GPU model other than `model` (its provenance names
    the device): a run on a new GPU model does not carry the old one's timings, ceilings or
    cuda results under its own name, where fractions would be taken of the old copy speed.
    Keys the empty manifest has go back to its placeholders; the others leave, with any folder
    they empty."""
    provenance = manifest.get("provenance") or {}
    for key, stamp in list(provenance.items()):
        if key != "gpu" and (stamp or {}).get("device") not in (None, "cpu", model):
            del provenance[key]
            _drop(manifest, key.split("."), empty)


def _drop(node: dict, path: list[str], empty) -> None:
    head, rest = path[0], path[1:]
    if not isinstance(node, dict) or head not in node:
        return
    kept = isinstance(empty, dict) and head in empty  # the empty manifest has this key
    if rest:
        _drop(node[head], rest, empty[head] if kept else None)
        if node[head] == {} and not kept:
            del node[head]
    elif kept:
        node[head] = json.loads(json.dumps(empty[head]))
    else:
        del node[head]


def _merge_timings(manifest: dict, benchmarks: list[dict], touched: dict) -> None:
    """Merge this run's raw timings with the previous ones (drop_other_gpus has removed another
    GPU model's), then derive every ratio, the lab's kernel points and the targets once, from
    the merged set."""
    previous_sweep = manifest.get("sweep") or []
    previous_calls = manifest.get("call_modes") or {}

    sweep = {case_key(e): e for e in previous_sweep}
    sweep.update({case_key(e): e for e in map(raw_sweep_entry, _records(benchmarks, "device"))})
    copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
    if sweep:
        manifest["sweep"] = derive_sweep(list(sweep.values()), copy_TBps)
        manifest["targets"] = target_report(manifest["sweep"])
        touched["sweep"], touched["targets"] = ("sweep",), ("targets",)
        points = kernel_points(manifest["sweep"])
        if points:
            manifest["softmax_kernels"].update(points)
            touched["softmax_kernels"] = ("softmax_kernels",)

    calls = {case_key(e): dict(e) for e in previous_calls.get("entries") or []}
    for e in raw_call_entries(benchmarks):
        calls.setdefault(case_key(e), {}).update(e)
    floors = {name: dict(values) for name, values in (previous_calls.get("floors") or {}).items()}
    for name, values in raw_floors(benchmarks).items():
        floors.setdefault(name, {}).update(values)
    if calls or floors:
        manifest["call_modes"] = derive_call_modes(list(calls.values()), floors, manifest.get("sweep") or [])
        touched["call_modes"] = ("call_modes",)


@functools.cache
def schema_sections(schema_path: Path = SCHEMA_PATH) -> frozenset:
    """The sections reports/manifest.schema.json describes (its top-level properties); read with
    the json module alone, so the check below holds where jsonschema is not installed."""
    return frozenset(json.loads(Path(schema_path).read_text())["properties"])


def check_section(section: str) -> None:
    """ValueError unless the schema describes `section`: a test recording into a section the
    schema does not describe fails at once, on a GPU image without jsonschema too."""
    if section not in schema_sections():
        raise ValueError(
            f"manifest section {section!r} is not described in {SCHEMA_PATH.name}: add it there "
            f"(README: a new manifest section) or record into one of {', '.join(sorted(schema_sections()))}"
        )


def validate(manifest: dict, schema_path: Path = SCHEMA_PATH) -> None:
    """Validate against the project's copy of the schema (jsonschema is a CPU-suite dependency;
    where it is missing, e.g. on a bare GPU image, validation is left to the CPU suite)."""
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(manifest, json.loads(Path(schema_path).read_text()))


# -- the entry point the conftest calls -----------------------------------------------------------------


def reports_destination(config) -> Path | None:
    """The folder this run writes its reports into, or None for none. Only a run that asks writes
    tracked files: `--benchmark-only` (the run that measures what reports/ states) writes into
    reports/, `--reports-dir DIR` into DIR, and any other run (`pytest -m cpu`, `pytest -m cuda`)
    nowhere, because its figures would rewrite committed ones with no one asking."""
    if config.getoption("no_reports"):
        return None
    if config.getoption("reports_dir"):
        return Path(config.getoption("reports_dir"))
    if config.getoption("benchmark_only", False):
        return REPORTS_DIR
    return None


def write_reports(
    out_dir: Path | None,
    *,
    benchmarks: list[dict],
    recorded: dict[str, dict],
    environment: dict,
    today: str | None = None,
    start_from: Path | None = None,
) -> list[Path]:
    """Update manifest.json (and the figures, when this run timed kernels) in `out_dir`; a folder
    without a manifest gets the one at `start_from` updated with this run (the run passes the
    committed one, so that what it did not measure is carried into a fresh --reports-dir rather
    than lost when that folder's copy replaces reports/). Returns the paths whose contents
    changed (or were removed: a figure the manifest has no data for). Nothing is written when the
    run measured nothing or measured exactly what the files already hold. With `out_dir` None
    nothing is written, but the manifest this run would give reports/ is still built and
    validated, so that a value a test recorded against the schema fails every run, not only the
    runs that write."""
    if not benchmarks and not recorded:
        return []
    from tests.suite import figures

    manifest_path = Path(REPORTS_DIR if out_dir is None else out_dir) / "manifest.json"
    previous = read_manifest(manifest_path if manifest_path.exists() or start_from is None else start_from)
    manifest = build_manifest(previous, benchmarks=benchmarks, recorded=recorded, environment=environment, today=today)
    validate(manifest)
    if out_dir is None:
        return []
    out_dir = Path(out_dir)
    written = [manifest_path] if write_if_changed(manifest_path, serialise(manifest)) else []
    if benchmarks:
        rendered = figures.render_all(manifest)
        for name, png in rendered.items():
            if write_if_changed(out_dir / name, png):
                written.append(out_dir / name)
        # A figure the manifest no longer has the data for (another GPU model's, dropped) is
        # removed, not left beside a manifest it does not show.
        for name in figures.FIGURES.keys() - rendered.keys():
            if (out_dir / name).exists():
                (out_dir / name).unlink()
                written.append(out_dir / name)
    return written
