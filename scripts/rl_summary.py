"""Before/after tables of RL runs from their folders, and one plot of their training curves
(the README's before/after tables are this script's output).

    python scripts/rl_summary.py --before WARM_START RUN [RUN ...] [--reference OTHER] [--plot FILE]

A RUN given as LABEL=FOLDER names its row LABEL (two runs of one name in different studies).

WARM_START is the folder of the starting policy's evaluations, each RUN the folder of an RL
run (train.py's run directory, or a copy of its files), OTHER a folder shown for comparison.

Every folder is read for the files the docs' commands write, and a column a folder lacks
stays empty:

- official greedy accuracy per size: ``eval_final.json`` (train.py's final evaluation) or
  ``eval_official_greedy.json`` (``eval.py --model M``), 100 puzzles per size;
- ``eval_heldout3.json`` (``eval.py --data data/heldout3.jsonl``, greedy, 400 puzzles; a
  study run's ``eval_heldout.json`` is the same evaluation and is read when that is absent),
  ``eval_official3_k4.json`` (``--sizes 3 --samples 4``, T 0.7) and ``eval_heldout3_k2.json``
  (``--data data/heldout3.jsonl --samples 2``);
- ``metrics.jsonl`` (an RL run's per-step log): the share of derivations at the first and
  last step and the first step where it reaches 0.8 (``aggregate.selection``), the share of
  sampled tokens with pi_old < eta (``low_fraction``: what Lopti's first stage updates);
- ``token_bins.json`` (``scripts/token_bins.py``): the share of sampled tokens with
  pi_old < 0.5.

The "mean" row averages the run folders (not --before or --reference) over the runs that
have the column, and says how many that is when it is not all of them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lopti_minimal.experiments.aggregate import selection  # noqa: E402
from lopti_minimal.plots import plot_runs  # noqa: E402

SIZES = ("3", "4", "5", "6", "7")
THREE = (("official greedy", "official"), ("held-out greedy", "eval_heldout3.json"),
         ("official sampled (T 0.7, x4)", "eval_official3_k4.json"),
         ("held-out sampled (T 0.7, x2)", "eval_heldout3_k2.json"))


def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _official(folder: Path):
    """The official-set greedy evaluation of a folder: train.py's or eval.py's file."""
    return _json(folder / "eval_final.json") or _json(folder / "eval_official_greedy.json")


def _acc(report, size: str = "3"):
    if report is None or size not in report["per_size"]:
        return None
    return float(report["per_size"][size]["accuracy"])


def split_label(arg: str) -> tuple[str | None, str]:
    """"LABEL=FOLDER" -> (LABEL, FOLDER); a plain folder -> (None, FOLDER)."""
    label, sep, folder = arg.partition("=")
    return (label, folder) if sep and label and not Path(arg).exists() else (None, arg)


def read_folder(folder, label: str | None = None) -> dict:
    """One row, named ``label`` or the folder's name: accuracies by size and by evaluation,
    selection and token shares."""
    folder = Path(folder)
    official = _official(folder)
    row = {"name": label or folder.name, "sizes": {n: _acc(official, n) for n in SIZES}}
    for label, name in THREE:
        report = official if name == "official" else _json(folder / name)
        if report is None and name == "eval_heldout3.json":
            report = _json(folder / "eval_heldout.json")        # the study's file name
        row[label] = _acc(report)
    metrics = [json.loads(l) for l in (folder / "metrics.jsonl").read_text().splitlines()
               if l.strip()] if (folder / "metrics.jsonl").exists() else []
    row["metrics"] = metrics
    if metrics:
        ds = [m["derive_share"] for m in metrics]
        row["derive"] = (ds[0], ds[-1], int(selection(metrics)["steps_to_80"]), len(ds))
        row["low"] = (metrics[0]["low_fraction"], metrics[-1]["low_fraction"])
    bins = _json(folder / "token_bins.json")
    row["below_0.5"] = bins["all"]["below_0.5"] if bins else None
    return row


def mean_row(rows: list[dict]) -> dict:
    def mean(values):
        have = [v for v in values if v is not None]
        return (float(np.mean(have)), len(have)) if have else (None, 0)
    out = {"name": f"mean of {len(rows)}", "sizes": {n: mean([r["sizes"][n] for r in rows]) for n in SIZES}}
    for label, _ in THREE:
        out[label] = mean([r[label] for r in rows])
    out["below_0.5"] = mean([r["below_0.5"] for r in rows])
    return out


def _cell(v, n_rows: int | None = None, bold: bool = False) -> str:
    if isinstance(v, tuple):                    # (mean, how many runs have it)
        v, have = v
        if v is not None and have != n_rows:
            return f"{v:.3f} ({have} of {n_rows})"
    if v is None:
        return ""
    return f"**{v:.3f}**" if bold else f"{v:.3f}"


def size_table(before, runs, mean, reference) -> list[str]:
    lines = ["| greedy, official (100 per size) | " + " | ".join(f"{n} people" for n in SIZES) + " |",
             "|---" * (len(SIZES) + 1) + "|"]
    for label, row in [("before RL: " + before["name"], before)] if before else []:
        lines.append(f"| {label} | " + " | ".join(_cell(row["sizes"][n]) for n in SIZES) + " |")
    for r in runs:
        lines.append(f"| {r['name']} | " + " | ".join(_cell(r["sizes"][n]) for n in SIZES) + " |")
    if len(runs) > 1:
        lines.append(f"| **{mean['name']}** | " + " | ".join(_cell(mean["sizes"][n], len(runs), True)
                                                          for n in SIZES) + " |")
    if reference:
        lines.append(f"| reference: {reference['name']} | " +
                     " | ".join(_cell(reference["sizes"][n]) for n in SIZES) + " |")
    return lines


def three_table(before, runs, mean, reference) -> list[str]:
    head = [label for label, _ in THREE] + ["derivations: step 1 -> last (first step >= 0.8)",
                                            "tokens < eta: step 1 / last", "tokens < 0.5 (token_bins)"]
    lines = ["| 3 people | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]

    def line(label, row, n_rows=None, bold=False):
        cells = [_cell(row[k], n_rows, bold) for k, _ in THREE]
        d, low = row.get("derive"), row.get("low")
        cells.append(f"{d[0]:.2f} -> {d[1]:.2f} ({d[2] if d[2] <= d[3] else 'never'})" if d else "")
        cells.append(f"{low[0]:.3f} / {low[1]:.3f}" if low else "")
        cells.append(_cell(row["below_0.5"], n_rows))
        return f"| {label} | " + " | ".join(cells) + " |"
    if before:
        lines.append(line("before RL: " + before["name"], before))
    lines += [line(r["name"], r) for r in runs]
    if len(runs) > 1:
        lines.append(line(f"**{mean['name']}**", mean, len(runs), True))
    if reference:
        lines.append(line("reference: " + reference["name"], reference))
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="RL run folders (train.py's, or copies of their files), "
                    "each optionally LABEL=FOLDER to name its row")
    ap.add_argument("--before", default=None, help="the starting policy's folder (its evaluations)")
    ap.add_argument("--reference", default=None, help="a policy to compare with (e.g. tiny-derive's folder)")
    ap.add_argument("--plot", default=None, help="write the runs' training curves to this PNG")
    a = ap.parse_args(argv)
    labelled = [split_label(r) for r in a.runs]
    missing = [p for p in [f for _, f in labelled] + [a.before, a.reference] if p and not Path(p).is_dir()]
    if missing:
        ap.error("not a folder: " + ", ".join(missing))
    runs = [read_folder(f, label) for label, f in labelled]
    before = read_folder(a.before) if a.before else None
    reference = read_folder(a.reference) if a.reference else None
    mean = mean_row(runs)
    print("\n".join(size_table(before, runs, mean, reference)) + "\n")
    print("\n".join(three_table(before, runs, mean, reference)))
    if a.plot:
        print("\nwrote", plot_runs({r["name"]: r["metrics"] for r in runs if r["metrics"]}, a.plot))


if __name__ == "__main__":
    main()
