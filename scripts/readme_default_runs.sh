#!/usr/bin/env bash
# The README's default-run table and figure, from scratch: three seeds of `python train.py`,
# each evaluated as the table reports it, and the two warm starts it is compared with.
# About 1 hour on a 2-core CPU. Usage: bash scripts/readme_default_runs.sh [OUT] (default
# results/rl-default-fixed, the table's runs, made with requirements-lock.txt's versions on a
# 2-core AMD EPYC; the warm starts' evaluations go to $WARM, default results/warmstart).
# A run in runs/readme-default-sS is reused only if it finished at the current commit: a
# rerun after a change of the code trains again.
set -euo pipefail
OUT=${1:-results/rl-default-fixed}
WARM=${WARM:-results/warmstart}
THREADS=${THREADS:-2}
HEAD=$(git rev-parse HEAD)
evals() {   # MODEL FOLDER: the held-out and sampled evaluations the table reads
  python eval.py --model "$1" --data data/heldout3.jsonl --threads "$THREADS" --out "$2/eval_heldout3.json"
  python eval.py --model "$1" --sizes 3 --samples 4 --threads "$THREADS" --out "$2/eval_official3_k4.json"
  python eval.py --model "$1" --data data/heldout3.jsonl --samples 2 --threads "$THREADS" --out "$2/eval_heldout3_k2.json"
  python scripts/token_bins.py --model "$1" --threads "$THREADS" --out "$2/token_bins.json"
}
for s in 0 1 2; do
  run=runs/readme-default-s$s
  if [ -f "$run/summary.json" ] && python -c "import json, sys; sys.exit(json.load(open('$run/run.json'))['code']['commit'] != '$HEAD')"; then
    echo "reusing $run (finished at $HEAD)"
  else
    rm -rf "$run"
    python train.py --seed $s --threads "$THREADS" --run-dir "$run" --no-progress
  fi
  mkdir -p "$OUT/tiny-warm-s$s"
  cp "$run"/{run.json,metrics.jsonl,summary.json,eval_final.json,training.png,accuracy_by_size.png} "$OUT/tiny-warm-s$s/"
  evals "$run" "$OUT/tiny-warm-s$s"
done
for w in tiny-warm tiny-derive; do
  python eval.py --model checkpoints/$w --threads "$THREADS" --out "$WARM/$w/eval_official_greedy.json"
  evals checkpoints/$w "$WARM/$w"
done
python scripts/rl_summary.py --before "$WARM/tiny-warm" "$OUT"/tiny-warm-s0 "$OUT"/tiny-warm-s1 \
  "$OUT"/tiny-warm-s2 --reference "$WARM/tiny-derive" --plot "$OUT/tiny-warm-seeds.png"
