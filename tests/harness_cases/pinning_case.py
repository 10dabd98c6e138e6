"""Each case writes which xdist worker ran it and which GPU that worker was pinned to."""

import os
from pathlib import Path

import pytest


@pytest.mark.cpu
@pytest.mark.parametrize("case", range(8))
def test_report_pinning(case):
    out = Path(os.environ["PINNING_OUT"])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (out / f"{case}.txt").write_text(f"{worker} {os.environ.get('CUDA_VISIBLE_DEVICES')}")
    assert worker.startswith("gw")
