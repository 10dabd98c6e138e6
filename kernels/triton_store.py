"""Autotuning of the Triton tile kernel: its configs, the stored choice
(kernels/triton_autotune.json) and the order in which a launch looks a config up; the offline
tuner is `python -m kernels.autotune` (kernels/autotune.py).

A choice serves a bucket of row lengths, the next power of two of V (at least MIN_BUCKET): the
tile kernel's best BLOCK and warp count follow the row's size class, not its exact length, so a
row of a length nobody tuned for takes its bucket's choice instead of timing twelve configs
(each a compile) in every process. The offline tuner times TUNE_SHAPES: a few batch sizes in
every bucket of the tile path.

Each stored choice sits under a fingerprint: a hash of what the tile kernel compiles (its
syntax tree and its helpers', `kernel_source_hash`), the config list and the GPU name, so
changing the kernel, a helper it calls or the configs, or moving to another GPU, makes the
wrapper ignore it and autotune again on first use (standard `@triton.autotune` behaviour).

The file read and written by default is STORED_PATH, or the file named by the environment
variable SOFTMAX_SUITE_TRITON_AUTOTUNE_FILE (set it before the first call, or call
`clear_autotune_memo()` of `kernels.softmax_triton` after changing it).

Under TRITON_INTERPRET=1 the tile path uses `INTERPRETER_CONFIG` and nothing is tuned.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import textwrap
from pathlib import Path

import torch
import triton

from .launch import device_info
from .spec import LAB_SHAPES
from .triton_dispatch import DISPATCH_BOUNDARIES, INTERPRET
from .triton_kernels import softmax_tile_kernel

STORED_PATH = Path(__file__).with_name("triton_autotune.json")
STORED_PATH_ENV = "SOFTMAX_SUITE_TRITON_AUTOTUNE_FILE"
STORED_FORMAT = 2  # 2: choices keyed on V's bucket (1: on V itself)
# Fields of an entry whose choices were carried over, unmeasured, from an earlier tile kernel
# source (its sha256 and why): the next write_stored for that fingerprint removes them.
CARRIED_OVER_FIELDS = ("choices_measured_with_kernel_source_sha256", "note")

# Every config is valid for every V: BLOCK is a tile width, not a bound on V.
CONFIGS = [triton.Config({"BLOCK": block}, num_warps=warps) for block in (256, 512, 1024, 2048) for warps in (2, 4, 8)]
INTERPRETER_CONFIG = {"BLOCK": 1024, "num_warps": 4}

# Bumped by every write, so memos of what the file said know they are stale.
generation = 0


def stored_path() -> Path:
    """The stored file this process reads and writes by default (STORED_PATH unless the
    environment variable STORED_PATH_ENV names another)."""
    env = os.environ.get(STORED_PATH_ENV, "").strip()
    return Path(env) if env else STORED_PATH


# --------------------------------------------------------------------------- fingerprint


def config_dict(cfg) -> dict:
    """A triton.Config as the plain dict stored on disk and returned by `autotune_picked`."""
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


@functools.cache  # a process's kernels do not change once loaded; lookups ask once per bucket
def kernel_source_hash(kernel=None) -> str:
    """sha256 of what `@triton.jit` compiles for a kernel (the tile kernel by default): the
    syntax tree of its function and of every jit function it calls, directly or through others,
    and the values of the module constants they read. Comments, docstrings and formatting do not
    count; an edit to a helper the kernel calls (its exp, its normaliser) does."""
    h = hashlib.sha256()
    todo, seen = [kernel or softmax_tile_kernel], set()
    while todo:
        fn = todo.pop(0)
        while hasattr(fn, "fn"):  # a JITFunction, or the interpreter's stand-in, around the Python function
            fn = fn.fn
        if fn in seen:
            continue
        seen.add(fn)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node, clean=False) is not None:
                node.body = node.body[1:] or [ast.Pass()]
        h.update(ast.unparse(tree).encode())  # one text on 3.11 and 3.12 (the H200 agrees); ast.dump differs
        for name in sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}):
            value = fn.__globals__.get(name)
            if isinstance(value, triton.runtime.jit.KernelInterface):
                todo.append(value)
            elif isinstance(value, (triton.language.constexpr, int, float, str)):
                value = getattr(value, "value", value)  # constexpr's repr differs between Triton versions
                h.update(f"{name}={value!r}".encode())
    return h.hexdigest()


def configs_hash(configs=None) -> str:
    """sha256 of a config list; CONFIGS (as it is at the call) by default."""
    configs = CONFIGS if configs is None else configs
    text = json.dumps(
        [{**config_dict(c), "num_ctas": c.num_ctas, "maxnreg": c.maxnreg} for c in configs], sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(gpu_name: str, *, source_hash: str | None = None, config_hash: str | None = None) -> str:
    """The key a stored choice lives under; any change of kernel, configs or GPU changes it."""
    parts = [source_hash or kernel_source_hash(), config_hash or configs_hash(), gpu_name]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


MIN_BUCKET = 16


def v_bucket(V: int) -> int:
    """The bucket of row lengths a choice serves: the next power of two of V, at least MIN_BUCKET."""
    return max(MIN_BUCKET, triton.next_power_of_2(int(V)))


def _tune_shapes() -> tuple:
    """LAB_SHAPES, and in every other bucket of the tile path an odd V three quarters of the way
    up at a short and a long batch."""
    lab_buckets = {v_bucket(V) for _, V in LAB_SHAPES}
    shapes = list(LAB_SHAPES)
    bucket = MIN_BUCKET
    while bucket <= DISPATCH_BOUNDARIES["tile_max_v"]:
        if bucket not in lab_buckets:
            shapes += [(B, 3 * bucket // 4 + 1) for B in (64, 4096)]
        bucket *= 2
    return tuple(shapes)


TUNE_SHAPES = _tune_shapes()


def choice_key(V: int, dtype: torch.dtype) -> str:
    """Where the choice for rows of length V in `dtype` is stored: "bucket|dtype"."""
    return f"{v_bucket(V)}|{str(dtype).removeprefix('torch.')}"


# --------------------------------------------------------------------------- the stored file


def read_stored(path=None) -> dict:
    """The stored file as a dict ({} when it does not exist or has another format)."""
    path = Path(path) if path is not None else stored_path()
    if not path.exists():
        return {}
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != STORED_FORMAT:
        return {}
    return data


def stored_choice(V: int, dtype: torch.dtype, gpu_name: str, *, path=None, source_hash=None, config_hash=None):
    """The stored tile config for rows of length V (its bucket's) in `dtype` on this GPU, or None
    when absent or stale."""
    key = fingerprint(gpu_name, source_hash=source_hash, config_hash=config_hash)
    entry = read_stored(path).get("entries", {}).get(key)
    if entry is None:
        return None
    choice = entry.get("choices", {}).get(choice_key(V, dtype))
    if choice is None:
        return None
    return {
        "BLOCK": int(choice["BLOCK"]),
        "num_warps": int(choice["num_warps"]),
        "num_stages": int(choice.get("num_stages", 3)),
    }


def write_stored(choices: dict, gpu_name: str, *, path=None, extra=None, source_hash=None, config_hash=None) -> Path:
    """Merge `choices` ({choice_key: config dict}) into the file under this kernel's
    fingerprint on `gpu_name`.

    Entries under other fingerprints (other GPUs) are kept; stale ones for this GPU are dropped.
    """
    global generation
    source_hash = source_hash or kernel_source_hash()
    config_hash = config_hash or configs_hash()
    path = Path(path) if path is not None else stored_path()
    data = read_stored(path) or {"format": STORED_FORMAT, "entries": {}}
    key = fingerprint(gpu_name, source_hash=source_hash, config_hash=config_hash)
    entries = {k: v for k, v in data.get("entries", {}).items() if v.get("gpu") != gpu_name or k == key}
    entry = entries.setdefault(key, {})
    # A choice carried over from an earlier kernel source says so; measuring replaces that.
    for carried in CARRIED_OVER_FIELDS:
        entry.pop(carried, None)
    entry.update(
        {
            "gpu": gpu_name,
            "kernel_source_sha256": source_hash,
            "configs_sha256": config_hash,
            "triton": triton.__version__,
            "torch": torch.__version__,
            **(extra or {}),
        }
    )
    entry.setdefault("choices", {}).update(choices)
    data["entries"] = entries
    data["format"] = STORED_FORMAT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    generation += 1
    return path


# --------------------------------------------------------------------------- the autotuner

_bench_calls = 0


def _bench(kernel_call, quantiles):
    """The autotuner's timer: triton.testing.do_bench, counted so tests can see re-tuning."""
    global _bench_calls
    _bench_calls += 1
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


def bench_calls() -> int:
    """How many configs the autotuner has timed in this process."""
    return _bench_calls


# The tile kernel under @triton.autotune, keyed on V (kernels.triton_launch calls it where no
# choice exists yet; run_autotune times every config with it).
tile_autotuned = triton.autotune(configs=CONFIGS, key=["V"], do_bench=_bench)(softmax_tile_kernel)

# What the lookups resolved once per process: (device, bucket, dtype, file generation) -> config,
# (device, bucket, dtype) -> config the autotuner picked here.
_lookup_memo: dict = {}
_tuned_here: dict = {}


def clear_memo() -> None:
    """Forget what this process resolved or tuned (the next lookup reads the stored file again)."""
    _lookup_memo.clear()
    _tuned_here.clear()


def cuda_device_index(device) -> int:
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
    dev = cuda_device_index(device)
    if path is not None:
        stored = stored_choice(V, dtype, device_info(dev)[0], path=path)
    else:
        stored = _stored_on(dev, V, dtype)
    return stored or _tuned_here.get((dev, v_bucket(V), dtype))


def tuned_at_first_use(V: int, dtype: torch.dtype = torch.float32, *, device=None):
    """The tile config this process's autotuner picked for rows of length V, where no stored
    choice applies on this GPU (a config that another run may pick differently); None where one
    is stored, nothing was tuned yet, or under the interpreter."""
    if INTERPRET:
        return None
    dev = cuda_device_index(device)
    if _stored_on(dev, V, dtype) is not None:
        return None
    return _tuned_here.get((dev, v_bucket(V), dtype))


def _stored_on(dev: int, V: int, dtype: torch.dtype):
    """stored_choice for GPU `dev`, read once per (bucket, dtype) and file generation."""
    key = (dev, v_bucket(V), dtype, generation)
    if key not in _lookup_memo:
        _lookup_memo[key] = stored_choice(V, dtype, device_info(dev)[0])
    return _lookup_memo[key]


def record_tuned(dev: int, V: int, dtype: torch.dtype) -> None:
    """Remember the config tile_autotuned just picked for rows of length V in `dtype` on `dev`:
    the choice of V's bucket for the rest of this process."""
    _tuned_here[(dev, v_bucket(V), dtype)] = config_dict(tile_autotuned.best_config)


def forget_tuned_here(dev: int) -> None:
    """Drop what this process tuned on `dev`: a new stored choice supersedes it."""
    for key in [k for k in _tuned_here if k[0] == dev]:
        del _tuned_here[key]
