"""Beyond the paper: four later methods that act on the same low- and high-probability
tokens differently, each a per-token policy term for `grpo_update`'s `pg_loss` hook.

Notation as in grpo.py: rho_t = pi_theta(o_t) / pi_old(o_t), A_t the token advantage,
sg(.) the stop-gradient, H_t the entropy of the whole next-token distribution at position t.

- "entropy_top"  High-entropy minority tokens. Wang et al. 2025, "Beyond the 80/20 Rule:
  High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning",
  arXiv 2506.01939, Eq. 5 (the GRPO/DAPO objective with the indicator):
      pg_t = 1[H_t >= tau_rho^B] * L_clip,t,   tau_rho^B the (1 - rho)-quantile of H over
  the batch B's valid tokens, rho = 0.2: only the top 20% most uncertain positions train.
  The opposite emphasis of AR: an uncertain position is where the sampled token is often a
  low-probability one, which AR damps and this keeps alone.
- "cispo"  MiniMax-M1 (MiniMax 2025, arXiv 2506.13585), Eq. 4 (CISPO):
      pg_t = -sg(clip(rho_t, 1 - eps_low^IS, 1 + eps_high^IS)) * A_t * log pi_theta(o_t):
  the importance weight is clipped and detached instead of the update, so every token keeps
  its gradient -- where PPO's clip zeroes it (rho outside [1 - eps_low, 1 + eps_high] on
  the side the advantage pushes), which happens first to the volatile low-probability ones.
- "clip_cov" and "kl_cov"  Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning
  for Reasoning Language Models", arXiv 2505.22617, Sec. 4 (Eq. for Cov, Clip-Cov, KL-Cov):
      Cov_t = (log pi(o_t) - mean_j log pi(o_j)) * (A_t - mean_j A_j)  over the N valid tokens;
  Clip-Cov: a uniformly random r*N of the tokens with w_low < Cov_t < w_high lose their
  gradient (pg_t = 0), the rest keep the clipped surrogate;
  KL-Cov: the top k*N tokens by Cov_t get pg_t = -A_t rho_t + beta * |log rho_t|, the others
  -A_t rho_t (no PPO clip: the penalty replaces it). High covariance = a confident token with
  a positive advantage or an unlikely one with a negative advantage: the updates that
  collapse entropy. |log rho| is the reference implementation's per-token estimate of the
  paper's KL(pi_old || pi_theta).

Design choices:

1. One hook, one module. Each method only replaces the per-token policy term; the k3 KL to
   pi_ref, the token-mean over all valid tokens (a dropped token still counts in the
   denominator, as TRL's entropy mask and verl's Clip-Cov do), the mini-/micro-batches,
   AdamW and the grad clip are grpo.py's, so the study's arms differ in that term alone.
2. The batch-level selections (the entropy quantile, the covariances) are made once per
   update, from pi_old over the whole rollout batch -- the "batch B" / "N" of the papers --
   before the first optimizer step. There pi_theta = pi_old, so they are what TRL (entropy
   from pi_theta, `GRPOTrainer._compute_loss`) and verl (`compute_policy_loss_clip_cov` /
   `_kl_cov`, log pi_theta) compute in the first optimizer step when it has one
   micro-batch. Both recompute per micro-batch from pi_theta instead, so with several
   micro-batches or optimizer steps the selections differ (trl_grpo.NOT_IN_TRL, entropy_top);
   ours do not depend on the micro-batch size, which is a memory knob here (grpo.py).
3. At rho = 1 -- every token of the first optimizer step on fresh samples -- CISPO's and
   KL-Cov's gradients equal GRPO's exactly (sg(1) A grad log pi; |log rho| has gradient 0
   at 0). They differ from GRPO only from the second optimizer step on a rollout, so the
   study runs every arm of its `token_fixes` grid with two passes (experiments/grid.py).
4. Defaults (TrainConfig fields, each with its source): rho 0.2 (80/20 paper and TRL's
   recommended `top_entropy_quantile`); CISPO eps_low^IS 1.0 = no lower bound (MiniMax-M1
   sets eps_low^IS "to a large value"; rho > 0 anyway) and eps_high^IS 4.0, an upper bound
   of 5 on the weight: MiniMax-M1 does not publish its value (not confirmed here); 5 is the
   epsilon_max TRL documents for `loss_type="cispo"` (from ScaleRL, arXiv 2510.13786);
   Clip-Cov r = 2e-4, w_low 1, w_high 5: the defaults of the reference implementation
   (PRIME-RL/Entropy-Mechanism-of-RL, merged into verl as `compute_policy_loss_clip_cov`:
   `clip_cov_ratio`, `clip_cov_lb`, `clip_cov_ub`; checked against verl's code, as are the
   draw and the covariance above). KL-Cov beta 1 is verl's `compute_policy_loss_kl_cov`
   default for `ppo_kl_coef` (its config dataclass defaults to 0.1); k = 2e-3 is the
   paper's Qwen2.5-7B setting as we read it, where verl's function defaults to 2e-4 (the
   paper's 32B value): pass --kl-cov-ratio 2e-4 for that.
5. The Clip-Cov draw is seeded by (seed, step), like every other random choice of a step,
   so a resumed run repeats it.
6. Clip-Cov keeps grpo.policy_loss for the other tokens, dual clip included (verl's
   `clip_cov` has plain PPO clipping: they differ only where A < 0 and rho > clip_c = 10).
   verl also excludes the tokens PPO has already clipped from the draw; at pi_old, where
   ours draws, there are none.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .batch import Rollout
from .config import TOKEN_FIXES
from .grpo import batch_logprobs, policy_loss


# ---------------------------------------------------------------- per-token quantities


@torch.no_grad()
def batch_entropies(model, batch: Rollout, cfg) -> torch.Tensor:
    """H_t of the policy's next-token distribution at every response position (logits /
    temperature, as sampled), in micro-batches, without grad: [B, R], 0 on padding.
    (Memory: two more float [b, R, V] temporaries than a log-prob pass, gradient-free.
    Where log pi_old is wanted too, `grpo.batch_logprobs(..., entropy=True)` gives both
    from one pass.)"""
    return batch_logprobs(model, batch, cfg, entropy=True)[1]


def high_entropy_mask(entropy: torch.Tensor, valid: torch.Tensor, top: float = 0.2) -> torch.Tensor:
    """80/20 paper: 1 where H_t >= tau, tau the (1 - top)-quantile of H over the valid tokens.

    As TRL's `get_high_entropy_mask`: `torch.quantile` (linear interpolation) of the valid
    tokens' entropies, ties at the threshold kept, so slightly more than `top` of the
    tokens may pass. Float [B, R], 0 on padding."""
    v = valid > 0
    vals = entropy[v].float()
    if vals.numel() == 0:
        return torch.zeros_like(entropy)
    tau = torch.quantile(vals, 1.0 - top)
    return ((entropy >= tau) & v).float()


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Entropy-mechanism paper: Cov_t = (log pi(o_t) - mean log pi) * (A_t - mean A), the means
    over the valid tokens (each token one term, as in the paper and its code). 0 on padding."""
    v = valid > 0
    n = v.sum().clamp_min(1)
    lp, a = logp.detach().float(), advantages.detach().float()
    mean_lp = torch.where(v, lp, 0.0).sum() / n
    mean_a = torch.where(v, a, 0.0).sum() / n
    return torch.where(v, (lp - mean_lp) * (a - mean_a), 0.0)


def clip_cov_mask(cov: torch.Tensor, valid: torch.Tensor, ratio: float = 2e-4, low: float = 1.0,
                  high: float = 5.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Clip-Cov's detached set: max(int(ratio * N), 1) tokens drawn uniformly, without
    replacement, among the valid ones with low < Cov_t < high (strict, as the reference
    code), N the valid tokens. Fewer if fewer qualify. Float [B, R], 1 = detached."""
    v = valid > 0
    cand = ((cov > low) & (cov < high) & v).flatten().nonzero().squeeze(1)
    n = max(int(ratio * int(v.sum())), 1)
    pick = cand[torch.randperm(len(cand), generator=generator)[:n].to(cand.device)]
    out = torch.zeros(cov.numel(), dtype=torch.float32, device=cov.device)
    out[pick] = 1.0
    return out.view_as(cov)


def kl_cov_mask(cov: torch.Tensor, valid: torch.Tensor, ratio: float = 2e-3) -> torch.Tensor:
    """KL-Cov's penalised set: the max(1, int(ratio * N)) valid tokens of largest Cov_t.
    Float [B, R], 1 = penalised."""
    v = valid > 0
    n = max(1, int(ratio * int(v.sum())))
    scores = torch.where(v, cov.float(), -torch.inf).flatten()
    out = torch.zeros(cov.numel(), dtype=torch.float32, device=cov.device)
    if v.any():
        out[torch.topk(scores, min(n, int(v.sum()))).indices] = 1.0
    return out.view_as(cov)


# ----------------------------------------------------------------- per-token losses


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
               eps_low: float = 1.0, eps_high: float = 4.0):
    """MiniMax-M1 Eq. 4: -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * log pi_theta.

    The gradient is -w A grad log pi for every token, clipped or not. Returns (loss [B, R],
    stats) with policy_loss's keys; "clipped" = the weight was clipped."""
    ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()     # the clamp: grpo.policy_loss's guard
    w = ratio.clamp(1.0 - eps_low, 1.0 + eps_high).detach()
    stats = {"ratio": ratio.detach(), "clipped": (w != ratio).detach(),
             "dual_clipped": torch.zeros_like(ratio, dtype=torch.bool)}
    return -w * advantages * logp, stats


def kl_cov_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                penalised: torch.Tensor, coef: float = 1.0):
    """KL-Cov: -A rho everywhere (no clip), + coef * |log rho| on the penalised tokens."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss = -advantages * ratio + coef * penalised * log_ratio.abs()
    stats = {"ratio": ratio.detach(), "clipped": torch.zeros_like(ratio, dtype=torch.bool),
             "dual_clipped": torch.zeros_like(ratio, dtype=torch.bool)}
    return loss, stats


# --------------------------------------------------------------------------- the hook
# Each method once: its token selection, made once per batch from pi_old (None: it selects
# none), and its per-token policy term given the selection's rows of the micro-batch.


def _select_entropy_top(model, batch: Rollout, cfg, generator):
    return high_entropy_mask(batch_entropies(model, batch, cfg), batch.response_mask, cfg.entropy_top_quantile)


def _select_clip_cov(model, batch: Rollout, cfg, generator):
    cov = token_covariance(batch.old_logprobs, batch.advantages, batch.response_mask)
    return clip_cov_mask(cov, batch.response_mask, cfg.clip_cov_ratio, cfg.clip_cov_low, cfg.clip_cov_high,
                         generator)


def _select_kl_cov(model, batch: Rollout, cfg, generator):
    cov = token_covariance(batch.old_logprobs, batch.advantages, batch.response_mask)
    return kl_cov_mask(cov, batch.response_mask, cfg.kl_cov_ratio)


def _surrogate_on(c, logp, old_logp, advantages, keep):
    """grpo.policy_loss on the tokens ``keep`` holds, 0 elsewhere (no gradient)."""
    loss, stats = policy_loss(logp, old_logp, advantages, c.eps_low, c.eps_high, c.clip_c)
    return loss * keep, stats


TERMS = {   # method: (selection, policy term(cfg, logp, old_logp, advantages, selection))
    "entropy_top": (_select_entropy_top, _surrogate_on),                  # trains the kept tokens
    "cispo": (None, lambda c, lp, old, adv, sel: cispo_loss(lp, old, adv, c.cispo_eps_low, c.cispo_eps_high)),
    "clip_cov": (_select_clip_cov,                                         # the drawn ones detached
                 lambda c, lp, old, adv, sel: _surrogate_on(c, lp, old, adv, 1.0 - sel)),
    "kl_cov": (_select_kl_cov, lambda c, lp, old, adv, sel: kl_cov_loss(lp, old, adv, sel, c.kl_cov_coef)),
}


@dataclass
class TokenFix:
    """The per-token policy term of one method: `grpo_update(..., pg_loss=fix)`.

    cfg   the run's TrainConfig (clip ranges, and the method's knobs).
    mask  [B, R] in the rows of the batch it was built on. entropy_top: the kept tokens;
          clip_cov: the detached ones; kl_cov: the penalised ones; cispo: None.
    """
    method: str
    cfg: object
    mask: torch.Tensor | None = None

    def __call__(self, logp, old_logp, advantages, rows):
        selection = None if self.mask is None else self.mask[rows]
        return TERMS[self.method][1](self.cfg, logp, old_logp, advantages, selection)

    def fraction(self, valid: torch.Tensor) -> float | None:
        """Share of the valid tokens the method singles out (kept, detached or penalised)."""
        if self.mask is None:
            return None
        return float((self.mask * valid).sum()) / max(float(valid.sum()), 1.0)


def build(method: str, model, batch: Rollout, cfg, generator: torch.Generator | None = None) -> TokenFix:
    """The hook of `method` for this batch, with the knobs of ``cfg``, its selection made
    from pi_old = batch.old_logprobs and the model as it is now (design choice 2);
    ``generator``: Clip-Cov's draw."""
    if method not in TOKEN_FIXES:
        raise ValueError(f"unknown token fix {method!r}: choose one of {', '.join(TOKEN_FIXES)}")
    select = TERMS[method][0]
    return TokenFix(method, cfg, None if select is None else select(model, batch, cfg, generator))


def selection_generator(seed: int, step: int) -> torch.Generator:
    """Clip-Cov's draw for one step, from (seed, step) (design choice 5)."""
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence([seed, step, 3]).generate_state(1)[0]))
    return g
