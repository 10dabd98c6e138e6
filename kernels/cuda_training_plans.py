"""Size classes of the CUDA C training kernels: the softmax backward (kernels/cuda/softmax_backward.cu)
and the fused cross-entropy (kernels/cuda/cross_entropy.cu).

As `kernels.cuda_plans` does for the forward, each table is the single source of the kernels
compiled (`module_source` instantiates exactly these), of the dispatch (`select_training_class`, used by
`kernels.cuda_training`) and of the boundaries the tests probe. V counts elements.

  warp      one warp per row, lane l holding elements l, l + 32, ... (element-wise loads)
  warpvec   one warp per row, 16-byte vectors with a head / tail peel, several rows a block
  row       one block per row, the row held in registers
  cluster   a thread-block cluster per row (sm_90), each CTA holding a slice in registers
  loop      rows past every class: passes that re-read the row, by a cluster of
            LOOP_CLUSTER CTAs on sm_90 (so each SM re-reads an eighth of a row and the
            re-reads stay in L2) or by one block before sm_90

Both ops share one table (below), with half the forward's elements per thread; the vectorised
warp rows stop at 256 (16 elements a lane need more than the 64 registers a warp row's launch
bounds allow) and a two-warp block takes rows up to 512. Long rows use clusters of 4 and 8
CTAs (2, 4 and 8 for 16-bit storage); the forward's seven-CTA class is left out. The
cross-entropy's rows past 16384 take the forward's cluster classes instead, seven CTAs included
(one tensor held: its row state fits beside the forward's elements a thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .cuda_build import CUDA_DIR, expand_includes, instantiations, one_class_unit
from .cuda_plans import FORMATS, RowShape, as_dtype

BACKWARD_SOURCE = CUDA_DIR / "softmax_backward.cu"
CROSS_ENTROPY_SOURCE = CUDA_DIR / "cross_entropy.cu"
TRAINING_SOURCES = (BACKWARD_SOURCE, CROSS_ENTROPY_SOURCE)

OPS = ("bwd", "ce")  # kernel name prefixes: softmax backward, cross-entropy
PATHS = ("warp", "warpvec", "row", "cluster", "loop")
WARP_ROWS_PER_BLOCK = 4
WARPVEC_ROWS_PER_BLOCK = 8
# The loop class by storage width: (threads per CTA, 16-byte vectors of each operand a thread has
# in flight per step of its passes). On an H100 at (4096, 262144) (graph clock, of the op's
# floor, runs/h100-2026-12-07/fused_training_variants.log) against 1024 x 2 before: bf16 512 x 4
# 0.696 / 0.741 (cross-entropy / backward) against 0.433 / 0.616, float32 1024 x 4 0.738 / 0.860
# against 0.652 / 0.778 (512 x 4 there: 0.663 / 0.441). The one-block loop of GPUs without
# clusters keeps 1024 x 2 (not measured; at 512 x 4 its 16-bit build spills).
LOOP_SHAPE = {4: (1024, 4), 2: (512, 4)}
LOOP_SHAPE_ONE_BLOCK = (1024, 2)
LOOP_CLUSTER = 8  # CTAs sharing a row on the loop path where clusters exist

# (max V, elements per lane): lane-strided warp rows, the same for every op and dtype.
_WARP_CLASSES = ((32, 1), (64, 2), (128, 4))

# Per storage width: (max V, elements per lane) of the vectorised warp rows, then (max V,
# threads per CTA, elements per thread, CTAs per cluster, packed) of the block and cluster rows.
# "packed": the row is held as the loaded 16-bit pairs and widened in each pass. Both ops use
# one table: the backward holds two values per element (y and dy), cross-entropy one (the
# logits) but some 20 more registers of row state (the target, its owner, the gradient's
# coefficients, the smoothing sum), so either fits in 64 registers with half the elements per
# thread of the forward's classes (16 fp32, 32 packed 16-bit; 8 for a warp row) and reaches the
# same lengths with twice the threads or CTAs.
_TABLES = {
    4: (
        ((256, 8),),
        (
            (512, 64, 8, 1, False),
            (1024, 128, 8, 1, False),
            (2048, 128, 16, 1, False),
            (4096, 256, 16, 1, False),
            (8192, 512, 16, 1, False),
            (16384, 1024, 16, 1, False),
            (32768, 512, 16, 4, False),
            (65536, 512, 16, 8, False),
            (131072, 1024, 16, 8, False),
        ),
    ),
    2: (
        ((256, 8),),
        (
            (512, 64, 8, 1, False),
            (1024, 128, 8, 1, False),
            (2048, 128, 16, 1, True),
            (4096, 128, 32, 1, True),
            (8192, 256, 32, 1, True),
            (16384, 512, 32, 1, True),
            (32768, 512, 32, 2, True),
            (65536, 512, 32, 4, True),
            (131072, 512, 32, 8, True),
        ),
    ),
}

_KINDS = {  # kind -> (kernel name, description, instantiation macro)
    "warp": (
        "{op}_warp_{sfx}_e{elems}",
        "warp(rows/block={rows}, elems/lane={elems})",
        "WARP({name}, {fmt}, {elems}, {rows})",
    ),
    "warpvec": (
        "{op}_warpvec_{sfx}_e{elems}_r{rows}",
        "warp(rows/block={rows}, elems/lane={elems}, 16-byte vectors)",
        "WARPVEC({name}, {fmt}, {elems}, {rows})",
    ),
    "row": (
        "{op}_row_{sfx}_t{threads}_e{elems}_c1{p}",
        "row(cluster=1, threads={threads}, elems/thread={elems}{packed})",
        "ROW({name}, {fmt}, {threads}, {elems}, {pk})",
    ),
    "cluster": (
        "{op}_cluster_{sfx}_t{threads}_e{elems}_c{cluster}{p}",
        "cluster(cluster={cluster}, threads={threads}, elems/thread={elems}{packed})",
        "CLUSTER({name}, {fmt}, {threads}, {elems}, {cluster}, {pk})",
    ),
    "loop": (
        "{op}_loop_{sfx}_t{threads}_c{cluster}",
        "loop(cluster={cluster}, threads={threads}, three passes)",
        "LOOP{cl}({name}, {fmt}, {threads}, {loop_elems}{cluster_arg})",
    ),
}
# The cross-entropy's rows past 16384: the forward's classes (kernels.cuda_plans), 64 packed
# elements a thread in 16-bit storage, 32 in float32. On an H100 at N = 4096 (graph clock, of
# the one-read-one-write floor, runs/h100-2026-12-07/fused_training_variants.log) against the
# shared table's: bf16 32000 0.896 against 0.656 (N = 16384: 0.927 against 0.668), 50257
# 0.746 against 0.503, 128256 0.853 against 0.574; float32 0.911 / 0.878 at 32000 / 128256
# against 0.771 / 0.603. The same bits. The float32 builds spill 40-44 bytes a thread
# under the 64 registers (a few row-state values, stored and loaded once a row, not an
# element): SPILL_BYTES is what their offline build may spill, every other class none.
SPILL_BYTES = 48
_CE_LONG = {  # (max V, threads, elements a thread, CTAs a cluster, packed) by storage width
    2: ((32768, 256, 64, 2, True), (57344, 128, 64, 7, True), (65536, 256, 64, 4, True), (131072, 256, 64, 8, True)),
    4: (
        (32768, 256, 32, 4, False),
        (57344, 256, 32, 7, False),
        (65536, 256, 32, 8, False),
        (131072, 512, 32, 8, False),
    ),
}
_MACRO_PREFIX = {"bwd": "SOFTMAX_BWD_", "ce": "CROSS_ENTROPY_"}


@dataclass(frozen=True)
class TrainingClass(RowShape):
    op: str  # one of OPS
    kind: str  # one of PATHS
    threads: int  # per CTA
    elems: int  # per thread (warp kinds: per lane); 0 for loop (it walks the row)
    cluster: int = 1
    packed: bool = False
    vectors: int = 0  # loop: 16-byte vectors of each operand a thread has in flight per step
    spill: int = 0  # bytes a thread its sm_90 build may spill (SPILL_BYTES or none)

    @property
    def capacity(self) -> int | None:
        """Largest V this size class holds on chip (None: any V)."""
        if self.kind == "loop":
            return None
        return self.row_threads * self.elems * self.cluster

    def _fields(self, dtype) -> dict:
        sfx, fmt = FORMATS[dtype]
        return {
            "op": self.op,
            "sfx": sfx,
            "fmt": fmt,
            "elems": self.elems,
            "rows": self.rows_per_block,
            "threads": self.threads,
            "cluster": self.cluster,
            "p": "_p" if self.packed else "",
            "packed": ", packed 16-bit" if self.packed else "",
            "pk": "true" if self.packed else "false",
            "loop_elems": self.vectors * 16 // _width(dtype),
            "cl": "_CLUSTER" if self.cluster > 1 else "",
            "cluster_arg": f", {self.cluster}" if self.cluster > 1 else "",
        }

    def _kinds(self) -> dict:
        return _KINDS

    def _macro_prefix(self) -> str:
        return _MACRO_PREFIX[self.op]


def _width(dtype) -> int:
    return 4 if dtype == torch.float32 else 2


def _table(op: str, dtype) -> list[tuple[int, TrainingClass]]:
    """(max V, size class) of every on-chip class of `op` for `dtype`, shortest rows first."""
    width = _width(dtype)
    warpvec, rows = _TABLES[width]
    long = ()
    if op == "ce":
        rows, long = tuple(r for r in rows if r[0] <= 16384), _CE_LONG[width]
    warp_threads = 32 * WARP_ROWS_PER_BLOCK
    table = [(v, TrainingClass(op, "warp", warp_threads, e)) for v, e in _WARP_CLASSES]
    table += [(v, TrainingClass(op, "warpvec", 32 * WARPVEC_ROWS_PER_BLOCK, e)) for v, e in warpvec]
    table += [(v, TrainingClass(op, "cluster" if c > 1 else "row", t, e, c, pk)) for v, t, e, c, pk in rows]
    spill = SPILL_BYTES if width == 4 else 0
    table += [(v, TrainingClass(op, "cluster", t, e, c, pk, spill=spill)) for v, t, e, c, pk in long]
    return table


def loop_class(op: str, dtype, *, clusters: bool = True) -> TrainingClass:
    threads, vectors = LOOP_SHAPE[_width(dtype)] if clusters else LOOP_SHAPE_ONE_BLOCK
    return TrainingClass(op, "loop", threads, 0, LOOP_CLUSTER if clusters else 1, vectors=vectors)


def training_classes(op: str, dtype) -> list[TrainingClass]:
    """Every size class of `op` that can be launched for `dtype`, the two loop classes last (the
    cluster one, then the one-block one)."""
    return [p for _, p in _table(op, dtype)] + [loop_class(op, dtype), loop_class(op, dtype, clusters=False)]


def select_training_class(op: str, V: int, dtype=torch.float32, *, clusters: bool = True) -> TrainingClass:
    """The size class for rows of V elements of `dtype`; `clusters=False` is what a device without
    thread-block clusters (before sm_90) runs."""
    for vmax, size_class in _table(op, dtype):
        if V <= vmax and (clusters or size_class.cluster == 1):
            return size_class
    return loop_class(op, dtype, clusters=clusters)


def boundaries(op: str, dtype) -> list[int]:
    """V values at which `op` changes path for `dtype`: V and V + 1 use different kernels."""
    return [v for v, _ in _table(op, dtype)]


def all_boundaries(op: str) -> list[int]:
    """The union over dtypes: every dtype is tested at all of these."""
    return sorted({v for dt in FORMATS for v in boundaries(op, dt)})


# -- what a shape takes ---------------------------------------------------------------------------


def _dtype(dtype, what: str) -> torch.dtype:
    try:
        return as_dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: dtype {dtype} is not supported (float32, bfloat16, float16)") from None


def _description(op: str, what: str, B: int, V: int, dtype) -> str:
    dtype = _dtype(dtype, what)
    if V < 1:
        raise ValueError(f"{what}: V must be >= 1, got {V}")
    return "empty(no launch)" if B == 0 else select_training_class(op, V, dtype).describe()


def backward_class_description(B: int, V: int, dtype=torch.float32) -> str:
    """Description of the path the fused softmax backward takes for (B, V) rows on sm_90."""
    return _description("bwd", "fused softmax backward", B, V, dtype)


def backward_path(B: int, V: int, dtype=torch.float32) -> str:
    """The path name (one of PATHS) the fused softmax backward takes for (B, V) on sm_90."""
    return select_training_class("bwd", V, _dtype(dtype, "fused softmax backward")).kind


def cross_entropy_class_description(B: int, V: int, dtype=torch.float32) -> str:
    """Description of the path the fused cross-entropy takes for (N, V) logits on sm_90."""
    return _description("ce", "fused cross-entropy", B, V, dtype)


def cross_entropy_path(B: int, V: int, dtype=torch.float32) -> str:
    """The path name (one of PATHS) the fused cross-entropy takes for (N, V) on sm_90."""
    return select_training_class("ce", V, _dtype(dtype, "fused cross-entropy")).kind


# -- translation units ----------------------------------------------------------------------------

# Kernels every cross-entropy module holds besides the size classes: the prologue (target
# checks, weight sums, the gradient scale) and the reduction of the per-row losses.
CROSS_ENTROPY_HELPERS = ("ce_prologue", "ce_reduce")


def _op_of(path: Path) -> str:
    name = Path(path).name
    if name == BACKWARD_SOURCE.name:
        return "bwd"
    if name == CROSS_ENTROPY_SOURCE.name:
        return "ce"
    raise ValueError(f"{name} is not a training kernel source ({', '.join(p.name for p in TRAINING_SOURCES)})")


def module_source(path: Path) -> str:
    """The full translation unit for a training source: headers inlined, every size class of its op
    instantiated for every dtype (what the offline build reports check)."""
    op = _op_of(path)
    lines = [size_class.instantiation(dt) for dt in FORMATS for size_class in training_classes(op, dt)]
    return expand_includes(path) + instantiations(lines)


def kernel_source(path: Path, name: str) -> str:
    """The translation unit compiled when kernel `name` of a training source is first launched: the
    source with that one size class instantiated (the helpers need none)."""
    op = _op_of(path)
    if op == "ce" and name in CROSS_ENTROPY_HELPERS:
        return expand_includes(path) + instantiations([])
    return one_class_unit(expand_includes(path), lambda dt: training_classes(op, dt), name, path)


def spill_allowances(path: Path) -> dict[str, int]:
    """{kernel name: bytes a thread its sm_90 build may spill} for the classes that may."""
    op = _op_of(path)
    return {p.kernel_name(dt): p.spill for dt in FORMATS for p in training_classes(op, dt) if p.spill}


def expected_kernels(path: Path) -> list[str]:
    """Entry points the translation unit for `path` defines (on sm_90)."""
    op = _op_of(path)
    names = [p.kernel_name(dt) for dt in FORMATS for p in training_classes(op, dt)]
    return names + list(CROSS_ENTROPY_HELPERS) if op == "ce" else names
