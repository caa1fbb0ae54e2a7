"""Do two commits compute the same run? Compare one run made at each, value for value.

    python scripts/commit_check.py results/study-fixed/cpu-tiny/grpo-s5 runs/study-fixed/cpu-tiny/grpo-s5

The study pairs a seed's arms only where they ran alike (experiments/grid.py, choice 4); its
declared test (docs/STUDY.md) pairs arms made at different commits only where a rerun shows
the commits compute the same. This is that check: the same (variant, seed) run at two
commits, on one kind of CPU, torch and thread count, compared in every per-step value both
logged (metrics.jsonl; a metric one commit added is named, not compared) except times and
memory, in the held-out evaluations along the run and at the end, and in the final
evaluation's per-size accuracy. Exact equality, no tolerance: bit-identical steps or not.
Prints a verdict and, with --json, writes it where the study's report can read it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lopti_minimal import runs  # noqa: E402
from lopti_minimal.experiments.grid import config_diff, machine_key  # noqa: E402

# What a run logs that depends on the moment and the machine's load, not on its numbers.
TIMING = ("sample_s", "update_s", "step_s", "mechanism_s", "peak_rss_gb")


def run_facts(run: Path) -> dict:
    saved = json.loads((run / "run.json").read_text())
    return {"commit": (saved.get("code") or {}).get("commit"), "dirty": (saved.get("code") or {}).get("dirty"),
            "machine": machine_key(saved), "config": saved["config"]}


def compare(a: Path, b: Path) -> dict:
    """{"equal": bool, "steps", "compared", "first_difference", "only_in_a", "only_in_b", ...}."""
    ma, mb = runs.read_jsonl(a / "metrics.jsonl"), runs.read_jsonl(b / "metrics.jsonl")
    fa, fb = run_facts(a), run_facts(b)
    out = {"a": str(a), "b": str(b), "commit_a": fa["commit"], "commit_b": fb["commit"],
           "machine_a": fa["machine"], "machine_b": fb["machine"], "steps": [len(ma), len(mb)]}
    first, compared = None, 0
    keys_a = set().union(*(m.keys() for m in ma)) - set(TIMING)
    keys_b = set().union(*(m.keys() for m in mb)) - set(TIMING)
    out["only_in_a"], out["only_in_b"] = sorted(keys_a - keys_b), sorted(keys_b - keys_a)
    for x, y in zip(ma, mb):
        for k in sorted(keys_a & keys_b):
            compared += 1
            if first is None and json.dumps(x.get(k)) != json.dumps(y.get(k)):
                first = f"step {x.get('step')}: {k} {x.get(k)!r} vs {y.get(k)!r}"
    files = sorted(p.name for p in a.glob("eval_heldout*.json") if (b / p.name).exists())
    for name in files:
        ea, eb = (json.loads((r / name).read_text())["overall"]["accuracy"] for r in (a, b))
        compared += 1
        if first is None and ea != eb:
            first = f"{name}: {ea} vs {eb}"
    if (a / "eval_final.json").exists() and (b / "eval_final.json").exists():
        pa, pb = (json.loads((r / "eval_final.json").read_text())["per_size"] for r in (a, b))
        compared += 1
        if first is None and {k: v["accuracy"] for k, v in pa.items()} != {k: v["accuracy"] for k, v in pb.items()}:
            first = "eval_final.json: per-size accuracy"
    if len(ma) != len(mb) and first is None:
        first = f"steps: {len(ma)} vs {len(mb)}"
    same_machine = fa["machine"] == fb["machine"]
    differs = config_diff(fa["config"], fb["config"])        # where it writes, threads etc. ignored
    out.update(compared=compared, heldout_files=files, first_difference=first, same_machine=same_machine,
               equal=first is None and same_machine and not differs)
    if differs:
        out["first_difference"] = first or f"the configs differ in {', '.join(differs)}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="a run folder (made at one commit)")
    ap.add_argument("b", help="the same variant and seed, made at another commit")
    ap.add_argument("--json", help="append the verdict as a line to this file (e.g. STUDY/commit_checks.jsonl)")
    a = ap.parse_args(argv)
    r = compare(Path(a.a), Path(a.b))
    verdict = "EQUAL" if r["equal"] else "DIFFERENT"
    print(f"{verdict}: {r['commit_a'][:7] if r['commit_a'] else '?'} vs {r['commit_b'][:7] if r['commit_b'] else '?'}, "
          f"{r['compared']} values compared over {r['steps'][0]} steps"
          + (f"; first difference: {r['first_difference']}" if r["first_difference"] else "")
          + ("" if r["same_machine"] else f"; machines differ: {r['machine_a']} vs {r['machine_b']}")
          + (f"; logged only at one commit (not compared): {r['only_in_a'] + r['only_in_b']}"
             if r["only_in_a"] or r["only_in_b"] else ""))
    if a.json:
        runs.append_jsonl(Path(a.json), {k: r[k] for k in ("commit_a", "commit_b", "equal", "compared",
                                                             "first_difference", "only_in_a", "only_in_b")}
                          | {"run": Path(a.a).name, "machine": r["machine_a"]})
    return 0 if r["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
