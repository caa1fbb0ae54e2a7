#!/usr/bin/env bash
# RL on a real pretrained LM, from scratch: SmolLM2-135M-Instruct from a supervised LoRA
# warm start, one RL run per seed and method on SIZE-person puzzles, and, per seed of
# CONTROLS, the same start trained supervised for the wall time of that seed's first RL run
# (the control that tells RL's gain from more supervised training). Every policy is
# evaluated greedily on the 400 held-out SIZE-person puzzles of data/heldout<SIZE>.jsonl
# (each response kept, so differences pair by puzzle), on 3 people too when SIZE is not 3
# (what training on larger puzzles costs on the ones the start was best at), and on the
# official SIZE-person set.
# SIZE=3 with the defaults is the script as it ran for the 3-person runs before the autocast
# fix (docs/HISTORY.md): about 2.3 hours per seed on a 2-core CPU (an hour of RL steps, an
# hour of supervised steps, 20 minutes of evaluations). At 4 people the responses are longer
# (budget 1,024 tokens); how long a step takes is what metrics.jsonl records, not assumed here.
#
# Rerun after an interruption: what is finished is skipped, an RL run resumes from its last
# checkpoint (every 10 steps; every step for SIZE=4), the control from its saved state (every 25 steps).
# On a fresh checkout (runs/ gone) a run whose OUT folder holds its summary and evaluations is
# not redone; a control whose OUT folder holds warmstart.json but no evaluations is retrained for
# the steps that file records (its calibration is not repeated), then evaluated.
# Usage: bash scripts/smollm2_kk_rl.sh [OUT]   (the weights stay under runs/; needs
# scripts/fetch_smollm2.py first). Settings, by environment variable:
#   SIZE     people per RL and held-out puzzle: 3 (default) or 4; another size needs PRESET
#            and BUDGET given.
#   PRESET   train.py's preset: smollm2-kk for SIZE=3, smollm2-kk4 for SIZE=4.
#   METHODS  train.py --method, one RL run each: "grpo ar_lopti" for SIZE=4 (the paper's
#            comparison, paired by seed). Otherwise ar_lopti by default: the
#            presets set no method, so train.py's default, the paper's AR+Lopti, is what
#            every 3-person rl-s<S> run trained with; each method takes its own paper
#            settings in train.py (config.METHODS: AR alpha 0.2, Lopti eta 0.4, AR+Lopti
#            alpha 0.3 and eta 0.5, GRPO neither).
#   SEEDS    "0 1" by default. THREADS: 2.
#   CONTROLS the seeds that get a supervised control: every seed for SIZE=3 (as the
#            3-person runs had), seed 0 only for SIZE=4 (each control there costs as long as
#            an RL run and its evaluations, about two hours; one control for equal time is
#            what the results compare RL against).
#   START    the supervised adapter folder (lm_warmstart --out) RL and the control start from:
#            checkpoints/smollm2-kk-sft-compact for SIZE=3, the shipped
#            checkpoints/smollm2-kk-sft-compact-396 (the preset's model) otherwise.
#   RL_ARGS  more train.py options: the preset's lr, prompts a step and steps were 2e-4, 2
#            and 30 for the first 3-person runs
#            (RL_ARGS="--lr 2e-4 --prompts-per-step 2 --steps 30" reruns them).
#   BUDGET   new tokens of the evaluations on SIZE people: 512 for 3 (above every faithful
#            3-person trace: the longest is 486 tokens, scripts/target_lengths.py), 1,024
#            for 4 (the preset's RL budget: 0.3% of faithful traces are longer). The
#            3-person evaluations of a larger SIZE keep 512, so they compare with the
#            start's and results/smollm2-kk-*.
# The control's steps are the RL run's summed step time over seconds per supervised step:
# for SIZE=3 the start's own (its warmstart.json: targets of at most 384 tokens, 2-4 people),
# as the 3-person controls ran; otherwise those of the control's own first 10 steps
# (runs/<OUT>-sft-s<S>.calibrate: the same seed, sizes and budget, so the same batches), since
# targets of up to 1,024 tokens make a step slower than the start's. The summary's training
# minutes say how close the control came to its RL run.
# OUT defaults to results/smollm2-kk-compact for SIZE=3 and results/smollm2-kk<SIZE> otherwise.
# Its folders: start/, rl-<method>-s<S>/ (rl-s<S> for SIZE=3's ar_lopti, the name the
# 3-person runs had), sft-s<S>/; then scripts/smollm2_kk_summary.py writes OUT/summary.md.
set -euo pipefail
SIZE=${SIZE:-3}
case $SIZE in
  3) PRESET=${PRESET:-smollm2-kk}; BUDGET=${BUDGET:-512}
     START=${START:-checkpoints/smollm2-kk-sft-compact}; OUT=${1:-results/smollm2-kk-compact} ;;
  4) PRESET=${PRESET:-smollm2-kk4}; BUDGET=${BUDGET:-1024}
     START=${START:-checkpoints/smollm2-kk-sft-compact-396}; OUT=${1:-results/smollm2-kk4}
     METHODS=${METHODS:-grpo ar_lopti} ;;
  *) if [ -z "${PRESET:-}" ] || [ -z "${BUDGET:-}" ]; then
       echo "error: SIZE=$SIZE has no default preset or budget: give PRESET and BUDGET (SIZE 3 and 4 have them)" >&2
       exit 2
     fi
     START=${START:-checkpoints/smollm2-kk-sft-compact-396}; OUT=${1:-results/smollm2-kk$SIZE} ;;
esac
if [ ! -f "data/heldout$SIZE.jsonl" ]; then
  echo "error: data/heldout$SIZE.jsonl not found (python scripts/heldout_set.py --size $SIZE makes it)" >&2
  exit 2
fi
METHODS=${METHODS:-ar_lopti}
SEEDS=${SEEDS:-0 1}
if [ "$SIZE" = 3 ]; then CONTROLS=${CONTROLS-$SEEDS}; else CONTROLS=${CONTROLS-0}; fi
THREADS=${THREADS:-2}

heldout() {   # MODEL FOLDER N TOKENS: greedy, the 400 held-out N-person puzzles, the responses saved
  [ -f "$2/eval_heldout$3.json" ] || python eval.py --model "$1" --data "data/heldout$3.jsonl" \
    --max-new-tokens "$4" --threads "$THREADS" --save-responses --no-progress --out "$2/eval_heldout$3.json"
}
evaluate() {  # MODEL FOLDER: the held-out SIZE-person set, and the 3-person one at 512 (forgetting)
  heldout "$1" "$2" "$SIZE" "$BUDGET"
  [ "$SIZE" = 3 ] || heldout "$1" "$2" 3 512
}
official() {  # MODEL FOLDER: greedy, the 100 official SIZE-person puzzles
  [ -f "$2/eval_official$SIZE.json" ] || python eval.py --model "$1" --sizes "$SIZE" --max-new-tokens "$BUDGET" \
    --threads "$THREADS" --no-progress --out "$2/eval_official$SIZE.json"
}
config_of() { # FILE KEY: a run.json's or warmstart.json's config[KEY]
  python -c 'import json, sys; print(json.load(open(sys.argv[1]))["config"][sys.argv[2]])' "$1" "$2"
}
evaluated() { # FOLDER: true when it holds every evaluation evaluate() writes
  [ -f "$1/eval_heldout$SIZE.json" ] && { [ "$SIZE" = 3 ] || [ -f "$1/eval_heldout3.json" ]; }
}
name() {      # METHOD SEED: a run's folder name after rl- (and runs/<OUT>-)
  if [ "$SIZE" = 3 ] && [ "$1" = ar_lopti ]; then echo "s$2"; else echo "$1-s$2"; fi
}
# train.py's official evaluation of the start before any step (eval_before.json): for SIZE=3
# as it always ran; otherwise start/eval_official<SIZE>.json is the same greedy evaluation
# of the same policy, not worth repeating per run at 1,024 tokens.
before=(); [ "$SIZE" = 3 ] && before=(--eval-before)
# The control's puzzles: for SIZE=3 lm_warmstart's default mix (2-4 people, the start's own,
# as every 3-person control); otherwise the RL run's size, so the control trains on what
# RL trains on.
sizes=(); [ "$SIZE" = 3 ] || sizes=(--sizes "$SIZE")

mkdir -p "$OUT/start"
evaluate "$START" "$OUT/start"
official "$START" "$OUT/start"
for s in $SEEDS; do
  first=""
  for m in $METHODS; do
    run=runs/$(basename "$OUT")-$(name "$m" "$s")
    folder=$OUT/rl-$(name "$m" "$s")
    first=${first:-$folder}   # its run.json and metrics.jsonl pace the control
    if [ ! -f "$run/summary.json" ] && [ -f "$folder/summary.json" ] && evaluated "$folder"; then
      continue                # finished on an earlier checkout: its weights are not needed again
    fi
    if [ ! -f "$run/summary.json" ]; then
      if compgen -G "$run/ckpt-*" > /dev/null; then
        python train.py --resume "$run" --no-progress
      else
        rm -rf "$run"
        # shellcheck disable=SC2086  # RL_ARGS: several options, split on purpose
        python train.py --preset "$PRESET" --method "$m" --model "$START" --seed "$s" ${before[@]+"${before[@]}"} \
          --threads "$THREADS" --run-dir "$run" --no-progress ${RL_ARGS:-}
      fi
    fi
    mkdir -p "$folder"
    cp "$run"/{run.json,metrics.jsonl,summary.json,eval_final.json,training.png} "$folder/"
    [ ! -f "$run/eval_before.json" ] || cp "$run/eval_before.json" "$folder/"
    evaluate "$run/final" "$folder"
  done

  case " $CONTROLS " in *" $s "*) ;; *) continue ;; esac
  sft=runs/$(basename "$OUT")-sft-s$s
  kept=$OUT/sft-s$s
  if [ ! -f "$sft/warmstart.json" ] && evaluated "$kept" && [ -f "$kept/eval_official$SIZE.json" ]; then
    continue                  # finished on an earlier checkout
  fi
  if [ ! -f "$sft/warmstart.json" ]; then
    if [ -d "$sft.resume" ]; then
      python -m lopti_minimal.experiments.lm_warmstart --resume "$sft" --threads "$THREADS" --no-progress
    else
      # Targets up to the RL run's sampling budget (384 for smollm2-kk, lm_warmstart's
      # default; 1,024 for smollm2-kk4), so the control can learn the long traces RL samples
      budget=$(config_of "$first/run.json" max_new_tokens)
      if [ -f "$kept/warmstart.json" ]; then
        n=$(config_of "$kept/warmstart.json" steps)   # trained on an earlier checkout: the same steps
      else
        # The wall time of this seed's first RL run, in seconds per supervised step
        # (smollm2_kk_summary.py, design choice 2): the start's own for SIZE=3, else the
        # control's first 10 steps, timed (the same seed, so the same batches)
        pace=$START
        if [ "$SIZE" != 3 ]; then
          pace=$sft.calibrate
          [ -f "$pace/warmstart.json" ] || python -m lopti_minimal.experiments.lm_warmstart --init "$START" \
            --steps 10 --seed $((s + 1)) --max-response-tokens "$budget" ${sizes[@]+"${sizes[@]}"} --out "$pace" \
            --state-every-steps 0 --threads "$THREADS" --no-progress
        fi
        n=$(python scripts/smollm2_kk_summary.py --control-steps "$first" "$pace")
      fi
      # seed s + 1: puzzles other than the start's own (it was trained at seed 0)
      # (--init continues the start's own chain-of-thought style)
      python -m lopti_minimal.experiments.lm_warmstart --init "$START" --steps "$n" --seed $((s + 1)) \
        --max-response-tokens "$budget" ${sizes[@]+"${sizes[@]}"} --out "$sft" --threads "$THREADS" --no-progress
    fi
  fi
  mkdir -p "$kept"
  cp "$sft/warmstart.json" "$kept/"
  evaluate "$sft" "$kept"
  official "$sft" "$kept"
done
python scripts/smollm2_kk_summary.py "$OUT" --size "$SIZE"
