"""The GPU probes of reports/probes/ run end to end on the CPU (their --cpu-smoke mode: CPU
tensors under Triton's interpreter, host-timed), so that a probe broken by a change elsewhere
(a tolerance's type, a launch parameter's shape) fails here, not on a GPU's time."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import TRITON_MISSING
from tests.suite.testing import ROOT

pytestmark = [pytest.mark.cpu, pytest.mark.skipif(bool(TRITON_MISSING), reason=TRITON_MISSING or "")]


def test_triton_long_rows_probe_checks_and_records_every_shape(tmp_path):
    # V = 37 takes the tile path, whose launch parameters nest the autotuned config.
    cmd = [sys.executable, "reports/probes/triton_long_rows.py", "--cpu-smoke", "--out", str(tmp_path)]
    cmd += ["--vs", "37", "--bs", "2", "--dtypes", "float32,bfloat16", "--no-sweep", "--jobs", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    record = json.loads((tmp_path / "triton_long_rows.json").read_text())
    assert record["failures"] == []
    seen = {(r["dtype"], r["V"], r["B"], r["name"]) for r in record["rows"]}
    assert seen == {(d, 37, 2, n) for d in ("fp32", "bf16") for n in ("F", "triton")}
