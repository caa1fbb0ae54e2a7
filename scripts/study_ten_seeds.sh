#!/usr/bin/env bash
# The study's seeds 5-9 and the commit checks (docs/STUDY.md, "The declared test"), resumable
# across sessions and machines of one kind (2-core AMD EPYC here: seeds 1-4 ran there).
#
#   bash scripts/study_ten_seeds.sh               # set up what is missing, then run what is left
#                                                 (python: the venv of requirements-lock.txt)
#   PART=archive bash scripts/study_ten_seeds.sh  # keep the finished new runs in results/study-new-seeds
#   PART=merge bash scripts/study_ten_seeds.sh    # once seeds 5-9 are complete: they join results/study-fixed
#
# Why each step:
# - Every new seed's arms run at one commit, the one whose docs/STUDY.md declared the test
#   (DECLARED): a git worktree at it (WT), since a resumed run imports the code on disk.
# - The study folder (runs/study-fixed) is the archive results/study-fixed, with the seed-5
#   runs of GRPO, GRPO x2 and AR+Lopti (made at df8c722 for the token-fix grid) set aside in
#   runs/study-old-s5 so that seed 5 reruns them at DECLARED, plus the new runs kept so far
#   (results/study-new-seeds). The new seeds join results/study-fixed, and the report, only
#   when all five are complete: until then README, tutorial and report cite seeds 0-4.
# - Seed 5 first; then one arm of seed 1 per older commit it ran at (c7837a7: GRPO x2;
#   78a8750: Lopti; fcb85f1: AR), rerun at DECLARED into runs/commit-check and compared value
#   for value (scripts/commit_check.py) with the archived run, as is grpo-s5 with its df8c722
#   version: the declared pairing rule pairs arms of two commits only where such a check is
#   EQUAL (verdicts in OUT/commit_checks.jsonl); then seeds 6-9.
# - Two runs of one thread at a time (--jobs 2), as seeds 1-4 ran; nothing else on the cores.
set -euo pipefail
DECLARED=610bef4
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WT=${WT:-$ROOT/../study-wt}
OUT=$ROOT/runs/study-fixed
CHECK=$ROOT/runs/commit-check
NEW=$ROOT/results/study-new-seeds
cd "$ROOT"

if [ "${PART:-run}" = merge ]; then       # the report then reads ten seeds; regenerate it
  missing=0                                # the 12 arms of the new seed 5 (main, control, criterion, isolation)
  for run in "$NEW"/cpu-tiny/*-s5; do
    for s in 5 6 7 8 9; do
      d=$OUT/cpu-tiny/$(basename "${run%-s5}")-s$s
      [ -f "$d/eval_final.json" ] && [ -f "$d/eval_heldout.json" ] || missing=$((missing + 1))
    done
  done
  [ "$missing" = 0 ] || { echo "$missing runs of seeds 5-9 unfinished: nothing merged" >&2; exit 1; }
  python scripts/archive_study.py "$OUT" results/study-fixed      # the seed-5 reruns replace df8c722's
  python scripts/archive_study.py "$CHECK" results/commit-checks   # the reruns behind commit_checks.jsonl
  git rm -rq results/study-new-seeds
  exit 0
fi
if [ "${PART:-run}" = archive ]; then
  python scripts/archive_study.py "$OUT" "$NEW" --not-in results/study-fixed
  python scripts/archive_study.py "$CHECK" "$NEW/commit-check"
  exit 0
fi

[ -d "$WT" ] || git worktree add "$WT" "$DECLARED"
if [ ! -d "$OUT" ]; then
  mkdir -p "$(dirname "$OUT")"
  cp -r results/study-fixed "$OUT"
  mkdir -p runs/study-old-s5
  for arm in grpo grpo-x2 ar_lopti-a0.3-e0.5; do
    mv "$OUT/cpu-tiny/$arm-s5" runs/study-old-s5/
  done
  [ -d "$NEW/cpu-tiny" ] && cp -r "$NEW/cpu-tiny/." "$OUT/cpu-tiny/"
  [ -f "$NEW/commit_checks.jsonl" ] && cp "$NEW/commit_checks.jsonl" "$OUT/"
  [ -f "$NEW/study_log.jsonl" ] && cp "$NEW/study_log.jsonl" "$OUT/"     # the archive's lines and the new ones
fi
if [ ! -d "$CHECK" ]; then
  mkdir -p "$CHECK/cpu-tiny"
  cp "$OUT/study.json" "$CHECK/"
  cp "$OUT"/cpu-tiny/warm-start-*.json "$CHECK/cpu-tiny/"
  [ -d "$NEW/commit-check/cpu-tiny" ] && cp -r "$NEW/commit-check/cpu-tiny/." "$CHECK/cpu-tiny/"
fi

COMMON=(--jobs 2 --model checkpoints/tiny-warm --heldout data/heldout3.jsonl --heldout-steps 5 10
        --set grad_shares_every=10 --no-progress --no-report)
GRIDS=(--grid main control criterion isolation)
study() { (cd "$WT" && python -m lopti_minimal.experiments.study "$@"); }
check() {   # compare a rerun with the archived run once; the verdict goes to commit_checks.jsonl
  local run=$1 old=$2 new=$3
  grep -q "\"run\": \"$run\"" "$OUT/commit_checks.jsonl" 2>/dev/null && return 0
  [ -f "$new/eval_final.json" ] || return 0
  python scripts/commit_check.py "$old" "$new" --json "$OUT/commit_checks.jsonl" || true
}

study "${GRIDS[@]}" --seeds 10 --skip-seeds 0 1 2 3 4 6 7 8 9 --out "$OUT" "${COMMON[@]}"
check grpo-s5 runs/study-old-s5/grpo-s5 "$OUT/cpu-tiny/grpo-s5"
study --grid main control --seeds 2 --skip-seeds 0 --only grpo-x2,lopti-e0.4,ar-a0.2 --out "$CHECK" "${COMMON[@]}"
for run in grpo-x2-s1 lopti-e0.4-s1 ar-a0.2-s1; do
  check "$run" "results/study-fixed/cpu-tiny/$run" "$CHECK/cpu-tiny/$run"
done
study "${GRIDS[@]}" --seeds 10 --skip-seeds 0 1 2 3 4 --out "$OUT" "${COMMON[@]}"
