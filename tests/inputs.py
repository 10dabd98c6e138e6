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
