"""The registry: a callable `Kernel` for every `KernelSpec` of `kernels.spec.SPECS`, plus any
named by the environment variable SOFTMAX_SUITE_EXTRA_KERNELS, by operation:
`REGISTRY[op][name]`, with `SOFTMAX_KERNELS`, `SOFTMAX_BACKWARD_KERNELS` and
`CROSS_ENTROPY_KERNELS` its three views.

    SOFTMAX_SUITE_EXTRA_KERNELS=mypkg.mysoftmax:SPEC,other.module:SPECS pytest -m cpu

Each `module:attribute` names a `KernelSpec` or a sequence of them; they join the registry
after the built-in kernels, so every registry-wide test, the coverage matrix and the benchmarks
take them up exactly as if they were in `SPECS`. The variable is read once, when the registry
is built (the first use of `kernels.SOFTMAX_KERNELS`). Backends are imported on a kernel's
first call, not here.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from .checks import torch_dtype
from .spec import OPS, SPECS, KernelSpec, Path, dtype_name

EXTRA_KERNELS_ENV = "SOFTMAX_SUITE_EXTRA_KERNELS"


def resolve(ref):
    """The object a spec refers to: "package.module:attribute" imported now, else ref itself."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{ref!r} is not 'package.module:attribute'")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _lazy(ref, what: str):
    """A callable that resolves `ref` on its first call (then keeps it), so building the
    registry imports no backend and a call costs no import machinery."""
    if ref is None or not isinstance(ref, str):
        return ref
    resolved = []

    def call(*args, **kwargs):
        if not resolved:
            resolved.append(resolve(ref))
        return resolved[0](*args, **kwargs)

    call.__name__ = ref.rpartition(":")[2]
    call.__qualname__ = f"{ref} ({what})"
    return call


@functools.cache
def triton_missing() -> str | None:
    """Why the triton package cannot be used here (Triton publishes Linux wheels only), or None."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"needs Triton, which is not importable here ({exc}); Triton publishes Linux wheels only"
    return None


class Kernel:
    """A registered kernel, callable as its op says (`kernel.spec.op`, `kernels.spec.OPS`; the
    softmax: `kernel(x, *, out=None)` for a (B, V) tensor), and its spec's facts (`kernel.spec`),
    with dtypes as torch dtypes and paths by name."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.name = spec.name
        self.op = spec.op
        self.dtypes = tuple(torch_dtype(d) for d in spec.dtypes)
        self.paths = spec.path_names
        # The paths the Triton interpreter runs (all, but a Gluon kernel's): the CPU cases' paths.
        self.interpreted_paths = tuple(p.name for p in spec.paths if p.interpreted)
        self.fn = _lazy(spec.fn, "fn")
        self._plan = _lazy(spec.plan, "plan")
        self._run_path = _lazy(spec.run_path, "run_path")

    backend = property(lambda self: self.spec.backend)
    interpretable = property(lambda self: self.spec.interpretable)
    baseline = property(lambda self: self.spec.baseline)
    gated = property(lambda self: self.spec.gated)

    def __repr__(self):
        return f"Kernel({self.name!r}, op={self.op!r}, backend={self.backend!r}, paths={self.paths})"

    def __call__(self, *inputs, **options):
        return self.fn(*inputs, **options)

    def path(self, name: str) -> Path:
        return self.spec.path(name)

    def plan(self, B: int, V: int, dtype: torch.dtype = torch.float32, **options) -> str:
        """The path a (B, V) input of `dtype` takes on the GPU; `options`: the plan's own keywords
        (a Path's `options`)."""
        return self.paths[0] if self._plan is None else self._plan(B, V, dtype, **options)

    def paths_for(self, dtype: torch.dtype) -> tuple:
        """The paths the dispatch takes for some input of `dtype` (its spec's Path.dtypes)."""
        return self.spec.paths_for(dtype)

    def run_path(self, *inputs_and_path, out=None, **params):
        """The op through the named path, `run_path(*inputs, path, *, out=None, **params)`, with
        launch parameters `params` (the softmax: run_path(x, path, out=None, **params)). A
        kernel without a run_path of its own has one path, which its plain call takes."""
        if self._run_path is not None:
            return self._run_path(*inputs_and_path, out=out, **params)
        *inputs, path = inputs_and_path
        if path not in self.paths or params:
            raise ValueError(f"{self.name} has no run_path: only its path {self.paths[0]!r}, without parameters")
        return self.fn(*inputs, out=out)

    def tolerance(self, dtype) -> dict | None:
        """The tolerance fields this kernel's spec overrides for `dtype`, or None: the suite's own."""
        return self.spec.tolerances.get(dtype_name(dtype))

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run the kernel at all (its backend's package is missing)."""
        return triton_missing() if self.backend == "triton" else None


def extra_specs(value: str | None) -> list[KernelSpec]:
    """The specs a SOFTMAX_SUITE_EXTRA_KERNELS value names ("module:attr,module:attr")."""
    specs = []
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            found = resolve(item)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImportError(f"{EXTRA_KERNELS_ENV}: cannot load {item!r}: {exc}") from exc
        found = [found] if isinstance(found, KernelSpec) else list(found) if isinstance(found, list | tuple) else found
        if not isinstance(found, list) or not all(isinstance(s, KernelSpec) for s in found):
            raise TypeError(f"{EXTRA_KERNELS_ENV}: {item!r} is not a KernelSpec or a sequence of them")
        specs += found
    return specs


def build(specs) -> dict[str, dict[str, Kernel]]:
    """{op: {name: Kernel}} for `specs`, every op of OPS present; ValueError on a name given
    twice within one op."""
    registry: dict[str, dict[str, Kernel]] = {op: {} for op in OPS}
    for spec in specs:
        if spec.name in registry[spec.op]:
            raise ValueError(f"{spec.op} kernel {spec.name!r} is registered twice")
        registry[spec.op][spec.name] = Kernel(spec)
    return registry


REGISTRY: dict[str, dict[str, Kernel]] = build((*SPECS, *extra_specs(os.environ.get(EXTRA_KERNELS_ENV))))
SOFTMAX_KERNELS: dict[str, Kernel] = REGISTRY["softmax"]
SOFTMAX_BACKWARD_KERNELS: dict[str, Kernel] = REGISTRY["softmax_backward"]
CROSS_ENTROPY_KERNELS: dict[str, Kernel] = REGISTRY["cross_entropy"]
# What each softmax accepts; tests draw their dtype parameters from here.
SUPPORTED_DTYPES = {name: k.dtypes for name, k in SOFTMAX_KERNELS.items()}
# Ours, as opposed to the baselines we measure them against.
OUR_KERNELS = tuple(name for name, k in SOFTMAX_KERNELS.items() if not k.baseline)
# The backward each forward softmax op (kernels/ops.py) runs: forward kernel -> an entry of
# SOFTMAX_BACKWARD_KERNELS (the spec's `backward`).
SOFTMAX_BACKWARD_OF: dict[str, str] = {name: k.spec.backward for name, k in SOFTMAX_KERNELS.items() if k.spec.backward}
