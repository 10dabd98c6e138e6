"""The GPU regression gate: this run's speed of the gated kernels (fused and Triton, `gated` in
their specs) relative to F.softmax, against
the committed manifest's figures for the same GPU model.

Ratios, not absolute times, are compared: F.softmax measured in the same run absorbs what moves
both (clocks, driver, a busier machine), so a ratio that drops is our kernel getting slower.
Compared are the device-time sweep (`sweep[].frac_of_F_softmax`) and the per-call mode
(`call_modes.entries[].x_F_softmax.per_call`); a case counts as regressed when its new ratio is
more than TOLERANCE below the committed one.
"""

from dataclasses import dataclass, field

from kernels.spec import names

GATED_KERNELS = names(lambda s: s.gated)  # from the kernels' specs (kernels/spec.py)
TOLERANCE = 0.10


def speed_ratios(manifest: dict | None) -> dict[tuple, float]:
    """{(kernel, B, V, dtype, mode): speed relative to F.softmax} for the gated kernels."""
    ratios = {}
    for e in (manifest or {}).get("sweep") or []:
        if e["kernel"] in GATED_KERNELS and e.get("frac_of_F_softmax") is not None:
            ratios[(e["kernel"], e["B"], e["V"], e["dtype"], "device")] = e["frac_of_F_softmax"]
    for e in ((manifest or {}).get("call_modes") or {}).get("entries") or []:
        ratio = (e.get("x_F_softmax") or {}).get("per_call")
        if e["kernel"] in GATED_KERNELS and ratio is not None:
            ratios[(e["kernel"], e["B"], e["V"], e["dtype"], "per_call")] = ratio
    return ratios


@dataclass
class GateResult:
    gpu_model: str | None
    compared: int = 0
    without_baseline: int = 0
    regressions: list[dict] = field(default_factory=list)
    note: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def lines(self) -> list[str]:
        """What the terminal summary prints: a verdict, then one line per regressed case."""
        if self.note:
            return [f"regression gate: {self.note}"]
        head = (
            f"regression gate ({self.gpu_model}): {self.compared} cases compared with the committed "
            f"manifest, {len(self.regressions)} regressed by more than {TOLERANCE:.0%} "
            f"({self.without_baseline} without a committed figure)"
        )
        return [head] + [
            f"  REGRESSED {r['kernel']} B={r['B']} V={r['V']} {r['dtype']} {r['mode']}: "
            f"{r['old_ratio']:.3f} -> {r['new_ratio']:.3f} x F.softmax"
            for r in self.regressions
        ]


def compare(committed: dict | None, current: dict, tolerance: float = TOLERANCE) -> GateResult:
    """Gate this run's manifest (`current`, built from this run's records alone) against the
    committed one. A different GPU model (or none committed) is no baseline: noted, not failed."""
    model = (current.get("gpu") or {}).get("model")
    if not model:
        return GateResult(None, note="this run measured no GPU: nothing to compare")
    committed_model = ((committed or {}).get("gpu") or {}).get("model")
    if committed_model != model:
        return GateResult(
            model, note=f"no baseline for {model} (the committed manifest is for {committed_model or 'no GPU'})"
        )
    old, new = speed_ratios(committed), speed_ratios(current)
    result = GateResult(model, compared=len(new.keys() & old.keys()), without_baseline=len(new.keys() - old.keys()))
    for key in sorted(new.keys() & old.keys(), key=lambda k: (k[4], k[3], k[2], k[1], k[0])):
        if new[key] < old[key] * (1 - tolerance):
            kernel, B, V, dtype, mode = key
            result.regressions.append(
                {
                    "kernel": kernel,
                    "B": B,
                    "V": V,
                    "dtype": dtype,
                    "mode": mode,
                    "old_ratio": old[key],
                    "new_ratio": new[key],
                }
            )
    if not new:
        result.note = f"this run timed no {' / '.join(GATED_KERNELS)} case on {model}: nothing to compare"
    return result
