"""The RL step and the loop: GRPO, AR and Lopti (Yang et al. 2025, arXiv 2505.12929).

`rl_step` reads as the paper: sample G responses per prompt from pi_old, score them with
the rule-based reward, compute the advantages, reweight them (AR, Eq. 4), and update the
policy (Lopti's two stages, Algorithm 1, or one GRPO update, Eq. 1). One typed batch
(batch.Rollout) carries the step's data from the sampler to the update; each quantity is
computed once and added to it. `train` is the loop around it. What it takes to run them
(seeds, data, the run directory, resume, checkpoints, logs, evaluation hooks, the step's
metrics) is in plumbing.py, which a reader of the method can skip; precision.py holds the
numerics (bf16 autocast on float32 master weights, the optimizer).

Design choices (in full: docs/ARCHITECTURE.md):

1. This module only composes the method's modules: prompts (task/, models.kk_prompt),
   rollouts (sampling.py), the Logic-RL reward (task/reward.py), advantages and the update
   (grpo.py), AR (reweight.py), Lopti (lopti.py); the later token-level methods
   (token_fixes.py) plug into the same update.
2. The lines marked "paper" are the method; the few marked "plumbing" are what running it
   needs (the length order of the rows, the mechanism's measurements, the metrics).
"""
from __future__ import annotations

import dataclasses
import time

import torch

from . import mechanism, plumbing, precision, token_fixes
from .config import TOKEN_FIXES, TrainConfig, TrainError
from .grpo import (batch_logprobs, grpo_update, group_advantages, reinforce_pp_advantages,
                   sort_by_length, token_advantages)
from .lopti import lopti_update, split_by_probability, split_generator
from .lora import add_lora
from .models import encode_prompts
from .reweight import reweight_advantages
from .sampling import sample_groups
from .batch import Rollout, concat_rollouts, decode_responses
from .task.reward import score_response


def rollout(model, tokenizer, prompt_ids: list[list[int]], cfg: TrainConfig, generator, *,
            group_size: int | None = None, max_new_tokens: int | None = None,
            greedy: bool = False) -> Rollout:
    """sample_groups over the prompts under the run's autocast, in chunks of
    cfg.rollout_chunk prompts. Records log pi_old only where the trainer does not recompute
    it (cfg.recompute_old_logprobs), so it is computed once either way."""
    G = group_size or cfg.group_size
    chunk = cfg.rollout_chunk or len(prompt_ids)
    device = next(model.parameters()).device
    parts = []
    with precision.autocast(cfg, device):
        for s in range(0, len(prompt_ids), chunk):
            parts.append(sample_groups(
                model, prompt_ids[s:s + chunk], G, max_new_tokens or cfg.max_new_tokens,
                temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                generator=generator, greedy=greedy, logprobs=not cfg.recompute_old_logprobs,
                decoder=cfg.decoder))
            precision.free_memory(device)   # this chunk's KV cache (the last one's before the update)
    return concat_rollouts(parts, tokenizer.pad_token_id)


def default_reward(text: str, record: dict) -> float:
    """The Logic-RL reward of a response (task/reward.py): format and answer."""
    return score_response(text, record).total


def rl_step(model, ref, optimizer, tokenizer, records: list[dict], prompt_ids: list[list[int]],
            cfg: TrainConfig, step: int, reward_fn=None) -> dict:
    """One RL step on the given prompts (``ref``: the frozen pi_ref, None without a KL
    term). Returns the step's metrics (a flat dict, plumbing.step_metrics)."""
    reward_fn = reward_fn or default_reward
    device = next(model.parameters()).device
    t0 = time.perf_counter()

    # --- paper: sample G responses per prompt from pi_old (GRPO), group-major ---
    batch = rollout(model, tokenizer, prompt_ids, cfg, plumbing.step_generator(cfg.seed, step, device))
    t_sample = time.perf_counter() - t0

    # --- paper: the rule-based reward of every response (Logic-RL, task/reward.py) ---
    texts = decode_responses(tokenizer, batch)
    group_records = [r for r in records for _ in range(cfg.group_size)]
    rewards = torch.tensor([float(reward_fn(t, r)) for t, r in zip(texts, group_records)])

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
        # --- paper: AR, Eq. 4: A_hat = (alpha * pi_old + 1 - alpha) * A, before any split ---
        if cfg.uses_ar:
            batch = dataclasses.replace(batch, advantages=reweight_advantages(
                batch.advantages, batch.old_logprobs, cfg.alpha))
        # --- beyond the paper: a later method's per-token policy term (token_fixes.py), its
        #     token selections made here, once, from pi_old ---
        fix = (token_fixes.build(cfg.method, model, batch, cfg, token_fixes.selection_generator(cfg.seed, step))
               if cfg.method in TOKEN_FIXES else None)
        # plumbing: the mechanism before the update (mechanism.py)
        probe = mechanism.Probe(cfg, step)
        probe.before(model, batch, fix)

        # --- paper: the update. Lopti, Algorithm 1 (split at pi_old < eta; update the
        #     low-probability tokens, then the high ones), or one GRPO update (Eq. 1). The
        #     random split (a control, lopti.py) draws from its own generator ---
        t1 = time.perf_counter()
        if cfg.uses_lopti:
            m = lopti_update(model, optimizer, batch, cfg, eta=cfg.eta, order=cfg.lopti_order,
                             split=cfg.lopti_split, generator=split_generator(cfg.seed, step)
                             if cfg.lopti_split == "random" else None)
            stages, low = (m["stage1"], m["stage2"]), m["low_fraction"]
        else:
            stages = (grpo_update(model, optimizer, batch, cfg, pg_loss=fix),)
            mask = batch.response_mask
            low = float(split_by_probability(batch.old_logprobs, mask, cfg.low_eta)[0].sum()
                        / mask.sum().clamp_min(1))
        t_update = time.perf_counter() - t1
        precision.free_memory(device)    # plumbing: the update's freed blocks, before what follows

        # plumbing: the mechanism after the update: which tokens rose / fell, per bin
        probe.after(model, batch)

    seconds = {"sample": t_sample, "update": t_update, "step": time.perf_counter() - t0}
    return plumbing.step_metrics(cfg, step, rewards, texts, batch, stages, low, probe, fix, seconds)


def train(cfg: TrainConfig, resume: bool = False, reward_fn=None, log=None) -> dict:
    """Run RL, or with ``resume=True`` continue the run in cfg.run_dir (cfg from
    ``plumbing.resume_config``) after its latest complete checkpoint.
    Returns {"run_dir", "metrics": [...], "final_eval", "paths", "config"}.
    reward_fn(text, record) -> float: the Logic-RL total by default (tests plug in others).
    """
    # plumbing: check everything before anything is loaded or written; data first (cheap,
    # and a bad data setting fails before any model loads)
    run = plumbing.Run(cfg, resume, log)
    records, data_path = plumbing.rl_prompt_set(cfg, cfg.progress)

    # --- paper: the policy, and pi_ref = the frozen *initial* policy (the KL term of
    #     Eq. 1; always cfg.model, also on resume) ---
    model, tokenizer = plumbing.load_policy(cfg)
    ref = precision.reference_copy(model, precision.ref_dtype(cfg)) if cfg.kl_coef else None
    if cfg.lora_rank:            # after pi_ref: the base model (lora.py, choice 3)
        model = add_lora(model, cfg.lora_rank, seed=cfg.seed)
    optimizer = precision.build_optimizer(model, cfg)

    # plumbing: resume from the latest checkpoint, or start the run directory
    start = run.start(model, optimizer, data_path)
    records, prompt_ids = encode_prompts(records, tokenizer, cfg.prompt_style, cfg.max_prompt_len)
    if not records:
        raise TrainError(f"no RL prompt fits max-prompt-len {cfg.max_prompt_len}: raise it")
    run.begin(model, tokenizer, len(records), data_path)

    for step in range(start, cfg.steps):
        # --- paper: one RL step on this step's prompts ---
        idx = plumbing.step_prompt_indices(cfg.seed, step, cfg.prompts_per_step, len(records))
        m = rl_step(model, ref, optimizer, tokenizer, [records[i] for i in idx],
                    [prompt_ids[i] for i in idx], cfg, step, reward_fn)
        run.after_step(m, model, tokenizer, optimizer)     # plumbing: log, evaluate, checkpoint
    return run.finish(model, tokenizer, optimizer)          # plumbing: final policy, evaluation
