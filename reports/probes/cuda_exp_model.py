"""The CUDA kernels' fp32 exponential and quotient modelled in NumPy, on the CPU.

    python reports/probes/cuda_exp_model.py pairs [--trials N]      # err = x - ((x - r) + r) is exact
    python reports/probes/cuda_exp_model.py rules [--noise ULPS] [--v V,...]

pairs: for rows maxima m over many magnitudes and x <= m at every distance that can give a
    nonzero output (|x - r| < 88), checks that with r = exp_reference(m) (m rounded up onto the
    multiples of 2^-17, kernels/cuda/softmax_common.cuh) the three float32 operations
    s = x - r, z = s + r, err = x - z give the rounding error of s exactly (exact rationals
    decide where float64 cannot), and that with the raw max for r they do not.
rules: the fused kernel's fp32 path (max, exp, fixed-point sum, normalisation) in float32
    arithmetic, fma with one rounding (long double), ex2.approx as 2^t rounded to float32 with
    optionally +-ULPS of deterministic noise (the hardware's error is up to 2 ulps), flush to
    zero: the form before (2Sum on the raw max, the quotient from the product with inv and one
    correction step) and now (exp_reference, three-operation err, e * inv + e * inv_lo), each
    held to the suite's rules (tests/helpers/tolerances.py: TOLERANCES at every output, the ratio to
    F.softmax on the CPU) on the accuracy tests' recipes.
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers import ISSUE_CASES, TAIL_CASES, assert_softmax_close, logits, ratio_to_torch  # noqa: E402

F32 = np.float32
TINY = 2.0**-126
L = F32(1.4426950408889634)  # SOFTMAX_LOG2E
LR = F32(1.3349758171622139e-8)  # SOFTMAX_LOG2E_REST
LN2 = F32(0.6931471805599453)  # SOFTMAX_LN2
GRID = F32(131072.0)  # 2^17


def f32(v) -> np.ndarray:
    """Round to float32, flushing results below the normal range to zero (-ftz=true)."""
    v = np.asarray(v, dtype=np.longdouble).astype(np.float32)
    return np.where(np.abs(v) < TINY, F32(0) * np.sign(v), v).astype(np.float32)


def fma(a, b, c) -> np.ndarray:
    return f32(np.asarray(a, np.longdouble) * np.asarray(b, np.longdouble) + np.asarray(c, np.longdouble))


def exp_reference(m) -> np.ndarray:
    m = np.asarray(m, np.float32)
    return np.where(np.abs(m) < 64, f32(np.ceil(f32(m * GRID)) * F32(1 / 131072.0)), m).astype(np.float32)


def ex2(t, noise: float) -> np.ndarray:
    t = np.asarray(t, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp2(t.astype(np.float64))
        if noise:
            h = (t.view(np.uint32).astype(np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 20)
            p = p * (1 + (h.astype(np.float64) / (1 << 20) * 2 - 1) * noise * 2.0**-23)
    return f32(p)


def exp_before(x, m, noise):
    """2Sum on the raw max (the form of commit 9370969)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = f32(x - m)
        xs = f32(s + m)
        ms = f32(s - xs)
        err = f32(f32(x - xs) - f32(m + ms))
        return _finish(s, err, noise)


def exp_now(x, r, noise):
    with np.errstate(invalid="ignore", over="ignore"):
        s = f32(x - r)
        err = f32(x - f32(s + r))
        return _finish(s, err, noise)


def _finish(s, err, noise):
    t = f32(s * L)
    t_err = fma(s, -L, t)
    c = np.fmin(fma(t_err, -LN2, fma(s, LR, err)), F32(1))
    p = ex2(t, noise)
    return fma(p, c, p)


def softmax_model(x: torch.Tensor, *, now: bool, noise: float = 0.0) -> torch.Tensor:
    x = x.numpy().astype(np.float32)
    V = x.shape[1]
    m = np.max(x, axis=1, keepdims=True).astype(np.float32)
    e = exp_now(x, exp_reference(m), noise) if now else exp_before(x, m, noise)
    K = 62 - (math.ceil(math.log2(V)) if V > 1 else 0)
    with np.errstate(invalid="ignore"):
        terms = np.trunc(e.astype(np.float64) * 2.0**K)
    nan_row = np.isnan(terms).any(axis=1, keepdims=True)
    S = np.where(np.isnan(terms), 0, terms).astype(np.int64).sum(axis=1, keepdims=True)
    hi_raw = S.astype(np.longdouble).astype(np.float32)
    hi = f32(hi_raw * F32(2.0**-K))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = f32(np.longdouble(2.0**K) / hi_raw.astype(np.longdouble))
    if now:
        inv_lo = f32(inv * fma(-inv, hi, F32(1)))
        out = fma(e, inv, f32(e * inv_lo))
    else:
        q = f32(e * inv)
        out = fma(fma(-q, hi, e), inv, q)
    return torch.from_numpy(np.where(nan_row, np.nan, out).astype(np.float32))


# -- pairs -----------------------------------------------------------------------------------------


def check_pairs(trials: int, raw: bool, seed: int = 0) -> tuple[int, int, int]:
    """(pairs checked, pairs whose s is inexact, pairs where err is not its exact rounding error)."""
    rng = np.random.default_rng(seed)
    n = inexact = bad = 0
    for trial in range(trials):
        mag = 10.0 ** rng.uniform(-8, 3)
        m = F32(rng.choice([-1, 1]) * mag) if trial % 6 else F32(rng.uniform(-100, 100))
        xs = np.concatenate(
            [
                m - rng.uniform(0, 100, 1000),
                m - np.abs(rng.standard_normal(1000)) * rng.uniform(0.01, 40),
                rng.uniform(-200, 200, 500),
                rng.standard_normal(500) * 10.0 ** rng.uniform(-30, 2),
                np.array([m, m / 2, m * 2, -m, -2 * m, m - 87.9, np.nextafter(m, F32(-np.inf))]),
            ]
        ).astype(np.float32)
        r = F32(m) if raw else exp_reference(m)[()]
        xs = xs[xs <= m]
        s = f32(xs - r)
        keep = np.abs(s) < 88
        xs, s = xs[keep], s[keep]
        err = f32(xs - f32(s + r))
        exact = xs.astype(np.float64) - np.float64(r) - s.astype(np.float64)
        differ = err.astype(np.float64) != exact
        for i in np.nonzero(differ)[0]:  # float64 may round there: decide with rationals
            ex = Fraction(float(xs[i])) - Fraction(float(r)) - Fraction(float(s[i]))
            differ[i] = Fraction(float(err[i])) != ex
            exact[i] = float(ex)
        n += xs.size
        inexact += int((exact != 0).sum())
        bad += int(differ.sum())
    return n, inexact, bad


# -- rules -----------------------------------------------------------------------------------------


def case_seed(recipe: str, scale: float, V: int) -> int:
    return zlib.crc32(f"{recipe}/{scale:g}/{V}".encode())  # as tests/test_accuracy.py


def check_rules(noise: float, vs: tuple[int, ...], elements: int) -> bool:
    cases = [(rec, sc, V, max(4, min(1024, elements // V))) for rec, sc in TAIL_CASES for V in vs]
    cases += [("plain", sc, V, B) for B, V, sc in ISSUE_CASES]
    eps = 2.0**-23
    print(f"ex2 modelled with +-{noise:g} ulps of noise; relative errors over normal outputs (eps = 2^-23)")
    print(
        f"{'case':28s} {'B':>5s} {'F.softmax':>9s} {'before':>9s} {'x F':>6s} {'now':>9s} {'x F':>6s} "
        f"{'now/eps':>7s}  rules"
    )
    ok = True
    for rec, sc, V, B in cases:
        x = logits(B, V, seed=case_seed(rec, sc, V), recipe=rec, scale=sc)
        F = torch.softmax(x, dim=-1)
        before = ratio_to_torch(softmax_model(x, now=False, noise=noise), x, reference=F)
        y = softmax_model(x, now=True, noise=noise)
        now = ratio_to_torch(y, x, reference=F)
        verdict = []
        try:
            assert_softmax_close(y, x, what="modelled")
            verdict.append("table ok")
        except AssertionError as e:
            verdict.append("TABLE FAILS: " + str(e).splitlines()[1][:100])
            ok = False
        if now["ours"] <= now["allowed"]:
            verdict.append("ratio ok")
        else:
            verdict.append("RATIO FAILS")
            ok = False
        name = f"{rec} x{sc:g} V={V}"
        print(
            f"{name:28s} {B:5d} {now['F_softmax']:9.3g} {before['ours']:9.3g} {before['x_F_softmax']:6.3f} "
            f"{now['ours']:9.3g} {now['x_F_softmax']:6.3f} {now['ours'] / eps:7.2f}  {'; '.join(verdict)}"
        )
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pairs", help="the three-operation err against exact rationals")
    p.add_argument("--trials", type=int, default=1500, help="row maxima drawn (about 4400 pairs each)")
    p = sub.add_parser("rules", help="the modelled fp32 path against the suite's accuracy rules")
    p.add_argument("--noise", type=float, default=0.0, help="ulps of deterministic noise on ex2 (default 0)")
    p.add_argument("--v", default="600,4099,50257,262144", help="row lengths of the recipe cases")
    p.add_argument("--elements", type=int, default=1 << 19, help="elements per case (B = elements // V, 4..1024)")
    args = ap.parse_args(argv)
    if args.what == "pairs":
        n, inexact, bad = check_pairs(args.trials, raw=False)
        print(f"exp_reference: {n} pairs, {inexact} with s inexact, {bad} where err is not exact")
        n2, inexact2, bad2 = check_pairs(max(1, args.trials // 10), raw=True)
        print(f"raw max:       {n2} pairs, {inexact2} with s inexact, {bad2} where err is not exact")
        return 0 if bad == 0 and bad2 > 0 else 1
    return 0 if check_rules(args.noise, tuple(int(v) for v in args.v.split(",")), args.elements) else 1


if __name__ == "__main__":
    sys.exit(main())
