"""AR and Lopti on top of TRL's `GRPOTrainer` (TRL 1.16.0): `LoptiGRPOTrainer`, plus
`trl_grpo_args`, the one place that maps our configuration onto TRL's arguments.

Optional: the core package never imports it (nor TRL); requirements.txt installs TRL (for
the package: the `trl` extra).
The algorithms live in `reweight.py` (Eq. 4) and `lopti.py` (Algorithm 1); this module only
teaches TRL to run them, and `tests/test_trl_grpo.py` checks that one TRL update equals our
`grpo_update` / `lopti_update` on the same batch (`tests/test_trl_multiprocess.py`: also
split over two processes). The choices in full: docs/GPU.md.

Design choices, in order of importance:

1. AR (Eq. 4) as a per-token advantage [B, T], set after `_generate_and_score_completions`.
2. pi_old is always computed (a no-grad teacher-forced forward at the sampling temperature),
   even where TRL would skip it (num_iterations = 1), as our trainer and verl do.
3. Lopti (Algorithm 1) = TRL's `num_iterations = 2`: pass 0 the low-probability tokens
   (pi_old(o_t) < eta), pass 1 the rest; pi_old not recomputed between the stages, exactly
   the reference's `seperate_updating`.
4. The token-mean denominator counts ALL response tokens in both stages (reference,
   `denominator="all"`): a stage's token mask goes in as TRL's `tool_mask`.
5. Group advantages (r - mean) / (std + 1e-6), equal groups exactly 0, recomputed from TRL's
   rewards (`paper_advantages=True`); TRL 1.16 uses std + 1e-4.
6. The dual clip c = 10 (verl `clip_ratio_c`) is TRL's `delta`: `delta = clip_c`.
6b. The KL term is k3(pi_theta, pi_ref) alone, as in the reference: TRL's
   `use_bias_correction_kl` (k3 * rho_t) is turned off.
7. What TRL cannot express (small): KL and log-ratio clamps, the normalizer with several
   optimizer steps per stage, an empty Lopti stage's step, position ids of padded prompts.
8. One table, `trl_grpo_args(cfg)` with `TRL_MAPPING` and `NOT_IN_TRL`; the trainer is
   configured by the same TrainConfig (``LoptiGRPOTrainer(..., cfg=cfg)``: its method,
   alpha, eta and Lopti order), and checks that its TRL args were made from it.
9. Beyond the paper (token_fixes.py): TRL has two of the later methods, and the mapping
   uses them: entropy_top = `top_entropy_quantile`, cispo = `loss_type="cispo"` with
   `epsilon_high` = 1 + cispo_eps_high (TRL clips the weight at epsilon_high itself, with
   no lower bound). Clip-Cov and KL-Cov are not in TRL 1.16. Where TRL's definitions
   differ from ours (the entropy selection's scope): NOT_IN_TRL, docs/GPU.md.
10. A non-finite number never updates or saves the weights (precision.py, choice 7, as our
   trainer's on_nonfinite "stop"): the rewards, advantages and log pi_old of a generation
   batch, each micro-step's loss and each optimizer step's gradient norm are checked, and
   the first that is not finite raises NonFiniteError before the optimizer steps on it;
   `save_model` (final folder and checkpoints alike) refuses non-finite weights. HF's
   Trainer on its own only filters a NaN loss out of its logs and steps on. "skip" is
   refused: the Trainer's loop has no hook that leaves out one optimizer step.
"""
from __future__ import annotations

import torch
from trl.trainer.grpo_trainer import disable_gradient_checkpointing
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer

from . import precision
from .config import PAPER_METHODS, TrainConfig
from .grpo import group_advantages, token_advantages
from .lopti import split_by_probability
from .reweight import reweight_advantages

# ------------------------------------------------------------------------------ mapping


def _cispo_args(cfg: TrainConfig) -> dict:
    if cfg.cispo_eps_low < 1.0:
        raise ValueError("TRL's cispo has no lower bound on the IS weight: cispo_eps_low must be 1")
    return dict(loss_type="cispo", epsilon_high=1.0 + cfg.cispo_eps_high)


# The later methods TRL 1.16 has, as its arguments (design choice 9); Clip-Cov and KL-Cov it has not.
TRL_TOKEN_FIXES = {"entropy_top": lambda cfg: dict(top_entropy_quantile=cfg.entropy_top_quantile),
                   "cispo": _cispo_args}
TRL_METHODS = PAPER_METHODS + tuple(TRL_TOKEN_FIXES)

# (our TrainConfig field, TRL GRPOConfig argument, the rule). `trl_grpo_args` implements it.
TRL_MAPPING = (
    ("group_size", "num_generations", "G responses per prompt"),
    ("temperature", "temperature", "sampling temperature; TRL also divides the training logits by it (fused LM head)"),
    ("top_p, top_k", "top_p, top_k", "1.0 and 0: no filtering (the reference)"),
    ("max_new_tokens", "max_completion_length", "response budget"),
    ("(keep truncated)", "mask_truncated_completions=False", "a truncated response is trained on, as ours"),
    ("lr x lr_scale", "learning_rate", "constant schedule, no warm-up (lr_scheduler_type='constant', warmup_steps=0)"),
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
    ("method entropy_top, entropy_top_quantile", "top_entropy_quantile", "80/20: the policy term on the top-rho tokens by entropy (choice 9)"),
    ("method cispo, cispo_eps_high", "loss_type='cispo', epsilon_high=1 + cispo_eps_high", "TRL clips the IS weight at epsilon_high, an absolute bound (choice 9)"),
    ("autocast_bf16", "bf16", "bf16 autocast around the forward passes, float32 weights"),
    ("gradient_checkpointing", "gradient_checkpointing", ""),
    ("seed", "seed", "the random streams differ from ours (sampler, prompt order)"),
    ("device='cpu' (or 'auto' without CUDA)", "use_cpu=True", "as plumbing.resolve_device"),
)

# Our settings with no TRL argument, and what the subclass does about each.
NOT_IN_TRL = {
    "alpha": "AR strength (Eq. 4): LoptiGRPOTrainer(cfg=...) reads cfg.alpha",
    "eta": "Lopti threshold (Algorithm 1): LoptiGRPOTrainer(cfg=...) reads cfg.eta",
    "lopti_order": "LoptiGRPOTrainer(cfg=...) reads cfg.lopti_order",
    "lopti_split='random'": "not mapped (a control of the study, not the method): refused",
    "lopti_optimizer='per_stage'": "TRL's Trainer steps one optimizer (and its scheduler) in every "
                                   "pass: the reference's shared state only; refused",
    "dynamic_sampling > 0": "TRL 1.16's GRPOTrainer trains on every group it generates (no DAPO "
                            "filter_groups): refused",
    "on_nonfinite='skip'": "the subclass stops on a non-finite value and never saves non-finite "
                           "weights (choice 10); skipping one optimizer step: refused",
    "recompute_old_logprobs": "always on in the subclass (pi_old by a teacher-forced forward)",
    "adv_eps = 1e-6, equal groups -> 0": "LoptiGRPOTrainer(paper_advantages=True)",
    "loss_agg_mode='seq-mean-token-mean'": "not mapped (TRL's 'dapo' is the token-mean)",
    "k3 clamp [-10, 10], its log-ratio clamp [-5, 5] (kl_log_ratio_clamp), the ratio's [-20, 20]":
        "not expressible without copying _compute_loss",
    "estimator='reinforce_pp'": "not mapped (GRPO advantages only)",
    "grad_accum='verl'": "not mapped (TRL's 'bnpo' is a per-micro-batch mean but divides by the "
                         "accumulation steps, not the reference's micro-batch count per GPU)",
    "max_prompt_len": "TRL 1.16 has no prompt cap: filter the prompt set beforehand",
    "optimizer='adamw8bit' / 'adafactor', dtype, ref_dtype": "not mapped: pass optim=... / model_init_kwargs yourself",
    "method='clip_cov' / 'kl_cov'": "not in TRL 1.16 (verl has them: policy_loss.loss_mode)",
    "cispo_eps_low < 1 (a floor under the IS weight)": "TRL's cispo has no lower bound: refused",
    "entropy_top: the quantile over the whole rollout batch, entropies at pi_old":
        "TRL takes it per micro-batch (gathered over processes), from pi_theta at that micro-step: "
        "equal in the first optimizer step when it is one micro-batch per process (tested); "
        "otherwise the thresholds differ (tests/test_trl_grpo.py shows it for two micro-batches)",
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
    _check_mappable(cfg)
    args = dict(
        output_dir=output_dir,
        # sampling
        num_generations=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p,
        top_k=cfg.top_k, max_completion_length=cfg.max_new_tokens,
        mask_truncated_completions=False,
        # optimisation
        learning_rate=cfg.optimizer_lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_betas[0], adam_beta2=cfg.adam_betas[1],
        optim="adamw_torch",
        max_grad_norm=cfg.grad_clip,
        # the objective (paper Eq. 1 with the reference's settings)
        epsilon=cfg.eps_low, delta=cfg.clip_c, beta=cfg.kl_coef,
        scale_rewards="group", importance_sampling_level="token",
        use_bias_correction_kl=False,       # TRL 1.16 defaults to True: k3 * rho (choice 6b)
        multi_objective_aggregation="sum_then_normalize",
        **method_args(cfg), **_batch_args(cfg, num_processes),
        # numerics, hardware
        bf16=bool(cfg.autocast_bf16), fp16=False,
        gradient_checkpointing=bool(cfg.gradient_checkpointing), seed=cfg.seed,
        use_cpu=(cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())),
        model_init_kwargs={"dtype": "float32"},
    )
    args.update(overrides)
    return args


def method_args(cfg: TrainConfig) -> dict:
    """The TRL arguments that depend on the method: Lopti's two passes (choice 3), the loss
    and the clip, and the later methods TRL has (choice 9; "cispo" normalises like "dapo")."""
    args = dict(loss_type="dapo", epsilon_high=cfg.eps_high, top_entropy_quantile=1.0,
                num_iterations=2 if cfg.uses_lopti else cfg.ppo_epochs)
    return {**args, **(TRL_TOKEN_FIXES[cfg.method](cfg) if cfg.method in TRL_TOKEN_FIXES else {})}


def _check_mappable(cfg: TrainConfig) -> None:
    """ValueError for a setting TRL cannot run as we do (NOT_IN_TRL)."""
    if cfg.estimator != "grpo":
        raise ValueError("only the GRPO advantage estimator is mapped onto TRL")
    if cfg.method not in TRL_METHODS:
        raise ValueError(f"method {cfg.method!r} is not in TRL 1.16 (NOT_IN_TRL)")
    if cfg.grad_accum != "global" or cfg.loss_agg_mode != "token-mean":
        raise ValueError("only grad_accum='global' with the token-mean (TRL loss_type='dapo') is "
                         "mapped onto TRL")
    if cfg.uses_lopti and cfg.ppo_epochs != 1:
        raise ValueError("Lopti on TRL uses num_iterations=2 for its two stages: ppo_epochs must be 1")
    if cfg.uses_lopti and cfg.lopti_split != "probability":
        raise ValueError("only Lopti's probability split (Algorithm 1) is mapped onto TRL")
    _check_one_optimizer(cfg)
    _check_no_dynamic_sampling(cfg)
    _check_stop_on_nonfinite(cfg)
    if not cfg.clip_c > 1.0 + cfg.eps_high:
        raise ValueError("TRL's delta equals the dual clip only if clip_c > 1 + eps_high")


def _check_one_optimizer(cfg: TrainConfig) -> None:
    """ValueError for Lopti with one optimizer per stage (lopti.py, choice 8): TRL's Trainer
    owns one optimizer, which every pass steps, as the reference's shared state does."""
    if cfg.uses_lopti and cfg.lopti_optimizer != "shared":
        raise ValueError("lopti_optimizer='per_stage' is not supported on TRL (its Trainer steps one "
                         "optimizer in both Lopti passes): use lopti_optimizer='shared', or our trainer")


def _check_no_dynamic_sampling(cfg: TrainConfig) -> None:
    """ValueError for DAPO's dynamic sampling (dynamic_sampling.py): TRL's GRPOTrainer trains
    on every group it generates, and refilling its generation batch is not one of its hooks."""
    if cfg.dynamic_sampling:
        raise ValueError("dynamic_sampling is not supported on TRL (its GRPOTrainer trains on every "
                         "generated group): use dynamic_sampling=0, or our trainer")


def _check_stop_on_nonfinite(cfg: TrainConfig) -> None:
    """ValueError for on_nonfinite "skip" (choice 10): HF's Trainer clips and steps in one
    loop body, with no hook that leaves one optimizer step out."""
    if cfg.on_nonfinite != "stop":
        raise ValueError("on_nonfinite='skip' is not supported on TRL (its Trainer cannot leave out "
                         "one optimizer step): use on_nonfinite='stop', or our trainer")


def _batch_args(cfg: TrainConfig, num_processes: int) -> dict:
    """TRL's per-device batching for our global sizes: one optimizer step per mini-batch,
    per pass."""
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
    return dict(per_device_train_batch_size=micro, gradient_accumulation_steps=mini // micro,
                steps_per_generation=rows // micro)


def make_trl_config(cfg: TrainConfig, output_dir: str, num_processes: int = 1, **overrides) -> TRLGRPOConfig:
    """TRL's GRPOConfig for our `cfg` (see `trl_grpo_args`)."""
    return TRLGRPOConfig(**trl_grpo_args(cfg, output_dir, num_processes, **overrides))


# ------------------------------------------------------------------------------ trainer


class LoptiGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with Advantage Reweighting (Eq. 4) and Lopti (Algorithm 1).

    cfg          our TrainConfig: its method, alpha, eta (None where the method does not use
                 them) and Lopti order; build ``args`` from it with `make_trl_config(cfg, ...)`.
    paper_advantages  recompute A = (r - mean) / (std + 1e-6), equal groups 0 (choice 5).

    Every other argument is GRPOTrainer's.
    """

    def __init__(self, *args, cfg: TrainConfig, paper_advantages: bool = True, **kwargs):
        if cfg.method not in TRL_METHODS:
            raise ValueError(f"method {cfg.method!r} is not in TRL 1.16: choose one of {', '.join(TRL_METHODS)}")
        _check_one_optimizer(cfg)
        _check_no_dynamic_sampling(cfg)
        _check_stop_on_nonfinite(cfg)
        self.cfg = cfg
        self.uses_ar, self.uses_lopti = cfg.uses_ar, cfg.uses_lopti
        self.alpha, self.eta, self.lopti_order = cfg.alpha, cfg.eta, cfg.lopti_order
        self.paper_advantages = paper_advantages
        self._last_rewards_per_func = None
        super().__init__(*args, **kwargs)
        a = self.args
        wrong = {k: getattr(a, k) for k, v in method_args(cfg).items() if getattr(a, k) != v}
        if wrong:
            raise ValueError(f"args {wrong} do not match method {cfg.method!r}: build them with "
                             "make_trl_config(cfg, ...)")
        if paper_advantages and (a.scale_rewards != "group"
                                 or a.multi_objective_aggregation != "sum_then_normalize"):
            raise ValueError("paper_advantages needs scale_rewards='group' and "
                             "multi_objective_aggregation='sum_then_normalize'")
        if a.loss_type != "cispo" and a.delta is not None and not a.delta > 1.0 + self.epsilon_high:
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
        adv, r = out["advantages"], None
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
            # [B] -> [B, T], 0 on padding (and on tool tokens), as our trainer's
            adv = reweight_advantages(token_advantages(adv, mask), out["old_per_token_logps"], self.alpha)
        self._stop_if_nonfinite({"reward": r, "advantage": adv,
                                 "log pi_old": out["old_per_token_logps"][mask.bool()]})
        out["advantages"] = adv
        return out

    # ------------------------------------------------------- non-finite values (choice 10)

    def _stop_if_nonfinite(self, values: dict) -> None:
        """precision.finite_values under on_nonfinite "stop": NonFiniteError, one line that
        says at which TRL optimizer step the run stopped, before that step's update."""
        try:
            precision.finite_values(values, self.cfg)
        except precision.NonFiniteError as e:
            e.resume = (f"the run stopped before TRL's optimizer step {self.state.global_step + 1}; "
                        "nothing of it was saved")
            raise

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's micro-step (forward and backward), then its loss checked (choice 10)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._stop_if_nonfinite({"loss": loss})
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's gradient norm (after clipping, before ``optimizer.step()``), checked:
        a NaN loss can leave the gradient finite and the reverse (choice 10)."""
        grad_norm = super()._get_grad_norm(model, grad_norm)
        self._stop_if_nonfinite({"gradient norm": torch.as_tensor(grad_norm, dtype=torch.float32)})
        return grad_norm

    def save_model(self, output_dir=None, _internal_call=False):
        """The Trainer's save (final folder and checkpoints), refused for non-finite weights,
        as runs.save_hf_atomic refuses them in our trainer (choice 10)."""
        bad = precision.nonfinite_weights(self.model)
        if bad:
            raise precision.NonFiniteError("policy's weights", bad, action=f"nothing was saved to {output_dir}")
        return super().save_model(output_dir, _internal_call)

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
