"""One build per machine. Processes that need the same kernel compiled at the same moment (the
workers of a parallel test run, the ranks of a job on one host) take turns: the first compiles it
into its compiler's on-disk cache (CuPy's, Triton's) and the others, waiting on the same lock,
then load it from there instead of compiling it again, each on its own core.

The locks are files in `lock_dir()` (the folder named by SOFTMAX_SUITE_BUILD_LOCKS, else
softmax-suite-build-locks-<user> under the system's temporary folder, one per user, as the
compilers' caches are); the operating system releases a lock whose holder dies, so a crashed
build never blocks the next one.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

LOCK_DIR_ENV = "SOFTMAX_SUITE_BUILD_LOCKS"


def lock_dir() -> Path:
    env = os.environ.get(LOCK_DIR_ENV, "").strip()
    if env:
        return Path(env)
    user = os.getuid() if hasattr(os, "getuid") else getpass.getuser()
    return Path(tempfile.gettempdir()) / f"softmax-suite-build-locks-{user}"


@contextmanager
def build_lock(key: str):
    """Hold the machine-wide lock of the build named `key` (any text that names what is built)."""
    folder = lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"):
        yield
