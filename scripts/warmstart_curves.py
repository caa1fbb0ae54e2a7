"""Two or more warm starts' evaluations side by side, step by step (markdown table).

    python scripts/warmstart_curves.py CHECKPOINT [CHECKPOINT ...]      # e.g. checkpoints/tiny-warm-stage1
    python scripts/warmstart_curves.py CHECKPOINT OUT.resume            # and a run still going

Each argument is a warm-start checkpoint folder (or its warmstart.json; the OUT.resume folder
of a run still going holds every evaluation so far): the `history` the
warm start records at every periodic evaluation (experiments/warmstart.py: greedy accuracy on
the first --eval-per-size official puzzles and on the --heldout-per-size generated
held-out puzzles, per size in `eval_sizes`) and at the final one.  Rows are matched by
the evaluation's position in the history, so two runs evaluated every N steps line up;
the step and the minutes of each run are printed next to its figures, so a mismatch is
visible.  Why it exists: to compare a candidate warm start with another at equal steps
(e.g. phrased derivations learned from the start against canonical ones).
"""
from __future__ import annotations

import argparse
import json
import os


def load_history(path: str) -> list[dict]:
    """The evaluations recorded in a warm start's warmstart.json (a folder or the file)."""
    file = os.path.join(path, "warmstart.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
        raise SystemExit(f"no warmstart.json at {path!r}")
    with open(file) as f:
        return json.load(f)["history"]


def cell(entry: dict | None, split: str, size: str) -> str:
    if entry is None or size not in entry.get(split, {}):
        return ""
    return f"{entry[split][size]['accuracy']:.3f}"        # 40 puzzles: steps of 0.025


def table(histories: dict[str, list[dict]]) -> str:
    """One row per evaluation index; per run: step, minutes and greedy accuracy on the
    official and held-out sets of each evaluated size (final rows marked)."""
    sizes = sorted({s for h in histories.values() for e in h if not e.get("final")
                    for s in e.get("official", {})}, key=int)
    head = ["eval"]
    for name in histories:
        head += [f"{name} step", "min"] + [f"off {s}p" for s in sizes] + [f"held {s}p" for s in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = max(len(h) for h in histories.values())
    for i in range(rows):
        row = [str(i + 1)]
        for h in histories.values():
            e = h[i] if i < len(h) else None
            step = "" if e is None else f"{e['step']}{' (final)' if e.get('final') else ''}"
            row += [step, "" if e is None else f"{e['minutes']:.0f}"]
            row += [cell(e, "official", s) for s in sizes] + [cell(e, "heldout", s) for s in sizes]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="warm-start checkpoint folders or warmstart.json files")
    a = ap.parse_args(argv)
    print(table({os.path.basename(os.path.normpath(r)) or r: load_history(r) for r in a.runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
