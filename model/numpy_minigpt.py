"""Reference decoder-only transformer in pure NumPy, with a hand-written backward.

Layout follows nanoGPT: token + learned position embeddings, N_LAYER pre-LayerNorm
blocks (causal multi-head self-attention, then a GELU MLP of width 4d), final
LayerNorm and an untied LM head. Linear weights are stored PyTorch-style as
(out_features, in_features), so `y = x @ W.T + b`.

Every layer is a pair `*_forward(...) -> (out, cache)` / `*_backward(dout, cache)`.
The dtype of the parameters decides the compute dtype: float32 for inference and
training, float64 for finite-difference gradient checks.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from .config import ARCHITECTURE, MiniGPTConfig

# ---------------------------------------------------------------------------- config
# Module-level names for the architecture of model/config.py (the one place it is written).
N_LAYER = ARCHITECTURE.n_layer
N_HEAD = ARCHITECTURE.n_head
D_MODEL = ARCHITECTURE.d_model
D_HEAD = ARCHITECTURE.d_head  # 16
D_FF = ARCHITECTURE.d_ff
CONTEXT = ARCHITECTURE.context
LN_EPS = ARCHITECTURE.ln_eps
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "minigpt.npz"
_GELU_C = math.sqrt(2.0 / math.pi)


class WeightsError(ValueError):
    """A weights file that is missing, unreadable or does not match the architecture."""


def expected_shapes(vocab_size: int, config: MiniGPTConfig = ARCHITECTURE) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape for `config` (the committed architecture by default)."""
    d, d_ff = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {
        "tok_emb.weight": (vocab_size, d),
        "pos_emb.weight": (config.context, d),
    }
    for i in range(config.n_layer):
        p = f"blocks.{i}."
        shapes.update(
            {
                p + "ln1.weight": (d,),
                p + "ln1.bias": (d,),
                p + "attn.qkv.weight": (3 * d, d),
                p + "attn.qkv.bias": (3 * d,),
                p + "attn.proj.weight": (d, d),
                p + "attn.proj.bias": (d,),
                p + "ln2.weight": (d,),
                p + "ln2.bias": (d,),
                p + "mlp.fc.weight": (d_ff, d),
                p + "mlp.fc.bias": (d_ff,),
                p + "mlp.proj.weight": (d, d_ff),
                p + "mlp.proj.bias": (d,),
            }
        )
    shapes.update(
        {
            "ln_f.weight": (d,),
            "ln_f.bias": (d,),
            "lm_head.weight": (vocab_size, d),
            "lm_head.bias": (vocab_size,),
        }
    )
    return shapes


# ---------------------------------------------------------------------------- layers
def linear_forward(x, w, b):
    return x @ w.T + b, x


def linear_backward(dy, x, w):
    """Returns dx, dw, db; leading axes of x/dy are flattened for the weight grads."""
    dx = dy @ w
    dw = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (out, in)
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    return dx, dw, db


def layernorm_forward(x, g, b, eps=LN_EPS):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    return xhat * g + b, (xhat, rstd, g)


def layernorm_backward(dy, cache):
    xhat, rstd, g = cache
    dg = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db


def gelu_forward(x):
    """tanh approximation, identical to torch GELU(approximate="tanh")."""
    # x * x * x, not x ** 3: NumPy's float32 power is ~100x slower than two multiplies
    t = np.tanh(_GELU_C * (x + 0.044715 * (x * x * x)))
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_backward(dy, cache):
    x, t = cache
    du_dx = _GELU_C * (1.0 + 3 * 0.044715 * (x * x))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * du_dx)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def attention_forward(x, p, n_head: int = N_HEAD):
    """Causal multi-head self-attention. x: (B, T, d); p holds qkv.* and proj.*."""
    B, T, d = x.shape
    d_head = d // n_head
    qkv, c_qkv = linear_forward(x, p["qkv.weight"], p["qkv.bias"])  # (B, T, 3d)
    qkv = qkv.reshape(B, T, 3, n_head, d_head).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, dh)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d_head)  # (B, H, T, T)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores = np.where(future, -np.inf, scores)
    att = softmax(scores, axis=-1)
    y = att @ v  # (B, H, T, dh)
    y = y.transpose(0, 2, 1, 3).reshape(B, T, d)  # concat heads
    out, c_proj = linear_forward(y, p["proj.weight"], p["proj.bias"])
    return out, (c_qkv, c_proj, q, k, v, att)


def attention_backward(dout, cache, p):
    c_qkv, c_proj, q, k, v, att = cache
    B, H, T, dh = q.shape
    dy, dw_proj, db_proj = linear_backward(dout, c_proj, p["proj.weight"])
    dy = dy.reshape(B, T, H, dh).transpose(0, 2, 1, 3)  # (B, H, T, dh)
    datt = dy @ v.transpose(0, 1, 3, 2)  # (B, H, T, T)
    dv = att.transpose(0, 1, 3, 2) @ dy
    # softmax Jacobian; masked entries have att == 0 so they receive no gradient
    dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True)) / math.sqrt(dh)
    dq = dscores @ k
    dk = dscores.transpose(0, 1, 3, 2) @ q
    dqkv = np.stack([dq, dk, dv])  # (3, B, H, T, dh)
    dqkv = dqkv.transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * H * dh)  # (B, T, 3d)
    dx, dw_qkv, db_qkv = linear_backward(dqkv, c_qkv, p["qkv.weight"])
    grads = {"qkv.weight": dw_qkv, "qkv.bias": db_qkv, "proj.weight": dw_proj, "proj.bias": db_proj}
    return dx, grads


def mlp_forward(x, p):
    h, c_fc = linear_forward(x, p["fc.weight"], p["fc.bias"])  # (B, T, 4d)
    a, c_gelu = gelu_forward(h)
    out, c_proj = linear_forward(a, p["proj.weight"], p["proj.bias"])
    return out, (c_fc, c_gelu, c_proj)


def mlp_backward(dout, cache, p):
    c_fc, c_gelu, c_proj = cache
    da, dw_proj, db_proj = linear_backward(dout, c_proj, p["proj.weight"])
    dh = gelu_backward(da, c_gelu)
    dx, dw_fc, db_fc = linear_backward(dh, c_fc, p["fc.weight"])
    return dx, {"fc.weight": dw_fc, "fc.bias": db_fc, "proj.weight": dw_proj, "proj.bias": db_proj}


def _sub(params, prefix):
    """View of the parameters under `prefix`, with the prefix stripped."""
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}


# ---------------------------------------------------------------------------- block
def block_forward(x, p, n_head: int = N_HEAD, eps: float = LN_EPS):
    """Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(.)). Returns sublayer outputs too."""
    h1, c_ln1 = layernorm_forward(x, p["ln1.weight"], p["ln1.bias"], eps)
    a, c_attn = attention_forward(h1, _sub(p, "attn."), n_head)
    x = x + a
    h2, c_ln2 = layernorm_forward(x, p["ln2.weight"], p["ln2.bias"], eps)
    m, c_mlp = mlp_forward(h2, _sub(p, "mlp."))
    return x + m, (c_ln1, c_attn, c_ln2, c_mlp), a, m


def block_backward(dout, cache, p):
    c_ln1, c_attn, c_ln2, c_mlp = cache
    grads = {}
    dh2, g_mlp = mlp_backward(dout, c_mlp, _sub(p, "mlp."))
    dx_mid, grads["ln2.weight"], grads["ln2.bias"] = layernorm_backward(dh2, c_ln2)
    dx_mid = dx_mid + dout
    dh1, g_attn = attention_backward(dx_mid, c_attn, _sub(p, "attn."))
    dx, grads["ln1.weight"], grads["ln1.bias"] = layernorm_backward(dh1, c_ln1)
    grads.update({"mlp." + k: v for k, v in g_mlp.items()})
    grads.update({"attn." + k: v for k, v in g_attn.items()})
    return dx + dx_mid, grads


def cross_entropy_forward(logits, targets, mask):
    """Mean next-token NLL over positions where mask is 1. logits (B, T, V)."""
    m = logits.max(axis=-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # (B, T)
    n = mask.sum()
    return float((nll * mask).sum() / n), (logp, targets, mask, n)


def cross_entropy_backward(cache):
    logp, targets, mask, n = cache
    dlogits = np.exp(logp)
    np.put_along_axis(
        dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1.0, axis=-1
    )
    return dlogits * (mask / n)[..., None].astype(logp.dtype)


# ---------------------------------------------------------------------------- model
class NumpyMiniGPT:
    """The model of `config`'s architecture (the committed one by default; the vocabulary size
    is read from tok_emb.weight)."""

    def __init__(self, params: dict[str, np.ndarray], config: MiniGPTConfig = ARCHITECTURE):
        if config.n_head < 1 or config.d_model % config.n_head:
            raise ValueError(f"d_model={config.d_model} is not divisible by n_head={config.n_head}")
        if "tok_emb.weight" not in params:
            raise WeightsError("missing parameter 'tok_emb.weight'")
        if np.ndim(params["tok_emb.weight"]) != 2:
            raise WeightsError(
                f"parameter 'tok_emb.weight' has shape {np.shape(params['tok_emb.weight'])}, "
                f"expected (vocab_size, {config.d_model})"
            )
        self.vocab_size = int(np.shape(params["tok_emb.weight"])[0])
        self.config = config.with_vocab(self.vocab_size)
        dtype = np.asarray(params["tok_emb.weight"]).dtype
        _validate(params, self.vocab_size, dtype, self.config)
        self.params = params
        self.dtype = dtype

    # --- construction -----------------------------------------------------------------
    @classmethod
    def init(
        cls, vocab_size: int, seed: int = 0, dtype=np.float32, config: MiniGPTConfig = ARCHITECTURE
    ) -> NumpyMiniGPT:
        """GPT-2 style init: N(0, 0.02), residual projections scaled by 1/sqrt(2L)."""
        rng = np.random.default_rng(seed)
        params = {}
        for name, shape in expected_shapes(vocab_size, config).items():
            if name.startswith("ln") or ".ln" in name:
                val = np.ones(shape) if name.endswith("weight") else np.zeros(shape)
            elif name.endswith("bias"):
                val = np.zeros(shape)
            else:
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("proj.weight") else 0.02
                val = rng.normal(0.0, std, size=shape)
            params[name] = val.astype(dtype)
        return cls(params, config)

    def astype(self, dtype) -> NumpyMiniGPT:
        return NumpyMiniGPT({k: v.astype(dtype) for k, v in self.params.items()}, self.config)

    @classmethod
    def load(cls, path: str | Path | None = None) -> NumpyMiniGPT:
        """Load and validate weights (None = the committed model/weights/minigpt.npz)."""
        path = Path(path) if path is not None else DEFAULT_WEIGHTS
        if not path.is_file():
            raise WeightsError(f"weights file not found: {path}")
        params = {}
        try:
            with np.load(path, allow_pickle=False) as f:
                for name in f.files:
                    try:
                        params[name] = f[name]
                    except ValueError as e:  # e.g. an object array, refused without pickle
                        raise WeightsError(f"parameter {name!r} in {path} is unreadable: {e}") from None
        except WeightsError:
            raise
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise WeightsError(f"cannot read weights file {path}: {e}") from None
        model = cls(params)
        if model.dtype != np.float32:
            raise WeightsError(f"parameter 'tok_emb.weight' has dtype {model.dtype}, expected float32")
        return model

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **{k: np.ascontiguousarray(v, dtype=np.float32) for k, v in self.params.items()})

    # --- forward ----------------------------------------------------------------------
    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be an integer array of shape (B, T), got {ids.dtype} {ids.shape}")
        if not 1 <= ids.shape[1] <= self.config.context:
            raise ValueError(f"sequence length {ids.shape[1]} outside [1, {self.config.context}]")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        return ids

    def _forward(self, ids, trace=None):
        p = self.params
        ids = self._check_ids(ids)
        T = ids.shape[1]
        x = p["tok_emb.weight"][ids] + p["pos_emb.weight"][:T]  # (B, T, d)
        if trace is not None:
            trace["embed"] = x
        caches = []
        cfg = self.config
        for i in range(cfg.n_layer):
            x, c, a, m = block_forward(x, _sub(p, f"blocks.{i}."), cfg.n_head, cfg.ln_eps)
            caches.append(c)
            if trace is not None:
                trace[f"blocks.{i}.attn"] = a
                trace[f"blocks.{i}.mlp"] = m
                trace[f"blocks.{i}"] = x
        h, c_lnf = layernorm_forward(x, p["ln_f.weight"], p["ln_f.bias"], cfg.ln_eps)
        logits, c_head = linear_forward(h, p["lm_head.weight"], p["lm_head.bias"])  # (B, T, V)
        if trace is not None:
            trace["ln_f"] = h
            trace["logits"] = logits
        return logits, (ids, caches, c_lnf, c_head)

    def logits(self, ids, trace: dict | None = None) -> np.ndarray:
        return self._forward(ids, trace)[0]

    def forward(self, ids) -> np.ndarray:
        """Next-token probabilities (B, T, V): softmax is the last step."""
        return softmax(self.logits(ids), axis=-1)

    __call__ = forward

    # --- training ---------------------------------------------------------------------
    def loss_and_grads(self, ids, targets, mask=None):
        """Mean cross-entropy over masked positions and the gradient of every parameter."""
        logits, (ids, caches, c_lnf, c_head) = self._forward(ids)
        targets = np.asarray(targets)
        mask = np.ones(targets.shape, self.dtype) if mask is None else np.asarray(mask, self.dtype)
        loss, c_ce = cross_entropy_forward(logits, targets, mask)
        p, g = self.params, {}
        dlogits = cross_entropy_backward(c_ce)
        dh, g["lm_head.weight"], g["lm_head.bias"] = linear_backward(dlogits, c_head, p["lm_head.weight"])
        dx, g["ln_f.weight"], g["ln_f.bias"] = layernorm_backward(dh, c_lnf)
        for i in reversed(range(self.config.n_layer)):
            prefix = f"blocks.{i}."
            dx, gb = block_backward(dx, caches[i], _sub(p, prefix))
            g.update({prefix + k: v for k, v in gb.items()})
        g["pos_emb.weight"] = np.zeros_like(p["pos_emb.weight"])
        g["pos_emb.weight"][: ids.shape[1]] = dx.sum(axis=0)
        g["tok_emb.weight"] = np.zeros_like(p["tok_emb.weight"])
        np.add.at(g["tok_emb.weight"], ids.reshape(-1), dx.reshape(-1, self.config.d_model))
        return loss, g


def _validate(params, vocab_size, dtype, config: MiniGPTConfig = ARCHITECTURE) -> None:
    """Every expected name present with the right shape and one float dtype; no extras."""
    expected = expected_shapes(vocab_size, config)
    for name in params:
        if name not in expected:
            raise WeightsError(f"unexpected parameter {name!r}")
    for name, shape in expected.items():
        if name not in params:
            raise WeightsError(f"missing parameter {name!r}")
        arr = params[name]
        if not isinstance(arr, np.ndarray):
            raise WeightsError(f"parameter {name!r} is {type(arr).__name__}, not a NumPy array")
        if arr.shape != shape:
            raise WeightsError(f"parameter {name!r} has shape {arr.shape}, expected {shape}")
        # all parameters share the dtype of tok_emb.weight, which must be a float type
        want = dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)
        if arr.dtype != want:
            raise WeightsError(f"parameter {name!r} has dtype {arr.dtype}, expected {want}")
