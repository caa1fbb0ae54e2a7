#!/usr/bin/env bash
# Every figure of docs/PERFORMANCE.md's "Results", in the order the document gives them, each
# benchmark's JSON and printed output into OUT. Printed figures, not tests: run it on an
# otherwise idle machine (any other job on the same cores distorts every time here).
#
#   bash benchmarks/all.sh [OUT]        # default OUT: runs/bench; THREADS=2 by default
#
# About an hour on a 2-core CPU, most of it the two TRL comparisons. Needs the environment of
# requirements.txt (TRL included) and SmolLM2-135M-Instruct (fetched here
# with scripts/fetch_smollm2.py if models/ lacks it).
set -euo pipefail
OUT=${1:-runs/bench}
T=${THREADS:-2}
mkdir -p "$OUT"
python -c "import trl" 2>/dev/null || {
  echo "error: TRL is not installed: pip install -r requirements.txt" >&2; exit 2; }
[ -f models/smollm2-135m-instruct/config.json ] || python scripts/fetch_smollm2.py
run() {   # NAME COMMAND...: the command's output to OUT/NAME.txt and the terminal
  echo "== $1: ${*:2}"
  "${@:2}" 2>&1 | tee "$OUT/$1.txt"
}
# the RL step on the tiny model: sampler vs generate, update vs bare forward+backward,
# phase split per method, memory with / without gradient checkpointing
run rl-step-tiny python benchmarks/rl_step.py --threads "$T" --json "$OUT/rl-step-tiny.json"
# gradient checkpointing's memory on SmolLM2-135M
run rl-step-smollm2-mem python benchmarks/rl_step.py --threads "$T" --preset smollm2-cpu \
  --parts memory --json "$OUT/rl-step-smollm2-mem.json"
# where the time of one step goes
run rl-step-smollm2 python benchmarks/rl_step.py --threads "$T" --preset smollm2-cpu --parts step \
  --steps 1 --methods ar_lopti --json "$OUT/rl-step-smollm2.json"
run rl-step-smollm2-m16 python benchmarks/rl_step.py --threads "$T" --preset smollm2-cpu --parts step \
  --steps 1 --methods ar_lopti --set mmap_threshold_mb=16 --json "$OUT/rl-step-smollm2-m16.json"
run flops-smollm2 python benchmarks/flops.py --threads "$T" --positions 560 --response 300
run profile python benchmarks/rl_step.py --threads "$T" --parts profile --methods grpo
# the two decode steps (transformers' forward vs decode.py), one thread as in the study
run sampler-speed python benchmarks/sampler_speed.py --threads 1 --repeats 3 --json "$OUT/sampler-speed.json"
# ours against TRL's GRPOTrainer, the same work in one process
run trl-tiny python benchmarks/trl_side_by_side.py --threads "$T" --json "$OUT/trl-tiny.json"
run trl-smollm2 python benchmarks/trl_side_by_side.py --threads "$T" --preset smollm2-cpu --steps 2 \
  --json "$OUT/trl-smollm2.json"
# host memory per phase of a default run, next to TRL's on the same steps
run memory python benchmarks/memory.py --steps 3 --threads "$T" --trl --json "$OUT/memory.json"
echo "all figures in $OUT"
