"""GrammarMiniGPT in PyTorch: a faithful port of the NumPy MiniGPT (model/numpy_minigpt.py).

Read top to bottom: config, the last softmax, attention (explicit and nn.MultiheadAttention),
MLP, Block, the model, then loading the NumPy weights.

Every parameter has the same name and the same (out, in) layout as in the NumPy weights file,
so loading is a key-for-key copy with no transposes. The one exception is the
nn.MultiheadAttention variant, whose attention weights live under the names PyTorch gives
them; `MHACausalSelfAttention.NUMPY_NAMES` maps those explicitly.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ARCHITECTURE, MiniGPTConfig
from .numpy_minigpt import DEFAULT_WEIGHTS, WeightsError

# -- the last softmax -------------------------------------------------------------------------

SOFTMAX_IMPLS = ("auto", "torch", "triton")


LM_HEAD_KERNEL = "triton"  # the registry's kernel the LM head runs on CUDA


def final_softmax(logits: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Softmax over the vocabulary; the only place the model turns logits into probabilities.

    "auto" runs the registry's LM_HEAD_KERNEL on CUDA tensors and F.softmax elsewhere; "torch"
    forces F.softmax (the reference when swapping kernels on a GPU); "triton" forces the kernel.
    Under torch.compile the kernel is called as its custom op, which the compiler traces
    without a graph break (and CUDA graphs capture).
    """
    if impl not in SOFTMAX_IMPLS:
        raise ValueError(f"softmax impl must be one of {SOFTMAX_IMPLS}, got {impl!r}")
    if impl == "torch" or (impl == "auto" and not logits.is_cuda):
        return F.softmax(logits, dim=-1)
    V = logits.shape[-1]
    # The kernel takes a (rows, V) matrix with unit column stride; reshape copies only when it must.
    rows = logits.reshape(-1, V)  # (B*T, V)
    if torch.compiler.is_compiling():
        import kernels.ops  # noqa: F401  (registers torch.ops.softmax_suite)

        return getattr(torch.ops.softmax_suite, LM_HEAD_KERNEL)(rows).view(logits.shape)
    from kernels import SOFTMAX_KERNELS  # here, so that the CPU path never imports a kernel backend

    return SOFTMAX_KERNELS[LM_HEAD_KERNEL](rows).view(logits.shape)  # (B, T, V)


# -- attention --------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out: one qkv projection, scores, mask, softmax."""

    NUMPY_NAMES: dict[str, str] = {}  # parameter names already equal the NumPy ones

    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.d_head = config.d_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)  # rows: q, k, v; heads in order
        self.proj = nn.Linear(config.d_model, config.d_model)
        # True above the diagonal = a future position, hidden from the query.
        future = torch.triu(torch.ones(config.context, config.context, dtype=torch.bool), diagonal=1)
        self.register_buffer("future", future, persistent=False)  # not a weight: kept out of state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)  # 3 x (B, T, d)
        q = q.view(B, T, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, dh)
        k = k.view(B, T, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, dh)
        v = v.view(B, T, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, dh)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # (B, H, T, T)
        scores = scores.masked_fill(self.future[:T, :T], float("-inf"))
        weights = F.softmax(scores, dim=-1)  # (B, H, T, T)
        heads = weights @ v  # (B, H, T, dh)
        heads = heads.transpose(1, 2).contiguous().view(B, T, d)  # (B, T, H*dh): heads concatenated
        return self.proj(heads)


class MHACausalSelfAttention(nn.Module):
    """The same attention through nn.MultiheadAttention, on the same weights.

    nn.MultiheadAttention packs its input projection as one (3d, d) matrix with rows q, k, v and
    splits each into heads in order, exactly the layout of `qkv`, so the weights copy unchanged.
    """

    NUMPY_NAMES = {  # NumPy name -> name inside this module
        "qkv.weight": "mha.in_proj_weight",
        "qkv.bias": "mha.in_proj_bias",
        "proj.weight": "mha.out_proj.weight",
        "proj.bias": "mha.out_proj.bias",
    }

    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.mha = nn.MultiheadAttention(config.d_model, config.n_head, bias=True, batch_first=True)
        future = torch.triu(torch.ones(config.context, config.context, dtype=torch.bool), diagonal=1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        out, _ = self.mha(x, x, x, attn_mask=self.future[:T, :T], need_weights=False, is_causal=True)
        return out  # (B, T, d)


ATTENTIONS = {"explicit": CausalSelfAttention, "mha": MHACausalSelfAttention}


# -- MLP, Block -------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_ff)
        self.gelu = nn.GELU(approximate="tanh")  # the NumPy model uses the tanh form too
        self.proj = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.gelu(self.fc(x)))


def _keep(trace: dict | None, key: str, value: torch.Tensor) -> torch.Tensor:
    """Store an intermediate under `key` when tracing; the value passes through unchanged."""
    if trace is not None:
        trace[key] = value.detach()
    return value


class Block(nn.Module):
    def __init__(self, config: MiniGPTConfig, index: int, attention: str):
        super().__init__()
        self.name = f"blocks.{index}"  # prefix of this block's trace keys
        self.ln1 = nn.LayerNorm(config.d_model, eps=config.ln_eps)
        self.attn = ATTENTIONS[attention](config)
        self.ln2 = nn.LayerNorm(config.d_model, eps=config.ln_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
        x = x + _keep(trace, f"{self.name}.attn", self.attn(self.ln1(x)))
        x = x + _keep(trace, f"{self.name}.mlp", self.mlp(self.ln2(x)))
        return x


# -- the model --------------------------------------------------------------------------------


class GrammarMiniGPT(nn.Module):
    """Decoder-only transformer: ids (B, T) -> next-token probabilities (B, T, V).

    attention: "explicit" (CausalSelfAttention) or "mha" (nn.MultiheadAttention).
    softmax_impl: how `forward` turns logits into probabilities, see `final_softmax`.
    """

    def __init__(self, config: MiniGPTConfig, *, attention: str = "explicit", softmax_impl: str = "auto"):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {tuple(ATTENTIONS)}, got {attention!r}")
        if config.d_model % config.n_head:
            raise ValueError(f"d_model={config.d_model} is not divisible by n_head={config.n_head}")
        if softmax_impl not in SOFTMAX_IMPLS:
            raise ValueError(f"softmax_impl must be one of {SOFTMAX_IMPLS}, got {softmax_impl!r}")
        self.config = config
        self.attention = attention
        self.softmax_impl = softmax_impl
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i, attention) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.ln_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)  # untied from tok_emb

    def check_ids(self, ids) -> None:
        """Reject what the embedding lookup would mishandle or reject obscurely, before indexing."""
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be an int64 (or int32) tensor of token ids, got dtype {ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (B, T), got a {ids.dim()}-D tensor of shape {tuple(ids.shape)}")
        T = ids.shape[1]
        if T == 0:
            raise ValueError("ids is an empty sequence (T = 0)")
        if T > self.config.context:
            raise ValueError(f"sequence length T={T} exceeds the context of {self.config.context} tokens")
        V = self.config.vocab_size
        if torch.compiler.is_compiling():
            # A traced graph cannot branch on tensor values; keep the range check inside it.
            torch._assert_async(((ids >= 0) & (ids < V)).all(), "token id out of range")
            return
        # One reduction and one read back (on a GPU: a single synchronisation, not two).
        lo, hi = torch.aminmax(ids)
        lo, hi = torch.stack((lo, hi)).tolist()
        if lo < 0 or hi >= V:
            raise ValueError(f"token ids must lie in [0, {V}), got values in [{lo}, {hi}]")

    def logits(self, ids: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
        """Logits (B, T, V). With a dict as `trace`, also store every intermediate under the
        NumPy model's keys: embed, blocks.{i}.attn, blocks.{i}.mlp, blocks.{i}, ln_f, logits."""
        self.check_ids(ids)
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)  # (T,)
        x = _keep(trace, "embed", self.tok_emb(ids) + self.pos_emb(positions))  # (B, T, d)
        for block in self.blocks:
            x = _keep(trace, block.name, block(x, trace))
        x = _keep(trace, "ln_f", self.ln_f(x))
        return _keep(trace, "logits", self.lm_head(x))  # (B, T, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return final_softmax(self.logits(ids), self.softmax_impl)

    def numpy_names(self) -> dict[str, str]:
        """NumPy parameter name -> this module's state_dict key, for every parameter."""
        names = {key: key for key in self.state_dict()}
        for block in self.blocks:
            prefix = f"{block.name}.attn."
            for numpy_name, own_name in block.attn.NUMPY_NAMES.items():
                del names[prefix + own_name]
                names[prefix + numpy_name] = prefix + own_name
        return names

    @classmethod
    def from_numpy(cls, path=None, *, attention: str = "explicit", softmax_impl: str = "auto") -> GrammarMiniGPT:
        """The trained NumPy weights (default: the NumPy model's file) in an eval-mode CPU module."""
        path = DEFAULT_WEIGHTS if path is None else Path(path)
        arrays = _read_npz(path)
        if "tok_emb.weight" not in arrays or arrays["tok_emb.weight"].ndim != 2:
            raise WeightMismatchError(f"{path}: no 2-D tok_emb.weight to read the vocabulary size from")
        model = cls(
            ARCHITECTURE.with_vocab(arrays["tok_emb.weight"].shape[0]), attention=attention, softmax_impl=softmax_impl
        )
        _copy_arrays(model, arrays, source=str(path))
        return model.eval()


# -- loading the NumPy weights ----------------------------------------------------------------


class WeightMismatchError(WeightsError):
    """The weights file does not fit the module: names the missing, extra and misshapen parameters.
    A WeightsError (a ValueError), like the NumPy model's own loading errors."""


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise WeightsError(f"weights file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:  # no pickles: a weights file must not run code
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # ValueError: a refused object array
        raise WeightsError(f"cannot read weights file {path}: {e}") from None


def _copy_arrays(module: nn.Module, arrays: dict[str, np.ndarray], source: str) -> None:
    names = module.numpy_names() if hasattr(module, "numpy_names") else {k: k for k in module.state_dict()}
    targets = module.state_dict(keep_vars=True)
    problems = []
    for name in sorted(names.keys() - arrays.keys()):
        problems.append(f"missing: {name} {tuple(targets[names[name]].shape)}")
    for name in sorted(arrays.keys() - names.keys()):
        problems.append(f"unexpected: {name} {arrays[name].shape}")
    for name in sorted(names.keys() & arrays.keys()):
        want, got = tuple(targets[names[name]].shape), arrays[name].shape
        if got != want:
            hint = " (transposed? the layout is (out, in))" if got == want[::-1] else ""
            problems.append(f"wrong shape: {name} is {got} in the file, the module needs {want}{hint}")
        elif not np.issubdtype(arrays[name].dtype, np.floating):
            problems.append(f"wrong dtype: {name} is {arrays[name].dtype}, expected a float array")
    if problems:
        raise WeightMismatchError(f"{source} does not match {type(module).__name__}:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for name, own_name in names.items():
            array = np.ascontiguousarray(arrays[name], dtype=np.float32)
            targets[own_name].copy_(torch.from_numpy(array))


def load_numpy_arrays(module: nn.Module, arrays: dict[str, np.ndarray], source: str = "arrays") -> nn.Module:
    """`load_numpy_weights` from arrays in memory (e.g. NumpyMiniGPT.init(...).params)."""
    _copy_arrays(module, arrays, source=source)
    return module


def load_numpy_weights(module: nn.Module, path=None) -> nn.Module:
    """Copy every array of the NumPy weights file into `module` as float32, name for name.

    The file's names and the module's parameters must match one to one with equal shapes;
    otherwise a WeightMismatchError lists every offending parameter and nothing is copied.
    """
    path = DEFAULT_WEIGHTS if path is None else Path(path)
    _copy_arrays(module, _read_npz(path), source=str(path))
    return module


__all__ = [
    "MiniGPTConfig",
    "final_softmax",
    "SOFTMAX_IMPLS",
    "CausalSelfAttention",
    "MHACausalSelfAttention",
    "MLP",
    "Block",
    "GrammarMiniGPT",
    "load_numpy_weights",
    "load_numpy_arrays",
    "WeightMismatchError",
]
