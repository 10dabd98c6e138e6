"""`python -m model`: output formats and clean failures. The cases call the CLI's `main` in this
process; a real subprocess is kept where only a fresh interpreter shows the behaviour: the
module's entry point itself, and a CUDA device hidden before CUDA starts."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model.__main__ import main
from model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "model", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        check=False,
    )


def call_main(capsys, *args):
    """(exit status, stdout, stderr) of the CLI run in this process."""
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def _has_torch_port():
    return importlib.util.find_spec("model.torch_minigpt") is not None


@pytest.mark.cpu
def test_entry_point_prints_five_past_forms():
    r = run_cli("Yesterday I")
    assert r.returncode == 0, r.stderr
    lines = [ln.split() for ln in r.stdout.splitlines()[1:]]
    assert len(lines) == 5
    tok = Tokenizer.load()
    probs = [float(p) for _, p in lines]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0
    assert all(tok.verb_form(w) == "past" for w, _ in lines)


@pytest.mark.cpu
def test_json_output(capsys):
    status, out, err = call_main(capsys, "Tomorrow I will", "--json", "--top", "3")
    assert status == 0, err
    data = json.loads(out)
    assert data["prompt"] == "Tomorrow I will" and data["backend"] == "numpy" and data["device"] == "cpu"
    assert len(data["top"]) == 3
    tok = Tokenizer.load()
    assert all(tok.verb_form(t["token"]) == "base" for t in data["top"])
    probs = [t["prob"] for t in data["top"]]
    assert probs == sorted(probs, reverse=True) and all(0 < p <= 1 for p in probs)


@pytest.mark.cpu
def test_the_top_words_are_the_models_most_likely(capsys):
    from model.__main__ import next_token_probs

    tok, probs = next_token_probs("Yesterday I")
    status, out, err = call_main(capsys, "Yesterday I", "--json")
    assert status == 0, err
    top = json.loads(out)["top"]
    assert [t["token"] for t in top] == [tok.id_to_token[i] for i in np.argsort(-probs, kind="stable")[:5]]
    assert top[0]["prob"] == pytest.approx(float(probs.max()), rel=1e-6)


@pytest.mark.cpu
@pytest.mark.parametrize(
    "args,message",
    [
        (["   "], "prompt is empty"),
        (["Yesterday I flibbered"], "unknown word 'flibbered'"),
        (["the dog " * 16], "context holds at most 31"),
        (["Yesterday I", "--device", "cuda"], "needs --backend torch"),
        (["Yesterday I", "--top", "0"], "--top must be at least 1"),
    ],
)
def test_errors_are_clean(capsys, args, message):
    # An exception escaping main would fail the test with its traceback; a clean failure is a
    # non-zero status, one message on stderr and nothing on stdout.
    status, out, err = call_main(capsys, *args)
    assert status != 0
    assert message in err
    assert "Traceback" not in err and out == ""


@pytest.mark.cpu
@pytest.mark.skipif(not _has_torch_port(), reason="model/torch_minigpt.py not present")
def test_torch_backend_agrees_with_numpy(capsys):
    status, out, err = call_main(capsys, "Every day she", "--json")
    assert status == 0, err
    a = json.loads(out)
    status, out, err = call_main(capsys, "Every day she", "--json", "--backend", "torch")
    assert status == 0, err
    b = json.loads(out)
    assert b["backend"] == "torch"
    assert [t["token"] for t in a["top"]] == [t["token"] for t in b["top"]]
    # Two printouts of the same model, NumPy and the PyTorch port: the port's equivalence
    # contract applies (tests/helpers/tolerances.py), not the kernels' TOLERANCES.
    from tests.helpers import PORT_ATOL, PORT_RTOL

    for x, y in zip(a["top"], b["top"], strict=True):
        assert abs(y["prob"] - x["prob"]) <= PORT_ATOL + PORT_RTOL * abs(x["prob"]), (x, y)


@pytest.mark.cpu
@pytest.mark.skipif(not _has_torch_port(), reason="model/torch_minigpt.py not present")
def test_cuda_without_a_gpu_is_a_clean_error():
    # CUDA_VISIBLE_DEVICES only hides a GPU from a process that has not started CUDA yet.
    r = run_cli("Yesterday I", "--backend", "torch", "--device", "cuda", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode != 0
    assert "no usable CUDA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not _has_torch_port(), reason="model/torch_minigpt.py not present")
def test_cuda_backend_runs(capsys):
    status, out, err = call_main(capsys, "Right now we are", "--json", "--backend", "torch", "--device", "cuda")
    assert status == 0, err
    data = json.loads(out)
    assert data["device"] == "cuda"
    tok = Tokenizer.load()
    assert all(tok.verb_form(t["token"]) == "ing" for t in data["top"])
