import pytest


@pytest.mark.cpu
def test_records_a_figure(record_manifest):
    # A value no real run measures, so that any run that writes the manifest changes it.
    record_manifest("torch_port", max_abs_diff_to_numpy_reference=0.5)
