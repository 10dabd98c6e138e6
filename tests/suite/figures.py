"""The report figures, drawn from a manifest (never from raw records, so a figure shows exactly
the numbers the manifest holds):

- roofline.png: the lab point, every kernel at its own arithmetic intensity, each with its own
  marker and a label led to it, so kernels that land together stay apart;
- bandwidth.png: fraction of the measured copy bandwidth per large shape, against the goals,
  with every value written out, misses marked, and cells no run measured shown as such;
- call_modes.png: device time, per-call wall time and CUDA-graph replay per kernel and shape,
  with the launch floors, and what separates the clocks (L2 flushed or warm) said on it;
- loss_timing.png: the training operations (cross-entropy loss + gradient, softmax backward):
  fraction of copy bandwidth per implementation and shape against the goal, our bars' speed
  relative to PyTorch eager and torch.compile and their peak memory written on them.

Each `*_png(manifest)` returns PNG bytes, or None when the manifest lacks what the figure needs.
"""

import io
import math

from kernels.spec import BASELINE, DTYPE_NAMES, LAB_POINT, in_grid, matrix_bytes
from tests.suite.devicetime import MODE_NAMES
from tests.suite.manifest import (
    FLOPS_PER_ELEMENT,
    KERNEL_ORDER,
    LARGE_COPY_GOAL,
    LOSS_BASELINES,
    LOSS_OPS,
    QUACK_BF16_COPY_FRACTION,
    SHAPE_COPY_GOALS,
    TARGET_MIN_BYTES,
    copy_goal,
    kernel_rank,
    loss_goals,
)

# From the kernels' specs: the bandwidth figure draws the kernels of the large-vocabulary sweep;
# the roofline every kernel measured at the lab point.
BANDWIDTH_KERNELS = in_grid("sweep")
GOAL_LEGEND = "goal: " + ", ".join(
    [f"{k} {g:.2f}" for k, g in LARGE_COPY_GOAL.items()]
    + [f"{k} {g:.2f} at ({B}, {V}) {d}" for (B, V, d), goals in SHAPE_COPY_GOALS.items() for k, g in goals.items()]
)
UNMEASURED_HEIGHT = 0.3  # the dashed outline standing in for a bar no run measured
MODE_MARKERS = {
    "device": ("o", "device time: one launch, L2 flushed before it (cold)"),
    "per_call": ("^", "per call: wall clock of back-to-back calls from Python (L2 warm)"),
    "graph": ("s", "CUDA-graph replay: back-to-back replays (L2 warm)"),
}
# The launch floors' lines on the call-modes figure, by clock.
FLOOR_STYLES = {"device": "-.", "per_call": "--", "graph": ":"}
DODGE = 0.16  # octaves between kernels drawn at one arithmetic intensity on the roofline
# The roofline's marker of each kernel, by its place in the registry (kernel_rank), as its colour is;
# past the end of the cycle the markers repeat. A kernel the registry does not hold is drawn with an X.
KERNEL_MARKERS = ("v", "s", "o", "D", "^", "P", "*", "h", "<", ">", "p", "d")
UNKNOWN_KERNEL_MARKER = "X"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # No timestamp or software version in the file: an unchanged figure stays byte-identical.
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    _pyplot().close(fig)
    return buffer.getvalue()


def _color(kernel: str) -> str:
    return f"C{kernel_rank(kernel)}"


def _dtypes(entries) -> list[str]:
    present = {e["dtype"] for e in entries}
    return [d for d in DTYPE_NAMES if d in present] + sorted(present - set(DTYPE_NAMES))


def _gpu_name(manifest: dict) -> str:
    return (manifest.get("gpu") or {}).get("model") or "unknown GPU"


def spread_labels(ys: list[float], gap: float) -> list[float]:
    """Label heights (log10 units) for points at heights `ys`: each label as near its point as
    it can be while consecutive labels stay `gap` apart, the group centred on its points."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    placed = [0.0] * len(ys)
    groups: list[list[int]] = []
    for i in order:
        groups.append([i])
        placed[i] = ys[i]
        while len(groups) > 1:  # merge with the group below while they would overlap
            below, above = groups[-2], groups[-1]
            if placed[above[0]] - placed[below[-1]] >= gap:
                break
            merged = below + above
            centre = sum(ys[j] for j in merged) / len(merged)
            for k, j in enumerate(merged):
                placed[j] = centre + (k - (len(merged) - 1) / 2) * gap
            groups[-2:] = [merged]
    return placed


def _kernel_marker(kernel: str) -> str:
    if kernel not in KERNEL_ORDER:
        return UNKNOWN_KERNEL_MARKER
    return KERNEL_MARKERS[kernel_rank(kernel) % len(KERNEL_MARKERS)]


def roofline_points(manifest: dict, copy_TBps: float) -> list[dict]:
    """Where the roofline draws each kernel of the sweep at the lab point, torch.compile
    included: {kernel, us, intensity, achieved (TFLOP/s), x (the marker), label (x, y), left}.
    Kernels at one intensity are set DODGE octaves apart sideways, so that none hides another;
    their labels are stacked beside them (spread_labels), left of the lowest intensity and under
    the roof there (a label spans about an octave), right of the others."""
    B, V, dtype = LAB_POINT
    flops = FLOPS_PER_ELEMENT * B * V
    columns: dict[float, list] = {}
    for e in sorted(manifest.get("sweep") or [], key=lambda e: kernel_rank(e["kernel"])):
        if (e["B"], e["V"], e["dtype"]) == (B, V, dtype):
            columns.setdefault(flops / e["bytes_by_design"], []).append(e)
    placed = []
    for intensity, mine in sorted(columns.items()):
        achieved = [flops / (e["us_median"] * 1e-6) / 1e12 for e in mine]
        heights = spread_labels([math.log10(a) for a in achieved], gap=0.11)
        left = intensity == min(columns) and len(columns) > 1
        for k, (e, a, height) in enumerate(zip(mine, achieved, heights, strict=True)):
            if left:
                label = (intensity / 2.6, 10 ** min(height, math.log10(copy_TBps * intensity / 2.6 / 2.2) - 0.12))
            else:
                label = (intensity * 2.6, 10**height)
            placed.append(
                {
                    "kernel": e["kernel"],
                    "us": e["us_median"],
                    "intensity": intensity,
                    "achieved": a,
                    "x": intensity * 2 ** (DODGE * (k - (len(mine) - 1) / 2)),
                    "label": label,
                    "left": left,
                }
            )
    return placed


def roofline_png(manifest: dict) -> bytes | None:
    """Roofline at the lab point: x = FLOPs per byte the kernel moves by design, y = TFLOP/s.
    Every kernel of the sweep at the lab point (torch.compile included) has its own marker and
    a label with a leader line (roofline_points)."""
    ceilings = manifest.get("ceilings") or {}
    copy_TBps, fp32_TFLOPS = ceilings.get("hbm_copy_TBps"), ceilings.get("fp32_TFLOPS")
    B, V, dtype = LAB_POINT
    points = roofline_points(manifest, copy_TBps) if copy_TBps else []
    if not (copy_TBps and fp32_TFLOPS and points):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.4))
    x = sorted([2.0**k for k in range(-6, 9)] + [fp32_TFLOPS / copy_TBps])  # the ridge is a corner
    ax.plot(
        x,
        [min(copy_TBps * xi, fp32_TFLOPS) for xi in x],
        color="black",
        lw=1.5,
        label=f"roofline: copy {copy_TBps:.2f} TB/s, fp32 {fp32_TFLOPS:.1f} TFLOP/s (measured)",
    )
    for p in points:
        color = _color(p["kernel"])
        ax.scatter(
            [p["x"]],
            [p["achieved"]],
            s=46,
            marker=_kernel_marker(p["kernel"]),
            facecolors="none",
            edgecolors=color,
            linewidths=1.6,
            zorder=3,
            label=f"{p['kernel']}: {p['us']:.2f} us, {p['achieved']:.3f} TFLOP/s",
        )
        ax.annotate(
            f"{p['kernel']} {p['us']:.2f} us",
            (p["x"], p["achieved"]),
            xytext=p["label"],
            ha="right" if p["left"] else "left",
            va="center",
            fontsize=8,
            color=color,
            arrowprops={"arrowstyle": "-", "color": color, "lw": 0.8, "shrinkB": 4},
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved by design)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"softmax, (B, V) = ({B}, {V}) fp32, {_gpu_name(manifest)}")
    lab_MB = matrix_bytes(B, V, dtype) / 1e6
    fig.text(
        0.01,
        0.01,
        f"{FLOPS_PER_ELEMENT} FLOPs per element (max, subtract, exp, sum, scale); "
        f"the {lab_MB:.1f} MB read + written fits in L2, flushed between launches;\n"
        "kernels at one intensity are drawn a little apart so that none hides another",
        fontsize=7,
        va="bottom",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _png(fig)


def _fraction_frame(ax, labels: list[str], title: str) -> None:
    """The frame of a panel of bars of the fraction of copy bandwidth, one group per label."""
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)


def _fraction_bar(ax, x: float, width: float, fraction: float, color: str, miss: bool) -> None:
    """One bar of a fraction of copy bandwidth with its value to three decimals above it; a bar
    below its goal hatched, its value red."""
    ax.bar(
        [x],
        [fraction],
        width=width * 0.92,
        color=color,
        hatch="///" if miss else None,
        edgecolor="black" if miss else "none",
        lw=0.6,
    )
    ax.text(
        x,
        fraction + 0.01,
        f"{fraction:.3f}",
        rotation=90,
        fontsize=6,
        ha="center",
        va="bottom",
        color="red" if miss else "black",
        fontweight="bold" if miss else "normal",
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.4, "alpha": 0.85},
    )


def bandwidth_cells(manifest: dict) -> dict[str, dict]:
    """{dtype: {"shapes": [(V, B)], "kernels": [...], "measured": {(V, B, kernel): fraction},
    "copy_same_bytes": {(V, B): fraction}}}: per dtype, every shape of the sweep (in any dtype)
    that moves at least TARGET_MIN_BYTES in this one or has a goal of its own (SHAPE_COPY_GOALS),
    what each kernel of BANDWIDTH_KERNELS measured there (a (shape, kernel) with no entry was not
    measured), and what a copy of the shape's own bytes reached where the run timed one."""
    sweep = manifest.get("sweep") or []
    everywhere = {(e["V"], e["B"]) for e in sweep}
    entries = [e for e in sweep if e["kernel"] in BANDWIDTH_KERNELS and e.get("frac_of_copy_bw") is not None]
    cells = {}
    for dtype in _dtypes(entries):
        shapes = sorted(
            (V, B)
            for V, B in everywhere
            if matrix_bytes(B, V, dtype) >= TARGET_MIN_BYTES or (B, V, dtype) in SHAPE_COPY_GOALS
        )
        measured = {(e["V"], e["B"], e["kernel"]): e["frac_of_copy_bw"] for e in entries if e["dtype"] == dtype}
        if not any((v, b) in set(shapes) for v, b, _ in measured):
            continue
        kernels = sorted({k for *_, k in measured} | set(BANDWIDTH_KERNELS), key=kernel_rank)
        copy_same_bytes = {
            (e["V"], e["B"]): e["same_bytes_copy_frac"]
            for e in entries
            if e["dtype"] == dtype and e.get("same_bytes_copy_frac") is not None
        }
        cells[dtype] = {"shapes": shapes, "kernels": kernels, "measured": measured, "copy_same_bytes": copy_same_bytes}
    return cells


def misses_goal(kernel: str, B: int, V: int, dtype: str, fraction: float) -> bool:
    """Whether a bar is below the goal that applies to it (the gated kernels only)."""
    goal = copy_goal(kernel, B, V, dtype)
    return goal is not None and fraction < goal


def bandwidth_png(manifest: dict) -> bytes | None:
    """Fraction of the measured copy bandwidth per shape that moves >= 100 MB (the shapes the
    goals apply to), one bar per kernel, one panel per dtype, goal lines drawn per row length.
    Every bar carries its value to three decimals; a fused or Triton bar below its goal is
    hatched and its value red; a (shape, kernel) no run measured is an empty dashed outline; a
    grey dash-dot line across a shape is what a copy of its own bytes reached."""
    cells = bandwidth_cells(manifest)
    copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
    if not cells or not copy_TBps:
        return None
    plt = _pyplot()
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(cells), 1, figsize=(14, 4.8 * len(cells)), squeeze=False)
    for ax, (dtype, c) in zip(axes[:, 0], cells.items(), strict=True):
        shapes, kernels, measured = c["shapes"], c["kernels"], c["measured"]
        width = 0.8 / len(kernels)
        for i, (V, B) in enumerate(shapes):
            for k, kernel in enumerate(kernels):
                x = i - 0.4 + width * (k + 0.5)
                fraction = measured.get((V, B, kernel))
                if fraction is None:
                    ax.bar(
                        [x], [UNMEASURED_HEIGHT], width=width * 0.92, color="none", edgecolor="grey", ls="--", lw=0.8
                    )
                    ax.text(x, 0.02, "not measured", rotation=90, fontsize=6, ha="center", va="bottom", color="grey")
                    continue
                _fraction_bar(ax, x, width, fraction, _color(kernel), misses_goal(kernel, B, V, dtype, fraction))
                goal = copy_goal(kernel, B, V, dtype)
                if goal is not None:  # the bar's own goal, a black line across it
                    ax.hlines(goal, x - width / 2, x + width / 2, colors="black", lw=1.6)
        for i, shape in enumerate(shapes):
            if shape in c["copy_same_bytes"]:
                ax.hlines(c["copy_same_bytes"][shape], i - 0.45, i + 0.45, colors="dimgrey", ls="-.", lw=1.2)
        if dtype == "bfloat16":
            ax.axhline(QUACK_BF16_COPY_FRACTION, color="navy", ls=":", lw=1.5)
        for i in range(1, len(shapes)):
            if shapes[i][0] != shapes[i - 1][0]:
                ax.axvline(i - 0.5, color="grey", lw=0.6, alpha=0.6)
        _fraction_frame(
            ax,
            [f"V={v}\nB={b}\n{matrix_bytes(b, v, dtype) / 1e6:.0f} MB" for v, b in shapes],
            f"{dtype}: read + write once, as a fraction of the measured copy ({copy_TBps:.2f} TB/s), "
            f"shapes moving >= {TARGET_MIN_BYTES / 1e6:.0f} MB or with a goal of their own, {_gpu_name(manifest)}",
        )
        handles = [Patch(color=_color(k), label=k) for k in kernels] + [
            plt.Line2D([], [], color="black", lw=1.6, label=GOAL_LEGEND),
            Patch(facecolor="white", edgecolor="black", hatch="///", label="below its goal (fused, triton)"),
            Patch(facecolor="none", edgecolor="grey", ls="--", label="not measured"),
        ]
        if c["copy_same_bytes"]:
            handles.append(plt.Line2D([], [], color="dimgrey", ls="-.", lw=1.2, label="a copy of the same bytes"))
        if dtype == "bfloat16":
            handles.append(
                plt.Line2D(
                    [], [], color="navy", ls=":", lw=1.5, label=f"QuACK bf16 anchor ({QUACK_BF16_COPY_FRACTION})"
                )
            )
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)
    fig.tight_layout()
    return _png(fig)


def warm_below_cold(entries: list[dict]) -> tuple[int, int]:
    """(entries whose graph replay is below their device time, entries that have both)."""
    both = [e for e in entries if "graph_us" in e and "device_us" in e]
    return sum(e["graph_us"] < e["device_us"] for e in both), len(both)


def call_modes_png(manifest: dict) -> bytes | None:
    """Per kernel and shape: device time, per-call wall time and graph replay (µs, log scale),
    one panel per dtype, the launch floors as horizontal lines. The clocks differ in more than
    host overhead, and the figure says so: device time flushes L2 before each launch, graph
    replays and per-call loops run back to back with the input warm in L2."""
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
        # One collection per kernel (its spans) and per kernel and mode (its markers): a
        # collection per point made this figure the slowest to draw.
        spans: dict[str, list] = {}
        points: dict[tuple, list] = {}
        for e in mine:
            x = shapes.index((e["V"], e["B"])) - 0.4 + step * (kernels.index(e["kernel"]) + 0.5)
            times = {mode: e[f"{mode}_us"] for mode in MODE_MARKERS if f"{mode}_us" in e}
            spans.setdefault(e["kernel"], []).append((x, min(times.values()), max(times.values())))
            for mode, us in times.items():
                points.setdefault((e["kernel"], mode), []).append((x, us))
        for kernel, span in spans.items():
            xs, lows, highs = zip(*span, strict=True)
            ax.vlines(xs, lows, highs, color=_color(kernel), lw=1.2, alpha=0.6)
        for (kernel, mode), xy in points.items():
            xs, ys = zip(*xy, strict=True)
            ax.scatter(
                xs,
                ys,
                marker=MODE_MARKERS[mode][0],
                s=24,
                color=_color(kernel),
                zorder=3,
                edgecolors="black" if kernel == BASELINE else "none",
                linewidths=0.6,
            )
        lines = sorted(
            (values[f"{mode}_us"], name, mode, style)
            for name, values in floors.items()
            for mode, style in FLOOR_STYLES.items()
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
            Line2D([], [], ls=style, color="grey", label=f"launch floor, {MODE_NAMES[mode]}")
            for mode, style in FLOOR_STYLES.items()
        ]
    )
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=7.5, frameon=False)
    below, both = warm_below_cold(entries)
    fig.text(
        0.5,
        1 - 0.62 / fig.get_figheight(),
        f"Graph replay is below device time in {below} of {both} entries, and not for lack of host time (device "
        "time has none): device time flushes L2 before each launch and times that one launch between two events, "
        "its start on the GPU included;\ngraph replays run 200 back to back (time / 200), each finding its input "
        "in L2 where it fits, one launch's start hidden behind the last one's end. Compare each mode with "
        "F.softmax in the same mode (x F.softmax), not the modes with each other.",
        ha="center",
        va="top",
        fontsize=7.5,
        color="darkred",
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.95 / fig.get_figheight()))
    return _png(fig)


LOSS_TITLES = {
    "cross_entropy": "cross-entropy loss + gradient (1 read + 1 write)",
    "weighted_cross_entropy": "cross-entropy, class weights and label smoothing 0.1 (1 read + 1 write)",
    "softmax_backward": "softmax backward (2 reads + 1 write)",
}


def loss_timing_png(manifest: dict) -> bytes | None:
    """One panel per training operation (LOSS_OPS) and dtype: each implementation's fraction of
    the copy bandwidth (device time) per (N, V), the goal as a dashed line, our bars below it
    hatched with their value in red; above each of our bars its device-time speed relative to
    PyTorch eager (xE) and torch.compile (xC) and, where measured, its peak memory beyond the
    inputs over the matrix's size (pk)."""
    copy_TBps = (manifest.get("ceilings") or {}).get("hbm_copy_TBps")
    panels = []
    for op, (section, _, _) in LOSS_OPS.items():
        entries = [e for e in (manifest.get(section) or {}).get("entries") or [] if "frac_of_copy_bw" in e]
        panels += [(op, dtype, [e for e in entries if e["dtype"] == dtype]) for dtype in _dtypes(entries)]
    if not panels or not copy_TBps:
        return None
    plt = _pyplot()
    from matplotlib.patches import Patch

    every_impl = sorted(
        {e["impl"] for *_, entries in panels for e in entries}, key=lambda k: (k in LOSS_BASELINES, kernel_rank(k), k)
    )
    color = {impl: f"C{i}" for i, impl in enumerate(every_impl)}  # one colour per implementation in every panel
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.2 * len(panels)), squeeze=False)
    for ax, (op, dtype, entries) in zip(axes[:, 0], panels, strict=True):
        shapes = sorted({(e["V"], e["N"]) for e in entries})
        impls = sorted({e["impl"] for e in entries}, key=lambda k: (k in LOSS_BASELINES, kernel_rank(k), k))
        ours = [i for i in impls if i not in LOSS_BASELINES]
        cell = {(e["V"], e["N"], e["impl"]): e for e in entries}
        width = 0.8 / len(impls)
        for i, (V, N) in enumerate(shapes):
            for k, impl in enumerate(impls):
                e = cell.get((V, N, impl))
                if e is None:
                    continue
                x, fraction = i - 0.4 + width * (k + 0.5), e["frac_of_copy_bw"]
                goal = loss_goals(op, V)["frac_of_copy_bw"]
                _fraction_bar(ax, x, width, fraction, color[impl], impl not in LOSS_BASELINES and fraction < goal)
                ratios = []
                if impl not in LOSS_BASELINES:
                    for key, short in (("x_eager", "xE"), ("x_compiled", "xC")):
                        ratio = (e.get(key) or {}).get("device")
                        if ratio is not None:
                            ratios.append(f"{short} {ratio:.2f}")
                    if "peak_extra_over_matrix" in e:
                        ratios.append(f"pk {e['peak_extra_over_matrix']:.2f}")
                if ratios:
                    ax.text(
                        x,
                        0.02,
                        "  ".join(ratios),
                        rotation=90,
                        fontsize=6,
                        ha="center",
                        va="bottom",
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.4, "alpha": 0.85},
                    )
        for V in sorted({v for v, _ in shapes}):
            span = [i for i, (v, _) in enumerate(shapes) if v == V]
            ax.hlines(loss_goals(op, V)["frac_of_copy_bw"], span[0] - 0.45, span[-1] + 0.45, colors="black", ls="--")
        _fraction_frame(
            ax,
            [f"V={v}\nN={n}" for v, n in shapes],
            f"{LOSS_TITLES.get(op, op)}, {dtype}: device time, L2 flushed, against the measured copy "
            f"({copy_TBps:.2f} TB/s), {_gpu_name(manifest)}",
        )
        handles = [Patch(color=color[impl], label=impl) for impl in impls] + [
            plt.Line2D([], [], color="black", ls="--", label="goal (of copy)"),
            Patch(
                facecolor="white",
                edgecolor="black",
                hatch="///",
                label=f"below the goal ({', '.join(ours)})",
            ),
        ]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)
    fig.text(
        0.01,
        0.002,
        "on our bars: xE / xC = speed relative to PyTorch eager / torch.compile (device time); "
        "pk = peak memory beyond the inputs over the matrix's size",
        fontsize=7.5,
    )
    fig.tight_layout(rect=(0, 0.01, 1, 1))
    return _png(fig)


FIGURES = {
    "roofline.png": roofline_png,
    "bandwidth.png": bandwidth_png,
    "call_modes.png": call_modes_png,
    "loss_timing.png": loss_timing_png,
}


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
