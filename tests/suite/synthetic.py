"""Made-up records with the shape of what the cuda benchmarks record, so the manifest, the
figures and the gate are tested on the CPU. The numbers are invented; only their shape is real."""

import math

from kernels.spec import BASELINE, SPEC_BY_NAME, matrix_bytes, names

GPU_ENV = {
    "gpu": {"model": "NVIDIA H200", "compute_capability": "9.0"},
    "versions": {"python": "3.12.3", "torch": "2.11.0", "triton": "3.6.0", "cupy": "14.2.0"},
    "command": "pytest -m cuda --benchmark-only",
}
CPU_ENV = {
    "gpu": None,
    "versions": {"python": "3.11.7", "torch": "2.13.0", "triton": "3.9.0", "cupy": None},
    "command": "pytest -m cpu",
}
CEILINGS = {"hbm_copy_TBps": 4.28, "fp32_TFLOPS": 50.0, "how_measured": "synthetic"}
COPY_GBps = CEILINGS["hbm_copy_TBps"] * 1e3


def record(kernel, B, V, dtype, us, *, mode="device", passes=None, **extra) -> dict:
    """A benchmark record; bytes by design from the kernel's passes in its spec (2 for others)."""
    if passes is None:
        passes = SPEC_BY_NAME[kernel].passes if kernel in SPEC_BY_NAME else 2
    return {
        "kernel": kernel,
        "B": B,
        "V": V,
        "dtype": dtype,
        "mode": mode,
        "us_median": us,
        "us_min": us * 0.9,
        "us_max": us * 1.5,
        "bytes": matrix_bytes(B, V, dtype, passes=passes),
        **extra,
    }


# Invented device times (µs) at the lab's V = 600 and B = 4096 / 2, per kernel of the lab grid.
LAB_US = {"naive": 40.0, "smem": 9.0, "fused": 4.0, "triton": 4.5, "F_softmax": 5.0}
PICKED = {"autotune_picked": {"BLOCK": 1024, "num_warps": 4}}  # what an autotuned kernel records


def _picked(kernel) -> dict:
    return PICKED if kernel in SPEC_BY_NAME and SPEC_BY_NAME[kernel].autotuned else {}


def lab_records() -> list[dict]:
    """The lab grid, fp32, V = 600: every kernel, device time."""
    records = []
    for kernel, us in LAB_US.items():
        for B in (64, 512, 4096):
            records.append(record(kernel, B, 600, "float32", us * (1 + B / 4096), **_picked(kernel)))
    return records


# Fraction of copy bandwidth each kernel reaches at the large shapes, per dtype.
LARGE_FRACTIONS = {
    "float32": {"fused": 0.96, "triton": 0.93, "F_softmax": 0.70, "torch_compile": 0.62},
    "bfloat16": {"fused": 0.90, "triton": 0.80, "F_softmax": 0.55, "torch_compile": 0.50},
}


def large_records() -> list[dict]:
    """Device time at large shapes, each kernel at a fixed fraction of the copy bandwidth."""
    records = []
    for dtype, fractions in LARGE_FRACTIONS.items():
        for V in (600, 4096, 32000, 50257, 128256):
            for B in (4096, 32768):
                for kernel, fraction in fractions.items():
                    us = matrix_bytes(B, V, dtype) / (fraction * COPY_GBps) / 1e3
                    records.append(record(kernel, B, V, dtype, us * (0.97 if V == 600 else 1.0)))
    return records


CALL_SHAPES = [(B, V, dtype) for dtype in ("float32", "bfloat16") for V in (600, 32000, 128256) for B in (1, 64, 512)]
# Invented costs: a launch path per kernel (µs on the host) and a device time per byte.
LAUNCH_US = {"fused": 9.0, "triton": 14.0, "F_softmax": 6.0, "torch_compile": 22.0}
FLOORS = {
    "empty_like": {"per_call_us": 1.6},
    "triton_empty": {"device_us": 2.9, "per_call_us": 11.0, "graph_us": 2.1},
    "cupy_empty": {"device_us": 2.8, "per_call_us": 7.5, "graph_us": 2.0},
}


def call_records() -> list[dict]:
    """Device, per-call and graph times at the call shapes, and the launch floors."""
    records = []
    for B, V, dtype in CALL_SHAPES:
        for kernel, launch_us in LAUNCH_US.items():
            device_us = 2.5 + matrix_bytes(B, V, dtype) / (0.8 * COPY_GBps) / 1e3 * (1.3 if kernel == BASELINE else 1)
            records.append(record(kernel, B, V, dtype, device_us, **_picked(kernel)))
            records.append(
                record(kernel, B, V, dtype, max(launch_us, device_us) + 0.5, mode="per_call", calls_per_round=200)
            )
            records.append(record(kernel, B, V, dtype, device_us + 1.0, mode="graph"))
    for name, values in FLOORS.items():
        for key, us in values.items():
            mode = key.removesuffix("_us")
            records.append(
                {
                    "floor": name,
                    "mode": mode,
                    "B": 512,
                    "V": 600,
                    "dtype": "float32",
                    "us_median": us,
                    "us_min": us,
                    "us_max": us,
                }
            )
    return records


BYTE_EQUIVALENCE_CASES = (("fused", "float32"), ("triton", "bfloat16"), ("F_softmax", "float32"))


def byte_equivalence_records() -> list[tuple]:
    """(section, values) as tests record them through `record_manifest`, several per key."""
    records = []
    for kernel, dtype in BYTE_EQUIVALENCE_CASES:
        for prop in ("deterministic", "batch_invariant", "position_invariant", "stride_invariant", "graph_invariant"):
            passed = "not gated: passed" if SPEC_BY_NAME[kernel].baseline else "passed"
            for shape in ([1, 600], [64, 50257]):
                records.append(
                    ("byte_equivalence", {f"{kernel}/{dtype}/{prop}": {"verdict": passed, "shapes": [shape]}})
                )
    return records


# -- paired measurements, as the gated benchmark cases record them -----------------------------------

GATED_BASE_RATIO = {"device": 1.25, "graph": 1.4, "per_call": 0.85}
PAIRED_ROUNDS = {"device": 100, "graph": 15, "per_call": 15}


def ratios_around(ratio: float, rounds: int, spread: float = 0.01) -> list[float]:
    """`rounds` made-up per-round ratios around `ratio`, within +-spread (deterministic)."""
    return [ratio * (1 + spread * math.sin(1.7 * i + 0.3)) for i in range(rounds)]


def f_softmax_device_us(B: int, V: int, dtype: str) -> float:
    """The made-up device time of F_softmax at a call shape (as call_records has it)."""
    return 2.5 + matrix_bytes(B, V, dtype) / (0.8 * COPY_GBps) / 1e3 * 1.3


def gated_records(factor=None, remeasured=None, *, spread=0.01) -> list[dict]:
    """Paired records of fused and triton at every call shape in the three modes. `factor(kernel,
    B, V, dtype, mode)` makes a case that many times slower relative to F_softmax (its ratios
    divided by it); `remeasured(...)`, where given and not None, adds a re-measurement (3x the
    rounds) at that factor, as a flagged case carries."""
    records = []
    for B, V, dtype in CALL_SHAPES:
        for kernel in names(lambda s: s.gated):
            for mode, base in GATED_BASE_RATIO.items():
                slower = factor(kernel, B, V, dtype, mode) if factor else 1.0
                r = record(kernel, B, V, dtype, 5.0, mode=mode)
                r["paired_ratios"] = {mode: ratios_around(base / slower, PAIRED_ROUNDS[mode], spread)}
                r["paired_F_softmax_us"] = {mode: f_softmax_device_us(B, V, dtype)}
                again = remeasured(kernel, B, V, dtype, mode) if remeasured else None
                if again is not None:
                    r["remeasured_ratios"] = {mode: ratios_around(base / again, 3 * PAIRED_ROUNDS[mode], spread)}
                records.append(r)
    return records


def gated_training_records(factor=None, remeasured=None) -> list[dict]:
    """Paired device-time records of the gated training kernels (tests/test_loss_benchmarks.py's
    shape) at N = 4096, V in {50257, 128256}, both dtypes: their per-round ratios are to the op's
    eager baseline. `factor(kernel, op, V, dtype)` / `remeasured(...)` as in gated_records."""
    from tests.suite.gate import GATED_TRAINING

    records = []
    for op, impls in GATED_TRAINING.items():
        for impl in impls:
            for V in (50257, 128256):
                for dtype in ("float32", "bfloat16"):
                    slower = factor(impl, op, V, dtype) if factor else 1.0
                    r = loss_record(op, impl, 4096, V, dtype, 1000.0)
                    r["paired_ratios"] = {"device": ratios_around(2.0 / slower, 20)}
                    r["paired_F_softmax_us"] = {"device": 2000.0}
                    again = remeasured(impl, op, V, dtype) if remeasured else None
                    if again is not None:
                        r["remeasured_ratios"] = {"device": ratios_around(2.0 / again, 60)}
                    records.append(r)
    return records


# -- another GPU model ---------------------------------------------------------------------------------


def another_model(manifest: dict, model: str, *, seed: int = 0, slower: float = 1.3, spread: float = 0.1) -> dict:
    """`manifest`'s timings as if measured on another GPU model: every time `slower` times
    longer, each within +-spread of that (seeded), the copy ceiling 1/slower of it; every ratio
    derived again. For testing what merges results of several machines."""
    import random

    from tests.suite.manifest import build_manifest
    from tests.suite.merge import records_from_manifest

    rng = random.Random(seed)
    records, ceilings = records_from_manifest(manifest)
    for r in records:
        factor = slower * (1 + spread * (2 * rng.random() - 1))
        for key in ("us_median", "us_min", "us_max"):
            r[key] *= factor
    ceilings = {k: v / slower for k, v in ceilings.items()}
    environment = {**GPU_ENV, "gpu": {"model": model, "compute_capability": "9.0"}}
    return build_manifest(
        None, benchmarks=records, recorded={"ceilings": ceilings}, environment=environment, today=manifest.get("date")
    )


def accuracy_figures(max_rel: float, ratio: float, *, B: int = 64, path: str = "tile") -> dict:
    """One accuracy case's figures, as tests/test_accuracy.py records them."""
    return {
        "B": B,
        "path": path,
        "max_rel_err": max_rel,
        "p999_rel_err": max_rel / 2,
        "max_logp_err_nats": max_rel,
        "max_err_ulps": max_rel / 2**-23,
        "F_softmax_max_err": max_rel / ratio,
        "x_F_softmax": ratio,
    }


def accuracy_records(device: str = "cuda") -> list[tuple]:
    """(section, values) as the accuracy tests record them: two kernels, two cases each."""
    return [
        (
            "accuracy",
            {
                f"{device}/{kernel}/float32/{case}/{V}": accuracy_figures(1.5e-7 * (1 + i), 0.1 * (1 + i))
                for i, (kernel, case, V) in enumerate(
                    [("fused", "randn x4", 600), ("fused", "span x1", 600), ("triton", "randn x20", 262144)]
                )
            },
        )
    ]


# -- the training operations (tests/test_loss_benchmarks.py) ------------------------------------------


def loss_record(op, impl, N, V, dtype, us, *, mode="device", peak=None):
    from tests.suite.manifest import LOSS_OPS

    passes = LOSS_OPS[op][2]
    r = {"op": op, "impl": impl, "N": N, "V": V, "dtype": dtype, "mode": mode, "us_median": us}
    r.update(us_min=us * 0.9, us_max=us * 1.2, bytes=matrix_bytes(N, V, dtype, passes=passes))
    if peak is not None:
        r["peak_extra_bytes"] = peak
    return r


def loss_records() -> list[dict]:
    """Records of tests/test_loss_benchmarks.py's shape at one shape: every clock of the
    cross-entropy, device time of the softmax backward; triton misses the compiled goal."""
    N, V = 4096, 32000
    logits = matrix_bytes(N, V, "float32", passes=1)
    copy_us = 2 * logits / (CEILINGS["hbm_copy_TBps"] * 1e12) * 1e6  # one read + one write at copy speed
    out = [
        loss_record("cross_entropy", "triton", N, V, "float32", copy_us / 0.93, peak=logits),
        loss_record("cross_entropy", "F_cross_entropy", N, V, "float32", copy_us / 0.93 * 3.0, peak=3 * logits),
        loss_record("cross_entropy", "torch_compile", N, V, "float32", copy_us / 0.93 * 1.1, peak=logits),
        loss_record("softmax_backward", "triton", N, V, "float32", 1.5 * copy_us / 0.8),
        loss_record("softmax_backward", "softmax_backward_data", N, V, "float32", 1.5 * copy_us / 0.7),
    ]
    for impl, us in (("triton", 40.0), ("F_cross_entropy", 90.0), ("torch_compile", 60.0)):
        out.append(loss_record("cross_entropy", impl, N, V, "float32", us * 1e3, mode="per_call"))
        out.append(loss_record("cross_entropy", impl, N, V, "float32", us * 1e3 * 0.9, mode="graph"))
    return out
