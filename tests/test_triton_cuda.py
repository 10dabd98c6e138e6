"""Triton softmax on a GPU: every dispatch path at its boundaries, long and odd rows, huge
batches, every autotune config, resource use of the compiled kernels, and autotune-once-reuse."""

import numpy as np
import pytest
import torch

from kernels import softmax_triton as st
from kernels.reference import softmax_ref
from tests.inputs import seeded_logits

pytestmark = pytest.mark.cuda

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def logits(B, V, *, seed, dtype=torch.float32):
    # At most 4096 marked entries: the large shapes here are drawn on the CPU.
    return seeded_logits(B, V, seed=seed, dtype=dtype, device="cuda", max_marked=4096)


def tolerance(dtype):
    """fp32: atol 1e-6, rtol 1e-4. bf16/fp16: one rounding of the stored output (half an ulp)
    plus float32 maths, covered by rtol = eps of the dtype."""
    if dtype == torch.float32:
        return {"atol": 1e-6, "rtol": 1e-4}
    return {"atol": 1e-6, "rtol": torch.finfo(dtype).eps}


def check(x, y, record=None, label=None):
    torch.cuda.synchronize()
    y_cpu = y.float().cpu().double()
    ref = torch.from_numpy(softmax_ref(x.float().cpu().numpy()))
    if record is not None:
        record("triton_cuda", **{f"max_abs_err_{label}": float((y_cpu - ref).abs().max())})
    assert not torch.isnan(y_cpu).any(), f"{int(torch.isnan(y_cpu).sum())} elements unwritten or NaN"
    torch.testing.assert_close(y_cpu, ref, **tolerance(x.dtype))


def _boundary_cases():
    b = st.DISPATCH_BOUNDARIES
    for V in (b["tile_max_v"] - 1, b["tile_max_v"], b["tile_max_v"] + 1,
              b["row_max_v"] - 1, b["row_max_v"], b["row_max_v"] + 1):
        yield 3, V
    for B in (b["rows_min_b"] - 1, b["rows_min_b"], b["rows_min_b"] + 1):
        yield B, 600
        yield B, b["tile_max_v"]
    yield from [(1, 1), (1, 7), (5, 4097), (3, 33001), (64, 50257), (8, 128256), (1, 128256),
                (70000, 7), (70000, 600), (1, 600), (17, 1000)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("B,V", list(_boundary_cases()))
def test_softmax_matches_reference(B, V, dtype):
    x = logits(B, V, seed=B * 7919 + V, dtype=dtype)
    out = torch.full_like(x, float("nan"))
    y = st.softmax(x, out=out)
    assert y is out
    check(x, y)


FORCED = [
    ("tile", {"config": {"BLOCK": 256, "num_warps": 2}}),
    ("row", {}),
    ("rows", {}),
    ("rows", {"ROWS": 8, "num_warps": 8}),
    ("split", {}),
    ("split", {"CHUNK": 1024, "num_warps": 4}),
    ("split", {"max_spins": 0}),  # most programs take the streaming fallback
]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("path,params", FORCED, ids=[f"{p}-{i}" for i, (p, _) in enumerate(FORCED)])
@pytest.mark.parametrize("B,V", [(3, 7), (70000, 33), (31, 2049), (9, 6001)])
def test_each_path_on_gpu(path, params, B, V, dtype):
    x = logits(B, V, seed=V + B, dtype=dtype)
    y = st.run_path(x, path, out=torch.full_like(x, float("nan")), **params)
    check(x, y)


SPLIT_OFFSET_CASES = [
    # (B, V, head, pad, params): rows `head` elements past a 16-byte boundary, row stride V + pad.
    (1, 50257, 0, 0, {}),
    (64, 50257, 0, 0, {}),
    (64, 50257, 1, 0, {}),                      # contiguous rows, buffer start off by one element
    (33, 50257, 1, 1, {}),                      # x[:, 1:] of a (B, V + 1) tensor
    (17, 50257, 3, 5, {}),
    (8, 128256, 1, 1, {}),
    (1, 128257, 2, 0, {}),
    (5, 6001, 1, 1, {"CHUNK": 1024, "num_warps": 4}),
    (70000, 33, 3, 2, {"CHUNK": 16, "num_warps": 1}),
    (9, 6001, 2, 3, {"CHUNK": 1024, "num_warps": 4, "max_spins": 0}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("B,V,head,pad,params", SPLIT_OFFSET_CASES,
                         ids=[f"B{c[0]}-V{c[1]}-h{c[2]}-p{c[3]}-{i}" for i, c in enumerate(SPLIT_OFFSET_CASES)])
def test_split_at_odd_v_and_unaligned_rows_on_gpu(B, V, head, pad, params, dtype):
    # Chunks are cut on 16-byte groups of the buffer, so rows that start inside a group take
    # the edge loads/stores; the output window has NaN guards that must stay untouched.
    flat = logits(1, (B - 1) * (V + pad) + V + head + 5, seed=B + V + head, dtype=dtype)[0]
    x = flat[head:].as_strided((B, V), (V + pad, 1))
    guard = torch.full((B * V + 6 + head,), float("nan"), dtype=dtype, device=x.device)
    out = guard[3 + head:3 + head + B * V].view(B, V)
    y = st.run_path(x, "split", out=out, **params)
    check(x, y)
    torch.cuda.synchronize()
    assert torch.isnan(guard[:3 + head]).all() and torch.isnan(guard[3 + head + B * V:]).all()


@pytest.mark.parametrize("cfg", st.CONFIGS, ids=lambda c: f"BLOCK{c.kwargs['BLOCK']}-w{c.num_warps}")
def test_every_autotune_config_on_gpu(cfg):
    for B, V in ((33, 600), (3, 5000), (2, 1)):
        x = logits(B, V, seed=B + V)
        check(x, st.run_path(x, "tile", out=torch.full_like(x, float("nan")), config=st.config_dict(cfg)))


def test_special_values_on_gpu():
    for path, params in FORCED:
        x = logits(4, 3000, seed=1)
        x[1] = -float("inf")
        x[2, 5], x[2, 6], x[3, 0] = 1e30, -1e30, -1e30
        y = st.run_path(x, path, out=torch.full_like(x, float("nan")), **params)
        torch.cuda.synchronize()
        assert torch.isnan(y[1]).all(), path
        assert torch.isfinite(y[[0, 2, 3]]).all(), path
        check(x[[0, 2, 3]], y[[0, 2, 3]])


def test_strided_input_on_gpu():
    wide = logits(64, 1300, seed=4)
    for x in (wide[:, :1200], wide[:, 1:1201], wide[:, ::2], wide[:, 3:40]):
        check(x, st.softmax(x))
    wide = logits(16, 50260, seed=5)
    for x in (wide[:, 1:], wide[:, 3:50260], wide[:1, 1:50258]):  # split rows off 16-byte boundaries
        check(x, st.softmax(x))


def test_compiled_kernels_do_not_spill(request):
    """The cubins the launches actually use: registers and spills reported by the driver."""
    x = logits(4, 600, seed=0)
    y = torch.empty_like(x)
    rows = []
    for cfg in st.CONFIGS:
        k = st._softmax_tile_kernel.warmup(x, y, 600, 600, 600, BLOCK=cfg.kwargs["BLOCK"], ALIGN=4,
                                          num_warps=cfg.num_warps, num_stages=cfg.num_stages, grid=(1,))
        k._init_handles()
        rows.append((f"tile BLOCK={cfg.kwargs['BLOCK']} w{cfg.num_warps}", k.n_regs, k.n_spills))
    # The split kernel at an odd V, as the wrapper launches it (group-aligned chunks).
    for dtype in (torch.float32, torch.bfloat16):
        V = 50257
        xs = logits(2, V, seed=1, dtype=dtype)
        ys = torch.empty_like(xs)
        sp = st._split_params(V, dtype)
        a = 16 // xs.element_size()
        P = -(-(V + a - 1) // sp["CHUNK"])
        ws = torch.zeros(2 * (P + 1), dtype=torch.int64, device="cuda")
        k = st._softmax_split_kernel.warmup(xs, ys, ws, V, P, V, V, 0, 0, CHUNK=sp["CHUNK"],
                                            P_BLOCK=max(2, 1 << (P - 1).bit_length()),
                                            FALLBACK_BLOCK=min(sp["CHUNK"], 1024), MAX_SPINS=st.SPLIT_MAX_SPINS,
                                            ALIGN=a, Y_ALIGN=a, num_warps=sp["num_warps"], grid=(1,))
        k._init_handles()
        rows.append((f"split {str(dtype).removeprefix('torch.')} V={V}", k.n_regs, k.n_spills))
    print()
    for name, regs, spills in rows:
        print(f"  {name:<24} {regs:>3} regs, {spills} spills")
    try:
        request.getfixturevalue("record_manifest")("triton_cuda", max_spills=max(r[2] for r in rows),
                                                   max_registers=max(r[1] for r in rows))
    except pytest.FixtureLookupError:
        pass
    assert all(spills == 0 for _, _, spills in rows), rows


def test_autotune_once_then_reuse(tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    monkeypatch.setattr(st, "STORED_PATH", path)
    # Private memos for this test, so the rest of the session keeps its own.
    monkeypatch.setattr(st, "_lookup_cache", {})
    monkeypatch.setattr(st, "_tuned_here", {})
    shapes = [(64, 600), (512, 600)]

    before = st.bench_calls()
    record = st.run_autotune(shapes, path=path)
    assert st.bench_calls() - before == len(shapes) * len(st.CONFIGS)  # every config on every shape
    choice = record["choices"]["600|float32"]
    assert {k: choice[k] for k in ("BLOCK", "num_warps")} in [
        {"BLOCK": c.kwargs["BLOCK"], "num_warps": c.num_warps} for c in st.CONFIGS]

    # A fresh lookup (memo cleared, as in a new process) reads the file and does not benchmark.
    st._lookup_cache.clear()
    st._tuned_here.clear()
    picked = st.autotune_picked(600, torch.float32)
    assert (picked["BLOCK"], picked["num_warps"]) == (choice["BLOCK"], choice["num_warps"])
    before = st.bench_calls()
    for B, _ in shapes + [(4096, 600)]:
        x = logits(B, 600, seed=B)
        check(x, st.softmax(x, out=torch.full_like(x, float("nan"))))
    assert st.bench_calls() == before, "a stored choice must not be re-benchmarked"

    # A V with no stored choice autotunes on first use, once.
    x = logits(64, 777, seed=5)
    check(x, st.softmax(x))
    assert st.bench_calls() - before == len(st.CONFIGS)
    check(x, st.softmax(x))
    assert st.bench_calls() - before == len(st.CONFIGS)
    assert st.autotune_picked(777, torch.float32) is not None

    # Stale file (the stored fingerprint no longer matches): ignored, tuned again.
    monkeypatch.setattr(st, "CONFIGS", st.CONFIGS[:-1] + [type(st.CONFIGS[0])({"BLOCK": 128}, num_warps=4)])
    st._lookup_cache.clear()
    st._tuned_here.clear()
    assert st.stored_choice(600, torch.float32, torch.cuda.get_device_name(), path=path) is None
    assert st.autotune_picked(600, torch.float32) is None


def test_repo_autotune_file_is_fresh_for_this_gpu():
    """If kernels/triton_autotune.json exists, the lab shapes on this GPU must use it."""
    if not st.STORED_PATH.exists():
        pytest.skip("no stored autotune file yet: run python -m kernels.autotune on the GPU")
    name = torch.cuda.get_device_name()
    entries = st.read_stored().get("entries", {})
    if not any(e.get("gpu") == name for e in entries.values()):
        pytest.skip(f"the stored file holds no choice for {name}")
    assert st.stored_choice(600, torch.float32, name) is not None, (
        "the stored choice for this GPU is stale (kernel or config list changed): re-run python -m kernels.autotune")
