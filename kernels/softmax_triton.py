"""Row softmax in Triton: dispatch, launches and the autotune plumbing around the kernels of
`kernels.triton_kernels`.

Paths (`plan(B, V, dtype)` names the one a call takes; `DISPATCH_BOUNDARIES` holds the limits):

  tile   V <= tile_max_v and B < rows_min_b. The autotuned kernel: one program per row, the
         row read in BLOCK-wide tiles (one read and one write when V <= BLOCK).
  rows   V <= tile_max_v and B >= rows_min_b. Many short rows: a [ROWS, BLOCK_V] block per
         program, so each program moves enough bytes to hide memory latency.
  row    tile_max_v < V <= row_max_v. One program holds the whole row in registers.
  split  V > row_max_v, except where stream applies. P programs share a row, each holding
         its chunk in registers (one read, one write), and meet twice through tagged words
         of a per-row workspace. For a short batch the chunks shrink so that the launch
         spreads over the GPU (launch_params).
  stream row_max_v < V <= stream_max_v, 16-bit storage, B >= stream_min_b. A grid of a few
         programs per SM walks the rows, each read three times in tiles (max, sum, write);
         the grid bounds the rows in flight so the re-reads come from L2. That holds only
         while the rows in flight fit L2: longer 16-bit rows split (reports/profiles.md).

Every path gives a row the same bits (the kernels' sums are order-free), so the B threshold
changes speed, never results. All arithmetic is float32 whatever the storage dtype. The input
may have any row stride; a tensor whose elements are not contiguous within a row is copied
with `.contiguous()` first. The output is always contiguous.

Launches. A kernel is compiled and loaded by Triton's own launcher on its first call for a
specialisation (dtype, pointer alignment, constexprs, warps); later calls launch the same
loaded function through `kernels.launch` (one driver call), which is what makes a call cheap.
The split path's workspace is zeroed once per device, stream and P and kept: every launch leaves
its words tagged for the next, so no fill kernel runs before a launch.

Autotune once, then reuse. `python -m kernels.autotune` tunes the tile kernel on the lab shapes
and writes `STORED_PATH`; the wrapper launches the stored config without benchmarking as long
as the fingerprint (kernel source, config list, GPU name) matches (`kernels.triton_store`).

Under TRITON_INTERPRET=1 (set before this module is imported) the kernels run on CPU tensors
through Triton's interpreter; the tile path then uses `INTERPRETER_CONFIG`.
"""

from __future__ import annotations

import functools
import json

import torch
import triton

from . import triton_store as store
from .checks import FLOAT_DTYPES, check_softmax_input, prepare_output
from .launch import KernelLauncher, LaunchError, current_stream, driver
from .spec import LAB_SHAPES, SPEC_BY_NAME
from .triton_kernels import (
    JIT_KERNELS,
    softmax_row_kernel,
    softmax_rows_kernel,
    softmax_split_kernel,
    softmax_stream_kernel,
    softmax_tile_kernel,
)

KERNEL_NAME = "triton"
STORED_PATH = store.STORED_PATH
PATHS = SPEC_BY_NAME[KERNEL_NAME].path_names  # the registry's entry names them

# Every config is valid for every V: BLOCK is a tile width, not a bound on V.
CONFIGS = [triton.Config({"BLOCK": block}, num_warps=warps) for block in (256, 512, 1024, 2048) for warps in (2, 4, 8)]
INTERPRETER_CONFIG = {"BLOCK": 1024, "num_warps": 4}

DISPATCH_BOUNDARIES = {
    "tile_max_v": 2048,  # V above this leaves the tile/rows kernels
    "rows_min_b": 8192,  # with V <= tile_max_v, B from here on takes the multi-row kernel
    "row_max_v": 32768,  # V above this: split (or stream, below)
    "stream_max_v": 65536,  # 16-bit rows up to this long stream from stream_min_b rows on
    "stream_min_b": 1024,
}

# The split path's launch parameters, from the H200 sweeps of reports/profiles.md (CHUNK
# 2048-8192 x 4-8 warps x register caps at B = 1024 and 4096; CHUNK 512-8192 at B <= 64).
# maxnreg is the register cap handed to ptxas: it sets the programs resident per SM (128: four
# of four warps, 32 KB of float32 chunk each), hence the bytes in flight, and without a cap
# sm_90's ptxas spills a few bytes in some of these kernels. HOLD_INPUT (keep the 16-bit chunk,
# not its float32 exponentials, across the second meeting) measured slower and stays off.
SPLIT_PARAMS = {"CHUNK": 8192, "num_warps": 4, "HOLD_INPUT": False, "maxnreg": 128}
# A short batch: chunks halve until the launch has SPLIT_FILL programs per SM, down to
# SPLIT_MIN_CHUNK (below it a row's meetings, over hundreds of siblings, cost more than the
# idle SMs would give: 1024-element chunks were 15-100 % slower than 2048 at V = 262144).
SPLIT_FILL = 1
SPLIT_MIN_CHUNK = 2048

# Poll bound for the split kernel on a GPU: ~2^20 atomic reads (order of a second) is far
# beyond the time siblings need to be scheduled; it exists only so a launch cannot hang.
SPLIT_MAX_SPINS = 1 << 20
INT32_MAX = 2**31 - 1

INTERPRET = type(softmax_tile_kernel).__name__ == "InterpretedFunction"
_DEVICE_TYPE = "cpu" if INTERPRET else "cuda"


def fixed_point_scale(V: int) -> float:
    """2^(62 - ceil(log2 V)): the largest power of two with V * SCALE <= 2^62, so a row's
    fixed-point sum of exponentials (each term <= SCALE) cannot overflow an int64."""
    return float(2 ** (62 - (int(V) - 1).bit_length()))


# --------------------------------------------------------------------------- autotune plumbing

_bench_calls = 0


def _bench(kernel_call, quantiles):
    """The autotuner's timer: triton.testing.do_bench, counted so tests can see re-tuning."""
    global _bench_calls
    _bench_calls += 1
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


def bench_calls() -> int:
    """How many configs the autotuner has timed in this process."""
    return _bench_calls


_tile_autotuned = triton.autotune(configs=CONFIGS, key=["V"], do_bench=_bench)(softmax_tile_kernel)
config_dict = store.config_dict
read_stored = store.read_stored


def kernel_source_hash(kernel=None) -> str:
    """sha256 of a kernel's source; the tile kernel's by default (what the fingerprint covers)."""
    return store.source_hash(kernel or softmax_tile_kernel)


def configs_hash(configs=None) -> str:
    return store.configs_hash(CONFIGS if configs is None else configs)


def fingerprint(gpu_name: str, *, source_hash: str | None = None, config_hash: str | None = None) -> str:
    return store.fingerprint(
        gpu_name, source_hash=source_hash or kernel_source_hash(), config_hash=config_hash or configs_hash()
    )


def stored_choice(V: int, dtype: torch.dtype, gpu_name: str, *, path=None, source_hash=None, config_hash=None):
    """The stored tile config for (V, dtype) on this GPU, or None when absent or stale."""
    return store.stored_choice(
        V,
        dtype,
        gpu_name,
        source_hash=source_hash or kernel_source_hash(),
        config_hash=config_hash or configs_hash(),
        path=path,
    )


def write_stored(choices: dict, gpu_name: str, *, path=None, extra=None):
    """Merge `choices` into the stored file under this kernel's fingerprint on `gpu_name`."""
    return store.write_stored(
        choices, gpu_name, source_hash=kernel_source_hash(), config_hash=configs_hash(), path=path, extra=extra
    )


# What the wrapper resolved once per process: (device, V, dtype, file generation) -> config,
# (device, V, dtype) -> config the autotuner picked here, device -> (name, SM count).
_lookup_memo: dict = {}
_tuned_here: dict = {}
_device_info: dict = {}


def clear_autotune_memo() -> None:
    """Forget what this process resolved or tuned (the next call reads the stored file again)."""
    _lookup_memo.clear()
    _tuned_here.clear()
    _repeat.clear()
    _common.clear()
    _long_row_class.cache_clear()


def _gpu(device_index: int):
    info = _device_info.get(device_index)
    if info is None:
        props = torch.cuda.get_device_properties(device_index)
        info = _device_info[device_index] = (props.name, props.multi_processor_count)
    return info


def _device_index(device) -> int:
    device = torch.device("cuda") if device is None else torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def autotune_picked(V: int, dtype: torch.dtype = torch.float32, *, device=None, path=None):
    """The tile config {"BLOCK", "num_warps", "num_stages"} the wrapper uses for rows of length V.

    Order: the stored file (fresh fingerprint only), then what the autotuner chose in this
    process; None when neither exists yet (the next call autotunes). Under the interpreter it
    is `INTERPRETER_CONFIG`.
    """
    if INTERPRET:
        return dict(INTERPRETER_CONFIG, num_stages=3)
    dev = _device_index(device)
    name = _gpu(dev)[0]
    if path is not None:
        return stored_choice(V, dtype, name, path=path) or _tuned_here.get((dev, int(V), dtype))
    key = (dev, int(V), dtype, store.generation)
    if key not in _lookup_memo:
        _lookup_memo[key] = stored_choice(V, dtype, name)
    return _lookup_memo[key] or _tuned_here.get((dev, int(V), dtype))


def run_autotune(shapes=LAB_SHAPES, *, dtypes=(torch.float32,), path=None, device="cuda", seed=0):
    """Autotune the tile kernel on `shapes` with the GPU's timer and store the choices at `path`.

    The autotuner is keyed on V, so shapes that share V share one choice. Every config is
    timed on every shape; the choice for a V is the config with the smallest mean slowdown
    against each shape's own best, so no single B decides alone. Returns the stored record.
    """
    if INTERPRET or not torch.cuda.is_available():
        raise RuntimeError("run_autotune needs a CUDA GPU (and TRITON_INTERPRET unset)")
    dev = _device_index(device)
    name = _gpu(dev)[0]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    per_v: dict = {}
    for dtype in dtypes:
        for B, V in shapes:
            x = (torch.randn(B, V, generator=gen) * 3).to(device=f"cuda:{dev}", dtype=dtype)
            y = torch.empty_like(x)
            _tile_autotuned.cache.clear()
            _tile_autotuned[(B,)](x, y, V, x.stride(0), y.stride(0), fixed_point_scale(V), ALIGN=_align(x, y))
            timings = {
                json.dumps(config_dict(c), sort_keys=True): float(t[0] if isinstance(t, (list, tuple)) else t)
                for c, t in _tile_autotuned.configs_timings.items()
            }
            per_v.setdefault(store.choice_key(V, dtype), []).append(
                {"shape": [B, V], "timings_ms": timings, "best": config_dict(_tile_autotuned.best_config)}
            )
    choices = {}
    for key, runs in per_v.items():
        names = list(runs[0]["timings_ms"])
        score = {n: sum(r["timings_ms"][n] / min(r["timings_ms"].values()) for r in runs) / len(runs) for n in names}
        best = min(names, key=score.get)
        choices[key] = {**json.loads(best), "mean_slowdown": score[best], "runs": runs}
    _tile_autotuned.cache.clear()
    out_path = write_stored(choices, name, path=path)
    for key in [k for k in _tuned_here if k[0] == dev]:
        del _tuned_here[key]
    return {"path": str(out_path), "gpu": name, "fingerprint": fingerprint(name), "choices": choices}


# --------------------------------------------------------------------------- dispatch


def plan(B: int, V: int, dtype: torch.dtype = torch.float32, boundaries=None) -> str:
    """Name of the path softmax() takes for a (B, V) input: tile, rows, row, split or stream."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    if V <= b["tile_max_v"]:
        return "rows" if B >= b["rows_min_b"] else "tile"
    if V <= b["row_max_v"]:
        return "row"
    return long_row_path(dtype, B, V, boundaries=b)


def long_row_path(dtype: torch.dtype, B: int = 1, V: int | None = None, *, boundaries=None) -> str:
    """The path of rows longer than row_max_v: split, except 16-bit rows of at most stream_max_v
    from stream_min_b rows on (V None: the longest such rows)."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    short = V is None or V <= b["stream_max_v"]
    return "stream" if dtype != torch.float32 and B >= b["stream_min_b"] and short else "split"


def paths_for(dtype: torch.dtype) -> tuple:
    """The paths softmax() takes for some input of `dtype` (run_path reaches all of PATHS), as
    the registry's entry lists them (tests hold `plan` to it)."""
    return SPEC_BY_NAME[KERNEL_NAME].paths_for(dtype)


def launch_params(
    path: str, V: int, dtype: torch.dtype = torch.float32, *, B: int | None = None, sms: int | None = None
) -> dict:
    """The launch parameters a path uses for rows of length V (tile: its config), picked from
    sweeps on an H200 (reports/profiles.md). split also depends on the batch: with B rows on a
    GPU of `sms` multiprocessors, its chunks shrink (down to SPLIT_MIN_CHUNK) until the launch
    has SPLIT_FILL programs per multiprocessor, so a short batch still spreads over the GPU."""
    if path == "row":
        block = triton.next_power_of_2(V)
        if block <= 4096:
            warps = 4 if dtype == torch.float32 else 8
        else:
            warps = 16 if block <= 8192 else 32
        return {"BLOCK": block, "num_warps": warps}
    if path == "rows":
        block_v = triton.next_power_of_2(V)
        return {"ROWS": max(1, 2048 // block_v), "BLOCK_V": block_v, "num_warps": 4 if block_v >= 512 else 2}
    if path == "split":
        p = dict(SPLIT_PARAMS)
        if B is not None and sms is not None:
            while p["CHUNK"] > SPLIT_MIN_CHUNK and B * triton.cdiv(V, p["CHUNK"]) < SPLIT_FILL * sms:
                p["CHUNK"] //= 2
        return p
    if path == "stream":
        # BLOCK 2048-16384 x 4-16 warps x 1-8 programs per SM at B = 512 and 4096, V = 50257
        # and 128256 (reports/profiles.md): 4096 x 16 x 8 led or tied in bfloat16. Programs
        # beyond what fits an SM at once run as a second wave.
        return {"BLOCK": 4096, "num_warps": 16, "programs_per_sm": 8}
    if path == "tile":
        return {"config": INTERPRETER_CONFIG if INTERPRET else autotune_picked(V, dtype)}
    raise ValueError(f"{KERNEL_NAME} softmax: unknown path {path!r} ({', '.join(PATHS)})")


def _align(x: torch.Tensor, y: torch.Tensor) -> int:
    """Largest power of two <= 16 bytes' worth of elements dividing V and both row strides."""
    a = 16 // x.element_size()
    V, sx, sy = x.shape[1], x.stride(0), y.stride(0)
    while a > 1 and (V % a or sx % a or sy % a):
        a //= 2
    return a


def aligned_base(t: torch.Tensor, a: int):
    """(view, head): a view of t's storage starting `head` elements before t, at an address
    that is a multiple of `a` elements, so kernels can index t as view + head + offset with
    group-aligned offsets. (t, 0) when t starts too close to its storage's beginning."""
    es = t.element_size()
    ptr = t.data_ptr()
    if ptr % es:
        return t, 0
    head = (ptr // es) % a
    if head == 0 or t.storage_offset() < head:
        return t, 0
    return t.as_strided(t.shape, t.stride(), t.storage_offset() - head), head


def split_layout(x: torch.Tensor, y: torch.Tensor, *, CHUNK: int, align: int | None = None, num_warps: int = 4) -> dict:
    """Where the split kernel's chunks (or the stream kernel's tiles, CHUNK = BLOCK) fall for
    x -> y: the 16-byte-aligned base views and heads, programs per row P (split) and the output
    alignment. One function for the wrapper and tests.

    P_BLOCK: see p_block. FALLBACK_BLOCK, the tile of split's streaming fallback (taken only when siblings are not
    scheduled in time), is one element a thread on a GPU, so it costs the kernel no registers;
    under the interpreter, where every early chunk takes it, it is wide for speed. The fallback
    computes the same exact max and sum either way."""
    V, sx, sy = x.shape[1], x.stride(0), y.stride(0)
    a = align or 16 // x.element_size()  # group width in elements
    if CHUNK % a:
        raise ValueError(f"{KERNEL_NAME} softmax: CHUNK {CHUNK} is not a multiple of align {a}")
    xb, xo = aligned_base(x, a)
    yb, yo = aligned_base(y, a)
    # A row starting h elements past a group boundary spans cdiv(V + h, CHUNK) chunks; h is the
    # same for every row when the stride is a multiple of the group width.
    head = xo % a if sx % a == 0 else a - 1
    P = triton.cdiv(V + head, CHUNK)
    y_align = a
    while y_align > 1 and ((yo - xo) % y_align or (sy - sx) % y_align):
        y_align //= 2
    return {
        "xb": xb,
        "xo": xo,
        "yb": yb,
        "yo": yo,
        "P": P,
        "ALIGN": a,
        "Y_ALIGN": y_align,
        "P_BLOCK": p_block(P, num_warps),
        "FALLBACK_BLOCK": fallback_block(CHUNK, num_warps),
    }


def p_block(P: int, num_warps: int) -> int:
    """The split kernel's P_BLOCK: how many of a row's published words a program reads at once.
    At least 32 * num_warps, so no word is read by two warps and every decision on them is the
    program's, not a warp's (kernels/triton_kernels.py); otherwise 2P (both meetings in one
    read each) up to 256, and a row of more programs is met in several reads."""
    return max(32 * num_warps, min(triton.next_power_of_2(2 * P), 256))


def _checked_p_block(P_BLOCK: int, num_warps: int) -> int:
    if P_BLOCK & (P_BLOCK - 1) or (not INTERPRET and P_BLOCK < 32 * num_warps):
        # The interpreter runs one thread of a program: there smaller blocks test the loop.
        raise ValueError(f"{KERNEL_NAME} softmax: P_BLOCK {P_BLOCK} must be a power of two >= 32 * num_warps")
    return P_BLOCK


def fallback_block(CHUNK: int, num_warps: int) -> int:
    """The split kernel's FALLBACK_BLOCK (see split_layout)."""
    return min(CHUNK, 1024 if INTERPRET else 32 * num_warps)


def split_workspace_words(B: int, P: int) -> int:
    """int64 words a split launch of B rows and P programs per row uses (3 per program). A
    workspace must be zeroed when allocated and then serve launches of that P only: each launch
    tags its words one past the tags the last launch left (kernels/triton_kernels.py)."""
    return B * 3 * P


# --------------------------------------------------------------------------- launches

# (kernel, device, dtype, pointer alignments, meta) -> KernelLauncher, or None where this
# kernel must go through Triton's own launcher.
_launchers: dict = {}
_UNBUILT = object()


def _driver_launcher(compiled, name: str, kinds) -> KernelLauncher | None:
    """A direct launcher for a kernel Triton compiled and loaded, or None where its launch
    needs more than one plain driver call (scratch memory, clusters, cooperative or PDL)."""
    md = getattr(compiled, "metadata", None)
    function = getattr(compiled, "function", None)
    if md is None or not function:
        return None
    if (
        getattr(md, "num_ctas", 1) != 1
        or getattr(md, "global_scratch_size", 0)
        or getattr(md, "profile_scratch_size", 0)
        or getattr(md, "launch_cooperative_grid", False)
        or getattr(md, "launch_pdl", False)
    ):
        return None
    sizes = driver().param_sizes(function)
    if sizes is None or len(sizes) < len(kinds):
        return None
    try:
        return KernelLauncher(
            name,
            function,
            arg_kinds=kinds,
            block=32 * md.num_warps,
            shared=md.shared,
            extra_null_params=len(sizes) - len(kinds),
        )
    except LaunchError:
        return None


def _compiled_launcher(kernel, grid: int, dev: int, tensors: tuple, scalars: tuple, kinds: tuple, options: dict):
    """Launch `kernel(*tensors, *scalars, **options)` on `grid` programs and return the direct
    launcher for later calls of this specialisation (None: keep going through Triton).

    The first call for a specialisation goes through Triton, which compiles and loads it; the
    launcher built from that compiled kernel launches the very same function afterwards."""
    if INTERPRET:
        kernel[(grid,)](*tensors, *scalars, **options)
        return None
    key = (kernel, dev, tensors[0].dtype, tuple(t.data_ptr() % 16 == 0 for t in tensors), tuple(options.items()))
    launcher = _launchers.get(key, _UNBUILT)
    if launcher is _UNBUILT:
        compiled = kernel[(grid,)](*tensors, *scalars, **options)
        launcher = _launchers[key] = _driver_launcher(compiled, kernel.__name__, kinds)
    elif launcher is None:
        kernel[(grid,)](*tensors, *scalars, **options)
    else:
        launcher(dev, grid, *[t.data_ptr() for t in tensors], *scalars)
    return launcher


_TILE_KINDS = ("ptr", "ptr", "i32", "i32", "i32", "f32")
_ROWS_KINDS = ("ptr", "ptr", "i32", "i32", "i32", "i32", "f32")
_STREAM_KINDS = ("ptr", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "f32")
_SPLIT_KINDS = ("ptr", "ptr", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "f32")

# (device, stream, P) -> the split path's workspace, zeroed when allocated; every launch leaves
# its words tagged for the next one, so no fill kernel runs before a launch. One per P: the
# tags of a row's words stay in step only while the same programs write the same words.
# Superseded buffers are kept alive (they are small): a CUDA graph captured with one still
# points at it.
_workspaces: dict = {}
_retired_workspaces: list = []


def _split_workspace(dev: int, B: int, P: int) -> torch.Tensor:
    words = split_workspace_words(B, P)
    key = (dev, 0 if INTERPRET else current_stream(dev), P)
    ws = _workspaces.get(key)
    if ws is not None and ws.numel() >= words:
        return ws
    device = "cpu" if INTERPRET else f"cuda:{dev}"
    if not INTERPRET and torch.cuda.is_current_stream_capturing():
        # Memory allocated during a capture belongs to the graph: use it, never cache it. The
        # zero fill is captured too, so every replay starts from untagged words.
        return torch.zeros(words, dtype=torch.int64, device=device)
    if ws is not None:
        _retired_workspaces.append(ws)
    ws = _workspaces[key] = torch.zeros(max(words, 3 * P * 64), dtype=torch.int64, device=device)
    return ws


def _launch(x: torch.Tensor, y: torch.Tensor, path: str, params: dict):
    """Launch `path` for x -> y. Returns a function (x, y) -> None that repeats this launch for
    any tensors of the same layout (the fast path), or None where none applies."""
    B, V = x.shape
    sx, sy = x.stride(0), y.stride(0)
    if max(sx, sy) > INT32_MAX or B > INT32_MAX:
        raise ValueError(f"{KERNEL_NAME} softmax: row strides and B must fit 32 bits")
    dev = -1 if INTERPRET else x.get_device()
    align = params.get("align") or _align(x, y)
    scale = fixed_point_scale(V)
    if path in ("tile", "row"):  # one program per row: the same arguments, other constexprs
        if path == "tile":
            cfg = params.get("config") or (INTERPRETER_CONFIG if INTERPRET else autotune_picked(V, x.dtype, device=dev))
            if cfg is None:
                # No stored or earlier choice: standard autotune on first use of this V.
                _tile_autotuned[(B,)](x, y, V, sx, sy, scale, ALIGN=align)
                _tuned_here[(dev, int(V), x.dtype)] = config_dict(_tile_autotuned.best_config)
                return None
            kernel = softmax_tile_kernel
            options = {"BLOCK": cfg["BLOCK"], "num_warps": cfg["num_warps"], "num_stages": cfg.get("num_stages", 3)}
        else:
            p = {**launch_params(path, V, x.dtype), **params}
            kernel = softmax_row_kernel
            options = {"BLOCK": max(p["BLOCK"], triton.next_power_of_2(V)), "num_warps": p["num_warps"]}
        options["ALIGN"] = align
        launcher = _compiled_launcher(kernel, B, dev, (x, y), (V, sx, sy, scale), _TILE_KINDS, options)
        return launcher and (lambda x, y: launcher(dev, x.shape[0], x.data_ptr(), y.data_ptr(), V, sx, sy, scale))
    p = {**launch_params(path, V, x.dtype, B=B, sms=_sms(dev)), **params}
    if path == "rows":
        rows = p["ROWS"]
        block_v = max(p["BLOCK_V"], triton.next_power_of_2(V))
        launcher = _compiled_launcher(
            softmax_rows_kernel,
            triton.cdiv(B, rows),
            dev,
            (x, y),
            (B, V, sx, sy, scale),
            _ROWS_KINDS,
            {"ROWS": rows, "BLOCK_V": block_v, "ALIGN": align, "num_warps": p["num_warps"]},
        )
        return launcher and (
            lambda x, y: launcher(dev, -(-x.shape[0] // rows), x.data_ptr(), y.data_ptr(), x.shape[0], V, sx, sy, scale)
        )
    if path == "split":
        lay = split_layout(x, y, CHUNK=p["CHUNK"], align=params.get("align"), num_warps=p["num_warps"])
        P, xo, yo = lay["P"], lay["xo"], lay["yo"]
        max_spins = p.get("max_spins", 0 if INTERPRET else SPLIT_MAX_SPINS)
        ws = _split_workspace(dev, B, P)
        constexprs = {
            "CHUNK": p["CHUNK"],
            "P_BLOCK": _checked_p_block(p.get("P_BLOCK", lay["P_BLOCK"]), p["num_warps"]),
            "FALLBACK_BLOCK": lay["FALLBACK_BLOCK"],
            "MAX_SPINS": max_spins,
            "ALIGN": lay["ALIGN"],
            "Y_ALIGN": lay["Y_ALIGN"],
            "HOLD_INPUT": bool(p.get("HOLD_INPUT", False)),
        }
        launcher = _compiled_launcher(
            softmax_split_kernel,
            B * P,
            dev,
            (lay["xb"], lay["yb"], ws),
            (V, P, sx, sy, xo, yo, scale),
            _SPLIT_KINDS,
            {**constexprs, "num_warps": p["num_warps"], **({"maxnreg": p["maxnreg"]} if p.get("maxnreg") else {})},
        )
        es = x.element_size()

        def again(x, y):
            B = x.shape[0]
            ws = _split_workspace(dev, B, P)
            launcher(
                dev,
                B * P,
                x.data_ptr() - xo * es,
                y.data_ptr() - yo * es,
                ws.data_ptr(),
                V,
                P,
                sx,
                sy,
                xo,
                yo,
                scale,
            )

        return launcher and again
    if path == "stream":
        lay = split_layout(x, y, CHUNK=p["BLOCK"], align=params.get("align"))
        xo, yo = lay["xo"], lay["yo"]
        per_sm = p["programs_per_sm"]
        slots = 2 if INTERPRET else per_sm * _gpu(dev)[1]
        launcher = _compiled_launcher(
            softmax_stream_kernel,
            min(B, slots),
            dev,
            (lay["xb"], lay["yb"]),
            (B, V, sx, sy, xo, yo, scale),
            _STREAM_KINDS,
            {"BLOCK": p["BLOCK"], "ALIGN": lay["ALIGN"], "Y_ALIGN": lay["Y_ALIGN"], "num_warps": p["num_warps"]},
        )
        es = x.element_size()
        return launcher and (
            lambda x, y: launcher(
                dev,
                min(x.shape[0], slots),
                x.data_ptr() - xo * es,
                y.data_ptr() - yo * es,
                x.shape[0],
                V,
                sx,
                sy,
                xo,
                yo,
                scale,
            )
        )
    raise ValueError(f"{KERNEL_NAME} softmax: unknown path {path!r} ({', '.join(PATHS)})")


# (path, device, V, dtype, row strides, both addresses mod 16, stored-choice generation) ->
# the fast path of `_launch`. Everything a launch derives from these (alignment hints, chunk
# layout, the specialisation Triton compiled) is the same for every tensor that shares them.
_repeat: dict = {}
# The same for the common call (contiguous rows, a new output): keyed on the input alone.
_common: dict = {}


def _softmax(x: torch.Tensor, y: torch.Tensor, path: str, params: dict, common_key=None) -> torch.Tensor:
    if x.shape[0] == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    if INTERPRET or params:
        _launch(x, y, path, params)
        return y
    B, V = x.shape
    dev = x.get_device()
    key = (
        path,
        dev,
        V,
        x.dtype,
        x.stride(0),
        y.stride(0),
        x.data_ptr() % 16,
        y.data_ptr() % 16,
        store.generation,
        _batch_class(B, V, x.dtype, dev),
    )
    again = _repeat.get(key)
    if again is None:
        again = _launch(x, y, path, params)
        if again is None:
            return y
        _repeat[key] = again
    else:
        again(x, y)
    if common_key is not None and y.data_ptr() % 16 == 0:
        _common[common_key] = again
    return y


_ROWS_MIN_B = DISPATCH_BOUNDARIES["rows_min_b"]
_ROW_MAX_V = DISPATCH_BOUNDARIES["row_max_v"]
_common_generation = [store.generation]


def _sms(dev: int) -> int | None:
    """Multiprocessors of the launch's GPU (None under the interpreter: no batch rule)."""
    return None if INTERPRET else _gpu(dev)[1]


def _batch_class(B: int, V: int, dtype: torch.dtype, dev: int):
    """What a launch takes from B beyond the path: for long rows, the path (split or stream)
    and split's parameters, which shrink for short batches. Part of the remembered launches'
    keys, so a launch is reused only for batches it was made for."""
    if V <= _ROW_MAX_V:
        return B >= _ROWS_MIN_B
    return _long_row_class(B, V, dtype, dev)


@functools.lru_cache(maxsize=4096)
def _long_row_class(B: int, V: int, dtype: torch.dtype, dev: int) -> tuple:
    path = plan(B, V, dtype)
    if path != "split":
        return (path,)
    return (path, *sorted(launch_params(path, V, dtype, B=B, sms=_sms(dev)).items()))


def run_path(x: torch.Tensor, path: str, *, out=None, **params) -> torch.Tensor:
    """softmax(x) through one named path; `params` override that path's launch parameters
    (tile: config; row: num_warps; rows: ROWS, BLOCK_V, num_warps; split: CHUNK, num_warps,
    HOLD_INPUT, P_BLOCK, maxnreg, max_spins; stream: BLOCK, num_warps, programs_per_sm; any: align). Tests use it
    to reach every path at small V (e.g. split, CHUNK=16).
    """
    check_softmax_input(x, kernel=KERNEL_NAME, dtypes=FLOAT_DTYPES, device_type=_DEVICE_TYPE)
    y = prepare_output(x, out, kernel=KERNEL_NAME)
    if INTERPRET or x.shape[0] == 0 or x.get_device() == torch.cuda.current_device():
        return _softmax(x, y, path, params)
    with torch.cuda.device(x.get_device()):
        return _softmax(x, y, path, params)


def softmax(x: torch.Tensor, *, out=None) -> torch.Tensor:
    """Softmax over the last dimension of a (B, V) float32 / bfloat16 / float16 tensor."""
    common = None
    if out is None and not INTERPRET:
        # The common call (rows of unit column stride, a new output, which is 16-byte aligned):
        # everything the launch needs is keyed on the input alone.
        if _common_generation[0] != store.generation:  # a new stored autotune choice
            _common.clear()
            _common_generation[0] = store.generation
        try:
            B, V = x.shape
            sx, sc = x.stride()
            dev = x.get_device()
            if sc == 1 and dev >= 0:
                common = (x.dtype, V, dev, sx, x.data_ptr() & 15, _batch_class(B, V, x.dtype, dev))
            again = _common.get(common)
        except (AttributeError, TypeError, ValueError):
            common = again = None  # not a 2-D tensor: the checks below say what is wrong
        if again is not None and B > 0:
            y = torch.empty_like(x, memory_format=torch.contiguous_format)
            again(x, y)
            return y
    check_softmax_input(x, kernel=KERNEL_NAME, dtypes=FLOAT_DTYPES, device_type=_DEVICE_TYPE)
    y = prepare_output(x, out, kernel=KERNEL_NAME)
    B, V = x.shape
    path = plan(B, V, x.dtype)
    if INTERPRET or B == 0 or x.get_device() == torch.cuda.current_device():
        return _softmax(x, y, path, {}, common)
    with torch.cuda.device(x.get_device()):
        return _softmax(x, y, path, {}, common)


__all__ = [
    "softmax",
    "run_path",
    "plan",
    "paths_for",
    "long_row_path",
    "launch_params",
    "split_layout",
    "split_workspace_words",
    "p_block",
    "fallback_block",
    "SPLIT_PARAMS",
    "SPLIT_FILL",
    "SPLIT_MIN_CHUNK",
    "aligned_base",
    "fixed_point_scale",
    "CONFIGS",
    "DISPATCH_BOUNDARIES",
    "INTERPRETER_CONFIG",
    "LAB_SHAPES",
    "PATHS",
    "STORED_PATH",
    "JIT_KERNELS",
    "autotune_picked",
    "run_autotune",
    "stored_choice",
    "write_stored",
    "read_stored",
    "fingerprint",
    "kernel_source_hash",
    "configs_hash",
    "config_dict",
    "bench_calls",
    "clear_autotune_memo",
    "INTERPRET",
    "SPLIT_MAX_SPINS",
]
