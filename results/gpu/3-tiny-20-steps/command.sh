#!/usr/bin/env bash
# Third GPU call: the default tiny run on cuda, 20 steps, with cuDNN attention off (the fix),
# beside the CUDA tests and the ci preset.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
mkdir -p runs
( timeout 100 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_precision.py tests/test_sampling.py tests/test_grpo.py tests/test_lopti.py tests/test_gpu_presets.py > $OUT/pytest-cuda.log 2>&1; echo "rc=$?" >> $OUT/pytest-cuda.log ) &
( timeout 100 python3 train.py --preset ci --device cuda --no-progress --run-dir runs/ci-cuda > $OUT/ci-cuda.log 2>&1; echo "rc=$?" >> $OUT/ci-cuda.log ) &
( timeout 185 python3 train.py --device cuda --no-progress --no-eval --no-plots --steps 20 --run-dir runs/tiny-cuda > $OUT/tiny-cuda.log 2>&1; echo "rc=$?" >> $OUT/tiny-cuda.log; cp runs/tiny-cuda/metrics.jsonl runs/tiny-cuda/run.json $OUT/ ) &
wait
