"""What the study compares, and what must be equal across a comparison.

Design choices:

1. A variant is one method with its knobs (Variant); a grid is a tuple of variants (GRIDS:
   the main comparison with the paper's per-method K&K settings, the control arm, the
   criterion's controls, REINFORCE++ and the one-knob sweeps).
2. Two runs belong to one comparison when their configs agree in everything but the
   variant, the seed and the runtime fields (setting_key).
3. One module for both readers: study.py runs the grids, report.py tabulates them.
4. Runs are paired only where they ran alike: a run's numbers (bf16 kernels above all) may
   differ with the CPU model, the torch build and the thread count, which every run
   records (run.json["machine"], runs.machine_info). A seed enters a grid's table only if
   all its arms' runs agree in these three (MACHINE_FIELDS; a run that recorded none, made
   before the record existed, agrees only with another such run); the other seeds are left
   out of every row of that grid, and the report says which and which field differs
   (`same_machine_seeds`). The same holds for the code: arms of a seed pair only at one
   commit, or at commits that a rerun showed to compute the same value for value
   (scripts/commit_check.py's verdicts in OUT/commit_checks.jsonl; PAIR_FIELDS' "code").
   A grid's own paired comparisons (GRID_PAIRS) ask it of their two arms only (aggregate._pair). Not a refusal: a study with one mixed seed keeps its other
   seeds; results/study-fixed ran each seed of its paired grids on one kind of CPU.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..config import (ESTIMATORS, LOPTI_OPTIMIZERS, LOPTI_ORDERS, LOPTI_SPLITS, METHODS, TOKEN_FIXES,
                      TrainConfig, paper_settings, uses_ar, uses_lopti, without_ar)
from ..paths import work_root
from ..runs import config_from_json, config_to_json

ROOT = work_root()       # the checkout (or, installed, the current folder)


class StudyError(ValueError):
    """A study that cannot go on safely (mixed configs or warm starts): one line, exit 2."""


# =======================================================================================
# 1. What is compared: variants and grids
# =======================================================================================

@dataclass(frozen=True)
class Variant:
    """One method with its knobs. Canonical: knobs a method does not use are dropped, and
    AR with alpha = 0 becomes the method without AR (the same computation, bit for bit)."""
    method: str
    alpha: float | None = None        # AR strength (paper Eq. 4), AR methods only
    eta: float | None = None          # Lopti threshold on pi_old, Lopti methods only
    order: str = "low_first"          # Lopti stage order, Lopti methods only
    ppo_epochs: int = 1               # optimizer passes over each rollout (TrainConfig.ppo_epochs)
    estimator: str = "grpo"           # advantage estimator: grpo | reinforce_pp (REINFORCE++)
    split: str = "probability"        # Lopti's first stage: pi_old < eta | random, Lopti methods only
    lr_scale: float = 1.0             # the optimizer's lr = the study's lr x this (TrainConfig.lr_scale)
    # Lopti's optimizer state: shared by its stages (the reference) | per_stage, Lopti methods only
    # (TrainConfig.lopti_optimizer; the default leaves names and overrides as before it existed)
    stage_optimizer: str = "shared"

    def __post_init__(self):
        m = self.method
        if m not in METHODS:
            raise StudyError(f"unknown method {m!r}: choose one of {', '.join(METHODS)}")
        if self.order not in LOPTI_ORDERS:
            raise StudyError(f"unknown Lopti order {self.order!r}: low_first or high_first")
        if self.split not in LOPTI_SPLITS:
            raise StudyError(f"unknown Lopti split {self.split!r}: {' or '.join(LOPTI_SPLITS)}")
        if self.stage_optimizer not in LOPTI_OPTIMIZERS:
            raise StudyError(f"unknown Lopti optimizer state {self.stage_optimizer!r}: "
                             f"{' or '.join(LOPTI_OPTIMIZERS)}")
        if uses_ar(m) and self.alpha is not None and float(self.alpha) == 0.0:
            m = without_ar(m)
        ar, lopti = uses_ar(m), uses_lopti(m)
        object.__setattr__(self, "method", m)
        object.__setattr__(self, "alpha", float(self.alpha) if ar and self.alpha is not None else None)
        object.__setattr__(self, "eta", float(self.eta) if lopti and self.eta is not None else None)
        object.__setattr__(self, "order", self.order if lopti else "low_first")
        object.__setattr__(self, "split", self.split if lopti else "probability")
        object.__setattr__(self, "stage_optimizer", self.stage_optimizer if lopti else "shared")
        object.__setattr__(self, "ppo_epochs", int(self.ppo_epochs))
        object.__setattr__(self, "lr_scale", float(self.lr_scale))
        if self.estimator not in ESTIMATORS:
            raise StudyError(f"unknown estimator {self.estimator!r}: {', '.join(ESTIMATORS)}")
        if self.ppo_epochs < 1:
            raise StudyError(f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if not self.lr_scale > 0:
            raise StudyError(f"lr_scale must be > 0, got {self.lr_scale}")

    @property
    def name(self) -> str:
        """Directory-safe, deterministic: grpo, ar-a0.2, lopti-e0.4-high_first,
        lopti-e0.4-random, lopti-e0.4-per_stage, grpo-lrx2, ..."""
        s = self.method
        if self.alpha is not None:
            s += f"-a{self.alpha:g}"
        if self.eta is not None:
            s += f"-e{self.eta:g}"
        if self.order != "low_first":
            s += f"-{self.order}"
        if self.split != "probability":
            s += f"-{self.split}"
        if self.stage_optimizer != "shared":
            s += f"-{self.stage_optimizer}"
        if self.ppo_epochs != 1:
            s += f"-x{self.ppo_epochs}"
        if self.lr_scale != 1.0:
            s += f"-lrx{self.lr_scale:g}"
        if self.estimator != "grpo":
            s = "rpp-" + s
        return s

    @property
    def label(self) -> str:
        fixes = METHODS[self.method].label
        base = "GRPO" + fixes if self.estimator == "grpo" else f"REINFORCE++ {fixes}".strip()
        knobs = ([f"α={self.alpha:g}"] if self.alpha is not None else []) + \
                ([f"η={self.eta:g}"] if self.eta is not None else []) + \
                (["high first"] if self.order == "high_first" else []) + \
                ([f"{self.split} split"] if self.split != "probability" else []) + \
                (["an optimizer per stage"] if self.stage_optimizer != "shared" else []) + \
                ([f"{self.ppo_epochs} optimizer steps per rollout"] if self.ppo_epochs != 1 else []) + \
                ([f"lr ×{self.lr_scale:g}"] if self.lr_scale != 1.0 else [])
        return f"{base} ({', '.join(knobs)})" if knobs else base

    def overrides(self) -> dict:
        """The TrainConfig fields of this variant. A knob is passed only when it is not the
        default, so the runs of the other variants need no trainer support for it."""
        d = {"method": self.method}
        if self.alpha is not None:
            d["alpha"] = self.alpha
        if self.eta is not None:
            d["eta"] = self.eta
        if self.order != "low_first":
            d["lopti_order"] = self.order
        if self.split != "probability":
            d["lopti_split"] = self.split
        if self.stage_optimizer != "shared":
            d["lopti_optimizer"] = self.stage_optimizer
        if self.ppo_epochs != 1:
            d["ppo_epochs"] = self.ppo_epochs
        if self.estimator != "grpo":
            d["estimator"] = self.estimator
        if self.lr_scale != 1.0:
            d["lr_scale"] = self.lr_scale
        return d

    @classmethod
    def from_config(cls, cfg: dict) -> "Variant":
        """The variant a run config (run.json["config"]) belongs to; a field an older run
        lacks has the value it ran with (the default)."""
        return cls(cfg["method"], cfg.get("alpha"), cfg.get("eta"), order=cfg.get("lopti_order", "low_first"),
                   ppo_epochs=cfg.get("ppo_epochs", 1), estimator=cfg.get("estimator", "grpo"),
                   split=cfg.get("lopti_split", "probability"), lr_scale=cfg.get("lr_scale", 1.0),
                   stage_optimizer=cfg.get("lopti_optimizer", "shared"))

    @property
    def update_passes(self) -> int:
        """Passes of the update over each rollout: ppo_epochs, times Lopti's two stages."""
        return (2 if uses_lopti(self.method) else 1) * self.ppo_epochs


GRPO = Variant("grpo")
# The paper's K&K settings per method (config.METHODS, the table `train.py --method` uses):
# the rows of its results table.
_ps = paper_settings
AR = Variant("ar", alpha=_ps("ar")["alpha"])
LOPTI = Variant("lopti", eta=_ps("lopti")["eta"])
AR_LOPTI = Variant("ar_lopti", alpha=_ps("ar_lopti")["alpha"], eta=_ps("ar_lopti")["eta"])
MAIN = (GRPO, AR, LOPTI, AR_LOPTI)
# The control arm: GRPO with two optimizer steps per rollout on the same samples (two passes,
# ppo_epochs = 2). Lopti makes two AdamW steps per rollout where GRPO makes one, and AdamW
# normalises each step, so part of a Lopti gain could be the extra step rather than the
# isolation. The paper does not control for this.
GRPO_X2 = Variant("grpo", ppo_epochs=2)
# The second baseline of the paper's reference code: REINFORCE++ (batch-whitened returns, no
# group baseline), alone and with AR+Lopti.
RPP = Variant("grpo", estimator="reinforce_pp")
RPP_AR_LOPTI = Variant("ar_lopti", alpha=AR_LOPTI.alpha, eta=AR_LOPTI.eta, estimator="reinforce_pp")
# Beyond the paper: later methods that act on the same tokens differently (token_fixes.py),
# at their papers' defaults. Each with two passes, so every arm but GRPO makes two optimizer
# steps per rollout, like AR+Lopti and the control: and at one pass CISPO and KL-Cov would be
# GRPO's gradient exactly (every ratio is 1 in the first step; token_fixes.py, choice 3).
TOKEN_FIX_ARMS = tuple(Variant(m, ppo_epochs=2) for m in TOKEN_FIXES)
# What carries Lopti's effect: its criterion, its stage order, or its larger step per rollout?
# - order: the stages reversed (high-probability tokens first; the paper's ablation), at each
#   Lopti arm's eta;
# - criterion: a first stage of as many tokens as pi_old < eta selects in that batch, drawn at
#   random (lopti.py, choice 5): two disjoint stages remain, the criterion is gone. For both
#   Lopti arms: AR+Lopti, the paper's best and train.py's default, splits at another eta with
#   AR acting on the same low-probability tokens, so its answer need not be Lopti's;
# - step size: GRPO with one optimizer step per rollout at twice the learning rate, beside
#   the control's two steps at the same rate.
LOPTI_HIGH = Variant("lopti", eta=LOPTI.eta, order="high_first")
AR_LOPTI_HIGH = Variant("ar_lopti", alpha=AR_LOPTI.alpha, eta=AR_LOPTI.eta, order="high_first")
LOPTI_RANDOM = Variant("lopti", eta=LOPTI.eta, split="random")
AR_LOPTI_RANDOM = Variant("ar_lopti", alpha=AR_LOPTI.alpha, eta=AR_LOPTI.eta, split="random")
GRPO_LR2 = Variant("grpo", lr_scale=2.0)
CRITERION = (GRPO, GRPO_X2, GRPO_LR2, LOPTI, LOPTI_HIGH, LOPTI_RANDOM, AR_LOPTI, AR_LOPTI_HIGH,
             AR_LOPTI_RANDOM)
# Is Lopti's isolation complete? Its stages share one AdamW state, as in the reference, so stage
# 2's step still carries about half stage 1's gradient (lopti.py, choice 8). Each Lopti arm with
# an optimizer per stage isolates the stages in the optimizer too; beside them the control.
LOPTI_PER_STAGE = Variant("lopti", eta=LOPTI.eta, stage_optimizer="per_stage")
AR_LOPTI_PER_STAGE = Variant("ar_lopti", alpha=AR_LOPTI.alpha, eta=AR_LOPTI.eta, stage_optimizer="per_stage")
ISOLATION = (GRPO, GRPO_X2, LOPTI, LOPTI_PER_STAGE, AR_LOPTI, AR_LOPTI_PER_STAGE)
GRIDS: dict[str, tuple[Variant, ...]] = {
    "main": MAIN,
    "control": (GRPO, GRPO_X2, LOPTI),
    "criterion": CRITERION,
    "isolation": ISOLATION,
    "reinforce_pp": (GRPO, RPP, RPP_AR_LOPTI),
    # alpha = 0 is GRPO (canonicalised), alpha = 0.2 is the main grid's AR.
    "alpha": tuple(Variant("ar", alpha=a) for a in (0.0, 0.1, 0.2, 0.3, 0.5)),
    # eta = 0.4 is the main grid's Lopti; GRPO is the baseline of the comparison.
    "eta": (GRPO,) + tuple(Variant("lopti", eta=e) for e in (0.3, 0.4, 0.5, 0.7)),
    "order": (GRPO, LOPTI, Variant("lopti", eta=LOPTI.eta, order="high_first")),
    "token_fixes": (GRPO, GRPO_X2, AR_LOPTI) + TOKEN_FIX_ARMS,
}
# Within a grid, comparisons besides "vs GRPO" (a minus b, paired by seed): Lopti against
# GRPO with as many optimizer steps (the control's question), and REINFORCE++ +AR+Lopti
# against REINFORCE++ (the paper's question for its second estimator).
GRID_PAIRS: dict[str, tuple[tuple[Variant, Variant], ...]] = {
    # Lopti and AR+Lopti against GRPO with as many optimizer steps: what is left of each
    # once the second step is matched (AR+Lopti's runs are the main grid's)
    "control": ((LOPTI, GRPO_X2), (AR_LOPTI, GRPO_X2)),
    # each Lopti arm against its reversed and its random-split twin (order, criterion); the
    # random split against the control (two disjoint stages vs every token twice); the
    # doubled step against GRPO, the control and the Lopti arms
    "criterion": ((LOPTI_HIGH, LOPTI), (AR_LOPTI_HIGH, AR_LOPTI), (LOPTI_RANDOM, LOPTI),
                  (AR_LOPTI_RANDOM, AR_LOPTI), (LOPTI_RANDOM, GRPO_X2), (AR_LOPTI_RANDOM, GRPO_X2),
                  (GRPO_LR2, GRPO), (GRPO_LR2, GRPO_X2), (LOPTI, GRPO_LR2), (AR_LOPTI, GRPO_LR2)),
    # each Lopti arm with an optimizer per stage against its shared-state twin (what the
    # shared state costs or gives) and against the control (two optimizer steps per rollout)
    "isolation": ((LOPTI_PER_STAGE, LOPTI), (AR_LOPTI_PER_STAGE, AR_LOPTI), (LOPTI_PER_STAGE, GRPO_X2),
                  (AR_LOPTI_PER_STAGE, GRPO_X2)),
    "reinforce_pp": ((RPP_AR_LOPTI, RPP),),
    # each later method against AR+Lopti (the paper's best) and against the control (GRPO
    # with as many optimizer steps)
    "token_fixes": tuple((v, b) for v in TOKEN_FIX_ARMS for b in (AR_LOPTI, GRPO_X2)),
}
GRID_TITLES = {"main": "Main comparison (the paper's per-method settings)",
               "control": "Control: GRPO with two optimizer steps per rollout (as many as Lopti)",
               "criterion": "What carries Lopti's effect: its criterion (a random split of the same "
                            "size), its stage order (high first) or its step size (GRPO at 2x lr)",
               "isolation": "Lopti's isolation in the optimizer: one AdamW state shared by its stages "
                            "(the reference) or one per stage",
               "reinforce_pp": "REINFORCE++ as the baseline (the reference's other estimator)",
               "alpha": "Sweep: AR strength alpha (GRPO+AR)",
               "eta": "Sweep: Lopti threshold eta (GRPO+Lopti)",
               "order": "Sweep: Lopti stage order (low-first = paper, high-first = ablation)",
               "token_fixes": "Beyond the paper: later token-level methods (80/20 entropy, CISPO, "
                              "Clip-Cov, KL-Cov), two optimizer steps per rollout"}

def short(label: str) -> str:
    """A label as the report's tables give it: "N optimizer steps per rollout" is ×N."""
    return re.sub(r"(\d+) optimizer steps per rollout", r"×\1", label)


# Paper, K&K accuracy per size 3..7 and avg (from Yang et al. 2025, the K&K
# results table; each one run, accuracy = mean of the last three evaluations).
PAPER_KK = {
    "Qwen2.5-3B-Instruct": {
        "base": (.09, .10, .03, .05, .02, .06), "grpo": (.60, .45, .33, .34, .23, .39),
        "ar": (.67, .62, .53, .44, .37, .53), "lopti": (.74, .67, .56, .42, .30, .54),
        "ar_lopti": (.72, .66, .55, .52, .40, .57)},
    "Qwen2.5-7B-Instruct-1M": {
        "base": (.22, .15, .08, .10, .02, .11), "grpo": (.91, .91, .77, .65, .61, .77),
        "ar": (.97, .98, .89, .83, .80, .89), "lopti": (.95, .94, .84, .80, .76, .86),
        "ar_lopti": (.95, .94, .91, .87, .87, .91)},
}


# =======================================================================================
# What must be equal across a comparison
# =======================================================================================

# Fields that do not change what a run computes (where it writes, how it shows progress,
# how many threads, the two memory knobs that change no number: gradient checkpointing,
# bit-identical gradients, and glibc's mmap threshold; and the held-out evaluations along the
# run; all tested): ignored when configs are compared, so runs from before they existed still
# pair with new ones (such a run has no held-out accuracy along the way: the report says n).
# The thread count may change the order of a sum, so a paired seed's arms must share the
# count each run recorded (MACHINE_FIELDS, choice 4).
RUNTIME_FIELDS = {"run_dir", "progress", "plots", "tensorboard", "threads", "cache_dir",
                  "gradient_checkpointing", "mmap_threshold_mb", "heldout_data", "heldout_steps"}
VARIANT_FIELDS = {"method", "alpha", "eta", "lopti_order", "lopti_split", "lopti_optimizer", "ppo_epochs",
                  "estimator", "lr_scale", "seed"}


def normalised(cfg) -> dict:
    """A config as plain JSON (tuples -> lists, missing fields -> defaults)."""
    if not isinstance(cfg, TrainConfig):
        cfg = config_from_json(cfg)
    return json.loads(json.dumps(config_to_json(cfg)))


def config_diff(a, b, ignore=RUNTIME_FIELDS) -> list[str]:
    """Names of the fields in which two configs differ (runtime fields ignored)."""
    a, b = normalised(a), normalised(b)
    return sorted(k for k in set(a) | set(b) if k not in ignore and a.get(k) != b.get(k))


def setting_key(cfg) -> str:
    """What must be equal across the runs of one comparison: all but variant and seed."""
    d = normalised(cfg)
    return json.dumps({k: v for k, v in sorted(d.items()) if k not in RUNTIME_FIELDS | VARIANT_FIELDS})


# What a run records of its machine (runs.machine_info) that must be equal between the arms of
# a paired seed (choice 4): the CPU's model name, the torch version (its build) and torch's
# intra-op threads. The config's `threads` is a runtime field above: a run's config does not
# change with it, its arithmetic may (how a kernel splits a reduction).
MACHINE_FIELDS = ("cpu", "torch", "threads")
# ... and the code: the study's aggregate adds each run's commit class ("code": one commit, or
# commits a rerun showed to compute the same, declared.commit_classes) to the key it pairs by.
PAIR_FIELDS = MACHINE_FIELDS + ("code",)


def machine_key(run_json: dict) -> dict:
    """The MACHINE_FIELDS of a run's run.json (None where it recorded no machine). A run
    resumed on another machine (run.json["resumed"], runs.record_session) has, in a field
    that changed, its values joined by " + " in the order they ran: equal to no one-machine
    run's, so its seed is reported apart."""
    sessions = [run_json.get("machine") or {}] + [r.get("machine") or {} for r in run_json.get("resumed", [])]
    key = {}
    for f in MACHINE_FIELDS:
        values = list(dict.fromkeys(m.get(f) for m in sessions))
        key[f] = values[0] if len(values) == 1 else " + ".join(map(str, values))
    return key


def code_key(run_json: dict) -> str:
    """The commits a run ran at (run.json "code", then each resumed session's), 12 characters
    each, "+changes" where the checkout was dirty, in order, joined by " + "; "not recorded"
    for a run from before the record. The declared test pairs a seed's arms by it too
    (declared.py), commits that a rerun showed to compute the same counting as one."""
    sessions = [run_json.get("code")] + [r.get("code") for r in run_json.get("resumed", [])]
    keys = [(c["commit"][:12] + ("+changes" if c.get("dirty") else "")) if c else "not recorded" for c in sessions]
    return " + ".join(dict.fromkeys(keys))


def same_machine_seeds(machines: dict, seeds) -> tuple[list, list[dict]]:
    """Choice 4. ``machines``: {arm: {seed: machine_key}} of the arms compared (with "code",
    PAIR_FIELDS, where the caller adds it). Returns (the seeds whose arms all share every
    field, [{"seed", "differs": [fields]}] for the others)."""
    keep, apart = [], []
    for s in seeds:
        keys = [by_seed[s] for by_seed in machines.values()]
        differs = [f for f in PAIR_FIELDS if len({k.get(f) for k in keys}) > 1]
        if differs:
            apart.append({"seed": s, "differs": differs})
        else:
            keep.append(s)
    return keep, apart


# =======================================================================================
# The study folder: OUT/<preset>/<variant>-s<seed>/ (study.py writes, report.py reads)
# =======================================================================================

HELDOUT_FILE = "eval_heldout.json"   # a run's evaluation on the held-out set, beside eval_final.json
# (its evaluations after earlier steps: runs.heldout_step_file, written by the trainer)

# The repository's top-level folders that a study's paths run through.
REPO_FOLDERS = ("runs", "results", "data", "docs", "checkpoints", "models", "cache")


def portable(arg: str) -> str:
    """A path (or any command-line argument) as the report and the aggregate show it, the
    same from any checkout on any machine: an absolute path inside this checkout relative to
    it; inside another checkout (a study run from a worktree) from its first repository
    folder on (runs/..., results/...); anywhere else by its last part (.../study), since
    its folders would name this machine. Anything not absolute as it is."""
    if not os.path.isabs(arg):
        return arg
    p = Path(arg)
    if p.is_relative_to(ROOT):
        return p.relative_to(ROOT).as_posix() or "."
    for i, part in enumerate(p.parts):
        if part in REPO_FOLDERS:
            return Path(*p.parts[i:]).as_posix()
    return f".../{p.name}"


def warm_start_eval_path(out, preset: str) -> Path:
    return Path(out) / preset / "warm-start-eval.json"
