"""The study's declared test: what the ten-seed study asks, decided before its new seeds ran.

docs/STUDY.md ("The declared test") states it in words; this module holds the same choices
as constants, so the report (report.py) and the power statement (scripts/study_power.py)
read one definition.

Design choices:

1. Two families of four comparisons, each an arm minus its twin, paired by seed. The primary
   family asks what carries Lopti's head start over GRPO (Lopti alone, eta 0.4, the
   paper's Lopti-only K&K setting): its second optimizer step (Lopti - GRPO x2), its
   criterion (a random split of the same size - Lopti), its order (high first - Lopti),
   its shared optimizer state (a state per stage - Lopti). The secondary family asks the
   same of AR+Lopti (alpha 0.3, eta 0.5): reported with the same test, its own Holm.
2. Measures: steps to 80% derivations and the derivation-share area (its continuous
   twin; aggregate.selection) are primary; final held-out accuracy (400 puzzles) is
   secondary. Holm runs over a family's comparisons x primary measures (8 tests); the
   secondary measure gets its own Holm over the 4 comparisons.
3. The test: exact paired sign-flip p (stats.sign_flip_p), Holm-adjusted; equivalence by
   two one-sided sign-flip tests within MARGINS, Holm-adjusted the same way; the verdict
   "different", "equivalent" or "undetermined" at ALPHA (stats.verdict).
4. Margins (one per measure, chosen from the five-seed spreads with the power statement
   in docs/STUDY.md): 2 steps, 0.04 of derivation area, 0.05 of held-out accuracy.
"""
from __future__ import annotations

from .grid import (AR_LOPTI, AR_LOPTI_HIGH, AR_LOPTI_PER_STAGE, AR_LOPTI_RANDOM, GRPO_X2, LOPTI,
                   LOPTI_HIGH, LOPTI_PER_STAGE, LOPTI_RANDOM, same_machine_seeds)
from .stats import holm, mean_ci, sign_flip_p, tost_p, verdict

ALPHA = 0.05
SEEDS = 10                        # the declared sample: seeds 0-9 of every arm below
PRIMARY = ((LOPTI, GRPO_X2), (LOPTI_RANDOM, LOPTI), (LOPTI_HIGH, LOPTI), (LOPTI_PER_STAGE, LOPTI))
SECONDARY = ((AR_LOPTI, GRPO_X2), (AR_LOPTI_RANDOM, AR_LOPTI), (AR_LOPTI_HIGH, AR_LOPTI),
             (AR_LOPTI_PER_STAGE, AR_LOPTI))
FAMILIES = {"primary": PRIMARY, "secondary": SECONDARY}
# aggregate.selection's keys and the held-out accuracy; primary measures share one Holm
PRIMARY_MEASURES = ("steps_to_80", "derive_auc")
SECONDARY_MEASURES = ("heldout",)
MARGINS = {"steps_to_80": 2.0, "derive_auc": 0.04, "heldout": 0.05}
MEASURE_WORDS = {"steps_to_80": "steps to 80% derivations", "derive_auc": "derivation-share area",
                 "heldout": "final held-out accuracy"}


def commit_classes(checks: list[dict]) -> dict[str, str]:
    """{commit (12 characters): its class's name}: commits joined where a rerun at one of them
    equalled a run at the other value for value (scripts/commit_check.py's EQUAL lines in the
    study's commit_checks.jsonl), transitively; a class is named by its smallest commit."""
    parent: dict[str, str] = {}

    def find(c: str) -> str:
        while parent.setdefault(c, c) != c:
            c = parent[c]
        return c
    for chk in checks:
        if chk.get("equal") and chk.get("commit_a") and chk.get("commit_b"):
            x, y = find(chk["commit_a"][:12]), find(chk["commit_b"][:12])
            parent[max(x, y)] = min(x, y)
    return {c: find(c) for c in list(parent)}


def code_class(run: dict, classes: dict) -> str:
    """A run's commits (aggregate's "code_key"), each named by its class (commit_classes)."""
    return " + ".join(classes.get(c, c) for c in run.get("code_key", "not recorded").split(" + "))


def _machine(run: dict) -> dict:
    """The run's machine without the code (this test names the seeds apart for their commits)."""
    return {k: v for k, v in run["machine"].items() if k != "code"}


def _comparison(groups: dict, a, b, measure: str, classes: dict) -> dict | None:
    """a minus b on one measure, paired by seed over the seeds both ran alike: one kind of
    CPU, torch and thread count (grid.py, choice 4) and one commit, or commits shown to
    compute the same (``classes``). The per-seed differences, their mean and 95% t interval,
    the sign-flip p and the equivalence p within the measure's margin (both before Holm);
    "apart": the seeds left out because their arms ran at commits not shown equal."""
    if a not in groups or b not in groups:
        return None
    ra, rb = ({r["seed"]: r for r in groups[v]} for v in (a, b))
    both = sorted(set(ra) & set(rb))
    seeds, _ = same_machine_seeds({v: {r["seed"]: _machine(r) for r in groups[v]} for v in (a, b)}, both)
    apart = [s for s in seeds if code_class(ra[s], classes) != code_class(rb[s], classes)]
    seeds = [s for s in seeds if s not in apart
             and ra[s].get(measure) is not None and rb[s].get(measure) is not None]
    diffs = [ra[s][measure] - rb[s][measure] for s in seeds]
    if not diffs:
        return None
    ci = mean_ci(diffs)
    return {"a": a.label, "b": b.label, "measure": measure, "seeds": seeds, "apart": apart, "diffs": diffs,
            "n": len(diffs),
            "mean": ci["mean"], "lo": ci["lo"], "hi": ci["hi"],
            "p": sign_flip_p(diffs), "tost": tost_p(diffs, MARGINS[measure])}


def declared_table(groups: dict, checks: list[dict] = ()) -> dict:
    """The declared test on the finished runs (``groups``: {Variant: runs}, aggregate's;
    ``checks``: the study's commit checks): per family, its comparisons x measures with p
    and the equivalence p, each Holm-adjusted within the family's primary tests or its
    held-out tests, and the verdict."""
    classes = commit_classes(list(checks))
    out = {"declared_n": SEEDS, "alpha": ALPHA, "margins": dict(MARGINS), "families": {},
           "equal_commits": sorted({(c, r) for c, r in classes.items() if c != r})}
    for fam, pairs in FAMILIES.items():
        rows = []
        for measures, kind in ((PRIMARY_MEASURES, "primary"), (SECONDARY_MEASURES, "secondary")):
            block = [dict(c, kind=kind) for a, b in pairs for m in measures
                     if (c := _comparison(groups, a, b, m, classes))]
            for key in ("p", "tost"):
                for row, adj in zip(block, holm([r[key] for r in block])):
                    row[f"{key}_holm"] = adj
            for row in block:
                row["verdict"] = verdict(row["p_holm"], row["tost_holm"], ALPHA)
            rows += block
        out["families"][fam] = rows
    return out
