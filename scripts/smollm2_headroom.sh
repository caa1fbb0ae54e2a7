#!/usr/bin/env bash
# Before any RL on a real pretrained LM: where does the SmolLM2 start have headroom?
# Measured on puzzles no run has seen (data/heldout4.jsonl, data/heldout5.jsonl: 400 each,
# scripts/heldout_set.py --size N), for the shipped compact-trace start:
#   1. the faithful trace's length per size (scripts/target_lengths.py: no model, seconds);
#   2. greedy accuracy on every held-out puzzle of 4 and 5 people at a budget that cuts off
#      (almost) no faithful trace, each response kept (eval.py --save-responses), and where
#      each response first leaves the trace (scripts/trace_errors.py, with how many are
#      longer than the RL budgets);
#   3. what an RL run would sample (scripts/headroom.py): accuracy at T 0.7 in groups of 8,
#      the share of groups whose rewards differ (the only ones GRPO learns from), lengths
#      and cut-offs, and the share of sampled tokens below pi_old 0.5 (what AR and Lopti act
#      on), on the first LIMIT puzzles in the order an RL run on the file would draw them;
#   4. the same at T 1.0 on 4 people (LIMIT / 2 puzzles): the model's own distribution, where
#      a start trained on one trace per puzzle may still leave its tokens more uncertain.
# Every step is skipped when its output exists, and headroom.py resumes within a file, so
# a rerun after an interruption goes on where it stopped.
# Usage: bash scripts/smollm2_headroom.sh [OUT]   (default results/smollm2-headroom)
# START (default checkpoints/smollm2-kk-sft-compact-396), BUDGET (1024), LIMIT (64 puzzles),
# THREADS (2). Needs scripts/fetch_smollm2.py first.
set -euo pipefail
OUT=${1:-results/smollm2-headroom}
START=${START:-checkpoints/smollm2-kk-sft-compact-396}
BUDGET=${BUDGET:-1024}
LIMIT=${LIMIT:-64}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
[ -f "$OUT/target_lengths.txt" ] || python scripts/target_lengths.py data/heldout3.jsonl data/heldout4.jsonl \
  data/heldout5.jsonl --budgets 384 512 768 1024 > "$OUT/target_lengths.txt"
for n in 4 5; do
  [ -f "$OUT/greedy$n.json" ] || python eval.py --model "$START" --data "data/heldout$n.jsonl" \
    --max-new-tokens "$BUDGET" --threads "$THREADS" --save-responses --no-progress --out "$OUT/greedy$n.json"
  [ -f "$OUT/trace_errors$n.txt" ] || python scripts/trace_errors.py --data "data/heldout$n.jsonl" \
    --tokens-over 384 "$OUT/greedy$n.responses.jsonl" > "$OUT/trace_errors$n.txt"
done
for n in 4 5; do
  python scripts/headroom.py --preset smollm2-kk --model "$START" --data "data/heldout$n.jsonl" --order run \
    --limit "$LIMIT" --max-new-tokens "$BUDGET" --threads "$THREADS" --no-progress --out "$OUT/sampled$n.json"
done
python scripts/headroom.py --preset smollm2-kk --model "$START" --data data/heldout4.jsonl --order run \
  --limit $((LIMIT / 2)) --temperature 1.0 --max-new-tokens "$BUDGET" --threads "$THREADS" --no-progress \
  --out "$OUT/sampled4-t1.json"
