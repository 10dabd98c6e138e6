"""Kept for the one import left elsewhere (`from tests.harness import cupy_unusable_reason` in
tests/test_softmax_kernels.py); the suite's machinery lives in tests/suite/."""

from tests.suite.gpus import cupy_unusable_reason

__all__ = ["cupy_unusable_reason"]
