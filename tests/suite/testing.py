"""What the suite's own tests share: running pytest in a subprocess on the tiny case files of
tests/harness_cases/."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "harness_cases"


def run_pytest(*args, env=None, timeout=300):
    """pytest in a subprocess from the project root; callers point --reports-dir away from reports/."""
    # Not the xdist worker's identity: the child is a session of its own, not a worker.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    full_env = {**inherited, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
