#!/usr/bin/env bash
# Second GPU call: (1) which SDPA backend makes the tiny run's gradient NaN at step 3 on cuda,
# (2) the presets' peak memory at short sequences (parallel processes: peaks are per process).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
T=240
tiny() {  # NAME BACKENDS-CODE
  timeout $T python3 -c "import torch, runpy, sys; $2; sys.argv=['train.py','--device','cuda','--no-progress','--no-eval','--no-plots','--steps','3','--run-dir','runs/probe-$1']; runpy.run_path('train.py', run_name='__main__')" > $OUT/tiny-$1.log 2>&1
  echo "rc=$?" >> $OUT/tiny-$1.log
}
check() {  # NAME ARGS...
  n=$1; shift
  timeout $T python3 scripts/gpu_check.py --device cuda --steps 1 --out $OUT/check-$n.json "$@" > runs/check-$n.log 2>&1
  echo "== $n rc=$?" >> $OUT/checks.log; tail -25 runs/check-$n.log >> $OUT/checks.log
}
mkdir -p runs
tiny nocudnn "torch.backends.cuda.enable_cudnn_sdp(False)" &
tiny math "torch.backends.cuda.enable_cudnn_sdp(False); torch.backends.cuda.enable_flash_sdp(False); torch.backends.cuda.enable_mem_efficient_sdp(False)" &
check 0.5b --preset qwen2.5-0.5b --max-new-tokens 256 &
check 1.5b --preset qwen2.5-1.5b --max-new-tokens 128 &
check 3b --preset qwen2.5-3b --max-new-tokens 128 &
check 3b-lora --preset qwen2.5-3b --max-new-tokens 128 --lora-rank 16 &
wait
nvidia-smi --query-gpu=name,memory.total --format=csv >> $OUT/checks.log
