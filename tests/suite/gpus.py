"""GPUs as the suite sees them, found without initialising CUDA: how many, which one a
pytest-xdist worker gets, what it is called, and why it cannot be used."""

import functools
import os
import re
import shutil
import subprocess
import sys

# Set to an integer to pretend the host has that many GPUs (for exercising the xdist
# pinning logic on a machine without them); only the counting and pinning honour it.
SIMULATED_GPUS_ENV = "SOFTMAX_SUITE_SIMULATED_GPUS"
# How many of the run's xdist workers were pinned to this worker's GPU (set by pin_xdist_worker).
GPU_WORKERS_ENV = "SOFTMAX_SUITE_GPU_WORKERS"


def visible_gpu_ids() -> list[str]:
    """GPU ids this process may use, found without initialising CUDA.

    CUDA_VISIBLE_DEVICES wins when set; otherwise `nvidia-smi -L` lists the devices. Touching
    torch.cuda here would create a CUDA context in the pytest controller before xdist workers
    are pinned, and would make a CPU box pay for driver probing at import time.
    """
    simulated = os.environ.get(SIMULATED_GPUS_ENV)
    if simulated:
        return [str(i) for i in range(int(simulated))]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    return _nvidia_smi_ids()


@functools.lru_cache(maxsize=1)
def _nvidia_smi_ids() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return re.findall(r"^GPU (\d+):", listing, flags=re.MULTILINE)


def pin_xdist_worker(worker: str | None, environ=os.environ) -> str | None:
    """Give xdist worker `gwN` its own GPU by narrowing CUDA_VISIBLE_DEVICES.

    Must run before anything initialises CUDA in the worker (conftest import time is early
    enough: workers are fresh processes). Where `environ` names the run's worker count
    (PYTEST_XDIST_WORKER_COUNT, as xdist sets it), also records how many workers share the GPU
    chosen (workers_on_this_gpu). Returns the GPU id chosen, or None.
    """
    if not worker:
        return None
    ids = visible_gpu_ids()
    if not ids:
        return None
    index = int(worker.removeprefix("gw"))
    chosen = ids[index % len(ids)]
    environ["CUDA_VISIBLE_DEVICES"] = chosen
    count = environ.get("PYTEST_XDIST_WORKER_COUNT")
    if count:
        environ[GPU_WORKERS_ENV] = str(len(range(index % len(ids), int(count), len(ids))))
    # nvidia-smi numbers GPUs in PCI bus order, CUDA by default fastest first: on a host of
    # mixed models the same index would name two GPUs. Unless the user chose an order, number
    # them as nvidia-smi does, so the id pinned is the GPU the manifest names.
    environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return chosen


def workers_on_this_gpu(environ=os.environ) -> int:
    """How many xdist workers of this run share this process's GPU: 1 outside xdist or with one
    worker per GPU (-n auto on a cuda run). Device time measured while others share the GPU
    includes their work."""
    return int(environ.get(GPU_WORKERS_ENV, 1))


def describe_gpu() -> dict | None:
    """{model, compute_capability} of the first visible GPU from nvidia-smi, without CUDA.

    The xdist controller runs no GPU code itself, yet writes the manifest for its workers."""
    smi = shutil.which("nvidia-smi")
    ids = visible_gpu_ids()
    if smi is None or not ids:
        return None
    try:
        line = (
            subprocess.run(
                [smi, "-i", ids[0], "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        name, capability = (part.strip() for part in line.rsplit(",", 1))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None
    return {"model": name, "compute_capability": capability}


def measured_gpu(gpu_work_ran: bool) -> dict | None:
    """The GPU this run measured on: from torch when this process used CUDA, else from
    nvidia-smi when GPU work ran elsewhere (in xdist workers), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        major, minor = torch.cuda.get_device_capability()
        return {"model": torch.cuda.get_device_name(), "compute_capability": f"{major}.{minor}"}
    if gpu_work_ran:
        return describe_gpu()
    return None


@functools.lru_cache(maxsize=1)
def gpu_unusable_reason() -> str | None:
    """None when torch sees a usable CUDA GPU, else why not. Touches CUDA: call lazily."""
    if not visible_gpu_ids():
        return "no NVIDIA GPU visible (nvidia-smi lists none and CUDA_VISIBLE_DEVICES is unset or empty)"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} cannot use the GPU (CPU-only build or driver problem)"
    return None


@functools.lru_cache(maxsize=1)
def cupy_unusable_reason() -> str | None:
    """None when CuPy imports and sees a GPU, else why not."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); install the gpu extra"
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy raises its own CUDARuntimeError subclasses
        return f"CuPy cannot reach the GPU: {exc}"
    return None
