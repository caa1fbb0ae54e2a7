#!/usr/bin/env bash
# RL on a real pretrained LM, from scratch: SmolLM2-135M-Instruct from its supervised LoRA
# warm start (checkpoints/smollm2-kk-sft-compact), `--preset smollm2-kk` at each seed, and,
# per seed, the same start trained supervised for the RL run's wall time (the control that tells RL's
# gain from more supervised training). Every policy is evaluated greedily on the 400
# held-out 3-person puzzles (each response kept, so differences pair by puzzle) and on the
# official 3-person set. About 2.3 hours per seed on a 2-core CPU (an hour of RL steps, an
# hour of supervised steps, 20 minutes of evaluations).
#
# Rerun after an interruption: what is finished is skipped, an RL run resumes from its last
# checkpoint (every 10 steps), the control from its saved state (every 25 steps).
# Usage: bash scripts/smollm2_kk_rl.sh [OUT]  (default results/smollm2-kk-compact; the weights
# stay under runs/). SEEDS="0 1" and THREADS=2 by default; START=ADAPTER_FOLDER runs the same
# from another supervised start (lm_warmstart --out) into its own OUT: results/smollm2-kk-rl
# is START=checkpoints/smollm2-kk-sft's. RL_ARGS adds options to train.py: the preset's lr,
# prompts a step and steps were 2e-4, 2 and 30 for results/smollm2-kk-rl and
# results/smollm2-kk-compact (RL_ARGS="--lr 2e-4 --prompts-per-step 2 --steps 30" reruns them).
# Needs scripts/fetch_smollm2.py first.
set -euo pipefail
OUT=${1:-results/smollm2-kk-compact}
SEEDS=${SEEDS:-0 1}
THREADS=${THREADS:-2}
START=${START:-checkpoints/smollm2-kk-sft-compact}
heldout() {   # MODEL FOLDER: greedy, 400 held-out puzzles, the responses saved
  [ -f "$2/eval_heldout3.json" ] || python eval.py --model "$1" --data data/heldout3.jsonl \
    --max-new-tokens 512 --threads "$THREADS" --save-responses --no-progress --out "$2/eval_heldout3.json"
}
official() {  # MODEL FOLDER: greedy, the 100 official 3-person puzzles
  [ -f "$2/eval_official3.json" ] || python eval.py --model "$1" --sizes 3 --max-new-tokens 512 \
    --threads "$THREADS" --no-progress --out "$2/eval_official3.json"
}
mkdir -p "$OUT/start"
heldout "$START" "$OUT/start"
official "$START" "$OUT/start"
for s in $SEEDS; do
  run=runs/$(basename "$OUT")-s$s
  if [ ! -f "$run/summary.json" ]; then
    if compgen -G "$run/ckpt-*" > /dev/null; then
      python train.py --resume "$run" --no-progress
    else
      rm -rf "$run"
      # shellcheck disable=SC2086  # RL_ARGS: several options, split on purpose
      python train.py --preset smollm2-kk --model "$START" --seed "$s" --eval-before --threads "$THREADS" \
        --run-dir "$run" --no-progress ${RL_ARGS:-}
    fi
  fi
  mkdir -p "$OUT/rl-s$s"
  cp "$run"/{run.json,metrics.jsonl,summary.json,eval_before.json,eval_final.json,training.png} "$OUT/rl-s$s/"
  heldout "$run/final" "$OUT/rl-s$s"

  sft=runs/$(basename "$OUT")-sft-s$s
  if [ ! -f "$sft/warmstart.json" ]; then
    if [ -d "$sft.resume" ]; then
      python -m lopti_minimal.experiments.lm_warmstart --resume "$sft" --threads "$THREADS" --no-progress
    else
      n=$(python scripts/smollm2_kk_summary.py --control-steps "$run" "$START")
      # seed s + 1: puzzles other than the start's own (it was trained at seed 0)
      # (--init continues the start's own chain-of-thought style)
      python -m lopti_minimal.experiments.lm_warmstart --init "$START" --steps "$n" --seed $((s + 1)) \
        --out "$sft" --threads "$THREADS" --no-progress
    fi
  fi
  mkdir -p "$OUT/sft-s$s"
  cp "$sft/warmstart.json" "$OUT/sft-s$s/"
  heldout "$sft" "$OUT/sft-s$s"
  official "$sft" "$OUT/sft-s$s"
done
python scripts/smollm2_kk_summary.py "$OUT"
