"""Shared test setup.

Tests are deterministic (fixed seeds) and sized for a 2-core CPU.  LOPTI_TEST_THREADS
sets torch's intra-op threads (default: 2, the CI machine's cores).
"""
import os

import torch

torch.set_num_threads(int(os.environ.get("LOPTI_TEST_THREADS", "2")))
