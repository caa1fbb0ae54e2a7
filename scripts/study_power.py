"""The power statement behind the study's declared margins (docs/STUDY.md, "The declared test").

    python scripts/study_power.py results/study-fixed           # seeds 0-4, as declared

For each comparison of the declared families (experiments/declared.py) and each measure, from
the per-seed differences in a study folder: their mean and standard deviation, and, by
simulation at the declared n (10 seeds), the chance that the declared test calls the
comparison
- "equivalent" (two one-sided sign-flip tests within the measure's margin) if the true mean
  difference is 0 and the differences spread as in these seeds;
- "different" (two-sided sign-flip) if the true mean is the one these seeds show;
each at alpha = 0.05 and at alpha / 8 (Holm's first step in a family of 8 tests: Holm's
power lies between the two).

Model: normal differences with the observed standard deviation (the steps are integers, so
this is an approximation; it says the scale, not the third decimal). Deterministic: a fixed
seed for the simulation. The per-seed differences are the report's (aggregate: the runs paired
as the declared test pairs them).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lopti_minimal.experiments import declared, stats  # noqa: E402
from lopti_minimal.experiments.aggregate import aggregate  # noqa: E402

MEASURES = declared.PRIMARY_MEASURES + declared.SECONDARY_MEASURES
# a comparison's place in its family, and its arms' run-folder names, by the report's labels
order = {(a.label, b.label): i for pairs in declared.FAMILIES.values() for i, (a, b) in enumerate(pairs)}
names = {v.label: v.name for pairs in declared.FAMILIES.values() for pair in pairs for v in pair}


def power(mean: float, sd: float, n: int, margin: float, alpha: float, sims: int, rng) -> tuple:
    """(P[equivalent | true mean 0], P[different | true mean = mean]) of the declared test."""
    if sd == 0:                 # every seed the same difference: the test is decided
        d0 = np.zeros(n)
        dm = np.full(n, mean)
        return (float(stats.tost_p(d0, margin) < alpha), float(stats.sign_flip_p(dm) < alpha))
    eq = sum(stats.tost_p(rng.normal(0.0, sd, n), margin) < alpha for _ in range(sims)) / sims
    diff = sum(stats.sign_flip_p(rng.normal(mean, sd, n)) < alpha for _ in range(sims)) / sims
    return eq, diff


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", help="a study folder (results/study-fixed)")
    ap.add_argument("--n", type=int, default=declared.SEEDS, help="seeds of the declared test")
    ap.add_argument("--sims", type=int, default=400, help="simulated studies per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", default="cpu-tiny", help="the study's preset")
    ap.add_argument("--margin", action="append", default=[], metavar="MEASURE=VALUE",
                    help="try another margin than the declared one (e.g. steps_to_80=2)")
    a = ap.parse_args(argv)
    margins = dict(declared.MARGINS)
    for item in a.margin:
        k, _, v = item.partition("=")
        if k not in margins:
            ap.error(f"--margin {item}: a measure is one of {', '.join(margins)}")
        margins[k] = float(v)
    dec = aggregate(Path(a.study))["presets"][a.preset]["declared"]     # the pairs as the report makes them
    rng = np.random.default_rng(a.seed)
    bonf = declared.ALPHA / (len(declared.PRIMARY) * len(declared.PRIMARY_MEASURES))
    print(f"n = {a.n} seeds; margins {margins}; P[...] at alpha {declared.ALPHA} / at {bonf:g}")
    print("| family | comparison | measure | seeds | mean | sd | P[equivalent if 0] | P[different if mean] |")
    print("|---|---|---|---|---|---|---|---|")
    for fam, rows in dec["families"].items():
        for r in sorted(rows, key=lambda r: (order[(r["a"], r["b"])], MEASURES.index(r["measure"]))):
            d = r["diffs"]
            if len(d) < 2:
                continue
            mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
            cells = [power(mean, sd, a.n, margins[r["measure"]], al, a.sims, rng) for al in (declared.ALPHA, bonf)]
            print(f"| {fam} | {names[r['a']]} - {names[r['b']]} | {r['measure']} | {len(d)} | {mean:+.3f} | {sd:.3f} | "
                  f"{cells[0][0]:.2f} / {cells[1][0]:.2f} | {cells[0][1]:.2f} / {cells[1][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
