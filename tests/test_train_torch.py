"""The PyTorch trainer (model/train_torch.py) against the NumPy trainer (model/train.py): the
same initial weights, batches and schedule give the same losses and gradients on the CPU, and on
the GPU, through the Triton cross-entropy, training reaches the NumPy run's final loss with the
tenses right.

Tolerances (fp32 CPU, one thread, measured on seeds 0-2): the first step's loss agrees to 2e-7
relative and every parameter's gradient to 7e-7 of that parameter's largest gradient entry; the
tests allow 1e-6 and 1e-5. The differences are the last bits of matrix products summed in other
orders by OpenBLAS and PyTorch's BLAS (README: the port), carried through the backward. After
three steps the losses still agree to 3e-7, but the weights less closely: Adam's first steps move
every weight by about lr * sign(gradient), so a gradient near zero whose sign the two orderings
disagree on moves that weight apart by up to 2 lr; the next gradients then agree to 1.4e-5 of
each parameter's largest entry (the test allows 1e-4).
"""

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from model import grammar, train_torch
from model import train as numpy_trainer
from model.numpy_minigpt import NumpyMiniGPT
from model.tokenizer import Tokenizer
from tests.helpers import INTERPRETED, needs_triton
from tests.suite import manifest

REPO = Path(__file__).resolve().parents[1]
NUMPY_LOG = REPO / "reports" / "runs" / "numpy-train-losses.json"
LOSS_RTOL = 1e-6
GRAD_TOL = 1e-5  # of each parameter's largest |gradient|
GRAD_TOL_AFTER_STEPS = 1e-4  # after three Adam steps (see the module's docstring)
FINAL_LOSS_TOLERANCE = 0.02  # nats: the bound on the GPU run's final loss
TRAIN_SECONDS = 300  # the whole 1500-step GPU run, generous: ~10-30 s expected on an H200


def _first_batch(seed, n_sentences=300, batch_size=8):
    tok = Tokenizer.from_grammar()
    inputs, targets, mask = numpy_trainer.encode_corpus(grammar.generate_corpus(n_sentences, seed=seed), tok)
    batch = numpy_trainer.next_batch(np.random.default_rng(seed), inputs, targets, mask, batch_size)
    return tok, batch


def _compare_step(tok, batch, seed, impl):
    loss_np, grads_np = NumpyMiniGPT.init(tok.vocab_size, seed=seed).loss_and_grads(*batch)
    model = train_torch.init_model(tok.vocab_size, seed=seed)
    loss_t, grads_t = train_torch.loss_and_grads(model, *batch, impl=impl)
    assert float(loss_t) == pytest.approx(loss_np, rel=LOSS_RTOL), (float(loss_t), loss_np)
    assert grads_t.keys() == grads_np.keys()
    for name, g in grads_np.items():
        err = float(np.abs(grads_t[name].numpy() - g).max())
        scale = float(np.abs(g).max())
        assert err <= GRAD_TOL * scale + 1e-12, f"{name}: max error {err:.3g}, largest gradient {scale:.3g}"


@pytest.mark.cpu
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_first_step_loss_and_every_gradient_match_numpy(one_thread, seed):
    tok, batch = _first_batch(seed)
    _compare_step(tok, batch, seed, "torch")


@pytest.mark.cpu
@needs_triton
@pytest.mark.skipif(not INTERPRETED, reason="the Triton loss runs on CPU tensors only interpreted")
def test_first_step_through_the_triton_loss_matches_numpy(one_thread):
    # One sentence: the interpreter runs one program per token row.
    tok, batch = _first_batch(0, batch_size=1)
    _compare_step(tok, batch, 0, "triton")


@pytest.mark.cpu
@needs_triton
@pytest.mark.skipif(not INTERPRETED, reason="the Triton loss runs on CPU tensors only interpreted")
def test_the_triton_loss_skips_padding_as_pytorchs_does():
    # A batch's padded positions (IGNORE_INDEX) count in neither the mean nor its gradient.
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 37, generator=g).requires_grad_(True)
    t = torch.randint(0, 37, (8,), generator=g)
    t[[2, 5, 6]] = train_torch.IGNORE_INDEX
    got = {}
    for impl in ("triton", "torch"):
        logits.grad = None
        loss = train_torch.cross_entropy(logits, t, impl)
        loss.backward()
        got[impl] = (loss.detach(), logits.grad.clone())
    torch.testing.assert_close(got["triton"][0], got["torch"][0], rtol=1e-6, atol=0.0)
    torch.testing.assert_close(got["triton"][1], got["torch"][1], rtol=1e-5, atol=1e-7)
    assert not got["triton"][1][[2, 5, 6]].any()


@pytest.mark.cpu
def test_the_trainer_takes_the_triton_loss_by_default(monkeypatch):
    seen = {}

    def fake_train(**kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(train_torch, "train", fake_train)
    with pytest.raises(SystemExit):
        train_torch.main(["--steps", "1"])
    assert seen["loss"] == "triton"


@pytest.mark.cpu
@pytest.mark.parametrize("seed", [0, 2])
def test_first_steps_losses_and_the_next_gradients_match_numpy(one_thread, seed):
    """Three training steps of each trainer, then both models' gradients on the fourth batch."""
    kw = {"steps": 3, "batch_size": 8, "n_sentences": 300, "seed": seed, "progress": False}
    model_np, tok, losses_np = numpy_trainer.train(**kw)
    model_t, _, losses_t = train_torch.train(loss="torch", **kw)
    np.testing.assert_allclose(losses_t, losses_np, rtol=LOSS_RTOL)
    inputs, targets, mask = numpy_trainer.encode_corpus(grammar.generate_corpus(300, seed=seed), tok)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        numpy_trainer.next_batch(rng, inputs, targets, mask, 8)
    batch = numpy_trainer.next_batch(rng, inputs, targets, mask, 8)
    loss_np, grads_np = model_np.loss_and_grads(*batch)
    loss_t, grads_t = train_torch.loss_and_grads(model_t.train(), *batch, impl="torch")
    assert float(loss_t) == pytest.approx(loss_np, rel=LOSS_RTOL)
    for name, g in grads_np.items():
        err = float(np.abs(grads_t[name].numpy() - g).max())
        scale = float(np.abs(g).max())
        assert err <= GRAD_TOL_AFTER_STEPS * scale, f"{name}: max error {err:.3g}, largest gradient {scale:.3g}"


@pytest.mark.cpu
def test_cli_writes_the_log_and_the_two_trainer_figure(tmp_path, capsys):
    numpy_log = tmp_path / "numpy.json"
    numpy_trainer.write_loss_log(numpy_log, [5.0, 4.0, 3.5], trainer="numpy", wall_s=1.0)
    log, plot = tmp_path / "torch.json", tmp_path / "curve.png"
    train_torch.main(
        ["--device", "cpu", "--loss", "torch", "--steps", "3", "--batch-size", "4", "--sentences", "50",
         "--log", str(log), "--plot", str(plot), "--numpy-log", str(numpy_log)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "final loss" in out and "Yesterday I" in out
    record = json.loads(log.read_text())
    assert record["trainer"].startswith("torch") and len(record["losses"]) == 3
    assert all(math.isfinite(x) for x in record["losses"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.cpu
def test_the_committed_numpy_log_is_the_committed_run():
    """The recorded NumPy run the GPU test compares with (`python -m model.train --log ...` on this
    project's 2-core CPU): 1500 steps from seed 0, ending at the README's 2.13 nats."""
    record = numpy_trainer.read_loss_log(NUMPY_LOG)
    assert record["trainer"] == "numpy" and record["seed"] == 0 and record["steps"] == len(record["losses"]) == 1500
    assert numpy_trainer.tail_mean(record["losses"]) == pytest.approx(2.13, abs=0.02)
    assert record["losses"][-1] == pytest.approx(2.13, abs=0.01)  # the README's final loss


@pytest.mark.cuda
def test_gpu_training_through_the_triton_loss_reaches_the_numpy_loss(pytestconfig, record_manifest):
    """1500 steps of batch 64 on the GPU with the Triton cross-entropy (the defaults of
    `python -m model.train_torch`): the mean loss of the last 50 steps within 0.02 nats of the
    NumPy run's, the five likeliest words after "Yesterday I" all past simple, the verb form right
    at >= 98% of held-out verb positions, in under TRAIN_SECONDS."""
    torch.backends.cuda.matmul.allow_tf32 = False
    numpy_losses = numpy_trainer.read_loss_log(NUMPY_LOG)["losses"]
    start = time.perf_counter()
    model, tok, losses = train_torch.train(device="cuda", loss="triton", progress=False)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    final, numpy_final = numpy_trainer.tail_mean(losses), numpy_trainer.tail_mean(numpy_losses)
    probs = train_torch.next_word_probs(model, tok, "Yesterday I")
    top = torch.argsort(probs, descending=True)[:5].tolist()
    forms = [tok.verb_form(i) for i in top]
    held_out = grammar.generate_corpus(2000, seed=10_000)
    accuracy = numpy_trainer.verb_form_accuracy(None, tok, held_out, logits=train_torch.numpy_logits(model))
    record_manifest(
        "torch_training",
        final_loss_mean_of_last_50=final,
        numpy_final_loss_mean_of_last_50=numpy_final,
        wall_s=wall,
        steps=len(losses),
        yesterday_top5=[tok.id_to_token[i] for i in top],
        verb_form_accuracy=accuracy,
        loss="triton cross-entropy (kernels.ops.cross_entropy)",
    )
    reports = manifest.reports_destination(pytestconfig)
    if reports is not None:
        gpu = torch.cuda.get_device_name()
        numpy_trainer.write_loss_log(
            reports / "runs" / "torch-train-losses.json",
            losses,
            trainer=f"torch ({gpu}, triton loss)",
            wall_s=wall,
            seed=0,
            steps=len(losses),
            batch_size=64,
            sentences=30000,
            lr=3e-3,
        )
        numpy_trainer.save_loss_curve(
            None,
            reports / "loss_curve.png",
            curves={"NumPy (CPU)": numpy_losses, f"PyTorch + Triton cross-entropy ({gpu})": losses},
            title="MiniGPT training loss: NumPy and PyTorch trainers",
        )
    assert abs(final - numpy_final) <= FINAL_LOSS_TOLERANCE, (final, numpy_final)
    assert forms == ["past"] * 5, [(tok.id_to_token[i], f) for i, f in zip(top, forms, strict=True)]
    assert accuracy >= 0.98
    assert wall < TRAIN_SECONDS, f"training took {wall:.0f} s"
