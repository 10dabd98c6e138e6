"""Build every Triton kernel configuration ahead of time for sm_90 and report its resources.

    python -m kernels.triton_build                      # the softmax kernels: one JSON line, a record per build
    python -m kernels.triton_build --training           # the softmax-backward and cross-entropy kernels
    python -m kernels.triton_build --training --quick   # their largest configuration of each kernel, fp32

No GPU is needed: Triton compiles for the H200's target, and the cubin is read back with the
`cuobjdump` and `ptxas` that Triton ships. Each record gives registers, shared memory, stack,
local memory, spill bytes and whether the PTX has vector loads and stores. The compiled (not
interpreted) kernels are needed, so TRITON_INTERPRET must be unset in this process: the tests
run it as a subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

from .checks import torch_dtype
from .spec import DTYPE_IDS, ITEMSIZE

TARGET_CAPABILITY = 90
# A row whose held buffer is allocated in three parts (kernels.triton_dispatch.held_block: 8 + 4
# + 1 tiles of 4096 bf16 elements for the softmax's launch, 16 + 8 + 1 of 2048 for the
# cross-entropy's), built besides the held paths' bounds.
HELD_PARTS_V = 50257


# The size operand of a cp.async copy from global to shared memory, in the PTX.
CP_ASYNC_SIZE = re.compile(r"cp\.async\.\w+\.shared\.global[^;]*?,\s*(0x[0-9a-f]+|\d+)\s*[,;]")


def compile_sm90(kernel, *, sig: dict, constexprs: dict, aligned: tuple, options: dict, ast_source=None):
    """Triton's compiled kernel of `kernel` for sm_90 (build's arguments; `options` as
    triton.compile takes them)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    src = (ast_source or ASTSource)(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", TARGET_CAPABILITY, 32), options=options)


def source_class(kernel):
    """The source class triton.compile takes for `kernel`: Gluon's for a Gluon kernel, else None
    (Triton's ASTSource)."""
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    return GluonASTSource if isinstance(kernel, GluonJITFunction) else None


def compile_path(entry, p: dict, V: int, dtype_name: str):
    """Triton's compiled kernel of one entry of kernels.triton_launch.TABLES, specialised as
    build_path specialises it (for a probe that reads its SASS)."""
    spec = entry.aot(p, V, DTYPE_IDS[dtype_name], ITEMSIZE[dtype_name])
    return compile_sm90(
        entry.kernel,
        sig=spec["signature"],
        constexprs=spec["constexprs"],
        aligned=spec["aligned"],
        options=dict(spec["options"]),
        ast_source=source_class(entry.kernel),
    )


def build(
    name: str,
    kernel,
    dtype: str,
    constexprs: dict,
    num_warps: int,
    num_stages: int = 3,
    *,
    sig: dict,
    aligned: tuple,
    maxnreg: int | None = None,
    ast_source=None,
) -> dict:
    """Compile `kernel` for sm_90 with the compile signature `sig` and `constexprs`, and report
    its resources; `maxnreg` is the register cap handed to ptxas, `aligned` the arguments
    (by position) divisible by 16, as Triton's launcher specialises them (pointers to torch
    allocations, strides and sizes that are multiples of 16). `ast_source`: the source class
    for kernels of another front end (Triton's ASTSource by default)."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas

    options = {"num_warps": num_warps, "num_stages": num_stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    c = compile_sm90(kernel, sig=sig, constexprs=constexprs, aligned=aligned, options=options, ast_source=ast_source)
    with tempfile.TemporaryDirectory() as tmp:
        cubin, ptx = Path(tmp) / "kernel.cubin", Path(tmp) / "kernel.ptx"
        cubin.write_bytes(c.asm["cubin"])
        ptx.write_text(c.asm["ptx"])
        usage = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "--dump-resource-usage", cubin], capture_output=True, text=True, check=True
        ).stdout
        fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
        # The ptxas Triton itself picks for sm_90 (3.9 uses its newer "ptxas-blackwell").
        arch = re.search(r"^\.target\s+(\w+)", c.asm["ptx"], re.M).group(1)  # sm_90a
        proc = subprocess.run(
            [get_ptxas(TARGET_CAPABILITY).path, "-v", f"--gpu-name={arch}", ptx, "-o", Path(tmp) / "kernel.o"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas failed for {name}: {proc.stderr}")
        spill = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", proc.stderr)]
        # Where a spill is touched, read from the SASS of a build that spills (listing the others,
        # unrolled kernels especially, takes long and finds no local access).
        loop_local = loop_local_accesses(sass_listing(cubin)) if sum(spill) or int(fields["LOCAL"]) else 0
    return {
        "name": name,
        "num_warps": num_warps,
        "maxnreg": maxnreg,
        **constexprs,
        "regs": int(fields["REG"]),
        "stack": int(fields["STACK"]),
        "local": int(fields["LOCAL"]),
        "spill_bytes": sum(spill),
        "loop_local": loop_local,
        "shared": int(c.metadata.shared),
        "vector_loads": bool(re.search(r"ld\.global(\.\w+)*\.v[248]", c.asm["ptx"])),
        "vector_stores": bool(re.search(r"st\.global(\.\w+)*\.v[248]", c.asm["ptx"])),
        # The widest cp.async copy from global to shared memory (the held kernel's loads), in bytes.
        "cp_async_bytes": max((int(n, 0) for n in CP_ASYNC_SIZE.findall(c.asm["ptx"])), default=0),
        "tag_read_first": tag_read_first(c.asm["ptx"]),
    }


# One SASS instruction a line (cuobjdump -sass): its address, then the opcode with its suffixes
# after any predicate, then the operands.
SASS_INSTRUCTION = re.compile(
    r"^\s+/\*([0-9a-f]{4,5})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)(.*)$", re.M
)
BRANCH_TARGET = re.compile(r"BRA\s+(?:`\()?0x([0-9a-f]+)")


def sass_listing(cubin: str | Path) -> str:
    """cuobjdump's -sass listing of the cubin file at `cubin`."""
    from triton import knobs

    return subprocess.run(
        [knobs.nvidia.cuobjdump.path, "-sass", cubin], capture_output=True, text=True, check=True
    ).stdout


def sass_instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each instruction of a cuobjdump -sass listing."""
    return [(int(m.group(1), 16), m.group(2), m.group(3)) for m in SASS_INSTRUCTION.finditer(sass)]


def innermost_loops(lines: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) indices into sass_instructions' `lines` of each loop that holds no other, a
    loop being the span of a branch back: a tile loop, where a kernel spends its time."""
    at = {address: i for i, (address, _, _) in enumerate(lines)}
    spans = []
    for i, (address, op, operands) in enumerate(lines):
        target = BRANCH_TARGET.search(op + operands)
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in at:
            spans.append((at[int(target.group(1), 16)], i))
    return [(a, b) for a, b in spans if not any(a <= c < d <= b and (c, d) != (a, b) for c, d in spans)]


def loop_local_accesses(sass: str) -> int:
    """Local-memory instructions (LDL, STL: a spill read or written) inside innermost loops."""
    lines = sass_instructions(sass)
    return sum(op.startswith(("LDL", "STL")) for a, b in innermost_loops(lines) for _, op, _ in lines[a : b + 1])


def tag_read_first(ptx: str) -> bool | None:
    """Whether a split kernel's first volatile read (its launch tag: kernels/triton_kernels.py,
    _launch_tag) comes before its first barrier, so that the read overlaps the chunk's loads
    instead of waiting behind a reduction (1.07-1.08x at (4096, 128256), reports/profiles.md);
    None for a kernel without volatile reads (no meetings)."""
    read = ptx.find("ld.volatile.global")
    if read < 0:
        return None
    barrier = ptx.find("bar.sync")
    return barrier < 0 or read < barrier


def resident_programs(record: dict) -> int:
    """How many programs of a build an sm_90 SM runs at once, as its registers and warps allow
    (kernels.triton_dispatch.SM_REGISTERS, SM_WARPS)."""
    from .triton_dispatch import SM_REGISTERS, SM_WARPS

    per_warp = -(-record["regs"] // 8) * 8 * 32
    return min(SM_REGISTERS // (per_warp * record["num_warps"]), SM_WARPS // record["num_warps"])


def spill_budget(record: dict) -> int:
    """Bytes of local memory a thread of a build may spill into: CAPPED_SPILL_BYTES under a
    register cap chosen by the benchmark, none without one."""
    from .triton_dispatch import CAPPED_SPILL_BYTES

    return CAPPED_SPILL_BYTES if record.get("maxnreg") else 0


def spill_problem(record: dict) -> str | None:
    """Why a build's spill is not allowed, or None: past spill_budget bytes a thread, or read or
    written inside an innermost loop (a local access every tile, where one outside the tile
    loops costs a few a row)."""
    budget = spill_budget(record)
    if spilled_bytes(record) > budget:
        return f"spills past {budget} bytes a thread"
    if record["loop_local"]:
        return f"{record['loop_local']} local-memory accesses inside its innermost loops"
    return None


def spilled_bytes(record: dict) -> int:
    """Bytes of local memory a thread of the build spills into: its stack frame where ptxas
    spills (the driver's local size for the kernel on a GPU), plus any local arrays. A stack
    frame with no spill in it (8 bytes in the cross-entropy row kernel at V = 32768 under
    Triton 3.9, none under 3.6) is reported, not counted."""
    return (record["stack"] if record["spill_bytes"] else 0) + record["local"]


def build_path(name: str, entry, p: dict, V: int, dtype_name: str) -> dict:
    """Build one entry of kernels.triton_launch.TABLES as its launches specialise it for
    contiguous, 16-byte-aligned rows of length V in `dtype_name` (a suite dtype name), all from
    the table: the record `name`."""
    dtype = DTYPE_IDS[dtype_name]  # Triton's type names are the suite's ids
    spec = entry.aot(p, V, dtype, ITEMSIZE[dtype_name])
    options = dict(spec["options"])
    record = build(
        name,
        entry.kernel,
        dtype,
        spec["constexprs"],
        options.pop("num_warps"),
        options.pop("num_stages", 3),
        sig=spec["signature"],
        maxnreg=options.pop("maxnreg", None),
        aligned=spec["aligned"],
        ast_source=source_class(entry.kernel),
    )
    if p.get("programs_per_sm"):  # stream's grid: programs beyond what fits an SM run as a second wave
        record["programs_per_sm"] = p["programs_per_sm"]
    return record


def _compiled(module):
    if module.INTERPRET:
        raise RuntimeError("kernels.triton_build needs the compiled kernels: unset TRITON_INTERPRET")
    from .triton_launch import TABLES

    return TABLES


def build_all() -> list[dict]:
    """Every autotune config of the tile kernel, and the row, rows, split, held, stream and
    held_split kernels as the wrapper launches them at typical V, in fp32 and bf16 (held, stream
    and held_split: bf16 only)."""
    from . import softmax_triton as st
    from . import triton_store as store
    from .triton_dispatch import DISPATCH_BOUNDARIES

    table = _compiled(st)["softmax"]

    def one(path, p, V, name):
        return build_path(f"{path} {DTYPE_IDS[name]}", table[path], p, V, name)

    rows = [one("tile", {"config": store.config_dict(cfg)}, 4096, "float32") for cfg in store.CONFIGS]
    for name in ("float32", "bfloat16"):
        tdtype = torch_dtype(name)
        for V in (4096, 8192, 16384, DISPATCH_BOUNDARIES["row_max_v"]):  # to the longest row it holds
            rows.append(one("row", st.launch_params("row", V, tdtype), V, name))
        for V in (600, 1100):  # a row cut 512 + 128 and 1024 + 128, one warp
            rows.append(one("rows", st.launch_params("rows", V, tdtype), V, name))
        # split for a full batch at typical V, and for one row of 262144 on an H200 (the
        # smallest chunks the batch rule picks). Chunks are cut on 16-byte groups whatever V is:
        # odd V gets the same vector accesses as even V (Y_ALIGN = ALIGN for contiguous rows).
        for V, B in ((50257, None), (128256, None), (262144, 1)):
            rows.append(
                one("split", st.launch_params("split", V, tdtype, B=B, sms=None if B is None else 132), V, name)
            )
        if name != "float32":  # held, stream and held_split take 16-bit rows only
            for V in (DISPATCH_BOUNDARIES["held_min_v"] + 1, DISPATCH_BOUNDARIES["held_max_v"], HELD_PARTS_V):
                rows.append(one("held", st.launch_params("held", V, tdtype), V, name))
            rows.append(one("stream", st.launch_params("stream", 128256, tdtype), 128256, name))
            # held_split from the first row past stream's, at a full batch and one row of 262144
            for V, B in ((DISPATCH_BOUNDARIES["stream_max_v"] + 1, None), (262144, None), (262144, 1)):
                p = st.launch_params("held_split", V, tdtype, B=B, sms=None if B is None else 132)
                rows.append(one("held_split", p, V, name))
    return rows


# -- the training kernels -------------------------------------------------------------------------

QUICK = {"bwd-row fp32", "bwd-split fp32", "bwd-split fp32 odd V", "bwd-stream fp32", "bwd-reread fp32",
         "bwd-held_split bf16", "ce-row fp32", "ce-row fp32 weighted smoothed", "ce-split fp32", "ce-split bf16",
         "ce-split fp32 odd V",
         "ce-split fp32 weighted smoothed", "ce-split fp32 weighted smoothed odd V", "ce-split fp16 weighted smoothed",
         "ce-split fp32 weighted smoothed out of step", "ce-split fp16 weighted smoothed out of step",
         "ce-held bf16", "ce-held_split bf16", "ce-held_split bf16 weighted smoothed",
         "ce-stream fp32 weighted smoothed", "ce-stream fp32 weighted smoothed odd V",
         "ce-stream bf16 weighted smoothed odd V", "ce-stream fp32 smoothed odd V", "ce-stream bf16 smoothed odd V",
         "ce-stream fp32 weighted odd V", "ce-split fp32 smoothed odd V", "bwd-stream bf16 odd V", "ce-scale fp32",
         "ce-prep",
         "ce-reduce"}  # fmt: skip


def build_training(quick: bool = False) -> list[dict]:
    """The softmax-backward and cross-entropy kernels as the wrappers launch them at V = 600 (row,
    small), the row paths' largest (8192; 32768 for the cross-entropy's plain rows and the
    backward's reread; 32000 for its stream), the cross-entropy's held bounds (16-bit) and
    262144 (split; 262145 for rows that are not 16-byte aligned, "odd V"; the splits also cut
    element by element, "out of step"), in fp32, bf16 and fp16, with and without weights and
    smoothing (the stream and split also with either alone); --quick:
    the QUICK records, the row kernels at their largest V only."""
    from . import triton_backward as tb
    from .triton_cross_entropy import DISPATCH_BOUNDARIES as ce_bounds

    tables = _compiled(tb)
    # Each row path at the largest V its dispatch sends it: a boundary moved past what a path
    # holds shows here as a spill.
    bounds = tb.DISPATCH_BOUNDARIES
    row_max, plain_max = bounds["row_max_v"], ce_bounds["plain_row_max_v"]
    builds = []  # (record name, op, path, V, dtype name, flags)
    for name in ("float32", "bfloat16", "float16"):
        dtype = DTYPE_IDS[name]
        builds += [(f"bwd-row {dtype}", "softmax_backward", "row", V, name, {}) for V in (600, row_max)]
        builds.append((f"bwd-split {dtype}", "softmax_backward", "split", 262144, name, {}))
        builds.append((f"bwd-split {dtype} odd V", "softmax_backward", "split", 262145, name, {}))
        builds.append((f"bwd-split {dtype} out of step", "softmax_backward", "split", 262144, name, {}))
        builds.append((f"bwd-stream {dtype}", "softmax_backward", "stream", 32000, name, {}))
        # ... and at the longest 16-bit rows it takes, one element short: rows not 16-byte aligned,
        # whose loads are scalar and take more registers a thread
        bwd_odd = bounds["stream_max_v"] - 1
        builds.append((f"bwd-stream {dtype} odd V", "softmax_backward", "stream", bwd_odd, name, {}))
        builds.append((f"bwd-reread {dtype}", "softmax_backward", "reread", bounds["reread_max_v"], name, {}))
        # chunks of y and dy held, past stream's rows: 4 warps under 128, 8 under 80 where 16-bit
        # chunks reach 16384 elements (launch_params)
        builds += [
            (f"bwd-held_split {dtype}", "softmax_backward", "held_split", V, name, {})
            for V in (bounds["stream_max_v"] + 1, 262144)
        ]
        for both in (False, True):
            flags = {"HAS_WEIGHT": both, "HAS_SMOOTHING": both}
            tag = f"{dtype}{' weighted smoothed' if both else ''}"
            # Plain rows (no weights, no smoothing) stay on the row path up to V = 32768.
            row_vs = (600, row_max) if both else (600, row_max, plain_max)
            builds += [(f"ce-row {tag}", "cross_entropy", "row", V, name, flags) for V in row_vs]
            builds += [
                (f"ce-split {tag}{' odd V' * (V % 2)}", "cross_entropy", "split", V, name, flags)
                for V in (262144, 262145)
            ]
            builds.append((f"ce-split {tag} out of step", "cross_entropy", "split", 262144, name, flags))
            # stream (weighted or smoothed rows, float32 ones to float32_stream_max_v; in place, rows
            # that would split)
            builds += [(f"ce-stream {tag}", "cross_entropy", "stream", V, name, flags) for V in (32768, 131072)]
            # ... and at GPT-2's vocabulary, whose rows are not 16-byte aligned
            builds.append((f"ce-stream {tag} odd V", "cross_entropy", "stream", 50257, name, flags))
            if both:  # and its held split with weights and smoothing (not dispatched)
                builds += [
                    (f"ce-held_split {tag}", "cross_entropy", "held_split", V, name, flags) for V in (65536, 262144)
                ]
        # class weights alone, and smoothing alone, are builds of their own (the stream spills most
        # with smoothing alone: kernels.triton_dispatch.CAPPED_SPILL_BYTES)
        for tag, weighted in (("weighted", True), ("smoothed", False)):
            flags = {"HAS_WEIGHT": weighted, "HAS_SMOOTHING": not weighted}
            builds += [
                (f"ce-stream {dtype} {tag}{' odd V' * (V % 2)}", "cross_entropy", "stream", V, name, flags)
                for V in (131072, 50257)
            ]
            builds.append((f"ce-split {dtype} {tag} odd V", "cross_entropy", "split", 262145, name, flags))
        if name != "float32":  # 16-bit plain rows held in shared memory, at the held path's bounds
            held = (ce_bounds["held_min_v"] + 1, ce_bounds["held_max_v"], HELD_PARTS_V)
            builds += [(f"ce-held {dtype}", "cross_entropy", "held", V, name, {}) for V in held]
        # plain rows split with each chunk held: 16-bit past held's rows, float32 past the row path's
        first = ce_bounds["held_max_v" if name != "float32" else "plain_row_max_v"] + 1
        builds += [(f"ce-held_split {dtype}", "cross_entropy", "held_split", V, name, {}) for V in (first, 262144)]
        builds += [
            (f"ce-scale {dtype}", "cross_entropy", "scale", 262144, name, {"IN_PLACE": i}) for i in (True, False)
        ]
    for mean in (True, False):
        builds.append(("ce-prep", "cross_entropy", "prep", 262144, "float32", {"HAS_WEIGHT": True, "MEAN": mean}))
        builds.append(("ce-reduce", "cross_entropy", "reduce", 262144, "bfloat16", {"MEAN": mean}))

    def params(record, op, path, V, name, flags):
        # As the wrappers choose them (kernels.triton_launch.training_cut): for contiguous rows of
        # an odd V, which start anywhere in their 16-byte groups, the split cuts them on groups;
        # "out of step" (input and output not in step within 16 bytes), element by element.
        plain = not (flags.get("HAS_WEIGHT") or flags.get("HAS_SMOOTHING"))
        a = 16 // ITEMSIZE[name]
        if record.endswith("out of step"):
            cut, rows = {"ALIGN": 1, "head": 0}, "elements"
        else:
            cut = {"ALIGN": a, "head": a - 1} if V % a else {}
            rows = "groups" if cut else "aligned"
        return {**tb.launch_params(path, V, torch_dtype(name), op=op, plain=plain, rows=rows), **cut, **flags}

    return [
        build_path(record, tables[op][path], params(record, op, path, V, name, flags), V, name)
        for record, op, path, V, name, flags in builds
        if not quick or (record in QUICK and not (path == "row" and V < row_max))
    ]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(build_training(quick="--quick" in args) if "--training" in args else build_all()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
