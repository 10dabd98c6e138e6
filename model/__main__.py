"""Show the likeliest next words after a prompt.

python -m model "Yesterday I" [--top K] [--json] [--backend numpy|torch] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


class CliError(Exception):
    """A user-facing error: printed on stderr, exit status 2, no traceback."""


def next_token_probs(prompt: str, backend: str = "numpy", device: str = "cpu"):
    """(tokenizer, probability vector over the vocabulary for the word after `prompt`)."""
    from model.numpy_minigpt import CONTEXT, WeightsError
    from model.tokenizer import Tokenizer, UnknownWordError

    if device == "cuda" and backend != "torch":
        raise CliError("--device cuda needs --backend torch (the NumPy backend runs on the CPU only)")
    if not prompt.strip():
        raise CliError('the prompt is empty; give a few words, e.g. "Yesterday I"')
    try:
        tok = Tokenizer.load()
        words = tok.encode(prompt)
    except (UnknownWordError, FileNotFoundError, ValueError) as e:
        raise CliError(str(e)) from None
    ids = [tok.bos_id] + words
    if len(ids) > CONTEXT:
        raise CliError(
            f"the prompt has {len(words)} words; the context holds at most {CONTEXT - 1} (plus the start token)"
        )

    try:
        if backend == "numpy":
            from model.numpy_minigpt import NumpyMiniGPT

            probs = NumpyMiniGPT.load()(np.array([ids]))[0, -1]
        else:
            probs = _torch_probs(ids, device)
    except WeightsError as e:
        raise CliError(str(e)) from None
    return tok, np.asarray(probs, dtype=np.float64)


def _torch_probs(ids, device):
    try:
        import torch

        from model.torch_minigpt import GrammarMiniGPT
    except ImportError as e:
        raise CliError(f"the torch backend is unavailable: {e}") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda requested but no usable CUDA GPU is available")
    model = GrammarMiniGPT.from_numpy().to(device)
    with torch.no_grad():
        probs = model(torch.tensor([ids], dtype=torch.long, device=device))
    return probs[0, -1].float().cpu().numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m model", description="Top next-word predictions.")
    ap.add_argument("prompt", help='the start of a sentence, e.g. "Yesterday I"')
    ap.add_argument("--top", type=int, default=5, metavar="K", help="how many words (default 5)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--backend", choices=["numpy", "torch"], default="numpy")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args(argv)

    try:
        if args.top < 1:
            raise CliError("--top must be at least 1")
        tok, probs = next_token_probs(args.prompt, args.backend, args.device)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    k = min(args.top, len(probs))
    order = np.argsort(-probs, kind="stable")[:k]
    top = [{"token": tok.id_to_token[i], "prob": float(probs[i])} for i in order]
    if args.json:
        print(json.dumps({"prompt": args.prompt, "backend": args.backend, "device": args.device, "top": top}))
    else:
        print(f"{args.prompt!r} ->")
        for t in top:
            print(f"  {t['token']:<14} {t['prob']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
