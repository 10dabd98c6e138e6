import pytest


@pytest.mark.cuda
def test_needs_a_gpu():
    import torch

    assert torch.cuda.is_available()
