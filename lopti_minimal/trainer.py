"""The RL step and the loop: GRPO, AR and Lopti (Yang et al. 2025, arXiv 2505.12929).

`rl_step` reads as the paper, in two seams: `make_batch` samples G responses per prompt from
pi_old and scores them with the rule-based reward (`sample_round`), computes the advantages,
pi_old and pi_ref, and reweights the advantages (AR, Eq. 4); `update` updates the policy
(Lopti's two stages, Algorithm 1, or one GRPO update, Eq. 1, with a later method's per-token
policy term where the method is one). One typed batch (batch.Rollout) carries the step's
data from the sampler to the update; each quantity is computed once and added to it. `train`
is the loop around it. What it takes to run them (seeds, data, the run directory, resume,
checkpoints, logs, evaluation hooks, the step's metrics) is in plumbing.py, which a reader of
the method can skip; precision.py holds the numerics (bf16 autocast on float32 master
weights, the optimizer).

Design choices (in full: docs/ARCHITECTURE.md):

1. This module only composes the method's modules: prompts (task/, models.kk_prompt),
   rollouts (sampling.py), the Logic-RL reward (task/reward.py), advantages and the update
   (grpo.py), AR (reweight.py), Lopti (lopti.py); the later token-level methods
   (token_fixes.py) plug into the same update; DAPO's dynamic sampling
   (dynamic_sampling.py, off by default) chooses the groups the batch holds.
2. The lines marked "paper" are the method; the few marked "plumbing" are what running it
   needs (the length order of the rows, the mechanism's measurements, the metrics); those
   marked "beyond the paper" are an option's, off by default.
3. The benchmarks (benchmarks/rl_step.py) and the diagnostics (experiments/diagnostics.py)
   call `make_batch`, `reweight` and `update`, so what they measure is this step.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import NamedTuple

import torch

from . import mechanism, plumbing, precision, token_fixes
from .batch import Rollout, concat_rollouts, decode_responses
from .config import TrainConfig, TrainError
from .dynamic_sampling import Kept, Samples, sample_informative
from .grpo import (batch_logprobs, grpo_update, group_advantages, reinforce_pp_advantages,
                   sort_by_length, token_advantages)
from .lopti import lopti_update, split_generator
from .lora import add_lora
from .models import encode_prompts
from .reweight import reweight_advantages
from .sampling import sample_groups
from .task.reward import score_response


def rollout(model, tokenizer, prompt_ids: list[list[int]], cfg: TrainConfig, generator) -> Rollout:
    """sample_groups over the prompts under the run's autocast, in chunks of
    cfg.rollout_chunk prompts. Records log pi_old only where the trainer does not recompute
    it (cfg.recompute_old_logprobs), so it is computed once either way."""
    chunk = cfg.rollout_chunk or len(prompt_ids)
    device = next(model.parameters()).device
    parts = []
    with precision.autocast(cfg, device):
        for s in range(0, len(prompt_ids), chunk):
            parts.append(sample_groups(
                model, prompt_ids[s:s + chunk], cfg.group_size, cfg.max_new_tokens,
                temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                generator=generator, logprobs=not cfg.recompute_old_logprobs,
                decoder=cfg.decoder))
            precision.free_memory(device)   # this chunk's KV cache (the last one's before the update)
    return concat_rollouts(parts, tokenizer.pad_token_id)


def default_reward(text: str, record: dict) -> float:
    """The Logic-RL reward of a response (task/reward.py): format and answer."""
    return score_response(text, record).total


def sample_round(model, tokenizer, records: list[dict], prompt_ids: list[list[int]], cfg: TrainConfig,
                 generator, reward_fn) -> Samples:
    """--- paper: sample G responses per prompt from pi_old (GRPO), group-major, and the
    rule-based reward of every response (Logic-RL, task/reward.py) ---"""
    t0 = time.perf_counter()
    batch = rollout(model, tokenizer, prompt_ids, cfg, generator)
    seconds = time.perf_counter() - t0
    texts = decode_responses(tokenizer, batch)
    group_records = [r for r in records for _ in range(cfg.group_size)]
    rewards = torch.tensor([float(reward_fn(t, r)) for t, r in zip(texts, group_records)])
    return Samples(batch, rewards, texts, seconds)


class StepBatch(NamedTuple):
    """What `make_batch` returns: the update's batch, and what the step logs of its samples."""
    batch: Rollout            # rows sorted by length; pi_old, advantages (after AR), pi_ref
    rewards: torch.Tensor     # [B], group-major (the sampler's row order)
    texts: list[str]          # the responses, group-major
    sample_s: float           # seconds spent sampling
    dynamic: Kept | None = None     # dynamic sampling's rounds and counts; None when off (the paper)


def make_batch(model, ref, tokenizer, records: list[dict], prompt_ids: list[list[int]],
               cfg: TrainConfig, step: int, reward_fn=None, more_prompts=None) -> StepBatch:
    """Everything the update trains on, for one step on these prompts (``ref``: the frozen
    pi_ref, None without a KL term; ``reward_fn(text, record)``: the Logic-RL total by
    default; ``more_prompts(r)``: the (records, prompt_ids) of sampling round r >= 1, which
    only dynamic sampling asks for: plumbing.step_prompts, as `train` passes it)."""
    reward_fn = reward_fn or default_reward
    device = next(model.parameters()).device

    def draw(r: int) -> Samples:        # round r of the step; the paper's step is round 0 alone
        recs, ids = (records, prompt_ids) if r == 0 else more_prompts(r)
        return sample_round(model, tokenizer, recs, ids, cfg, plumbing.step_generator(cfg.seed, step, device, r),
                            reward_fn)

    # --- paper: the step's samples and their rewards (`sample_round`) ---
    kept = None
    if not cfg.dynamic_sampling:
        s = draw(0)
    else:   # beyond the paper: DAPO's dynamic sampling keeps the groups whose rewards differ
        if more_prompts is None:
            raise ValueError("dynamic_sampling needs more_prompts, the further rounds' prompts "
                             "(plumbing.step_prompts; trainer.train passes them)")
        kept = sample_informative(draw, len(prompt_ids), 1 + cfg.dynamic_sampling, cfg.group_size,
                                  tokenizer.pad_token_id)
        s = kept.samples
    batch, rewards, texts = s.batch, s.rewards, s.texts

    # --- paper: the advantage of every token (0 on padding): GRPO's one per response from
    #     its group (paper section 2) spread over its tokens, or REINFORCE++'s per token ---
    if cfg.estimator == "reinforce_pp":
        advantages = reinforce_pp_advantages(rewards.to(device), batch.response_mask)
    else:
        advantages = token_advantages(group_advantages(rewards, cfg.group_size, cfg.adv_eps).to(device),
                                      batch.response_mask)
    # plumbing: similar lengths in each micro-batch, so the forward passes skip most padding
    # (the same mini-batches, the same loss: grpo.sort_by_length); every row in this order
    # from here on
    batch = sort_by_length(dataclasses.replace(batch, advantages=advantages), cfg)

    with precision.autocast(cfg, device):
        # --- paper: log pi_old by the teacher-forced forward the update uses (the reference's
        #     way: the first ratio is then exactly 1 under bf16 autocast), unless the sampler
        #     recorded it (cfg.recompute_old_logprobs = False) ---
        if cfg.recompute_old_logprobs:
            batch = dataclasses.replace(batch, old_logprobs=batch_logprobs(model, batch, cfg))
        # --- paper: log pi_ref for the KL term of Eq. 1, once for the step (both Lopti stages) ---
        if cfg.kl_coef:
            batch = dataclasses.replace(batch, ref_logprobs=batch_logprobs(ref, batch, cfg))
    return StepBatch(reweight(batch, cfg), rewards, texts, s.seconds, kept)


def reweight(batch: Rollout, cfg: TrainConfig) -> Rollout:
    """--- paper: AR, Eq. 4: A_hat = (alpha * pi_old + 1 - alpha) * A, before any split; the
    batch as it is for a method without AR."""
    if not cfg.uses_ar:
        return batch
    return dataclasses.replace(batch, advantages=reweight_advantages(batch.advantages, batch.old_logprobs,
                                                                     cfg.alpha))


def policy_term(model, batch: Rollout, cfg: TrainConfig, step: int):
    """--- beyond the paper: a later method's per-token policy term (token_fixes.py), its
    token selections made here, once, from pi_old; None for the paper's methods."""
    if not cfg.uses_token_fix:
        return None
    return token_fixes.build(cfg.method, model, batch, cfg, token_fixes.selection_generator(cfg.seed, step))


def update(model, optimizer, batch: Rollout, cfg: TrainConfig, step: int, fix=None) -> tuple[dict, ...]:
    """--- paper: the update. Lopti, Algorithm 1 (split at pi_old < eta; update the
    low-probability tokens, then the high ones), or one GRPO update (Eq. 1) with ``fix``
    (`policy_term`) as its policy term. The random split (a control, lopti.py) draws from its
    own generator. Returns grpo_update's metrics of each stage, in the order they ran."""
    if cfg.uses_lopti:
        m = lopti_update(model, optimizer, batch, cfg, eta=cfg.eta, order=cfg.lopti_order,
                         split=cfg.lopti_split, generator=split_generator(cfg.seed, step))
        return m["stage1"], m["stage2"]
    return (grpo_update(model, optimizer, batch, cfg, pg_loss=fix),)


def rl_step(model, ref, optimizer, tokenizer, records: list[dict], prompt_ids: list[list[int]],
            cfg: TrainConfig, step: int, reward_fn=None, more_prompts=None) -> dict:
    """One RL step on the given prompts (``ref``: the frozen pi_ref, None without a KL
    term; ``more_prompts``: dynamic sampling's further rounds, `make_batch`). Returns the
    step's metrics (a flat dict, plumbing.step_metrics)."""
    device = next(model.parameters()).device
    t0 = time.perf_counter()
    # --- paper: the batch: samples, rewards, advantages, pi_old, pi_ref, AR ---
    sb = make_batch(model, ref, tokenizer, records, prompt_ids, cfg, step, reward_fn, more_prompts)
    if not plumbing.finite_batch(sb, cfg):    # plumbing: no update on a NaN (precision.py, choice 7)
        return plumbing.skipped_step_metrics(cfg, step, sb, time.perf_counter() - t0)
    if sb.dynamic is not None and not sb.dynamic.kept_groups:   # beyond the paper: dynamic sampling
        return plumbing.skipped_step_metrics(cfg, step, sb, time.perf_counter() - t0)  # kept no group
    with precision.autocast(cfg, device):
        fix = policy_term(model, sb.batch, cfg, step)
        probe = mechanism.Probe(cfg, step)      # plumbing: the mechanism before the update
        probe.before(model, sb.batch, fix)
        # --- paper: the update ---
        t1 = time.perf_counter()
        stages = update(model, optimizer, sb.batch, cfg, step, fix)
        t_update = time.perf_counter() - t1
        precision.free_memory(device)    # plumbing: the update's freed blocks, before what follows
        probe.after(model, sb.batch)     # plumbing: which tokens rose / fell, per bin
    seconds = {"sample": sb.sample_s, "update": t_update, "step": time.perf_counter() - t0}
    return plumbing.step_metrics(cfg, step, sb, stages, probe, fix, seconds)


def train(cfg: TrainConfig, resume: bool = False, reward_fn=None, log=None, allow_changed_data: bool = False) -> dict:
    """Run RL, or with ``resume=True`` continue the run in cfg.run_dir (cfg from
    ``plumbing.resume_config``) after its latest complete checkpoint (a finished run at its
    length: run_guard.RunFinished; RL data that changed since: TrainError unless
    ``allow_changed_data``). Returns {"run_dir", "metrics": [...], "final_eval", "paths", "config"}.
    reward_fn(text, record) -> float: the Logic-RL total by default (tests plug in others).
    """
    # plumbing: check everything before anything is loaded or written; data first (cheap,
    # and a bad data setting fails before any model loads)
    with plumbing.Run(cfg, resume, log, allow_changed_data) as run:   # plumbing: the folder, locked
        records, data_path = plumbing.rl_prompt_set(cfg, cfg.progress)
        data_sha256 = run.check_data(data_path)

        # --- paper: the policy, and pi_ref = the frozen *initial* policy (the KL term of
        #     Eq. 1; always cfg.model, also on resume) ---
        model, tokenizer = plumbing.load_policy(cfg)
        ref = precision.reference_copy(model, precision.ref_dtype(cfg)) if cfg.kl_coef else None
        if cfg.lora_rank:            # after pi_ref: the base model (lora.py, choice 3)
            model = add_lora(model, cfg.lora_rank, seed=cfg.seed)
        optimizer = precision.build_optimizer(model, cfg)

        # plumbing: resume from the latest checkpoint, or start the run directory
        start = run.start(model, optimizer, data_path, data_sha256)
        records, prompt_ids = encode_prompts(records, tokenizer, cfg.prompt_style, cfg.max_prompt_len)
        if not records:
            raise TrainError(f"no RL prompt fits max-prompt-len {cfg.max_prompt_len}: raise it")
        run.begin(model, tokenizer, len(records), data_path)

        step = start - 1                 # plumbing: the step a NaN's message names (step + 1)
        try:
            for step in range(start, cfg.steps):
                # --- paper: one RL step on this step's prompts (beyond the paper: `more`, the
                #     further rounds' prompts of dynamic sampling) ---
                recs, ids = plumbing.step_prompts(records, prompt_ids, cfg, step)
                more = functools.partial(plumbing.step_prompts, records, prompt_ids, cfg, step)
                m = rl_step(model, ref, optimizer, tokenizer, recs, ids, cfg, step, reward_fn, more)
                run.after_step(m, model, tokenizer, optimizer)     # plumbing: log, evaluate, checkpoint
            return run.finish(model, tokenizer, optimizer)          # plumbing: final policy, evaluation
        except precision.NonFiniteError as e:   # plumbing: a NaN stopped the run (precision.py, choice 7)
            run.stop(e, step + 1)
            raise
