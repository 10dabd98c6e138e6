import os

import pytest


@pytest.mark.cpu
def test_records_a_figure(record_manifest):
    # A value no real run measures, so that any run that writes the manifest changes it; with
    # RECORD_CASE_INVALID=1 one the schema refuses (an error below zero).
    invalid = os.environ.get("RECORD_CASE_INVALID") == "1"
    record_manifest("torch_port", max_abs_diff_to_numpy_reference=-1.0 if invalid else 0.5)
