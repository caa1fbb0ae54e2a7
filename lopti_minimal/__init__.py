"""lopti-minimal: a small, exact, readable reimplementation of "Do Not Let Low-Probability
Tokens Over-Dominate in RL for LLMs" (Yang et al., 2025, arXiv 2505.12929).

Design choices (the module map: docs/ARCHITECTURE.md):

1. The method as the paper states it: GRPO, Advantage Reweighting (AR, Eq. 4) and
   Low-Probability Token Isolation (Lopti, Algorithm 1), on Knights-and-Knaves logic
   puzzles.
2. Three layers: the method in flat modules here, each one idea; the task in task/; the
   experiments in experiments/, which import the core, while the core never imports them.
"""

__version__ = "0.1.0"

import logging as _logging

# torchao (the 8-bit optimizer of the large GPU presets, precision.py) is imported by
# transformers whenever it is installed, and on import it warns about CUDA kernels it
# cannot load on this machine and about torch.compile registrations: noise on every CPU
# run, nothing to act on. Real errors still show.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
