#!/usr/bin/env bash
# A SmolLM2 start built the way checkpoints/tiny-warm is, and its measurements before any RL:
# the paper's regime (a behaviour to select, many uncertain tokens) on a real pretrained LM.
#
#   bash scripts/smollm2_two_behaviour.sh [OUT]      # default runs/smollm2-two; resumable
#
# 1. Stage 1 (lm_warmstart --style two-behaviour --guess-share 0): a fresh LoRA on the
#    SmolLM2-135M-Instruct base (not the compact start) learns phrased derivations with tail
#    words from the first step, on 3-person puzzles, every held-out set excluded, targets up
#    to 640 tokens (a phrased 3-person derivation reaches 569 SmolLM2 tokens: none is cut).
# 2. Stage 2 (--init stage 1): tiny-warm's second stage, 70% of the targets guesses, 5% of the
#    puzzles without a solution; the loss divided by a constant (choice 7 of lm_warmstart).
# 3. Before any RL, on data/heldout3.jsonl: greedy accuracy (400 puzzles) and with the
#    derivation forced (eval.py --response-prefix '\n '); sampled at T 0.7 in groups of 8 on
#    LIMIT puzzles (scripts/headroom.py): accuracy, the share of derivations, of informative
#    groups, of tokens below pi_old 0.5 and what they are (phrasing choices or reasoning).
# Each step is skipped when its output exists; an interrupted stage continues from its saved
# state (lm_warmstart --resume), headroom.py within its file.
# STEPS1 (400), STEPS2 (150), LR (1e-3), LIMIT (64), THREADS (2). Needs scripts/fetch_smollm2.py.
set -euo pipefail
OUT=${1:-runs/smollm2-two}
STEPS1=${STEPS1:-400}
STEPS2=${STEPS2:-150}
LR=${LR:-1e-3}
LIMIT=${LIMIT:-64}
THREADS=${THREADS:-2}
BUDGET=640
COMMON=(--style two-behaviour --sizes 3 --max-response-tokens "$BUDGET" --lr "$LR" --threads "$THREADS" --no-progress)
mkdir -p "$OUT"

stage() {   # stage OUT_DIR ARGS...: run it, or continue it, or skip it when done
  local dir=$1; shift
  if [ -f "$dir/adapter_model.safetensors" ] && [ -f "$dir/warmstart.json" ]; then return 0; fi
  if [ -f "$dir.resume" ] || [ -d "$dir.resume" ]; then
    python -m lopti_minimal.experiments.lm_warmstart --resume "$dir" --threads "$THREADS" --no-progress
  else
    python -m lopti_minimal.experiments.lm_warmstart --out "$dir" "$@"
  fi
}
stage "$OUT/stage1" "${COMMON[@]}" --steps "$STEPS1" --guess-share 0 --unsolvable-share 0
stage "$OUT/start" "${COMMON[@]}" --init "$OUT/stage1" --steps "$STEPS2" --guess-share 0.7 --unsolvable-share 0.05

M=$OUT/measure
mkdir -p "$M"
[ -f "$M/greedy3.json" ] || python eval.py --model "$OUT/start" --data data/heldout3.jsonl --max-new-tokens "$BUDGET" \
  --threads "$THREADS" --save-responses --no-progress --out "$M/greedy3.json"
[ -f "$M/forced3.json" ] || python eval.py --model "$OUT/start" --data data/heldout3.jsonl --max-new-tokens "$BUDGET" \
  --response-prefix '\n ' --threads "$THREADS" --no-progress --out "$M/forced3.json"
python scripts/headroom.py --preset smollm2-kk --model "$OUT/start" --data data/heldout3.jsonl --order run \
  --limit "$LIMIT" --max-new-tokens "$BUDGET" --threads "$THREADS" --no-progress --out "$M/sampled3.json"
