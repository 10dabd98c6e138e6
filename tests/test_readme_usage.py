"""README.md's Python snippet (Quick start) runs as printed: here on CPU tensors under the
Triton interpreter, which conftest.py switches on when no GPU is visible."""

import re
from pathlib import Path

import pytest

from tests.helpers import needs_triton

pytestmark = [pytest.mark.cpu, needs_triton]

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "Quick start should show one python block"
    return blocks[0]


def test_the_readme_snippet_runs_and_gives_what_it_says(capsys):
    import torch
    import torch.nn.functional as F

    names: dict = {}
    exec(compile(quick_start_snippet(), str(README), "exec"), names)
    x, probs, logits, targets = names["x"], names["probs"], names["logits"], names["targets"]
    expected = F.softmax(x.double(), dim=-1)
    assert probs.shape == x.shape and probs.dtype == torch.float32
    torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-5)
    reference = F.cross_entropy(x.double(), targets)
    assert names["loss"].item() == pytest.approx(reference.item(), rel=1e-5)
    torch.testing.assert_close(names["lse"].double(), torch.logsumexp(x.double(), dim=-1), atol=1e-5, rtol=1e-5)
    onehot = F.one_hot(targets, x.shape[1]).double()
    torch.testing.assert_close(logits.grad.double(), (expected - onehot) / x.shape[0], atol=1e-6, rtol=1e-4)
    assert names["softmax"].plan(8, 1000, torch.float32) in capsys.readouterr().out
