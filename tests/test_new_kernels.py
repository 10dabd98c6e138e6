"""What the suite says about kernels it has never seen.

In a copy of the tree, the example of README.md's "Adding a kernel" is added exactly as the
README says (tests/examples/online_softmax.py as kernels/online_softmax.py, the README's two
`KernelSpec` entries appended to SPECS), together with the same module whose running sum is not
rescaled (entries renamed toy_norescale*), and the deliberately broken kernels of
tests/broken_kernels.py are registered through SOFTMAX_SUITE_EXTRA_KERNELS. One `pytest -m cpu`
in that copy runs every registry-wide case of the whole suite on the correct kernels, which must
pass all of them, and each wrong one in the cases its corpus says are meant to catch it, which
must fail (-k on their names, `selection`).
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kernels import SOFTMAX_KERNELS
from kernels.registry import EXTRA_KERNELS_ENV
from tests.helpers import INTERPRETED, needs_triton

interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="the kernels run on CPU tensors only under the Triton interpreter"
)


def on_cpu(test):
    return pytest.mark.cpu(needs_triton(interpreted(test)))


REPO = Path(__file__).resolve().parents[1]
# The broken kernels and the gaming ones (tests/adversaries.py), registered as a contributor would.
CORPORA = "tests.broken_kernels:CORPUS,tests.adversaries:CORPUS"
COPIED = ("kernels", "model", "tests", "conftest.py", "pytest.ini", "pyproject.toml")
EXAMPLE = REPO / "tests" / "examples" / "online_softmax.py"
CORRECT = ("toy_online", "toy_online_row")
NOT_RESCALED = ("toy_norescale", "toy_norescale_row")
RESCALE = "s = s * rescale + tl.sum("  # the example's running sum, rescaled
NO_RESCALE = "s = s + tl.sum("


def readme_entries() -> str:
    """The KernelSpec entries of README.md's "Adding a kernel", as the reader copies them into
    SPECS (the block shows them inside `SPECS = (..., <entries>)`)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Adding a kernel") :]
    section = section[: section.index("\n## ", 1)]
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", section, re.S) if "KernelSpec(" in b]
    assert len(blocks) == 1, "the section should show its entries in one python block"
    lines = blocks[0].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("    KernelSpec("))
    last = max(i for i, line in enumerate(lines) if line == ")")
    return textwrap.dedent("\n".join(lines[first:last])) + "\n"


def copy_tree(root: Path) -> None:
    # The compiled modules travel too (copy2 keeps the sources' times, which they are checked
    # against): the child then compiles only the files the copy changes, not the whole suite.
    ignore = shutil.ignore_patterns(".pytest_cache")
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=ignore)
        else:
            shutil.copy2(source, root / name)


def add_kernels_as_the_readme_says(root: Path) -> None:
    example = EXAMPLE.read_text()
    assert example.count(RESCALE) == 1, "the example's rescale line moved: update RESCALE"
    (root / "kernels" / "online_softmax.py").write_text(example)
    (root / "kernels" / "online_softmax_no_rescale.py").write_text(example.replace(RESCALE, NO_RESCALE))
    entries = readme_entries()
    assert [f'"{n}"' in entries for n in CORRECT] == [True, True], entries
    broken = entries.replace("kernels.online_softmax:", "kernels.online_softmax_no_rescale:")
    broken = broken.replace('"toy_online', '"toy_norescale')
    spec = root / "kernels" / "spec.py"
    text = spec.read_text()
    end_of_specs = "\n)\n\nSPEC_BY_NAME"
    assert text.count(end_of_specs) == 1, "kernels/spec.py: SPECS should end with a line holding ')'"
    spec.write_text(text.replace(end_of_specs, "\n" + textwrap.indent(entries + broken, "    ") + end_of_specs))


def parse_junit(path: Path, kernels) -> dict:
    """{kernel: {"passed" | "failed" | "skipped": [test names]}} for the cases whose parameter id
    starts with the kernel's name."""
    verdicts = {k: {"passed": [], "failed": [], "skipped": []} for k in kernels}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if "[" not in name:
            continue
        kernel = name[name.index("[") + 1 :].split("-")[0].rstrip("]")
        if kernel not in verdicts:
            continue
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        verdicts[kernel][outcome].append(name)
    return verdicts


def selection(*corpora) -> str:
    """The -k expression of the run in the copy: the correct kernels and the honest controls in
    every case, the kernels without the rescale in float32, and each wrong kernel of `corpora` in
    the test functions its CAUGHT_BY names (one CPU case to show it registered where only a GPU
    can catch it)."""
    terms = [*CORRECT, *(h for c in corpora for h in getattr(c, "HONEST", ())), "toy_norescale and fp32"]
    for corpus in corpora:
        for spec in corpus.CORPUS:
            if spec.name in getattr(corpus, "HONEST", ()):
                continue
            functions = corpus.CAUGHT_BY.get(spec.name) if spec.name not in corpus.CUDA_ONLY else None
            terms.append(f"{spec.name} and ({' or '.join(functions or ('test_cpu_path_edges',))})")
    return " or ".join(f"({t})" for t in terms)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    from tests import adversaries, broken_kernels

    root = tmp_path_factory.mktemp("tree")
    copy_tree(root)
    add_kernels_as_the_readme_says(root)
    report = root / "junit.xml"
    corpus = [spec.name for spec in (*broken_kernels.CORPUS, *adversaries.CORPUS)]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    env[EXTRA_KERNELS_ENV] = CORPORA
    # Every registry-wide cpu case of the suite on the correct kernels and the honest control; the
    # kernels without the rescale in float32 only (to fail, one dtype is enough); each broken or
    # gaming kernel in the cases meant to catch it (the test below asserts they do); not this
    # file, which would recurse.
    cmd = [sys.executable, "-m", "pytest", "tests", "-m", "cpu", "-k", selection(broken_kernels, adversaries)]
    cmd += ["--ignore", f"tests/{Path(__file__).name}", "-p", "no:xdist", "-p", "no:cacheprovider", "--no-reports"]
    # The verdicts are pass or fail per case (a plain assert fails as a rewritten one does), so
    # the whole suite's assertions are not rewritten in the copy: it caches no bytecode.
    cmd += ["--assert=plain"]
    # One line per failure: the verdicts come from the junit report, and the broken kernels'
    # full tracebacks (dozens of them) would only cost time.
    cmd += ["-q", "--tb=line", "-o", "junit_family=xunit1", f"--junitxml={report}"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode in (0, 1) and report.exists(), (
        f"the run did not complete (status {proc.returncode}):\n{tail}"
    )
    # The kernels no CPU case can run (CUDA C) are named in the run's summary.
    cuda_only = ", ".join(k.name for k in SOFTMAX_KERNELS.values() if not (k.baseline or k.interpretable))
    assert f"verified on CUDA only: {cuda_only}\n" in proc.stdout, tail
    return parse_junit(report, (*CORRECT, *NOT_RESCALED, *corpus)), tail


def caught_by(tests) -> dict:
    """{test function: how many of its cases failed}."""
    counts: dict = {}
    for name in tests:
        function = name.split("[")[0]
        counts[function] = counts.get(function, 0) + 1
    return counts


@on_cpu
def test_a_kernel_added_as_the_readme_says_passes_every_registry_wide_case(verdicts):
    results, tail = verdicts
    for kernel in CORRECT:
        got = results[kernel]
        assert not got["failed"], f"{kernel} failed {got['failed'][:5]}\n{tail}"
        assert not got["skipped"], f"{kernel} was skipped in {got['skipped'][:5]}"
        assert got["passed"], f"no case ran {kernel}: it was not registered\n{tail}"
    # Every path x layout x dtype cell: 2 paths, and 1, under 6 + 10 + 10 layouts.
    cells = {k: sum(n.startswith("test_cpu_path_under_layout[") for n in results[k]["passed"]) for k in CORRECT}
    assert cells == {"toy_online": 52, "toy_online_row": 26}, cells
    for needed in ("test_cpu_path_batch_invariant", "test_cpu_path_edges", "test_cpu_public_entry_long_rows"):
        assert any(n.startswith(needed) for n in results["toy_online"]["passed"]), needed


@on_cpu
def test_the_same_kernel_without_the_rescale_fails(verdicts):
    results, tail = verdicts
    for kernel in NOT_RESCALED:
        assert results[kernel]["failed"], f"{kernel} (running sum not rescaled) passed everything\n{tail}"
    # Two paths forced onto tiles of 16: the layout cells see it. One path at its own tile of
    # 256: only rows several tiles long do.
    assert "test_cpu_path_under_layout" in caught_by(results["toy_norescale"]["failed"])
    assert "test_cpu_public_entry_long_rows_and_one_column" in caught_by(results["toy_norescale_row"]["failed"])
    print()
    for kernel in NOT_RESCALED:
        print(f"  {kernel}: caught by {caught_by(results[kernel]['failed'])}")


@on_cpu
def test_every_broken_kernel_is_rejected(verdicts):
    from tests import broken_kernels

    results, tail = verdicts
    lines, missed = [], []
    for spec in broken_kernels.CORPUS:
        got = results[spec.name]
        assert got["passed"] or got["failed"], f"no case ran {spec.name}: it was not registered\n{tail}"
        caught = caught_by(got["failed"])
        lines.append(f"  {spec.name}: caught by {caught or 'nothing on the CPU'}")
        if spec.name in broken_kernels.CUDA_ONLY:
            continue  # wrong only past sizes the interpreter can run: test_cuda_rejects_the_cuda_only_ones
        if not caught:
            missed.append(spec.name)
        for expected in broken_kernels.CAUGHT_BY[spec.name]:
            assert expected in caught, f"{spec.name}: {expected} did not catch it (caught by {caught})"
    print("\n" + "\n".join(lines))
    assert not missed, f"broken kernels the CPU suite accepts: {missed}\n" + "\n".join(lines)


@on_cpu
def test_every_gaming_kernel_is_rejected_for_the_property_it_breaks(verdicts):
    """The corpus of tests/adversaries.py: each kernel that games a verifier fails the case
    meant for its class, with that property in the failure; the honest control passes all."""
    from tests import adversaries

    results, tail = verdicts
    for name in adversaries.HONEST:
        got = results[name]
        assert got["passed"] and not got["failed"], f"{name} (honest) failed {got['failed'][:5]}\n{tail}"
    lines = []
    for spec in adversaries.CORPUS:
        got = results[spec.name]
        assert got["passed"] or got["failed"], f"no case ran {spec.name}: it was not registered\n{tail}"
        caught = caught_by(got["failed"])
        lines.append(f"  {spec.name}: caught by {caught or 'nothing on the CPU'}")
        if spec.name in adversaries.HONEST or spec.name in adversaries.CUDA_ONLY:
            continue
        for expected in adversaries.CAUGHT_BY[spec.name]:
            assert expected in caught, f"{spec.name}: {expected} did not catch it (caught by {caught})"
    print("\n" + "\n".join(lines))


def cuda_caught_by() -> dict:
    """{kernel: (test file, cases)} of both corpora: what `pytest -m cuda` must reject."""
    from tests import adversaries, broken_kernels

    return {**broken_kernels.CUDA_CAUGHT_BY, **adversaries.CUDA_CAUGHT_BY}


@pytest.mark.cuda
@needs_triton
def test_cuda_rejects_the_cuda_only_ones_and_the_tail_faults():
    """The broken and gaming kernels no CPU case can catch, and the faults of the distribution's
    tail, are rejected by the registry-wide cuda cases (CUDA_CAUGHT_BY of each corpus): one child
    run per test file, on every case of that file that the kernels take."""
    expected_by_kernel = cuda_caught_by()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[EXTRA_KERNELS_ENV] = CORPORA
    by_file: dict[str, list[str]] = {}
    for name, (file, _) in expected_by_kernel.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        cmd = [sys.executable, "-m", "pytest", f"tests/{file}", "-m", "cuda", "-k", " or ".join(names)]
        cmd += ["-p", "no:xdist", "-p", "no:cacheprovider", "--no-reports", "-q", "-rf", "--tb=no"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
        assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
        for name in names:
            for expected in expected_by_kernel[name][1]:
                assert re.search(rf"FAILED \S+::{expected}\[{name}-", proc.stdout), (expected, proc.stdout[-3000:])
