"""Statistics of the study: Student-t intervals without scipy (study.py, design choice 5).

Design choices:

1. mean_ci: mean over seeds and its 95% interval, mean +- t * s / sqrt(n).
2. paired_diff: the per-seed differences from a baseline, their paired t interval and the
   relative change (the seeds are paired: common random numbers, study.py choice 2).
3. detectable: the smallest difference a paired comparison of n seeds would detect.
4. No scipy dependency: the t quantiles come from a table (n <= 31) and an asymptotic
   expansion beyond it (study.py choice 5).
5. The declared test of the study's primary family (docs/STUDY.md, "The declared test"):
   an exact paired sign-flip test (sign_flip_p: every one of the 2^n sign assignments of
   the per-seed differences, so ties and zero variance need no special case), Holm's step-down
   adjustment within a family (holm), and equivalence within a margin by two one-sided
   sign-flip tests (tost_p); verdict() turns the adjusted p values into words.
"""
from __future__ import annotations

import math

import numpy as np


# Two-sided 95% critical values t_{0.975, df} of Student's t distribution, df = 1..30, as
# printed in standard tables (e.g. NIST/SEMATECH e-Handbook of Statistical Methods,
# section 1.3.6.7.2, "Critical values of the Student's t distribution").
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
        17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
        25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042}


# One-sided 80% quantiles t_{0.80, df} (same tables), for the smallest difference a paired
# t test at the 5% level detects with 80% power; beyond df = 30 the normal quantile 0.8416.
T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883,
       10: 0.879, 11: 0.876, 12: 0.873, 13: 0.870, 14: 0.868, 15: 0.866, 16: 0.865, 17: 0.863,
       18: 0.862, 19: 0.861, 20: 0.860, 21: 0.859, 22: 0.858, 23: 0.858, 24: 0.857, 25: 0.856,
       26: 0.856, 27: 0.855, 28: 0.855, 29: 0.854, 30: 0.854}


def t975_expansion(df: float) -> float:
    """The asymptotic (Cornish-Fisher) expansion of the t quantile in powers of 1/df around
    the normal quantile z = 1.959964 (Abramowitz & Stegun 26.7.5); within 1e-3 of the
    table from df = 10, used beyond df = 30."""
    z = 1.959963985
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least 2 values (df >= 1)")
    return T975[df] if df in T975 else t975_expansion(df)


def mean_ci(values) -> dict:
    """Mean and 95% t interval: mean +- t_{0.975, n-1} * s / sqrt(n). With one value the
    interval is undefined (None)."""
    x = np.asarray(list(values), dtype=float)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "half": None, "lo": None, "hi": None}
    m = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": m, "sd": None, "half": None, "lo": None, "hi": None}
    sd = float(x.std(ddof=1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "sd": sd, "half": half, "lo": m - half, "hi": m + half}


def detectable(sd: float | None, n: int) -> float | None:
    """The smallest true paired difference that a two-sided paired t test at the 5% level
    detects with 80% power, for n pairs whose differences have standard deviation sd:
    (t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n) (the usual planning approximation, sd
    taken as known)."""
    if sd is None or n < 2:
        return None
    df = n - 1
    return (t975(df) + T80.get(df, 0.8416)) * sd / math.sqrt(n)


def paired_diff(a_by_seed: dict, b_by_seed: dict) -> dict:
    """a - b on the seeds both have: mean, paired t interval, and the relative change
    (mean difference / mean of b on those seeds; its interval divides the paired interval
    by that mean, which is treated as fixed). excludes_zero: None with fewer than 2 pairs.
    mde80: the difference these seeds could detect (`detectable`)."""
    seeds = sorted(set(a_by_seed) & set(b_by_seed))
    diffs = [a_by_seed[s] - b_by_seed[s] for s in seeds]
    d = mean_ci(diffs)
    d["diffs"] = diffs
    d["mde80"] = detectable(d["sd"], d["n"])
    base = float(np.mean([b_by_seed[s] for s in seeds])) if seeds else None
    rel = lambda v: (v / base) if (v is not None and base) else None   # noqa: E731
    excl = None if d["lo"] is None else bool(d["lo"] > 0 or d["hi"] < 0)
    return {**d, "seeds": seeds, "base_mean": base, "rel": rel(d["mean"]), "rel_lo": rel(d["lo"]),
            "rel_hi": rel(d["hi"]), "excludes_zero": excl}



# ---------------------------------------------------------------------------------------
# The declared test (choice 5): sign-flip, Holm, two one-sided tests
# ---------------------------------------------------------------------------------------

# Means within this of the observed one count as "as extreme": the sums of a few decimals
# in another order differ in the last bits.
_TIE = 1e-9


def _flipped_means(d: np.ndarray) -> np.ndarray:
    """The mean of s * d for every sign vector s in {-1, +1}^n (2^n values; n <= 20)."""
    n = len(d)
    if n > 20:
        raise ValueError(f"an exact sign-flip test enumerates 2^n assignments: n = {n} is too many")
    signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1)
    return (signs * d[None, :]).mean(1)


def sign_flip_p(diffs, alternative: str = "two-sided") -> float | None:
    """Exact paired sign-flip (randomisation) test of "the per-seed differences are
    symmetric about 0": the share of the 2^n sign assignments whose mean is at least as
    extreme as the observed mean. A zero difference flips into itself, so ties and a zero
    variance need no special case (all zeros: p = 1). alternative: "two-sided", "greater"
    (the mean is above 0) or "less". None for no differences."""
    d = np.asarray(list(diffs), dtype=float)
    if len(d) == 0:
        return None
    m, means = float(d.mean()), _flipped_means(d)
    if alternative == "two-sided":
        return float(np.mean(np.abs(means) >= abs(m) - _TIE))
    if alternative == "greater":
        return float(np.mean(means >= m - _TIE))
    if alternative == "less":
        return float(np.mean(means <= m + _TIE))
    raise ValueError(f"alternative {alternative!r}: two-sided, greater or less")


def tost_p(diffs, margin: float) -> float | None:
    """Equivalence within +-margin by two one-sided sign-flip tests: H0 "mean <= -margin"
    (the differences + margin are symmetric about 0, rejected when their mean is large) and
    H0 "mean >= +margin" (the differences - margin, rejected when small). The larger of the
    two p values: below alpha, the mean difference lies within the margin."""
    d = np.asarray(list(diffs), dtype=float)
    if len(d) == 0:
        return None
    return max(sign_flip_p(d + margin, "greater"), sign_flip_p(d - margin, "less"))


def holm(pvalues) -> list:
    """Holm's step-down adjustment of a family of p values (None stays None): the i-th
    smallest of k is multiplied by k - i + 1, capped at 1, and made non-decreasing in that
    order. Reject where the adjusted p < alpha: the family-wise error is at most alpha."""
    items = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    k, out, run = len(items), list(pvalues), 0.0
    for rank, (p, i) in enumerate(items):
        run = max(run, min(1.0, (k - rank) * p))
        out[i] = run
    return out


def verdict(p_holm: float | None, tost_holm: float | None, alpha: float = 0.05) -> str:
    """The declared words (docs/STUDY.md): "different" where the Holm-adjusted two-sided p
    is below alpha, else "equivalent" where the Holm-adjusted equivalence p is, else
    "undetermined"."""
    if p_holm is not None and p_holm < alpha:
        return "different"
    if tost_holm is not None and tost_holm < alpha:
        return "equivalent"
    return "undetermined"
