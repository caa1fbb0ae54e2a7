"""Configuration: every option of a run, declared once, and the named presets.

Design choices:

1. One config, one declaration per option. A `TrainConfig` field carries its default *and*
   its command-line help (``option(default, "help")``, cli.py: the `field(metadata={"help":
   ...})` idiom of TRL's configs); `add_options` turns the fields into `train.py`'s options
   and `overrides` reads them back. The method's functions (grpo.py, lopti.py,
   precision.build_optimizer) read the same object. Validation (`validate`) is the only
   other place an option appears, because a range ("alpha in [0, 1]") is a rule, not a
   declaration: every numeric field's range is one row of one table, `RANGES` (ranges.py), which
   `validate` reads (eval.py checks its options against the same rows); rules across
   fields stay in `validate`. A value outside its range, NaN, or an infinity where the
   number must be finite is refused in one line that names the option, the value and the
   range: nothing is accepted silently.
2. The paper's settings are one marked section of it, "The method", each field with the
   paper's equation or the reference's name and value (the reference: the authors' verl
   fork, its K&K launch scripts scripts/train_kklogic_*_4x80GB.sh, Qwen2.5-3B and 7B on 4 x
   80 GB). Every method is one row of one table, `METHODS`: what it adds to GRPO and the
   paper's K&K values (AR alone alpha 0.2, Lopti alone eta 0.4, AR+Lopti alpha 0.3 and eta
   0.5), None for a knob it does not use; the code asks the table's predicates (`uses_ar`,
   `uses_lopti`, `uses_token_fix`), never a method's name.
3. Presets are overrides of the defaults, and the defaults *are* the ``cpu-tiny`` preset
   (the embedded run: the shipped tiny warm start on a 2-core CPU). So a command-line
   option defaults to None ("not given") and the preset's value stands unless the user
   says otherwise. Every deviation of cpu-tiny from the reference is said, with the
   reason; the GPU presets keep the reference values.
4. A saved config (run.json) is written and read back by runs.py, old ones too.
5. This module imports no torch (only dataclasses and argparse), so `train.py --help` and
   argument errors are instant.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import asdict, dataclass

from . import cli, host_memory
from .cli import TrainError, option
from .ranges import INT_MAX, RANGES, Range, check_range, int_range  # noqa: F401  (the ranges, ranges.py)


@dataclass(frozen=True)
class Method:
    """What a method adds to GRPO (paper Eq. 1); None: not used."""
    label: str                    # in reports: "GRPO" + this
    alpha: float | None = None    # AR (Eq. 4): its strength in the paper's K&K runs
    eta: float | None = None      # Lopti (Algorithm 1): its threshold on pi_old, ditto
    token_fix: bool = False       # beyond the paper: a per-token policy term (token_fixes.py)


# The methods, each once: the paper's, with its K&K settings (Yang et al. 2025 and the
# reference's launch scripts), and later methods acting on the same tokens differently, each a
# per-token policy term on GRPO's advantages (token_fixes.py; their knobs are TrainConfig fields).
METHODS = {"grpo": Method(""), "ar": Method("+AR", alpha=0.2), "lopti": Method("+Lopti", eta=0.4),
           "ar_lopti": Method("+AR+Lopti", alpha=0.3, eta=0.5),
           "entropy_top": Method("+top-20% entropy", token_fix=True), "cispo": Method("+CISPO", token_fix=True),
           "clip_cov": Method("+Clip-Cov", token_fix=True), "kl_cov": Method("+KL-Cov", token_fix=True)}
PAPER_METHODS = tuple(m for m, d in METHODS.items() if not d.token_fix)
TOKEN_FIXES = tuple(m for m, d in METHODS.items() if d.token_fix)
ESTIMATORS = ("grpo", "reinforce_pp")
LOPTI_ORDERS = ("low_first", "high_first")
# Lopti's first stage: the tokens with pi_old < eta (Algorithm 1), or as many drawn at random
LOPTI_SPLITS = ("probability", "random")
# The optimizer state of Lopti's two stages: one, shared (the reference fork), or one per
# stage, so stage 2 carries nothing of stage 1's gradient (lopti.py, choice 8)
LOPTI_OPTIMIZERS = ("shared", "per_stage")
# The decode step of sampling (sampling.sample_groups, decode.py): auto = lean on a CPU
DECODERS = ("auto", "hf", "lean")
# Every method logs `low_fraction`, the share of tokens with pi_old < eta (what Lopti's first
# stage holds); a method without Lopti measures it at AR+Lopti's eta.
LOW_FRACTION_ETA = METHODS["ar_lopti"].eta
# The evaluation's response budget per size for the tiny model (train.py's evaluation,
# eval.py): above the longest phrased derivation for 3 and 4 people (~550 and ~1,100 tokens,
# a full search), the 95th percentile for 5 (~1,300); 6 and 7 people are capped to keep the
# evaluation cheap (the tiny model almost never solves them). Every extra token costs a
# decoding step of the whole batch.
EVAL_MAX_NEW_TOKENS = {3: 640, 4: 1152, 5: 1536, 6: 1536, 7: 2048}


def uses_ar(method: str) -> bool:
    """Whether ``method`` reweights its advantages (AR, paper Eq. 4)."""
    return method in METHODS and METHODS[method].alpha is not None


def uses_lopti(method: str) -> bool:
    """Whether ``method`` updates in Lopti's two stages (paper Algorithm 1)."""
    return method in METHODS and METHODS[method].eta is not None


def uses_token_fix(method: str) -> bool:
    """Whether ``method`` is a later method's per-token policy term (token_fixes.py)."""
    return method in METHODS and METHODS[method].token_fix


def paper_settings(method: str) -> dict:
    """{"alpha", "eta"} of ``method`` as in the paper's K&K runs (METHODS); None for a knob
    the method does not use."""
    m = METHODS.get(method, METHODS["grpo"])
    return {"alpha": m.alpha, "eta": m.eta}


def without_ar(method: str) -> str:
    """The paper's method that is ``method`` without AR (AR at alpha = 0 is exactly it, Eq. 4)."""
    return next(m for m in PAPER_METHODS if not uses_ar(m) and uses_lopti(m) == uses_lopti(method))


def parse_steps(text: str) -> tuple[int, ...]:
    """"5,10" -> (5, 10): RL steps, each >= 1."""
    try:
        steps = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes RL steps like 5 or 5,10, not {text!r}")
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError(f"each step must be >= 1, got {text!r}")
    return steps


def parse_sizes(text: str) -> tuple[int, ...]:
    """"3" or "3,4" -> (3,) or (3, 4): people per puzzle, each 2..8."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes people per puzzle like 3 or 3,4, not {text!r}")
    if not sizes or any(not 2 <= n <= 8 for n in sizes):
        raise argparse.ArgumentTypeError(f"each size must be 2..8, got {text!r}")
    return sizes


@dataclass
class TrainConfig:
    """Everything a run depends on. Defaults = the ``cpu-tiny`` preset."""

    # --- model and prompts
    model: str = option("checkpoints/tiny-warm", "HF folder, hub id or .gguf file")
    prompt_style: str = option("auto", "prompt format: auto (the chat template for instruct models, "
                               "compact otherwise)", choices=("auto", "qwen", "compact"))

    # ==================================================================================
    # The method: GRPO (paper Eq. 1), AR (Eq. 4), Lopti (Algorithm 1). "reference X" = the
    # reference's launch-script or verl setting of that name; every cpu-tiny deviation says why.
    # ==================================================================================
    method: str = option("ar_lopti", "grpo | ar | lopti | ar_lopti (the paper's best K&K "
                         "combination) | entropy_top | cispo | clip_cov | kl_cov (later methods, "
                         "token_fixes.py)")
    # Eq. 4, A_hat = (alpha * pi_old + 1 - alpha) * A (reference reweight_k = alpha,
    # reweight_tau = 1 - alpha); None for a method without AR
    alpha: float | None = option(None, "AR strength, paper Eq. 4, in [0, 1]; ar and ar_lopti only "
                                 "(default: the paper's, 0.2 for ar, 0.3 for ar_lopti)", type=float)
    # Algorithm 1's split pi_old < eta; None for a method without Lopti
    eta: float | None = option(None, "Lopti threshold on pi_old, in (0, 1]; lopti and ar_lopti only "
                               "(default: the paper's, 0.4 for lopti, 0.5 for ar_lopti)", type=float)
    lopti_order: str = option("low_first", "Lopti stage order: low_first (Algorithm 1) | "
                              "high_first (the reversed ablation)", choices=LOPTI_ORDERS)
    # Not in the paper: a random first stage of the same size isolates the criterion
    # pi_old < eta from the two-stage update itself (lopti.py, choice 5)
    lopti_split: str = option("probability", "Lopti's first stage: probability (pi_old < eta, "
                              "Algorithm 1) | random (as many tokens, drawn at random: the "
                              "criterion's control)", choices=LOPTI_SPLITS)
    # Not in the paper: the reference fork steps one AdamW in both stages, so stage 2's first
    # moment still holds stage 1's gradient (about 0.47 g_low + 0.53 g_high on a fresh state);
    # per_stage gives each stage's token set an AdamW of its own (lopti.py, choice 8)
    lopti_optimizer: str = option("shared", "Lopti's optimizer state: shared (one for both stages, "
                                  "the reference fork) | per_stage (one per stage: stage 2 steps on "
                                  "its own gradient only; twice the optimizer memory)",
                                  choices=LOPTI_OPTIMIZERS)
    # GRPO's group baseline (paper section 2), or REINFORCE++ = batch-whitened returns
    # (grpo.reinforce_pp_advantages): the reference offers both for every K&K script.
    estimator: str = option("grpo", "advantage estimator: grpo (group baseline) | reinforce_pp "
                            "(REINFORCE++)", choices=ESTIMATORS)
    group_size: int = option(8, "responses per prompt, G >= 2")  # reference rollout.n = 8
    adv_eps: float = option(1e-6)    # A = (r - mean) / (std + 1e-6), the reference's epsilon
    temperature: float = option(0.7, "sampling temperature (also divides the logits in "
                                "training)")                    # reference 0.7
    # Reference 1e-6 is for 3B/7B models; a ~3.4M-parameter model needs a far larger step:
    # 1e-4 selects the warm start's derivations within the default run while the k3 KL to
    # pi_ref stays small, where a step twice as large drifts away from pi_ref.
    lr: float = option(1e-4, "AdamW learning rate")
    # The optimizer's step is lr x lr_scale (`optimizer_lr`). Only the study sets the scale,
    # for its step-size control (GRPO at twice the learning rate): lr then stays the value
    # every run of a comparison shares and the factor is recorded in run.json. Elsewhere
    # change lr itself (the same computation).
    lr_scale: float = option(1.0)
    adam_betas: tuple = option((0.9, 0.999))    # verl's AdamW default betas
    weight_decay: float = option(0.01, "AdamW weight decay")    # verl's AdamW default
    grad_clip: float = option(1.0, "gradient-norm clip")       # reference actor.grad_clip
    # Eq. 1's clipped surrogate: reference clip_ratio_low / clip_ratio_high (asymmetric,
    # "clip-higher") and clip_ratio_c (the dual clip, loss <= -A * c when A < 0)
    eps_low: float = option(0.20, "PPO clip range below 1")
    eps_high: float = option(0.24, "PPO clip range above 1 (clip-higher)")
    clip_c: float = option(10.0, "dual-clip bound for negative advantages")
    # Eq. 1's KL term: reference kl_loss_coef with use_kl_loss, the k3 ("low_var_kl") estimate
    kl_coef: float = option(0.001, "k3 KL coefficient to the frozen initial policy")
    # The reference fork clamps the k3 log-ratio to [-5, 5] (its low_var_kl): a token whose
    # probability rose > e^5 above pi_ref's gets a constant KL term. Current verl: 20.
    kl_log_ratio_clamp: float = option(5.0, "clamp of log pi_ref - log pi in the k3 KL: 5 (the "
                                       "reference fork) | 20 (current verl)")
    # reference loss_agg_mode; "seq-mean-token-mean" averages per response first (grpo.agg_loss)
    loss_agg_mode: str = option("token-mean")
    # reference ppo_mini_batch_size = 256: one optimizer step per stage whenever prompts x
    # G <= 256 (grpo.py, choice 5)
    mini_batch_size: int = option(256, "responses per optimizer step")
    # The reference's per-forward micro-batch: its ppo_micro_batch_size=32 is split over 4
    # GPUs, 8 rows per forward on each (so grad_accum="verl" reproduces its per-micro-batch
    # means). Under grad_accum="global" only memory, speed and float rounding depend on it.
    # On a CPU 8 is also faster than 32: the rows sorted by length waste less padding, and
    # each temporary is small enough to be reused from the heap (docs/PERFORMANCE.md).
    micro_batch_size: int = option(8, "responses per forward/backward (memory only)")
    # "global": the exact token-mean over the mini-batch; "verl": the reference's mean of
    # per-micro-batch means (grpo.grpo_update explains it)
    grad_accum: str = option("global", "how micro-batches are averaged: global (exact) | verl",
                             choices=("global", "verl"))
    # Optimizer passes over each rollout (reference ppo_epochs = 1). 2 is the study's control
    # arm: GRPO with as many optimizer steps per rollout as Lopti makes.
    ppo_epochs: int = option(1, "optimizer passes over each rollout (reference 1)")
    # log pi_old by a teacher-forced forward after sampling, as verl does (the reference's
    # behaviour; it makes the first ratio exactly 1 under autocast); False: the log-probs
    # the sampler recorded while it sampled
    recompute_old_logprobs: bool = option(True)

    # --- beyond the paper (token_fixes.py, where each default's source is given)
    entropy_top_quantile: float = option(0.2, "entropy_top: share of the batch's tokens, by entropy, "
                                         "that train (rho, 'Beyond the 80/20 Rule', arXiv 2506.01939)")
    cispo_eps_low: float = option(1.0, "cispo: IS weight >= 1 - this (1: no lower bound, MiniMax-M1, "
                                  "arXiv 2506.13585)")
    cispo_eps_high: float = option(4.0, "cispo: IS weight <= 1 + this (4: TRL's documented bound 5)")
    clip_cov_ratio: float = option(2e-4, "clip_cov: share r of the tokens detached (Cui et al., "
                                   "arXiv 2505.22617)")
    clip_cov_low: float = option(1.0, "clip_cov: detach among tokens with covariance > this")
    clip_cov_high: float = option(5.0, "clip_cov: ... and < this")
    kl_cov_ratio: float = option(2e-3, "kl_cov: share k of the tokens, top by covariance, penalised "
                                 "(2e-3: the 7B setting)")
    kl_cov_coef: float = option(1.0, "kl_cov: coefficient of |log rho| on those tokens")

    # --- RL schedule
    seed: int = option(0, "seed of the run (prompt order, sampling)")
    # reference: 5 epochs x 4,500 / 64 ~ 350 steps; sized here to fit the 15-minute CPU
    # budget of the default run
    steps: int = option(20, "RL steps (with --resume: extend the run to this many)")
    prompts_per_step: int = option(8, "prompts per RL step")    # reference 64 (for 4 GPUs)
    # Not in the paper: DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476; verl's DAPO
    # recipe: filter_groups, max_num_gen_batches = 1 + this): a group of equal rewards has
    # advantage 0; drop such groups and refill the step from further rounds of fresh prompts
    # (dynamic_sampling.py)
    dynamic_sampling: int = option(0, "DAPO's dynamic sampling, a deviation from the paper: drop the "
                                   "groups whose rewards are all equal and sample up to N further rounds "
                                   "of prompts-per-step fresh prompts to fill the step (0 = off, the paper)")
    top_p: float = option(1.0, "nucleus sampling (1 = off)")   # reference: no filtering
    top_k: int = option(0, "top-k sampling (0 = off)")
    # Reference 4,096. Never cuts a derivation of the sizes the default trains on: the
    # longest phrased 3-person derivation, a full search that finds nothing, has ~550
    # tokens. A cut derivation scores -3, below a wrong guess (-0.5), and teaches the policy
    # to guess.
    max_new_tokens: int = option(640, "response budget of an RL rollout")
    # verl drops over-long prompts the same way; reference 400
    max_prompt_len: int = option(256, "longer RL prompts are dropped")

    # --- data: the RL prompt set (generated, official test puzzles excluded, cached)
    # Reference trains on 3..7 people; the tiny model derives right on 3 people about half
    # the time and on 5-7 almost never, and 4-person derivations (up to ~1,100 tokens) would
    # need a cap that doubles the sampling time.
    rl_sizes: tuple = option((3,), "people per generated RL puzzle, e.g. 3 or 3,4", type=parse_sizes)
    rl_per_size: int = option(900, "generated RL puzzles per size")   # reference 900
    data_seed: int = option(20250518, "generator seed of the RL set (not the warm start's)")
    cache_dir: str = option("cache", "where generated RL sets are cached")
    rl_data: str | None = option(None, "train on this K&K JSON Lines file instead of generated "
                                 "puzzles", flag="--data", type=str)

    # --- numerics and hardware (precision.py)
    device: str = option("auto", "cpu, cuda, cuda:1 ... (auto: cuda if available)")
    # The optimizer updates float32 master weights, bf16 is for compute. auto = float32
    # weights everywhere; bfloat16 weights only with an optimizer that rounds stochastically
    # (adamw8bit), else small updates round away.
    dtype: str = option("auto", "weight dtype: auto (float32) | float32 | bfloat16")
    # bf16 matmuls under autocast, on a CPU (AMX/AVX-512: far faster than float32's) and CUDA
    # alike
    autocast_bf16: bool = option(True, "bf16 autocast for compute", flag="--no-bf16")
    ref_dtype: str = option("same", "the frozen pi_ref copy: same | bfloat16 (half the memory)")
    # reference AdamW (float32 state); adamw8bit: torchao's 8-bit AdamW with bf16 stochastic
    # rounding, for bf16 weights where float32 ones do not fit; adafactor (transformers)
    optimizer: str = option("adamw", "adamw | adamw8bit | adafactor")
    # A non-finite reward, advantage, log-prob, loss or gradient norm never updates the
    # weights (precision.py, choice 7): "stop" ends the run there (exit code 3) with its last
    # checkpoint good, "skip" makes no update on it, logs it and goes on
    on_nonfinite: str = option("stop", "a non-finite reward, advantage, loss or gradient norm: stop "
                               "(the run ends; --resume continues from its last checkpoint) | skip "
                               "(no update on it; the metrics line says so; also with --resume)",
                               choices=("stop", "skip"))
    # On by default, on a CPU too: it keeps one micro-batch's activations per layer instead of
    # all of them, for one more forward in the backward; the gradients are bit for bit the
    # same (non-reentrant checkpointing, models.set_gradient_checkpointing; tested).
    gradient_checkpointing: bool = option(True, "recompute activations in the backward (less memory, "
                                          "same gradients, one more forward)",
                                          flag="--no-gradient-checkpointing")
    # The paper trains all weights (0); LoRA (lora.py, needs peft) is for GPUs too small for it.
    lora_rank: int = option(0, "train LoRA adapters of this rank instead of all weights (0 = off, "
                            "as in the paper; needs peft)")
    rollout_chunk: int = option(0, "prompts per sampling call (0 = all): bounds the KV cache on a GPU")
    # The same sampling loop either way, but for the decode step (decode.py). Samples differ
    # where the last bits of a logit decide a token.
    decoder: str = option("auto", "decode step of sampling and evaluation: auto (lean on a CPU, "
                          "else hf) | lean (decode.py: the same arithmetic in fewer ops, faster on "
                          "a CPU) | hf (transformers' forward)", choices=DECODERS)
    threads: int | None = option(None, "torch CPU threads (default: all cores)", type=int)
    # Host memory (host_memory.py). glibc keeps freed blocks below its dynamic mmap threshold
    # (up to 32 MiB) in the heap, where they fragment and the resident set grows; above a
    # fixed threshold, blocks go back to the kernel on free, but each new one is a fresh
    # mapping the kernel must fault in and zero. 4 MiB is the knee of that trade of peak
    # memory against step time (docs/PERFORMANCE.md).
    mmap_threshold_mb: int = option(host_memory.MMAP_THRESHOLD >> 20, "glibc malloc: blocks of this many MiB or more are returned "
                                    "to the kernel on free (lower: less memory, slower; "
                                    "0 = glibc's dynamic default)")

    # --- the mechanism over training (mechanism.py): per-bin rise / fall shares after every
    # update cost one no-grad forward and are always logged; each bin's share of the squared
    # gradient norm costs four backward passes, so it is measured every N steps when asked
    grad_shares_every: int = option(0, "log each probability bin's share of the squared gradient "
                                    "norm every N steps, from step 1 (0: never)")

    # --- evaluation (official 3..7-person sets; accuracy = the greedy response scores 3)
    eval_every: int = option(0, "evaluate every N steps (0: only at the end)")
    eval_sizes: tuple = option((3, 4, 5, 6, 7), "official sizes to evaluate, e.g. 3,4",
                               type=parse_sizes)
    eval_per_size: int = option(100, "puzzles per size (the official sets have 100)")
    eval_max_new_tokens: dict = option(factory=lambda: dict(EVAL_MAX_NEW_TOKENS))
    # Memory only (the KV cache of one batch): 50 bounds the default run's evaluation peak
    # (docs/PERFORMANCE.md); the GPU presets take 100 or less.
    eval_batch_size: int = option(50, "puzzles per generate call in the evaluation")
    final_eval: bool = option(True, "skip the final evaluation", flag="--no-eval")
    eval_before: bool = option(False, "also evaluate the initial policy (eval_before.json)")
    # Accuracy at fixed budgets along the run, on puzzles outside the official sets (the
    # study's data/heldout3.jsonl): greedy, with the final evaluation's numerics and budget,
    # into RUN_DIR/eval_heldout_step<N>.json. It changes no number of the run (tested).
    heldout_data: str | None = option(None, "a K&K JSON Lines file to evaluate on after the steps "
                                      "--heldout-steps", type=str)
    heldout_steps: tuple = option((), "steps after which to evaluate --heldout-data, e.g. 5,10",
                                  type=parse_steps)

    # --- output
    run_dir: str | None = option(None, "where to write the run (default "
                                 "runs/<time>-<preset>-<method>-s<seed>)", type=str)
    save_every: int = option(10, "checkpoint every N steps (a crash loses at most N steps)")
    # 0 keeps every one, e.g. to evaluate the policy along the run
    keep_checkpoints: int = option(2, "periodic checkpoints kept (0 keeps all)")
    preset: str = option("cpu-tiny")     # set by make_config (train.py --preset)
    progress: bool = option(True, "no tqdm bars", flag="--no-progress")
    plots: bool = option(True, "no plots", flag="--no-plots")
    tensorboard: bool = option(False, "also log to TensorBoard (if installed)")

    # ----------------------------------------------------------------------------------
    def __post_init__(self):
        """A knob the method uses defaults to the paper's value; one it does not use is
        None (a GRPO run records no alpha or eta)."""
        paper = paper_settings(self.method)
        self.alpha = (paper["alpha"] if self.alpha is None else self.alpha) if self.uses_ar else None
        self.eta = (paper["eta"] if self.eta is None else self.eta) if self.uses_lopti else None

    @property
    def uses_ar(self) -> bool:
        return uses_ar(self.method)

    @property
    def uses_lopti(self) -> bool:
        return uses_lopti(self.method)

    @property
    def uses_token_fix(self) -> bool:
        return uses_token_fix(self.method)

    @property
    def optimizer_lr(self) -> float:
        """The learning rate the optimizer steps with: lr x lr_scale."""
        return self.lr * self.lr_scale

    @property
    def low_eta(self) -> float:
        """The threshold of the logged `low_fraction`: eta, or LOW_FRACTION_ETA without Lopti."""
        return self.eta if self.uses_lopti else LOW_FRACTION_ETA


def add_options(parser: argparse.ArgumentParser) -> None:
    """train.py's run options: one per TrainConfig field that has help (cli.add_options)."""
    cli.add_options(parser, TrainConfig, shown="cpu-tiny")


def overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields given on the command line (None = not given)."""
    return cli.given(args, TrainConfig)


# =======================================================================================
# Presets: overrides of the defaults above (the cpu-tiny preset is the defaults)
# =======================================================================================

_REF = dict(lr=1e-6, temperature=0.7, group_size=8, prompts_per_step=64, max_new_tokens=4096,
            max_prompt_len=400, rl_sizes=(3, 4, 5, 6, 7), gradient_checkpointing=True,
            eval_every=10, eval_max_new_tokens={n: 4096 for n in range(3, 8)}, eval_batch_size=100,
            steps=350, save_every=20,
            # precision.py: float32 master weights under AdamW, bf16 compute (autocast), a
            # bf16 pi_ref; a CUDA GPU (refused with a one-line error where there is none).
            device="cuda", dtype="float32", autocast_bf16=True, ref_dtype="bfloat16")
PRESETS: dict[str, dict] = {
    "cpu-tiny": {},
    # The smallest thing that runs every part: tests and CI (< 60 s on 2 cores).
    "ci": dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=48, rl_per_size=20,
               eval_sizes=(3,), eval_per_size=4, eval_max_new_tokens={3: 48},
               save_every=1, eval_every=0, plots=True, lr=1e-4),
    # SmolLM2-135M-Instruct on a CPU (python scripts/fetch_smollm2.py): its chat template,
    # its 49k vocabulary; a pretrained 135M model takes a smaller step than the tiny one.
    "smollm2-cpu": dict(model="models/smollm2-135m-instruct", lr=1e-5, prompts_per_step=4,
                        group_size=4, max_new_tokens=384, max_prompt_len=512, steps=20,
                        rl_sizes=(3,), micro_batch_size=8, eval_sizes=(3,), eval_per_size=50,
                        eval_max_new_tokens={3: 512}, eval_batch_size=50),
    # The same model from its supervised LoRA warm start (experiments/lm_warmstart.py, the
    # compact trace, 250 + 146 steps; the adapter merged on load): RL trains fresh rank-8
    # adapters on top. Groups of 8, four prompts a step, lr 5e-5, 10 steps (about an hour on
    # 2 CPU cores): measured from the 250-step start before the autocast fix, lr 2e-4 with 2
    # prompts a step lost 7 points of held-out accuracy in 10 steps, this setting 3.7; from
    # this start it moved +0.3 and +0.5 (two seeds; docs/HISTORY.md).
    "smollm2-kk": dict(model="checkpoints/smollm2-kk-sft-compact-396", lora_rank=8, lr=5e-5, prompts_per_step=4,
                       group_size=8, max_new_tokens=384, max_prompt_len=512, steps=10,
                       rl_sizes=(3,), micro_batch_size=8, eval_sizes=(3,), eval_per_size=100,
                       eval_max_new_tokens={3: 512}, eval_batch_size=50),
    # One GPU, gradient checkpointing, the reference hyperparameters (GPU_MEMORY_GB: the
    # GPU each is sized for). What bounds memory (gpu_memory.memory_estimate_gb, docs/GPU.md table):
    # the KV cache of a rollout (64 x 8 responses of 4.5k tokens at once would need 40-85 GB,
    # hence rollout_chunk prompts per sampling call), the float32 [rows, 4096, 151,936]
    # logits of a micro-batch (~5 GB per response with their gradient, hence
    # micro-batches of 1), and the evaluation's KV cache (eval_batch_size).
    "qwen2.5-0.5b": dict(_REF, model="Qwen/Qwen2.5-0.5B-Instruct", micro_batch_size=1, rollout_chunk=16,
                         eval_batch_size=64),
    # 1.5B: float32 weights, gradients and AdamW moments (16 B/param = 24.6 GB) do not fit
    # 24 GB; bf16 weights with torchao's 8-bit AdamW and bf16 stochastic rounding do, and
    # keep every update in expectation (precision.py, choice 3).
    "qwen2.5-1.5b": dict(_REF, model="Qwen/Qwen2.5-1.5B-Instruct", micro_batch_size=1, rollout_chunk=4,
                         eval_batch_size=32, dtype="bfloat16", optimizer="adamw8bit"),
    # 3B: the same policy needs ~30 GB at the faithful 4,096-token budget (weights, 8-bit
    # moments and the reference copy are 6.2 GB each): a 40 GB GPU. No precision that
    # keeps the updates fits 24 GB.
    "qwen2.5-3b": dict(_REF, model="Qwen/Qwen2.5-3B-Instruct", micro_batch_size=1, rollout_chunk=2,
                       eval_batch_size=16, dtype="bfloat16", optimizer="adamw8bit"),
}
# smollm2-kk on 4-person puzzles: on 3 people the start is at 0.850 and most groups of
# 8 had equal rewards (docs/HISTORY.md), so RL had little to learn from. Budget
# 1,024 new tokens: the faithful compact trace of a 4-person puzzle is longer than that
# for 0.3% of puzzles (384: 46%, 768: 3.7%; `python scripts/target_lengths.py
# data/heldout4.jsonl --budgets 384 768 1024`; 0.1% of the RL set train.py builds), so a
# cut-off (reward -3) almost never punishes a faithful trace. The longest 4-person prompt
# in SmolLM2's chat template is 298 tokens (data/heldout4.jsonl; 289 in the RL set, 286
# in the official set): 512 drops none. Evaluated on the official 4-person set at the
# same 1,024. A step at 4 people samples and trains longer responses: a GRPO step took
# 561-717 s (mean 661; AMD EPYC, 2 threads; results/smollm2-kk4/rl-grpo-s0), AR+Lopti's
# more (two updates), so 6 steps, not smollm2-kk's 10, keep a GRPO run near an hour on 2
# CPU cores; a checkpoint after every step, since a run outlives a working session.
# metrics.jsonl's step_s is each step's measured time.
PRESETS["smollm2-kk4"] = dict(PRESETS["smollm2-kk"], max_new_tokens=1024, rl_sizes=(4,), eval_sizes=(4,),
                              eval_max_new_tokens={4: 1024}, steps=6, save_every=1)
# The GPU memory (GB) each GPU preset is sized for (benchmarks/memory_table.py checks the
# estimate against it).
GPU_MEMORY_GB = {"qwen2.5-0.5b": 24, "qwen2.5-1.5b": 24, "qwen2.5-3b": 40}


def make_config(preset: str = "cpu-tiny", **overrides) -> TrainConfig:
    """A preset, then explicit overrides (None values are ignored), validated."""
    if preset not in PRESETS:
        raise TrainError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    values = dict(PRESETS[preset], preset=preset)
    values.update({k: v for k, v in overrides.items() if v is not None})
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(values) - names
    if unknown:
        raise TrainError(f"unknown config field(s): {', '.join(sorted(unknown))}")
    method = values.get("method", TrainConfig.method)
    for knob, used, which in (("alpha", uses_ar, "AR's strength"), ("eta", uses_lopti, "Lopti's threshold")):
        if values.get(knob) is not None and not used(method):
            raise TrainError(f"{knob} is {which}: method {method} does not use it")
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Reject bad input with a message that says what is wrong and what is allowed."""
    if cfg.method not in METHODS:
        raise TrainError(f"unknown method {cfg.method!r}: choose one of {', '.join(METHODS)}")
    for name, allowed in RANGES.items():     # every numeric field in its range (alpha, eta:
        check_range(name.replace("_", "-"), getattr(cfg, name), allowed)    # None if unused)
    # --- rules across fields
    if not cfg.clip_cov_low < cfg.clip_cov_high:
        raise TrainError(f"need clip-cov-low < clip-cov-high, got {cfg.clip_cov_low}, {cfg.clip_cov_high}")
    if not cfg.optimizer_lr <= 1.0:
        raise TrainError(f"lr x lr-scale (the optimizer's step) must lie in (0, 1], got "
                         f"{cfg.lr} x {cfg.lr_scale}")
    if len(cfg.adam_betas) != 2 or not all(Range(0, 1, "[)").holds(b) for b in cfg.adam_betas):
        raise TrainError(f"adam-betas must be two numbers in [0, 1), got {cfg.adam_betas}")
    if cfg.estimator not in ESTIMATORS:
        raise TrainError(f"unknown estimator {cfg.estimator!r}: choose one of {', '.join(ESTIMATORS)}")
    if cfg.decoder not in DECODERS:
        raise TrainError(f"unknown decoder {cfg.decoder!r}: choose one of {', '.join(DECODERS)}")
    if cfg.lopti_order not in LOPTI_ORDERS:
        raise TrainError(f"lopti order must be low_first or high_first, got {cfg.lopti_order!r}")
    if cfg.lopti_split not in LOPTI_SPLITS:
        raise TrainError(f"lopti split must be probability or random, got {cfg.lopti_split!r}")
    if cfg.lopti_optimizer not in LOPTI_OPTIMIZERS:
        raise TrainError(f"lopti optimizer must be shared or per_stage, got {cfg.lopti_optimizer!r}")
    if cfg.grad_accum not in ("global", "verl"):
        raise TrainError(f"grad accum must be global or verl, got {cfg.grad_accum!r}")
    if cfg.loss_agg_mode not in ("token-mean", "seq-mean-token-mean"):
        raise TrainError(f"loss agg mode must be token-mean or seq-mean-token-mean, got {cfg.loss_agg_mode!r}")
    from .precision import check_precision   # torch: only once a config is built
    check_precision(cfg)                     # its PrecisionError is a TrainError
    if cfg.lora_rank:
        import importlib.util
        if importlib.util.find_spec("peft") is None:
            raise TrainError("lora-rank needs peft: pip install -r requirements.txt (or the lora extra)")
    if cfg.heldout_steps and not cfg.heldout_data:
        raise TrainError("heldout-steps needs --heldout-data (the puzzles to evaluate on)")
    if any(int(s) < 1 for s in cfg.heldout_steps):
        raise TrainError(f"heldout-steps must be >= 1, got {cfg.heldout_steps}")
    if cfg.on_nonfinite not in ("stop", "skip"):
        raise TrainError(f"on-nonfinite must be stop or skip, got {cfg.on_nonfinite!r}")
    # --- options that would be accepted and recorded but do nothing: refused instead
    if not cfg.uses_lopti:
        for name, faithful in (("lopti_optimizer", "shared"), ("lopti_split", "probability"),
                               ("lopti_order", "low_first")):
            if getattr(cfg, name) != faithful:
                raise TrainError(f"--{name.replace('_', '-')} {getattr(cfg, name)} applies to Lopti "
                                 f"(--method lopti or ar_lopti); --method {cfg.method} would ignore it")
    # --- the evaluation sets exist, checked now rather than after training
    if cfg.final_eval or cfg.eval_every or cfg.eval_before:
        from .task.kk import OFFICIAL_DIR
        missing = [n for n in cfg.eval_sizes if not (OFFICIAL_DIR / f"kk_test_{n}ppl.jsonl").exists()]
        if missing:
            have = sorted(int(p.name[8:-9]) for p in OFFICIAL_DIR.glob("kk_test_*ppl.jsonl"))
            raise TrainError(f"eval-sizes {','.join(map(str, missing))}: the official test sets hold "
                             f"{','.join(map(str, have))} people (--no-eval skips the evaluation)")
