"""Train the PyTorch port (GrammarMiniGPT) through our cross-entropy, on the NumPy trainer's
corpus, batches and schedule: the same initial weights (NumpyMiniGPT.init with the same seed,
loaded key for key), the same sentences drawn in the same order (model.train.next_batch), the
same loss (mean next-token cross-entropy over the non-padding positions: padding targets become
ignore_index), the same global-norm clipping and Adam (lr 3e-3, betas (0.9, 0.98), eps 1e-8,
linear warm-up then cosine decay: model.train.lr_at).

    python -m model.train_torch --device cuda [--steps N] [--log PATH] [--plot PATH --numpy-log PATH]

The loss is `kernels.ops.cross_entropy` (the Triton kernel as a custom op: loss and gradient in
one pass) with --loss triton, the default; on the CPU the kernel runs under TRITON_INTERPRET=1
(slow: a few seconds per step at batch 64). --loss torch uses F.cross_entropy (the reference).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model import grammar
from model.config import ARCHITECTURE
from model.numpy_minigpt import NumpyMiniGPT
from model.tokenizer import Tokenizer
from model.torch_minigpt import GrammarMiniGPT, load_numpy_arrays
from model.train import (
    DEFAULT_PLOT,
    encode_corpus,
    lr_at,
    next_batch,
    read_loss_log,
    save_loss_curve,
    tail_mean,
    write_loss_log,
)

LOSS_IMPLS = ("triton", "torch")
IGNORE_INDEX = -100
BETAS = (0.9, 0.98)
ADAM_EPS = 1e-8


def init_model(vocab_size: int, seed: int = 0, device="cpu") -> GrammarMiniGPT:
    """The NumPy trainer's initial weights (NumpyMiniGPT.init(vocab_size, seed)) in the port."""
    model = GrammarMiniGPT(ARCHITECTURE.with_vocab(vocab_size))
    load_numpy_arrays(model, NumpyMiniGPT.init(vocab_size, seed=seed).params, source=f"NumpyMiniGPT.init(seed={seed})")
    return model.to(device).train()


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, impl: str = "triton") -> torch.Tensor:
    """Mean cross-entropy of (rows, V) logits against (rows,) targets, IGNORE_INDEX skipped."""
    if impl == "triton":
        from kernels import ops

        return ops.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)[0]
    if impl == "torch":
        return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
    raise ValueError(f"loss must be one of {LOSS_IMPLS}, got {impl!r}")


def loss_and_grads(model: GrammarMiniGPT, ids, targets, mask, impl: str = "triton"):
    """The loss of one batch (NumPy arrays, as model.train.next_batch gives them) and, after
    backward, every parameter's gradient under its NumPy name: NumpyMiniGPT.loss_and_grads's
    counterpart."""
    device = next(model.parameters()).device
    ids_t = torch.as_tensor(ids, device=device)
    t = torch.as_tensor(np.where(mask > 0, targets, IGNORE_INDEX), device=device)
    logits = model.logits(ids_t)
    loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1), impl)
    model.zero_grad(set_to_none=True)
    loss.backward()
    params = dict(model.named_parameters())
    return loss.detach(), {name: params[own].grad for name, own in model.numpy_names().items()}


def clip_by_global_norm_(grads, clip: float) -> float:
    """Scale the gradients in place so that their global norm (summed in float64, as the NumPy
    trainer does) is at most `clip`; returns the norm before clipping."""
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    if norm > clip:
        for g in grads:
            g.mul_(clip / norm)
    return norm


def train(
    steps=1500,
    batch_size=64,
    seed=0,
    n_sentences=30000,
    lr=3e-3,
    warmup=60,
    clip=1.0,
    *,
    device="cpu",
    loss="triton",
    progress=True,
):
    """Returns (model, tokenizer, per-step losses): model.train.train's arguments and order."""
    if loss not in LOSS_IMPLS:
        raise ValueError(f"loss must be one of {LOSS_IMPLS}, got {loss!r}")
    tok = Tokenizer.from_grammar()
    inputs, targets, mask = encode_corpus(grammar.generate_corpus(n_sentences, seed=seed), tok)
    model = init_model(tok.vocab_size, seed=seed, device=device)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=BETAS, eps=ADAM_EPS)
    rng = np.random.default_rng(seed)
    losses = []
    bar = range(steps)
    if progress:
        from tqdm import tqdm

        bar = tqdm(bar, desc=f"train ({device}, {loss})", unit="step")
    for step in bar:
        value, grads = loss_and_grads(model, *next_batch(rng, inputs, targets, mask, batch_size), impl=loss)
        clip_by_global_norm_(list(grads.values()), clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        opt.step()
        losses.append(float(value))
        if progress:
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    return model.eval(), tok, losses


def numpy_logits(model: GrammarMiniGPT):
    """ids (NumPy, (B, T)) -> logits as a NumPy array: the port as model.train's helpers call a model."""
    device = next(model.parameters()).device

    def logits(ids):
        with torch.no_grad():
            return model.logits(torch.as_tensor(ids, device=device)).float().cpu().numpy()

    return logits


def next_word_probs(model: GrammarMiniGPT, tok: Tokenizer, prompt: str) -> torch.Tensor:
    """Probabilities of the word after `prompt` (float64 on the CPU)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[tok.bos_id] + tok.encode(prompt)], device=device)
    with torch.no_grad():
        return F.softmax(model.logits(ids)[0, -1].double(), dim=-1).cpu()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--loss", choices=LOSS_IMPLS, default="triton")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sentences", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log", type=Path, default=None, help="write the per-step losses here (JSON)")
    ap.add_argument("--plot", type=Path, default=None, help=f"draw both trainers' curves here (e.g. {DEFAULT_PLOT})")
    ap.add_argument("--numpy-log", type=Path, default=None, help="the NumPy trainer's loss log, for --plot")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    model, tok, losses = train(
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        n_sentences=args.sentences,
        lr=args.lr,
        device=args.device,
        loss=args.loss,
    )
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.1f} s; final loss {losses[-1]:.4f} (mean of last 50 steps {tail_mean(losses):.4f})")
    probs = next_word_probs(model, tok, "Yesterday I")
    top = torch.argsort(probs, descending=True)[:5].tolist()
    print("after 'Yesterday I':", ", ".join(f"{tok.id_to_token[i]} ({tok.verb_form(i)})" for i in top))
    if args.log:
        write_loss_log(args.log, losses, trainer=f"torch ({args.device}, {args.loss} loss)", wall_s=wall,
                       seed=args.seed, steps=args.steps, batch_size=args.batch_size, sentences=args.sentences,
                       lr=args.lr)  # fmt: skip
    if args.plot:
        curves = {}
        if args.numpy_log:
            curves["NumPy"] = read_loss_log(args.numpy_log)["losses"]
        curves[f"PyTorch, {args.loss} loss ({args.device})"] = losses
        save_loss_curve(None, args.plot, curves=curves, title="MiniGPT training loss: NumPy and PyTorch trainers")


if __name__ == "__main__":
    main()
