"""The suite's inputs: one seeded generator of logits in every layout the kernels meet
(`logits`, `layouts`, the named recipes and the accuracy cases), and the model port's token ids
and weight files."""

from __future__ import annotations

import math

import numpy as np
import torch

from kernels.spec import DTYPE_IDS, dtype_name

VECTOR_BYTES = 16  # the widest vector access of the kernels: alignment classes are counted in it


def dtype_id(dtype) -> str:
    """ "fp32" / "bf16" / "fp16": the dtype as test ids name it."""
    return DTYPE_IDS[dtype_name(dtype)]


OUTLIER = 30.0
NEG_INF_DENSITY = 50  # one -inf per this many entries, on average
# A row-stride layout pads each row so that the stride is odd: consecutive rows then start in
# every alignment class, and no vector width divides the stride.
_ROW_PADS = (5, 6)


def layouts(dtype) -> tuple[str, ...]:
    """Every input layout the suite runs a kernel on: contiguous, rows with a stride > V, a
    contiguous view at every other 16-byte alignment class (offset 0 is "contiguous"), and
    elements strided within a row."""
    classes = VECTOR_BYTES // torch.tensor([], dtype=dtype).element_size()
    return ("contiguous", "row_stride", *(f"offset:{k}" for k in range(1, classes)), "col_stride")


# Named input recipes (`logits(..., recipe=...)`). Each is drawn from the same seeded float64
# generator, then the outliers and -inf entries (where asked for) and the recipe's own last step.
RECIPES = {
    "randn": "randn * scale: the default",
    "plain": "randn * scale, never an outlier or a -inf entry (the inputs the issue's figures used)",
    "confident": "randn * scale, then one entry per row raised until it holds 0.999 of the row's mass",
    "span": "-uniform(0, 110) per entry (scale unused, no outliers): probabilities from ~1 down through every "
    "binade of float32 and past its smallest normal",
    "masked": "randn * scale with all but 1/2, 1/8, 1/64 or a single entry of each row -inf (row by row in "
    "turn), as a top-k or attention mask leaves it",
    "overflow": "randn * scale shifted so that each row's max lies at one of OVERFLOW_MAXIMA (row by row in "
    "turn): at and past where exp(x) itself overflows (88.72) or underflows in float32",
}
# exp(88.72) is float32's largest; a kernel that does not subtract the max overflows past it.
OVERFLOW_MAXIMA = (88.0, 88.72, 89.5, 100.0, 1000.0, 30000.0, -88.0, -30000.0)
_MASK_KEEP = (2, 8, 64, 0)  # masked: keep 1/k of a row's entries (0: a single one)
CONFIDENT_MASS = 0.999

# The inputs of the accuracy tests, (recipe, scale): wide ranges, one confident entry, the whole
# exponent range, masks and the overflow edge. ISSUE_CASES: (B, V, scale) of the measurements
# in the issue that asked for them ("plain" inputs).
TAIL_CASES = (
    ("randn", 4.0),
    ("randn", 8.0),
    ("randn", 20.0),
    ("confident", 3.0),
    ("span", 1.0),
    ("masked", 4.0),
    ("overflow", 3.0),
)
ISSUE_CASES = ((512, 600, 1.0), (64, 600, 8.0), (256, 32000, 4.0), (16, 128256, 10.0), (4, 262144, 4.0))


def logits(
    B: int,
    V: int,
    *,
    seed: int,
    dtype=torch.float32,
    device="cpu",
    layout: str = "contiguous",
    outliers: bool = True,
    neg_inf: bool = True,
    scale: float = 3.0,
    neg_inf_rows=(),
    recipe: str = "randn",
    on_device: bool = False,
) -> torch.Tensor:
    """A (B, V) tensor drawn in float64 from a generator of its own, then cast.

    recipe: one of RECIPES (randn * scale by default).
    outliers: every row gets a -30 and every even row a +30. A +30 makes one entry take
        nearly all of a row's mass, so a wrong max or a lost element shows there; odd rows keep
        their mass spread, so an error in the sum or in the small probabilities shows there.
    neg_inf: about one entry in NEG_INF_DENSITY is -inf (at least one per tensor), never a
        whole row; neg_inf_rows lists rows to make entirely -inf (their softmax is NaN).
    layout: see `layouts`; storage outside the view (padding, gaps, the bytes before an
        offset view) holds NaN, so a kernel that reads past its row poisons its own output.
    on_device: draw on `device` itself, in float32 with a generator of that device, instead of
        in float64 on the host: the same recipe for shapes too large to draw on the host (the
        benchmarks, the GPU byte cases); the values then differ from one device to another.
        The recipes "randn", "plain" and "span" only.
    The same seed gives the same values in every layout, dtype and device (on_device aside).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}: one of {', '.join(RECIPES)}")
    if on_device and recipe not in ("randn", "plain", "span"):
        raise ValueError(f"recipe {recipe!r} is drawn on the host only (on_device=False)")
    if recipe == "plain":
        outliers = neg_inf = False
    if recipe == "span":
        outliers = False  # a +30 would leave every other entry 30 nats down: the span is the point
    where = torch.device(device) if on_device else torch.device("cpu")
    draw = (B, V, seed, outliers, neg_inf, float(scale), tuple(neg_inf_rows), recipe)
    if not on_device:
        x = _host_draw(*draw)
        # The draw is shared by every call with the same arguments: a cast or placement that
        # would return it as it is must copy it.
        x = x.to(dtype, copy=True) if torch.device(device).type == "cpu" else x.to(dtype)
    else:
        x = _draw(where, torch.float32, *draw).to(dtype)
    return _place(x, layout, torch.device(device))


# Host draws are deterministic in their arguments, and the same one is asked for in many layouts,
# dtypes and kernels (a coverage cell, a property per path): the newest ones are kept, up to this
# many bytes per process, so a large shape is drawn once per process instead of once per call.
_DRAW_CACHE_BYTES = 1 << 30
_draws: dict = {}


def _host_draw(*draw) -> torch.Tensor:
    x = _draws.pop(draw, None)
    if x is None:
        x = _draw(torch.device("cpu"), torch.float64, *draw)
    _draws[draw] = x  # newest last
    while sum(t.numel() * t.element_size() for t in _draws.values()) > _DRAW_CACHE_BYTES and len(_draws) > 1:
        del _draws[next(iter(_draws))]
    return x


def _draw(where, wide, B, V, seed, outliers, neg_inf, scale, neg_inf_rows, recipe) -> torch.Tensor:
    """The recipe's values in `wide` (float64 on the host, float32 drawn on a device), uncast."""
    g = torch.Generator(device=where).manual_seed(seed)

    def randint(high, n):
        return torch.randint(0, high, (n,), generator=g, device=where)

    if recipe == "span":
        x = -torch.rand(B, V, generator=g, dtype=wide, device=where) * 110.0
    else:
        x = torch.randn(B, V, generator=g, dtype=wide, device=where) * scale
    if B and V >= 3 and outliers:
        rows = torch.arange(B, device=where)
        x[rows, randint(V, B)] = -OUTLIER
        x[rows[::2], randint(V, len(rows[::2]))] = OUTLIER
    if B and V >= 2 and neg_inf:
        n = max(1, B * V // NEG_INF_DENSITY)
        x[randint(B, n), randint(V, n)] = -math.inf
        lost = torch.isneginf(x).all(dim=1).nonzero().flatten()  # short rows may lose every entry
        x[lost, randint(V, len(lost))] = torch.randn(len(lost), generator=g, dtype=wide, device=where) * scale
    if B and V and recipe == "masked":
        keep = torch.tensor([_MASK_KEEP[r % len(_MASK_KEEP)] for r in range(B)])
        kept = torch.rand(B, V, generator=g, dtype=torch.float64) * torch.where(keep > 0, keep, 1)[:, None] < 1
        kept[keep == 0] = False
        # One entry of every row is kept and finite, so no row is masked whole.
        rows, one = torch.arange(B), torch.randint(0, V, (B,), generator=g)
        kept[rows, one] = True
        x[rows, one] = torch.where(torch.isneginf(x[rows, one]), 0.0, x[rows, one])
        x = torch.where(kept, x, -math.inf)
    if B and V and recipe == "confident":
        top = torch.randint(0, V, (B,), generator=g)
        rest = x.clone()
        rest[torch.arange(B), top] = -math.inf
        # p(top) = 1 / (1 + sum(exp(rest - top))): the top entry sits ln(mass / (1 - mass)) above
        # the rest's log-sum-exp (rows of one entry have no rest and hold all of their mass).
        # 0.3 nats more keep it above the mass after rounding to bf16 (steps of 0.25 up to 64).
        lift = torch.logsumexp(rest, dim=1) + math.log(CONFIDENT_MASS / (1 - CONFIDENT_MASS)) + 0.3
        x[torch.arange(B), top] = torch.where(torch.isfinite(lift), lift, x[torch.arange(B), top])
    if B and V and recipe == "overflow":
        target = torch.tensor([OVERFLOW_MAXIMA[r % len(OVERFLOW_MAXIMA)] for r in range(B)], dtype=torch.float64)
        finite = torch.where(torch.isneginf(x), -math.inf, x)
        x = x - finite.max(dim=1, keepdim=True).values + target[:, None]
    for row in neg_inf_rows:
        x[row] = -math.inf
    return x


def _place(values: torch.Tensor, layout: str, device: torch.device) -> torch.Tensor:
    B, V = values.shape
    dtype = values.dtype
    if layout == "contiguous":
        return values.to(device)
    if layout == "row_stride":
        buf = torch.full((B, V + _ROW_PADS[V % 2]), math.nan, dtype=dtype, device=device)
        buf[:, :V] = values
        return buf[:, :V]
    if layout == "col_stride":
        buf = torch.full((B, V, 2), math.nan, dtype=dtype, device=device)
        buf[..., 0] = values
        return buf[..., 0]
    if layout.startswith("offset:"):
        k = int(layout.removeprefix("offset:"))
        guard = VECTOR_BYTES // values.element_size()
        flat = torch.full((k + B * V + guard,), math.nan, dtype=dtype, device=device)
        x = flat[k : k + B * V].view(B, V)
        x.copy_(values)
        assert x.data_ptr() % VECTOR_BYTES == k * values.element_size() % VECTOR_BYTES, "allocation not aligned"
        return x
    raise ValueError(f"unknown layout {layout!r}: one of {layouts(dtype)} or offset:<k>")


def place(values: torch.Tensor, layout: str, device="cpu") -> torch.Tensor:
    """`values` copied into `layout` (see `layouts`; NaN outside the view) on `device`."""
    return _place(values, layout, torch.device(device))


def mid_group_cases(dtype) -> tuple[tuple[int, int, int], ...]:
    """(a, V, k) for rows k elements past a 16-byte boundary (`place(..., f"offset:{k}")`), a
    the group's width in elements: V = 40 with k = a - 1, every row starting on its group's
    last element (the head that adds a chunk to a row); V = 37 with k = 1, rows starting at
    every place in their groups (a cut that takes the first row's head for all of them fails)."""
    a = VECTOR_BYTES // torch.tensor([], dtype=dtype).element_size()
    return ((a, 40, a - 1), (a, 37, 1))


def outside_view(t: torch.Tensor) -> torch.Tensor:
    """The elements of a contiguous view's storage that the view does not cover (NaN where `place`
    made it): a kernel that writes past its rows shows there."""
    assert t.is_contiguous(), "outside_view: a contiguous view"
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    o = t.storage_offset()
    return torch.cat([flat[:o], flat[o + t.numel() :]])


def device_logits(B: int, V: int, dtype, device, *, seed: int, neg_inf: bool = True) -> torch.Tensor:
    """logits(B, V, seed=seed, ...) drawn on `device` itself where that is a GPU (on_device: the
    large shapes of the benchmarks and the byte cases would take seconds to minutes to draw on
    the host), on the host otherwise. neg_inf=False: no -inf entry at all; never an all -inf row."""
    return logits(
        B, V, seed=seed, dtype=dtype, device=device, neg_inf=neg_inf, on_device=torch.device(device).type != "cpu"
    )


def batched_logits(B: int, T: int, V: int, *, seed: int, device="cpu") -> torch.Tensor:
    """(B, T, V) model-shaped logits on `device` from the suite's one generator (outliers and -inf)."""
    return logits(B * T, V, seed=seed, device=device).view(B, T, V)


def random_ids(vocab_size: int, shape, seed: int) -> np.ndarray:
    """int64 token ids of `shape`, uniform over the vocabulary, from a generator of their own."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=shape, dtype=np.int64)


def npz_arrays(path) -> dict[str, np.ndarray]:
    """Every array of a weights file (.npz), by name, read without pickles."""
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}
