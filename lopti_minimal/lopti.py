"""Low-Probability Token Isolation (Lopti), paper Algorithm 1.

Low-probability tokens dominate a joint update with their large gradients (paper Prop. 4.2,
Fig. 1); Lopti separates them in time: split the response tokens by pi_old(o_t) < eta
(eta = 0.5; 0.4 Lopti-only), update on the low-probability tokens only, then on the
high-probability ones, starting from the parameters stage 1 produced. Each stage is a full
`grpo_update` with a token mask; this module is only the composition. In full:
docs/ARCHITECTURE.md.

Note for every reader: by default the two stages step ONE optimizer state, as the reference
does, so under AdamW the isolation is not complete: on a fresh state stage 2's step follows a
first moment of 0.47 g_low + 0.53 g_high, half of it the low-probability tokens' gradient
(choice 8).
`lopti_optimizer="per_stage"` gives each stage its own state, and stage 2 steps on the
high-probability tokens' gradient alone.

Design choices (the reference, `seperate_updating` in the AR-Lopti fork's ray_trainer, is
the default):

1. pi_old is NOT recomputed between the stages (`recompute_old=False`), as the reference
   simply reruns the actor update on the same batch; `recompute_old=True` re-evaluates it.
2. The split is made once, from the pre-update pi_old, and is not re-evaluated.
3. Masked tokens still count in the token-mean denominator (`denominator="all"`), as in
   the reference, so each stage is scaled by its share of the tokens; `"masked"` averages
   over the stage's own tokens.
4. Low-first by default; `order="high_first"` is the ablation the paper reports to collapse
   training (the reference's negative eta, the same partition).
5. The split is the paper's, by probability, by default (`split="probability"`, Algorithm 1).
   `split="random"` is a control that is not in the paper: the first stage holds as many
   tokens as the probability split's low stage, drawn uniformly from all valid tokens of
   the batch, so two stages over disjoint tokens remain and only the criterion is gone.
   Its draw comes from a generator of its own (`split_generator`, from the run's seed and
   step), so the sampler's random stream, and hence every rollout, is unchanged.
6. A stage (or mini-batch) with no tokens makes no optimizer step (the reference would step
   AdamW on a zero gradient), so eta <= min pi_old or eta > 1 is exactly one GRPO update.
7. AR composes: pass the AR-reweighted advantages as `batch.advantages`.
8. The two stages share ONE optimizer state by default, as in the reference, whose
   `seperate_updating` reruns the actor update with the same actor and its same AdamW. The
   isolation is then exact only under plain SGD: AdamW's moments carry stage 1's gradient
   into stage 2's step. On a fresh state (betas 0.9, 0.999) stage 2's bias-corrected first
   moment is (0.09 g_low + 0.1 g_high) / 0.19 = 0.47 g_low + 0.53 g_high, and its second
   moment about half g_low^2, half g_high^2: the low-probability tokens' gradient makes up
   about half of the step meant to update the high ones (later in a run, 0.09 of the
   current g_low beside 0.1 of g_high, on top of the history of both).
   `lopti_optimizer="per_stage"` (not in the paper; `StageOptimizers`, which
   precision.build_optimizer builds for every optimizer kind) gives each stage an optimizer
   of its own over the same parameters, stepping only in its stage: stage 2's step is
   exactly what a fresh optimizer would make from stage 1's weights on the high tokens'
   gradient, and carries nothing of stage 1's (tests/test_lopti.py). It costs a second
   optimizer state; both are checkpointed. A state belongs to a token set, "low" (the
   first stage of Algorithm 1: pi_old < eta, or the random split's draw of that size) or
   "high" (the others), not to a stage position: its moments then average the gradients
   of one population only, and the reversed order (high_first) differs from the default
   only in which stage runs first. (Within a run the order is fixed, so keying by position
   would step the same two states; the names say what each one holds.)
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .batch import Rollout
from .grpo import batch_logprobs, grpo_update
from .precision import StageOptimizers     # choice 8's pair of optimizers


def split_by_probability(old_logprobs: torch.Tensor, response_mask: torch.Tensor,
                         eta: float = 0.5):
    """Algorithm 1, line "split": low = pi_old(o_t) < eta, high = the other valid tokens.

    Returns (low_mask, high_mask) as float [B, R]; padding is in neither.
    """
    valid = response_mask > 0
    low = (old_logprobs.exp() < eta) & valid
    high = (~low) & valid
    return low.float(), high.float()


def low_fraction(old_logprobs: torch.Tensor, response_mask: torch.Tensor, eta: float) -> float:
    """The share of the valid tokens with pi_old(o_t) < eta: the size of Lopti's first stage
    (every run logs it, a method without Lopti at config.LOW_FRACTION_ETA)."""
    low, _ = split_by_probability(old_logprobs, response_mask, eta)
    return float(low.sum()) / max(float(response_mask.sum()), 1.0)


def split_at_random(low: torch.Tensor, response_mask: torch.Tensor, generator: torch.Generator):
    """The criterion's control (module docstring, choice 5): as many tokens as ``low``
    holds, drawn uniformly without replacement from the valid tokens of the whole batch,
    whatever their pi_old; the other valid tokens second.

    Returns (first_mask, second_mask) as float [B, R], disjoint, covering the valid tokens.
    ``generator``: a CPU torch.Generator (`split_generator`), the only randomness used.
    """
    valid = (response_mask > 0).flatten()
    where = valid.nonzero().squeeze(1)                      # flat indices of the valid tokens
    k = int(low.sum())
    pick = torch.randperm(len(where), generator=generator)[:k].to(where.device)
    first = torch.zeros_like(valid, dtype=torch.float32)
    first[where[pick]] = 1.0
    first = first.view(response_mask.shape)
    return first, valid.view(response_mask.shape).float() - first


def split_generator(seed: int, step: int) -> torch.Generator:
    """The random split's draw for one step, from (seed, step), apart from the sampler's
    generator (plumbing.step_generator) and every other stream of the run."""
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence([seed, step, 4]).generate_state(1)[0]))
    return g


def stage_optimizers(optimizer, order: str) -> tuple:
    """(the first stage's optimizer, the second's): the one shared optimizer twice (the
    reference, choice 8), or each token set's own (`StageOptimizers`) in the stage order."""
    if not isinstance(optimizer, StageOptimizers):
        return optimizer, optimizer
    return (optimizer.low, optimizer.high) if order == "low_first" else (optimizer.high, optimizer.low)


def lopti_update(model, optimizer, batch: Rollout, cfg, eta: float = 0.5,
                 order: str = "low_first", recompute_old: bool = False,
                 denominator: str = "all", split: str = "probability",
                 generator: torch.Generator | None = None) -> dict:
    """Paper Algorithm 1: two `grpo_update`s, low-probability tokens then high.

    Arguments are those of `grpo_update` (the batch carries pi_old, the advantages and the
    reference log-probs, computed once for both stages; ``optimizer``: one, shared by the
    stages, or a `StageOptimizers`, choice 8) plus eta, order ("low_first" |
    "high_first"), recompute_old, denominator, and split ("probability", Algorithm 1 |
    "random", the control, drawn from ``generator``; see the module docstring).

    Returns {"stage1": metrics, "stage2": metrics, "low_fraction": share of valid tokens
    with pi_old < eta (the size of the random split's first stage too)}.
    """
    low, high = split_by_probability(batch.old_logprobs, batch.response_mask, eta)
    low_share = low_fraction(batch.old_logprobs, batch.response_mask, eta)
    if split == "random":             # the same stage sizes, the criterion gone (choice 5)
        if generator is None:
            raise ValueError("the random split needs its generator (split_generator)")
        low, high = split_at_random(low, batch.response_mask, generator)
    elif split != "probability":
        raise ValueError(f"unknown split {split!r}")
    if order == "low_first":
        first, second = low, high
    elif order == "high_first":
        first, second = high, low
    else:
        raise ValueError(f"unknown order {order!r}")

    opt1, opt2 = stage_optimizers(optimizer, order)     # the same one twice by default (choice 8)

    m1 = grpo_update(model, opt1, batch, cfg, token_mask=first, denominator=denominator)
    if recompute_old:
        batch = dataclasses.replace(batch, old_logprobs=batch_logprobs(model, batch, cfg))
    m2 = grpo_update(model, opt2, batch, cfg, token_mask=second, denominator=denominator)
    return {"stage1": m1, "stage2": m2, "low_fraction": low_share}
