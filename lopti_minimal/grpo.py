"""GRPO: group advantages, token log-probs, the clipped surrogate with dual clip, the k3 KL
penalty, token-mean aggregation and the (mini-/micro-)batched update.

Notation (paper): pi_theta is the policy being trained, pi_old the policy that sampled
the responses, rho_t = pi_theta(o_t) / pi_old(o_t), A_t the token advantage, pi_ref the
frozen initial policy.

Design choices:

1. Everything follows the paper's GRPO objective and its reference implementation (a fork
   of the verl RL framework: `compute_policy_loss`, `kl_penalty` and `agg_loss` in
   verl/trainer/ppo/core_algos.py, `update_policy` in verl/workers/actor/dp_actor.py, and
   the K&K launch scripts for the defaults: the "method" section of config.TrainConfig,
   which every function here reads its numbers from).
2. The code is written from the formulas; the comments say where a choice reproduces the
   reference and where it deliberately differs.
3. Gradient accumulation is exact by default (grad_accum="global": each micro-batch's
   summed loss is divided by the token count of the whole mini-batch, so the accumulated
   gradient equals the whole-mini-batch gradient). The reference (verl
   dp_actor.update_policy) instead takes each micro-batch's own token-mean and divides it by
   the number of micro-batches (and FSDP then averages the 4 GPUs): a mean of
   per-micro-batch means, which weights tokens of short micro-batches more;
   grad_accum="verl" reproduces that.
4. A mini-batch with nothing to train on (e.g. an empty Lopti stage) makes no optimizer
   step, where the reference would still step on a zero gradient (see lopti.py).
5. Mini-batch membership. Ours are contiguous slices of the group-major batch (the G
   responses of a prompt stay together). The reference first reorders the rows
   (`_balance_batch` in its ray_trainer.py, which balances token counts across GPUs), so
   its mini-batches mix groups differently. Where prompts x G <= mini_batch_size (the CPU
   presets) there is one mini-batch per pass and the two agree up to summation order; the
   GPU presets' 64 x 8 = 512 rows make two mini-batches of 256 per pass, two optimizer
   steps as in the reference, of other rows than the reference's.
6. The token log-probs are the plain expression, log_softmax(logits / T) gathered at the
   sampled tokens (`logprobs_from_logits`, as the reference's `logprobs_from_logits` in
   verl/utils/torch_functional.py, after its actor divides the logits by T). The update
   computes the same bits by a fast path that never builds the float32 copy of the logits
   whole (fast_logprobs.py: speed engineering, a learner can skip it; tested bit for bit).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from . import precision
from .batch import Rollout, position_ids_from_mask
# the fast path of the token log-probs (design choice 6); TargetLogProb stays importable from here
from .fast_logprobs import TargetLogProb, response_logprobs  # noqa: F401


# ------------------------------------------------------------------- advantages


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage, one value per response (paper §2, GRPO):

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps),   std unbiased (n - 1).

    rewards: [B] group-major (rows g*G .. g*G+G-1 share a prompt). Returns [B].

    A group whose rewards are all equal gets exactly 0. (r - mean) alone is not always
    exactly 0 in floating point -- the mean of eight 0.1s is not 0.1 -- and dividing such
    a rounding residue by eps = 1e-6 would give a spurious advantage, so equal groups are
    zeroed explicitly.
    """
    if group_size < 2:
        # verl falls back to mean 0 / std 1 for a singleton group; a group of one has no
        # relative signal, so we refuse rather than silently train on raw rewards.
        raise ValueError("GRPO needs group_size >= 2")
    r = rewards.float().view(-1, group_size)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True, unbiased=True)
    adv = (r - mean) / (std + eps)
    constant = (r == r[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(adv), adv).view(-1)


def reinforce_pp_advantages(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0,
                            eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ outcome advantage, per token (Hu 2025, arXiv 2501.03262), exactly as the
    paper's reference code computes it (verl `compute_reinforce_plus_plus_outcome_advantage`
    with `masked_whiten`); the reference runs every K&K script with either this or GRPO.

    1. The outcome reward r_i sits on the last valid token of response i; returns run
       backwards, G_t = r_t + gamma * G_{t+1}, reset at the padding (the mask), so
       G_t = gamma^(L_i - 1 - t) * r_i on response i's L_i tokens and 0 on padding. The
       reference scripts leave gamma at its default 1, so G_t = r_i on every token.
    2. Whitening over *every valid token of the batch* (no per-prompt baseline):
           A_t = (G_t - mu) / sqrt(var + 1e-8),
       mu and var the mean and the unbiased (N - 1) variance over the N valid tokens, so a
       long response weighs more in both. The reference's masked_whiten takes an epsilon
       argument (1e-6) that it never uses; 1e-8 inside the square root is what it applies.
    3. KL is not in the reward: the reference scripts set use_kl_loss, so the k3 KL term
       stays in the loss, as with GRPO.

    rewards: [B]; response_mask: [B, R]. Returns [B, R], 0 on padding. AR and Lopti then
    act on these advantages exactly as on GRPO's (the reference applies them after any
    estimator).
    """
    m = response_mask.float()
    lengths = m.sum(1, keepdim=True)
    t = torch.arange(m.shape[1], device=m.device).unsqueeze(0)
    # gamma^(L - 1 - t) on the valid tokens (exactly 1 for gamma = 1).
    discount = torch.ones_like(m) if gamma == 1.0 else gamma ** (lengths - 1 - t).clamp_min(0)
    returns = rewards.float().view(-1, 1) * discount * m
    n = m.sum()
    if n < 2:
        raise ValueError("REINFORCE++ whitening needs at least 2 valid tokens in the batch")
    mean = returns.sum() / n
    var = ((returns - mean) ** 2 * m).sum() / (n - 1)
    return (returns - mean) * torch.rsqrt(var + eps) * m


def token_advantages(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast one advantage per response to its tokens: [B] -> [B, R], 0 on padding."""
    return adv.view(-1, 1) * response_mask


# ----------------------------------------------------------------- log-probs


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(y) = log_softmax(logits / T)[y] at each position: logits [..., V], targets [...]
    -> [...], float32 (the plain expression; design choice 6).

    Written out as z_y - logsumexp(z), z = logits.float() / T: log_softmax's own formula,
    one float32 reduction per row. (torch.log_softmax computes it in another order and can
    differ in the last bit.) token_logprobs gets these very bits, values and gradients,
    from fast_logprobs.response_logprobs, which never builds z whole.
    """
    z = logits.float() / temperature
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   prompt_len: int, temperature: float, entropy: bool = False):
    """log pi(o_t) of the response tokens with logits / temperature: [B, R]. With
    ``entropy=True`` also the entropy of the whole next-token distribution at each response
    position, H_t = -sum_v pi(v) log pi(v) (same temperature): (logp, entropy), both [B, R]
    (token_fixes.py's high-entropy selection needs it).

    The logits at position P-1+t predict response token t. We ask the model for the last
    R+1 positions only (`logits_to_keep`), so neither the [B, P, V] prompt logits nor a
    full log_softmax over them is ever built. Position ids skip the left padding exactly
    as in sampling. Padding positions get an arbitrary value; callers mask them.
    """
    R_full = input_ids.shape[1] - prompt_len
    # Responses are right-padded to the longest of the whole batch; a micro-batch of
    # shorter ones skips its all-padding tail columns (the causal model never looks
    # ahead, so the kept positions compute the same values) and pads the result back.
    filled = attention_mask[:, prompt_len:].any(0).nonzero()
    R = int(filled.max()) + 1 if len(filled) else 0
    input_ids, attention_mask = input_ids[:, :prompt_len + R], attention_mask[:, :prompt_len + R]
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask),
                use_cache=False, logits_to_keep=R + 1)
    # logprobs_from_logits(out.logits[:, :-1], input_ids[:, prompt_len:], T), to the bit,
    # without a float32 copy of the logits (design choice 6: fast_logprobs.py)
    logp = response_logprobs(out.logits, input_ids[:, prompt_len:], temperature)
    logp = torch.nn.functional.pad(logp, (0, R_full - R))
    if not entropy:
        return logp
    logits = out.logits[:, :-1, :]                                   # [B, R, V]
    # H = logsumexp(z) - sum_v softmax(z)_v z_v, from the same logits (z = logits / T)
    z = logits.float() / temperature
    ent = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, torch.nn.functional.pad(ent, (0, R_full - R))


# ------------------------------------------------------------------------ losses


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, log_ratio_clamp: float = 5.0) -> torch.Tensor:
    """k3 ("low_var_kl") estimate of KL(pi_theta || pi_ref) per token, as the reference
    fork's `kl_penalty` computes it:

        d  = clamp(log pi_ref - log pi_theta, -5, 5)
        k3 = clamp(exp(d) - d - 1, -10, 10).

    Non-negative, zero when the policies agree. The clamp on d is part of the estimator,
    not only an overflow guard: once a token's probability under pi_theta has risen more
    than e^5 (~148x) above pi_ref's, d sits at -5, k3 is the constant e^-5 + 4 = 4.0067
    and that token's KL term has no gradient; on the other side (pi_theta fell e^5 below
    pi_ref) k3 is e^5 - 6 = 142.4, over the outer clamp, so 10 without gradient already
    from d ~ 2.61. `log_ratio_clamp=20` gives current verl's `kl_penalty`, whose term keeps
    pulling a risen token back (d = -6: k3 5.0025, gradient 0.9975 w.r.t. log pi_theta);
    20 is as far as it can go, since exp(20) already saturates the outer clamp and a
    larger exp could overflow (an inf would turn the clamp's zero gradient into NaN).
    """
    log_ratio = (ref_logp - logp).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              num_tokens: float | None = None, num_seqs: float | None = None,
              denom_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce a [B, R] per-token loss to a scalar (verl `agg_loss`).

    token-mean:          sum over valid tokens / number of valid tokens.
    seq-mean-token-mean: mean over sequences of (sum over its tokens / its token count).

    `mask` selects the tokens in the numerator. `denom_mask` (default: `mask`) selects
    the tokens that are counted in the denominator -- they differ for a Lopti stage, where
    the reference keeps the other stage's tokens in the count. num_tokens / num_seqs
    override the denominators: a micro-batch passes the counts of its whole mini-batch, so
    that summing the micro-batch losses gives exactly the mini-batch loss and gradient.
    """
    denom_mask = mask if denom_mask is None else denom_mask
    if mode == "token-mean":
        denom = denom_mask.sum() if num_tokens is None else num_tokens
        return (loss_mat * mask).sum() / max(float(denom), 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * mask).sum(-1) / denom_mask.sum(-1).clamp_min(1.0)
        denom = denom_mask.shape[0] if num_seqs is None else num_seqs
        return per_seq.sum() / max(float(denom), 1.0)
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                eps_low: float = 0.20, eps_high: float = 0.24, clip_c: float = 10.0):
    """Per-token clipped surrogate with asymmetric clip and dual clip (paper Eq. 1, the
    GRPO objective, as implemented by verl `compute_policy_loss` with `clip_ratio_c`):

        rho   = exp(logp - old_logp)
        L_clip = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))
        L     = min(L_clip, -A * c)   if A < 0   (dual clip: a huge rho on a bad token
                L_clip                otherwise   cannot make the loss unbounded)

    Returns (loss [B, R], stats) where stats holds per-token tensors for metrics:
    ratio, clipped (the clip bound was active), dual_clipped.
    The log-ratio is clamped to [-20, 20] before exp, an overflow guard: current verl clamps
    there; the authors' fork does not clamp (the two agree within the clamp).
    """
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clip_loss = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_c
    dual_loss = torch.minimum(clip_loss, loss3)
    loss = torch.where(advantages < 0, dual_loss, clip_loss)
    stats = {
        "ratio": ratio.detach(),
        "clipped": (loss2 > loss1).detach(),
        "dual_clipped": ((clip_loss > loss3) & (advantages < 0)).detach(),
    }
    return loss, stats


# ------------------------------------------------------------------------ update


def sort_by_length(batch: Rollout, cfg) -> Rollout:
    """Reorder the rows of each mini-batch by response length, so that each micro-batch
    holds responses of similar length and `token_logprobs` can skip its padding.

    Only the order of rows within a mini-batch changes, so every optimizer step sees the
    same responses; under grad_accum="global" its loss is a sum over tokens divided by
    the mini-batch's token count, which no order changes (equal up to float rounding).
    Under grad_accum="verl" the micro-batch composition is part of the loss (a mean of
    per-micro-batch means), so the batch is returned unchanged. Group-major order is gone
    afterwards: compute what needs the groups (advantages) before.
    """
    if cfg.grad_accum != "global":
        return batch
    lengths = batch.response_mask.sum(1)
    order = torch.cat([s + lengths[s:s + cfg.mini_batch_size].argsort(stable=True)
                       for s in range(0, len(lengths), cfg.mini_batch_size)])
    return batch.rows(order)


@torch.no_grad()
def batch_logprobs(model, batch: Rollout, cfg, entropy: bool = False):
    """log-probs of a batch's response tokens, in micro-batches of cfg.micro_batch_size, at
    cfg.temperature, without grad: the frozen reference policy's log pi_ref, or a
    recomputed log pi_old. 0 on padding. With ``entropy=True`` also H_t from the same
    forward pass (token_logprobs): (logp, entropy), both [B, R]."""
    was_training = model.training
    model.eval()
    B = batch.input_ids.shape[0]
    parts = []
    for s in range(0, B, cfg.micro_batch_size):
        mb = slice(s, s + cfg.micro_batch_size)
        out = token_logprobs(model, batch.input_ids[mb], batch.attention_mask[mb],
                             batch.prompt_len, cfg.temperature, entropy=entropy)
        parts.append(out if entropy else (out,))
    model.train(was_training)
    cols = [torch.cat(c, 0) * batch.response_mask for c in zip(*parts)]
    return tuple(cols) if entropy else cols[0]


def _micro_batch_loss(model, batch: Rollout, mb: slice, masks: tuple, cfg, norm: tuple, pg_loss=None):
    """The loss of one micro-batch (rows ``mb``), scaled so that the micro-batch losses of a
    mini-batch add up to the mini-batch loss, and its statistics. ``masks``: (the tokens
    trained on, the tokens counted in the denominator); ``norm``: the mini-batch's (token
    count, sequence count, micro-batches) that the scaling divides by."""
    logp = token_logprobs(model, batch.input_ids[mb], batch.attention_mask[mb],
                          batch.prompt_len, cfg.temperature)
    if pg_loss is None:
        pg, st = policy_loss(logp, batch.old_logprobs[mb], batch.advantages[mb],
                             cfg.eps_low, cfg.eps_high, cfg.clip_c)
    else:       # another method's per-token policy term (token_fixes.py)
        pg, st = pg_loss(logp, batch.old_logprobs[mb], batch.advantages[mb], mb)
    kl = torch.zeros_like(pg)
    if batch.ref_logprobs is not None:
        kl = kl_k3(logp, batch.ref_logprobs[mb], cfg.kl_log_ratio_clamp)
    per_token = pg + cfg.kl_coef * kl
    # Masked tokens contribute 0 to the numerator; `dm` decides the denominator.
    tm, dm = masks[0][mb], masks[1][mb]
    n_tok, n_seq, n_micro = norm
    if cfg.grad_accum == "global":
        loss = agg_loss(per_token, tm, cfg.loss_agg_mode, n_tok, n_seq, dm)
    elif cfg.grad_accum == "verl":
        loss = agg_loss(per_token, tm, cfg.loss_agg_mode, denom_mask=dm) / n_micro
    else:
        raise ValueError(f"unknown grad_accum {cfg.grad_accum!r}")
    with torch.no_grad():
        ntm = float(tm.sum())
        ratio = st["ratio"][tm > 0]
        stats = {
            "pg_loss": float(agg_loss(pg, tm, cfg.loss_agg_mode, denom_mask=dm)),
            "kl": float((kl * tm).sum()) / max(ntm, 1.0),
            "clip_frac": float((st["clipped"] * tm).sum()) / max(ntm, 1.0),
            "dual_clip_frac": float((st["dual_clipped"] * tm).sum()) / max(ntm, 1.0),
            "n_tok": ntm,
            "ratio_sum": float(ratio.sum()),
            "ratio_min": float(ratio.min()) if ntm else math.inf,
            "ratio_max": float(ratio.max()) if ntm else -math.inf,
        }
    return loss, stats


class UpdateMetrics:
    """grpo_update's bookkeeping, apart from its loop: sums over the micro-batches and the
    optimizer steps, then (`result`) loss as the mean over mini-batches (the micro-batch
    losses of one add up to its loss), pg_loss, kl, clip_frac, dual_clip_frac as means over
    micro-batches, the ratio's mean, min and max over the trained tokens, grad_norm (pre-clip)
    as the mean over optimizer steps, and n_steps."""

    MICRO = ("pg_loss", "kl", "clip_frac", "dual_clip_frac")     # means over micro-batches

    def __init__(self):
        self.sums = dict.fromkeys(("loss", *self.MICRO, "ratio_mean", "grad_norm"), 0.0)
        self.ratio_min, self.ratio_max = math.inf, -math.inf
        self.n_micro, self.n_steps, self.n_ratio_tok = 0, 0, 0.0

    def micro_batch(self, loss: torch.Tensor, st: dict) -> None:
        self.sums["loss"] += float(loss.detach())
        for k in self.MICRO:
            self.sums[k] += st[k]
        if st["n_tok"] > 0:
            self.sums["ratio_mean"] += st["ratio_sum"]
            self.n_ratio_tok += st["n_tok"]
            self.ratio_min = min(self.ratio_min, st["ratio_min"])
            self.ratio_max = max(self.ratio_max, st["ratio_max"])
        self.n_micro += 1

    def optimizer_step(self, grad_norm: torch.Tensor) -> None:
        self.sums["grad_norm"] += float(grad_norm)
        self.n_steps += 1

    def result(self) -> dict:
        m = {"loss": self.sums["loss"] / max(self.n_steps, 1)}
        m.update({k: self.sums[k] / max(self.n_micro, 1) for k in self.MICRO})
        m["ratio_mean"] = self.sums["ratio_mean"] / max(self.n_ratio_tok, 1.0)
        m["ratio_min"] = self.ratio_min if self.n_ratio_tok else float("nan")
        m["ratio_max"] = self.ratio_max if self.n_ratio_tok else float("nan")
        m["grad_norm"] = self.sums["grad_norm"] / max(self.n_steps, 1)
        m["n_steps"] = self.n_steps
        return m


def grpo_update(model, optimizer, batch: Rollout, cfg, token_mask: torch.Tensor | None = None,
                denominator: str = "all", pg_loss=None) -> dict:
    """One GRPO update on a rollout batch: mini-batches, each its own optimizer step, each
    made of micro-batches whose gradients accumulate.

    model       the policy pi_theta (trained in place).
    batch       a `Rollout` with old_logprobs and advantages [B, R] (token-level), and
                ref_logprobs unless cfg.kl_coef == 0.
    cfg         a config.TrainConfig: the numbers of its "method" section (temperature,
                clip ranges, KL, batch sizes, aggregation, ppo_epochs, grad_clip).
    token_mask  [B, R] optional: the tokens this update trains on (Lopti's stage masks);
                outside it the advantage is 0 and the KL term masked, as in the reference.
    denominator "all" (default, faithful to the reference): masked tokens still count in
                the token-mean denominator, so an update that trains on a fraction f of the
                tokens is scaled by f. "masked": divide by the trained tokens only.
    pg_loss     optional hook replacing `policy_loss` as the per-token policy term:
                pg_loss(logp, old_logp, advantages, rows) -> (loss [b, R], stats with
                policy_loss's keys), where `rows` is the micro-batch's slice of `batch`
                (token_fixes.py: the methods that act on the tokens differently). The KL
                term, the masks and the aggregation stay as they are.

    Loss per mini-batch (token-mean):  sum_t m_t * (L_pg,t + kl_coef * k3_t) / N_tokens,
    its micro-batches' gradients accumulated as design choice 3 says.

    Returns `UpdateMetrics.result()`: loss, pg_loss, kl, clip_frac, dual_clip_frac,
    ratio_mean/min/max (over trained tokens), grad_norm (pre-clip), n_steps."""
    model.train()
    B = batch.input_ids.shape[0]
    resp = batch.response_mask.float()
    train_mask = resp if token_mask is None else resp * token_mask.float()
    denom_mask = resp if denominator == "all" else train_mask
    if denominator not in ("all", "masked"):
        raise ValueError(f"unknown denominator {denominator!r}")
    if cfg.kl_coef != 0.0 and batch.ref_logprobs is None:
        raise ValueError("kl_coef != 0 needs the reference log-probs (batch.ref_logprobs)")
    batch = dataclasses.replace(batch, advantages=batch.advantages * train_mask,
                                ref_logprobs=batch.ref_logprobs if cfg.kl_coef else None)
    metrics = UpdateMetrics()
    for _ in range(cfg.ppo_epochs):
        for ms in range(0, B, cfg.mini_batch_size):
            mini = slice(ms, min(ms + cfg.mini_batch_size, B))
            if train_mask[mini].sum() == 0:
                # Nothing to train on (e.g. an empty Lopti stage): make no optimizer step,
                # so AdamW's momentum and weight decay do not move the weights. The
                # reference would still step on a zero gradient; see lopti.py.
                continue
            micro = range(mini.start, mini.stop, cfg.micro_batch_size)
            norm = (float(denom_mask[mini].sum()), float(mini.stop - mini.start), len(micro))
            optimizer.zero_grad(set_to_none=True)
            losses = []     # the micro-batches', checked before the step (precision.py, choice 7)
            for s in micro:
                mb = slice(s, min(s + cfg.micro_batch_size, mini.stop))
                loss, st = _micro_batch_loss(model, batch, mb, (train_mask, denom_mask), cfg, norm, pg_loss)
                loss.backward()
                metrics.micro_batch(loss, st)
                losses.append(loss.detach())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if not precision.finite_step(torch.stack(losses), grad_norm, cfg):
                continue    # a NaN or inf loss or gradient norm: no step (precision.py, choice 7)
            optimizer.step()
            precision.weights_changed()     # the next forward casts the new weights
            metrics.optimizer_step(grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return metrics.result()
