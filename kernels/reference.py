"""The ground truth: a NumPy softmax over the last axis, accumulated in float64.

Memory traffic of the textbook three-pass version, for a (B, V) matrix of 4-byte floats:
  max pass       reads  4·B·V bytes
  exp-sum pass   reads  4·B·V bytes
  normalise pass reads  4·B·V bytes and writes 4·B·V bytes
16·B·V bytes in all, against 8·B·V for a kernel that reads the row once and writes it once:
that factor of two is the whole argument for fusing.
"""

import numpy as np


def softmax_ref(x) -> np.ndarray:
    """Softmax over the last axis in float64, returned as float64.

    Follows `torch.softmax` at the edges: -inf entries get probability 0, and a row whose
    entries are all -inf has no defined distribution and comes back as NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x.copy()
    row_max = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # an all -inf row gives -inf - -inf = NaN, as in torch
        e = np.exp(x - row_max)
    return e / e.sum(axis=-1, keepdims=True)


# -- the softmax backward and cross-entropy ------------------------------------------------------


def softmax_backward_ref(dy, y) -> np.ndarray:
    """dx = y * (dy - sum(y * dy)) over the last axis, in float64: the gradient of softmax's
    input given its output y and the gradient dy of its output."""
    dy = np.asarray(dy, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # NaN rows (an all -inf softmax) and inf gradients stay NaN / inf
        return y * (dy - (y * dy).sum(axis=-1, keepdims=True))


def logsumexp_ref(x) -> np.ndarray:
    """log(sum(exp(x))) over the last axis in float64; -inf for a row of -inf (torch.logsumexp)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1)
    safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        return np.where(np.isneginf(m), -np.inf, safe + np.log(np.exp(x - safe[..., None]).sum(axis=-1)))


def cross_entropy_ref(x, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """F.cross_entropy with class-index targets, in float64: (loss, lse, grad).

    loss: a float for "mean" / "sum", shape (N,) for "none". lse: (N,). grad: d loss / d x for
    "mean" / "sum", and of loss.sum() for "none" (a grad_output of ones). PyTorch's semantics:
    a row whose target is ignore_index contributes 0 to the loss and to the denominator; the
    weighted mean divides by the sum of the non-ignored rows' target weights, and the label
    smoothing term by the same; every row's loss is

        (1 - e) * w_t * (lse - x_t) + e / V * sum_j w_j * (lse - x_j).

    The gradient of an ignored row is 0. p_t - 1 at the target is taken as minus the sum of the
    other probabilities, so confident rows keep their digits. A target outside [0, V) that is
    not ignore_index raises ValueError.
    """
    x = np.asarray(x, dtype=np.float64)
    t = np.asarray(targets).astype(np.int64)
    N, V = x.shape
    w = np.ones(V) if weight is None else np.asarray(weight, dtype=np.float64)
    eps = float(label_smoothing)
    ignored = t == ignore_index
    bad = ~ignored & ((t < 0) | (t >= V))
    if bad.any():
        raise ValueError(f"targets {np.unique(t[bad]).tolist()} outside [0, {V}) and not ignore_index")
    ts = np.where(ignored, 0, t)
    rows = np.arange(N)
    lse = logsumexp_ref(x)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # Relative to the row's max, so rows of huge logits (1e30) keep their probabilities.
        z = x - x.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        p = np.exp(logp)
        w_t = np.where(ignored, 0.0, w[ts])
        loss = w_t * -logp[rows, ts]
        if eps > 0:
            loss = (1 - eps) * loss + eps / V * -(logp * w[None, :]).sum(axis=1)
        loss = np.where(ignored, 0.0, loss)
        others = np.where(np.arange(V)[None, :] == ts[:, None], 0.0, p).sum(axis=1)
        q = p.copy()
        q[rows, ts] = -others  # p_t - 1
        grad = w_t[:, None] * q
        if eps > 0:
            grad = (1 - eps) * grad + eps / V * (w.sum() * p - w[None, :])
        grad = np.where(ignored[:, None], 0.0, grad)
    if reduction == "none":
        return loss, lse, grad
    total = loss.sum()
    if reduction == "sum":
        return float(total), lse, grad
    if reduction != "mean":
        raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")
    denominator = w_t.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        # All rows ignored: 0 / 0 = NaN for the loss, as PyTorch gives; their gradient stays 0.
        return float(total / denominator), lse, np.where(ignored[:, None], 0.0, grad / denominator)
