"""Advantage Reweighting (AR), paper Eq. 4.

    A_hat_t = (alpha * pi_old(o_t) + (1 - alpha)) * A_t,      pi_old(o_t) = exp(old log-prob)

Design choices:

1. Why: low-probability tokens carry large gradients (paper Prop. 4.2, Fig. 1): the norm
   of d log pi(o_t) / d z is about (1 - pi(o_t)). AR damps them by scaling each token's
   advantage linearly in its old probability.
2. Once per batch, right after the advantages are computed, for positive and negative
   advantages alike.
3. The weight runs from 1 - alpha (a token the old policy found impossible) to 1 (a certain
   token), so high-probability tokens keep their full advantage and the rest are scaled
   down. alpha = 0 is plain GRPO, bit for bit.
4. alpha = 0.3 in the K&K AR+Lopti runs, 0.2 for AR alone, 0.1 for math (the paper's
   per-method settings). In the reference launch scripts this is
   `reweight_method=both_linear_normal` with reweight_k = alpha and reweight_tau = 1 - alpha.
"""
from __future__ import annotations

import torch


def reweight_weights(old_logprobs: torch.Tensor, alpha: float = 0.3) -> torch.Tensor:
    """The per-token factor of Eq. 4: alpha * pi_old + (1 - alpha), in [1 - alpha, 1]."""
    return alpha * old_logprobs.exp() + (1.0 - alpha)


def reweight_advantages(token_advantages: torch.Tensor, old_logprobs: torch.Tensor,
                        alpha: float = 0.3) -> torch.Tensor:
    """Paper Eq. 4: A_hat = (alpha * pi_old + 1 - alpha) * A, applied to both signs.

    token_advantages: [B, R] (0 on padding, which stays 0); old_logprobs: [B, R], log pi_old
    at the sampling temperature (by default recomputed by a teacher-forced forward,
    trainer.make_batch; else as the sampler recorded it).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must lie in [0, 1]")
    return reweight_weights(old_logprobs, alpha) * token_advantages


def mean_weight(old_logprobs: torch.Tensor, response_mask: torch.Tensor, alpha: float) -> float:
    """The mean of Eq. 4's factor over the valid tokens (response_mask > 0): by how much AR
    scales a step's advantages on average, 1 - alpha to 1 (the step's `ar_weight`)."""
    w = reweight_weights(old_logprobs, alpha) * response_mask
    return float(w.sum()) / max(float(response_mask.sum()), 1.0)
