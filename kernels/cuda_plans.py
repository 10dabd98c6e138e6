"""The fused kernel's dispatch table: which size class (`FusedClass`) serves a row of V elements.

A size class fixes, at compile time, how many threads share a row and how many elements each holds,
so per-thread arrays have constant sizes and stay in registers. The table is the single source
of the kernels compiled (`kernels.cuda_build` instantiates exactly these), of the dispatch
(`kernels.softmax_cuda`), and of the boundaries the tests probe. V counts elements.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .checks import torch_dtype

FORMATS = {  # torch dtype -> (kernel name suffix, C++ format struct)
    torch.float32: ("f32", "FmtF32"),
    torch.bfloat16: ("bf16", "FmtBF16"),
    torch.float16: ("f16", "FmtF16"),
}

WARP_ROWS_PER_BLOCK = 4
WARPVEC_ROWS_PER_BLOCK = 8  # measured a little ahead of 2 and 4 at (32768, 600)
# (max V, elements per lane): one warp per row. Rows up to 128 are read element by element
# (lane l holds l, l+32, ...: coalesced at any alignment, nothing to peel); longer ones as
# 16-byte vectors with a head/tail peel, which needs 4-8x fewer load/store instructions.
_WARP_CLASSES = tuple((32 * ew, ew) for ew in (1, 2, 4))
_WARPVEC_CLASSES = tuple((32 * e, e) for e in (8, 16, 24, 32))
# (max V, threads per CTA, elements per thread, CTAs per cluster[, elements per thread in shared
# memory]); row held in registers. E = 32 needs about 60 registers, so two 512-thread CTAs (or
# four 256-thread ones) share an SM and one CTA's loads overlap another's reductions. Rows past
# 16384 are split over a cluster, which both keeps them on chip and spreads a small batch over
# more SMs. The seven-CTA class exists for V around 50257: cut over 8 (fp32) or 4 (16-bit) CTAs
# such a row left a quarter of each CTA's register slots empty, over 7 about an eighth
# (reports/profiles.md). Past 131072 the clusters stay at 8 CTAs and each thread keeps up to 40
# more elements in shared memory (copied there with cp.async, no registers; 24 stay in registers,
# which leaves room for the shared-memory passes within 64 registers): clusters of
# 16 CTAs (a non-portable size sm_90 allows) held these rows in registers alone, but an H200
# places fewer 16-CTA clusters at once than its SMs would hold, and they measured 0.72-0.89 of
# copy bandwidth where 8-CTA clusters reach 0.95 (reports/profiles.md).
_ROW_CLASSES = (
    (2048, 128, 16, 1),
    (4096, 128, 32, 1),
    (8192, 256, 32, 1),
    (16384, 512, 32, 1),
    (32768, 256, 32, 4),
    (57344, 256, 32, 7),
    (65536, 256, 32, 8),
    (131072, 512, 32, 8),
    (163840, 512, 24, 8, 16),
    (212992, 512, 24, 8, 28),
    (262144, 512, 24, 8, 40),
)
# 16-bit storage, sized by bytes: past 4096 a thread keeps its 64 elements as the loaded 16-bit
# pairs (32 registers, as many bytes as an fp32 thread's 32 elements) and widens them to fp32
# in each pass. Element-sized classes left each SM with half the fp32 bytes in flight (bf16
# V >= 32000 reached only 0.54-0.73 of copy bandwidth). The CTA shapes follow the fp32 table.
# SOFTMAX_FUSED_PACK16=0 in the environment (read at import) gives 16-bit storage the fp32
# table instead, for comparisons.
# (max V, threads per CTA, elements per thread, CTAs per cluster, packed[, shared-memory elements])
PACK_16BIT_ROWS = os.environ.get("SOFTMAX_FUSED_PACK16", "1").strip() != "0"
_ROW_CLASSES_16BIT = (
    (
        (2048, 128, 16, 1, False),
        (4096, 128, 32, 1, False),
        (8192, 128, 64, 1, True),
        (16384, 256, 64, 1, True),
        (32768, 256, 64, 2, True),
        (57344, 128, 64, 7, True),
        (65536, 256, 64, 4, True),
        (131072, 256, 64, 8, True),
        (163840, 256, 48, 8, True, 32),
        (212992, 256, 48, 8, True, 56),
        (262144, 256, 48, 8, True, 80),
    )
    if PACK_16BIT_ROWS
    else tuple((v, t, e, c, False, *rest) for v, t, e, c, *rest in _ROW_CLASSES)
)
# The split path, for rows past the largest cluster class: P CTAs per row, each holding a slice
# in registers and shared memory as the classes above do, meeting through a per-row workspace
# in global memory, up to SPLIT_MAX_PARTS slices (all of a row's CTAs must be resident at once:
# 128 <= 2 CTAs on each of 64 SMs). A small batch is cut into more slices than it needs, so that
# it covers the GPU (`fused_parts`). (Cutting the rows the clusters hold that way measured 1-3 µs
# slower at B <= 16 than the cluster class: two meetings through L2 cost more than the SMs
# they add; reports/profiles.md.)
# (threads per CTA, elements per thread, packed, shared-memory elements per thread); 16-bit rows
# take the fp32 CTA shape here: the meetings' code needs registers the packed 256-thread CTAs
# did not have (ptxas spilled them).
_SPLIT_CLASS_32 = (512, 24, False, 40)
_SPLIT_CLASS_16BIT = (512, 24, True, 40) if PACK_16BIT_ROWS else (512, 24, False, 40)
SPLIT_MAX_PARTS = 128
SPREAD_MIN_SLICE = 2048  # elements: a small batch's slices are cut no shorter than this
# The loop path, for rows past the split's capacity: P CTAs per row (as many as there are SMs, up
# to LOOP_MAX_PARTS, slices of at least LOOP_MIN_SLICE) meet as split does and read their slice
# three times. One 1024-thread CTA per SM, so a row's CTAs are resident together when P <= SMs.
LOOP_THREADS = 1024
LOOP_ELEMS = 16  # elements per thread in flight per step of the three passes
LOOP_MAX_PARTS = 128
LOOP_MIN_SLICE = 16384
# Polls of a row's arrival counter before a CTA stops waiting for its partners and reads the
# whole row itself (milliseconds: only a GPU shared with other work or a capped grid reaches it).
SPLIT_MAX_POLLS = 1 << 14

# Per kind (path): kernel name, description (the path's name, then the class's shape), and the
# instantiation macro of softmax_fused.cu.
_KINDS = {
    "warp": (
        "fused_warp_{sfx}_e{elems}",
        "warp(rows/block={rows}, elems/lane={elems})",
        "SOFTMAX_FUSED_WARP({name}, {fmt}, {elems}, {rows})",
    ),
    "warpvec": (
        "fused_warpvec_{sfx}_e{elems}_r{rows}",
        "warpvec(rows/block={rows}, elems/lane={elems}, 16-byte vectors)",
        "SOFTMAX_FUSED_WARPVEC({name}, {fmt}, {elems}, {rows})",
    ),
    "row": (
        "fused_row_{sfx}_t{threads}_e{elems}_c{cluster}{p}",
        "row(cluster={cluster}, threads={threads}, elems/thread={elems}{packed})",
        "SOFTMAX_FUSED_ROW({name}, {fmt}, {threads}, {elems}, {pk})",
    ),
    "cluster": (
        "fused_cluster_{sfx}_t{threads}_e{elems}_c{cluster}{p}{s}",
        "cluster(cluster={cluster}, threads={threads}, elems/thread={elems}{stashed}{packed})",
        "SOFTMAX_FUSED_CLUSTER({name}, {fmt}, {threads}, {elems}, {cluster}, {pk}, {stash})",
    ),
    "split": (
        "fused_split_{sfx}_t{threads}_e{elems}{p}{s}",
        "split(CTAs per row meet in global memory, threads={threads}, elems/thread={elems}{stashed}{packed})",
        "SOFTMAX_FUSED_SPLIT({name}, {fmt}, {threads}, {elems}, {pk}, {stash})",
    ),
    "loop": (
        "fused_loop_{sfx}_t{threads}",
        "loop(CTAs per row meet in global memory, threads={threads}, three passes)",
        "SOFTMAX_FUSED_LOOP({name}, {fmt}, {threads}, {loop_elems})",
    ),
}
PATHS = tuple(_KINDS)


class RowShape:
    """How a size class's CTA covers rows, from its `kind` and `threads` (shared by the forward
    classes and the training kernels' plans): the warp kinds give each row a warp, the others
    the whole CTA."""

    @property
    def row_threads(self) -> int:
        """Threads that share one row slice."""
        return 32 if self.kind in ("warp", "warpvec") else self.threads

    @property
    def rows_per_block(self) -> int:
        return self.threads // 32 if self.kind in ("warp", "warpvec") else 1

    # A subclass gives its table of kinds -> (kernel-name, description, instantiation formats),
    # the fields they are formatted with, and the prefix of its instantiation macros.
    def _kinds(self) -> dict:
        raise NotImplementedError

    def _fields(self, dtype) -> dict:
        raise NotImplementedError

    def _macro_prefix(self) -> str:
        return ""

    def kernel_name(self, dtype: torch.dtype) -> str:
        return self._kinds()[self.kind][0].format(**self._fields(dtype))

    def describe(self) -> str:
        return self._kinds()[self.kind][1].format(**self._fields(torch.float32))

    def instantiation(self, dtype: torch.dtype) -> str:
        if self.packed and dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{self.describe()} is for 16-bit storage, not {dtype}")
        fields = self._fields(dtype)
        return self._macro_prefix() + self._kinds()[self.kind][2].format(name=self.kernel_name(dtype), **fields)


@dataclass(frozen=True)
class FusedClass(RowShape):
    kind: str  # one of PATHS
    threads: int  # per CTA
    elems: int  # per thread (warp kinds: per lane); 0 for loop (it walks the row)
    cluster: int = 1
    packed: bool = False  # row / cluster / split only: the body is held in 16-bit storage form
    stash: int = 0  # cluster / split only: elements per thread held in shared memory besides

    @property
    def slice_capacity(self) -> int | None:
        """Elements one CTA (a warp, for the warp kinds) holds on chip (None: loop)."""
        return None if self.kind == "loop" else self.row_threads * (self.elems + self.stash)

    def shared_bytes(self, dtype) -> int:
        """Dynamic shared memory a CTA of this class needs for `dtype` (its stash)."""
        return self.threads * self.stash * torch.tensor([], dtype=dtype).element_size()

    @property
    def capacity(self) -> int | None:
        """Largest V this class holds on chip (None: any V)."""
        if self.kind == "loop":
            return None
        if self.kind == "split":
            return self.slice_capacity * SPLIT_MAX_PARTS
        return self.slice_capacity * self.cluster

    @property
    def meets_in_memory(self) -> bool:
        """Split and loop: several CTAs per row meeting through a global workspace."""
        return self.kind in ("split", "loop")

    def _fields(self, dtype) -> dict:
        sfx, fmt = FORMATS[dtype]
        return {
            "sfx": sfx,
            "fmt": fmt,
            "elems": self.elems,
            "rows": self.rows_per_block,
            "threads": self.threads,
            "cluster": self.cluster,
            "p": "_p" if self.packed else "",
            "packed": ", packed 16-bit" if self.packed else "",
            "s": f"_s{self.stash}" if self.stash else "",
            "stashed": f" + {self.stash} in shared memory" if self.stash else "",
            "stash": self.stash,
            "pk": "true" if self.packed else "false",
            "loop_elems": LOOP_ELEMS,
        }

    def _kinds(self) -> dict:
        return _KINDS


_WARP_TABLE = [(v, FusedClass("warp", 32 * WARP_ROWS_PER_BLOCK, ew)) for v, ew in _WARP_CLASSES] + [
    (v, FusedClass("warpvec", 32 * WARPVEC_ROWS_PER_BLOCK, e)) for v, e in _WARPVEC_CLASSES
]
_ROW_TABLE_32 = [(v, FusedClass("cluster" if c > 1 else "row", t, e, c, False, *s)) for v, t, e, c, *s in _ROW_CLASSES]
_ROW_TABLE_16 = [
    (v, FusedClass("cluster" if c > 1 else "row", t, e, c, pk, *s)) for v, t, e, c, pk, *s in _ROW_CLASSES_16BIT
]
_ROW_TABLE = {torch.float32: _ROW_TABLE_32, torch.bfloat16: _ROW_TABLE_16, torch.float16: _ROW_TABLE_16}
_SPLIT_32 = FusedClass("split", *_SPLIT_CLASS_32[:2], 1, *_SPLIT_CLASS_32[2:])
_SPLIT_16 = FusedClass("split", *_SPLIT_CLASS_16BIT[:2], 1, *_SPLIT_CLASS_16BIT[2:])
SPLIT_CLASSES = {torch.float32: _SPLIT_32, torch.bfloat16: _SPLIT_16, torch.float16: _SPLIT_16}
LOOP_CLASS = FusedClass("loop", LOOP_THREADS, 0)

# V values at which `fused` changes path for a dtype: V and V + 1 use different kernels. The
# last is the split's capacity; the loop takes any V past it. The path does not depend on B.
_WARP_BOUNDARIES = [v for v, _ in _WARP_CLASSES] + [v for v, _ in _WARPVEC_CLASSES]
DISPATCH_BOUNDARIES_BY_DTYPE = {
    dt: _WARP_BOUNDARIES + [v for v, _ in _ROW_TABLE[dt]] + [SPLIT_CLASSES[dt].capacity] for dt in FORMATS
}
# Every dtype is tested at all of these (the union over dtypes).
DISPATCH_BOUNDARIES = sorted({v for b in DISPATCH_BOUNDARIES_BY_DTYPE.values() for v in b})


def fused_classes(dtype) -> list[FusedClass]:
    """Every size class `softmax_fused` can launch for `dtype`, the loop fallback last."""
    return [p for _, p in _WARP_TABLE] + [p for _, p in _ROW_TABLE[dtype]] + [SPLIT_CLASSES[dtype], LOOP_CLASS]


def select_fused_class(V: int, dtype=torch.float32, *, clusters: bool = True) -> FusedClass:
    """The size class for rows of V elements of `dtype`: the first class that holds the row, else
    split, else loop. `clusters=False` is what a device without thread-block clusters (before
    sm_90) runs: the rows the clusters hold go to split."""
    for vmax, size_class in _WARP_TABLE + _ROW_TABLE[dtype]:
        if V <= vmax and (clusters or size_class.cluster == 1):
            return size_class
    split = SPLIT_CLASSES[dtype]
    return split if V <= split.capacity else LOOP_CLASS


def slice_length(V: int, parts: int) -> int:
    """Elements in each slice when a row of V is cut into `parts` (as the kernels cut it: a
    multiple of 8, so every slice of a 16-byte aligned row is aligned too; the last is shorter)."""
    return V if parts == 1 else (-(-V // parts) + 7) // 8 * 8


def min_parts(size_class: FusedClass, V: int) -> int:
    """The fewest CTAs per row whose slices fit a split class's CTAs (1 for the loop)."""
    if size_class.kind != "split":
        return 1
    cap = size_class.slice_capacity
    parts = -(-V // cap)
    while slice_length(V, parts) > cap:
        parts += 1
    return parts


def fused_parts(size_class: FusedClass, B: int, V: int, sm_count: int) -> int:
    """CTAs per row for a split or loop launch of (B, V) on a GPU of `sm_count` SMs (1 otherwise).

    split: as few as hold the row, or, where B is small, enough that the batch has about one
    CTA per SM (slices no shorter than SPREAD_MIN_SLICE). loop: one per SM up to
    LOOP_MAX_PARTS, slices no shorter than LOOP_MIN_SLICE. Either way every CTA of a row can be
    resident at once; the launch checks that for split (`split_fits`)."""
    if size_class.kind == "split":
        spread = min(-(-sm_count // max(B, 1)), V // SPREAD_MIN_SLICE, SPLIT_MAX_PARTS)
        return max(min_parts(size_class, V), spread)
    if size_class.kind == "loop":
        return max(1, min(LOOP_MAX_PARTS, sm_count, -(-V // LOOP_MIN_SLICE)))
    return 1


def split_fits(size_class: FusedClass, V: int, sm_count: int) -> bool:
    """Whether a GPU of `sm_count` SMs holds all of a row's split CTAs at once (launch bounds
    promise 1024 threads' worth of CTAs per SM); where not, rows go to the loop instead."""
    return min_parts(size_class, V) <= sm_count * (1024 // size_class.threads)


def as_dtype(dtype) -> torch.dtype:
    """A torch dtype from a dtype or a name such as "bf16"; TypeError when fused lacks it."""
    try:
        dtype = torch_dtype(dtype)
    except TypeError:
        pass
    if dtype not in FORMATS:
        raise TypeError(f"fused softmax: dtype {dtype} is not supported")
    return dtype


def fused_class_description(B: int, V: int, dtype=torch.float32) -> str:
    """The size class `softmax_fused` launches for a (B, V) input of `dtype` on sm_90, described:
    its path's name, then its shape ("row(cluster=1, threads=128, elems/thread=32)")."""
    dtype = as_dtype(dtype)
    if V < 1:
        raise ValueError(f"fused softmax: V must be >= 1, got {V}")
    if B == 0:
        return "empty(no launch)"
    return select_fused_class(V, dtype).describe()


def fused_path(B: int, V: int, dtype=torch.float32) -> str:
    """The path name (one of PATHS) `softmax_fused` takes for a (B, V) input on sm_90."""
    return select_fused_class(V, as_dtype(dtype)).kind
