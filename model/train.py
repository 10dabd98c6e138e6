"""Train NumpyMiniGPT from scratch on the synthetic grammar (pure NumPy, Adam).

    python -m model.train [--steps N] [--batch-size B] [--seed S] [--log PATH]

Writes model/weights/minigpt.npz, model/weights/vocab.json and reports/loss_curve.png; with
--log, the per-step losses as JSON (reports/runs/numpy-train-losses.json is such a record of
the committed run, which the loss-curve figure draws beside the PyTorch trainer's).
One sentence per row: <bos> words ... <eos>, padded; padding is excluded from the loss.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

# The matrices here are small (64-256 wide): threaded BLAS gains little and, on a
# busy 2-core machine, loses a lot to contention. Only effective before NumPy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from model import grammar
from model.numpy_minigpt import CONTEXT, DEFAULT_WEIGHTS, NumpyMiniGPT
from model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PLOT = REPO / "reports" / "loss_curve.png"


def encode_corpus(sentences, tok: Tokenizer):
    """(inputs, targets, mask), each (N, L); row n predicts sentence n shifted by one."""
    seqs = [[tok.bos_id] + [tok.token_to_id[w] for w in s.tokens] + [tok.eos_id] for s in sentences]
    L = max(len(s) for s in seqs) - 1
    if L > CONTEXT:
        raise ValueError(f"a sentence needs {L} positions, the context holds {CONTEXT}")
    data = np.full((len(seqs), L + 1), tok.pad_id, dtype=np.int64)
    for n, s in enumerate(seqs):
        data[n, : len(s)] = s
    inputs, targets = data[:, :-1], data[:, 1:]
    mask = (targets != tok.pad_id).astype(np.float32)
    return inputs, targets, mask


def verb_form_accuracy(model: NumpyMiniGPT, tok: Tokenizer, sentences, batch_size=256, *, logits=None) -> float:
    """Fraction of labelled verb positions whose argmax prediction (given the words
    to the left) is a verb token of the required form. `logits` (ids -> NumPy logits) replaces
    model.logits, e.g. for the PyTorch port (model.train_torch.numpy_logits)."""
    inputs, _, _ = encode_corpus(sentences, tok)
    logits = model.logits if logits is None else logits
    hits = total = 0
    for lo in range(0, len(sentences), batch_size):
        pred = np.asarray(logits(inputs[lo : lo + batch_size])).argmax(axis=-1)  # (b, L)
        for n, s in enumerate(sentences[lo : lo + batch_size]):
            for pos, form in s.verb_positions:
                # input index pos holds the word before the verb (index 0 is <bos>)
                hits += tok.verb_form(int(pred[n, pos])) == form
                total += 1
    return hits / total


class Adam:
    def __init__(self, params, lr, betas=(0.9, 0.98), eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, betas[0], betas[1], eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads, lr):
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for k, g in grads.items():
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            params[k] -= (lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)).astype(params[k].dtype)


def next_batch(rng, inputs, targets, mask, batch_size):
    """(inputs, targets, mask) of the next batch: `batch_size` sentences drawn with replacement,
    padding columns that the whole batch shares trimmed. Every trainer draws its batches here."""
    idx = rng.integers(0, len(inputs), size=batch_size)
    L = int(mask[idx].sum(axis=1).max())
    return inputs[idx, :L], targets[idx, :L], mask[idx, :L]


def lr_at(step, steps, lr, warmup):
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(steps=1500, batch_size=64, seed=0, n_sentences=30000, lr=3e-3, warmup=60, clip=1.0, progress=True):
    """Returns (model, tokenizer, per-step losses). Same arguments -> identical weights."""
    tok = Tokenizer.from_grammar()
    inputs, targets, mask = encode_corpus(grammar.generate_corpus(n_sentences, seed=seed), tok)
    model = NumpyMiniGPT.init(tok.vocab_size, seed=seed)
    opt = Adam(model.params, lr)
    rng = np.random.default_rng(seed)
    losses = []
    bar = range(steps)
    if progress:
        from tqdm import tqdm

        bar = tqdm(bar, desc="train", unit="step")
    for step in bar:
        loss, grads = model.loss_and_grads(*next_batch(rng, inputs, targets, mask, batch_size))
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
        if norm > clip:
            grads = {k: g * np.float32(clip / norm) for k, g in grads.items()}
        opt.step(model.params, grads, lr_at(step, steps, lr, warmup))
        losses.append(loss)
        if progress:
            bar.set_postfix(loss=f"{loss:.4f}")
    return model, tok, losses


def write_loss_log(path, losses, *, trainer: str, wall_s: float, **settings) -> None:
    """The per-step losses of a run and how it was made, as JSON (a record for the figure)."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"trainer": trainer, **settings, "wall_s": round(float(wall_s), 1), "losses": [float(x) for x in losses]}
    path.write_text(json.dumps(record, indent=0) + "\n")


def read_loss_log(path) -> dict:
    import json

    return json.loads(Path(path).read_text())


def tail_mean(losses, n: int = 50) -> float:
    """The mean of the last n steps' losses: a run's final loss without one batch's noise."""
    return float(np.mean(losses[-n:]))


def save_loss_curve(losses, path, *, curves: dict | None = None, title: str = "NumpyMiniGPT training loss") -> None:
    """The loss per step and its running mean; `curves` ({label: losses}) replaces `losses` with
    several runs drawn together (e.g. the NumPy and the PyTorch trainer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    k = 20
    curves = curves or {"": losses}
    fig, ax = plt.subplots(figsize=(6, 4))
    top = 0.0
    for label, values in curves.items():
        smooth = np.convolve(values, np.ones(k) / k, mode="valid") if len(values) >= k else values
        x = np.arange(len(smooth)) + (len(values) - len(smooth))
        (line,) = ax.plot(values, alpha=0.25, label=f"{label} per step".strip())
        ax.plot(x, smooth, color=line.get_color(), label=f"{label} mean of {k}".strip())
        top = max(top, max(values))
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(0, top * 1.05)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sentences", type=int, default=30000, help="training corpus size")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    ap.add_argument("--log", type=Path, default=None, help="write the per-step losses here (JSON)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    model, tok, losses = train(
        steps=args.steps, batch_size=args.batch_size, seed=args.seed, n_sentences=args.sentences, lr=args.lr
    )
    wall = time.perf_counter() - t0
    model.save(args.weights)
    tok.save(args.weights.with_name("vocab.json"))
    save_loss_curve(losses, args.plot)
    if args.log:
        write_loss_log(
            args.log,
            losses,
            trainer="numpy",
            wall_s=wall,
            seed=args.seed,
            steps=args.steps,
            batch_size=args.batch_size,
            sentences=args.sentences,
            lr=args.lr,
        )
    held_out = grammar.generate_corpus(2000, seed=args.seed + 10_000)
    acc = verb_form_accuracy(model, tok, held_out)
    tail = losses[-50:]
    print(
        f"wall time {wall:.1f} s; final loss {losses[-1]:.4f} (mean of last {len(tail)} steps {tail_mean(losses):.4f})"
    )
    print(f"verb-form accuracy on {len(held_out)} held-out sentences: {acc:.4f}")
    print(f"weights -> {args.weights} ({args.weights.stat().st_size / 1e6:.2f} MB); loss curve -> {args.plot}")


if __name__ == "__main__":
    main()
