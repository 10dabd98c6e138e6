"""The MiniGPT's architecture, written once: the NumPy reference and the PyTorch port both read
it from here (the vocabulary size comes from the vocabulary, or from a weights file)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MiniGPTConfig:
    vocab_size: int = 0  # V: set from model/weights/vocab.json or the weights' tok_emb
    n_layer: int = 4  # L
    n_head: int = 4  # H
    d_model: int = 64  # d
    context: int = 32  # T_max: rows of pos_emb, the longest sequence the model accepts
    ln_eps: float = 1e-5  # LayerNorm epsilon (PyTorch's default is the same value)
    mlp_ratio: int = 4  # the feed-forward width is mlp_ratio * d

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def d_ff(self) -> int:
        return self.mlp_ratio * self.d_model

    def with_vocab(self, vocab_size: int) -> MiniGPTConfig:
        return replace(self, vocab_size=int(vocab_size))


# The architecture of the committed model.
ARCHITECTURE = MiniGPTConfig()
