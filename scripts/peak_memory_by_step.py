"""Does a run's peak memory creep, or follow the work? Read from the runs' own logs.

    python scripts/peak_memory_by_step.py results/study-fixed              # every run of a study
    python scripts/peak_memory_by_step.py runs/<run> runs/<other run>       # or single runs

Every RL step logs the peak resident memory of its process while the step ran
(`peak_rss_gb` in metrics.jsonl, the high-water mark reset before each step) and how many
response tokens it sampled (`tokens`). A step's transient memory scales with its work (the
KV cache of the rollout, the activations of the update's micro-batches), and the work grows
over a run as RL selects the long derivations. So the last step's peak over the second's
(the "flat" test of a naive reading) mixes two things; this script separates them with a
least-squares fit over all steps of all runs given:

    peak_gb = a + b * (tokens / 10,000) [+ d * (max_len / 100)] + c * (step / 10)

(max_len, the step's longest response, where every run logs it: it sizes the KV cache and
the widest micro-batch, so it is work too). c is what the peak does over 10 steps *at equal
work*: memory that creeps (held across steps: a growing cache, fragmentation) shows as
c > 0; a peak that only follows the work as c ~ 0. Printed: per run the peaks at step 2
and at the last step with their tokens, then the fit with 95% intervals (ordinary least
squares, normal approximation).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def run_dirs(paths: list[Path]) -> list[Path]:
    """The run folders (with a metrics.jsonl) at or under each path, sorted."""
    out = []
    for p in paths:
        out += [p] if (p / "metrics.jsonl").exists() else sorted(m.parent for m in p.rglob("metrics.jsonl"))
    return out


def steps_of(run: Path) -> list[dict]:
    """(step, tokens, max_len or None, peak) of every logged step that has a peak."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": r["step"], "tokens": r["tokens"], "max_len": r.get("max_len"), "peak": r["peak_rss_gb"]}
            for r in rows if r.get("peak_rss_gb") is not None and r.get("tokens") is not None]


def fit(points: list[dict]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """OLS of peak on (1, tokens / 1e4, [max_len / 100,] step / 10): the terms, coefficients
    and their standard errors."""
    with_len = all(p["max_len"] is not None for p in points)
    names = ["GB at no work, step 0", "GB per 10k response tokens"]
    names += ["GB per 100 tokens of the longest response"] if with_len else []
    names += ["GB per 10 steps at equal work"]
    X = np.array([[1.0, p["tokens"] / 1e4] + ([p["max_len"] / 100] if with_len else []) + [p["step"] / 10]
                  for p in points])
    y = np.array([p["peak"] for p in points])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = max(len(y) - X.shape[1], 1)
    cov = np.linalg.inv(X.T @ X) * float(resid @ resid) / dof
    return names, coef, np.sqrt(np.diag(cov))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", type=Path, nargs="+", help="run folders, or folders holding runs")
    a = ap.parse_args(argv)
    runs, points = [], []
    print("run | step 2: GB, tokens | last step: GB, tokens | last / step 2")
    for run in run_dirs(a.paths):
        s = steps_of(run)
        if len(s) < 2:
            continue
        runs.append(run)
        second, last = s[1], s[-1]
        print(f"{run.name} | {second['peak']:.3f}, {second['tokens']} | {last['peak']:.3f}, {last['tokens']} "
              f"(step {last['step']}) | {last['peak'] / second['peak']:.2f}")
        points += s
    if len(points) < 4:
        print("error: fewer than 4 logged steps with a peak", file=sys.stderr)
        return 2
    try:
        names, coef, se = fit(points)
    except np.linalg.LinAlgError:
        print("error: the work and the step number move together in these steps: the fit cannot "
              "separate them", file=sys.stderr)
        return 2
    print(f"\nfit over {len(points)} steps of {len(runs)} runs (95% intervals):")
    for name, c, e in zip(names, coef, se):
        print(f"  {name}: {c:+.3f} [{c - 1.96 * e:+.3f}, {c + 1.96 * e:+.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
