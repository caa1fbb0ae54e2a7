"""Low-Probability Token Isolation (Lopti), paper Algorithm 1.

Low-probability tokens dominate a joint update with their large gradients (paper Prop. 4.2,
Fig. 1) and move the probabilities of the high-probability tokens more than those tokens' own
gradients do. Lopti separates them in time:

    1. split the response tokens by pi_old(o_t) < eta           (eta = 0.5; 0.4 Lopti-only)
    2. stage 1: update on the low-probability tokens only
    3. stage 2: update on the high-probability tokens only, starting from the parameters
       that stage 1 produced, so the high tokens' update corrects whatever stage 1 did to
       them.

Each stage is a full `grpo_update` (its own mini-batches and optimizer steps) with a
token mask; this module is only the composition. Choices, with the reference code
(the AR-Lopti fork of verl, `seperate_updating` in its ray_trainer) as the default:

- pi_old is NOT recomputed between the stages (`recompute_old=False`): stage 2's ratios,
  and so its clipping, are relative to the policy that sampled the batch. The reference
  simply reruns the actor update on the same batch. `recompute_old=True` re-evaluates
  pi_old after stage 1 instead (ratio exactly 1 at the start of stage 2).
- The split is made once, from the pre-update pi_old, and is not re-evaluated.
- Masked tokens still count in the token-mean denominator (`denominator="all"`): the
  reference zeroes the other stage's advantages and multiplies its KL term by a mask but
  keeps the response mask, so each stage is scaled by its share of the tokens.
  `denominator="masked"` averages over the stage's own tokens instead.
- Low-first by default; `order="high_first"` is the ablation the paper reports to
  collapse training (the reference encodes it as a negative eta, splitting by
  pi_old >= |eta|, which is the same partition).
- A stage (or a mini-batch within it) with no tokens makes no optimizer step. The
  reference would step AdamW on a zero gradient, which still moves the weights through
  momentum and weight decay; skipping it is what makes eta <= min pi_old or eta > 1
  reduce exactly to one GRPO update.
- AR composes: pass the AR-reweighted advantages in `batch["advantages"]`; Lopti splits
  those.
"""
from __future__ import annotations

import torch

from .grpo import GRPOConfig, batch_logprobs, grpo_update


def split_by_probability(old_logprobs: torch.Tensor, response_mask: torch.Tensor,
                         eta: float = 0.5):
    """Algorithm 1, line "split": low = pi_old(o_t) < eta, high = the other valid tokens.

    Returns (low_mask, high_mask) as float [B, R]; padding is in neither.
    """
    valid = response_mask > 0
    low = (old_logprobs.exp() < eta) & valid
    high = (~low) & valid
    return low.float(), high.float()


def lopti_update(model, ref, optimizer, batch: dict, config: GRPOConfig, eta: float = 0.5,
                 order: str = "low_first", recompute_old: bool = False,
                 denominator: str = "all") -> dict:
    """Paper Algorithm 1: two `grpo_update`s, low-probability tokens then high.

    Arguments are those of `grpo_update` plus eta, order ("low_first" | "high_first"),
    recompute_old and denominator (see the module docstring). The reference log-probs are
    computed once, before stage 1, from the frozen reference policy.

    Returns {"stage1": metrics, "stage2": metrics, "low_fraction": share of valid tokens
    with pi_old < eta}.
    """
    low, high = split_by_probability(batch["old_logprobs"], batch["response_mask"], eta)
    if order == "low_first":
        first, second = low, high
    elif order == "high_first":
        first, second = high, low
    else:
        raise ValueError(f"unknown order {order!r}")

    if config.kl_coef != 0.0 and ref is not None and not torch.is_tensor(ref):
        ref = batch_logprobs(ref, batch, config)      # once, for both stages

    m1 = grpo_update(model, ref, optimizer, batch, config, token_mask=first,
                     denominator=denominator)
    if recompute_old:
        batch = dict(batch, old_logprobs=batch_logprobs(model, batch, config))
    m2 = grpo_update(model, ref, optimizer, batch, config, token_mask=second,
                     denominator=denominator)
    n_valid = float(batch["response_mask"].sum())
    return {"stage1": m1, "stage2": m2, "low_fraction": float(low.sum()) / max(n_valid, 1.0)}
