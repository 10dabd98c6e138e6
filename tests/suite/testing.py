"""What the suite's own tests share: running pytest in a subprocess on the tiny case files of
tests/harness_cases/, and reading the committed manifest and its schema."""

import json
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
    # One terminal width wherever the suite runs: pytest cuts summary lines to it.
    full_env = {**inherited, "COLUMNS": "120", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


COMMITTED_MANIFEST = ROOT / "reports" / "manifest.json"


def committed_manifest() -> dict:
    """reports/manifest.json as committed, read afresh (a caller may change what it gets)."""
    return json.loads(COMMITTED_MANIFEST.read_text())


def manifest_schema() -> dict:
    """reports/manifest.schema.json: what every manifest the suite writes validates against."""
    from tests.suite import manifest

    return json.loads(manifest.SCHEMA_PATH.read_text())
