"""Triton softmax on CPU: the kernels under TRITON_INTERPRET=1, sm_90 builds ahead of time, and
the stored-autotune bookkeeping.

The interpreter must be switched on before `kernels.softmax_triton` is imported. Where the
test process already imported it interpreted (no GPU: conftest sets TRITON_INTERPRET=1), the
kernel tests run here. Elsewhere (a GPU machine) they are skipped in this process and
`test_interpreter_tests_in_a_subprocess` runs this file again in a child with the variable set.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import softmax_triton as st
from kernels.reference import softmax_ref
from tests.inputs import seeded_logits as logits

pytestmark = pytest.mark.cpu

REPO = Path(__file__).resolve().parents[1]
interpreted = pytest.mark.skipif(not st.INTERPRET, reason="needs the interpreted module; "
                                 "test_interpreter_tests_in_a_subprocess runs it")

V_SHAPES = (1, 7, 255, 600, 781, 1025, 2049, 5000)
LOW_PRECISION = (torch.bfloat16, torch.float16)
SM90_SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90


def poisoned(x):
    return torch.full_like(x, float("nan"))


def assert_matches_reference(y, x, *, atol=1e-6, rtol=1e-4):
    """Compare with the float64 NumPy reference of the (rounded) input; NaN never passes."""
    ref = torch.from_numpy(softmax_ref(x.float().numpy()))
    assert not torch.isnan(y).any(), f"{int(torch.isnan(y).sum())} elements unwritten or NaN"
    torch.testing.assert_close(y.double(), ref, atol=atol, rtol=rtol)


def tolerance(dtype):
    """fp32: the project's 1e-6 / 1e-4. bf16/fp16: storing the output rounds it once, a
    relative error up to half an ulp (eps / 2); rtol = eps leaves room for the float32 maths."""
    if dtype == torch.float32:
        return {"atol": 1e-6, "rtol": 1e-4}
    return {"atol": 1e-6, "rtol": torch.finfo(dtype).eps}


def _config_id(cfg):
    return f"BLOCK{cfg.kwargs['BLOCK']}-w{cfg.num_warps}"


# ------------------------------------------------------------------ every autotune config

def _config_cases():
    # The full product: 12 configs x 8 V x B in {1, 3, 64}, about 55 s in the interpreter on
    # two cores (B = 64 alone is about half of it).
    for cfg in st.CONFIGS:
        for V in V_SHAPES:
            for B in (1, 3, 64):
                yield pytest.param(cfg, B, V, id=f"{_config_id(cfg)}-B{B}-V{V}")


@interpreted
@pytest.mark.parametrize("cfg,B,V", list(_config_cases()))
def test_every_autotune_config_matches_reference(cfg, B, V):
    x = logits(B, V, seed=B * 100003 + V)
    y = st.run_path(x, "tile", out=poisoned(x), config=st.config_dict(cfg))
    assert_matches_reference(y, x)


# ------------------------------------------------------------------ every dispatch path

SMALL_PATH_PARAMS = {
    # Thresholds scaled down so the interpreter exercises the real code of each path.
    "tile": {"config": {"BLOCK": 16, "num_warps": 2}},        # V > BLOCK: the two-pass loop
    "row": {"num_warps": 4},
    "rows": {"ROWS": 4, "num_warps": 2},
    "split": {"CHUNK": 16, "num_warps": 2},                    # P = cdiv(V, 16) programs a row
}


@interpreted
@pytest.mark.parametrize("path", sorted(SMALL_PATH_PARAMS))
@pytest.mark.parametrize("B,V", [(1, 1), (3, 7), (5, 16), (2, 17), (9, 33), (4, 100), (3, 600)])
def test_each_path_matches_reference(path, B, V):
    x = logits(B, V, seed=7 * B + V)
    y = st.run_path(x, path, out=poisoned(x), **SMALL_PATH_PARAMS[path])
    assert_matches_reference(y, x)


@interpreted
@pytest.mark.parametrize("align", [1, 2, 4])
def test_vector_alignment_hint_keeps_results(align):
    # V = 64 and strides divisible by 4: every hint the wrapper might pass is true here.
    x = logits(6, 64, seed=align)
    for path, params in SMALL_PATH_PARAMS.items():
        y = st.run_path(x, path, out=poisoned(x), align=align, **params)
        assert_matches_reference(y, x)


@interpreted
def test_split_combines_published_partials_and_falls_back():
    # Programs run one after another in the interpreter (poll bound 0): the last chunk of a row
    # finds every partial published and combines them, earlier chunks stream the row. Both must
    # agree with the reference, including a chunk that is entirely -inf.
    x = logits(4, 64, seed=3)
    x[1, 16:32] = -float("inf")
    y = st.run_path(x, "split", out=poisoned(x), CHUNK=16, num_warps=2, max_spins=0)
    assert_matches_reference(y, x)


def _offset_views(B, V, *, head, pad, seed, dtype):
    """x: (B, V) rows `head` elements into a flat buffer with row stride V + pad (pad = 0:
    contiguous rows, starting off a 16-byte boundary); out: a contiguous (B, V) window into a
    NaN buffer with guard elements on both sides."""
    flat = logits(1, (B - 1) * (V + pad) + V + head + 5, seed=seed, dtype=dtype)[0]
    x = flat[head:].as_strided((B, V), (V + pad, 1))
    guard = torch.full((B * V + 2 * 3 + head,), float("nan"), dtype=dtype)
    out = guard[3 + head:3 + head + B * V].view(B, V)
    return x, out, guard


@interpreted
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("align", [1, 2, 4, 8])
@pytest.mark.parametrize("head,pad", [(0, 0), (1, 0), (3, 0), (1, 1), (2, 5), (5, 3)])
@pytest.mark.parametrize("B,V", [(1, 1), (1, 7), (4, 33), (3, 61), (2, 100)])
def test_split_group_aligned_chunks_at_any_row_offset(B, V, head, pad, align, dtype):
    # Chunks cut on `align`-element groups of the buffer: rows start anywhere inside a group,
    # the partial groups at both row ends go through the edge loads/stores of chunk 0, and the
    # last chunk of a row may be empty. Every element must be written once with the right
    # value and nothing outside the output window touched.
    x, out, guard = _offset_views(B, V, head=head, pad=pad, seed=B * 1000 + V * 10 + head, dtype=dtype)
    x_before = x.clone()
    y = st.run_path(x, "split", out=out, CHUNK=16, num_warps=2, align=align)
    assert y is out
    assert_matches_reference(y, x, **tolerance(dtype))
    assert torch.isnan(guard[:3 + head]).all() and torch.isnan(guard[3 + head + B * V:]).all(), \
        "split wrote outside its output rows"
    torch.testing.assert_close(x, x_before, atol=0, rtol=0)


@interpreted
def test_aligned_base_view_points_at_a_group_boundary():
    flat = torch.randn(64)
    for head in range(5):
        view, h = st._aligned_base(flat[head:head + 40], 4)
        assert view.data_ptr() % 16 == 0 and h == head % 4
        assert view.data_ptr() + h * 4 == flat[head:].data_ptr()


@interpreted
@pytest.mark.parametrize("path", sorted(SMALL_PATH_PARAMS))
@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_each_path_low_precision(path, dtype):
    x = logits(3, 70, seed=11, dtype=dtype)
    y = st.run_path(x, path, out=poisoned(x), **SMALL_PATH_PARAMS[path])
    assert y.dtype == dtype
    assert_matches_reference(y, x, **tolerance(dtype))


def test_plan_changes_at_each_boundary():
    b = st.DISPATCH_BOUNDARIES
    assert st.plan(64, b["tile_max_v"]) == "tile"
    assert st.plan(64, b["tile_max_v"] + 1) == "row"
    assert st.plan(b["rows_min_b"] - 1, 600) == "tile"
    assert st.plan(b["rows_min_b"], 600) == "rows"
    assert st.plan(b["rows_min_b"], b["tile_max_v"] + 1) == "row"
    assert st.plan(1, b["row_max_v"]) == "row"
    assert st.plan(1, b["row_max_v"] + 1) == "split"
    for B, V in st.LAB_SHAPES:
        assert st.plan(B, V, torch.float32) == "tile", "the lab shapes must run the autotuned kernel"


def test_plan_accepts_scaled_boundaries():
    small = {"tile_max_v": 8, "rows_min_b": 4, "row_max_v": 32}
    assert [st.plan(2, v, boundaries=small) for v in (8, 9, 32, 33)] == ["tile", "row", "row", "split"]
    assert st.plan(4, 8, boundaries=small) == "rows"


# ------------------------------------------------------------------ public softmax() on CPU

@interpreted
@pytest.mark.parametrize("dtype", (torch.float32, *LOW_PRECISION))
@pytest.mark.parametrize("B,V", [(1, 1), (3, 7), (64, 600), (2, 2049), (2, 5000)])
def test_public_softmax(B, V, dtype):
    x = logits(B, V, seed=B + V, dtype=dtype)
    out = poisoned(x)
    y = st.softmax(x, out=out)
    assert y is out
    assert_matches_reference(y, x, **tolerance(dtype))


@interpreted
@pytest.mark.parametrize("dtype", (torch.float32, *LOW_PRECISION))
def test_v_equal_one_gives_ones(dtype):
    x = logits(5, 1, seed=1, dtype=dtype)
    y = st.softmax(x)
    torch.testing.assert_close(y, torch.ones_like(x), atol=0, rtol=0)


@interpreted
@pytest.mark.parametrize("path", sorted(SMALL_PATH_PARAMS))
def test_all_minus_inf_row_is_nan_like_torch(path):
    x = logits(3, 40, seed=5)
    x[1] = -float("inf")
    y = st.run_path(x, path, out=poisoned(x), **SMALL_PATH_PARAMS[path])
    expected = F.softmax(x, dim=-1)
    assert torch.isnan(expected[1]).all()
    assert torch.isnan(y[1]).all()
    assert_matches_reference(y[[0, 2]], x[[0, 2]])


@interpreted
@pytest.mark.parametrize("path", sorted(SMALL_PATH_PARAMS))
def test_huge_logits_do_not_overflow(path):
    x = logits(3, 40, seed=9)
    x[0, 3], x[0, 5], x[1, 7], x[2, 0] = 1e30, -1e30, -1e30, 1e30
    x[2, 39] = 1e30  # a tie between two huge entries: 1/2 each
    y = st.run_path(x, path, out=poisoned(x), **SMALL_PATH_PARAMS[path])
    assert torch.isfinite(y).all()
    assert_matches_reference(y, x)
    assert y[2, 0].item() == pytest.approx(0.5) and y[2, 39].item() == pytest.approx(0.5)


@interpreted
def test_empty_batch_returns_without_launch(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel was launched for B = 0")

    for name in ("_softmax_tile_kernel", "_softmax_tile_autotuned", "_softmax_row_kernel",
                 "_softmax_rows_kernel", "_softmax_split_kernel"):
        monkeypatch.setattr(st, name, type("NoLaunch", (), {"__getitem__": lambda self, grid: no_launch})())
    for V in (5, 600, 40000):
        x = torch.empty(0, V)
        y = st.softmax(x)
        assert y.shape == (0, V) and y.dtype == x.dtype


@interpreted
def test_row_stride_and_column_stride():
    wide = logits(4, 300, seed=21)
    x = wide[:, :250]                      # row stride 300: used as is
    assert_matches_reference(st.softmax(x), x)
    x = wide[:, ::2]                        # column stride 2: copied to contiguous first
    assert_matches_reference(st.softmax(x), x)


@interpreted
def test_output_buffer_is_used_and_checked():
    x = logits(3, 20, seed=2)
    out = poisoned(x)
    assert st.softmax(x, out=out) is out
    with pytest.raises(ValueError, match="out"):
        st.softmax(x, out=torch.empty(3, 21))
    with pytest.raises(ValueError, match="out"):
        st.softmax(x, out=torch.empty(3, 20, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        st.softmax(x, out=torch.empty(20, 3).t())
    with pytest.raises(TypeError, match="out"):
        st.softmax(x, out=np.empty((3, 20), np.float32))


@pytest.mark.parametrize("bad,exc,msg", [
    (lambda: torch.randn(5), ValueError, "2-D"),
    (lambda: torch.randn(2, 3, 4), ValueError, "2-D"),
    (lambda: torch.randn(2, 0), ValueError, "V = 0"),
    (lambda: torch.randn(2, 3, dtype=torch.float64), TypeError, "float64"),
    (lambda: torch.ones(2, 3, dtype=torch.int32), TypeError, "int32"),
    (lambda: np.ones((2, 3), np.float32), TypeError, "torch.Tensor"),
])
def test_bad_inputs_raise_clear_errors(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        st.softmax(bad())


@pytest.mark.skipif(st.INTERPRET, reason="only the compiled module insists on CUDA tensors")
def test_cpu_tensor_rejected_without_interpreter():
    with pytest.raises(ValueError, match="cuda"):
        st.softmax(torch.randn(2, 3))


def test_interpreter_tests_in_a_subprocess(pytestconfig):
    """On a machine whose test process runs the compiled module, run the interpreter tests in a
    child process that has TRITON_INTERPRET=1 from the start."""
    if st.INTERPRET:
        pytest.skip("this process is interpreted already: the tests above ran here")
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__)), "-q", "-p", "no:cacheprovider",
           "-k", "not test_interpreter_tests_in_a_subprocess and not aot and not sm90", "-W", "ignore::RuntimeWarning"]
    try:
        pytestconfig.getoption("no_reports")
        cmd.append("--no-reports")  # the parent session writes the reports, not the child
    except ValueError:
        pass
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert re.search(r"\d+ passed", proc.stdout), tail


# ------------------------------------------------------------------ ahead-of-time sm_90 builds

_AOT_SCRIPT = textwrap.dedent(r"""
    import json, re, subprocess, sys, tempfile
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource
    from kernels import softmax_triton as st

    assert not st.INTERPRET
    TARGET = GPUTarget("cuda", 90, 32)
    # Pointers 16-byte aligned, as Triton specialises torch allocations.
    ATTRS = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}

    def build(name, kernel, sig, const, num_warps, num_stages=3):
        src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=ATTRS)
        c = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(c.asm["cubin"])
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(c.asm["ptx"])
        # The ptxas Triton itself picks for sm_90 (3.9 uses its newer "ptxas-blackwell").
        arch = re.search(r"^\.target\s+(\w+)", c.asm["ptx"], re.M).group(1)  # sm_90a
        proc = subprocess.run([get_ptxas(90).path, "-v", f"--gpu-name={arch}", f.name, "-o", f.name + ".o"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        log = proc.stderr
        spill = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        return {"name": name, "num_warps": num_warps, **const, "regs": int(fields["REG"]),
                "vector_stores": bool(re.search(r"st\.global(\.\w+)*\.v[248]", c.asm["ptx"])),
                "stack": int(fields["STACK"]), "local": int(fields["LOCAL"]), "spill_bytes": sum(spill),
                "shared": int(c.metadata.shared),
                "vector_loads": bool(re.search(r"ld\.global(\.\w+)*\.v[248]", c.asm["ptx"]))}

    def sig(names, dtype):
        return {n: t.replace("T", dtype) for n, t in names}

    rows = []
    tile = [("X", "*T"), ("Y", "*T"), ("V", "i32"), ("stride_x", "i32"), ("stride_y", "i32"),
            ("BLOCK", "constexpr"), ("ALIGN", "constexpr")]
    for cfg in st.CONFIGS:
        rows.append(build(f"tile fp32", st._softmax_tile_kernel, sig(tile, "fp32"),
                          {"BLOCK": cfg.kwargs["BLOCK"], "ALIGN": 4}, cfg.num_warps, cfg.num_stages))
    import torch
    for dtype, tdtype, es in (("fp32", torch.float32, 4), ("bf16", torch.bfloat16, 2)):
        a = 16 // es
        for block in (4096, 8192, 16384, 32768):
            rows.append(build(f"row {dtype}", st._softmax_row_kernel, sig(tile, dtype),
                              {"BLOCK": block, "ALIGN": a}, st._row_warps(block, tdtype)))
        rp = st._rows_params(600, tdtype)
        rows.append(build(f"rows {dtype}", st._softmax_rows_kernel,
                          sig([("X", "*T"), ("Y", "*T"), ("B", "i32"), ("V", "i32"), ("stride_x", "i32"),
                               ("stride_y", "i32"), ("ROWS", "constexpr"), ("BLOCK_V", "constexpr"),
                               ("ALIGN", "constexpr")], dtype),
                          {"ROWS": rp["ROWS"], "BLOCK_V": rp["BLOCK_V"], "ALIGN": a}, rp["num_warps"]))
        for V in (50257, 128256):
            sp = st._split_params(V, tdtype)
            P = triton.cdiv(V, sp["CHUNK"])
            split_sig = sig([("X", "*T"), ("Y", "*T"), ("WS", "*i64"), ("V", "i32"), ("P", "i32"),
                             ("stride_x", "i32"), ("stride_y", "i32"), ("x_off", "i32"), ("y_off", "i32"),
                             ("CHUNK", "constexpr"), ("P_BLOCK", "constexpr"), ("FALLBACK_BLOCK", "constexpr"),
                             ("MAX_SPINS", "constexpr"), ("ALIGN", "constexpr"), ("Y_ALIGN", "constexpr")],
                            dtype)
            # Chunks are cut on 16-byte groups whatever V is: odd V gets the same vector
            # accesses as even V (Y_ALIGN = ALIGN for contiguous rows).
            rows.append(build(f"split {dtype}", st._softmax_split_kernel, split_sig,
                              {"CHUNK": sp["CHUNK"], "P_BLOCK": triton.next_power_of_2(P),
                               "FALLBACK_BLOCK": min(sp["CHUNK"], 1024), "MAX_SPINS": st.SPLIT_MAX_SPINS,
                               "ALIGN": a, "Y_ALIGN": a},
                              sp["num_warps"]))
    print("AOT-JSON " + json.dumps(rows))
""")


@pytest.fixture(scope="module")
def sm90_builds(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("AOT-JSON "))
    return json.loads(line.removeprefix("AOT-JSON "))


def test_sm90_aot_builds_have_no_spills_and_fit_shared_memory(sm90_builds, request):
    print()
    for r in sm90_builds:
        extra = {k: v for k, v in r.items() if k in ("BLOCK", "ROWS", "BLOCK_V", "CHUNK")}
        print(f"  {r['name']:<10} {json.dumps(extra):<34} warps {r['num_warps']:>2}: {r['regs']:>3} regs, "
              f"shared {r['shared']:>6} B, stack {r['stack']}, spill bytes {r['spill_bytes']}, "
              f"vector loads {r['vector_loads']}, stores {r['vector_stores']}")
    tile = [r for r in sm90_builds if r["name"].startswith("tile")]
    assert len(tile) == len(st.CONFIGS)
    try:
        record = request.getfixturevalue("record_manifest")
    except pytest.FixtureLookupError:
        record = None
    if record is not None:
        record("triton_sm90_aot", max_registers=max(r["regs"] for r in sm90_builds),
               max_spill_bytes=max(r["spill_bytes"] + r["local"] for r in sm90_builds),
               max_shared_bytes=max(r["shared"] for r in sm90_builds))
    for r in sm90_builds:
        assert r["spill_bytes"] == 0 and r["local"] == 0 and r["stack"] == 0, r
        assert r["shared"] <= SM90_SHARED_LIMIT, r
        assert r["regs"] <= 255, r
        per_thread = r.get("BLOCK", r.get("CHUNK", r.get("ROWS", 1) * r.get("BLOCK_V", 1))) // (32 * r["num_warps"])
        if r["ALIGN"] > 1 and per_thread >= r["ALIGN"]:
            assert r["vector_loads"], f"{r['name']} with ALIGN > 1 should issue vector loads: {r}"
            assert r["vector_stores"], f"{r['name']} with ALIGN > 1 should issue vector stores: {r}"


# ------------------------------------------------------------------ stored choice and staleness

GPU = "Test GPU 9000"


def test_stored_choice_round_trip(tmp_path):
    path = tmp_path / "tune.json"
    assert st.stored_choice(600, torch.float32, GPU, path=path) is None  # no file yet
    st.write_stored({"600|float32": {"BLOCK": 512, "num_warps": 4, "num_stages": 3}}, GPU, path=path)
    assert st.stored_choice(600, torch.float32, GPU, path=path) == {"BLOCK": 512, "num_warps": 4, "num_stages": 3}
    assert st.stored_choice(600, torch.bfloat16, GPU, path=path) is None
    assert st.stored_choice(601, torch.float32, GPU, path=path) is None
    data = json.loads(path.read_text())
    entry = data["entries"][st.fingerprint(GPU)]
    assert entry["kernel_source_sha256"] == st.kernel_source_hash()
    assert entry["configs_sha256"] == st.configs_hash()


def test_changed_source_configs_or_gpu_invalidate_the_stored_choice(tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    st.write_stored({"600|float32": {"BLOCK": 1024, "num_warps": 8}}, GPU, path=path)
    assert st.stored_choice(600, torch.float32, GPU, path=path) is not None
    # Another GPU name: different fingerprint.
    assert st.stored_choice(600, torch.float32, "Other GPU", path=path) is None
    # Edited kernel: the hash of the source differs.
    assert st.stored_choice(600, torch.float32, GPU, path=path, source_hash="0" * 64) is None
    # A different config list (one config dropped) changes the config hash ...
    assert st.configs_hash(st.CONFIGS[:-1]) != st.configs_hash()
    assert st.stored_choice(600, torch.float32, GPU, path=path,
                            config_hash=st.configs_hash(st.CONFIGS[:-1])) is None
    # ... and so does editing the module's list in place, with no argument passed.
    monkeypatch.setattr(st, "CONFIGS", st.CONFIGS[:-1] + [type(st.CONFIGS[0])({"BLOCK": 4096}, num_warps=16)])
    assert st.stored_choice(600, torch.float32, GPU, path=path) is None


def test_source_hash_follows_the_kernel_text():
    assert st.kernel_source_hash(st._softmax_row_kernel) != st.kernel_source_hash()
    assert st.kernel_source_hash() == st.kernel_source_hash(st._softmax_tile_kernel)


def test_write_keeps_other_gpus_and_drops_stale_entries(tmp_path):
    path = tmp_path / "tune.json"
    st.write_stored({"600|float32": {"BLOCK": 256, "num_warps": 2}}, "Other GPU", path=path)
    data = json.loads(path.read_text())
    # A stale entry for GPU (old kernel source) that the next write must replace.
    data["entries"]["stale"] = {"gpu": GPU, "choices": {"600|float32": {"BLOCK": 2048, "num_warps": 8}}}
    path.write_text(json.dumps(data))
    st.write_stored({"600|float32": {"BLOCK": 512, "num_warps": 4}}, GPU, path=path)
    entries = json.loads(path.read_text())["entries"]
    assert "stale" not in entries
    assert {e["gpu"] for e in entries.values()} == {GPU, "Other GPU"}
    assert st.stored_choice(600, torch.float32, "Other GPU", path=path)["BLOCK"] == 256
    assert st.stored_choice(600, torch.float32, GPU, path=path)["BLOCK"] == 512


def test_unknown_file_format_is_ignored(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"format": 999, "entries": {st.fingerprint(GPU): {
        "gpu": GPU, "choices": {"600|float32": {"BLOCK": 256, "num_warps": 2}}}}}))
    assert st.stored_choice(600, torch.float32, GPU, path=path) is None


@interpreted
def test_interpreter_uses_fixed_config():
    assert st.autotune_picked(600) == dict(st.INTERPRETER_CONFIG, num_stages=3)
    assert st.INTERPRETER_CONFIG in [{"BLOCK": c.kwargs["BLOCK"], "num_warps": c.num_warps} for c in st.CONFIGS]


def test_repo_autotune_file_matches_the_current_tile_kernel():
    """The stored choices in kernels/triton_autotune.json stay valid only while the tile kernel
    and its config list are unchanged: every entry's fingerprint must still be recomputable."""
    if not st.STORED_PATH.exists():
        pytest.skip("no stored autotune file in the repo")
    entries = st.read_stored().get("entries", {})
    assert entries, "the stored file holds no entries"
    for key, entry in entries.items():
        assert entry["kernel_source_sha256"] == st.kernel_source_hash(), "tile kernel source changed"
        assert entry["configs_sha256"] == st.configs_hash(), "tile config list changed"
        assert key == st.fingerprint(entry["gpu"])
        assert st.stored_choice(600, torch.float32, entry["gpu"]) is not None
