"""Test inputs shared by the kernel tests."""

import torch


def make_logits(B, V, dtype=torch.float32, *, neg_inf=True, device="cpu"):
    """randn·3 with one +30 and one -30 outlier per row (so a wrong max-subtraction shows) and,
    unless `neg_inf` is False, -inf entries: one per row plus B/4 scattered ones (never a whole
    row for V > 4). Drawn in float64, then cast."""
    x = torch.randn(B, V, dtype=torch.float64) * 3
    if V > 2:
        rows = torch.arange(B)
        x[rows, torch.randint(0, V, (B,))] = 30.0
        x[rows, torch.randint(0, V, (B,))] = -30.0
    if neg_inf and V > 4:
        x[torch.arange(B), torch.randint(0, V, (B,))] = float("-inf")
        x[torch.randint(0, B, (max(1, B // 4),)), torch.randint(0, V, (max(1, B // 4),))] = float("-inf")
    return x.to(device=device, dtype=dtype)


def seeded_logits(B, V, *, seed, dtype=torch.float32, device="cpu", max_marked=None):
    """randn·3 from a generator of its own, with B·V/50 scattered ±30 outliers and as many -inf
    entries (at most `max_marked` of each); column 0 stays finite, so no row is all -inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * 3
    if V >= 2:
        n = max(1, B * V // 50 if max_marked is None else min(B * V // 50, max_marked))
        r = torch.randint(0, B, (n,), generator=g)
        c = torch.randint(0, V, (n,), generator=g)
        x[r, c] = torch.where(torch.rand(n, generator=g) < 0.5, 30.0, -30.0)
        r = torch.randint(0, B, (n,), generator=g)
        c = torch.randint(1, V, (n,), generator=g)
        x[r, c] = -float("inf")
    return x.to(dtype).to(device)
