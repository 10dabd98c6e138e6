"""The fused kernel's dispatch table: which size class (plan) serves a row of V elements.

A plan fixes, at compile time, how many threads share a row and how many elements each holds,
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
# (max V, threads per CTA, elements per thread, CTAs per cluster); row held in registers.
# E = 32 needs about 60 registers, so two 512-thread CTAs (or four 256-thread ones) share an SM
# and one CTA's loads overlap another's reductions. Rows past 16384 are split over a cluster,
# which both keeps them on chip and spreads a small batch over more SMs. The seven-CTA class
# exists for V around 50257: cut over 8 (fp32) or 4 (16-bit) CTAs such a row left a quarter of
# each CTA's register slots empty, over 7 about an eighth (reports/profiles.md).
_ROW_CLASSES = (
    (2048, 128, 16, 1),
    (4096, 128, 32, 1),
    (8192, 256, 32, 1),
    (16384, 512, 32, 1),
    (32768, 256, 32, 4),
    (57344, 256, 32, 7),
    (65536, 256, 32, 8),
    (131072, 512, 32, 8),
)
# 16-bit storage, sized by bytes: past 4096 a thread keeps its 64 elements as the loaded 16-bit
# pairs (32 registers, as many bytes as an fp32 thread's 32 elements) and widens them to fp32
# in each pass. Element-sized classes left each SM with half the fp32 bytes in flight (bf16
# V >= 32000 reached only 0.54-0.73 of copy bandwidth). The CTA shapes follow the fp32 table.
# SOFTMAX_FUSED_PACK16=0 in the environment (read at import) gives 16-bit storage the fp32
# table instead, for comparisons.
# (max V, threads per CTA, elements per thread, CTAs per cluster, packed)
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
    )
    if PACK_16BIT_ROWS
    else tuple((v, t, e, c, False) for v, t, e, c in _ROW_CLASSES)
)
ONLINE_THREADS = 1024
ONLINE_ELEMS = 16  # elements per thread in flight per step of the long-row loop

# Per kind: kernel name, description, and the instantiation macro of softmax_fused.cu.
_KINDS = {
    "warp": (
        "fused_warp_{sfx}_e{elems}",
        "warp(rows/block={rows}, elems/lane={elems})",
        "SOFTMAX_FUSED_WARP({name}, {fmt}, {elems}, {rows})",
    ),
    "warpvec": (
        "fused_warpvec_{sfx}_e{elems}_r{rows}",
        "warp(rows/block={rows}, elems/lane={elems}, 16-byte vectors)",
        "SOFTMAX_FUSED_WARPVEC({name}, {fmt}, {elems}, {rows})",
    ),
    "row": (
        "fused_row_{sfx}_t{threads}_e{elems}_c{cluster}{p}",
        "row(cluster={cluster}, threads={threads}, elems/thread={elems}{packed})",
        "SOFTMAX_FUSED_ROW({name}, {fmt}, {threads}, {elems}, {pk})",
    ),
    "cluster": (
        "fused_cluster_{sfx}_t{threads}_e{elems}_c{cluster}{p}",
        "cluster(cluster={cluster}, threads={threads}, elems/thread={elems}{packed})",
        "SOFTMAX_FUSED_CLUSTER({name}, {fmt}, {threads}, {elems}, {cluster}, {pk})",
    ),
    "online": (
        "fused_online_{sfx}_t{threads}",
        "online(threads={threads}, three passes)",
        "SOFTMAX_FUSED_ONLINE({name}, {fmt}, {threads}, {online_elems})",
    ),
}
PATHS = tuple(_KINDS)


@dataclass(frozen=True)
class FusedPlan:
    kind: str  # one of PATHS
    threads: int  # per CTA
    elems: int  # per thread (warp kinds: per lane); 0 for online (loops)
    cluster: int = 1
    packed: bool = False  # row / cluster only: the body is held in 16-bit storage form

    @property
    def row_threads(self) -> int:
        """Threads that share one row slice."""
        return 32 if self.kind in ("warp", "warpvec") else self.threads

    @property
    def rows_per_block(self) -> int:
        return self.threads // 32 if self.kind in ("warp", "warpvec") else 1

    @property
    def capacity(self) -> int | None:
        """Largest V this plan holds on chip (None: any V)."""
        if self.kind == "online":
            return None
        return self.row_threads * self.elems * self.cluster

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
            "pk": "true" if self.packed else "false",
            "online_elems": ONLINE_ELEMS,
        }

    def kernel_name(self, dtype: torch.dtype) -> str:
        return _KINDS[self.kind][0].format(**self._fields(dtype))

    def describe(self) -> str:
        return _KINDS[self.kind][1].format(**self._fields(torch.float32))

    def instantiation(self, dtype: torch.dtype) -> str:
        if self.packed and dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{self.describe()} is for 16-bit storage, not {dtype}")
        fields = self._fields(dtype)
        return _KINDS[self.kind][2].format(name=self.kernel_name(dtype), **fields)


_WARP_PLANS = [(v, FusedPlan("warp", 32 * WARP_ROWS_PER_BLOCK, ew)) for v, ew in _WARP_CLASSES] + [
    (v, FusedPlan("warpvec", 32 * WARPVEC_ROWS_PER_BLOCK, e)) for v, e in _WARPVEC_CLASSES
]
_ROW_PLANS_32 = [(v, FusedPlan("cluster" if c > 1 else "row", t, e, c)) for v, t, e, c in _ROW_CLASSES]
_ROW_PLANS_16 = [(v, FusedPlan("cluster" if c > 1 else "row", t, e, c, pk)) for v, t, e, c, pk in _ROW_CLASSES_16BIT]
_ROW_PLANS = {torch.float32: _ROW_PLANS_32, torch.bfloat16: _ROW_PLANS_16, torch.float16: _ROW_PLANS_16}
ONLINE_PLAN = FusedPlan("online", ONLINE_THREADS, 0)

# V values at which `fused` changes path for a dtype: V and V + 1 use different kernels.
_WARP_BOUNDARIES = [v for v, _ in _WARP_CLASSES] + [v for v, _ in _WARPVEC_CLASSES]
DISPATCH_BOUNDARIES_BY_DTYPE = {dt: _WARP_BOUNDARIES + [v for v, _ in _ROW_PLANS[dt]] for dt in FORMATS}
# Every dtype is tested at all of these (the union over dtypes).
DISPATCH_BOUNDARIES = sorted({v for b in DISPATCH_BOUNDARIES_BY_DTYPE.values() for v in b})


def fused_plans(dtype) -> list[FusedPlan]:
    """Every plan `softmax_fused` can launch for `dtype`, the online fallback last."""
    return [p for _, p in _WARP_PLANS] + [p for _, p in _ROW_PLANS[dtype]] + [ONLINE_PLAN]


# Union over dtypes, in first-seen order, online last.
ALL_FUSED_PLANS = list(dict.fromkeys(p for dt in FORMATS for p in fused_plans(dt)[:-1])) + [ONLINE_PLAN]


def select_fused_plan(V: int, dtype=torch.float32, *, clusters: bool = True) -> FusedPlan:
    """The plan for rows of V elements of `dtype`; `clusters=False` is what a device without
    thread-block clusters (before sm_90) runs."""
    for vmax, plan in _WARP_PLANS + _ROW_PLANS[dtype]:
        if V <= vmax and (clusters or plan.cluster == 1):
            return plan
    return ONLINE_PLAN


def as_dtype(dtype) -> torch.dtype:
    """A torch dtype from a dtype or a name such as "bf16"; TypeError when fused lacks it."""
    try:
        dtype = torch_dtype(dtype)
    except TypeError:
        pass
    if dtype not in FORMATS:
        raise TypeError(f"fused softmax: dtype {dtype} is not supported")
    return dtype


def fused_plan(B: int, V: int, dtype=torch.float32) -> str:
    """Description of the path `softmax_fused` takes for a (B, V) input of `dtype` on sm_90."""
    dtype = as_dtype(dtype)
    if V < 1:
        raise ValueError(f"fused softmax: V must be >= 1, got {V}")
    if B == 0:
        return "empty(no launch)"
    return select_fused_plan(V, dtype).describe()


def fused_path(B: int, V: int, dtype=torch.float32) -> str:
    """The path name (one of PATHS) `softmax_fused` takes for a (B, V) input on sm_90."""
    return select_fused_plan(V, as_dtype(dtype)).kind
