"""Copy a study's finished runs, without their model weights, into a folder git can hold.

    python scripts/archive_study.py runs/study-fixed results/study-fixed

A study runs for hours, longer than a machine may be kept. Its report (docs/RESULTS.md) and
the per-run scripts (rl_summary.py, phrasing_diversity.py's table) read only the small
files of each run -- run.json, metrics.jsonl, the evaluations, summary.json, phrasing.json --
so those are what is kept: a run is copied only when it is finished (its eval_final.json
exists), without its checkpoints (ckpt-*/), its final policy (final/) and its plots (*.png,
which the report redraws). The preset's warm-start evaluations come along, and so do the
study's own records: study.json (the warm start's fingerprint, which a continued study
checks), study_log.jsonl (each invocation's wall time and machine, for the report) and
commit_checks.jsonl (scripts/commit_check.py's verdicts: which commits compute the same).

To continue a study on a fresh machine, copy the archive back and run the same study
command: the archived runs count as finished and are skipped (study.py's run_status).

    cp -r results/study-fixed runs/study-fixed

Run phrasing_diversity.py --study first if its table is wanted: it needs each run's final/.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lopti_minimal.experiments.aggregate import find_runs  # noqa: E402  (the report's rule)

SKIP = ("ckpt-*", "final", "*.png", ".lock")


def archive(study: Path, dest: Path, not_in: Path | None = None) -> list[Path]:
    """Copy each finished run (without SKIP), each preset's top-level .json files and the
    study's study.json, study_log.jsonl and commit_checks.jsonl. ``not_in``: an archive whose
    runs are left out where its run.json is the same file (the runs a study added to it go
    to ``dest``, e.g. new seeds kept apart until they are complete).
    Returns the run folders written. Re-running refreshes them (e.g. a new phrasing.json)."""
    written = []
    for run in find_runs(study)[0]:
        old = not_in / run.relative_to(study) / "run.json" if not_in else None
        if old is not None and old.exists() and old.read_bytes() == (run / "run.json").read_bytes():
            continue
        target = dest / run.relative_to(study)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(run, target, ignore=shutil.ignore_patterns(*SKIP))
        written.append(target)
    records = [study / n for n in ("study.json", "study_log.jsonl", "commit_checks.jsonl") if (study / n).exists()]
    for f in [*study.glob("*/*.json"), *records]:
        (dest / f.relative_to(study)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / f.relative_to(study))
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", type=Path, help="the study's --out folder")
    ap.add_argument("dest", type=Path, help="the archive folder (e.g. results/study-fixed)")
    ap.add_argument("--not-in", type=Path, help="leave out the runs this archive already holds (same run.json)")
    a = ap.parse_args(argv)
    if not a.study.is_dir():
        print(f"error: {a.study} is not a folder", file=sys.stderr)
        return 2
    written = archive(a.study, a.dest, a.not_in)
    print(f"{len(written)} finished runs copied to {a.dest} (without {', '.join(SKIP)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
