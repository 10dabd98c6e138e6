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
    with np.errstate(invalid="ignore", over="ignore"):  # infinite gradients give inf / NaN, as in torch
        return y * (dy - (y * dy).sum(axis=-1, keepdims=True))


def cross_entropy_ref(x, targets, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """F.cross_entropy with class-index targets, in float64: (loss, lse, grad).

    For a row with target t != ignore_index, class weights w (ones if None), smoothing e and
    log-probabilities lp = x - lse,

        loss = (1 - e) * w_t * (-lp_t) + e / V * sum_j w_j * (-lp_j)       (no e term if e == 0)
        grad = (1 - e) * w_t * (p_j - [j == t]) + e / V * (W * p_j - w_j),  W = sum_j w_j,

    p_t - 1 taken as minus the sum of the other probabilities, so that confident rows keep their
    digits. loss: shape (N,) for "none", a float for "sum" and "mean"; "mean" divides the sum by
    the sum of w_t over the rows not ignored (0 / 0 = NaN when every row is ignored) and so does
    its gradient. grad: d loss / d x ("none": of loss.sum(), a grad_output of ones). lse (N,):
    torch.logsumexp per row (a row of -inf gives -inf, one with +inf gives +inf, NaN gives NaN).

    PyTorch's semantics at the edges (checked against F.cross_entropy in the tests): an ignored
    row has loss 0 and contributes nothing to the sum or to the mean's denominator, and its
    gradient is 0 times the row's probabilities, so 0, or NaN throughout where they are NaN (a
    NaN, a +inf or no finite logit in the row), whatever the reduction. Log-probabilities follow
    torch.log_softmax: a row whose max is infinite or NaN is NaN throughout. A target neither
    ignore_index nor in [0, V) raises ValueError.
    """
    x = np.asarray(x, dtype=np.float64)
    t = np.asarray(targets).astype(np.int64)
    N, V = x.shape
    w = np.ones(V) if weight is None else np.asarray(weight, dtype=np.float64)
    e = float(label_smoothing)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")
    ignored = t == ignore_index
    bad = ~ignored & ((t < 0) | (t >= V))
    if bad.any():
        raise ValueError(f"targets {np.unique(t[bad]).tolist()} outside [0, {V}) and not ignore_index")
    ts = np.where(ignored, 0, t)
    rows = np.arange(N)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # Relative to the row's max, so rows of huge logits (1e30) keep their probabilities.
        m = x.max(axis=1, initial=-np.inf) if V else np.full(N, -np.inf)
        shifted = x - m[:, None]
        terms = np.exp(shifted)
        log_s = np.log(terms.sum(axis=1))
        # log1p of the other terms where the max is finite: log of a sum near 1 would round a
        # confident row's loss (~1e-12) to a few digits.
        fin = np.isfinite(m)
        if V and fin.any():
            others = np.where(fin[:, None], terms, 0.0)
            others[rows, np.argmax(np.where(fin[:, None], x, 0.0), axis=1)] = 0.0
            log_s = np.where(fin, np.log1p(others.sum(axis=1)), log_s)
        lse = np.where(np.isinf(m), m, m + log_s)
        lp = shifted - log_s[:, None]
        p = np.exp(lp)
        w_t = np.where(ignored, 0.0, w[ts])
        loss = w_t * -lp[rows, ts]
        if e > 0:
            loss = (1 - e) * loss + e / V * (w[None, :] * -lp).sum(axis=1)
        loss = np.where(ignored, 0.0, loss)
        p_minus_onehot = p.copy()
        p_minus_onehot[rows, ts] = -np.where(np.arange(V)[None, :] == ts[:, None], 0.0, p).sum(axis=1)
        grad = ((1 - e) * w_t)[:, None] * p_minus_onehot
        if e > 0:
            grad = grad + np.where(ignored, 0.0, e / V)[:, None] * (w.sum() * p - w[None, :])
        if reduction == "none":
            return loss, lse, grad
        if reduction == "sum":
            return float(loss.sum()), lse, grad
        denominator = w_t.sum()
        return float(loss.sum() / denominator), lse, np.where(ignored[:, None], grad, grad / denominator)
