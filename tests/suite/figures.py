"""The report figures, drawn from a manifest (never from raw records, so a figure shows exactly
the numbers the manifest holds):

- roofline.png: the lab point, every kernel at its own arithmetic intensity;
- bandwidth.png: fraction of the measured copy bandwidth per large shape, against the goals;
- call_modes.png: device time, per-call wall time and CUDA-graph replay per kernel and shape,
  with the launch floors.

Each `*_png(manifest)` returns PNG bytes, or None when the manifest lacks what the figure needs.
"""

import io
import math

from kernels.spec import BASELINE, LAB_POINT, in_grid, matrix_bytes
from tests.suite.manifest import (
    FLOPS_PER_ELEMENT,
    QUACK_BF16_COPY_FRACTION,
    TARGET_MIN_BYTES,
    copy_goal,
    kernel_rank,
)

# From the kernels' specs: the roofline draws the kernels of the lab grid, the bandwidth figure
# those of the large-vocabulary sweep.
ROOFLINE_KERNELS = in_grid("lab")
BANDWIDTH_KERNELS = in_grid("sweep")
DTYPE_ORDER = ("float32", "bfloat16", "float16")
MODE_MARKERS = {
    "device": ("o", "device time (events, L2 flushed)"),
    "per_call": ("^", "per call (wall clock, back-to-back calls)"),
    "graph": ("s", "CUDA-graph replay"),
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # No timestamp or software version in the file: an unchanged figure stays byte-identical.
    fig.savefig(buffer, format="png", dpi=130, metadata={"Software": None})
    _pyplot().close(fig)
    return buffer.getvalue()


def _color(kernel: str) -> str:
    return f"C{kernel_rank(kernel)}"


def _dtypes(entries) -> list[str]:
    present = {e["dtype"] for e in entries}
    return [d for d in DTYPE_ORDER if d in present] + sorted(present - set(DTYPE_ORDER))


def _gpu_name(manifest: dict) -> str:
    return (manifest.get("gpu") or {}).get("model") or "unknown GPU"


def roofline_png(manifest: dict) -> bytes | None:
    """Roofline at the lab point: x = FLOPs per byte the kernel moves by design, y = TFLOP/s."""
    ceilings = manifest.get("ceilings") or {}
    copy_TBps, fp32_TFLOPS = ceilings.get("hbm_copy_TBps"), ceilings.get("fp32_TFLOPS")
    B, V, dtype = LAB_POINT
    points = [
        e
        for e in manifest.get("sweep") or []
        if (e["B"], e["V"], e["dtype"]) == (B, V, dtype) and e["kernel"] in ROOFLINE_KERNELS
    ]
    if not (copy_TBps and fp32_TFLOPS and points):
        return None
    flops = FLOPS_PER_ELEMENT * B * V
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    x = sorted([2.0**k for k in range(-6, 9)] + [fp32_TFLOPS / copy_TBps])  # the ridge is a corner
    ax.plot(
        x,
        [min(copy_TBps * xi, fp32_TFLOPS) for xi in x],
        color="black",
        lw=1.5,
        label=f"roofline: copy {copy_TBps:.2f} TB/s, fp32 {fp32_TFLOPS:.1f} TFLOP/s (measured)",
    )
    labels: list[list] = []  # [x, y, names]: kernels that land on one spot share one label
    for e in sorted(points, key=lambda e: kernel_rank(e["kernel"])):
        intensity = flops / e["bytes_by_design"]
        achieved = flops / (e["us_median"] * 1e-6) / 1e12
        ax.scatter(
            [intensity],
            [achieved],
            s=50,
            color=_color(e["kernel"]),
            zorder=3,
            label=f"{e['kernel']}: {e['us_median']:.2f} us",
        )
        for label in labels:
            if abs(math.log(label[0] / intensity)) < 0.1 and abs(math.log(label[1] / achieved)) < 0.15:
                label[2].append(e["kernel"])
                break
        else:
            labels.append([intensity, achieved, [e["kernel"]]])
    for lx, ly, names in labels:
        ax.annotate(", ".join(names), (lx, ly), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved by design)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"softmax, (B, V) = ({B}, {V}) fp32, {_gpu_name(manifest)}")
    lab_MB = matrix_bytes(B, V, dtype) / 1e6
    ax.text(
        0.01,
        0.01,
        f"{FLOPS_PER_ELEMENT} FLOPs per element (max, subtract, exp, sum, scale); "
        f"the {lab_MB:.1f} MB read + written fits in L2, flushed between launches",
        transform=ax.transAxes,
        fontsize=7,
        va="bottom",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _png(fig)


def bandwidth_png(manifest: dict) -> bytes | None:
    """Fraction of the measured copy bandwidth per shape that moves >= 100 MB (the shapes the
    goals apply to), one bar per kernel, one panel per dtype, goal lines drawn per row length."""
    entries = [
        e
        for e in manifest.get("sweep") or []
        if e["kernel"] in BANDWIDTH_KERNELS
        and e.get("frac_of_copy_bw") is not None
        and matrix_bytes(e["B"], e["V"], e["dtype"]) >= TARGET_MIN_BYTES
    ]
    copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
    if not entries or not copy_TBps:
        return None
    dtypes = _dtypes(entries)
    plt = _pyplot()
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(13, 4.4 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes, strict=True):
        mine = [e for e in entries if e["dtype"] == dtype]
        shapes = sorted({(e["V"], e["B"]) for e in mine})
        kernels = sorted({e["kernel"] for e in mine}, key=kernel_rank)
        width = 0.8 / len(kernels)
        for k, kernel in enumerate(kernels):
            got = {(e["V"], e["B"]): e["frac_of_copy_bw"] for e in mine if e["kernel"] == kernel}
            xs = [i - 0.4 + width * (k + 0.5) for i, s in enumerate(shapes) if s in got]
            ax.bar(xs, [got[s] for s in shapes if s in got], width=width * 0.92, color=_color(kernel), label=kernel)
        goal_labelled = False
        for V in sorted({v for v, _ in shapes}):
            goal = copy_goal(V)
            span = [i for i, (v, _) in enumerate(shapes) if v == V]
            if goal is None:
                continue
            ax.hlines(
                goal,
                span[0] - 0.45,
                span[-1] + 0.45,
                colors="black",
                linestyles="--",
                lw=1.2,
                label=None if goal_labelled else "goal (0.95 for V >= 4096, 0.90 at V = 600)",
            )
            ax.text(span[-1] + 0.45, goal + 0.01, f"{goal:.2f}", fontsize=7, ha="right", va="bottom")
            goal_labelled = True
        if dtype == "bfloat16":
            ax.axhline(
                QUACK_BF16_COPY_FRACTION,
                color="navy",
                ls=":",
                lw=1.5,
                label=f"QuACK bf16 anchor ({QUACK_BF16_COPY_FRACTION})",
            )
        for i in range(1, len(shapes)):
            if shapes[i][0] != shapes[i - 1][0]:
                ax.axvline(i - 0.5, color="grey", lw=0.6, alpha=0.6)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"V={v}\nB={b}\n{matrix_bytes(b, v, dtype) / 1e6:.0f} MB" for v, b in shapes], fontsize=7)
        ax.set_xlim(-0.6, len(shapes) - 0.4)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("fraction of copy bandwidth")
        ax.set_title(
            f"{dtype}: read + write once, as a fraction of the measured copy ({copy_TBps:.2f} TB/s), "
            f"shapes moving >= {TARGET_MIN_BYTES / 1e6:.0f} MB, {_gpu_name(manifest)}",
            fontsize=9,
        )
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)
    fig.tight_layout()
    return _png(fig)


def call_modes_png(manifest: dict) -> bytes | None:
    """Per kernel and shape: device time, per-call wall time and graph replay (µs, log scale),
    one panel per dtype, the launch floors as horizontal lines."""
    section = manifest.get("call_modes") or {}
    entries = [e for e in section.get("entries") or [] if any(f"{mode}_us" in e for mode in MODE_MARKERS)]
    if not entries:
        return None
    floors = section.get("floors") or {}
    dtypes = _dtypes(entries)
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    kernels = sorted({e["kernel"] for e in entries}, key=kernel_rank)
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(14, 4.6 * len(dtypes) + 0.8), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes, strict=True):
        mine = [e for e in entries if e["dtype"] == dtype]
        shapes = sorted({(e["V"], e["B"]) for e in mine})
        step = 0.8 / len(kernels)
        for e in mine:
            x = shapes.index((e["V"], e["B"])) - 0.4 + step * (kernels.index(e["kernel"]) + 0.5)
            times = {mode: e[f"{mode}_us"] for mode in MODE_MARKERS if f"{mode}_us" in e}
            color = _color(e["kernel"])
            ax.vlines(x, min(times.values()), max(times.values()), color=color, lw=1.2, alpha=0.6)
            for mode, us in times.items():
                ax.scatter(
                    [x],
                    [us],
                    marker=MODE_MARKERS[mode][0],
                    s=24,
                    color=color,
                    zorder=3,
                    edgecolors="black" if e["kernel"] == BASELINE else "none",
                    linewidths=0.6,
                )
        lines = sorted(
            (values[f"{mode}_us"], name, mode, style)
            for name, values in floors.items()
            for mode, style in (("per_call", "--"), ("graph", ":"))
            if f"{mode}_us" in values
        )
        for us, _, _, style in lines:
            ax.axhline(us, color="grey", ls=style, lw=0.9)
        ax.set_yscale("log")
        low, high = (math.log10(v) for v in ax.get_ylim())
        label_at = low
        for us, name, mode, _ in lines:
            # Labels of floors close together are pushed apart so that each stays legible.
            label_at = max(math.log10(us), label_at + 0.04 * (high - low))
            ax.text(
                1.005,
                10**label_at,
                f"{name}, {mode.replace('_', '-')}: {us:.1f} us",
                fontsize=6.5,
                color="dimgrey",
                va="center",
                transform=ax.get_yaxis_transform(),
            )
        for i in range(1, len(shapes)):
            if shapes[i][0] != shapes[i - 1][0]:
                ax.axvline(i - 0.5, color="grey", lw=0.6, alpha=0.6)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"V={v}\nB={b}" for v, b in shapes], fontsize=7)
        ax.set_xlim(-0.6, len(shapes) - 0.4)
        ax.set_ylabel("µs per call")
        ax.set_title(f"{dtype}: the cost of one softmax by how it is called ({_gpu_name(manifest)})", fontsize=9)
        ax.grid(True, which="major", axis="y", alpha=0.3)
    handles = (
        [Patch(color=_color(k), label=k + (" (black edge)" if k == BASELINE else "")) for k in kernels]
        + [Line2D([], [], ls="", marker=m, color="black", label=label) for m, label in MODE_MARKERS.values()]
        + [
            Line2D([], [], ls="--", color="grey", label="launch floor, per call"),
            Line2D([], [], ls=":", color="grey", label="launch floor, graph replay"),
        ]
    )
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=7.5, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    return _png(fig)


FIGURES = {"roofline.png": roofline_png, "bandwidth.png": bandwidth_png, "call_modes.png": call_modes_png}


def render_all(manifest: dict) -> dict[str, bytes]:
    """{file name: PNG bytes} for every figure the manifest has the data for."""
    rendered = {name: draw(manifest) for name, draw in FIGURES.items()}
    return {name: png for name, png in rendered.items() if png is not None}


def main(argv=None) -> int:
    """`python -m tests.suite.figures [FOLDER]`: redraw the figures of FOLDER/manifest.json
    (default reports/), writing only those that change; no GPU needed."""
    import argparse
    from pathlib import Path

    from tests.suite.manifest import SCHEMA_PATH, read_manifest, write_if_changed

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("folder", nargs="?", default=str(SCHEMA_PATH.parent))
    folder = Path(parser.parse_args(argv).folder)
    manifest = read_manifest(folder / "manifest.json")
    if manifest is None:
        parser.error(f"no readable manifest.json in {folder}")
    for name, png in render_all(manifest).items():
        print(f"{folder / name}: {'written' if write_if_changed(folder / name, png) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
