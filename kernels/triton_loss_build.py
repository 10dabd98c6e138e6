"""Build the softmax-backward and cross-entropy Triton kernels ahead of time for sm_90 and report
their resources (registers, spills, shared memory), as kernels.triton_build does for the forward.

    python -m kernels.triton_loss_build           # one JSON line: a record per build
    python -m kernels.triton_loss_build --quick   # the largest configuration of each kernel, fp32

TRITON_INTERPRET must be unset (the compiled kernels are needed): tests run it as a subprocess.
"""

from __future__ import annotations

import json
import sys

from .checks import torch_dtype
from .triton_build import build

# Parameter name -> compile type; "T" is the storage dtype of the build.
_TYPES = {
    "DY": "*T", "Y": "*T", "DX": "*T", "X": "*T", "G": "*T", "OUT": "*T", "WS": "*i64", "CNT": "*i64",
    "T": "*i64", "W": "*T", "LOSS": "*fp32", "LSE": "*fp32", "PREP": "*fp32", "BAD": "*i64", "GO": "*T",
    "eps": "fp32", "inv_v": "fp32", "SCALE": "fp32",
}  # fmt: skip


def loss_signature(kernel, dtype: str, overrides: dict | None = None) -> dict:
    types = {**_TYPES, **(overrides or {})}
    return {
        p.name: "constexpr" if p.is_constexpr else types.get(p.name, "i32").replace("T", dtype) for p in kernel.params
    }


QUICK = {"bwd-row fp32", "bwd-split fp32", "ce-row fp32 weighted smoothed", "ce-split fp32 weighted smoothed",
         "ce-scale fp32", "ce-prep", "ce-reduce"}  # fmt: skip


def build_all(quick: bool = False) -> list[dict]:
    """Each kernel as the wrappers launch it at V = 600 (row, small), 8192 (the row paths'
    largest) and 262144 (split), in fp32 and bf16, with and without weights and smoothing."""
    from . import triton_backward as tb
    from . import triton_cross_entropy as tce
    from . import triton_loss_kernels as K

    if tb.INTERPRET:
        raise RuntimeError("kernels.triton_loss_build needs the compiled kernels: unset TRITON_INTERPRET")
    rows = []

    def one(name, kernel, dtype, constexprs, num_warps, sig):
        # --quick: the QUICK kernels, the row kernels at their largest row only.
        small_row = name.startswith(("bwd-row", "ce-row")) and constexprs["BLOCK"] < 8192
        if quick and (name not in QUICK or small_row):
            return None
        return build(name, kernel, dtype, constexprs, num_warps, sig=sig)

    for dtype in ("fp32", "bf16"):  # Triton's type names are the suite's dtype ids
        tdtype = torch_dtype(dtype)
        for V in (600, 8192):
            p = tb.launch_params("row", V, tdtype)
            sig = loss_signature(K.softmax_backward_row_kernel, dtype)
            rows.append(one(f"bwd-row {dtype}", K.softmax_backward_row_kernel, dtype, {"BLOCK": p["BLOCK"]},
                              p["num_warps"], sig=sig))  # fmt: skip
        p = tb.launch_params("split", 262144, tdtype)
        sp = tb.split_params(262144, p)
        del sp["P"]
        sig = loss_signature(K.softmax_backward_split_kernel, dtype)
        rows.append(one(f"bwd-split {dtype}", K.softmax_backward_split_kernel, dtype, sp, p["num_warps"], sig=sig))
        for weight, smoothing in ((False, False), (True, True)):
            flags = {"HAS_WEIGHT": weight, "HAS_SMOOTHING": smoothing}
            tag = f"{dtype}{' weighted smoothed' if weight else ''}"
            for V in (600, 8192):
                p = tce.launch_params("row", V, tdtype)
                sig = loss_signature(K.cross_entropy_row_kernel, dtype)
                rows.append(one(f"ce-row {tag}", K.cross_entropy_row_kernel, dtype, {"BLOCK": p["BLOCK"], **flags},
                                  p["num_warps"], sig=sig))  # fmt: skip
            p = tce.launch_params("split", 262144, tdtype)
            sp = tb.split_params(262144, p)
            del sp["P"]
            sig = loss_signature(K.cross_entropy_split_kernel, dtype)
            rows.append(one(f"ce-split {tag}", K.cross_entropy_split_kernel, dtype, {**sp, **flags},
                              p["num_warps"], sig=sig))  # fmt: skip
        for in_place in (True, False):
            sig = loss_signature(K.cross_entropy_scale_kernel, dtype)
            rows.append(one(f"ce-scale {dtype}", K.cross_entropy_scale_kernel, dtype,
                              {"BLOCK": 4096, "IN_PLACE": in_place}, 4, sig=sig))  # fmt: skip
    for mean in (True, False):
        sig = loss_signature(K.cross_entropy_prep_kernel, "fp32")
        rows.append(one("ce-prep", K.cross_entropy_prep_kernel, "fp32",
                          {"BLOCK": 1024, "HAS_WEIGHT": True, "MEAN": mean}, 4, sig=sig))  # fmt: skip
        sig = loss_signature(K.cross_entropy_reduce_kernel, "bf16", {"OUT": "*bf16"})
        rows.append(one("ce-reduce", K.cross_entropy_reduce_kernel, "bf16", {"BLOCK": 1024, "MEAN": mean}, 4,
                          sig=sig))  # fmt: skip
    return [r for r in rows if r is not None]


def main(argv=None) -> int:
    print(json.dumps(build_all(quick="--quick" in (sys.argv[1:] if argv is None else argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
