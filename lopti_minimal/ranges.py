"""The values every numeric option allows: one row per numeric TrainConfig field (config.py's
design choice 1), read by config.validate and by eval.py for its own options.

A value outside its row, NaN, or an infinity where the number must be finite is refused with
one line that names the option, the value and the range (a TrainError: exit 2 in train.py and
eval.py). Rules across fields (clip-cov-low < clip-cov-high, lr x lr-scale <= 1) stay in
config.validate. Like config.py, this module imports no torch.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

from .cli import TrainError



class Range(NamedTuple):
    """The values a numeric option allows: ``lo`` to ``hi``, each end closed or open as
    ``ends`` says ("[]", "(]", "[)", "()"); ``integer``: whole numbers only; ``finite``: no
    infinity (NaN is never allowed); ``why``: the reason, said with a refusal, where the
    range is not obvious."""
    lo: float
    hi: float = math.inf
    ends: str = "[]"
    integer: bool = False
    finite: bool = True
    why: str = ""

    def holds(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if self.integer else numbers.Real):
            return False
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        above = value > self.lo if self.ends[0] == "(" else value >= self.lo
        below = value < self.hi if self.ends[1] == ")" else value <= self.hi
        return above and below

    def text(self) -> str:
        """The range in words, after "must": "be an integer >= 1", "lie in (0, 1]"."""
        if self.integer:
            return f"be an integer >= {self.lo}" if self.hi == INT_MAX else f"be an integer in [{self.lo}, {self.hi}]"
        if self.lo == -math.inf and self.hi == math.inf:
            return "be a finite number"
        if self.hi == math.inf:
            return f"be a {'finite ' if self.finite else ''}number {'>' if self.ends[0] == '(' else '>='} {self.lo:g}"
        return f"lie in {self.ends[0]}{self.lo:g}, {self.hi:g}{self.ends[1]}"


# The largest count any option takes: a C int, what torch and glibc take for a count.
INT_MAX = 2 ** 31 - 1


def int_range(lo: int, hi: int = INT_MAX, why: str = "") -> Range:
    """Whole numbers from ``lo`` to ``hi``."""
    return Range(lo, hi, "[]", integer=True, why=why)


# Every numeric field of TrainConfig (None, where a field allows it, means "not set" and is
# not checked). eval.py checks its options against the rows of the fields they stand for.
RANGES: dict[str, Range] = {
    # --- the method (paper Eq. 1 and 4, Algorithm 1; the reference's settings)
    "alpha": Range(0, 1, why="paper Eq. 4"),
    "eta": Range(0, 1, "(]", why="Lopti's threshold on pi_old"),
    "group_size": int_range(2, why="GRPO compares the responses within a group"),
    "adv_eps": Range(0),
    # logits / T in float32: below 0.01 sampling is greedy but for ties, and a large logit
    # over a tiny T overflows to inf (NaN probabilities); above 100 it is uniform
    "temperature": Range(0.01, 100, why="T divides the logits in float32"),
    # AdamW moves each weight by about lr a step whatever the gradient's scale: above 1, by
    # more than the size of any weight of an LM
    "lr": Range(0, 1, "(]", why="AdamW moves a weight by about lr a step"),
    "lr_scale": Range(0, ends="()"),
    # AdamW scales each weight by 1 - lr x weight_decay a step (lr <= 1: never below 0)
    "weight_decay": Range(0, 1),
    # inf: no clipping (clip_grad_norm_ then scales by 1); 0 or less would zero or flip the step
    "grad_clip": Range(0, ends="(]", finite=False, why="inf: no clipping"),
    "eps_low": Range(0, 1, "[)", why="the ratio's lower clip bound 1 - eps-low must stay > 0"),
    "eps_high": Range(0),
    # the dual clip caps a negative advantage's loss at -A x c; with c <= 1 it would cut the
    # surrogate already at ratio 1 (-A): verl's compute_policy_loss asserts clip_ratio_c > 1.0
    "clip_c": Range(1, ends="()", why="the dual clip; verl asserts clip_ratio_c > 1"),
    "kl_coef": Range(0),
    # exp(20) already saturates k3's outer clamp; exp of a larger bound can overflow (grpo.kl_k3)
    "kl_log_ratio_clamp": Range(0, 20, "(]", why="5 = the reference fork, 20 = current verl"),
    "mini_batch_size": int_range(1), "micro_batch_size": int_range(1), "ppo_epochs": int_range(1),
    # --- beyond the paper (token_fixes.py)
    "entropy_top_quantile": Range(0, 1), "cispo_eps_low": Range(0, 1), "cispo_eps_high": Range(0),
    "clip_cov_ratio": Range(0, 1, "(]"), "kl_cov_ratio": Range(0, 1, "(]"), "kl_cov_coef": Range(0),
    "clip_cov_low": Range(-math.inf, ends="()"), "clip_cov_high": Range(-math.inf, ends="()"),
    # --- schedule and data
    "seed": int_range(0), "steps": int_range(1), "prompts_per_step": int_range(1),
    # each round samples prompts_per_step x G more responses: 32 rounds already multiply a
    # step's sampling by 33
    "dynamic_sampling": int_range(0, 32, why="0 = off; extra sampling rounds per step"),
    "top_p": Range(0, 1, "(]", why="1 = off; 0 would keep no token"),
    "top_k": int_range(0, why="0 = off"),
    "max_new_tokens": int_range(1), "max_prompt_len": int_range(1),
    "rl_per_size": int_range(1), "data_seed": int_range(0),
    # --- numerics and hardware
    "lora_rank": int_range(0, why="0 = off"), "rollout_chunk": int_range(0, why="0 = all prompts"),
    # more threads than a machine's cores only slow a run (no CPU has 1,024 cores)
    "threads": int_range(1, 1024, why="torch's CPU threads"),
    # mallopt takes the threshold in bytes as a C int: 2,048 MiB and more would wrap around
    "mmap_threshold_mb": int_range(0, 2047, why="0 = glibc's dynamic default"),
    # --- the mechanism, the evaluation, the output
    "grad_shares_every": int_range(0), "eval_every": int_range(0), "eval_per_size": int_range(1),
    "eval_batch_size": int_range(1), "save_every": int_range(0),
    "keep_checkpoints": int_range(0, why="0 keeps all"),
}


def check_range(name: str, value, allowed: Range) -> None:
    """TrainError, one line naming the option, the value and the range, unless ``value``
    lies in ``allowed`` (None: not set, nothing to check)."""
    if value is None or allowed.holds(value):
        return
    why = f" ({allowed.why})" if allowed.why else ""
    raise TrainError(f"{name} must {allowed.text()}{why}, got {value!r}")
