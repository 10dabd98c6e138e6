"""Tune the Triton softmax tile kernel once on this GPU and store the choice in the repo.

    python -m kernels.autotune                       # TUNE_SHAPES, every dtype, kernels/triton_autotune.json
    python -m kernels.autotune --shapes 64x600 4096x600 --dtypes float32 bfloat16 --path /tmp/t.json

Later runs of `kernels.softmax_triton.softmax` read the file and launch the stored config
without benchmarking, as long as the kernel source, the config list and the GPU name still
match the fingerprint the choice was stored under.
"""

import argparse
import sys

import torch

from .checks import torch_dtype
from .spec import DTYPE_NAMES


def _shape(text: str):
    b, v = text.lower().split("x")
    return int(b), int(v)


def main(argv=None) -> int:
    from . import softmax_triton as st

    parser = argparse.ArgumentParser(prog="python -m kernels.autotune", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=_shape,
        default=list(st.TUNE_SHAPES),
        help="BxV shapes to tune on (default: %(default)s)",
    )
    parser.add_argument("--dtypes", nargs="+", choices=DTYPE_NAMES, default=list(DTYPE_NAMES))
    parser.add_argument("--path", default=str(st.stored_path()), help="file to store the choices in")
    args = parser.parse_args(argv)

    if st.INTERPRET or not torch.cuda.is_available():
        print("kernels.autotune: needs a CUDA GPU with TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    record = st.run_autotune(args.shapes, dtypes=[torch_dtype(d) for d in args.dtypes], path=args.path)
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
    import json

    return json.dumps({k: choice[k] for k in ("BLOCK", "num_warps", "num_stages")}, sort_keys=True)


if __name__ == "__main__":
    sys.exit(main())
