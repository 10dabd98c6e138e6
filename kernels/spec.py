"""What the suite knows about each kernel of its three operations (the softmax, the softmax
backward, the cross-entropy), in one entry per kernel: the specification the registry
(`kernels.registry`), every registry-wide test, the benchmarks and the report harness
(tests/suite: manifest, gate, figures) are derived from.

This module imports nothing but the standard library, so the harness reads it without
importing torch. A new kernel is one `KernelSpec(...)` in `SPECS` below (README, "Adding a
kernel"); one kept outside this tree is added through `kernels.registry.EXTRA_KERNELS_ENV`.

Also here, because the harness needs them without torch: the dtype names, the lab's shapes and
the bytes a softmax moves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# -- dtypes: names as the manifest writes them, short ids as test ids use them ---------------------

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_IDS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_name(dtype) -> str:
    """ "float32" for "float32", "fp32" or torch.float32 (anything whose str is torch.<name>)."""
    text = str(dtype).removeprefix("torch.")
    for name, short in DTYPE_IDS.items():
        if text in (name, short):
            return name
    raise TypeError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_NAMES)}")


def itemsize(dtype) -> int:
    """Bytes per element of a dtype name, id or torch dtype."""
    return ITEMSIZE[dtype_name(dtype)]


# -- shapes and bytes ------------------------------------------------------------------------------

# The lab's grid of (B, V): the autotune shapes, the lab benchmark grid and the lab gates.
LAB_SHAPES = ((64, 600), (512, 600), (4096, 600))
# The lab's headline point (B, V, dtype name): the manifest's per-kernel figures and the roofline.
LAB_POINT = (512, 600, "float32")


def matrix_bytes(B: int, V: int, dtype, passes: int = 2) -> int:
    """Bytes a softmax moves through device memory when it passes over the (B, V) matrix of
    `dtype` (a name, an id or a torch dtype) `passes` times; the default 2 is one read and one
    write, the least any softmax can move, and passes=1 is the size of the tensor."""
    return passes * int(B) * int(V) * itemsize(dtype)


# -- the specification of one kernel ----------------------------------------------------------------

# The benchmark grids of tests/test_benchmarks.py a kernel is timed on.
GRIDS = ("lab", "sweep", "calls")
BACKENDS = ("cupy", "triton", "torch")
BASELINE = "F_softmax"  # the kernel every speed ratio is relative to

# The operations a kernel may implement, each with the call its `fn` answers.
OPS = {
    "softmax": "fn(x, *, out=None) -> y: softmax over the last axis of a (B, V) tensor",
    "softmax_backward": "fn(dy, y, *, out=None) -> dx = y * (dy - sum(y * dy, -1)) for (B, V) tensors",
    "cross_entropy": "fn(logits, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, "
    'reduction="mean", out=None) -> (loss, lse, grad), F.cross_entropy\'s semantics',
}
BACKWARD_BASELINE = "softmax_backward_data"  # torch._softmax_backward_data
CROSS_ENTROPY_BASELINE = "F_cross_entropy"


@dataclass(frozen=True)
class Path:
    """One dispatch path of a kernel.

    gpu: a (B, V) that the kernel's `plan` sends down this path, in every dtype whose dispatch
        has the path; the cuda coverage matrix and the call-mode tests run the path there.
    cpu: launch parameters for the kernel's `run_path(x, name, **cpu)` under the Triton
        interpreter, scaled down so that the CPU cases' short rows (tens of elements) span
        several tiles, chunks or programs of this path: the path's real loop runs on the CPU.
    dtypes: the dtype names whose dispatch takes this path (None: every dtype of the kernel);
        `run_path` reaches every path in every dtype.
    interpreted: False for a path of an interpretable kernel that the interpreter cannot run (a
        Gluon kernel): the CPU cases check its ahead-of-time build instead, the GPU its outputs.
    options: the keywords of the kernel's `plan` under which it sends `gpu` down this path
        (the cross-entropy's split: plain=False, rows with class weights or label smoothing).
    meets: the programs sharing a row wait for each other at meetings in global memory, so the
        path's time depends on how the GPU schedules them, and with it on the kernels timed
        beside it (reports/profiles.md); the regression gate allows such training cases more
        noise (tests/suite/gate.py, noise_floor).
    """

    name: str
    gpu: tuple[int, int]
    cpu: Mapping = field(default_factory=dict)
    dtypes: tuple[str, ...] | None = None
    interpreted: bool = True
    options: Mapping = field(default_factory=dict)
    meets: bool = False


Ref = str | Callable  # "package.module:attribute", resolved on first use, or the object itself


@dataclass(frozen=True)
class KernelSpec:
    """Every fact the suite holds about one kernel (see README, "Adding a kernel").

    name      the registry key within its op, the benchmark and manifest name
    fn        the op's call (OPS[op]); for the softmax fn(x, *, out=None) -> Tensor
    paths     every dispatch path (Path), in the order the dispatch tries them
    dtypes    dtype names the kernel accepts
    backend   what launches it: "cupy" (CUDA C), "triton" or "torch"
    plan      plan(B, V, dtype) -> the path name a call takes on the GPU (None: the one path)
    run_path  run_path(x, path, *, out=None, **params): one named path, with launch parameters
              (needed by an interpretable kernel of several paths: the CPU cases force each)
    interpretable  runs on CPU tensors under TRITON_INTERPRET=1, so `pytest -m cpu` checks it
    baseline  a reference we measure against, not one of ours (ours must be bit-for-bit
              invariant: a row's bits depend only on its values and V)
    gated     held to the GPU regression gate (a softmax kernel against F.softmax, a training
              op's against its PyTorch eager baseline) and, for the softmax, the speed targets
    lab_contract  the lab contract's manifest section softmax_kernels requires its lab point
    autotuned reports its autotune choice (autotune_picked) in the manifest
    custom_op registered as a torch.library custom operator (kernels/ops.py), so torch.compile
              traces it without a graph break
    grids     the benchmark grids it is timed on (GRIDS)
    bench_max_v   longest row timed outside the lab grid (None: no limit), and why
    lab_gate  (reference kernel, floor): at the lab point its speed must be >= floor x the
              reference's, timed back to back
    passes    times it moves the (B, V) matrix through device memory by design, at rows that
              fit on chip (the roofline places it at its own intensity)
    tolerances  dtype name -> {field: value} replacing fields of the suite's tolerance for that
              dtype (tests/helpers.py Tolerance, e.g. {"k": 2.0}); empty for every kernel of ours
    op        the operation it implements, a key of OPS (default the softmax); the fields from
              grids to autotuned describe softmax benchmarks and stay at their defaults otherwise
    backward  (softmax only) the softmax_backward entry of the same name family its custom
              operator's backward runs (None: the baseline's)
    """

    name: str
    fn: Ref
    paths: tuple[Path, ...]
    dtypes: tuple[str, ...] = ("float32",)
    backend: str = "torch"
    plan: Ref | None = None
    run_path: Ref | None = None
    interpretable: bool = False
    baseline: bool = False
    gated: bool = False
    lab_contract: bool = False
    autotuned: bool = False
    custom_op: bool = False
    grids: tuple[str, ...] = ("calls",)
    bench_max_v: tuple[int, str] | None = None
    lab_gate: tuple[str, float] | None = None
    passes: int = 2
    tolerances: Mapping = field(default_factory=dict)
    op: str = "softmax"
    backward: str | None = None

    def __post_init__(self):
        problems = []
        if self.op not in OPS:
            problems.append(f"op must be one of {tuple(OPS)}")
        elif self.op != "softmax" and (
            self.grids or self.lab_contract or self.lab_gate or self.autotuned or self.custom_op or self.backward
        ):
            problems.append("grids, lab_contract, lab_gate, autotuned, custom_op and backward are softmax facts")
        if not self.name.isidentifier():
            problems.append("name must be an identifier (it appears in test ids and manifest keys)")
        if not self.paths or any(not isinstance(p, Path) for p in self.paths):
            raise ValueError(f"kernel spec {self.name!r}: paths must be one or more Path(...) entries")
        if len({p.name for p in self.paths}) != len(self.paths):
            problems.append("paths must be one or more Path(...) with distinct names")
        if not self.dtypes or any(d not in DTYPE_NAMES for d in self.dtypes):
            problems.append(f"dtypes must be names from {DTYPE_NAMES}")
        if self.backend not in BACKENDS:
            problems.append(f"backend must be one of {BACKENDS}")
        if any(g not in GRIDS for g in self.grids):
            problems.append(f"grids must be names from {GRIDS}")
        if len(self.paths) > 1 and self.plan is None:
            problems.append("a kernel with several paths needs plan(B, V, dtype)")
        if self.interpretable and len(self.paths) > 1 and self.run_path is None:
            problems.append("an interpretable kernel with several paths needs run_path, so the CPU cases reach each")
        if any(p.dtypes is not None and not set(p.dtypes) <= set(self.dtypes) for p in self.paths):
            problems.append("a path's dtypes must be dtypes of the kernel")
        if any(d not in DTYPE_NAMES for d in self.tolerances):
            problems.append(f"tolerances are keyed on dtype names from {DTYPE_NAMES}")
        if problems:
            raise ValueError(f"kernel spec {self.name!r}: " + "; ".join(problems))

    @property
    def path_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.paths)

    def paths_for(self, dtype) -> tuple[str, ...]:
        """The paths the dispatch takes for some input of `dtype` (a name, id or torch dtype)."""
        name = dtype_name(dtype)
        return tuple(p.name for p in self.paths if p.dtypes is None or name in p.dtypes)

    def path(self, name: str) -> Path:
        for p in self.paths:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no path {name!r} ({', '.join(self.path_names)})")


# -- the kernels -------------------------------------------------------------------------------------

_ALL = DTYPE_NAMES
_ROW_SERIAL = (
    32000,
    "it reads each row three times (naive with one thread per row), so a call at long rows takes "
    "far too long for loops of back-to-back calls",
)

SPECS: tuple[KernelSpec, ...] = (
    *(
        KernelSpec(
            name,
            f"kernels.softmax_cuda:softmax_{name}",
            (Path(path, gpu=(5, 100)),),
            backend="cupy",
            lab_contract=True,
            grids=("lab", "calls"),
            bench_max_v=_ROW_SERIAL,
            passes=4,  # three reads (max, sum, normalise) and one write
        )
        for name, path in (("naive", "thread"), ("smem", "block"))
    ),
    KernelSpec(
        "fused",
        "kernels.softmax_cuda:softmax_fused",
        (
            Path("warp", gpu=(5, 100)),
            Path("warpvec", gpu=(5, 129)),
            Path("row", gpu=(5, 1025)),
            Path("cluster", gpu=(5, 16385)),
            Path("split", gpu=(2, 262145), meets=True),
            Path("loop", gpu=(2, 4194305), meets=True),
        ),
        _ALL,
        backend="cupy",
        plan="kernels.cuda_plans:fused_path",
        backward="fused",
        gated=True,
        lab_contract=True,
        custom_op=True,
        grids=GRIDS,
        lab_gate=(BASELINE, 0.30),
    ),
    KernelSpec(
        "triton",
        "kernels.softmax_triton:softmax",
        (
            Path("tile", gpu=(5, 100), cpu={"config": {"BLOCK": 16, "num_warps": 2}}),  # V > BLOCK: the loop
            # 3 rows: a partly masked block; rows cut into a head and a tail, as the GPU cuts them from
            # V = 513 (the whole-row block of shorter rows: test_rows_cut_or_whole_give_the_same_bits)
            Path("rows", gpu=(8193, 100), cpu={"ROWS": 4, "num_warps": 2, "CUT": True}),
            Path("row", gpu=(5, 2049), cpu={"num_warps": 4}),
            Path("split", gpu=(5, 32769), cpu={"CHUNK": 16, "num_warps": 2}, meets=True),
            # 16-bit rows of 24577-49152 from DISPATCH_BOUNDARIES["stream_min_b"] rows on, in shared memory
            Path("held", gpu=(1024, 24577), dtypes=("bfloat16", "float16"), interpreted=False),
            # 16-bit rows past DISPATCH_BOUNDARIES["stream_max_v"] from its "stream_min_b" rows on: split's
            # programs, each holding its chunk in shared memory
            Path("held_split", gpu=(1024, 49153), dtypes=("bfloat16", "float16"), interpreted=False, meets=True),
            Path(
                "stream",
                gpu=(1024, 16385),  # the other 16-bit rows of 16385-49152 from DISPATCH_BOUNDARIES["stream_min_b"] on
                cpu={"BLOCK": 16, "num_warps": 2, "programs_per_sm": 1},  # tiles of 16, rows walked by 2 programs
                dtypes=("bfloat16", "float16"),
            ),
        ),
        _ALL,
        backend="triton",
        plan="kernels.softmax_triton:plan",
        run_path="kernels.softmax_triton:run_path",
        backward="triton",
        interpretable=True,
        gated=True,
        lab_contract=True,
        autotuned=True,
        custom_op=True,
        grids=GRIDS,
        lab_gate=("fused", 0.80),
    ),
    KernelSpec(
        BASELINE,
        "kernels.baselines:torch_softmax",
        (Path("torch", gpu=(5, 100)),),
        _ALL,
        interpretable=True,
        baseline=True,
        grids=GRIDS,
    ),
    KernelSpec(
        "torch_compile",
        "kernels.baselines:compiled_softmax",
        (Path("compiled", gpu=(5, 100)),),
        _ALL,
        baseline=True,
        grids=("sweep", "calls"),
    ),
    # -- the training side: the softmax backward and the cross-entropy ------------------------------
    # The fused entries' paths are the size classes of kernels/cuda_training_plans.py (the same
    # for both ops and every dtype), each at the shortest row that takes it.
    *(
        KernelSpec(
            "fused",
            f"kernels.cuda_training:registry_{op}",
            (
                Path("warp", gpu=(5, 100)),
                Path("warpvec", gpu=(5, 129)),
                Path("row", gpu=(5, 257)),
                Path("cluster", gpu=(5, 16385)),
                Path("loop", gpu=(2, 131073)),
            ),
            _ALL,
            backend="cupy",
            plan=f"kernels.cuda_training_plans:{op.removeprefix('softmax_')}_path",
            gated=True,
            grids=(),
            op=op,
        )
        for op in ("softmax_backward", "cross_entropy")
    ),
    *(
        KernelSpec(
            "triton",
            f"kernels.{module}:{op}",
            (
                Path("row", gpu=(5, 100)),
                Path(
                    "split",
                    gpu=(5, split_v),
                    cpu={"CHUNK": 16, "num_warps": 2},
                    options=split_options,
                    meets=True,
                    dtypes=split_dtypes,
                ),
                *extra,
            ),
            _ALL,
            backend="triton",
            plan=f"kernels.{module}:plan",
            # softmax_backward: run_path(dy, y, path, *, out=None, **params); cross_entropy:
            # run_path(logits, targets, path, *, params, **options)
            run_path=f"kernels.{module}:run_path",
            interpretable=True,
            gated=True,
            grids=(),
            op=op,
        )
        # split_v: the shortest row the split takes (the backward's past its row path's 8192;
        # the cross-entropy's weighted or smoothed float32 rows past stream's 65536, its 16-bit
        # ones and its plain rows never: those stream, and these are held, in one program's
        # registers to 32768, 16-bit ones in its shared memory to 40960, and held_split beyond;
        # split only where the held kernels cannot run); split_options: the cross-entropy's
        # weighted case; split_dtypes: the dtypes whose rows the dispatch splits (None: all)
        for op, module, split_v, split_options, split_dtypes, extra in (
            (
                "softmax_backward",
                "triton_backward",
                8193,
                {},
                None,
                # from DISPATCH_BOUNDARIES["stream_min_b"] rows on: reread (float32) writes in
                # tiles of 16, stream (16-bit) walks tiles of 16 with 2 programs; held_split past
                # their rows
                (
                    Path("reread", gpu=(1024, 8193), cpu={"TILE": 16, "num_warps": 2}, dtypes=("float32",)),
                    Path(
                        "stream",
                        gpu=(1024, 24576),
                        cpu={"BLOCK": 16, "num_warps": 2, "programs_per_sm": 1},
                        dtypes=("bfloat16", "float16"),
                    ),
                    Path("held_split", gpu=(64, 49153), interpreted=False, meets=True),
                ),
            ),
            (
                "cross_entropy",
                "triton_cross_entropy",
                65537,
                {"plain": False},
                ("float32",),
                # 16-bit plain rows of 16385-40960 (past DISPATCH_BOUNDARIES["held_min_v"]) held in
                # shared memory; longer plain rows split, each program's chunk in shared memory;
                # weighted or smoothed rows stream (float32 ones to
                # DISPATCH_BOUNDARIES["float32_stream_max_v"]), tiles of 16 with one program
                (
                    Path("held", gpu=(5, 16385), dtypes=("bfloat16", "float16"), interpreted=False),
                    Path("held_split", gpu=(5, 40961), interpreted=False, meets=True),
                    Path(
                        "stream",
                        gpu=(5, 8193),
                        cpu={"BLOCK": 16, "num_warps": 2, "programs_per_sm": 1},
                        options={"plain": False},
                    ),
                ),
            ),
        )
    ),
    *(
        KernelSpec(
            baseline,
            f"kernels.baselines:torch_{op}",
            (Path("torch", gpu=(5, 100)),),
            _ALL,
            interpretable=True,
            baseline=True,
            grids=(),
            op=op,
        )
        for op, baseline in (("softmax_backward", BACKWARD_BASELINE), ("cross_entropy", CROSS_ENTROPY_BASELINE))
    ),
    *(
        KernelSpec(
            "torch_compile",
            f"kernels.baselines:compiled_{op}",
            (Path("compiled", gpu=(5, 100)),),
            _ALL,
            baseline=True,
            grids=(),
            op=op,
        )
        for op in ("softmax_backward", "cross_entropy")
    ),
)

SPEC_BY_NAME: dict[str, KernelSpec] = {s.name: s for s in SPECS if s.op == "softmax"}  # spec_of: every op


def spec_of(op: str, name: str, specs=SPECS) -> KernelSpec:
    """The entry of kernel `name` of operation `op`."""
    for s in specs:
        if s.op == op and s.name == name:
            return s
    raise KeyError(f"no {op} kernel {name!r}")


def names(where: Callable[[KernelSpec], bool] | None = None, specs=SPECS, op: str = "softmax") -> tuple[str, ...]:
    """Names of the kernels of `op` in registry order, optionally those `where(spec)` holds for."""
    return tuple(s.name for s in specs if s.op == op and (where is None or where(s)))


def in_grid(grid: str, specs=SPECS) -> tuple[str, ...]:
    """The kernels timed on a benchmark grid."""
    if grid not in GRIDS:
        raise ValueError(f"no benchmark grid {grid!r}: one of {GRIDS}")
    return names(lambda s: grid in s.grids, specs)
