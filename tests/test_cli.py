"""`python -m model`: output formats and clean failures, through a real subprocess."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "model", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=full_env)


def _has_torch_port():
    return importlib.util.find_spec("model.torch_minigpt") is not None


@pytest.mark.cpu
def test_default_prints_five_past_forms():
    r = run_cli("Yesterday I")
    assert r.returncode == 0, r.stderr
    lines = [ln.split() for ln in r.stdout.splitlines()[1:]]
    assert len(lines) == 5
    tok = Tokenizer.load()
    probs = [float(p) for _, p in lines]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0
    assert all(tok.verb_form(w) == "past" for w, _ in lines)


@pytest.mark.cpu
def test_json_output():
    r = run_cli("Tomorrow I will", "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["prompt"] == "Tomorrow I will" and data["backend"] == "numpy" and data["device"] == "cpu"
    assert len(data["top"]) == 3
    tok = Tokenizer.load()
    assert all(tok.verb_form(t["token"]) == "base" for t in data["top"])
    probs = [t["prob"] for t in data["top"]]
    assert probs == sorted(probs, reverse=True) and all(0 < p <= 1 for p in probs)


@pytest.mark.cpu
@pytest.mark.parametrize("args,message", [
    (["   "], "prompt is empty"),
    (["Yesterday I flibbered"], "unknown word 'flibbered'"),
    (["the dog " * 16], "context holds at most 31"),
    (["Yesterday I", "--device", "cuda"], "needs --backend torch"),
    (["Yesterday I", "--top", "0"], "--top must be at least 1"),
])
def test_errors_are_clean(args, message):
    r = run_cli(*args)
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.cpu
@pytest.mark.skipif(not _has_torch_port(), reason="model/torch_minigpt.py not present")
def test_torch_backend_agrees_with_numpy():
    a = json.loads(run_cli("Every day she", "--json").stdout)
    r = run_cli("Every day she", "--json", "--backend", "torch")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["backend"] == "torch"
    assert [t["token"] for t in a["top"]] == [t["token"] for t in b["top"]]
    for x, y in zip(a["top"], b["top"]):
        assert y["prob"] == pytest.approx(x["prob"], rel=1e-4, abs=1e-6)


@pytest.mark.cpu
@pytest.mark.skipif(not _has_torch_port(), reason="model/torch_minigpt.py not present")
def test_cuda_without_a_gpu_is_a_clean_error():
    r = run_cli("Yesterday I", "--backend", "torch", "--device", "cuda", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode != 0
    assert "no usable CUDA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not _has_torch_port(), reason="model/torch_minigpt.py not present")
def test_cuda_backend_runs():
    r = run_cli("Right now we are", "--json", "--backend", "torch", "--device", "cuda")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["device"] == "cuda"
    tok = Tokenizer.load()
    assert all(tok.verb_form(t["token"]) == "ing" for t in data["top"])
