"""Deliberately wrong softmax-backward and cross-entropy kernels: the bugs the field reports,
each written as a kernel with it would compute (float32 arithmetic, the registry's calling
convention). tests/test_cross_entropy.py and tests/test_softmax_backward.py assert that the
suite's checks reject every one of them on the suite's own inputs, and accept `standard`, the
cross-entropy kernels' common body without a bug, so each is rejected for its own bug and a
check that stops seeing one fails a test. Not collected (the name does not start with test_).

Cross-entropy, `fn(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
reduction="mean", out=None) -> (loss, lse, grad)`:
  no_minus_one_at_target      the gradient is softmax alone: the -1 at the target is missing
  smoothing_on_ignored_rows   label smoothing's loss and gradient also given to ignored rows
  lse_without_max             log(sum(exp(x))) without subtracting the max: overflows
  one_minus_p_in_float32      1 - p_t formed as 1 minus a float32 probability near 1
  loss_from_lse_minus_target  the loss as logsumexp - x_t in float32: a confident row's rounds away
  ignored_rows_in_the_mean    the mean divides by N, not by the non-ignored rows' weights
  smoothing_terms_at_eps_0    the smoothing's gradient terms formed and scaled by eps even at
                              eps = 0: 0 x inf, a NaN in every row, where a class weighs inf
Softmax backward, `fn(dy, y, *, out=None) -> dx`:
  sum_without_y               s = sum(dy) instead of sum(y * dy)
  sequential_float32_sum      s summed one element at a time in float32 (drifts on long rows)
"""

from __future__ import annotations

import torch


def _prepare(logits, target, weight, ignore_index):
    x = logits.detach().float()
    N, V = x.shape
    w = torch.ones(V) if weight is None else weight.detach().float().cpu()
    w = w.to(x.device)
    ignored = target == ignore_index
    ts = torch.where(ignored, torch.zeros_like(target), target).long()
    return x, N, V, w, ignored, ts


def _finish(x, loss_rows, grad, w_t, ignored, reduction, out, *, denominator=None):
    grad = torch.where(ignored[:, None], torch.zeros_like(grad), grad)
    loss_rows = torch.where(ignored, torch.zeros_like(loss_rows), loss_rows)
    if reduction == "none":
        loss = loss_rows
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        d = w_t.sum() if denominator is None else denominator
        loss = loss_rows.sum() / d
        grad = grad / d
    lse = torch.logsumexp(x, dim=-1)
    out = torch.empty_like(x) if out is None else out
    out.copy_(grad.to(out.dtype))
    return loss.to(x.dtype if out.dtype == torch.float32 else out.dtype), lse, out


def _standard(x, V, w, ignored, ts, label_smoothing, *, lse=None, smooth_ignored=False, pm1=None):
    """Loss rows and gradient as a correct float32 kernel forms them (standard() below: it passes
    the suite's checks), with hooks for the bugs. Every term relative to the row's max m, as the
    suite's kernels form them: L = log1p(the exponentials off the first maximum), so a confident
    row keeps its small loss, and p_t - 1 = -(the other classes' mass), so it keeps its small
    gradient. `lse` given: the textbook route from it instead (loss lse - x_t, p = exp(x - lse),
    p_t - 1 formed from p_t)."""
    eps = float(label_smoothing)
    rows = torch.arange(x.shape[0], device=x.device)
    if lse is None:
        m = x.max(dim=-1).values
        e = torch.exp(x - m[:, None])
        first = x.argmax(dim=-1)
        off = e.clone()
        off[rows, first] = 0.0
        S = 1.0 + off.sum(dim=-1)
        L = torch.log1p(off.sum(dim=-1))
        p = e / S[:, None]
        # -(S - e_t) / S, the sum of the other classes' exponentials taken without e_t's cancellation
        others = (
            off.sum(dim=-1)
            + torch.where(first == ts, torch.zeros_like(S), torch.ones_like(S))
            - torch.where(first == ts, torch.zeros_like(S), e[rows, ts])
        )
        pm1 = -others / S if pm1 is None else pm1
        d_t = m - x[rows, ts]
        smooth_of = lambda W: W * L - (w[None, :] * (x - m[:, None])).sum(dim=1)  # noqa: E731
    else:
        p = torch.exp(x - lse[:, None])
        pm1 = p[rows, ts] - 1 if pm1 is None else pm1
        L, d_t = lse, -x[rows, ts]
        smooth_of = lambda W: W * lse - (w[None, :] * x).sum(dim=1)  # noqa: E731
    w_t = torch.where(ignored, torch.zeros_like(d_t), w[ts])
    q = p.clone()
    q[rows, ts] = pm1
    loss = w_t * (d_t + L)
    grad = w_t[:, None] * q
    if eps > 0:
        smooth = smooth_of(w.sum())
        smooth_grad = w.sum() * p - w[None, :]
        loss = (1 - eps) * loss + eps / V * smooth
        grad = (1 - eps) * grad + eps / V * smooth_grad
        if smooth_ignored:
            # The bug: the smoothing term kept for ignored rows after they are zeroed.
            loss = torch.where(ignored, eps / V * smooth, loss)
            grad = torch.where(ignored[:, None], eps / V * smooth_grad, grad)
    return loss, grad, w_t


def standard(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", out=None):
    """The corpus's kernels without their bugs: the control that the suite's checks accept."""
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing)
    return _finish(x, loss, grad, w_t, ignored, reduction, out)


def no_minus_one_at_target(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    rows = torch.arange(N, device=x.device)
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing)
    grad[rows, ts] += (1 - float(label_smoothing)) * w_t  # puts back what the -1 took away
    return _finish(x, loss, grad, w_t, ignored, reduction, out)


def smoothing_on_ignored_rows(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                              reduction="mean", out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing, smooth_ignored=True)
    # No zeroing of ignored rows afterwards (that is the bug), so _finish's masking is bypassed.
    if reduction == "none":
        total = loss
    elif reduction == "sum":
        total = loss.sum()
    else:
        total = loss.sum() / w_t.sum()
        grad = grad / w_t.sum()
    out = torch.empty_like(x) if out is None else out
    out.copy_(grad.to(out.dtype))
    return total.to(out.dtype), torch.logsumexp(x, dim=-1), out


def lse_without_max(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                    out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    lse = torch.log(torch.exp(x).sum(dim=-1))
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing, lse=lse)
    loss_t, _, out = _finish(x, loss, grad, w_t, ignored, reduction, out)
    return loss_t, lse, out


def one_minus_p_in_float32(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    rows = torch.arange(N, device=x.device)
    # The probability rounded to float32 first, then 1 subtracted: near p_t = 1 the difference
    # keeps only the digits that float32 has above 1 - p_t.
    lse = torch.logsumexp(x, dim=-1)
    p_t = torch.exp(x[rows, ts] - lse).float()
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing, pm1=p_t - torch.ones_like(p_t))
    return _finish(x, loss, grad, w_t, ignored, reduction, out)


def loss_from_lse_minus_target(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                               reduction="mean", out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    rows = torch.arange(N, device=x.device)
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing)
    # The bug: the loss as logsumexp - x_t in float32, the log of a sum near 1 on a confident
    # row: its small loss rounds away (the gradient is the correct kernel's).
    lse = torch.logsumexp(x, dim=-1)
    nll = w_t * (lse - x[rows, ts])
    eps = float(label_smoothing)
    if eps > 0:
        nll = (1 - eps) * nll + eps / V * (w.sum() * lse - (w[None, :] * x).sum(dim=1))
    return _finish(x, torch.where(ignored, loss, nll), grad, w_t, ignored, reduction, out)


def ignored_rows_in_the_mean(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                             reduction="mean", out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing)
    return _finish(x, loss, grad, w_t, ignored, reduction, out, denominator=torch.tensor(float(N)))


def smoothing_terms_at_eps_0(logits, target, *, weight=None, ignore_index=-100, label_smoothing=0.0,
                             reduction="mean", out=None):  # fmt: skip
    x, N, V, w, ignored, ts = _prepare(logits, target, weight, ignore_index)
    loss, grad, w_t = _standard(x, V, w, ignored, ts, label_smoothing)
    if label_smoothing == 0:
        # The bug: eps / V (sum(w) p - w) added though eps is 0, which adds nothing unless sum(w)
        # or a w is inf.
        grad = grad + label_smoothing / V * (w.sum() * torch.softmax(x, dim=-1) - w[None, :])
    return _finish(x, loss, grad, w_t, ignored, reduction, out)


BROKEN_CROSS_ENTROPY = {
    f.__name__: f
    for f in (
        no_minus_one_at_target,
        smoothing_on_ignored_rows,
        lse_without_max,
        one_minus_p_in_float32,
        loss_from_lse_minus_target,
        ignored_rows_in_the_mean,
        smoothing_terms_at_eps_0,
    )
}


def sum_without_y(dy, y, *, out=None):
    d, yy = dy.float(), y.float()
    dx = yy * (d - d.sum(dim=-1, keepdim=True))
    out = torch.empty_like(y) if out is None else out
    return out.copy_(dx.to(out.dtype))


def sequential_float32_sum(dy, y, *, out=None):
    import numpy as np

    d, yy = dy.float(), y.float()
    t = (yy * d).cpu().numpy()
    s = torch.from_numpy(np.add.accumulate(t, axis=1, dtype=np.float32)[:, -1:]).to(y.device)  # left to right
    dx = yy * (d - s)
    out = torch.empty_like(y) if out is None else out
    return out.copy_(dx.to(out.dtype))


BROKEN_SOFTMAX_BACKWARD = {f.__name__: f for f in (sum_without_y, sequential_float32_sum)}
