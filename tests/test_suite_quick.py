"""The one-minute GPU check, `pytest -m "cuda and quick"`, checked on the CPU by collecting it:
every cell of the coverage matrix (from the registry) once, the bitwise properties once per
dispatch path of our kernels in every dtype, the common call and graph replay per path, the
registry's edge cases, the model swap and the completeness check; none of the wide grids."""

import re

import pytest

from kernels import SOFTMAX_KERNELS
from kernels.spec import dtype_name
from tests import test_model_swap_cuda
from tests.suite.testing import run_pytest
from tests.test_coverage_matrix import cells

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def selected() -> list[str]:
    # Collected, not run: no assertion is rewritten (--assert=plain), which costs most of a
    # collection where no bytecode is cached.
    proc = run_pytest(
        "-m", "cuda and quick", "--co", "-q", "--allow-no-gpu", "-p", "no:xdist", "--assert=plain", timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def ids_of(selected, test):
    return [re.search(r"\[(.*)\]$", n).group(1) for n in selected if n.split("[")[0].endswith(f"::{test}")]


def test_every_cell_of_the_matrix_runs_once(selected):
    ran = []
    for case_id in ids_of(selected, "test_cuda_path_under_layout"):
        kernel, path, layout, dtype, _, _ = case_id.split("-")
        ran.append((kernel, path, layout, dtype))
    assert len(ran) == len(set(ran))
    assert set(ran) == cells(SOFTMAX_KERNELS.values())
    assert any(n.endswith("::test_every_cuda_cell_ran") for n in selected)


def test_every_path_of_our_kernels_has_its_properties_checked(selected):
    checked = {tuple(i.split("-")[:3]) for i in ids_of(selected, "test_every_property_once_per_path")}
    expected = {
        (name, path, dtype_name(dtype))
        for name, k in SOFTMAX_KERNELS.items()
        if not k.baseline
        for dtype in k.dtypes
        for path in k.paths_for(dtype)
    }
    assert checked == expected
    assert ids_of(selected, "test_graph_replay_gives_the_eager_bits")
    assert ids_of(selected, "test_the_remembered_common_call_gives_the_checked_calls_bits")


def test_the_model_swap_and_the_edges_run(selected):
    swap = {n.split("::")[1].split("[")[0] for n in selected if "test_model_swap_cuda.py" in n}
    assert swap == {name for name in dir(test_model_swap_cuda) if name.startswith("test_")}
    assert set(ids_of(selected, "test_empty_batch")) == set(SOFTMAX_KERNELS)


def test_the_wide_grids_stay_out(selected):
    files = {n.split("::")[0] for n in selected}
    assert files == {
        "tests/test_coverage_matrix.py",
        "tests/test_byte_equivalence.py",
        "tests/test_call_paths.py",
        "tests/test_softmax_kernels.py",
        "tests/test_model_swap_cuda.py",
    }
    equivalence = {n.split("::")[1].split("[")[0] for n in selected if "test_byte_equivalence.py" in n}
    assert equivalence == {"test_every_property_once_per_path"}
    assert not any("test_kernel_matches_reference" in n or "test_long_wide" in n for n in selected)
