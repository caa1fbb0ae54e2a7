"""lopti-minimal: a small, exact, readable reimplementation of "Do Not Let Low-Probability
Tokens Over-Dominate in RL for LLMs" (Yang et al., 2025, arXiv 2505.12929).

Design choices (the module map: docs/ARCHITECTURE.md):

1. The method as the paper states it: GRPO, Advantage Reweighting (AR, Eq. 4) and
   Low-Probability Token Isolation (Lopti, Algorithm 1), on Knights-and-Knaves logic
   puzzles.
2. Three layers: the method in flat modules here, each one idea; the task in task/; the
   experiments in experiments/, which import the core, while the core never imports them.
3. One public surface, `__all__`: `from lopti_minimal import reweight_advantages,
   split_by_probability, lopti_update, ...` (README, "Use AR and Lopti in your own
   trainer"); TRL's trainer is apart, in lopti_minimal.trl_grpo.
"""

__version__ = "0.1.0"

import logging as _logging

# torchao (the 8-bit optimizer of the large GPU presets, precision.py) is imported by
# transformers whenever it is installed, and on import it warns about CUDA kernels it
# cannot load on this machine and about torch.compile registrations: noise on every CPU
# run, nothing to act on. Real errors still show.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)

# The public surface, imported on first use (PEP 562): `import lopti_minimal` stays free of
# torch, so `train.py --help` (which imports lopti_minimal.cli) answers at once.
_PUBLIC = {
    "group_advantages": "grpo",       # GRPO's group baseline (paper §2)
    "policy_loss": "grpo",            # the clipped surrogate of Eq. 1 (dual clip)
    "kl_k3": "grpo",                  # the k3 KL of Eq. 1
    "grpo_update": "grpo",            # one GRPO update (token-mean over the mini-batch)
    "reweight_advantages": "reweight",    # Advantage Reweighting, Eq. 4
    "split_by_probability": "lopti",      # Lopti's token split, Algorithm 1
    "lopti_update": "lopti",              # Lopti's two-stage update, Algorithm 1
    "TrainConfig": "config",
    "train": "trainer",
}
__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name):
    if name in _PUBLIC:
        import importlib
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value            # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_PUBLIC})
