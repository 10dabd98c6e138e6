"""Row softmax in Triton, with the tile width tuned once per GPU and the choice kept in the repo.

Paths (`plan(B, V, dtype)` names the one a call takes; `DISPATCH_BOUNDARIES` holds the limits):

  tile   V <= tile_max_v and B < rows_min_b. The autotuned kernel: one program per row, the
         row read in BLOCK-wide tiles. When V <= BLOCK the row stays in registers (one read,
         one write); otherwise an online max/sum pass, then a normalise pass that reads it again.
  rows   V <= tile_max_v and B >= rows_min_b. Many short rows: a [ROWS, BLOCK_V] block per
         program, so each program moves enough bytes to hide memory latency.
  row    tile_max_v < V <= row_max_v. One program holds the whole row in registers
         (BLOCK = next_pow2(V)): one read, one write.
  split  V > row_max_v. A row is too long for one program's registers, so P = cdiv(V + h, CHUNK)
         programs share it, each keeping its chunk in registers. Chunks are cut on 16-byte
         groups of the buffer (h: how far the row starts into a group), so at any V or row
         offset the bulk of the row moves in vector accesses; the few elements in the partial
         groups at the row's ends are read and written one by one by chunk 0. Each program
         publishes its partial (max, sum of exp) as one 64-bit atomic word, bumps the row's
         arrival counter, polls the counter until all P have arrived, combines the P words and
         writes its normalised chunk: still one read and one write.
         The poll is bounded: a program that gives up (its siblings not yet scheduled) streams
         the row itself to get the statistics, slower but correct, so the launch can never
         deadlock. Under the interpreter, whose programs run one after another, the bound is 0:
         the last chunk of a row combines the published words, the others take the streaming
         fallback, so both branches are exercised on CPU.

All arithmetic is float32 whatever the storage dtype (float32, bfloat16, float16). The input
may have any row stride (stride(0)); a tensor whose elements are not contiguous within a row
is copied with `.contiguous()` first. The output is always contiguous.

Autotune once, then reuse. `python -m kernels.autotune` tunes the tile kernel on the lab shapes
and writes `STORED_PATH` (kernels/triton_autotune.json). Each stored choice sits under a
fingerprint: a hash of the tile kernel's source, the config list and the GPU name, so editing
the kernel or the configs, or moving to another GPU, makes the wrapper ignore it and autotune
again on first use (standard `@triton.autotune` behaviour). A stored choice is applied by
launching the bare jitted kernel with that config, which does not depend on the autotuner's
internal cache layout. Triton's own compile cache needs no special handling: its key covers
the kernel source and its jitted callees, the Triton version, the target and the options, so
it cannot serve code compiled from an older source.

Under TRITON_INTERPRET=1 (set before this module is imported) the kernels run on CPU tensors;
the tile path then uses `INTERPRETER_CONFIG` instead of benchmarking.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from .checks import FLOAT_DTYPES, check_softmax_input, prepare_output

KERNEL_NAME = "triton"
STORED_PATH = Path(__file__).with_name("triton_autotune.json")
STORED_FORMAT = 1

# Every config is valid for every V: BLOCK is a tile width, not a bound on V.
CONFIGS = [triton.Config({"BLOCK": block}, num_warps=warps)
           for block in (256, 512, 1024, 2048) for warps in (2, 4, 8)]
INTERPRETER_CONFIG = {"BLOCK": 1024, "num_warps": 4}

DISPATCH_BOUNDARIES = {
    "tile_max_v": 2048,   # V above this leaves the tile/rows kernels
    "rows_min_b": 8192,   # with V <= tile_max_v, B from here on takes the multi-row kernel
    "row_max_v": 32768,   # V above this is split over several programs per row
}
# The shapes that `python -m kernels.autotune` tunes on.
LAB_SHAPES = ((64, 600), (512, 600), (4096, 600))

# Poll bound for the split kernel on a GPU: ~2^20 atomic reads (order of a second) is far
# beyond the time siblings need to be scheduled; it exists only so a launch cannot hang.
SPLIT_MAX_SPINS = 1 << 20


# --------------------------------------------------------------------------- kernels

@triton.jit
def _softmax_tile_kernel(X, Y, V, stride_x, stride_y, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    # ALIGN (from the wrapper) divides V and both row strides. Saying so lets Triton use
    # ALIGN-wide vector accesses: row offsets are multiples of ALIGN and the mask, written on
    # ALIGN-groups, is constant within a vector (it equals cols < V because ALIGN | V).
    row = tl.program_id(0).to(tl.int64)
    x_row = X + tl.multiple_of(row * stride_x, ALIGN)
    y_row = Y + tl.multiple_of(row * stride_y, ALIGN)
    cols = tl.arange(0, BLOCK)
    V_A = V // ALIGN
    if V <= BLOCK:
        mask = (cols // ALIGN) < V_A
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        # An all -inf row gives m = -inf and exp(NaN): NaN throughout, as F.softmax does.
        e = tl.exp(x - m)
        y = e / tl.sum(e, axis=0)
        tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Per-lane running max and sum: no cross-warp reduction inside the loop.
        m_lane = tl.full([BLOCK], -float("inf"), tl.float32)
        s_lane = tl.zeros([BLOCK], tl.float32)
        # while, not range(0, V, BLOCK): Triton 3.6's interpreter cannot take a run-time
        # range bound under NumPy 2 (int() of a 1-element array).
        start = 0
        while start < V:
            idx = tl.multiple_of(start, BLOCK) + cols
            x = tl.load(x_row + idx, mask=(idx // ALIGN) < V_A, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m_lane, x)
            # Guard -inf - -inf (a lane that has seen only -inf so far).
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s_lane = s_lane * tl.exp(m_lane - m_safe) + tl.exp(x - m_safe)
            m_lane = m_new
            start += BLOCK
        m = tl.max(m_lane, axis=0)
        m_ref = tl.where(m == -float("inf"), 0.0, m)
        s = tl.sum(s_lane * tl.exp(m_lane - m_ref), axis=0)
        # All -inf: s = 0 and exp(-inf - -inf) = NaN, so NaN output like F.softmax.
        inv = 1.0 / s
        start = 0
        while start < V:
            idx = tl.multiple_of(start, BLOCK) + cols
            mask = (idx // ALIGN) < V_A
            x = tl.load(x_row + idx, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(y_row + idx, (tl.exp(x - m) * inv).to(Y.dtype.element_ty), mask=mask)
            start += BLOCK


@triton.jit
def _softmax_row_kernel(X, Y, V, stride_x, stride_y, BLOCK: tl.constexpr, ALIGN: tl.constexpr = 1):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (cols // ALIGN) < V // ALIGN  # == cols < V, constant over ALIGN-groups
    x = tl.load(X + tl.multiple_of(row * stride_x, ALIGN) + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    y = e / tl.sum(e, axis=0)
    tl.store(Y + tl.multiple_of(row * stride_y, ALIGN) + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_rows_kernel(X, Y, B, V, stride_x, stride_y, ROWS: tl.constexpr, BLOCK_V: tl.constexpr,
                         ALIGN: tl.constexpr = 1):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_V)
    mask = (rows < B)[:, None] & ((cols // ALIGN) < V // ALIGN)[None, :]  # [ROWS, BLOCK_V]
    x_off = tl.multiple_of(rows * stride_x, ALIGN)
    y_off = tl.multiple_of(rows * stride_y, ALIGN)
    # Rows past B load -inf throughout and turn to NaN, but are never stored.
    x = tl.load(X + x_off[:, None] + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    e = tl.exp(x - m[:, None])
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(Y + y_off[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_split_kernel(X, Y, WS, V, P, stride_x, stride_y, x_off, y_off,
                          CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, FALLBACK_BLOCK: tl.constexpr,
                          MAX_SPINS: tl.constexpr, ALIGN: tl.constexpr = 1, Y_ALIGN: tl.constexpr = 1):
    # Chunks are cut on ALIGN-groups of element offsets from X (the wrapper makes X 16-byte
    # aligned and passes the tensor's head as x_off), not on column numbers, so every chunk
    # starts on a group boundary whatever V and the row stride are, and the bulk of a row is
    # read and written in whole groups (vector accesses). The groups a row only partly covers
    # (at most ALIGN - 1 elements at each end) are "edges", handled by chunk 0 element-wise.
    # Y_ALIGN divides the distance between a row's output and input offsets, so stores of
    # whole input groups are Y_ALIGN-aligned too.
    # Work item pid -> (row, chunk); a row's P chunks have consecutive ids, so the hardware
    # dispatches them together.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // P
    chunk = pid - row * P
    xs = x_off + row * stride_x                       # row start, elements from X
    g_lo = (xs + ALIGN - 1) // ALIGN                  # first group wholly inside the row
    g_hi = (xs + V) // ALIGN                          # one past the last such group
    c_start = tl.multiple_of((xs // ALIGN) * ALIGN + chunk * CHUNK, ALIGN)
    c_g = c_start // ALIGN
    cols = tl.arange(0, CHUNK)
    grp = cols // ALIGN                               # constant over ALIGN-groups
    mask = (grp >= (g_lo - c_g).to(tl.int32)) & (grp < (g_hi - c_g).to(tl.int32))
    x = tl.load(X + c_start + cols, mask=mask, other=-float("inf")).to(tl.float32)
    # Edges: the first ALIGN offsets of the row and the partial group at its end, each element
    # once (the tail part skips what the head part covers), all in-row elements of partial
    # groups and nothing else. Only chunk 0 loads and stores them.
    e = tl.arange(0, 2 * ALIGN)
    pos = tl.where(e < ALIGN, xs + e, g_hi * ALIGN + (e - ALIGN))
    pos_g = pos // ALIGN
    # (pos - pos + chunk): the chunk test as a tensor; the interpreter rejects a scalar term in a mask.
    e_mask = ((pos >= xs) & (pos < xs + V) & ((pos_g < g_lo) | (pos_g >= g_hi))
              & ((e < ALIGN) | (pos >= xs + ALIGN)) & ((pos - pos + chunk) == 0))
    xe = tl.load(X + pos, mask=e_mask, other=-float("inf")).to(tl.float32)

    m_c = tl.maximum(tl.max(x, axis=0), tl.max(xe, axis=0))
    m_c_safe = tl.where(m_c == -float("inf"), 0.0, m_c)
    s_c = tl.sum(tl.exp(x - m_c_safe), axis=0) + tl.sum(tl.exp(xe - m_c_safe), axis=0)
    # One 64-bit word (max bits high, sum bits low) so readers never see half a partial.
    m_bits = m_c.to(tl.int32, bitcast=True).to(tl.int64)
    s_bits = s_c.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    # Row workspace: P words, then an arrival counter.
    ws_row = WS + row * (P + 1)
    # Scalar atomics run in one thread and their results reach every thread of the program
    # through shared memory, so `ready` below is the same in all threads and the branch on it
    # cannot diverge across the reductions (and barriers) inside it. The release on the
    # counter orders the word before it; the acquire when polling orders the word reads after.
    tl.atomic_xchg(ws_row + chunk, (m_bits << 32) | s_bits, sem="relaxed")
    tl.atomic_add(ws_row + P, 1, sem="release")
    ready = tl.atomic_add(ws_row + P, 0, sem="acquire")
    spins = 0
    while (ready < P) & (spins < MAX_SPINS):
        ready = tl.atomic_add(ws_row + P, 0, sem="acquire")
        spins += 1

    if ready == P:
        slots = tl.arange(0, P_BLOCK)
        slot_ok = slots < P
        # volatile: read from L2, not from an L1 line another program on this SM left behind.
        words = tl.load(ws_row + slots, mask=slot_ok, other=0, volatile=True)
        m_p = (words >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        s_p = words.to(tl.int32).to(tl.float32, bitcast=True)
        m_p = tl.where(slot_ok, m_p, -float("inf"))
        s_p = tl.where(slot_ok, s_p, 0.0)
        m_row = tl.max(m_p, axis=0)
        m_ref = tl.where(m_row == -float("inf"), 0.0, m_row)
        # Chunks that were all -inf (or empty) carry s = 0 and drop out; an all -inf row gives s = 0.
        s_row = tl.sum(s_p * tl.exp(m_p - m_ref), axis=0)
    else:
        # Siblings not scheduled in time: read the whole row for its statistics.
        x_row = X + xs
        fcols = tl.arange(0, FALLBACK_BLOCK)
        m_row = -float("inf")
        s_row = 0.0
        start = 0
        while start < V:
            idx = start + fcols
            t = tl.load(x_row + idx, mask=idx < V, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m_row, tl.max(t, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s_row = s_row * tl.exp(m_row - m_safe) + tl.sum(tl.exp(t - m_safe), axis=0)
            m_row = m_new
            start += FALLBACK_BLOCK
    inv = 1.0 / s_row
    # Output element of input offset o sits at Y + o + shift.
    shift = tl.multiple_of(y_off + row * stride_y - xs, Y_ALIGN)
    tl.store(Y + shift + c_start + cols, (tl.exp(x - m_row) * inv).to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + shift + pos, (tl.exp(xe - m_row) * inv).to(Y.dtype.element_ty), mask=e_mask)


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


_softmax_tile_autotuned = triton.autotune(configs=CONFIGS, key=["V"], do_bench=_bench)(_softmax_tile_kernel)

INTERPRET = type(_softmax_tile_kernel).__name__ == "InterpretedFunction"


def _python_fn(kernel):
    return getattr(kernel, "fn", kernel)


def config_dict(cfg) -> dict:
    """A triton.Config as the plain dict stored on disk and returned by `autotune_picked`."""
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def kernel_source_hash(kernel=None) -> str:
    """sha256 of the tile kernel's Python source (what `@triton.jit` compiles)."""
    return hashlib.sha256(inspect.getsource(_python_fn(kernel or _softmax_tile_kernel)).encode()).hexdigest()


def configs_hash(configs=None) -> str:
    configs = CONFIGS if configs is None else configs
    text = json.dumps([{**config_dict(c), "num_ctas": c.num_ctas, "maxnreg": c.maxnreg} for c in configs],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(gpu_name: str, *, source_hash: str | None = None, config_hash: str | None = None) -> str:
    """The key a stored choice lives under; any change of kernel, configs or GPU changes it."""
    parts = [source_hash or kernel_source_hash(), config_hash or configs_hash(), gpu_name]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _choice_key(V: int, dtype: torch.dtype) -> str:
    return f"{int(V)}|{str(dtype).removeprefix('torch.')}"


def read_stored(path=None) -> dict:
    """The stored file as a dict ({} when it does not exist)."""
    path = Path(path) if path is not None else STORED_PATH
    if not path.exists():
        return {}
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != STORED_FORMAT:
        return {}
    return data


def stored_choice(V: int, dtype: torch.dtype, gpu_name: str, *, path=None, source_hash=None,
                  config_hash=None):
    """The stored config for (V, dtype) on this GPU, or None when absent or stale."""
    entry = read_stored(path).get("entries", {}).get(
        fingerprint(gpu_name, source_hash=source_hash, config_hash=config_hash))
    if entry is None:
        return None
    choice = entry.get("choices", {}).get(_choice_key(V, dtype))
    if choice is None:
        return None
    return {"BLOCK": int(choice["BLOCK"]), "num_warps": int(choice["num_warps"]),
            "num_stages": int(choice.get("num_stages", 3))}


def write_stored(choices: dict, gpu_name: str, *, path=None, extra=None) -> Path:
    """Merge `choices` ({(V, dtype) key string: config dict}) into the file under this fingerprint.

    Entries under other fingerprints (other GPUs) are kept; stale ones for this GPU are dropped.
    """
    path = Path(path) if path is not None else STORED_PATH
    data = read_stored(path) or {"format": STORED_FORMAT, "entries": {}}
    key = fingerprint(gpu_name)
    entries = {k: v for k, v in data.get("entries", {}).items() if v.get("gpu") != gpu_name or k == key}
    entry = entries.setdefault(key, {})
    entry.update({"gpu": gpu_name, "kernel_source_sha256": kernel_source_hash(),
                  "configs_sha256": configs_hash(), "triton": triton.__version__,
                  "torch": torch.__version__, **(extra or {})})
    entry.setdefault("choices", {}).update(choices)
    data["entries"] = entries
    data["format"] = STORED_FORMAT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    _lookup_cache.clear()
    return path


# Per-process memo of what the wrapper uses: (device index, V, dtype) -> config dict.
_lookup_cache: dict = {}
_tuned_here: dict = {}
_device_info: dict = {}


def _gpu(device: torch.device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    info = _device_info.get(idx)
    if info is None:
        props = torch.cuda.get_device_properties(idx)
        info = _device_info[idx] = (idx, props.name, props.multi_processor_count)
    return info


def autotune_picked(V: int, dtype: torch.dtype = torch.float32, *, device=None, path=None):
    """The tile config {"BLOCK", "num_warps", "num_stages"} the wrapper uses for rows of length V.

    Order: the stored file (fresh fingerprint only), then what the autotuner chose in this
    process; None when neither exists yet (the next call autotunes). Under the interpreter it
    is `INTERPRETER_CONFIG`.
    """
    if INTERPRET:
        return dict(INTERPRETER_CONFIG, num_stages=3)
    dev_idx, name, _ = _gpu(torch.device("cuda") if device is None else torch.device(device))
    key = (dev_idx, int(V), dtype)
    if path is not None:
        return stored_choice(V, dtype, name, path=path) or _tuned_here.get(key)
    # The file is read once per (device, V, dtype); write_stored() clears this memo.
    if key not in _lookup_cache:
        _lookup_cache[key] = stored_choice(V, dtype, name)
    return _lookup_cache[key] or _tuned_here.get(key)


def run_autotune(shapes=LAB_SHAPES, *, dtypes=(torch.float32,), path=None, device="cuda", seed=0):
    """Autotune the tile kernel on `shapes` with the GPU's timer and store the choices at `path`.

    The autotuner is keyed on V, so shapes that share V share one choice. Every config is
    timed on every shape; the choice for a V is the config with the smallest mean slowdown
    against each shape's own best, so no single B decides alone. Returns the stored record.
    """
    if INTERPRET or not torch.cuda.is_available():
        raise RuntimeError("run_autotune needs a CUDA GPU (and TRITON_INTERPRET unset)")
    device = torch.device(device)
    dev_idx, name, _ = _gpu(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    per_v: dict = {}
    for dtype in dtypes:
        for B, V in shapes:
            x = (torch.randn(B, V, generator=gen) * 3).to(device=device, dtype=dtype)
            y = torch.empty_like(x)
            _softmax_tile_autotuned.cache.clear()
            _softmax_tile_autotuned[(B,)](x, y, V, x.stride(0), y.stride(0), ALIGN=_align(x, y))
            timings = {json.dumps(config_dict(c), sort_keys=True): float(t[0] if isinstance(t, (list, tuple)) else t)
                       for c, t in _softmax_tile_autotuned.configs_timings.items()}
            per_v.setdefault(_choice_key(V, dtype), []).append({"shape": [B, V], "timings_ms": timings,
                                                                "best": config_dict(_softmax_tile_autotuned.best_config)})
    choices = {}
    for key, runs in per_v.items():
        names = list(runs[0]["timings_ms"])
        score = {n: sum(r["timings_ms"][n] / min(r["timings_ms"].values()) for r in runs) / len(runs) for n in names}
        best = min(names, key=score.get)
        choices[key] = {**json.loads(best), "mean_slowdown": score[best], "runs": runs}
    _softmax_tile_autotuned.cache.clear()
    out_path = write_stored(choices, name, path=path)
    for key in [k for k in _tuned_here if k[0] == dev_idx]:
        del _tuned_here[key]
    return {"path": str(out_path), "gpu": name, "fingerprint": fingerprint(name), "choices": choices}


# --------------------------------------------------------------------------- dispatch

def plan(B: int, V: int, dtype: torch.dtype = torch.float32, boundaries=None) -> str:
    """Name of the path softmax() takes for a (B, V) input: tile, rows, row or split."""
    b = DISPATCH_BOUNDARIES if boundaries is None else boundaries
    if V <= b["tile_max_v"]:
        return "rows" if B >= b["rows_min_b"] else "tile"
    if V <= b["row_max_v"]:
        return "row"
    return "split"


# Launch parameters below were picked from a sweep on an H200 (fraction of copy bandwidth at
# B = 4096 / 32768); see the module docstring for the paths.
def _row_warps(block: int, dtype) -> int:
    if block <= 4096:
        return 4 if dtype == torch.float32 else 8
    return 16 if block <= 8192 else 32


def _rows_params(V: int, dtype) -> dict:
    block_v = triton.next_power_of_2(V)
    return {"ROWS": max(1, 2048 // block_v), "BLOCK_V": block_v, "num_warps": 4 if block_v >= 512 else 2}


def _split_params(V: int, dtype) -> dict:
    if dtype == torch.float32 and V >= 65536:
        return {"CHUNK": 8192, "num_warps": 8}
    return {"CHUNK": 4096, "num_warps": 4}


def _align(x: torch.Tensor, y: torch.Tensor) -> int:
    """Largest power of two <= 16 bytes' worth of elements dividing V and both row strides."""
    a = 16 // x.element_size()
    V, sx, sy = x.shape[1], x.stride(0), y.stride(0)
    while a > 1 and (V % a or sx % a or sy % a):
        a //= 2
    return a


def _aligned_base(t: torch.Tensor, a: int):
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


def _launch(x: torch.Tensor, y: torch.Tensor, path: str, params: dict) -> torch.Tensor:
    B, V = x.shape
    if B == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    sx, sy = x.stride(0), y.stride(0)
    align = params.get("align", _align(x, y))
    if path == "tile":
        cfg = params.get("config")
        if cfg is None and INTERPRET:
            cfg = INTERPRETER_CONFIG
        if cfg is None:
            cfg = autotune_picked(V, x.dtype, device=x.device)
        if cfg is None:
            # No stored or earlier choice: standard autotune on first use of this V.
            _softmax_tile_autotuned[(B,)](x, y, V, sx, sy, ALIGN=align)
            _tuned_here[(_gpu(x.device)[0], int(V), x.dtype)] = config_dict(_softmax_tile_autotuned.best_config)
        else:
            _softmax_tile_kernel[(B,)](x, y, V, sx, sy, BLOCK=cfg["BLOCK"], ALIGN=align, num_warps=cfg["num_warps"],
                                       num_stages=cfg.get("num_stages", 3))
    elif path == "row":
        block = triton.next_power_of_2(V)
        _softmax_row_kernel[(B,)](x, y, V, sx, sy, BLOCK=block, ALIGN=align,
                                  num_warps=params.get("num_warps", _row_warps(block, x.dtype)))
    elif path == "rows":
        p = {**_rows_params(V, x.dtype), **params}
        block_v = max(p["BLOCK_V"], triton.next_power_of_2(V))
        _softmax_rows_kernel[(triton.cdiv(B, p["ROWS"]),)](x, y, B, V, sx, sy, ROWS=p["ROWS"], BLOCK_V=block_v,
                                                           ALIGN=align, num_warps=p["num_warps"])
    elif path == "split":
        p = {**_split_params(V, x.dtype), **params}
        chunk = p["CHUNK"]
        # Group width in elements: 16 bytes unless a test asks for another power of two.
        a = p.get("align", 16 // x.element_size())
        if chunk % a:
            raise ValueError(f"{KERNEL_NAME} softmax: CHUNK {chunk} is not a multiple of align {a}")
        xb, xo = _aligned_base(x, a)
        yb, yo = _aligned_base(y, a)
        # A row starting h elements past a group boundary spans cdiv(V + h, CHUNK) chunks; h is
        # the same for every row when the stride is a multiple of the group width.
        head = xo % a if sx % a == 0 else a - 1
        P = triton.cdiv(V + head, chunk)
        y_align = a
        while y_align > 1 and ((yo - xo) % y_align or (sy - sx) % y_align):
            y_align //= 2
        ws = torch.zeros(B * (P + 1), dtype=torch.int64, device=x.device)
        max_spins = p.get("max_spins", 0 if INTERPRET else SPLIT_MAX_SPINS)
        _softmax_split_kernel[(B * P,)](xb, yb, ws, V, P, sx, sy, xo, yo, CHUNK=chunk,
                                        P_BLOCK=max(2, triton.next_power_of_2(P)),
                                        FALLBACK_BLOCK=min(chunk, 1024), MAX_SPINS=max_spins, ALIGN=a,
                                        Y_ALIGN=y_align, num_warps=p["num_warps"])
    else:
        raise ValueError(f"{KERNEL_NAME} softmax: unknown path {path!r} (tile, rows, row, split)")
    return y


_DEVICE_TYPE = "cpu" if INTERPRET else "cuda"


def run_path(x: torch.Tensor, path: str, *, out=None, **params) -> torch.Tensor:
    """softmax(x) through one named path; `params` override that path's launch parameters
    (tile: config; row: num_warps; rows: ROWS, BLOCK_V, num_warps; split: CHUNK, num_warps,
    max_spins; any: align). Tests use it to reach every path at small V (e.g. split, CHUNK=16).
    """
    check_softmax_input(x, kernel=KERNEL_NAME, dtypes=FLOAT_DTYPES, device_type=_DEVICE_TYPE)
    return _launch(x, prepare_output(x, out, kernel=KERNEL_NAME), path, params)


def softmax(x: torch.Tensor, *, out=None) -> torch.Tensor:
    """Softmax over the last dimension of a (B, V) float32 / bfloat16 / float16 tensor."""
    check_softmax_input(x, kernel=KERNEL_NAME, dtypes=FLOAT_DTYPES, device_type=_DEVICE_TYPE)
    y = prepare_output(x, out, kernel=KERNEL_NAME)
    return _launch(x, y, plan(x.shape[0], x.shape[1], x.dtype), {})


__all__ = ["softmax", "run_path", "plan", "CONFIGS", "DISPATCH_BOUNDARIES", "INTERPRETER_CONFIG", "LAB_SHAPES",
           "STORED_PATH", "autotune_picked", "run_autotune", "stored_choice", "write_stored", "read_stored",
           "fingerprint", "kernel_source_hash", "configs_hash", "bench_calls", "INTERPRET"]
