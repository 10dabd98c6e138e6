"""Training loop: determinism, a smoke run whose loss falls, the optimiser, and the CLI outputs."""

import itertools

import numpy as np
import pytest

from model import train as tr
from model.numpy_minigpt import NumpyMiniGPT
from model.tokenizer import Tokenizer

pytestmark = pytest.mark.cpu


def test_training_is_deterministic():
    kw = {"steps": 4, "batch_size": 8, "n_sentences": 200, "progress": False}
    a, _, la = tr.train(seed=3, **kw)
    b, _, lb = tr.train(seed=3, **kw)
    c, _, _ = tr.train(seed=4, **kw)
    assert la == lb
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in a.params)


def test_smoke_run_loss_goes_down():
    _, _, losses = tr.train(steps=40, batch_size=16, n_sentences=300, seed=0, progress=False)
    assert all(np.isfinite(losses))
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < first - 1.0, (first, last)


def test_adam_matches_the_update_rule():
    rng = np.random.default_rng(0)
    p = {"w": rng.normal(size=(3, 2)).astype(np.float32)}
    g1, g2 = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    w0 = p["w"].astype(np.float64).copy()
    opt = tr.Adam(p, lr=0.1, betas=(0.9, 0.98), eps=1e-8)
    opt.step(p, {"w": g1.astype(np.float32)}, 0.1)
    opt.step(p, {"w": g2.astype(np.float32)}, 0.05)
    m = 0.9 * (0.1 * g1) + 0.1 * g2
    v = 0.98 * (0.02 * g1**2) + 0.02 * g2**2
    # the first step moves every weight by exactly lr in the sign of its gradient
    expected = w0 - 0.1 * np.sign(g1) - 0.05 * (m / (1 - 0.9**2)) / (np.sqrt(v / (1 - 0.98**2)) + 1e-8)
    np.testing.assert_allclose(p["w"], expected, rtol=1e-5, atol=1e-6)


def test_lr_schedule():
    lrs = [tr.lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01) and lrs[-1] > 0.1
    # Every step: linear warmup, then the cosine from the peak toward 10 % of it over the rest.
    for s, got in enumerate(lrs):
        want = (s + 1) / 10 if s < 10 else 0.1 + 0.45 * (1 + np.cos(np.pi * (s - 10) / 90))
        assert got == pytest.approx(want, rel=1e-12), s


def test_the_corpus_masks_exactly_the_padding():
    tok = Tokenizer.from_grammar()
    sentences = tr.grammar.generate_corpus(6, seed=2)
    inputs, targets, mask = tr.encode_corpus(sentences, tok)
    assert len({len(s.tokens) for s in sentences}) > 1, "sentences of one length test no padding"
    np.testing.assert_array_equal(mask, (targets != tok.pad_id).astype(np.float32))
    # Each row predicts its words and the end of the sentence, then only padding.
    assert mask.sum(axis=1).tolist() == [len(s.tokens) + 1 for s in sentences]
    for row, s in zip(mask, sentences, strict=True):
        assert row[: len(s.tokens) + 1].all() and not row[len(s.tokens) + 1 :].any()
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])


def test_a_batch_trims_only_the_padding_every_row_shares():
    tok = Tokenizer.from_grammar()
    inputs, targets, mask = tr.encode_corpus(tr.grammar.generate_corpus(50, seed=3), tok)
    for seed in range(5):
        idx = np.random.default_rng(seed).integers(0, len(inputs), size=8)
        _, t, m = tr.next_batch(np.random.default_rng(seed), inputs, targets, mask, 8)
        assert m.sum() == mask[idx].sum(), "a target of the batch was trimmed away"
        assert m[:, -1].any(), "a column of padding only was kept"
        np.testing.assert_array_equal(t, targets[idx, : t.shape[1]])


def test_verb_form_accuracy_counts_positions():
    tok = Tokenizer.from_grammar()
    sentences = tr.grammar.generate_corpus(20, seed=5)
    untrained = NumpyMiniGPT.init(tok.vocab_size, seed=0)
    acc = tr.verb_form_accuracy(untrained, tok, sentences)
    assert 0.0 <= acc < 0.5  # an untrained model is not right by chance


def test_cli_writes_outputs(tmp_path, capsys):
    weights, plot = tmp_path / "w" / "minigpt.npz", tmp_path / "loss.png"
    tr.main(["--steps", "3", "--batch-size", "4", "--sentences", "50", "--weights", str(weights), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert "wall time" in out and "final loss" in out and "verb-form accuracy" in out
    model = NumpyMiniGPT.load(weights)
    assert model.vocab_size == Tokenizer.load(weights.with_name("vocab.json")).vocab_size
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
