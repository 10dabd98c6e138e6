"""The CUDA C kernels without a GPU: they compile for sm_90 with no register spills (and the
fused ones, less their cluster entry points, for sm_80), the fused dispatch table is consistent,
its slicing arithmetic covers every element exactly once, and the wrappers reject bad inputs
before touching CUDA.

Run with -s to see the per-kernel ptxas report (registers, shared memory, stack, spills).
"""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import build_once, cuda_build, cuda_plans, cuda_training_plans
from kernels import softmax_cuda as sc
from kernels.cuda_build import FUSED_SOURCE
from kernels.cuda_plans import fused_class_description, select_fused_class
from kernels.spec import itemsize
from tests.helpers import assert_builds_clean, dtype_id, slice_geometry

TRAINING_SOURCES = ("softmax_backward.cu", "cross_entropy.cu")

pytestmark = pytest.mark.cpu

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: the offline sm_90 build cannot run")
DTYPES = sc.FUSED_DTYPES


# -- nvcc / ptxas --------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("path", cuda_build.CU_SOURCES, ids=lambda p: p.name)
def test_compiles_for_sm90_without_spills(path, record_manifest):
    res = cuda_build.compile_offline(path, nvcc=NVCC)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"nvcc failed for {path.name} (ptxas -warn-spills is fatal):\n{log}"
    report = cuda_build.parse_ptxas_report(log)
    print(f"\n{path.name} ({cuda_build.TARGET_ARCH}):\n{cuda_build.format_ptxas_report(report)}")
    expected = cuda_build.expected_kernels(path)
    worst_spill = max((r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in report.values()), default=0)
    worst_stack = max((r.get("stack_bytes", 0) for r in report.values()), default=0)
    record_manifest(
        "ptxas_sm90",
        max_spill_bytes=worst_spill,
        max_stack_bytes=worst_stack,
        max_registers=max((r.get("registers", 0) for r in report.values()), default=0),
    )
    assert_builds_clean(report, expected, path.name)


@pytest.mark.slow  # the deeper tier: a build, no kernel runs
@needs_nvcc
def test_fused_builds_for_gpus_without_clusters():
    # Before sm_90 the cluster entry points (and their st.async / mbarrier meetings) are left
    # out, and select_fused_class(clusters=False) never picks them: the sm_80 build must hold
    # every other size class and no cluster class.
    res = cuda_build.compile_offline(FUSED_SOURCE, nvcc=NVCC, arch="sm_80")
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"nvcc failed for sm_80:\n{log}"
    built = set(cuda_build.parse_ptxas_report(log))
    size_classes = [(p, dt) for dt in DTYPES for p in cuda_plans.fused_classes(dt)]
    assert built == {p.kernel_name(dt) for p, dt in size_classes if p.cluster == 1}
    for dt in DTYPES:
        for V in (1, 600, 16384, 16385, 50257, 128256, 200000, 262144, 1000000, 4194305):
            assert select_fused_class(V, dt, clusters=False).kernel_name(dt) in built, (V, dt)


def test_ptxas_report_parser():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_one' for 'sm_90'
ptxas info    : Function properties for k_one
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 144 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k_two' for 'sm_90'
ptxas info    : Function properties for k_two
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 21 registers, used 0 barriers
"""
    assert cuda_build.parse_ptxas_report(text) == {
        "k_one": {"registers": 40, "smem_bytes": 144, "stack_bytes": 8, "spill_stores": 4, "spill_loads": 12},
        "k_two": {"registers": 21, "smem_bytes": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0},
    }


FAKE_NVCC = """#!/bin/sh
# Counts its builds; its ptxas "rejects" a source holding SPILL, and it "crashes" on one holding CRASH.
[ "$1" = "--version" ] && echo "fake nvcc 1.0" && exit 0
echo build >> "$(dirname "$0")/builds"
for last; do :; done
if grep -q SPILL "$last"; then echo "ptxas error   : Registers are spilled to local memory"; exit 255; fi
if grep -q CRASH "$last"; then echo "Killed" >&2; exit 137; fi
echo "ptxas info    : Compiling entry function 'k' for '$1'"
"""


def test_offline_builds_are_cached_on_everything_that_decides_them(tmp_path, monkeypatch):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    monkeypatch.setenv(cuda_build.NVCC_CACHE_ENV, str(tmp_path / "cache"))
    cu = tmp_path / "k.cu"

    def build(source, **kw):
        res = cuda_build.compile_offline(cu, nvcc=str(nvcc), source=source, **kw)
        return res.returncode, res.stdout, (tmp_path / "builds").read_text().count("build")

    built = (0, "ptxas info    : Compiling entry function 'k' for '-arch=sm_90'\n", 1)
    assert build("one") == built
    assert build("one") == built, "the same build ran again"
    assert build("two")[2] == 2, "a changed source must build again"
    assert build("one", arch="sm_80")[2] == 3, "another architecture must build again"
    assert build("one", extra=("-G",))[2] == 4, "another option must build again"
    # ptxas's verdict on the code is kept; a build that died for another reason is not.
    assert build("SPILL")[0::2] == (255, 5) and build("SPILL")[0::2] == (255, 5)
    assert build("CRASH")[0::2] == (137, 6) and build("CRASH")[0::2] == (137, 7)
    monkeypatch.setenv(cuda_build.NVCC_CACHE_ENV, "0")
    assert build("one")[2] == 8, "SOFTMAX_SUITE_NVCC_CACHE=0 builds every time"


def test_every_dispatchable_kernel_is_instantiated():
    src = cuda_build.module_source(cuda_build.CU_SOURCES[2])
    names = cuda_build.expected_kernels(cuda_build.CU_SOURCES[2])
    assert len(names) == len(set(names)) == sum(len(cuda_plans.fused_classes(dt)) for dt in DTYPES)
    for name in names:
        assert f"({name}," in src, f"{name} is not instantiated"
    for path in cuda_build.CU_SOURCES:
        assert '#include "softmax_common.cuh"' not in cuda_build.module_source(path), "header not inlined"


# -- one translation unit per kernel at run time ---------------------------------------------------
# The wrappers compile a kernel when it is first launched, alone (kernel_source): half a second of
# nvcc instead of the whole table's 14 s, in each process that has no cached build yet.


def _every_kernel():
    sources = [(path, cuda_build.kernel_source) for path in cuda_build.CU_SOURCES]
    sources += [(path, cuda_training_plans.kernel_source) for path in cuda_training_plans.TRAINING_SOURCES]
    expected = {path: cuda_build.expected_kernels for path in cuda_build.CU_SOURCES}
    expected.update({path: cuda_training_plans.expected_kernels for path in cuda_training_plans.TRAINING_SOURCES})
    return [(path, source_of, name) for path, source_of in sources for name in expected[path](path)]


def _instantiated(src: str) -> list[str]:
    return [line for line in src.split("generated from the dispatch table ----")[-1].splitlines() if line.strip()]


def test_each_kernel_has_a_translation_unit_of_its_own():
    """A kernel's unit instantiates that kernel and no other; an unknown name is refused."""
    cases = _every_kernel()
    assert len(cases) > 100
    for path, source_of, name in cases:
        src = source_of(path, name)
        lines = _instantiated(src) if "generated from the dispatch table" in src else []
        if lines or path.name == "softmax_fused.cu":
            assert len(lines) == 1 and f"({name}," in lines[0], f"{path.name}: {name} -> {lines}"
    for path, source_of, _ in cases[:: len(cases) - 1]:
        if path.name in ("softmax_fused.cu", "softmax_backward.cu", "cross_entropy.cu"):
            with pytest.raises(ValueError, match="not a kernel of"):
                source_of(path, "softmax_no_such_kernel")


@needs_nvcc
@pytest.mark.parametrize(
    "path", [*cuda_build.CU_SOURCES[2:], *cuda_training_plans.TRAINING_SOURCES], ids=lambda p: p.name
)
@pytest.mark.slow  # the deeper tier: a build, no kernel runs
def test_a_kernel_built_alone_is_the_kernel_of_the_whole_build(path):
    """ptxas gives a kernel compiled in its own unit the registers, stack and spills it gets in
    the whole source's build (whose spills the build tests judge, reported here, not fatal): the
    run-time units change what is compiled together, not the code. Static shared memory may differ by the
    padding that places the unit's __shared__ variables (measured: 404 bytes alone, 416 in the
    whole build for fused_loop_f32_t1024), never by a buffer. One kernel of each kind."""
    whole_source = (cuda_training_plans if path in cuda_training_plans.TRAINING_SOURCES else cuda_build).module_source
    built = cuda_build.compile_offline(path, nvcc=NVCC, source=whole_source(path), spills_fatal=False)
    whole = cuda_build.parse_ptxas_report(_log(built))
    source_of = {name: src for p, src, name in _every_kernel() if p == path}
    kinds = {}
    for name in source_of:
        kinds.setdefault(name.split("_")[1] if name.count("_") > 1 else name, name)
    for name in kinds.values():
        alone = cuda_build.parse_ptxas_report(
            _log(cuda_build.compile_offline(path, nvcc=NVCC, source=source_of[name](path, name), spills_fatal=False))
        )
        assert name in alone, f"{name} not built from its own unit"
        what = f"{name}: alone {alone[name]} vs in the whole build {whole[name]}"
        code = ("registers", "stack_bytes", "spill_stores", "spill_loads")
        assert {k: alone[name][k] for k in code} == {k: whole[name][k] for k in code}, what
        assert abs(alone[name]["smem_bytes"] - whole[name]["smem_bytes"]) < SHARED_PADDING, what


# Alignment padding between a unit's static __shared__ variables: less than one 16-byte slot.
SHARED_PADDING = 16


def _log(res) -> str:
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    return log


# -- one build per machine -----------------------------------------------------------------------

_TAKE_LOCK = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("build_once", sys.argv[1])
build_once = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_once)
with build_once.build_lock(sys.argv[2]):
    print(time.monotonic(), flush=True)
"""


def test_the_first_build_of_a_kernel_is_taken_in_turns_on_the_machine(tmp_path, monkeypatch):
    """A process asking for a build another holds waits until it lets go; another build does not
    wait; SOFTMAX_SUITE_BUILD_LOCKS names the folder of the locks."""
    monkeypatch.setenv(build_once.LOCK_DIR_ENV, str(tmp_path / "locks"))
    assert build_once.lock_dir() == tmp_path / "locks"
    module = str(Path(build_once.__file__))

    def take(key):
        return subprocess.Popen([sys.executable, "-c", _TAKE_LOCK, module, key], stdout=subprocess.PIPE, text=True)

    with build_once.build_lock("kernel A"):
        same, other = take("kernel A"), take("kernel B")
        assert other.wait(timeout=60) == 0, "another build must not wait"
        time.sleep(0.3)
        assert same.poll() is None, "the same build must wait for its holder"
        released = time.monotonic()
    assert same.wait(timeout=60) == 0
    assert float(same.stdout.read()) >= released
    assert len(list((tmp_path / "locks").glob("*.lock"))) == 2
    monkeypatch.delenv(build_once.LOCK_DIR_ENV)
    assert build_once.lock_dir().name.startswith("softmax-suite-build-locks-")


# -- the fused dispatch table --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dispatch_boundaries_are_the_class_capacities(dtype):
    bounds = cuda_plans.DISPATCH_BOUNDARIES_BY_DTYPE[dtype]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    # The GPU tests walk the union: every dtype's boundaries must be in it.
    assert set(bounds) <= set(cuda_plans.DISPATCH_BOUNDARIES)
    for v in bounds:
        assert select_fused_class(v, dtype).capacity == v, v
        assert select_fused_class(v, dtype) != select_fused_class(v + 1, dtype), f"no path change at V = {v}"
    assert select_fused_class(bounds[-2] + 1, dtype).kind == "split"
    # The path depends on V alone: every B of a (B, V) input takes the same one.
    for v in bounds:
        assert {cuda_plans.fused_path(B, v + 1, dtype) for B in (1, 7, 64, 4096)} == {
            select_fused_class(v + 1, dtype).kind
        }
    assert select_fused_class(bounds[-1] + 1, dtype).kind == "loop"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("V", [16385, 131073, 151936, 262145, 1000000, 2097152, 4194304])
@pytest.mark.parametrize("B", [1, 3, 8, 9, 4096])
def test_split_parts_fit_and_are_resident_together(V, B, dtype):
    split = cuda_plans.SPLIT_CLASSES[dtype]
    for sms in (132, 108, 64):
        parts = cuda_plans.fused_parts(split, B, V, sms)
        assert cuda_plans.min_parts(split, V) <= parts <= cuda_plans.SPLIT_MAX_PARTS
        assert cuda_plans.slice_length(V, parts) <= split.slice_capacity, (V, parts)
        # All of a row's CTAs fit the GPU at once (launch bounds: 1024 threads' worth per SM).
        assert parts <= sms * (1024 // split.threads)
        assert cuda_plans.split_fits(split, V, sms)
    p = cuda_plans.min_parts(split, V)
    assert p == 1 or cuda_plans.slice_length(V, p - 1) > split.slice_capacity, "min_parts is not the fewest"
    # A small batch is spread over about one CTA per SM (slices no shorter than SPREAD_MIN_SLICE).
    parts = cuda_plans.fused_parts(split, B, V, 132)
    assert B * parts >= min(132, B * (V // cuda_plans.SPREAD_MIN_SLICE), B * cuda_plans.SPLIT_MAX_PARTS)
    # The loop: one 1024-thread CTA per SM at most, so P <= SMs.
    for sms in (132, 20):
        assert 1 <= cuda_plans.fused_parts(cuda_plans.LOOP_CLASS, B, 2 * V, sms) <= min(sms, cuda_plans.LOOP_MAX_PARTS)
    assert not cuda_plans.split_fits(split, split.capacity, 16)
    # Spreading a small batch never cuts slices shorter than SPREAD_MIN_SLICE.
    for sms in (132, 108, 64):
        parts = cuda_plans.fused_parts(split, B, V, sms)
        if parts > cuda_plans.min_parts(split, V):
            assert cuda_plans.slice_length(V, parts) >= cuda_plans.SPREAD_MIN_SLICE, (V, B, sms, parts)


def test_slices_are_cut_as_the_kernels_cut_them():
    # The .cu files' `((n + P - 1) / P + 7) / 8 * 8`: a multiple of 8, the last slice shorter.
    for sources in (FUSED_SOURCE.read_text(), *(FUSED_SOURCE.with_name(n).read_text() for n in TRAINING_SOURCES)):
        assert "+ 7) / 8 * 8" in sources
    for V in (100, 16385, 50257, 262145):
        for parts in (2, 3, 7, 64):
            n = cuda_plans.slice_length(V, parts)
            assert n == ((V + parts - 1) // parts + 7) // 8 * 8 and n % 8 == 0 and (parts - 1) * n < V + 8 * parts
    assert cuda_plans.slice_length(100, 3) == 40 and cuda_plans.slice_length(100, 1) == 100


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_shared_memory_is_the_stash_in_the_storage_dtype(dtype):
    for size_class in cuda_plans.fused_classes(dtype):
        assert size_class.shared_bytes(dtype) == size_class.threads * size_class.stash * itemsize(dtype), size_class
    split = cuda_plans.SPLIT_CLASSES[dtype]
    assert split.stash > 0 and split.shared_bytes(dtype) == split.threads * split.stash * itemsize(dtype)


def test_the_column_limit_is_exact():
    limit = sc.MAX_V
    sc.check_columns(torch.empty(0, limit - 1), "x")
    with pytest.raises(ValueError, match="32-bit column index"):
        sc.check_columns(torch.empty(0, limit), "x")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    "V",
    [1, 2, 31, 32, 33, 600, 1024, 1025, 4096, 4097, 8192, 8193, 32000, 50257, 128256, 131072, 131073]
    + [151936, 200064, 202048, 262144, 262145, 1000000, 4194304, 4194305, 1 << 24],
)
def test_size_class_holds_the_row(V, dtype):
    size_class = select_fused_class(V, dtype)
    assert size_class.capacity is None or V <= size_class.capacity
    if size_class.capacity is not None:
        # Each slice fits its threads' registers.
        parts = cuda_plans.min_parts(size_class, V) if size_class.kind == "split" else size_class.cluster
        assert cuda_plans.slice_length(V, parts) <= size_class.slice_capacity
    # No smaller size class would do: the table is ordered and the first fit is taken.
    smaller = [b for b in cuda_plans.DISPATCH_BOUNDARIES_BY_DTYPE[dtype] if b < V]
    if smaller and size_class.kind != "loop":
        assert select_fused_class(smaller[-1], dtype).capacity < V


@pytest.mark.skipif(not cuda_plans.PACK_16BIT_ROWS, reason="SOFTMAX_FUSED_PACK16=0: 16-bit rows use the fp32 table")
def test_packed_rows_only_for_16_bit_storage():
    # A packed thread keeps its elements as 16-bit pairs: registers = elems / 2, i.e. the same
    # bytes per thread as the fp32 classes (32 elements, 32 registers) at most.
    packed = {p for dt in (torch.bfloat16, torch.float16) for p in cuda_plans.fused_classes(dt) if p.packed}
    assert packed, "no packed 16-bit row class"
    assert not any(p.packed for p in cuda_plans.fused_classes(torch.float32))
    for p in packed:
        assert p.kind in ("row", "cluster", "split") and p.elems // 2 <= 32, p
        with pytest.raises(ValueError):
            p.instantiation(torch.float32)
    # The long 16-bit rows (the bandwidth-bound vocabulary sizes) take the packed classes.
    for V in (8192, 32000, 50257, 128256, 151936, 262144, 1000000):
        for dt in (torch.bfloat16, torch.float16):
            assert select_fused_class(V, dt).packed, (V, dt)
        assert not select_fused_class(V, torch.float32).packed


def test_without_clusters_long_rows_split_over_ctas():
    # Before sm_90 the rows the clusters hold are cut over CTAs meeting in global memory instead.
    for V in (16385, 32000, 50257, 128256, 262144):
        assert select_fused_class(V, clusters=False).kind == "split"
        assert select_fused_class(V, clusters=True).kind == "cluster"
    assert select_fused_class(16384, clusters=False).kind == "row"
    assert select_fused_class(4194305, clusters=False).kind == "loop"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, "bf16", "float32"])
def test_fused_class_descriptions(dtype):
    assert fused_class_description(4096, 600, dtype).startswith("warpvec(")
    assert fused_class_description(4096, 4096, dtype) == "row(cluster=1, threads=128, elems/thread=32)"
    if dtype in (torch.float32, "float32") or not cuda_plans.PACK_16BIT_ROWS:
        assert fused_class_description(64, 128256, dtype) == "cluster(cluster=8, threads=512, elems/thread=32)"
        stashed = "cluster(cluster=8, threads=512, elems/thread=24 + 40 in shared memory)"
        assert fused_class_description(1, 262144, dtype) == stashed
    else:
        assert (
            fused_class_description(64, 128256, dtype)
            == "cluster(cluster=8, threads=256, elems/thread=64, packed 16-bit)"
        )
        assert fused_class_description(1, 262144, dtype) == (
            "cluster(cluster=8, threads=256, elems/thread=48 + 80 in shared memory, packed 16-bit)"
        )
    assert fused_class_description(4096, 1000000, dtype).startswith("split(")
    assert fused_class_description(2, 4194305, dtype).startswith("loop(")
    assert fused_class_description(0, 600, dtype).startswith("empty")


def test_fused_class_description_rejects_bad_arguments():
    with pytest.raises(TypeError):
        fused_class_description(4, 8, torch.float64)
    with pytest.raises(ValueError):
        fused_class_description(4, 0, torch.float32)


# -- the kernels' index arithmetic, replayed in Python --------------------------------------------
# A model of fused_row_body: which element each thread of each CTA loads (a cluster's CTAs, or a
# split row's P CTAs, one slice each). It must cover [0, V) exactly once for every row
# alignment, with no thread over its capacity. Vectorised over threads: the rows are long.


def _covered(size_class, V, row_offset_elems, vec, parts=None):
    loaded = []
    P = parts or size_class.cluster
    chunk = cuda_plans.slice_length(V, P)
    nv = (size_class.elems + size_class.stash) // vec  # register vectors, then the shared-memory ones
    nt = size_class.row_threads
    t = np.arange(nt)
    for rank in range(P):
        start = min(rank * chunk, V)
        length = min(V - start, chunk)
        head, nvec, tail0, tail = slice_geometry(row_offset_elems + start, length, vec)
        assert (row_offset_elems + start + head) % vec == 0 or nvec == 0
        assert head < nt and tail < nt and head < vec and tail < vec
        assert nvec <= nv * nt, f"slice of {length} overflows {size_class}"
        vi = (np.arange(nv)[:, None] * nt + t[None, :]).ravel()  # vector j of thread t
        vi = vi[vi < nvec]
        body = (start + head + vi[:, None] * vec + np.arange(vec)[None, :]).ravel()
        loaded += [body, start + t[t < head], start + tail0 + t[t < tail]]
    return np.bincount(np.concatenate(loaded), minlength=V)


@pytest.mark.parametrize("dtype, vec", [(d, 16 // itemsize(d)) for d in DTYPES], ids=[dtype_id(d) for d in DTYPES])
def test_row_and_cluster_slices_cover_each_element_once(dtype, vec):
    Vs = sorted(
        {v + d for v in cuda_plans.DISPATCH_BOUNDARIES for d in (-1, 0, 1)}
        | {600, 1025, 4099, 30001, 32000, 50257, 128256, 151936, 200064, 202048, 1000003}
    )
    for V in Vs:
        for B in (1, 4096):  # a split row is cut finer for a small batch
            size_class = select_fused_class(V, dtype)
            if size_class.kind in ("warp", "loop") or (B == 1 and size_class.kind != "split"):
                continue
            parts = cuda_plans.fused_parts(size_class, B, V, 132) if size_class.kind == "split" else None
            # Every alignment a row can start at (past a million elements, three of them: the
            # slice arithmetic is the same, and the model's time grows with V).
            for offset in range(vec) if V < 10**6 else (0, 1, vec - 1):
                counts = _covered(size_class, V, offset + 3 * V, vec, parts)
                bad = np.flatnonzero(counts != 1)
                assert not bad.size, f"V={V} offset={offset} {size_class}: elements {bad[:8]} covered {counts[bad[:8]]}"


def test_small_slices_cover_each_element_once():
    # Rows shorter than a vector, or shorter than the head: the peel must not double count.
    size_class = cuda_plans.FusedClass("row", 128, 16)
    for vec in (4, 8):
        for V in range(1, 3 * vec + 2):
            for offset in range(vec):
                assert _covered(size_class, V, offset, vec).tolist() == [1] * V, (vec, V, offset)
    cluster = cuda_plans.FusedClass("cluster", 32, 8, 8)
    for V in (1, 7, 9, 63, 64, 65, 200, 2047, 2048):
        for offset in range(8):
            assert _covered(cluster, V, offset, 8).tolist() == [1] * V, (V, offset)


# -- input checks that need no GPU ----------------------------------------------------------------

WRAPPERS = [sc.softmax_naive, sc.softmax_smem, sc.softmax_fused]


@pytest.mark.parametrize("fn", WRAPPERS, ids=lambda f: f.__name__)
def test_rejects_cpu_tensor(fn):
    with pytest.raises(ValueError, match="cuda"):
        fn(torch.randn(4, 8))


@pytest.mark.parametrize("fn", WRAPPERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(8,), (2, 3, 4)])
def test_rejects_wrong_rank(fn, shape):
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.randn(*shape))


@pytest.mark.parametrize("fn", WRAPPERS, ids=lambda f: f.__name__)
def test_rejects_float64(fn):
    with pytest.raises(TypeError, match="float64"):
        fn(torch.randn(4, 8, dtype=torch.float64))


@pytest.mark.parametrize("fn", [sc.softmax_naive, sc.softmax_smem], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_naive_and_smem_are_float32_only(fn, dtype):
    with pytest.raises(TypeError, match="not supported"):
        fn(torch.randn(4, 8).to(dtype))


@pytest.mark.parametrize("fn", WRAPPERS, ids=lambda f: f.__name__)
def test_rejects_empty_rows(fn):
    with pytest.raises(ValueError, match="V = 0"):
        fn(torch.empty(4, 0))


def test_not_a_tensor():
    with pytest.raises(TypeError, match="torch.Tensor"):
        sc.softmax_fused([[1.0, 2.0]])
