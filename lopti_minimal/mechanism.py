"""The mechanism over training: what each RL update does to the tokens of each probability
bin (the paper's Fig. 1b and Fig. 3, measured at every step instead of once).

Notation (paper): pi_old(o_t) the probability the sampling policy gave token o_t (at the
rollout temperature), A_t its advantage (after AR where the method uses it).

The paper's fixed bins of pi_old, [0,.25) [.25,.5) [.5,.75) [.75,1], and per RL step:

- ``bin_share``  the share of the sampled response tokens in each bin (Fig. 1a);
- ``rise_pos``   per bin, the share of tokens with A > 0 whose probability rose after the
                 step's whole update (both Lopti stages), on the same batch (Fig. 3);
- ``fall_neg``   per bin, the share of tokens with A < 0 whose probability fell;
- ``rise_pos_moved``, ``fall_neg_moved``  the same among the tokens whose log-prob changed
                 at all: a token the model gives probability 1 in floating point (log pi
                 exactly 0) cannot rise, and such saturated tokens fill much of the top bin
                 of a small, sharp model;
- ``nll``        the mean -log pi_old of the sampled tokens: a one-sample estimate of the
                 policy's entropy at the rollout temperature (E_{o ~ pi}[-log pi(o)] = H(pi));
- ``grad_sq_share`` (every ``grad_shares_every`` steps, an option: it costs four backward
                 passes) per bin, ||g_k||^2 / sum_j ||g_j||^2, where g_k is the gradient,
                 at pi_old, of the method's loss restricted to bin k (a Lopti-style token
                 mask, token-mean over *all* tokens): the paper's Fig. 1b as shares. With AR
                 the advantages are the reweighted ones; Lopti's split is not applied (the
                 joint loss, so the arms are comparable: Lopti's stage 1 is bins 0-1 of it).

A share is None where its bin has no such token. Comparisons: Fig. 3 says GRPO raises only
~half of the positive high-probability tokens and AR / Lopti raise more; these metrics ask
whether that holds at every step of a run, per method.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from .batch import Rollout
from .grpo import batch_logprobs, grpo_update

# The paper's fixed bins of pi_old (Fig. 1, Fig. 3); the last one is closed at 1.
BIN_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)
BIN_LABELS = ("[0,.25)", "[.25,.5)", "[.5,.75)", "[.75,1]")
N_BINS = 4


def bin_index(p: torch.Tensor) -> torch.Tensor:
    """Bin of each probability: 0 for [0,.25), 1 for [.25,.5), 2 for [.5,.75), 3 for [.75,1]."""
    edges = torch.tensor(BIN_EDGES[1:-1], dtype=p.dtype, device=p.device)
    return torch.bucketize(p, edges, right=True)


def bin_masks(p: torch.Tensor, valid: torch.Tensor) -> list[torch.Tensor]:
    """Four float [B, R] masks, one per bin, over the valid tokens only."""
    b = bin_index(p)
    return [((b == k) & (valid > 0)).float() for k in range(N_BINS)]


def _share(hit: torch.Tensor, among: torch.Tensor) -> float | None:
    n = float(among.sum())
    return round(float((hit * among).sum()) / n, 5) if n else None


def step_shares(old_logp: torch.Tensor, new_logp: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor) -> dict:
    """bin_share, rise_pos, fall_neg and nll of one step (module docstring).

    old_logp / new_logp: [B, R] log-probs of the batch's tokens before / after the update,
    computed the same way (so equal weights give equal values); adv: [B, R]; mask: [B, R]."""
    masks = bin_masks(old_logp.exp(), mask)
    n = float(mask.sum())
    rose, fell = (new_logp > old_logp).float(), (new_logp < old_logp).float()
    pos, neg, moved = (adv > 0).float(), (adv < 0).float(), (new_logp != old_logp).float()
    return {
        "bin_share": [round(float(m.sum()) / n, 5) if n else None for m in masks],
        "rise_pos": [_share(rose, m * pos) for m in masks],
        "fall_neg": [_share(fell, m * neg) for m in masks],
        "rise_pos_moved": [_share(rose, m * pos * moved) for m in masks],
        "fall_neg_moved": [_share(fell, m * neg * moved) for m in masks],
        "nll": round(float((-old_logp * mask).sum()) / max(n, 1.0), 5),
    }


def gradient_sq_shares(model, batch: Rollout, cfg, pg_loss=None) -> list[float | None]:
    """Each bin's share of the squared gradient norm of the method's loss (module docstring).

    One `grpo_update` per bin with that bin as the token mask and the denominator "all"
    (exactly a Lopti stage's loss), and an SGD optimizer with lr 0, so the parameters do not
    move: its pre-clip `grad_norm` is ||g_k||. One pass (ppo_epochs 1) whatever the method.
    `pg_loss`: a token fix's policy term (token_fixes.py), as the method's update uses it."""
    masks = bin_masks(batch.old_logprobs.exp(), batch.response_mask)
    one_pass = dataclasses.replace(cfg, ppo_epochs=1)
    still = torch.optim.SGD(model.parameters(), lr=0.0)
    sq = []
    for m in masks:
        if m.sum() == 0:
            sq.append(0.0)
            continue
        sq.append(grpo_update(model, still, batch, one_pass, token_mask=m, pg_loss=pg_loss)["grad_norm"] ** 2)
    total = sum(sq)
    return [round(s / total, 5) if total > 0 else None for s in sq]


class Probe:
    """The mechanism's measurements around one RL step's update, as the trainer takes them:
    ``before`` at pi_old (grad_sq_share every cfg.grad_shares_every steps, and the log-probs
    before the update), ``after`` once the whole update is done (step_shares). ``metrics``
    holds what was measured, ``seconds`` what it cost."""

    def __init__(self, cfg, step: int):
        self.cfg, self.step = cfg, step
        self.metrics: dict = {}
        self.seconds = 0.0
        self._before = None

    def before(self, model, batch: Rollout, fix=None) -> None:
        t = time.perf_counter()
        cfg = self.cfg
        if cfg.grad_shares_every and self.step % cfg.grad_shares_every == 0:
            self.metrics["grad_sq_share"] = gradient_sq_shares(model, batch, cfg, fix)
        # The log-probs before the update, computed as the ones after it will be: a
        # teacher-forced forward (the recomputed pi_old is one).
        self._before = batch.old_logprobs if cfg.recompute_old_logprobs else batch_logprobs(model, batch, cfg)
        self.seconds += time.perf_counter() - t

    def after(self, model, batch: Rollout) -> None:
        t = time.perf_counter()
        self.metrics.update(step_shares(self._before, batch_logprobs(model, batch, self.cfg),
                                        batch.advantages, batch.response_mask))
        self.seconds += time.perf_counter() - t
