SUITE_BUDGET_S=420 PYTHONUNBUFFERED=1 python3 scripts/gpu_suite.py   # at commit acf74e3 (before cuDNN attention was turned off), with .whl/ holding the torchao 0.18.0 wheel
