"""Tune the Triton softmax tile kernel once on this GPU and store the choice in the repo.

    python -m kernels.autotune                       # TUNE_SHAPES, every dtype, kernels/triton_autotune.json
    python -m kernels.autotune --shapes 64x600 4096x600 --dtypes float32 bfloat16 --path /tmp/t.json

Later runs launch the stored config without benchmarking while its fingerprint holds
(kernels/triton_store.py).
"""

import argparse
import json
import sys

import torch

from .checks import torch_dtype
from .launch import device_info
from .spec import DTYPE_NAMES
from .triton_dispatch import INTERPRET
from .triton_launch import PATH_TABLE
from .triton_store import (
    TUNE_SHAPES,
    choice_key,
    config_dict,
    cuda_device_index,
    fingerprint,
    forget_tuned_here,
    stored_path,
    tile_autotuned,
    write_stored,
)


def _shape(text: str):
    b, v = text.lower().split("x")
    return int(b), int(v)


def run_autotune(shapes=TUNE_SHAPES, *, dtypes=(torch.float32,), path=None, device="cuda", seed=0):
    """Autotune the tile kernel on `shapes` with the GPU's timer and store the choices at `path`.

    Shapes whose V share a bucket share one choice. Every config is timed on every shape; the
    choice for a bucket is the config with the smallest mean slowdown against each shape's own
    best, so no single shape decides alone. Returns the stored record.
    """
    if INTERPRET or not torch.cuda.is_available():
        raise RuntimeError("run_autotune needs a CUDA GPU (and TRITON_INTERPRET unset)")
    dev = cuda_device_index(device)
    name = device_info(dev)[0]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    per_v: dict = {}
    for dtype in dtypes:
        for B, V in shapes:
            x = (torch.randn(B, V, generator=gen) * 3).to(device=f"cuda:{dev}", dtype=dtype)
            y = torch.empty_like(x)
            tile_autotuned.cache.clear()
            PATH_TABLE["tile"].bind(x, y, {"config": None}, dev=dev).autotune()
            timings = {
                json.dumps(config_dict(c), sort_keys=True): float(t[0] if isinstance(t, (list, tuple)) else t)
                for c, t in tile_autotuned.configs_timings.items()
            }
            per_v.setdefault(choice_key(V, dtype), []).append(
                {"shape": [B, V], "timings_ms": timings, "best": config_dict(tile_autotuned.best_config)}
            )
    choices = {}
    for key, runs in per_v.items():
        names = list(runs[0]["timings_ms"])
        score = {n: sum(r["timings_ms"][n] / min(r["timings_ms"].values()) for r in runs) / len(runs) for n in names}
        best = min(names, key=score.get)
        choices[key] = {**json.loads(best), "mean_slowdown": score[best], "runs": runs}
    tile_autotuned.cache.clear()
    out_path = write_stored(choices, name, path=path)
    forget_tuned_here(dev)
    return {"path": str(out_path), "gpu": name, "fingerprint": fingerprint(name), "choices": choices}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.autotune", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=_shape,
        default=list(TUNE_SHAPES),
        help="BxV shapes to tune on (default: %(default)s)",
    )
    parser.add_argument("--dtypes", nargs="+", choices=DTYPE_NAMES, default=list(DTYPE_NAMES))
    parser.add_argument("--path", default=str(stored_path()), help="file to store the choices in")
    args = parser.parse_args(argv)

    if INTERPRET or not torch.cuda.is_available():
        print("kernels.autotune: needs a CUDA GPU with TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    record = run_autotune(args.shapes, dtypes=[torch_dtype(d) for d in args.dtypes], path=args.path)
    print(f"GPU {record['gpu']}  fingerprint {record['fingerprint']}  -> {record['path']}")
    for key, choice in sorted(record["choices"].items()):
        print(
            f"  bucket|dtype {key}: BLOCK={choice['BLOCK']} num_warps={choice['num_warps']} "
            f"(mean slowdown vs per-shape best {choice['mean_slowdown']:.3f})"
        )
        for run in choice["runs"]:
            times = run["timings_ms"]
            best = min(times.values())
            print(
                f"    shape {run['shape']}: best {best * 1e3:.1f} us, this config "
                f"{times[_key(choice)] * 1e3:.1f} us, autotuner's pick at this shape {run['best']}"
            )
    return 0


def _key(choice) -> str:
    return json.dumps({k: choice[k] for k in ("BLOCK", "num_warps", "num_stages")}, sort_keys=True)


if __name__ == "__main__":
    sys.exit(main())
