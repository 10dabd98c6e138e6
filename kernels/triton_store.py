"""The stored autotune choice of the Triton tile kernel (kernels/triton_autotune.json).

Each stored choice sits under a fingerprint: a hash of the tile kernel's source, the config
list and the GPU name, so editing the kernel or the configs, or moving to another GPU, makes
the wrapper ignore it and autotune again on first use (standard `@triton.autotune` behaviour).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path

import torch
import triton

STORED_PATH = Path(__file__).with_name("triton_autotune.json")
STORED_FORMAT = 1
# Fields of an entry whose choices were carried over, unmeasured, from an earlier tile kernel
# source (its sha256 and why): the next write_stored for that fingerprint removes them.
CARRIED_OVER_FIELDS = ("choices_measured_with_kernel_source_sha256", "note")

# Bumped by every write, so memos of what the file said know they are stale.
generation = 0


def config_dict(cfg) -> dict:
    """A triton.Config as the plain dict stored on disk and returned by `autotune_picked`."""
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def source_hash(kernel) -> str:
    """sha256 of a jitted kernel's Python source (what `@triton.jit` compiles)."""
    return hashlib.sha256(inspect.getsource(getattr(kernel, "fn", kernel)).encode()).hexdigest()


def configs_hash(configs) -> str:
    text = json.dumps(
        [{**config_dict(c), "num_ctas": c.num_ctas, "maxnreg": c.maxnreg} for c in configs], sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(gpu_name: str, *, source_hash: str, config_hash: str) -> str:
    """The key a stored choice lives under; any change of kernel, configs or GPU changes it."""
    return hashlib.sha256("|".join([source_hash, config_hash, gpu_name]).encode()).hexdigest()[:32]


def choice_key(V: int, dtype: torch.dtype) -> str:
    return f"{int(V)}|{str(dtype).removeprefix('torch.')}"


def read_stored(path=None) -> dict:
    """The stored file as a dict ({} when it does not exist or has another format)."""
    path = Path(path) if path is not None else STORED_PATH
    if not path.exists():
        return {}
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != STORED_FORMAT:
        return {}
    return data


def stored_choice(V: int, dtype: torch.dtype, gpu_name: str, *, source_hash: str, config_hash: str, path=None):
    """The stored config for (V, dtype) on this GPU, or None when absent or stale."""
    entry = (
        read_stored(path)
        .get("entries", {})
        .get(fingerprint(gpu_name, source_hash=source_hash, config_hash=config_hash))
    )
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


def write_stored(choices: dict, gpu_name: str, *, source_hash: str, config_hash: str, path=None, extra=None) -> Path:
    """Merge `choices` ({choice_key: config dict}) into the file under this fingerprint.

    Entries under other fingerprints (other GPUs) are kept; stale ones for this GPU are dropped.
    """
    global generation
    path = Path(path) if path is not None else STORED_PATH
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
