"""The RL loop: rollouts, rewards, group advantages, AR, the GRPO or Lopti update, logging,
checkpoints, resume, evaluation.

Design choices (the loop, resume and the run directory in full: docs/ARCHITECTURE.md):

1. This module only *composes* the others (Yang et al. 2025, arXiv 2505.12929): prompts
   (task/kk.py, models.kk_prompt), rollouts (sampling.py), the Logic-RL reward
   (task/reward.py), group advantages (grpo.py), AR (reweight.py, paper Eq. 4), and
   lopti_update (lopti.py, Algorithm 1) or grpo_update (grpo.py).
2. Every random choice of a step is derived from (seed, step): the prompts from a
   permutation seeded by (seed, epoch), the sampler's torch.Generator by (seed, step).
   Nothing random is carried between steps except the model and optimizer, which the
   checkpoints store exactly, so a run resumed from its step-k checkpoint repeats steps
   k+1.. bit for bit (tests/test_trainer.py proves it). The global RNG states are saved
   too, for code that might use them (none of ours does).
3. Everything a run writes lives in its run directory (run.json, metrics.jsonl,
   evals.jsonl, ckpt-*/, final/, eval_final.json, plots), read and written by runs.py.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

# Configuration, presets and the paper's per-method table live in config.py (one
# declaration per option); re-exported here because every run starts from them.
from .config import (ESTIMATORS, GPU_MEMORY_GB, METHODS, PAPER_SETTINGS, PRESETS,  # noqa: F401
                     TOKEN_FIXES, TrainConfig, TrainError, config_from_json, config_to_json, make_config,
                     paper_settings, validate)
from .grpo import (batch_from_rollout, batch_logprobs, grpo_update, group_advantages, kl_k3,
                   reinforce_pp_advantages, sort_by_length, token_advantages)
from .lopti import lopti_update, split_by_probability
from .models import (ModelLoadError, count_parameters, default_device, encode_prompts,
                     load_model_and_tokenizer, set_gradient_checkpointing)
from . import mechanism, precision, runs, token_fixes
from .lora import add_lora, load_adapter_state
from .paths import resolve_model, work_root
from .precision import PrecisionError, check_hardware, master_dtype, ref_dtype, reference_copy
from .precision import autocast as amp
from .precision import build_optimizer
from .reweight import reweight_advantages
from .runs import (RUN_MARKER, append_jsonl, checkpoints, default_run_dir, save_checkpoint, saved_config,
                   save_hf_atomic, truncate_jsonl)
from .sampling import Rollout, decode_responses, sample_groups
from .task import dataset, kk, reward
from .task.behaviours import derive_share
from .task.evaluate import check_records, evaluate_records, write_eval_json
from .task.reward import score_response

# The repository (or, in an installed copy, the current directory): cache/ is written here.
ROOT = work_root()


# =======================================================================================
# Seeds: every random draw of a step derives from (seed, step)
# =======================================================================================

def step_generator(seed: int, step: int, device="cpu") -> torch.Generator:
    """The sampler's generator for one step. Seeding by (seed, step) rather than carrying
    one generator through the run is what makes resume exact without saving its state."""
    g = torch.Generator(device=device)
    g.manual_seed(int(np.random.SeedSequence([seed, step, 1]).generate_state(1)[0]))
    return g


def step_prompt_indices(seed: int, step: int, per_step: int, n: int) -> list[int]:
    """Indices of the step's prompts: consecutive slices of a fresh permutation of the
    prompt set per epoch (each epoch sees every prompt once), seeded by (seed, epoch)."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n)
        out.append(int(_permutation(seed, epoch, n)[pos]))
    return out


_PERM_CACHE: dict = {}


def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    key = (seed, epoch, n)
    if key not in _PERM_CACHE:
        _PERM_CACHE.clear()                     # only the current epoch is ever needed
        _PERM_CACHE[key] = np.random.default_rng([seed, epoch, 2]).permutation(n)
    return _PERM_CACHE[key]


# =======================================================================================
# Data: the cached RL prompt set
# =======================================================================================

def rl_prompt_set(cfg: TrainConfig, progress: bool = True) -> tuple[list[dict], str]:
    """Generated K&K records for RL (sizes cfg.rl_sizes, cfg.rl_per_size each), with every
    official test puzzle excluded; cached as JSON Lines so later runs reuse the same set.
    Returns (records, cache path)."""
    if cfg.rl_data:
        return load_records(cfg.rl_data), str(cfg.rl_data)
    sizes = "-".join(str(n) for n in cfg.rl_sizes)
    # ROOT / an absolute cache_dir is that absolute path.
    path = ROOT / cfg.cache_dir / "rl_prompts" / f"kk-n{sizes}-x{cfg.rl_per_size}-seed{cfg.data_seed}.jsonl"
    if path.exists():
        return kk.load_jsonl(path), str(path)
    exclude = kk.official_keys()
    records: list[dict] = []
    with tqdm(total=len(cfg.rl_sizes) * cfg.rl_per_size, desc="RL prompts", disable=not progress,
              file=sys.stderr) as bar:
        for n in cfg.rl_sizes:
            # A seed per size, so adding a size does not change the others' puzzles.
            records += dataset.generate_records(n, cfg.rl_per_size, seed=cfg.data_seed + 1000 * n,
                                           exclude=exclude, progress=bar)
    path.parent.mkdir(parents=True, exist_ok=True)
    kk.save_jsonl(records, path, overwrite=True)      # atomic (temp file, then rename)
    return records, str(path)


def load_records(path) -> list[dict]:
    """K&K records from a JSON Lines file; TrainError (one line) if unreadable."""
    try:
        records = kk.load_jsonl(path)
        check_records(records, str(path))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise TrainError(f"cannot read K&K data {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return records


# =======================================================================================
# Model, reference, optimizer
# =======================================================================================

def resolve_device(cfg: TrainConfig) -> torch.device:
    return default_device() if cfg.device == "auto" else torch.device(cfg.device)


def resolve_dtype(cfg: TrainConfig, device=None) -> torch.dtype:
    """The dtype of the trained weights (precision.master_dtype: float32 unless asked)."""
    return master_dtype(cfg)


def load_policy(cfg: TrainConfig, source: str | None = None):
    """(model, tokenizer) from cfg.model (or ``source``, e.g. a checkpoint), on the
    configured device and dtype; gradient checkpointing as configured."""
    device = resolve_device(cfg)
    # repo-relative defaults work from any working dir, and from an installed copy
    src = source or cfg.model
    src = resolve_model(src) if src else src
    try:
        model, tok = load_model_and_tokenizer(src, dtype=resolve_dtype(cfg, device), device=device)
    except ModelLoadError as e:
        raise TrainError(str(e)) from e
    set_gradient_checkpointing(model, cfg.gradient_checkpointing)
    return model, tok


def frozen_copy(model, dtype: torch.dtype | None = None):
    """The reference policy pi_ref: a frozen copy of the initial policy (paper Eq. 1's KL
    term), in ``dtype`` if given (precision.reference_copy)."""
    return reference_copy(model, dtype)


def make_optimizer(model, cfg: TrainConfig):
    """AdamW as in the reference, or the low-memory alternatives (precision.build_optimizer)."""
    try:
        return build_optimizer(model, cfg)
    except PrecisionError as e:
        raise TrainError(str(e)) from None


def autocast(cfg: TrainConfig, device):
    """bf16 autocast for compute when cfg.autocast_bf16, on CPU and CUDA (precision.py)."""
    return amp(cfg, device)


# =======================================================================================
# One RL step
# =======================================================================================

def concat_rollouts(parts: list, pad_token_id: int):
    """Join rollouts of prompt chunks (rollout_chunk) into one, keeping the layout
    [left-padded prompt | right-padded response]: prompts are padded on the left to the
    widest prompt, responses on the right to the longest response."""
    if len(parts) == 1:
        return parts[0]
    P = max(r.prompt_len for r in parts)
    R = max(r.response_ids.shape[1] for r in parts)

    def pad(t, left, right, value):
        return torch.nn.functional.pad(t, (left, right), value=value)

    ids, am, rid, rm, lp = [], [], [], [], []
    for r in parts:
        dl, dr = P - r.prompt_len, R - r.response_ids.shape[1]
        ids.append(pad(r.input_ids, dl, dr, pad_token_id))
        am.append(pad(r.attention_mask, dl, dr, 0))
        rid.append(pad(r.response_ids, 0, dr, pad_token_id))
        rm.append(pad(r.response_mask, 0, dr, 0.0))
        lp.append(pad(r.old_logprobs, 0, dr, 0.0))
    return Rollout(input_ids=torch.cat(ids), attention_mask=torch.cat(am), response_ids=torch.cat(rid),
                   response_mask=torch.cat(rm), old_logprobs=torch.cat(lp), prompt_len=P,
                   group_size=parts[0].group_size)


def rollout(model, tokenizer, prompt_ids: list[list[int]], cfg: TrainConfig, generator, *,
            group_size: int | None = None, max_new_tokens: int | None = None, greedy: bool = False):
    """sample_groups over the prompts, in chunks of cfg.rollout_chunk prompts."""
    G = group_size or cfg.group_size
    chunk = cfg.rollout_chunk or len(prompt_ids)
    device = next(model.parameters()).device
    parts = []
    with autocast(cfg, device):
        for s in range(0, len(prompt_ids), chunk):
            parts.append(sample_groups(
                model, prompt_ids[s:s + chunk], G, max_new_tokens or cfg.max_new_tokens,
                temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                generator=generator, greedy=greedy))
            precision.free_memory(device)   # this chunk's KV cache (the last one's before the update)
    return concat_rollouts(parts, tokenizer.pad_token_id)


def default_reward(text: str, record: dict) -> float:
    return score_response(text, record).total


def rl_step(model, ref, optimizer, tokenizer, records: list[dict], prompt_ids: list[list[int]],
            cfg: TrainConfig, step: int, reward_fn=None) -> dict:
    """One RL step on the given prompts. Returns the step's metrics (a flat dict).

    Reads top to bottom: the lines marked "paper" are the method (Yang et al. 2025: the
    GRPO objective, Eq. 1; AR, Eq. 4; Lopti, Algorithm 1), the lines marked "plumbing"
    are what it takes to run it (timing, padding order, numerics, metrics)."""
    # plumbing: defaults, device, clocks
    reward_fn = reward_fn or default_reward
    gcfg = cfg.grpo_config()
    device = next(model.parameters()).device
    G = cfg.group_size
    t0 = time.perf_counter()

    # --- paper: sample G responses per prompt from pi_old (GRPO), group-major ---
    ro = rollout(model, tokenizer, prompt_ids, cfg, step_generator(cfg.seed, step, device))
    t_sample = time.perf_counter() - t0

    # --- paper: the rule-based reward of every response (Logic-RL, task/reward.py) ---
    texts = decode_responses(tokenizer, ro)
    recs = [r for r in records for _ in range(G)]
    rewards = torch.tensor([float(reward_fn(t, r)) for t, r in zip(texts, recs)])

    # --- paper: advantages. GRPO's one per response from its group (paper section 2),
    #     broadcast to its tokens, or REINFORCE++'s per token, whitened over the batch
    #     (padding 0 in both) ---
    if cfg.estimator == "reinforce_pp":
        tok_adv = reinforce_pp_advantages(rewards.to(device), ro.response_mask)
    else:
        tok_adv = token_advantages(group_advantages(rewards, G, gcfg.adv_eps).to(device), ro.response_mask)
    with autocast(cfg, device):
        # plumbing: one batch dict, sorted by length, old and reference log-probs
        batch = batch_from_rollout(ro, tok_adv)
        # Similar lengths in each micro-batch, so the forward passes skip most padding
        # (the same mini-batches, the same loss; see sort_by_length). From here on every
        # per-row tensor, the mask included, is in this order.
        batch, _ = sort_by_length(batch, gcfg)
        mask = batch["response_mask"]
        # log pi_old by the same teacher-forced forward the update uses (verl does
        # this too): under bf16 autocast the sampler's incremental logits differ in the
        # last bits, and the first ratio must be exactly 1 (a known pitfall of GRPO
        # implementations).
        if cfg.recompute_old_logprobs:
            batch["old_logprobs"] = batch_logprobs(model, batch, gcfg)
        # Reference log-probs (the KL term of Eq. 1) once per step (both Lopti stages reuse them).
        ref_logp = batch_logprobs(ref, batch, gcfg) if cfg.kl_coef else None
        # --- paper: AR, Eq. 4: A_hat = (alpha * pi_old + 1 - alpha) * A, on the token
        #     advantages, before any split ---
        if cfg.uses_ar:
            batch["advantages"] = reweight_advantages(batch["advantages"], batch["old_logprobs"], cfg.alpha)
        # --- beyond the paper: a later method's per-token policy term (token_fixes.py), its
        #     token selections made here, once, from pi_old ---
        fix = (token_fixes.build_from_config(cfg, model, batch, gcfg, step)
               if cfg.method in token_fixes.TOKEN_FIXES else None)
        # plumbing: the mechanism (mechanism.py): each bin's share of the squared gradient
        # norm at pi_old (Fig. 1b), every grad_shares_every steps; the log-probs before the
        # update, computed as the ones after it will be
        mech, t_mech = {}, time.perf_counter()
        if cfg.grad_shares_every and step % cfg.grad_shares_every == 0:
            mech["grad_sq_share"] = mechanism.gradient_sq_shares(model, batch, ref_logp, gcfg, fix)
        before = batch["old_logprobs"] if cfg.recompute_old_logprobs else batch_logprobs(model, batch, gcfg)
        t1 = time.perf_counter()
        t_mech = t1 - t_mech
        # --- paper: the update. Lopti, Algorithm 1 (split at pi_old < eta; update the
        #     low-probability tokens, then the high ones), or one GRPO update (Eq. 1) ---
        if cfg.uses_lopti:
            m = lopti_update(model, ref_logp, optimizer, batch, gcfg, eta=cfg.eta, order=cfg.lopti_order)
            stages = (m["stage1"], m["stage2"])
            low = m["low_fraction"]
        else:
            stages = (grpo_update(model, ref_logp, optimizer, batch, gcfg, pg_loss=fix),)
            low = float(split_by_probability(batch["old_logprobs"], mask, cfg.eta)[0].sum() / mask.sum().clamp_min(1))
        t_update = time.perf_counter() - t1
        # plumbing: the mechanism (Fig. 3 at every step): which tokens rose / fell, per bin
        t2 = time.perf_counter()
        mech.update(mechanism.step_shares(before, batch_logprobs(model, batch, gcfg),
                                          batch["advantages"], mask))
        t_mech += time.perf_counter() - t2

    # plumbing: metrics. KL: k3 between pi_old (this step's policy) and pi_ref, over all tokens.
    n_tok = float(mask.sum())
    kl = float((kl_k3(batch["old_logprobs"], ref_logp, cfg.kl_log_ratio_clamp) * mask).sum() / max(n_tok, 1)) if ref_logp is not None else 0.0
    # Token shares of the stages in the order they ran (stage 1 = the high tokens if high_first).
    shares = ((low, 1 - low) if cfg.lopti_order == "low_first" else (1 - low, low)) if len(stages) == 2 else (1.0,)
    correct = (rewards == reward.RIGHT).float()
    groups = rewards.view(-1, G)
    return {
        "step": step + 1,
        "reward": float(rewards.mean()),
        "accuracy": float(correct.mean()),
        "format_ok": float((rewards > reward.BAD_FORMAT).float().mean()),
        # The behaviour of the samples (behaviours.py): the share that derive rather than
        # guess. From the shipped warm start RL should raise it (the selection it makes).
        "derive_share": derive_share(texts),
        "response_len": float(mask.sum(1).mean()),
        "truncated": float((mask.sum(1) >= cfg.max_new_tokens).float().mean()),
        "kl": kl,
        "clip_frac": sum(s * st["clip_frac"] for s, st in zip(shares, stages)),
        "grad_norm": float(np.mean([st["grad_norm"] for st in stages if st["n_steps"]] or [0.0])),
        "low_fraction": low,
        "zero_adv_groups": float((groups == groups[:, :1]).all(1).float().mean()),
        "pg_loss": sum(st["pg_loss"] for st in stages),
        # Ratios of the first update: exactly 1 on its first mini-batch (fresh samples).
        "ratio_min": stages[0]["ratio_min"], "ratio_max": stages[0]["ratio_max"],
        **mech,
        # the share of tokens a token fix singles out (kept, detached or penalised)
        **({"fix_fraction": fix.fraction(mask)} if fix is not None and fix.mask is not None else {}),
        "tokens": int(n_tok),
        "sample_s": round(t_sample, 3),
        "update_s": round(t_update, 3),
        "mechanism_s": round(t_mech, 3),      # the mechanism's measurements (mechanism.py)
        "step_s": round(time.perf_counter() - t0, 3),
    }


def summary_line(m: dict, steps: int) -> str:
    """The one-line per-step summary."""
    return (f"step {m['step']:>4}/{steps} | reward {m['reward']:+.3f} | acc {m['accuracy']:.3f} | "
            f"derive {m.get('derive_share', float('nan')):.2f} | len {m['response_len']:6.1f} | kl {m['kl']:.2e} | clip {m['clip_frac']:.3f} | "
            f"gnorm {m['grad_norm']:.3f} | low {m['low_fraction']:.3f} | "
            f"{m['step_s']:.1f}s (sample {m['sample_s']:.1f}s)")


# =======================================================================================
# Run directory, checkpoints, resume
# =======================================================================================

def read_run_config(path) -> TrainConfig:
    """The config of an existing run; TrainError if ``path`` is not one of our runs."""
    if not Path(path).is_dir():
        raise TrainError(f"--resume {path}: no such directory")
    saved = saved_config(path)
    if saved is None:
        raise TrainError(f"--resume {path}: not a lopti-minimal run directory (no valid run.json)")
    return config_from_json(saved)


# =======================================================================================
# Evaluation hook
# =======================================================================================

def evaluate_policy(model, tokenizer, cfg: TrainConfig, sizes=None, per_size=None, progress=True) -> dict:
    """Greedy accuracy on the official sets (task/evaluate.py), with the run's numerics."""
    sizes = tuple(sizes or cfg.eval_sizes)
    per = per_size or cfg.eval_per_size
    records = [r for n in sizes for r in kk.load_official([n])[:per]]
    return evaluate_records(model, tokenizer, records, max_new_tokens=cfg.eval_max_new_tokens,
                            batch_size=cfg.eval_batch_size, prompt_style=cfg.prompt_style,
                            autocast_bf16=cfg.autocast_bf16, rollout_chunk=0, progress=progress)


# =======================================================================================
# The run
# =======================================================================================

def resume_config(run_dir, steps: int | None = None, progress: bool | None = None) -> TrainConfig:
    """The saved config of a run, to continue it; ``steps`` may extend a finished run."""
    cfg = read_run_config(run_dir)
    cfg.run_dir = str(run_dir)
    if steps:
        cfg.steps = steps
    if progress is not None:
        cfg.progress = progress
    return cfg


def train(cfg: TrainConfig, resume: bool = False, reward_fn=None, log=None) -> dict:
    """Run RL, or with ``resume=True`` continue the run in cfg.run_dir (cfg from
    ``resume_config``) after its latest complete checkpoint.
    Returns {"run_dir", "metrics": [...], "final_eval", "paths", "config"}.
    reward_fn(text, record) -> float: the Logic-RL total by default (tests plug in others).
    """
    # plumbing: check everything before anything is loaded or written
    log = log or (lambda s: tqdm.write(s, file=sys.stdout))
    if resume:
        read_run_config(cfg.run_dir)          # TrainError unless it is one of our runs
    validate(cfg)
    try:
        check_hardware(cfg)                   # before any model is loaded
    except PrecisionError as e:
        raise TrainError(str(e)) from None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_dir = Path(cfg.run_dir or default_run_dir(cfg))
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise TrainError(f"run directory {run_dir} exists and is not empty: pass --resume {run_dir} "
                         "or choose another --run-dir")

    # plumbing: data first (cheap, and a bad data setting fails before any model loads).
    records, data_path = rl_prompt_set(cfg, cfg.progress)

    # --- paper: the policy, and pi_ref = the frozen *initial* policy (the KL term of
    #     Eq. 1; always cfg.model, also on resume) ---
    model, tokenizer = load_policy(cfg)
    ref = frozen_copy(model, ref_dtype(cfg)) if cfg.kl_coef else None
    if cfg.lora_rank:            # after pi_ref: the base model (lora.py, choice 3)
        model = add_lora(model, cfg.lora_rank, seed=cfg.seed)
    optimizer = make_optimizer(model, cfg)
    # plumbing: resume from the latest checkpoint, or start the run directory
    start = 0
    if resume:
        ck = checkpoints(run_dir)
        if ck:
            start, path = ck[-1]
            state = torch.load(path / "trainer_state.pt", weights_only=False)
            if cfg.lora_rank:
                load_adapter_state(model, state["lora"])
            else:
                loaded, _ = load_policy(cfg, str(path))
                model.load_state_dict(loaded.state_dict())
                del loaded
            optimizer.load_state_dict(state["optimizer"])
            random.setstate(state["rng"]["python"])
            np.random.set_state(state["rng"]["numpy"])
            torch.set_rng_state(state["rng"]["torch"])
            log(f"[resume] {path} (step {start})")
        for name in ("metrics.jsonl", "evals.jsonl"):
            truncate_jsonl(run_dir / name, start)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(
            {"kind": RUN_MARKER, "config": config_to_json(cfg), "data": data_path,
             "created": time.strftime("%Y-%m-%d %H:%M:%S"), "code": runs.code_version()}, indent=1))
    records, prompt_ids = encode_prompts(records, tokenizer, cfg.prompt_style, cfg.max_prompt_len)
    if not records:
        raise TrainError(f"no RL prompt fits max-prompt-len {cfg.max_prompt_len}: raise it")

    log(f"[run] {run_dir}\n[run] model {cfg.model} ({count_parameters(model):,} params, "
        f"{next(model.parameters()).dtype}, {next(model.parameters()).device}), method {cfg.method}, "
        f"{cfg.prompts_per_step} prompts x G={cfg.group_size}, lr {cfg.lr:g}, T {cfg.temperature}, "
        f"{len(records)} RL prompts ({data_path}), threads {torch.get_num_threads()}")
    writer = _tensorboard(cfg, run_dir)
    if cfg.eval_before and start == 0:
        ev = evaluate_policy(model, tokenizer, cfg, progress=cfg.progress)
        write_eval_json(ev, run_dir / "eval_before.json")
        log("[eval] before RL: " + _eval_text(ev))

    metrics_path, evals_path = run_dir / "metrics.jsonl", run_dir / "evals.jsonl"
    history = [json.loads(l) for l in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    bar = tqdm(total=cfg.steps, initial=start, desc="RL steps", disable=not cfg.progress,
               file=sys.stderr, unit="step")
    t_run = time.perf_counter()
    for step in range(start, cfg.steps):
        # --- paper: one RL step on this step's prompts (rl_step) ---
        idx = step_prompt_indices(cfg.seed, step, cfg.prompts_per_step, len(records))
        m = rl_step(model, ref, optimizer, tokenizer, [records[i] for i in idx],
                    [prompt_ids[i] for i in idx], cfg, step, reward_fn)
        # plumbing: log, evaluate, checkpoint
        history.append(m)
        append_jsonl(metrics_path, m)
        if writer:
            for k, v in m.items():
                for name, x in ([(f"{k}/bin{i}", x) for i, x in enumerate(v)] if isinstance(v, list) else [(k, v)]):
                    if x is not None:
                        writer.add_scalar(f"train/{name}", x, m["step"])
        bar.update(1)
        bar.set_postfix(reward=f"{m['reward']:+.2f}", acc=f"{m['accuracy']:.2f}", refresh=False)
        log(summary_line(m, cfg.steps))
        done = step + 1
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            ev = evaluate_policy(model, tokenizer, cfg, progress=cfg.progress)
            append_jsonl(evals_path, {"step": done, **_eval_brief(ev)})
            log(f"[eval] step {done}: " + _eval_text(ev))
        if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
            save_checkpoint(run_dir, done, model, tokenizer, optimizer, config_to_json(cfg), cfg.keep_checkpoints)
    bar.close()
    rl_seconds = time.perf_counter() - t_run

    # plumbing: the end: a final checkpoint (resumable: extend with --resume --steps N), the final
    # policy in HF format, the final evaluation, plots.
    paths = {"run_dir": str(run_dir), "metrics": str(metrics_path)}
    if cfg.steps > start or not (run_dir / "final").exists():
        save_checkpoint(run_dir, cfg.steps, model, tokenizer, optimizer, config_to_json(cfg),
                        cfg.keep_checkpoints)
        save_hf_atomic(model, tokenizer, run_dir / "final")
    paths["final_model"] = str(run_dir / "final")
    final_eval = None
    if cfg.final_eval:
        final_eval = evaluate_policy(model, tokenizer, cfg, progress=cfg.progress)
        write_eval_json(final_eval, run_dir / "eval_final.json")
        append_jsonl(evals_path, {"step": cfg.steps, "final": True, **_eval_brief(final_eval)})
        paths["eval"] = str(run_dir / "eval_final.json")
        log("[eval] final: " + _eval_text(final_eval))
    if cfg.plots:
        try:
            from .plots import plot_run
            paths["plots"] = plot_run(run_dir)
        except Exception as e:           # plotting must never lose a finished run
            log(f"[plots] skipped: {e}")
    if writer:
        writer.close()
    (run_dir / "summary.json").write_text(json.dumps(
        {"steps": cfg.steps, "rl_seconds_this_session": round(rl_seconds, 1), "paths": paths,
         "final_eval": _eval_brief(final_eval) if final_eval else None}, indent=1))
    return {"run_dir": str(run_dir), "metrics": history, "final_eval": final_eval, "paths": paths,
            "config": cfg}


def _eval_brief(ev: dict) -> dict:
    return {"accuracy": {str(n): v["accuracy"] for n, v in ev["per_size"].items()},
            "mean_accuracy": ev["overall"]["accuracy"],
            "format_error": ev["overall"]["format_error"]}


def _eval_text(ev: dict) -> str:
    per = " ".join(f"{n}p {v['accuracy']:.2f}" for n, v in ev["per_size"].items())
    return f"accuracy {per} | mean {ev['overall']['accuracy']:.3f} | format errors {ev['overall']['format_error']:.3f}"


def _tensorboard(cfg: TrainConfig, run_dir: Path):
    if not cfg.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("[tensorboard] not installed (pip install tensorboard); logging to JSON Lines only")
        return None
    return SummaryWriter(str(run_dir / "tb"))


# =======================================================================================
# GPU memory estimate (the table in docs/GPU.md)
# =======================================================================================

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def memory_estimate_gb(n_params: float, layers: int, kv_heads: int, head_dim: int, vocab: int,
                       rows: int, seq: int, micro_batch: int, optimizer: str = "adamw",
                       weights: str = "float32", ref: str = "bfloat16") -> dict:
    """Rough GPU memory of one training step in GB (1e9 bytes) under a precision policy
    (precision.py): trained weights and their gradients in ``weights`` (4 B/param for
    float32 master weights, 2 for bf16); optimizer state: AdamW's two moments in the
    weights' dtype (8 or 4 B/param), torchao's 8-bit AdamW 2 B/param, Adafactor ~0; the
    frozen reference copy in ``ref``; the bf16 KV cache of one rollout chunk (rows x seq x
    layers x 2 x kv_heads x head_dim x 2 B; autocast computes keys and values in bf16);
    the float32 logits of one micro-batch [micro_batch, seq, vocab] (x2: value + grad).
    The phases do not overlap: sampling holds the KV cache (grads are freed after each
    update), the update holds grads and logits; "peak" is the larger phase. Checkpointed
    activations (~0.1-0.7 GB) and the CUDA context (~0.5 GB) come on top."""
    gb = 1e9
    w = BYTES["float32" if weights == "auto" else weights]
    state = {"adamw": 2 * w, "adamw8bit": 2, "adafactor": 0.05}[optimizer]
    out = {
        "weights": w * n_params / gb, "grads": w * n_params / gb, "optimizer": state * n_params / gb,
        "reference": BYTES[weights if ref == "same" else ref] * n_params / gb,
        "kv_cache": rows * seq * layers * 2 * kv_heads * head_dim * 2 / gb,
        "logits": 2 * micro_batch * seq * vocab * 4 / gb,
    }
    base = out["weights"] + out["optimizer"] + out["reference"]
    out["peak"] = max(base + out["kv_cache"], base + out["grads"] + out["logits"])
    return out
