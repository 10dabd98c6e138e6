"""tests/suite/gpus.py: GPUs counted, named and handed to xdist workers without CUDA."""

import os

import pytest

from tests.suite import gpus
from tests.suite.testing import CASES, run_pytest

pytestmark = pytest.mark.cpu


@pytest.fixture
def no_gpu_env(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", gpus.SIMULATED_GPUS_ENV):
        monkeypatch.delenv(name, raising=False)
    gpus._nvidia_smi_ids.cache_clear()
    yield monkeypatch
    gpus._nvidia_smi_ids.cache_clear()


@pytest.fixture
def fake_nvidia_smi(tmp_path, no_gpu_env):
    """A stand-in nvidia-smi on PATH listing two H200s."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  -L) printf 'GPU 0: NVIDIA H200 (UUID: GPU-a)\\nGPU 1: NVIDIA H200 (UUID: GPU-b)\\n' ;;\n"
        "  *) echo 'NVIDIA H200, 9.0' ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    no_gpu_env.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return fake


def test_gpus_are_counted_and_named_through_nvidia_smi(fake_nvidia_smi):
    """Counting and naming never go through CUDA."""
    assert gpus.visible_gpu_ids() == ["0", "1"]
    assert gpus.describe_gpu() == {"model": "NVIDIA H200", "compute_capability": "9.0"}
    environ = {}
    assert gpus.pin_xdist_worker("gw3", environ) == "1"
    assert environ == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(
    "visible",
    ["3,1", "GPU-5f1c,GPU-09ab", "2, 7", "MIG-aa11,MIG-bb22"],
    ids=["reordered", "uuids", "spaced", "mig"],
)
def test_workers_are_pinned_to_the_visible_ids_themselves(no_gpu_env, visible):
    # Ids that are not 0..n-1 (a reordered subset, UUIDs, MIG instances): each worker gets one
    # of the listed ids verbatim, in turn, never an index into them.
    no_gpu_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    listed = [v.strip() for v in visible.split(",")]
    pinned = []
    for i in range(4):
        environ = {}
        pinned.append(gpus.pin_xdist_worker(f"gw{i}", environ))
        assert environ["CUDA_VISIBLE_DEVICES"] == pinned[-1]
    assert pinned == [listed[0], listed[1], listed[0], listed[1]]


def test_a_chosen_device_order_is_kept(no_gpu_env):
    no_gpu_env.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    environ = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert gpus.pin_xdist_worker("gw0", environ) == "1"
    assert environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


@pytest.mark.parametrize("visible, expected", [("0,2", ["0", "2"]), (" 3 , ", ["3"]), ("", []), ("-1", [])])
def test_cuda_visible_devices_wins_over_nvidia_smi(fake_nvidia_smi, no_gpu_env, visible, expected):
    no_gpu_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpus.visible_gpu_ids() == expected


def test_a_simulated_count_wins_and_workers_take_turns(no_gpu_env):
    no_gpu_env.setenv(gpus.SIMULATED_GPUS_ENV, "3")
    assert gpus.visible_gpu_ids() == ["0", "1", "2"]
    assert [gpus.pin_xdist_worker(f"gw{i}", {}) for i in range(5)] == ["0", "1", "2", "0", "1"]
    assert gpus.pin_xdist_worker(None, {}) is None


def test_workers_know_how_many_share_their_gpu(no_gpu_env):
    # Five workers on three GPUs: gw0 and gw3 share GPU 0, gw1 and gw4 GPU 1, gw2 has GPU 2 alone.
    no_gpu_env.setenv(gpus.SIMULATED_GPUS_ENV, "3")
    shared = []
    for i in range(5):
        environ = {"PYTEST_XDIST_WORKER_COUNT": "5"}
        gpus.pin_xdist_worker(f"gw{i}", environ)
        shared.append(gpus.workers_on_this_gpu(environ))
    assert shared == [2, 2, 1, 2, 2]
    assert gpus.workers_on_this_gpu({}) == 1  # not a worker, or a run that did not say


def test_without_a_gpu_nothing_is_named_or_pinned(no_gpu_env):
    no_gpu_env.setenv("CUDA_VISIBLE_DEVICES", "")
    environ = {}
    assert gpus.pin_xdist_worker("gw0", environ) is None and environ == {}
    assert gpus.describe_gpu() is None
    assert gpus.measured_gpu(gpu_work_ran=True) is None


def test_the_measured_gpu_is_named_only_when_gpu_work_ran(fake_nvidia_smi):
    assert gpus.measured_gpu(gpu_work_ran=False) is None
    assert gpus.measured_gpu(gpu_work_ran=True) == {"model": "NVIDIA H200", "compute_capability": "9.0"}


def test_xdist_workers_are_pinned_one_per_gpu(tmp_path):
    """With two (simulated) GPUs, `-n auto` starts two workers, each with its own GPU."""
    env = {gpus.SIMULATED_GPUS_ENV: "2", "PINNING_OUT": str(tmp_path)}
    result = run_pytest(
        "-n",
        "auto",
        "-m",
        "cpu or cuda",
        "--allow-no-gpu",
        str(CASES / "pinning_case.py"),
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 workers" in result.stdout
    seen = {tuple(p.read_text().split()) for p in tmp_path.glob("*.txt")}
    assert len(list(tmp_path.glob("*.txt"))) == 8
    assert {device for _, device in seen} == {"0", "1"}
    assert all(dict(seen)[worker] == worker.removeprefix("gw") for worker in dict(seen))
