"""CUDA C softmax kernels (kernels/cuda/*.cu), compiled at run time through CuPy.

Three versions side by side, each adding one idea to the last:
  naive  one thread per row, three serial passes (max, sum, normalise); float32 only.
  smem   one block per row, shared-memory tree reductions, three coalesced passes; float32 only.
  fused  the row read once and written once, held in registers between; float32, bfloat16,
         float16 storage with float32 arithmetic. A size class per row length (see
         `fused_plan`), so per-thread arrays have compile-time sizes and never spill.

Inputs: a (B, V) CUDA tensor. A non-contiguous input is copied with `.contiguous()` first
(the kernels assume a row stride of V); a contiguous input at any storage offset is read in
place. `out`, if given, must be contiguous (checks.prepare_output). Launches go to torch's
current stream on the tensor's device. CuPy is imported on first call, never at import time.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checks import check_softmax_input, prepare_output

CUDA_DIR = Path(__file__).resolve().parent / "cuda"
COMMON_HEADER = CUDA_DIR / "softmax_common.cuh"
CU_SOURCES = [CUDA_DIR / "softmax_naive.cu", CUDA_DIR / "softmax_smem.cu", CUDA_DIR / "softmax_fused.cu"]

# Options given to CuPy's nvcc backend. CuPy adds `-gencode=arch=compute_XX,code=sm_XX` for the
# device itself (so no -arch here: two architecture flags would conflict) and `-ftz=true`.
NVCC_OPTIONS = ("-std=c++17", "-O3")
CUPY_IMPLICIT_OPTIONS = ("-ftz=true",)
# The offline build (tests/test_cuda_compile.py, `ptxas_report`) targets the H200.
TARGET_ARCH = "sm_90"
PTXAS_CHECK_OPTIONS = ("-Xptxas", "-v,-warn-spills,-Werror")

_INCLUDE_LINE = '#include "softmax_common.cuh"'

# ---------------------------------------------------------------------------------------------
# fused dispatch table (V counts elements). The warp classes and the shorter row classes are
# shared by all dtypes (a thread holds its elements as float32 whatever the storage type); the
# longer 16-bit row classes keep their rows packed (see _ROW_CLASSES_16BIT).

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
# which both keeps them on chip and spreads a small batch over more SMs.
_ROW_CLASSES = (
    (2048, 128, 16, 1),
    (4096, 128, 32, 1),
    (8192, 256, 32, 1),
    (16384, 512, 32, 1),
    (32768, 256, 32, 4),
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
    (2048, 128, 16, 1, False),
    (4096, 128, 32, 1, False),
    (8192, 128, 64, 1, True),
    (16384, 256, 64, 1, True),
    (32768, 256, 64, 2, True),
    (65536, 256, 64, 4, True),
    (131072, 256, 64, 8, True),
) if PACK_16BIT_ROWS else tuple((v, t, e, c, False) for v, t, e, c in _ROW_CLASSES)
ONLINE_THREADS = 1024
ONLINE_ELEMS = 16  # elements per thread in flight per step of the online loop

# V values at which `fused` changes path for a dtype: V and V + 1 use different kernels.
_WARP_BOUNDARIES = [v for v, _ in _WARP_CLASSES] + [v for v, _ in _WARPVEC_CLASSES]
DISPATCH_BOUNDARIES_BY_DTYPE = {
    torch.float32: _WARP_BOUNDARIES + [v for v, *_ in _ROW_CLASSES],
    torch.bfloat16: _WARP_BOUNDARIES + [v for v, *_ in _ROW_CLASSES_16BIT],
    torch.float16: _WARP_BOUNDARIES + [v for v, *_ in _ROW_CLASSES_16BIT],
}
# Every dtype is tested at all of these (the union over dtypes).
DISPATCH_BOUNDARIES = sorted({v for b in DISPATCH_BOUNDARIES_BY_DTYPE.values() for v in b})

_FORMATS = {  # torch dtype -> (kernel name suffix, C++ format struct)
    torch.float32: ("f32", "FmtF32"),
    torch.bfloat16: ("bf16", "FmtBF16"),
    torch.float16: ("f16", "FmtF16"),
}
_VEC_BYTES = 16
_MAX_GRID_X = 2**31 - 1
# Grid caps. Rows past the grid are looped over inside the kernels; tests lower these caps to
# exercise those loops at small B.
_ROW_GRID_CAP = _MAX_GRID_X
_WARP_BLOCKS_PER_SM = 32
# Tests set this to a FusedPlan to run a path outside its usual V range (it must hold the row).
_PLAN_OVERRIDE = None


@dataclass(frozen=True)
class FusedPlan:
    kind: str  # "warp", "warpvec", "row", "cluster" or "online"
    threads: int  # per CTA
    elems: int  # per thread (warp: per lane); 0 for online (loops)
    cluster: int = 1
    packed: bool = False  # row / cluster only: the body is held in 16-bit storage form

    @property
    def row_threads(self) -> int:
        """Threads that share one row slice."""
        return 32 if self.kind in ("warp", "warpvec") else self.threads

    @property
    def capacity(self) -> int | None:
        """Largest V this plan holds on chip (None: any V)."""
        if self.kind in ("warp", "warpvec"):
            return 32 * self.elems
        if self.kind == "online":
            return None
        return self.threads * self.elems * self.cluster

    def kernel_name(self, dtype: torch.dtype) -> str:
        sfx = _FORMATS[dtype][0]
        if self.kind == "warp":
            return f"fused_warp_{sfx}_e{self.elems}"
        if self.kind == "warpvec":
            return f"fused_warpvec_{sfx}_e{self.elems}_r{self.threads // 32}"
        if self.kind == "online":
            return f"fused_online_{sfx}_t{self.threads}"
        p = "_p" if self.packed else ""
        return f"fused_{self.kind}_{sfx}_t{self.threads}_e{self.elems}_c{self.cluster}{p}"

    def describe(self) -> str:
        if self.kind == "warp":
            return f"warp(rows/block={self.threads // 32}, elems/lane={self.elems})"
        if self.kind == "warpvec":
            return f"warp(rows/block={self.threads // 32}, elems/lane={self.elems}, 16-byte vectors)"
        if self.kind == "online":
            return f"online(threads={self.threads}, two passes)"
        p = ", packed 16-bit" if self.packed else ""
        return f"{self.kind}(cluster={self.cluster}, threads={self.threads}, elems/thread={self.elems}{p})"

    def instantiation(self, dtype: torch.dtype) -> str:
        fmt = _FORMATS[dtype][1]
        name = self.kernel_name(dtype)
        if self.kind == "warp":
            return f"SOFTMAX_FUSED_WARP({name}, {fmt}, {self.elems}, {self.threads // 32})"
        if self.kind == "warpvec":
            return f"SOFTMAX_FUSED_WARPVEC({name}, {fmt}, {self.elems}, {self.threads // 32})"
        if self.kind == "online":
            return f"SOFTMAX_FUSED_ONLINE({name}, {fmt}, {self.threads}, {ONLINE_ELEMS})"
        if self.packed and dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{self.describe()} is for 16-bit storage, not {dtype}")
        p = "true" if self.packed else "false"
        if self.kind == "row":
            return f"SOFTMAX_FUSED_ROW({name}, {fmt}, {self.threads}, {self.elems}, {p})"
        return f"SOFTMAX_FUSED_CLUSTER({name}, {fmt}, {self.threads}, {self.elems}, {self.cluster}, {p})"


_WARP_PLANS = ([(v, FusedPlan("warp", 32 * WARP_ROWS_PER_BLOCK, ew)) for v, ew in _WARP_CLASSES]
               + [(v, FusedPlan("warpvec", 32 * WARPVEC_ROWS_PER_BLOCK, e)) for v, e in _WARPVEC_CLASSES])
_ROW_PLANS_32 = [(v, FusedPlan("cluster" if c > 1 else "row", t, e, c)) for v, t, e, c in _ROW_CLASSES]
_ROW_PLANS_16 = [(v, FusedPlan("cluster" if c > 1 else "row", t, e, c, pk))
                 for v, t, e, c, pk in _ROW_CLASSES_16BIT]
_ROW_PLANS = {torch.float32: _ROW_PLANS_32, torch.bfloat16: _ROW_PLANS_16, torch.float16: _ROW_PLANS_16}
_ONLINE_PLAN = FusedPlan("online", ONLINE_THREADS, 0)


def fused_plans(dtype) -> list[FusedPlan]:
    """Every plan `softmax_fused` can launch for `dtype`, the online fallback last."""
    return [p for _, p in _WARP_PLANS] + [p for _, p in _ROW_PLANS[dtype]] + [_ONLINE_PLAN]


# Union over dtypes, in first-seen order, online last.
ALL_FUSED_PLANS = list(dict.fromkeys(p for dt in (torch.float32, torch.bfloat16, torch.float16)
                                     for p in fused_plans(dt)[:-1])) + [_ONLINE_PLAN]


def _select_plan(V: int, clusters_ok: bool = True, dtype=torch.float32) -> FusedPlan:
    for vmax, plan in _WARP_PLANS + _ROW_PLANS[dtype]:
        if V <= vmax and (clusters_ok or plan.cluster == 1):
            return plan
    return _ONLINE_PLAN


_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def fused_plan(B: int, V: int, dtype=torch.float32) -> str:
    """Name of the path `softmax_fused` takes for a (B, V) input of `dtype` (a torch dtype or a
    name such as "bf16") on an sm_90 device."""
    dtype = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in _FORMATS:
        raise TypeError(f"fused softmax: dtype {dtype} is not supported")
    if V < 1:
        raise ValueError(f"fused softmax: V must be >= 1, got {V}")
    if B == 0:
        return "empty(no launch)"
    return _select_plan(V, dtype=dtype).describe()


# ---------------------------------------------------------------------------------------------
# sources

def expand_source(path: Path) -> str:
    """The .cu text with the shared header pasted in place of its #include, so that the
    compile cache (keyed on the source text) sees header edits too."""
    text = Path(path).read_text()
    header = COMMON_HEADER.read_text()
    if _INCLUDE_LINE not in text:
        raise RuntimeError(f"{path} does not include softmax_common.cuh")
    return text.replace(_INCLUDE_LINE, header, 1)


def fused_instantiations() -> str:
    lines = [plan.instantiation(dt) for dt in _FORMATS for plan in fused_plans(dt)]
    return "\n// ---- instantiations generated from the dispatch table ----\n" + "\n".join(lines) + "\n"


def module_source(path: Path) -> str:
    """The full translation unit compiled for `path` (header inlined, kernels instantiated)."""
    src = expand_source(path)
    if Path(path).name == "softmax_fused.cu":
        src += fused_instantiations()
    return src


def expected_kernels(path: Path) -> list[str]:
    """Entry points the translation unit for `path` must define."""
    name = Path(path).name
    if name == "softmax_naive.cu":
        return ["softmax_naive_f32"]
    if name == "softmax_smem.cu":
        return ["softmax_smem_f32"]
    return [plan.kernel_name(dt) for dt in _FORMATS for plan in fused_plans(dt)]


# ---------------------------------------------------------------------------------------------
# offline build report (no GPU needed)

_FN_RE = re.compile(r"Compiling entry function '(\w+)'")
_PROPS_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers(.*)")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(text: str) -> dict[str, dict[str, int]]:
    """Per-kernel {registers, smem_bytes, stack_bytes, spill_stores, spill_loads} from ptxas -v."""
    report: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = _FN_RE.search(line)
        if m:
            current = m.group(1)
            report[current] = {}
            continue
        if current is None:
            continue
        m = _PROPS_RE.search(line)
        if m:
            report[current].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                                   spill_loads=int(m.group(3)))
            continue
        m = _USED_RE.search(line)
        if m:
            s = _SMEM_RE.search(m.group(2))
            report[current].update(registers=int(m.group(1)), smem_bytes=int(s.group(1)) if s else 0)
    return report


def compile_offline(path: Path, *, arch: str = TARGET_ARCH, nvcc: str | None = None,
                    extra=()) -> subprocess.CompletedProcess:
    """nvcc -cubin the translation unit for `path` with the runtime options plus ptxas checks."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / Path(path).name
        cu.write_text(module_source(path))
        cmd = [nvcc, f"-arch={arch}", "-cubin", "-o", str(cu.with_suffix(".cubin")),
               *NVCC_OPTIONS, *CUPY_IMPLICIT_OPTIONS, *PTXAS_CHECK_OPTIONS, *extra, str(cu)]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)


def ptxas_report(arch: str = TARGET_ARCH, nvcc: str | None = None) -> dict[str, dict[str, int]]:
    """Registers / shared memory / stack / spills of every kernel, parsed from ptxas -v."""
    report: dict[str, dict[str, int]] = {}
    for path in CU_SOURCES:
        res = compile_offline(path, arch=arch, nvcc=nvcc)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed for {path.name}:\n{res.stdout}\n{res.stderr}")
        report.update(parse_ptxas_report(res.stdout + res.stderr))
    return report


def format_ptxas_report(report: dict[str, dict[str, int]]) -> str:
    rows = [f"{'kernel':44s} {'regs':>4s} {'smem':>6s} {'stack':>5s} {'spill st/ld':>11s}"]
    for name, r in report.items():
        rows.append(f"{name:44s} {r.get('registers', -1):4d} {r.get('smem_bytes', -1):6d} "
                    f"{r.get('stack_bytes', -1):5d} {r.get('spill_stores', -1):5d}/{r.get('spill_loads', -1):<5d}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# runtime: CuPy modules, streams, launches

_modules: dict = {}  # (device index, source sha256) -> cupy.RawModule
_kernels: dict = {}  # (device index, kernel name) -> cupy.RawKernel
_streams: dict = {}  # (device index, stream pointer) -> cupy.cuda.ExternalStream
_device_info: dict = {}  # device index -> (SM count, compute capability major)


def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the CUDA C softmax kernels (naive, smem, fused) need CuPy: pip install cupy-cuda13x "
            "(or the cupy-cuda12x wheel matching the installed CUDA driver)") from e
    return cupy


def _sm_count_and_major(device_index: int) -> tuple[int, int]:
    info = _device_info.get(device_index)
    if info is None:
        props = torch.cuda.get_device_properties(device_index)
        info = (props.multi_processor_count, props.major)
        _device_info[device_index] = info
    return info


def _kernel(device_index: int, path: Path, name: str):
    key = (device_index, name)
    k = _kernels.get(key)
    if k is not None:
        return k
    cp = _cupy()
    src = module_source(path)
    mkey = (device_index, hashlib.sha256(src.encode()).hexdigest())
    with cp.cuda.Device(device_index):
        mod = _modules.get(mkey)
        if mod is None:
            backend = "nvcc" if cp.cuda.get_nvcc_path() else "nvrtc"  # the source needs no headers
            mod = cp.RawModule(code=src, options=NVCC_OPTIONS, backend=backend)
            _modules[mkey] = mod
        k = mod.get_function(name)
    _kernels[key] = k
    return k


def _stream(cp, device_index: int):
    ptr = torch.cuda.current_stream(device_index).cuda_stream
    s = _streams.get((device_index, ptr))
    if s is None:
        with warnings.catch_warnings():  # deprecated in CuPy 14 in favour of from_external
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cp.cuda.ExternalStream(ptr, device_index)
        _streams[(device_index, ptr)] = s
    return s


def _launch(x: torch.Tensor, path: Path, name: str, grid: int, block: int, args: tuple) -> None:
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    k = _kernel(dev, path, name)
    cp = _cupy()
    with cp.cuda.Device(dev), _stream(cp, dev):
        k((grid,), (block,), args)


def _prepare(x, out, kernel: str, dtypes):
    check_softmax_input(x, kernel=kernel, dtypes=dtypes)
    if x.shape[1] >= 2**31 - 2**20:
        raise ValueError(f"{kernel} softmax: V = {x.shape[1]} exceeds the kernels' 32-bit column index")
    if not x.is_contiguous():
        x = x.contiguous()  # the kernels assume rows of stride V
    y = prepare_output(x, out, kernel=kernel)
    return x, y


def _ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())  # a 64-bit kernel parameter, whatever CuPy's int default


def softmax_naive(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """One thread per row (float32)."""
    x, y = _prepare(x, out, "naive", (torch.float32,))
    B, V = x.shape
    if B == 0:
        return y
    threads = 256
    grid = -(-B // threads)
    if grid > _MAX_GRID_X:
        raise ValueError(f"naive softmax: B = {B} needs more than 2^31 - 1 blocks")
    _launch(x, CU_SOURCES[0], "softmax_naive_f32", grid, threads,
            (_ptr(x), _ptr(y), np.int64(B), np.int32(V)))
    return y


def softmax_smem(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """One block per row, shared-memory tree reductions (float32)."""
    x, y = _prepare(x, out, "smem", (torch.float32,))
    B, V = x.shape
    if B == 0:
        return y
    grid = min(B, 1 << 20)  # the kernel loops over rows beyond the grid
    _launch(x, CU_SOURCES[1], "softmax_smem_f32", grid, 256,
            (_ptr(x), _ptr(y), np.int64(B), np.int32(V)))
    return y


def softmax_fused(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Single read, single write softmax; float32 / bfloat16 / float16."""
    x, y = _prepare(x, out, "fused", tuple(_FORMATS))
    B, V = x.shape
    if B == 0:
        return y
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    n_sm, major = _sm_count_and_major(dev)
    plan = _PLAN_OVERRIDE or _select_plan(V, clusters_ok=major >= 9, dtype=x.dtype)
    name = plan.kernel_name(x.dtype)
    cap = plan.capacity
    if cap is not None and V > cap:
        raise ValueError(f"fused softmax: V = {V} does not fit {plan.describe()}")
    # Vector stores need the output slice aligned like the input slice; with equal addresses
    # mod 16 that holds for every row and slice.
    out_vec_ok = np.int32((y.data_ptr() - x.data_ptr()) % _VEC_BYTES == 0)
    if plan.kind in ("warp", "warpvec"):
        rows_per_block = plan.threads // 32
        # Enough blocks to fill every SM several times over; the kernel loops over the rest.
        grid = min(-(-B // rows_per_block), n_sm * _WARP_BLOCKS_PER_SM)
        args = (_ptr(x), _ptr(y), np.int64(B), np.int32(V))
        if plan.kind == "warpvec":
            args += (out_vec_ok,)
    else:
        groups = min(B, _ROW_GRID_CAP // plan.cluster)
        grid = groups * plan.cluster
        args = (_ptr(x), _ptr(y), np.int64(B), np.int32(V), out_vec_ok)
    _launch(x, CU_SOURCES[2], name, grid, plan.threads, args)
    return y


__all__ = [
    "softmax_naive", "softmax_smem", "softmax_fused", "fused_plan", "FusedPlan", "DISPATCH_BOUNDARIES",
    "DISPATCH_BOUNDARIES_BY_DTYPE", "fused_plans",
    "ALL_FUSED_PLANS", "CU_SOURCES", "NVCC_OPTIONS", "CUPY_IMPLICIT_OPTIONS", "TARGET_ARCH",
    "PTXAS_CHECK_OPTIONS", "module_source", "expected_kernels", "ptxas_report", "parse_ptxas_report",
    "format_ptxas_report", "compile_offline",
]
