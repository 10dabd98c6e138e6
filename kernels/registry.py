"""The registry: a callable `Kernel` for every `KernelSpec` of `kernels.spec.SPECS`, plus any
named by the environment variable SOFTMAX_SUITE_EXTRA_KERNELS.

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
import torch.nn.functional as F

from .checks import check_softmax_input, prepare_output, torch_dtype
from .spec import BASELINE, SPECS, KernelSpec, Path, dtype_name

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


def triton_missing() -> str | None:
    """Why the triton package cannot be used here (Triton publishes Linux wheels only), or None."""
    return _triton_missing()


@functools.cache
def _triton_missing() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"needs Triton, which is not importable here ({exc}); Triton publishes Linux wheels only"
    return None


class Kernel:
    """A registered softmax: `kernel(x, *, out=None)` for a (B, V) tensor, and its spec's facts
    (`kernel.spec`), with dtypes as torch dtypes and paths by name."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.name = spec.name
        self.dtypes = tuple(torch_dtype(d) for d in spec.dtypes)
        self.paths = spec.path_names
        self.fn = _lazy(spec.fn, "fn")
        self._plan = _lazy(spec.plan, "plan")
        self._run_path = _lazy(spec.run_path, "run_path")

    backend = property(lambda self: self.spec.backend)
    interpretable = property(lambda self: self.spec.interpretable)
    baseline = property(lambda self: self.spec.baseline)
    gated = property(lambda self: self.spec.gated)

    def __repr__(self):
        return f"Kernel({self.name!r}, backend={self.backend!r}, paths={self.paths})"

    def __call__(self, x, *, out=None):
        return self.fn(x, out=out)

    def path(self, name: str) -> Path:
        return self.spec.path(name)

    def plan(self, B: int, V: int, dtype: torch.dtype = torch.float32) -> str:
        """The path a (B, V) input of `dtype` takes on the GPU."""
        return self.paths[0] if self._plan is None else self._plan(B, V, dtype)

    def paths_for(self, dtype: torch.dtype) -> tuple:
        """The paths the dispatch takes for some input of `dtype` (its spec's Path.dtypes)."""
        return self.spec.paths_for(dtype)

    def run_path(self, x, path: str, *, out=None, **params):
        """softmax(x) through the named path with launch parameters `params`. A kernel without
        a run_path of its own has one path, which its plain call takes."""
        if self._run_path is not None:
            return self._run_path(x, path, out=out, **params)
        if path not in self.paths or params:
            raise ValueError(f"{self.name} has no run_path: only its path {self.paths[0]!r}, without parameters")
        return self.fn(x, out=out)

    def tolerance(self, dtype) -> dict | None:
        """The tolerance fields this kernel's spec overrides for `dtype`, or None: the suite's own."""
        return self.spec.tolerances.get(dtype_name(dtype))

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run the kernel at all (its backend's package is missing)."""
        return triton_missing() if self.backend == "triton" else None


def torch_softmax(x, *, out=None):
    """The baseline: `F.softmax` over the last dimension."""
    check_softmax_input(x, kernel=BASELINE, device_type=None)
    y = F.softmax(x, dim=-1)
    if out is None:
        return y
    return prepare_output(x, out, kernel=BASELINE).copy_(y)


@functools.cache
def _compiled_softmax():
    return torch.compile(functools.partial(F.softmax, dim=-1))


def compiled_softmax(x, *, out=None):
    """The second baseline: `torch.compile(F.softmax)` (Inductor's generated kernel)."""
    check_softmax_input(x, kernel="torch_compile", device_type="cuda")
    y = _compiled_softmax()(x)
    if out is None:
        return y
    return prepare_output(x, out, kernel="torch_compile").copy_(y)


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


def build(specs) -> dict[str, Kernel]:
    """{name: Kernel} for `specs`; ValueError on a name given twice."""
    registry: dict[str, Kernel] = {}
    for spec in specs:
        if spec.name in registry:
            raise ValueError(f"softmax kernel {spec.name!r} is registered twice")
        registry[spec.name] = Kernel(spec)
    return registry


SOFTMAX_KERNELS: dict[str, Kernel] = build((*SPECS, *extra_specs(os.environ.get(EXTRA_KERNELS_ENV))))
# What each kernel accepts; tests draw their dtype parameters from here.
SUPPORTED_DTYPES = {name: k.dtypes for name, k in SOFTMAX_KERNELS.items()}
# Ours, as opposed to the baselines we measure them against.
OUR_KERNELS = tuple(name for name, k in SOFTMAX_KERNELS.items() if not k.baseline)
