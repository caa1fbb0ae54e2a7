"""What RL does to the reward-irrelevant tokens: the diversity of the phrasing choices.

    python scripts/phrasing_diversity.py --model checkpoints/tiny-warm       # one policy
    python scripts/phrasing_diversity.py --study runs/study-fixed             # every finished run

The shipped warm start phrases its derivations freely (task/phrasing.py): at every node
line, check, verdict, line end and answer line it picked one of 3-4 words uniformly, and
any choice scores the same. These choice tokens are most of the tokens below pi_old = 0.5,
the ones the paper's AR and Lopti treat differently. RL has no reason to keep or drop a
choice, except through the gradient that flows to these tokens from the advantage of the
response they sit in. So: does GRPO collapse them faster than AR or Lopti, and does that
matter for accuracy?

For a policy: G samples (T 0.7, as the RL rollouts) for each of --prompts generated
3-person puzzles that no run trains on (scripts/token_bins.py's sampler and seed); the
choices each derivation made are read back (phrasing.choices); per kind of choice, the
entropy of the options taken, divided by log(number of options), so 1 = the uniform
choice the warm start was taught and 0 = always the same word. "mean" averages the kinds.
The token bins of the same samples (token_bins.measure) come along.

With --study: the warm start and every finished run (its final policy) of a study folder,
each written to RUN/phrasing.json (skipped when there); then per method: the mean
normalised entropy (mean and 95% t interval over seeds), the paired difference from GRPO,
and the correlation of the mean entropy with held-out accuracy across all runs and within
methods (each run's values minus its method's means: seed-to-seed, not arm-to-arm).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))        # token_bins


def normalised_entropy(options: list[str], k: int) -> float | None:
    """Entropy of the empirical distribution of ``options`` / log(k); None if empty."""
    n = len(options)
    if n == 0:
        return None
    h = -sum(c / n * math.log(c / n) for c in Counter(options).values())
    return h / math.log(k)


def diversity(texts: list[str]) -> dict:
    """Per kind of choice: how many were read, the normalised entropy and the counts."""
    from lopti_minimal.task import phrasing
    from lopti_minimal.task.behaviours import DERIVE, behaviour_of
    taken = {k: [] for k in phrasing.CHOICE_KINDS}
    derivations = [t for t in texts if behaviour_of(t) == DERIVE]
    for t in derivations:
        for kind, opts in phrasing.choices(t).items():
            taken[kind] += opts
    kinds = {k: {"n": len(v), "entropy": normalised_entropy(v, len(phrasing.CHOICE_KINDS[k])),
                 "counts": dict(Counter(v))} for k, v in taken.items()}
    ent = [d["entropy"] for d in kinds.values() if d["entropy"] is not None]
    return {"derivations": len(derivations), "kinds": kinds, "mean": sum(ent) / len(ent) if ent else None}


def measure_policy(model_path: str, prompts: int, group_size: int, seed: int) -> dict:
    from token_bins import load_policy, measure
    model, tok = load_policy(model_path)
    res = measure(model, tok, prompts, group_size, seed=seed, keep_texts=True)
    texts = res.pop("texts")
    return {"model": model_path, "diversity": diversity(texts), "token_bins": res}


def format_one(res: dict) -> str:
    d = res["diversity"]
    lines = [f"{res['model']}: {d['derivations']} derivations; normalised entropy of each choice "
             "(1 = uniform, as taught; 0 = one word)"]
    for k, v in d["kinds"].items():
        e = "  -  " if v["entropy"] is None else f"{v['entropy']:.3f}"
        lines.append(f"  {k:<12} {e}  ({v['n']} choices)")
    lines.append(f"  {'mean':<12} {d['mean']:.3f}" if d["mean"] is not None else "  mean -")
    return "\n".join(lines)


def study_table(out: Path, prompts: int, group_size: int, seed: int, log=print) -> dict:
    """Measure the warm start and every finished run of a study folder; per-method table."""
    from lopti_minimal.experiments.grid import GRPO, HELDOUT_FILE, Variant
    from lopti_minimal.experiments.aggregate import find_runs
    from lopti_minimal.experiments.stats import mean_ci, paired_diff
    from lopti_minimal.runs import saved_config
    done, _ = find_runs(out)
    study = json.loads((out / "study.json").read_text())
    rows = {}
    warm = None
    for preset, info in study["presets"].items():
        path = out / preset / "warm-start-phrasing.json"
        if not path.exists():
            log(f"[phrasing] warm start {info['model']}")
            path.write_text(json.dumps(measure_policy(info["model"], prompts, group_size, seed), indent=1))
        warm = json.loads(path.read_text())
    for d in done:
        path = d / "phrasing.json"
        if not path.exists():
            log(f"[phrasing] {d}")
            path.write_text(json.dumps(measure_policy(str(d), prompts, group_size, seed), indent=1))
        res = json.loads(path.read_text())
        cfg = saved_config(d)
        v = Variant.from_config(cfg)
        held = d / HELDOUT_FILE
        rows.setdefault(v, {})[int(cfg["seed"])] = {
            "entropy": res["diversity"]["mean"],
            "below_0.5": res["token_bins"]["all"]["below_0.5"],
            "heldout": json.loads(held.read_text())["overall"]["accuracy"] if held.exists() else None}
    table = {}
    for v, by_seed in rows.items():
        ent = {s: r["entropy"] for s, r in by_seed.items() if r["entropy"] is not None}
        base = {s: r["entropy"] for s, r in rows.get(GRPO, {}).items() if r["entropy"] is not None}
        table[v.label] = {"n": len(ent), "entropy": mean_ci(ent.values()),
                          "below_0.5": mean_ci(r["below_0.5"] for r in by_seed.values()),
                          "vs_grpo": paired_diff(ent, base) if v != GRPO and len(set(ent) & set(base)) > 1 else None}
    groups = [[(r["entropy"], r["heldout"]) for r in by_seed.values()
               if r["entropy"] is not None and r["heldout"] is not None] for by_seed in rows.values()]
    return {"warm_start": warm, "methods": table, **correlations(groups)}


def correlations(groups: list[list[tuple[float, float]]]) -> dict:
    """Pearson r of (entropy, held-out accuracy) pairs, one group per method: over all runs,
    and within methods (each run's values minus its method's means), so that a method that
    lowers both -- a difference between arms -- does not make the second correlation."""
    import numpy as np
    pairs = [p for g in groups for p in g]
    within = [(e - me, h - mh) for g in groups if len(g) > 1
              for me, mh in [np.mean(g, axis=0)] for e, h in g]
    r = lambda ps: float(np.corrcoef(*zip(*ps))[0, 1]) if len(ps) > 2 else None  # noqa: E731
    return {"corr_entropy_heldout": r(pairs), "n_runs": len(pairs),
            "corr_within_methods": r(within), "n_within": len(within)}


def format_study(t: dict) -> str:
    w = t["warm_start"]["diversity"]
    lines = [f"warm start: mean normalised choice entropy {w['mean']:.3f}, tokens below 0.5 "
             f"{t['warm_start']['token_bins']['all']['below_0.5']:.3f}", "",
             "| method | runs | choice entropy (1 = as taught) | Δ vs GRPO [paired 95% CI] | tokens below 0.5 |",
             "|---|---|---|---|---|"]
    for label, r in t["methods"].items():
        e, b, d = r["entropy"], r["below_0.5"], r["vs_grpo"]
        cell = lambda c: f"{c['mean']:.3f}" + (f" ± {c['half']:.3f}" if c["half"] is not None else "")  # noqa: E731
        dc = f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]" if d and d["lo"] is not None else "–"
        lines.append(f"| {label} | {r['n']} | {cell(e)} | {dc} | {cell(b)} |")
    if t["corr_entropy_heldout"] is not None:
        lines += ["", f"Correlation of a run's choice entropy with its held-out accuracy, over "
                      f"{t['n_runs']} runs: r = {t['corr_entropy_heldout']:+.2f}"]
    if t.get("corr_within_methods") is not None:
        lines += [f"Within methods (each run minus its method's means), over {t['n_within']} runs: "
                  f"r = {t['corr_within_methods']:+.2f}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF folder, or a run directory (its final policy)")
    src.add_argument("--study", help="a study folder (python -m lopti_minimal.experiments.study --out)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=424243)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", help="write the numbers here (JSON)")
    a = ap.parse_args(argv)
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model:
        res = measure_policy(a.model, a.prompts, a.group_size, a.seed)
        print(format_one(res))
    else:
        res = study_table(Path(a.study), a.prompts, a.group_size, a.seed)
        print(format_study(res))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
