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


# -- training: the softmax backward and cross-entropy ----------------------------------------------


def softmax_backward_ref(y, dy) -> np.ndarray:
    """dx = y * (dy - sum(y * dy)) over the last axis, in float64: the gradient with respect to
    softmax's input, given its output y and the gradient dy of that output."""
    y = np.asarray(y, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # infinite gradients give inf / NaN, as in torch
        return y * (dy - (y * dy).sum(axis=-1, keepdims=True))


def cross_entropy_ref(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0):
    """F.cross_entropy per row with class-index targets, in float64: (loss, grad, lse).

    loss (N,): reduction="none"'s value. For a row with target t != ignore_index, weights w
    (ones if None) and smoothing e, with log-probabilities lp = x - lse,
        loss = (1 - e) * w_t * (-lp_t) + e / V * sum_j w_j * (-lp_j)      (no e term if e == 0)
    and 0 for an ignored row. grad (N, V): d loss.sum() / d logits,
        (1 - e) * w_t * (p_j - [j == t]) + e / V * (W * p_j - w_j),       W = sum_j w_j,
    p_t - 1 taken as expm1(lp_t) so that confident rows keep their digits; an ignored row's
    gradient is 0 times that (0, or NaN where p is NaN, as in PyTorch). lse (N,): log-sum-exp
    per row as torch.logsumexp (a row of -inf gives -inf, one with +inf gives +inf).
    "mean" is loss.sum() / (sum of w_t over the rows not ignored), its gradient grad / that.
    Log-probabilities follow torch.log_softmax: a row whose max is infinite or NaN is NaN
    throughout. A target neither ignore_index nor in [0, V) raises ValueError.
    """
    x = np.asarray(logits, dtype=np.float64)
    t = np.asarray(target).astype(np.int64)
    N, V = x.shape
    w = np.ones(V) if weight is None else np.asarray(weight, dtype=np.float64)
    e = float(label_smoothing)
    ignored = t == ignore_index
    bad = ~ignored & ((t < 0) | (t >= V))
    if bad.any():
        raise ValueError(f"targets {sorted(set(t[bad].tolist()))} outside [0, {V}) and not ignore_index")
    ts = np.where(ignored, 0, t)
    rows = np.arange(N)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = x.max(axis=1, initial=-np.inf) if V else np.full(N, -np.inf)
        shifted = x - m[:, None]
        log_s = np.log(np.exp(shifted).sum(axis=1))
        lse = np.where(np.isinf(m), m, m + log_s)
        lp = shifted - log_s[:, None]
        p = np.exp(lp)
        w_t = np.where(ignored, 0.0, w[ts])
        loss = w_t * -lp[rows, ts]
        if e > 0:
            loss = (1 - e) * loss + e / V * (w[None, :] * -lp).sum(axis=1)
        loss = np.where(ignored, 0.0, loss)
        p_minus_onehot = p.copy()
        p_minus_onehot[rows, ts] = np.expm1(lp[rows, ts])
        grad = ((1 - e) * w_t)[:, None] * p_minus_onehot
        if e > 0:
            grad = grad + np.where(ignored, 0.0, e / V)[:, None] * (w.sum() * p - w[None, :])
    return loss, grad, lse
