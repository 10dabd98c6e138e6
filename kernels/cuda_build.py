"""Building the CUDA C kernels: the translation units CuPy compiles at run time, and the same
units compiled offline for sm_90 with ptxas checks (registers, spills), which needs no GPU.

The fused kernels are instantiated from the dispatch table in `kernels.cuda_plans`, so the
kernels compiled are exactly the ones the dispatcher can launch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from .cuda_plans import FORMATS, fused_classes

CUDA_DIR = Path(__file__).resolve().parent / "cuda"
COMMON_HEADER = CUDA_DIR / "softmax_common.cuh"
CU_SOURCES = [CUDA_DIR / "softmax_naive.cu", CUDA_DIR / "softmax_smem.cu", CUDA_DIR / "softmax_fused.cu"]
NAIVE_SOURCE, SMEM_SOURCE, FUSED_SOURCE = CU_SOURCES

# Options given to CuPy's nvcc backend. CuPy adds `-gencode=arch=compute_XX,code=sm_XX` for the
# device itself (so no -arch here: two architecture flags would conflict) and `-ftz=true`.
NVCC_OPTIONS = ("-std=c++17", "-O3")
CUPY_IMPLICIT_OPTIONS = ("-ftz=true",)
# The offline build (tests/test_cuda_compile.py) targets the H200.
TARGET_ARCH = "sm_90"
PTXAS_CHECK_OPTIONS = ("-Xptxas", "-v,-warn-spills,-Werror")
PTXAS_REPORT_OPTIONS = ("-Xptxas", "-v,-warn-spills")  # spills reported, each kernel's judged by the caller

_INCLUDE_RE = re.compile(r'^#include "([\w.]+\.cuh)"$', re.MULTILINE)


# ---------------------------------------------------------------------------------------------
# sources


def expand_includes(path: Path) -> str:
    """The .cu text with each `#include "X.cuh"` of kernels/cuda replaced by that file's text,
    so that the compile cache (keyed on the source text) sees header edits too."""
    text = Path(path).read_text()

    def paste(m: re.Match) -> str:
        header = CUDA_DIR / m.group(1)
        if not header.is_file():
            raise RuntimeError(f"{path}: included header {m.group(1)} is not in {CUDA_DIR}")
        return header.read_text()

    return _INCLUDE_RE.sub(paste, text)


def expand_source(path: Path) -> str:
    """expand_includes for a softmax source, which must include softmax_common.cuh."""
    if f'#include "{COMMON_HEADER.name}"' not in Path(path).read_text():
        raise RuntimeError(f"{path} does not include {COMMON_HEADER.name}")
    return expand_includes(path)


def instantiations(lines) -> str:
    """The instantiation lines appended to a source, under one heading."""
    return "\n// ---- instantiations generated from the dispatch table ----\n" + "\n".join(lines) + "\n"


def fused_instantiations() -> str:
    return instantiations([size_class.instantiation(dt) for dt in FORMATS for size_class in fused_classes(dt)])


def module_source(path: Path) -> str:
    """The full translation unit for `path` (header inlined, every kernel instantiated): what the
    offline build reports check."""
    src = expand_source(path)
    if Path(path).name == "softmax_fused.cu":
        src += fused_instantiations()
    return src


def one_class_unit(src: str, classes, name: str, path: Path) -> str:
    """`src` with the one size class of `classes` (a function of the dtype format giving its size
    classes) whose kernel is `name` instantiated; a ValueError where none is."""
    for dt in FORMATS:
        for size_class in classes(dt):
            if size_class.kernel_name(dt) == name:
                return src + instantiations([size_class.instantiation(dt)])
    raise ValueError(f"{name!r} is not a kernel of {Path(path).name}")


def kernel_source(path: Path, name: str) -> str:
    """The translation unit compiled when kernel `name` of `path` is first launched: the source
    with that one size class instantiated (nvcc takes about half a second for it, 14 s for all of
    them), or the whole source where it instantiates nothing."""
    if Path(path).name != "softmax_fused.cu":
        return module_source(path)
    return one_class_unit(expand_source(path), fused_classes, name, path)


def expected_kernels(path: Path) -> list[str]:
    """Entry points the translation unit for `path` must define."""
    name = Path(path).name
    if name == "softmax_naive.cu":
        return ["softmax_naive_f32"]
    if name == "softmax_smem.cu":
        return ["softmax_smem_f32"]
    return [size_class.kernel_name(dt) for dt in FORMATS for size_class in fused_classes(dt)]


# ---------------------------------------------------------------------------------------------
# offline build report (no GPU needed)

_FN_RE = re.compile(r"Compiling entry function '(\w+)'")
_PROPS_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
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
            report[current].update(
                stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
            continue
        m = _USED_RE.search(line)
        if m:
            s = _SMEM_RE.search(m.group(2))
            report[current].update(registers=int(m.group(1)), smem_bytes=int(s.group(1)) if s else 0)
    return report


# The offline builds are cached on disk, keyed on everything that decides their outcome: nvcc's
# version, the architecture, every option and the full translation unit (header inlined, kernels
# instantiated), so an edit to any of them builds again. Kept: the builds that succeeded and
# those ptxas rejected (a verdict on the code, e.g. a spill under -Werror); not other failures.
# SOFTMAX_SUITE_NVCC_CACHE names the folder; "0" turns the cache off.
NVCC_CACHE_ENV = "SOFTMAX_SUITE_NVCC_CACHE"
_PTXAS_ERROR_RE = re.compile(r"^ptxas error\s*:", re.MULTILINE)


def nvcc_cache_dir() -> Path | None:
    setting = os.environ.get(NVCC_CACHE_ENV)
    if setting == "0":
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "softmax-suite" / "nvcc"


@cache
def _nvcc_version(nvcc: str) -> str:
    res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    return res.stdout + res.stderr


def compile_offline(
    path: Path,
    *,
    arch: str = TARGET_ARCH,
    nvcc: str | None = None,
    extra=(),
    source: str | None = None,
    spills_fatal: bool = True,
) -> subprocess.CompletedProcess:
    """nvcc -cubin the translation unit for `path` (or the given `source` text, compiled under
    `path`'s name) with the runtime options plus ptxas checks (a spill fails the build unless
    `spills_fatal` is False). A build already done with the same nvcc, options and source
    returns its recorded result (see NVCC_CACHE_ENV)."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH")
    text = module_source(path) if source is None else source
    name = Path(path).name
    options = [f"-arch={arch}", "-cubin", *NVCC_OPTIONS, *CUPY_IMPLICIT_OPTIONS,
               *(PTXAS_CHECK_OPTIONS if spills_fatal else PTXAS_REPORT_OPTIONS), *extra]  # fmt: skip
    folder = nvcc_cache_dir()
    entry = None
    if folder is not None:
        key = hashlib.sha256("\0".join([_nvcc_version(nvcc), name, *options, text]).encode()).hexdigest()
        entry = folder / f"{key}.json"
        try:
            kept = json.loads(entry.read_text())
            return subprocess.CompletedProcess(kept["args"], kept["returncode"], kept["stdout"], kept["stderr"])
        except (OSError, ValueError, KeyError):
            pass
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / name
        cu.write_text(text)
        cmd = [nvcc, *options[:2], "-o", str(cu.with_suffix(".cubin")), *options[2:], str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    if entry is not None and (res.returncode == 0 or _PTXAS_ERROR_RE.search(res.stdout + res.stderr)):
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            partial = entry.with_suffix(f".{os.getpid()}.tmp")
            kept = {"args": cmd, "returncode": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
            partial.write_text(json.dumps(kept))
            partial.replace(entry)  # atomic: a parallel run reads a whole entry or none
        except OSError:
            pass  # a read-only home: build every time
    return res


def format_ptxas_report(report: dict[str, dict[str, int]]) -> str:
    rows = [f"{'kernel':44s} {'regs':>4s} {'smem':>6s} {'stack':>5s} {'spill st/ld':>11s}"]
    for name, r in report.items():
        rows.append(
            f"{name:44s} {r.get('registers', -1):4d} {r.get('smem_bytes', -1):6d} "
            f"{r.get('stack_bytes', -1):5d} {r.get('spill_stores', -1):5d}/{r.get('spill_loads', -1):<5d}"
        )
    return "\n".join(rows)
