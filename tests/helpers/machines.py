"""Which machine a test needs: Triton (it publishes Linux wheels only), CuPy for the CUDA C
kernels, the interpreter where no GPU is visible; and a child process that runs a file's cpu
tests interpreted where the parent runs the compiled kernels."""

from __future__ import annotations

import importlib
import os

import pytest

from kernels.registry import triton_missing

# Whether the kernels run on CPU tensors through Triton's interpreter (the conftest sets the
# variable where no GPU is visible, before any kernel module is imported).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Why Triton cannot be used on this machine (it publishes Linux wheels only), or None. Every test
# that needs it skips with this one reason.
TRITON_MISSING = triton_missing()
needs_triton = pytest.mark.skipif(TRITON_MISSING is not None, reason=TRITON_MISSING or "")


def triton_module(name: str = "softmax_triton"):
    """kernels.<name> (a Triton module of kernels/: the public entry by default), or None where
    Triton is missing (its tests skip: needs_triton)."""
    return None if TRITON_MISSING else importlib.import_module(f"kernels.{name}")


def needs_cupy(kernel) -> bool:
    """Whether a registry kernel is one of the CUDA C kernels, compiled through CuPy."""
    return kernel.backend == "cupy"


def skip_if_unavailable(kernel) -> None:
    """Skip (with the reason) a test whose kernel's backend package is missing here (Triton
    off Linux): what even its plan and its CPU cases need."""
    reason = kernel.unavailable_reason()
    if reason:
        pytest.skip(reason)


# A test run on CPU tensors in the cpu tier and on a GPU's in the cuda tier (skip_unless_runs_on).
on_each_device = pytest.mark.parametrize(
    "device", [pytest.param("cpu", marks=pytest.mark.cpu), pytest.param("cuda", marks=pytest.mark.cuda)]
)


def skip_unless_runs_on(kernel, device: str) -> None:
    """Skip a test whose kernel cannot take `device` tensors here: "cpu", the kernels PyTorch
    runs and, under Triton's interpreter, the interpreted ones; "cuda", skip_unless_runnable's."""
    if device != "cpu":
        skip_unless_runnable(kernel)
        return
    skip_if_unavailable(kernel)
    if not kernel.interpretable or not (kernel.baseline or INTERPRETED):
        pytest.skip(f"{kernel.name} takes CPU tensors only under Triton's interpreter" if kernel.interpretable
                    else f"{kernel.name} takes CUDA tensors only")  # fmt: skip


def skip_unless_runnable(kernel) -> None:
    """Skip (with the reason) a test whose kernel cannot run on this machine: its backend's
    package is missing, or it is launched through CuPy and CuPy cannot be used."""
    skip_if_unavailable(kernel)
    if needs_cupy(kernel):
        from tests.suite.gpus import cupy_unusable_reason

        reason = cupy_unusable_reason()
        if reason:
            pytest.skip(reason)


def sm90_builds(tmp_dir, *args: str) -> list[dict]:
    """The records of `python -m kernels.triton_build *args` (sm_90 builds ahead of time), run
    in a child process: the compiled kernels are needed, so TRITON_INTERPRET must be unset
    there. Triton's own cache (keyed on source, options, target and version) serves a warm
    rerun. The child's temporary files go to `tmp_dir`, which the builds must leave empty."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    env["TMPDIR"] = str(tmp_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.triton_build", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    left = sorted(p.name for p in Path(tmp_dir).iterdir())
    assert not left, f"the sm_90 builds left {len(left)} temporary files behind, e.g. {left[:3]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_interpreted_in_subprocess(test_file, pytestconfig, *, exclude: str = "interpreted_in_a_subprocess") -> None:
    """On a machine whose test process runs the compiled Triton modules (a GPU is visible), run the
    cpu tests of `test_file` again in a child with TRITON_INTERPRET=1 from the start (the variable
    is read when kernels are decorated, at import), so the interpreter cases run there too."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    cmd += ["-m", "cpu", "-k", f"not {exclude}", "-W", "ignore::RuntimeWarning"]
    try:
        pytestconfig.getoption("no_reports")
        cmd.append("--no-reports")  # the parent session writes the reports, not the child
    except ValueError:
        pass
    proc = subprocess.run(
        cmd, cwd=Path(test_file).resolve().parents[1], env=env, capture_output=True, text=True, timeout=1800
    )
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert re.search(r"\d+ passed", proc.stdout), tail
