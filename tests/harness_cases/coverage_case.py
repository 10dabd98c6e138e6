"""A four-cell coverage matrix in the shape of tests/test_coverage_matrix.py: each case records
its cell, the check test expects them all when every case is selected. COVERAGE_CASE_SKIP names
paths whose case skips before running its kernel (a cell left out without failing anything)."""

import os

import pytest

from tests.suite import coverage

CELLS = [("kern", path, "contiguous", "fp32") for path in ("a", "b", "c", "d")]


@pytest.mark.cpu
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c[1])
def test_cell(request, cell):
    if cell[1] in os.environ.get("COVERAGE_CASE_SKIP", "").split(","):
        pytest.skip("a new skip condition nobody noticed")
    coverage.record_cell(request.node, "cpu", cell)


@pytest.mark.cpu
def test_every_cell_ran(request):
    selected = [item for item in request.session.items if getattr(item, "originalname", None) == "test_cell"]
    if len(selected) != len(CELLS):
        pytest.skip("only part of the matrix was selected in this run")
    coverage.expect(request.node, "cpu", CELLS)
