"""The old name of the suite's logits generator, kept while tests/test_byte_equivalence.py still
imports it from here: tests.helpers.logits is the generator (seed, dtype, device, layout)."""

from tests.helpers import logits as seeded_logits

__all__ = ["seeded_logits"]
