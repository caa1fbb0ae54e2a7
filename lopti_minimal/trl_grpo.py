"""AR and Lopti on top of TRL's `GRPOTrainer` (TRL 1.16.0): `LoptiGRPOTrainer`, plus
`trl_grpo_args`, the one place that maps our configuration onto TRL's arguments.

Paper: Yang et al. 2025, "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs"
(arXiv 2505.12929). Notation: pi_theta the policy being trained, pi_old the policy that
sampled the batch, o_t the t-th response token, A the GRPO advantage of a response,
rho_t = pi_theta(o_t) / pi_old(o_t), alpha the AR strength (Eq. 4), eta the Lopti threshold
(Algorithm 1). The algorithms themselves live in `reweight.py` (Eq. 4) and `lopti.py`
(Algorithm 1); this module only teaches TRL to run them, and `tests/test_trl_grpo.py` checks
that one TRL update equals our `grpo_update` / `lopti_update` on the same batch.

This module is optional: the core package never imports it (nor TRL). Install TRL with
`pip install -r requirements-trl.txt`.

Design choices, in order of importance:

1. AR (paper Eq. 4) is a per-token advantage. After TRL has generated and scored a
   generation batch (`_generate_and_score_completions`), its advantage [B] becomes
   [B, T]:  A_hat_t = (alpha * pi_old(o_t) + 1 - alpha) * A, with our own
   `reweight.reweight_advantages`. TRL's `_compute_loss` accepts [B, T] advantages as
   they are (it only unsqueezes a [B] tensor).

2. pi_old is always computed, even where TRL would skip it. With one optimizer step per
   generation (num_iterations = 1) TRL does not compute old log-probs at all and uses the
   detached current ones (ratio 1). AR needs pi_old(o_t) before the update and Lopti needs
   it to split the tokens, so the subclass computes log pi_old by a no-grad teacher-forced
   forward of the policy that sampled (TRL's own `_get_per_token_logps_and_entropies`, at
   the sampling temperature) and stores it as `old_per_token_logps`, so the ratio rho_t of
   every stage is relative to it. This is also what our trainer does by default
   (`TrainConfig.recompute_old_logprobs=True`) and what verl does.

3. Lopti (paper Algorithm 1) is two optimizer steps on one generation batch, mapped onto
   TRL's `num_iterations = 2`: TRL buffers the generation batch, with its
   `old_per_token_logps`, and replays it for a second optimizer step on the parameters the
   first step produced. The buffer is never re-scored, so pi_old is NOT recomputed between
   the stages -- exactly the reference, whose `seperate_updating` reruns the actor update
   on the same batch (github.com/zhyang2226/AR-Lopti, verl/trainer/ppo/ray_trainer.py).
   The pass index, `(self._step % (steps_per_generation * num_iterations)) //
   steps_per_generation`, says which stage a micro-batch belongs to: pass 0 trains on the
   low-probability tokens (pi_old(o_t) < eta, `lopti.split_by_probability`), pass 1 on
   the rest; `lopti_order="high_first"` swaps them (the paper's ablation).

4. The token-mean denominator counts ALL response tokens in both stages, as in the
   reference (it zeroes the other stage's advantages and masks its KL term but keeps the
   response mask in the denominator) and in our `grpo_update(denominator="all")`. In TRL
   with loss_type="dapo" the numerator is `(per_token_loss * mask).sum()` with
   mask = completion_mask * tool_mask, and the denominator is `num_items_in_batch`, the
   token count of the whole generation batch, fixed when the batch was scored. So a stage
   is selected by passing its token mask as `tool_mask` to TRL's `_compute_loss` (on a
   copy of the inputs): it removes the other stage's tokens from the numerator (policy
   term and KL term alike) and leaves the denominator alone.

5. Group advantages as in the paper and our `grpo.group_advantages`:
   (r - mean) / (std + 1e-6), unbiased std, a group of equal rewards exactly 0.
   TRL 1.16 divides by (std + 1e-4) and leaves a rounding residue on equal groups, so with
   `paper_advantages=True` (default) the subclass recomputes the advantages from the
   rewards TRL computed (captured in `_calculate_rewards`). Needs scale_rewards="group"
   and multi_objective_aggregation="sum_then_normalize" (checked).

6. The dual clip c = 10 (verl `clip_ratio_c`) IS expressible: TRL's `delta` ("two-sided
   GRPO clipping", INTELLECT-2) caps the unclipped ratio before the min,
       L_t = -min(min(rho, delta) * A, clip(rho, 1 - eps_low, 1 + eps_high) * A).
   For A < 0 this is -A * min(max(rho, clip(rho)), delta) = min(L_clip, -A * delta), the
   dual clip with c = delta; for A > 0 the cap never binds because
   clip(rho) <= 1 + eps_high < delta. Values and gradients are the same as the dual clip
   whenever 1 + eps_high < c (checked). So `delta = clip_c`.

6b. The KL term is k3(pi_theta, pi_ref) alone, as in the reference (verl `kl_penalty`,
   "low_var_kl", added to the loss with `kl_loss_coef`). TRL 1.16 multiplies it by the
   ratio rho_t by default (`use_bias_correction_kl=True`); the mapping turns that off. The
   two agree when rho = 1 (the first pass of a fresh batch) and differ afterwards, e.g. in
   Lopti's second stage -- tests/test_trl_grpo.py found it on ratios far from 1.

7. What TRL cannot express (a real difference, small): our k3 KL is clamped to [-10, 10]
   and both log-ratios to [-20, 20] (verl `kl_penalty`); TRL's are not clamped. They
   differ only on a token with |log pi_ref - log pi_theta| > ~2.6 or a ratio > e^20.
   Several optimizer steps per stage (a generation batch larger than `mini_batch_size`):
   TRL's "dapo" normalizer divides every step by the generation batch's tokens /
   n_steps, ours by each mini-batch's own count; with one optimizer step per stage (the
   default here, P x G <= 256) they are the same. An empty Lopti stage: TRL still makes
   the optimizer step (on a zero gradient, as the reference does), ours skips it
   (lopti.py). Prompts of unequal length: TRL left-pads them and its training forward
   passes no position ids (the positions count the padding), ours derives the positions
   from the attention mask. Rotary models (Llama, Qwen) attend by position differences
   only, so this moves nothing but rounding; the parity test uses unpadded prompts.

8. One table, `trl_grpo_args(cfg)`, maps every relevant `TrainConfig` field onto a TRL
   `GRPOConfig` argument and `TRL_MAPPING` says why; `NOT_IN_TRL` lists the rest.
"""
from __future__ import annotations

import torch
from trl.trainer.grpo_trainer import disable_gradient_checkpointing
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer

from .grpo import group_advantages
from .lopti import split_by_probability
from .reweight import reweight_advantages
from .config import METHODS, TrainConfig, paper_settings

# ------------------------------------------------------------------------------ mapping

# (our TrainConfig field, TRL GRPOConfig argument, the rule). `trl_grpo_args` implements it.
TRL_MAPPING = (
    ("group_size", "num_generations", "G responses per prompt"),
    ("temperature", "temperature", "sampling temperature; TRL also divides the training logits by it (fused LM head)"),
    ("top_p, top_k", "top_p, top_k", "1.0 and 0: no filtering (the reference)"),
    ("max_new_tokens", "max_completion_length", "response budget"),
    ("(keep truncated)", "mask_truncated_completions=False", "a truncated response is trained on, as ours"),
    ("lr", "learning_rate", "constant schedule, no warm-up (lr_scheduler_type='constant', warmup_steps=0)"),
    ("weight_decay", "weight_decay", "AdamW (optim='adamw_torch'), betas 0.9 / 0.999"),
    ("grad_clip", "max_grad_norm", "global grad-norm clip per optimizer step"),
    ("eps_low", "epsilon", "lower clip: rho >= 1 - eps_low"),
    ("eps_high", "epsilon_high", "upper clip ('clip-higher'): rho <= 1 + eps_high"),
    ("clip_c", "delta", "dual clip for A < 0: TRL caps the unclipped ratio at delta (design choice 6)"),
    ("kl_coef", "beta", "k3 KL to the frozen initial policy; TRL's k3 is not clamped (choice 7)"),
    ("(plain k3)", "use_bias_correction_kl=False", "TRL 1.16's default True multiplies k3 by rho; the reference's KL loss is k3 alone"),
    ("grad_accum='global', token-mean", "loss_type='dapo'", "sum over the step's tokens / their count"),
    ("(group advantage)", "scale_rewards='group'", "divide by the group std; eps and equal groups fixed by the subclass (choice 5)"),
    ("(token ratio)", "importance_sampling_level='token'", "rho per token, as Eq. 1"),
    ("micro_batch_size", "per_device_train_batch_size", "responses per forward/backward"),
    ("prompts_per_step x G", "gradient_accumulation_steps x per_device_train_batch_size x processes", "one optimizer step per generation batch (per stage); our sizes are global, TRL's per device"),
    ("mini_batch_size", "steps_per_generation", "optimizer steps per pass = ceil(P x G / mini_batch_size) (choice 7)"),
    ("method lopti / ar_lopti", "num_iterations=2", "Algorithm 1: two passes, stage = pass (choice 3)"),
    ("ppo_epochs", "num_iterations", "GRPO / AR: passes over each generation batch; Lopti needs ppo_epochs = 1"),
    ("autocast_bf16", "bf16", "bf16 autocast around the forward passes, float32 weights"),
    ("gradient_checkpointing", "gradient_checkpointing", ""),
    ("seed", "seed", "the random streams differ from ours (sampler, prompt order)"),
    ("device='cpu'", "use_cpu=True", ""),
)

# Our settings with no TRL argument, and what the subclass does about each.
NOT_IN_TRL = {
    "alpha": "AR strength (Eq. 4): LoptiGRPOTrainer(alpha=...)",
    "eta": "Lopti threshold (Algorithm 1): LoptiGRPOTrainer(eta=...)",
    "lopti_order": "LoptiGRPOTrainer(lopti_order=...)",
    "recompute_old_logprobs": "always on in the subclass (pi_old by a teacher-forced forward)",
    "adv_eps = 1e-6, equal groups -> 0": "LoptiGRPOTrainer(paper_advantages=True)",
    "k3 clamp [-10, 10], log-ratio clamp [-20, 20]": "not expressible without copying _compute_loss",
    "estimator='reinforce_pp'": "not mapped (GRPO advantages only)",
    "grad_accum='verl'": "not mapped (TRL's 'bnpo' is a per-micro-batch mean but divides by the "
                         "accumulation steps, not the reference's micro-batch count per GPU)",
    "max_prompt_len": "TRL 1.16 has no prompt cap: filter the prompt set beforehand",
    "optimizer='adamw8bit' / 'adafactor', dtype, ref_dtype": "not mapped: pass optim=... / model_init_kwargs yourself",
}


def trl_grpo_args(cfg: TrainConfig, output_dir: str, num_processes: int = 1, **overrides) -> dict:
    """Keyword arguments for TRL's `GRPOConfig` equivalent to our `cfg` (TRL_MAPPING).

    num_processes: the data-parallel processes (GPUs) of `accelerate launch`. Our batch
    sizes are global (P x G responses per step, `mini_batch_size` per optimizer step), TRL's
    per device, so each process gets 1 / num_processes of the rows; the "dapo" normalizer
    divides the gathered token count by num_processes and DDP / DeepSpeed average the
    gradients, so the loss stays the token-mean over the whole step.
    `overrides` win (e.g. max_steps, logging, report_to). Raises ValueError where a
    setting has no exact TRL equivalent that matters for the method (see NOT_IN_TRL).
    """
    if cfg.estimator != "grpo":
        raise ValueError("only the GRPO advantage estimator is mapped onto TRL")
    if cfg.grad_accum != "global":
        raise ValueError("only grad_accum='global' (TRL loss_type='dapo') is mapped onto TRL")
    if cfg.uses_lopti and cfg.ppo_epochs != 1:
        raise ValueError("Lopti on TRL uses num_iterations=2 for its two stages: ppo_epochs must be 1")
    if not cfg.clip_c > 1.0 + cfg.eps_high:
        raise ValueError("TRL's delta equals the dual clip only if clip_c > 1 + eps_high")
    n_rows = cfg.prompts_per_step * cfg.group_size
    mini = min(cfg.mini_batch_size, n_rows)
    if n_rows % mini or mini % num_processes:
        raise ValueError(f"P x G = {n_rows} must be a multiple of the mini-batch {mini}, itself a "
                         f"multiple of the {num_processes} processes")
    rows, mini = n_rows // num_processes, mini // num_processes       # per process
    micro = min(cfg.micro_batch_size, mini)
    if mini % micro:
        raise ValueError(f"the per-process mini-batch {mini} must be a multiple of the micro-batch "
                         f"{micro} (TRL splits whole per-device batches)")
    args = dict(
        output_dir=output_dir,
        # sampling
        num_generations=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p,
        top_k=cfg.top_k, max_completion_length=cfg.max_new_tokens,
        mask_truncated_completions=False,
        # optimisation
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=cfg.weight_decay, adam_beta1=0.9, adam_beta2=0.999, optim="adamw_torch",
        max_grad_norm=cfg.grad_clip,
        # the objective (paper Eq. 1 with the reference's settings)
        epsilon=cfg.eps_low, epsilon_high=cfg.eps_high, delta=cfg.clip_c, beta=cfg.kl_coef,
        loss_type="dapo", scale_rewards="group", importance_sampling_level="token",
        use_bias_correction_kl=False,       # TRL 1.16 defaults to True: k3 * rho (choice 6b)
        multi_objective_aggregation="sum_then_normalize",
        # batching: one optimizer step per mini-batch, per pass
        per_device_train_batch_size=micro, gradient_accumulation_steps=mini // micro,
        steps_per_generation=rows // micro,
        num_iterations=2 if cfg.uses_lopti else cfg.ppo_epochs,
        # numerics, hardware
        bf16=bool(cfg.autocast_bf16), fp16=False,
        gradient_checkpointing=bool(cfg.gradient_checkpointing), seed=cfg.seed,
        use_cpu=(cfg.device == "cpu"), model_init_kwargs={"dtype": "float32"},
    )
    args.update(overrides)
    return args


def make_trl_config(cfg: TrainConfig, output_dir: str, num_processes: int = 1, **overrides) -> TRLGRPOConfig:
    """TRL's GRPOConfig for our `cfg` (see `trl_grpo_args`)."""
    return TRLGRPOConfig(**trl_grpo_args(cfg, output_dir, num_processes, **overrides))


# ------------------------------------------------------------------------------ trainer


class LoptiGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with Advantage Reweighting (Eq. 4) and Lopti (Algorithm 1).

    method       "grpo" | "ar" | "lopti" | "ar_lopti". alpha / eta default to the paper's
                 K&K setting of the method (`trainer.paper_settings`: AR alone alpha 0.2,
                 Lopti alone eta 0.4, AR+Lopti alpha 0.3, eta 0.5).
    lopti_order  "low_first" (Algorithm 1) | "high_first" (the paper's reversed ablation).
    paper_advantages  recompute A = (r - mean) / (std + 1e-6), equal groups 0 (choice 5).

    Every other argument is GRPOTrainer's; build `args` with `make_trl_config(cfg, ...)`.
    Lopti needs args.num_iterations == 2 and loss_type "dapo" (the all-token
    denominator); other methods need no particular num_iterations.
    """

    def __init__(self, *args, method: str = "ar_lopti", alpha: float | None = None,
                 eta: float | None = None, lopti_order: str = "low_first",
                 paper_advantages: bool = True, **kwargs):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
        if lopti_order not in ("low_first", "high_first"):
            raise ValueError(f"lopti_order must be low_first or high_first, got {lopti_order!r}")
        paper = paper_settings(method)
        self.method = method
        self.alpha = paper["alpha"] if alpha is None else float(alpha)
        self.eta = paper["eta"] if eta is None else float(eta)
        self.uses_ar = method in ("ar", "ar_lopti")
        self.uses_lopti = method in ("lopti", "ar_lopti")
        self.lopti_order = lopti_order
        self.paper_advantages = paper_advantages
        self._last_rewards_per_func = None
        super().__init__(*args, **kwargs)
        a = self.args
        if self.uses_lopti and (a.num_iterations != 2 or a.loss_type != "dapo"):
            raise ValueError("Lopti needs num_iterations=2 (one pass per stage) and loss_type='dapo' "
                             "(token-mean whose denominator counts every token)")
        if paper_advantages and (a.scale_rewards != "group"
                                 or a.multi_objective_aggregation != "sum_then_normalize"):
            raise ValueError("paper_advantages needs scale_rewards='group' and "
                             "multi_objective_aggregation='sum_then_normalize'")
        if a.delta is not None and not a.delta > 1.0 + self.epsilon_high:
            raise ValueError("delta must exceed 1 + epsilon_high to act as the dual clip")
        if self.use_vllm:
            raise ValueError("LoptiGRPOTrainer is written and tested for transformers generation only")

    # -------------------------------------------------------------- rewards -> advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards [B_all, n_funcs] (gathered over processes), kept for choice 5."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's generation and scoring, then (train mode only):

        1. log pi_old(o_t) by a no-grad forward where TRL skipped it (choice 2);
        2. A = (r - mean_group) / (std_group + 1e-6), equal groups 0 (choice 5);
        3. AR, Eq. 4: A_hat_t = (alpha * pi_old(o_t) + 1 - alpha) * A, per token (choice 1).
        """
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        if "old_per_token_logps" not in out:
            input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                old, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, out["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size)
            out["old_per_token_logps"] = old
        adv = out["advantages"]
        if self.paper_advantages:
            rpf = self._last_rewards_per_func
            if torch.isnan(rpf).all(dim=1).any():
                # TRL excludes such a completion from its group's mean; the paper's formula
                # has no such case (our K&K reward scores every response).
                raise ValueError("paper_advantages: a completion got no reward from any reward function")
            r = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
            n = len(adv)
            start = self.accelerator.process_index * n        # this process's rows
            adv = group_advantages(r, self.num_generations).to(adv.device)[start:start + n]
        if self.uses_ar:
            # [B] -> [B, T]; padding keeps a finite weight but is masked out of the loss.
            adv = reweight_advantages(adv.unsqueeze(1) * mask, out["old_per_token_logps"], self.alpha)
        out["advantages"] = adv
        return out

    # ------------------------------------------------------------------------ Lopti stages

    def _lopti_pass(self) -> int:
        """Which pass over the buffered generation batch the current micro-step belongs to:
        0 for Lopti's stage 1, 1 for stage 2 (TRL's `_prepare_inputs` replays the buffer
        num_iterations times, steps_per_generation micro-steps each)."""
        spg = self.args.steps_per_generation
        return (self._step % (spg * self.num_iterations)) // spg

    def lopti_stage_mask(self, inputs, stage: int) -> torch.Tensor:
        """Algorithm 1's token split for stage 0 (first) or 1 (second): low = pi_old < eta."""
        low, high = split_by_probability(inputs["old_per_token_logps"], inputs["completion_mask"], self.eta)
        first, second = (low, high) if self.lopti_order == "low_first" else (high, low)
        return first if stage == 0 else second

    def _compute_loss(self, model, inputs):
        """TRL's loss; in a Lopti pass restricted to that stage's tokens (choices 3 and 4).

        The stage mask goes in as `tool_mask`: TRL multiplies it into the numerator's mask
        (policy term and KL alike) while the denominator `num_items_in_batch` still counts
        every response token of the generation batch.
        """
        if self.uses_lopti and self.model.training:
            stage_mask = self.lopti_stage_mask(inputs, self._lopti_pass()).to(inputs["completion_mask"].dtype)
            inputs = dict(inputs)
            if "tool_mask" in inputs:
                stage_mask = stage_mask * inputs["tool_mask"]
            inputs["tool_mask"] = stage_mask
        return super()._compute_loss(model, inputs)
