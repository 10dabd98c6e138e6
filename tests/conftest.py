"""Fixtures that more than one test file uses (the suite-wide hooks and fixtures are in the
conftest.py above this folder). A file asks for one by argument or, for all of its tests, with
pytest.mark.usefixtures in its pytestmark. torch is imported inside the fixtures: a process that
never needs it (a child run of the suite's own tests) is spared its import."""

import pytest

from tests.suite.testing import committed_manifest


@pytest.fixture
def one_thread():
    """One CPU thread for the test: a fixed reduction order, so results do not depend on the host.
    The host's thread count comes back afterwards for the rest of the session."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def ieee_fp32():
    """TF32 off for the module, so CUDA matmuls round like CPU fp32 ones; restored afterwards."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = False
    cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


@pytest.fixture
def cupy_importable():
    """Skips the test where CuPy, through which the CUDA C kernels are launched, does not import."""
    pytest.importorskip("cupy", reason="the CUDA C kernels are launched through CuPy")


@pytest.fixture(scope="module")
def committed():
    """reports/manifest.json as committed, read once per module."""
    return committed_manifest()
