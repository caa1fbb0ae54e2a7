"""The study: GRPO vs GRPO+AR vs GRPO+Lopti vs GRPO+AR+Lopti, several seeds, equal budgets,
confidence intervals, and the report docs/RESULTS.md.

    python -m lopti_minimal.study                          # main grid: 4 methods x 5 seeds, cpu-tiny
    python -m lopti_minimal.study --grid all               # + REINFORCE++ arms, alpha, eta, order sweeps (3 seeds)
    python -m lopti_minimal.study --dry-run                # the plan, what is done, a time estimate
    python -m lopti_minimal.study --report-only            # aggregate finished runs, rewrite the report
    python -m lopti_minimal.study --preset smollm2-cpu --seeds 3 --only grpo,ar_lopti

The paper (Yang et al. 2025, arXiv 2505.12929) reports one run per method on K&K. One
independent re-implementation found no gain from AR on K&K. At our scale (a
3.4M-parameter model, a few dozen RL steps) seed-to-seed noise is large, so one run per
method could not tell a method effect from seed noise. This module is the protocol that lets the
result be whatever it is, stated with its uncertainty. The design choices, each with its
reason:

1. One run = one ordinary trainer run (trainer.train) in its own directory with a
   deterministic name, OUT/<preset>/<variant>-s<seed>. A run whose eval_final.json exists
   is finished and skipped; a run with a run.json but no final evaluation is resumed from
   its latest checkpoint (the trainer's exact resume); anything else starts fresh. An
   interrupted study (Ctrl-C, kill, a reboot, a crash) therefore loses at most the steps
   since the last checkpoint of the runs that were in flight; on Ctrl-C or kill (SIGTERM)
   the queued runs are dropped, not started, and the invocation is still logged. Before
   a run is skipped or resumed its saved config is compared with the one the command
   line asks for, field by field; a mismatch (say, --steps changed) is an error, never a
   silent mix of budgets.
   A failing run is logged (RUN_DIR/study_error.txt) and the study goes on with the others.

2. Same warm start, same seeds. Every run of a preset starts from cfg.model, and
   OUT/study.json stores the SHA-256 of its weights the first time: if the warm start
   changes under a study (someone retrains checkpoints/tiny-warm), the next invocation
   stops with an error instead of mixing two warm starts. Seed s is the same for every
   method, and in the trainer a seed fixes the prompts of every step and the sampler's
   random stream (trainer.step_prompt_indices, trainer.step_generator): the methods see
   the same puzzles in the same order, and their first rollouts are identical. This is
   "common random numbers", and it is why the comparison with GRPO is *paired by seed*:
   the difference of two runs with the same seed has less noise than the difference of
   two independent means.

3. Equal budgets. Every method of a preset gets the same number of RL steps x prompts per
   step x G responses per prompt, so the same number of *sampled responses* (the
   expensive part, and the quantity that limits data). Lopti's second stage makes a second
   optimizer pass over the *same* responses (paper Algorithm 1): we count it as extra
   update compute, not as extra samples (the paper's runs likewise give every method the
   same steps over the same data, per the reference's K&K launch scripts; reviewers noted
   the doubled update cost).
   The report shows, per method, the optimizer passes per
   batch (1 or 2), and the measured mean seconds per RL step, for sampling and for the
   update, from each run's metrics.jsonl, so the compute cost of Lopti is visible.
   All other hyperparameters are those of the preset for every method, and the
   aggregation checks it: a run whose config differs from the others of its preset in
   anything but method, alpha, eta, order and seed is left out of the tables and named.

4. The methods use the paper's per-method K&K settings (the reference's launch scripts):
   AR alone alpha 0.2, Lopti alone eta 0.4, AR+Lopti alpha 0.3 and eta 0.5 -- the settings
   behind the paper's table that the report puts beside ours. The sweeps (fewer seeds, --sweep-seeds) vary
   one knob: alpha in {0, 0.1, 0.2, 0.3, 0.5} for AR alone, eta in {0.3, 0.4, 0.5, 0.7} for
   Lopti alone, and Lopti's order (low-first, the paper's, vs high-first, which the paper
   reports to collapse; it needs TrainConfig.lopti_order, and is skipped with a message
   if the trainer lacks that field). A variant that is the same computation as another shares its
   runs: AR with alpha = 0 *is* GRPO bit for bit (reweight.py), so alpha = 0 is the GRPO
   run; the eta = 0.4 and the low-first points are the main grid's Lopti runs. Runs are
   ordered seed-major (all methods of seed 0, then seed 1, ...), main grid first, so a
   study stopped early still has complete, paired seeds.

5. Statistics. Accuracy is the share of official test puzzles (3..7 people, 100 each)
   whose greedy response scores 3, per size and averaged over sizes (the paper's "avg"),
   from the final evaluation of each run (the paper averages its last three evaluations;
   we evaluate once at the end, to save time). Each table of the report (one per grid) is
   balanced: it uses only the seeds that all its rows have, so a half-finished study
   never compares a 5-seed mean with a 2-seed one. Per row: mean over seeds and a 95%
   confidence interval from Student's t with n-1 degrees of freedom, mean +- t * s /
   sqrt(n) (s the sample standard deviation). Against GRPO: the per-seed differences,
   their mean and t interval (a paired t interval), and the relative
   change = mean difference / GRPO mean (the paper's "+46.2%" is .57 / .39 - 1, the same
   ratio). The relative interval divides the paired interval by the GRPO mean, treating
   that mean as fixed (an approximation, said in the report). scipy is not a dependency, so
   the t quantiles come from a table (n <= 31) and an asymptotic expansion beyond it.

6. The report states only what is computed: for each method whether the paired 95% CI of
   its difference from GRPO excludes 0, the point estimate beside the paper's, and no
   correction for the three comparisons (it says so). The paragraph of interpretation is
   the author's: the block between the HAND-WRITTEN markers in docs/RESULTS.md survives
   every regeneration.

7. Parallel runs. --jobs J runs J trainer runs at once in separate processes, each with
   threads = cores / J. A 3.4M-parameter model uses two cores poorly, so two one-thread
   runs may finish a study sooner than one two-thread run at a time; it changes nothing
   in the results except floating-point summation order. Wall times are recorded per run
   (RUN_DIR/study_time.json) and per invocation (OUT/study_log.jsonl), with the machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import runs, trainer
from .cli import HelpFormatter
from .trainer import ROOT, TrainError

DEFAULT_OUT = "runs/study"
DEFAULT_REPORT = "docs/RESULTS.md"
DEFAULT_FIGURES = "docs/figures"
DEFAULT_HELDOUT = "data/heldout3.jsonl"
HAND_BEGIN = "<!-- BEGIN HAND-WRITTEN: study.py keeps this block when it regenerates the file -->"
HAND_END = "<!-- END HAND-WRITTEN -->"


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
    passes: int = 1                   # optimizer passes over each rollout (ppo_epochs)
    estimator: str = "grpo"           # advantage estimator: grpo | reinforce_pp (REINFORCE++)

    def __post_init__(self):
        m = self.method
        if m not in trainer.METHODS:
            raise StudyError(f"unknown method {m!r}: choose one of {', '.join(trainer.METHODS)}")
        if self.order not in ("low_first", "high_first"):
            raise StudyError(f"unknown Lopti order {self.order!r}: low_first or high_first")
        if m in ("ar", "ar_lopti") and self.alpha is not None and float(self.alpha) == 0.0:
            m = {"ar": "grpo", "ar_lopti": "lopti"}[m]
        ar, lopti = m in ("ar", "ar_lopti"), m in ("lopti", "ar_lopti")
        object.__setattr__(self, "method", m)
        object.__setattr__(self, "alpha", float(self.alpha) if ar and self.alpha is not None else None)
        object.__setattr__(self, "eta", float(self.eta) if lopti and self.eta is not None else None)
        object.__setattr__(self, "order", self.order if lopti else "low_first")
        object.__setattr__(self, "passes", int(self.passes))
        if self.estimator not in trainer.ESTIMATORS:
            raise StudyError(f"unknown estimator {self.estimator!r}: {', '.join(trainer.ESTIMATORS)}")
        if self.passes < 1:
            raise StudyError(f"passes must be >= 1, got {self.passes}")

    @property
    def name(self) -> str:
        """Directory-safe, deterministic: grpo, ar-a0.2, lopti-e0.4-high_first, ..."""
        s = self.method
        if self.alpha is not None:
            s += f"-a{self.alpha:g}"
        if self.eta is not None:
            s += f"-e{self.eta:g}"
        if self.order != "low_first":
            s += f"-{self.order}"
        if self.passes != 1:
            s += f"-x{self.passes}"
        if self.estimator != "grpo":
            s = "rpp-" + s
        return s

    @property
    def label(self) -> str:
        base = {"grpo": "GRPO", "ar": "GRPO+AR", "lopti": "GRPO+Lopti", "ar_lopti": "GRPO+AR+Lopti"}[self.method]
        if self.estimator == "reinforce_pp":
            base = base.replace("GRPO", "REINFORCE++")
        knobs = ([f"α={self.alpha:g}"] if self.alpha is not None else []) + \
                ([f"η={self.eta:g}"] if self.eta is not None else []) + \
                (["high first"] if self.order == "high_first" else []) + \
                ([f"{self.passes} optimizer steps per rollout"] if self.passes != 1 else [])
        return f"{base} ({', '.join(knobs)})" if knobs else base

    def overrides(self) -> dict:
        """The TrainConfig fields of this variant. lopti_order is passed only when it is
        not the default, so low-first runs need no trainer support for the option."""
        d = {"method": self.method}
        if self.alpha is not None:
            d["alpha"] = self.alpha
        if self.eta is not None:
            d["eta"] = self.eta
        if self.order != "low_first":
            d["lopti_order"] = self.order
        if self.passes != 1:
            d["ppo_epochs"] = self.passes
        if self.estimator != "grpo":
            d["estimator"] = self.estimator
        return d

    @classmethod
    def from_config(cls, cfg: dict) -> "Variant":
        """The variant a run config (run.json["config"]) belongs to."""
        return cls(cfg["method"], cfg.get("alpha"), cfg.get("eta"), cfg.get("lopti_order", "low_first"),
                   cfg.get("ppo_epochs", 1), cfg.get("estimator", "grpo"))


GRPO = Variant("grpo")
# The paper's K&K settings per method (trainer.PAPER_SETTINGS, the table `train.py --method`
# uses): the rows of its results table.
_ps = trainer.paper_settings
MAIN = (GRPO, Variant("ar", alpha=_ps("ar")["alpha"]), Variant("lopti", eta=_ps("lopti")["eta"]),
        Variant("ar_lopti", alpha=_ps("ar_lopti")["alpha"], eta=_ps("ar_lopti")["eta"]))
# The control arm: GRPO with two optimizer steps per rollout on the same samples (two passes,
# ppo_epochs = 2). Lopti makes two AdamW steps per rollout where GRPO makes one, and AdamW
# normalises each step, so part of a Lopti gain could be the extra step rather than the
# isolation. The paper does not control for this.
GRPO_X2 = Variant("grpo", passes=2)
GRIDS: dict[str, tuple[Variant, ...]] = {
    "main": MAIN,
    "control": (GRPO, GRPO_X2, Variant("lopti", eta=_ps("lopti")["eta"])),
    # The second baseline of the paper's reference code: REINFORCE++ (batch-whitened
    # returns, no group baseline), alone and with AR+Lopti, beside GRPO.
    "reinforce_pp": (GRPO, Variant("grpo", estimator="reinforce_pp"),
                     Variant("ar_lopti", alpha=_ps("ar_lopti")["alpha"], eta=_ps("ar_lopti")["eta"],
                             estimator="reinforce_pp")),
    # alpha = 0 is GRPO (canonicalised), alpha = 0.2 is the main grid's AR.
    "alpha": tuple(Variant("ar", alpha=a) for a in (0.0, 0.1, 0.2, 0.3, 0.5)),
    # eta = 0.4 is the main grid's Lopti; GRPO is the baseline of the comparison.
    "eta": (GRPO,) + tuple(Variant("lopti", eta=e) for e in (0.3, 0.4, 0.5, 0.7)),
    "order": (GRPO, Variant("lopti", eta=0.4), Variant("lopti", eta=0.4, order="high_first")),
}
GRID_TITLES = {"main": "Main comparison (the paper's per-method settings)",
               "control": "Control: GRPO with two optimizer steps per rollout (as many as Lopti)",
               "reinforce_pp": "REINFORCE++ as the baseline (the reference's other estimator)",
               "alpha": "Sweep: AR strength alpha (GRPO+AR)",
               "eta": "Sweep: Lopti threshold eta (GRPO+Lopti)",
               "order": "Sweep: Lopti stage order (low-first = paper, high-first = ablation)"}

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
# 2. The plan: which runs, with which configs
# =======================================================================================

@dataclass(frozen=True)
class RunSpec:
    preset: str
    variant: Variant
    seed: int
    grid: str                          # the first grid that asked for it

    def run_dir(self, out) -> Path:
        return Path(out) / self.preset / f"{self.variant.name}-s{self.seed}"


def plan_runs(grids, seeds: int, sweep_seeds: int, preset: str, only=None) -> list[RunSpec]:
    """Deduplicated runs, main grid first, seed-major inside a grid (see docstring §4).
    ``only``: keep these methods (or variant names) only."""
    names = list(GRIDS) if "all" in grids else list(grids)
    for g in names:
        if g not in GRIDS:
            raise StudyError(f"unknown grid {g!r}: choose from {', '.join(GRIDS)}, all")
    names.sort(key=list(GRIDS).index)
    out, seen = [], set()

    def add(g, v, seed):
        if only and v.method not in only and v.name not in only:
            return
        if (v, seed) not in seen:
            seen.add((v, seed))
            out.append(RunSpec(preset, v, seed, g))

    # The main grid and its control share the seeds and run seed-major together, so a study
    # stopped early has complete, paired seeds for both; the sweeps follow.
    first = [g for g in names if g in ("main", "control")]
    for seed in range(seeds):
        for g in first:
            for v in GRIDS[g]:
                add(g, v, seed)
    for g in names:
        if g not in first:
            for seed in range(sweep_seeds):
                for v in GRIDS[g]:
                    add(g, v, seed)
    return out


# Fields that do not change what a run computes (where it writes, how it shows progress,
# how many threads): ignored when configs are compared.
RUNTIME_FIELDS = {"run_dir", "progress", "plots", "tensorboard", "threads", "cache_dir"}
VARIANT_FIELDS = {"method", "alpha", "eta", "lopti_order", "ppo_epochs", "estimator", "seed"}


def run_config(spec: RunSpec, out, overrides: dict | None = None, threads: int | None = None):
    """The TrainConfig of one run: the preset, the study-wide overrides, the variant, the
    seed, and the study's fixed choices (final evaluation on, no tqdm bars inside runs)."""
    values = dict(overrides or {})
    values.update(spec.variant.overrides(), seed=spec.seed, run_dir=str(spec.run_dir(out)),
                  final_eval=True, progress=False, threads=threads)
    return trainer.make_config(spec.preset, **values)


def normalised(cfg) -> dict:
    """A config as plain JSON (tuples -> lists, missing fields -> defaults)."""
    if not isinstance(cfg, trainer.TrainConfig):
        cfg = trainer.config_from_json(cfg)
    return json.loads(json.dumps(trainer.config_to_json(cfg)))


def config_diff(a, b, ignore=RUNTIME_FIELDS) -> list[str]:
    """Names of the fields in which two configs differ (runtime fields ignored)."""
    a, b = normalised(a), normalised(b)
    return sorted(k for k in set(a) | set(b) if k not in ignore and a.get(k) != b.get(k))


def setting_key(cfg) -> str:
    """What must be equal across the runs of one comparison: all but variant and seed."""
    d = normalised(cfg)
    return json.dumps({k: v for k, v in sorted(d.items()) if k not in RUNTIME_FIELDS | VARIANT_FIELDS})


def run_status(run_dir) -> str:
    """"done" (final evaluation written), "resume" (one of our runs, unfinished) or "new"."""
    run_dir = Path(run_dir)
    if runs.is_run_dir(run_dir):
        return "done" if (run_dir / "eval_final.json").exists() else "resume"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise StudyError(f"{run_dir} exists but is not a lopti-minimal run: move it away")
    return "new"


def check_existing(run_dir, cfg) -> None:
    """A run to skip or resume must have been made with the config we would use now."""
    saved = json.loads((Path(run_dir) / "run.json").read_text())["config"]
    diff = config_diff(saved, cfg)
    if diff:
        raise StudyError(f"{run_dir} was made with a different config ({', '.join(diff)}): "
                         "use another --out, or the options it was made with")


def model_fingerprint(model: str) -> str:
    """SHA-256 of a local model's weights and tokenizer (a folder or a file); for a hub id,
    the id itself (it cannot be hashed without downloading it)."""
    p = Path(model)
    if not p.is_absolute() and not p.exists() and (ROOT / model).exists():
        p = ROOT / model
    if not p.exists():
        return f"id:{model}"
    files = [p] if p.is_file() else sorted(
        f for f in p.iterdir() if f.is_file() and (f.suffix in (".safetensors", ".bin", ".gguf")
                                                  or f.name in ("config.json", "tokenizer.json")))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


def check_warm_start(out, preset: str, model: str) -> str:
    """Record the warm start of a preset in OUT/study.json, or check it is unchanged."""
    path = Path(out) / "study.json"
    state = json.loads(path.read_text()) if path.exists() else {"created": _now(), "presets": {}}
    fp = model_fingerprint(model)
    first = model.split("/")[0]
    if fp.startswith("id:") and (model.startswith((".", "/", "~")) or model.count("/") != 1
                                 or first in ("checkpoints", "models") or (ROOT / first).is_dir()):
        raise StudyError(f"warm start {model} not found: for the tiny model run `python train.py "
                         "--rebuild-warmstart`, for SmolLM2 `python scripts/fetch_smollm2.py`, or pass --model")
    known = state["presets"].get(preset)
    if known and (known["model"], known["fingerprint"]) != (model, fp):
        raise StudyError(f"the warm start of preset {preset} changed since this study began "
                         f"({known['model']} {known['fingerprint'][:19]} -> {model} {fp[:19]}): "
                         "use another --out")
    if not known:
        state["presets"][preset] = {"model": model, "fingerprint": fp, "recorded": _now()}
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, state)
    return fp


def warm_start_eval_path(out, preset: str) -> Path:
    return Path(out) / preset / "warm-start-eval.json"


def evaluate_warm_start(out, cfg, echo=print, heldout: str | None = None) -> Path:
    """The reference row "warm start (no RL)": the starting policy of a preset, evaluated
    once, greedy, with exactly the final evaluation of the runs (cfg: any run config of
    the preset). RL at small scale can lower accuracy; the Δ vs GRPO columns cannot show
    that, this row does. Skipped when its file exists (greedy decoding is deterministic)."""
    path = warm_start_eval_path(out, cfg.preset)
    hpath = path.with_name("warm-start-heldout.json")
    if heldout and not hpath.exists():
        echo(f"[study] evaluating the warm start {cfg.model} on {heldout} -> {hpath}")
        _write_heldout(cfg, heldout, hpath)
    if path.exists():
        return path
    from .task.evaluate import write_report
    echo(f"[study] evaluating the warm start {cfg.model} ({cfg.preset}) -> {path}")
    t0 = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = trainer.load_policy(cfg)
    report = trainer.evaluate_policy(model, tok, cfg, progress=False)
    report.update(model=cfg.model, threads=cfg.threads, wall_s=round(time.perf_counter() - t0, 1))
    write_report(report, path)
    return path


# =======================================================================================
# 3. Running: skip, resume, or start; one process or several
# =======================================================================================

def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _write_json(path: Path, obj) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def machine_info() -> dict:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def _file_log(path: Path):
    """A trainer log that appends to RUN_DIR/train.log. It opens the file per line, so it
    never creates the run directory itself (the trainer refuses a non-empty new one)."""
    def log(s: str) -> None:
        if path.parent.exists():
            with open(path, "a") as f:
                f.write(s + "\n")
    return log


HELDOUT_FILE = "eval_heldout.json"


def evaluate_heldout(run_dir, cfg, heldout) -> Path:
    """Greedy accuracy of a finished run's final policy on a held-out K&K file (default
    data/heldout3.jsonl: 400 three-person puzzles outside the official sets, the RL set and
    the warm start's stream; the official 3-person set has only 100, so its accuracy has a
    standard error of ~0.05). Same numerics and budget as the final evaluation."""
    run_dir = Path(run_dir)
    return _write_heldout(cfg, heldout, run_dir / HELDOUT_FILE, source=str(run_dir / "final"))


def _write_heldout(cfg, heldout, path: Path, source: str | None = None) -> Path:
    """Evaluate the policy at ``source`` (default cfg.model) on the K&K file ``heldout``."""
    from .task.evaluate import evaluate_records, write_report
    from .task.kk import load_jsonl
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = trainer.load_policy(cfg, source=source)
    report = evaluate_records(model, tok, load_jsonl(_abs(heldout)), max_new_tokens=cfg.eval_max_new_tokens,
                              batch_size=cfg.eval_batch_size, prompt_style=cfg.prompt_style,
                              autocast_bf16=cfg.autocast_bf16, progress=False)
    report.update(model=source or cfg.model, data=str(heldout))
    write_report(report, path)
    return path


def execute(cfg, status: str, train_fn=None, heldout: str | None = None) -> dict:
    """One run: start it, or resume it after its latest checkpoint, then (``heldout``) its
    held-out evaluation; status "heldout" runs that evaluation only. Never raises except on
    KeyboardInterrupt; a failure is returned and written to RUN_DIR/study_error.txt."""
    train_fn = train_fn or trainer.train
    run_dir = Path(cfg.run_dir)
    log = _file_log(run_dir / "train.log")
    t0, start = time.perf_counter(), _now()
    ok, err = False, None
    try:
        if status == "resume":
            rcfg = trainer.resume_config(run_dir, progress=False)
            rcfg.threads = cfg.threads
            train_fn(rcfg, resume=True, log=log)
        elif status == "new":
            train_fn(cfg, resume=False, log=log)
        if heldout and not (run_dir / HELDOUT_FILE).exists():
            evaluate_heldout(run_dir, cfg, heldout)
        ok = True
    except KeyboardInterrupt:
        err = "interrupted"
        raise
    except Exception as e:                       # noqa: BLE001 -- a study outlives one bad run
        err = f"{type(e).__name__}: {e}"
        # Inside the run only if it is one of our runs: a stray file in a directory
        # without run.json would make the trainer refuse to start it next time.
        if runs.is_run_dir(run_dir):
            (run_dir / "study_error.txt").write_text(traceback.format_exc())
        else:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            (run_dir.parent / f"{run_dir.name}.study_error.txt").write_text(traceback.format_exc())
    finally:
        wall = time.perf_counter() - t0
        if runs.is_run_dir(run_dir):
            tpath = run_dir / "study_time.json"
            rec = json.loads(tpath.read_text()) if tpath.exists() else {"wall_s": 0.0, "sessions": []}
            rec["wall_s"] = round(rec["wall_s"] + wall, 1)
            rec["sessions"].append({"start": start, "wall_s": round(wall, 1), "status": status,
                                    "ok": ok, "error": err, "threads": cfg.threads})
            _write_json(tpath, rec)
    return {"run_dir": str(run_dir), "ok": ok, "error": err, "wall_s": wall}


def _quiet_transformers() -> None:
    """No "Writing model shards" bars from save_pretrained under the study's own bar."""
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except Exception:                           # noqa: BLE001 -- cosmetic only
        pass


def _execute_in_worker(cfg_json: dict, status: str, train_fn, heldout) -> dict:
    """Process-pool entry point (module level, so it pickles)."""
    _quiet_transformers()
    return execute(trainer.config_from_json(cfg_json), status, train_fn, heldout)


def run_study(specs: list[RunSpec], out, overrides: dict | None = None, *, train_fn=None, jobs: int = 1,
              threads: int | None = None, progress: bool = True, echo=print, argv=None,
              eval_warm_start: bool = False, heldout: str | None = None) -> dict:
    """Run every spec that is not finished. Returns {"done", "skipped", "failed", "wall_s"}.
    train_fn(cfg, resume=..., log=...) defaults to trainer.train (tests inject a fake).
    eval_warm_start: first evaluate each preset's warm start (`evaluate_warm_start`; the
    command line does, tests of the orchestration with fake models do not).
    heldout: a K&K file every finished run is also evaluated on (`evaluate_heldout`); a
    finished run without that evaluation gets it (status "heldout")."""
    out = Path(out)
    jobs = max(1, int(jobs))
    if threads is None and jobs > 1:
        threads = max(1, (os.cpu_count() or 1) // jobs)
    t0, start = time.perf_counter(), _now()
    todo, skipped, checked = [], [], set()
    for spec in specs:                    # all checks first: refuse before anything runs
        cfg = run_config(spec, out, overrides, threads)
        if (spec.preset, cfg.model) not in checked:
            check_warm_start(out, spec.preset, cfg.model)
            checked.add((spec.preset, cfg.model))
        status = run_status(cfg.run_dir)
        if status != "new":
            check_existing(cfg.run_dir, cfg)
        if status == "done" and heldout and not (Path(cfg.run_dir) / HELDOUT_FILE).exists():
            status = "heldout"
        (skipped if status == "done" else todo).append((spec, cfg, status))
    if eval_warm_start:
        for preset in dict.fromkeys(spec.preset for spec, _, _ in todo + skipped):
            cfg = next(c for sp, c, _ in todo + skipped if sp.preset == preset)
            evaluate_warm_start(out, cfg, echo, heldout)
    echo(f"[study] {len(specs)} runs: {len(skipped)} finished (skipped), "
         f"{sum(s == 'resume' for _, _, s in todo)} to resume, {sum(s == 'new' for _, _, s in todo)} to start"
         f" | jobs {jobs}, threads per run {threads or 'default'} | {out}")
    results = []
    bar = tqdm(total=len(todo), desc="study runs", unit="run", disable=not progress, file=sys.stderr)
    try:
        if jobs == 1:
            for spec, cfg, status in todo:
                bar.set_postfix_str(f"{spec.preset}/{spec.variant.name}-s{spec.seed} ({status})")
                r = execute(cfg, status, train_fn, heldout)
                results.append(r)
                if not r["ok"]:
                    echo(f"[study] FAILED {r['run_dir']}: {r['error']}")
                bar.update(1)
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed
            with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
                futs = [pool.submit(_execute_in_worker, trainer.config_to_json(cfg), status, train_fn, heldout)
                        for _, cfg, status in todo]
                try:
                    for f in as_completed(futs):
                        r = f.result()
                        results.append(r)
                        if not r["ok"]:
                            echo(f"[study] FAILED {r['run_dir']}: {r['error']}")
                        bar.set_postfix_str(Path(r["run_dir"]).name)
                        bar.update(1)
                except KeyboardInterrupt:
                    # Leaving the `with` would run every queued run first: drop the ones not
                    # started. Runs in flight stop with the interrupt when it reaches their
                    # process too (Ctrl-C in a terminal does) and resume next time.
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()
        wall = time.perf_counter() - t0
        out.mkdir(parents=True, exist_ok=True)
        runs.append_jsonl(out / "study_log.jsonl", {
            "start": start, "end": _now(), "wall_s": round(wall, 1), "argv": argv,
            "jobs": jobs, "threads": threads, "planned": len(specs), "skipped": len(skipped),
            "ran": len(results), "failed": sum(not r["ok"] for r in results), "machine": machine_info()})
    failed = [r for r in results if not r["ok"]]
    return {"done": [r["run_dir"] for r in results if r["ok"]], "skipped": [str(c.run_dir) for _, c, _ in skipped],
            "failed": failed, "wall_s": wall}


# =======================================================================================
# 4. Statistics: Student-t intervals (no scipy)
# =======================================================================================

# Two-sided 95% critical values t_{0.975, df} of Student's t distribution, df = 1..30, as
# printed in standard tables (e.g. NIST/SEMATECH e-Handbook of Statistical Methods,
# section 1.3.6.7.2, "Critical values of the Student's t distribution").
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
        17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
        25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042}


# One-sided 80% quantiles t_{0.80, df} (same tables), for the smallest difference a paired
# t test at the 5% level detects with 80% power; beyond df = 30 the normal quantile 0.8416.
T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883,
       10: 0.879, 11: 0.876, 12: 0.873, 13: 0.870, 14: 0.868, 15: 0.866, 16: 0.865, 17: 0.863,
       18: 0.862, 19: 0.861, 20: 0.860, 21: 0.859, 22: 0.858, 23: 0.858, 24: 0.857, 25: 0.856,
       26: 0.856, 27: 0.855, 28: 0.855, 29: 0.854, 30: 0.854}


def t975_expansion(df: float) -> float:
    """The asymptotic (Cornish-Fisher) expansion of the t quantile in powers of 1/df around
    the normal quantile z = 1.959964 (Abramowitz & Stegun 26.7.5); within 1e-3 of the
    table from df = 10, used beyond df = 30."""
    z = 1.959963985
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least 2 values (df >= 1)")
    return T975[df] if df in T975 else t975_expansion(df)


def mean_ci(values) -> dict:
    """Mean and 95% t interval: mean +- t_{0.975, n-1} * s / sqrt(n). With one value the
    interval is undefined (None)."""
    x = np.asarray(list(values), dtype=float)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "half": None, "lo": None, "hi": None}
    m = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": m, "sd": None, "half": None, "lo": None, "hi": None}
    sd = float(x.std(ddof=1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "sd": sd, "half": half, "lo": m - half, "hi": m + half}


def detectable(sd: float | None, n: int) -> float | None:
    """The smallest true paired difference that a two-sided paired t test at the 5% level
    detects with 80% power, for n pairs whose differences have standard deviation sd:
    (t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n) (the usual planning approximation, sd
    taken as known)."""
    if sd is None or n < 2:
        return None
    df = n - 1
    return (t975(df) + T80.get(df, 0.8416)) * sd / math.sqrt(n)


def paired_diff(a_by_seed: dict, b_by_seed: dict) -> dict:
    """a - b on the seeds both have: mean, paired t interval, and the relative change
    (mean difference / mean of b on those seeds; its interval divides the paired interval
    by that mean, which is treated as fixed). excludes_zero: None with fewer than 2 pairs.
    mde80: the difference these seeds could detect (`detectable`)."""
    seeds = sorted(set(a_by_seed) & set(b_by_seed))
    d = mean_ci([a_by_seed[s] - b_by_seed[s] for s in seeds])
    d["mde80"] = detectable(d["sd"], d["n"])
    base = float(np.mean([b_by_seed[s] for s in seeds])) if seeds else None
    rel = lambda v: (v / base) if (v is not None and base) else None   # noqa: E731
    excl = None if d["lo"] is None else bool(d["lo"] > 0 or d["hi"] < 0)
    return {**d, "seeds": seeds, "base_mean": base, "rel": rel(d["mean"]), "rel_lo": rel(d["lo"]),
            "rel_hi": rel(d["hi"]), "excludes_zero": excl}


# =======================================================================================
# 5. Aggregation: finished run directories -> one JSON
# =======================================================================================

def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _size_mean(report: dict, key: str, sizes=None) -> float:
    """Mean over the sizes of an evaluation report (evaluate.py) of one per-size field."""
    return float(np.mean([v.get(key, 0.0) for n, v in report["per_size"].items()
                          if sizes is None or int(n) in sizes]))


def read_run(run_dir) -> dict:
    """One finished run: its variant, seed, config, per-size final accuracy, curves, times."""
    run_dir = Path(run_dir)
    cfg = json.loads((run_dir / "run.json").read_text())["config"]
    ev = json.loads((run_dir / "eval_final.json").read_text())
    acc = {int(n): float(v["accuracy"]) for n, v in ev["per_size"].items()}
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    hfile = run_dir / HELDOUT_FILE
    heldout = float(json.loads(hfile.read_text())["overall"]["accuracy"]) if hfile.exists() else None
    tfile = run_dir / "study_time.json"
    if tfile.exists():
        wall = json.loads(tfile.read_text())["wall_s"]
    else:                                        # a run made outside the study
        wall = sum(m.get("step_s", 0.0) for m in metrics) + float(ev.get("seconds", 0.0))
    return {"dir": str(run_dir), "preset": cfg.get("preset", "?"), "variant": Variant.from_config(cfg),
            "seed": int(cfg["seed"]), "config": cfg, "setting": setting_key(cfg),
            "accuracy": acc, "avg": float(np.mean(list(acc.values()))),
            "format_error": _size_mean(ev, "format_error"), "truncated": _size_mean(ev, "truncated"),
            "tokens": _size_mean(ev, "mean_tokens"),
            "metrics": metrics, "eval_s": float(ev.get("seconds", 0.0)), "wall_s": float(wall),
            "heldout": heldout, **selection(metrics)}


SELECT_AT = 0.8          # "the behaviour is selected": derivations are >= 80% of the samples


def selection(metrics: list[dict]) -> dict:
    """How fast RL selects the derivations (behaviours.py), from one run's metrics:
    steps_to_80 = the first step whose samples are >= 80% derivations (a run that never
    gets there counts as steps + 1, so a slower method never looks faster), derive_auc =
    the area under the share-of-derivations curve per step (its mean over the steps: 1 =
    derivations from the first step on), and train_truncated = the mean share of samples
    cut at the response cap."""
    ds = [m["derive_share"] for m in metrics if "derive_share" in m]
    if not ds:
        return {"steps_to_80": None, "derive_auc": None, "train_truncated": None}
    hit = next((i + 1 for i, v in enumerate(ds) if v >= SELECT_AT), len(ds) + 1)
    return {"steps_to_80": float(hit), "derive_auc": float(np.mean(ds)),
            "train_truncated": float(np.mean([m.get("truncated", 0.0) for m in metrics]))}


def find_runs(out) -> tuple[list[Path], list[Path]]:
    """(finished, unfinished) run directories under OUT."""
    done, open_ = [], []
    for rj in sorted(Path(out).rglob("run.json")):
        d = rj.parent
        if runs.is_run_dir(d):
            (done if (d / "eval_final.json").exists() else open_).append(d)
    return done, open_


def curve_stats(runs: list[dict], key: str, window: int) -> dict:
    """Per step, over seeds: mean and 95% t band of the per-seed moving average of ``key``."""
    from .plots import moving_average
    series = [[m[key] for m in r["metrics"] if key in m] for r in runs]
    T = min((len(s) for s in series), default=0)
    if T == 0:
        return {"step": [], "mean": [], "lo": [], "hi": []}
    Y = np.array([moving_average(s[:T], window) for s in series])
    mean = Y.mean(0)
    if len(Y) > 1:
        half = t975(len(Y) - 1) * Y.std(0, ddof=1) / math.sqrt(len(Y))
        lo, hi = mean - half, mean + half
    else:
        lo = hi = mean
    steps = [m["step"] for m in runs[0]["metrics"][:T]]
    r6 = lambda a: [round(float(v), 6) for v in a]     # noqa: E731
    return {"step": steps, "mean": r6(mean), "lo": r6(lo), "hi": r6(hi)}


def _variant_rank(v: Variant) -> tuple:
    """Report order: the grids' order (main first), then anything else by name."""
    known = list(dict.fromkeys(x for g in GRIDS.values() for x in g))
    return (known.index(v), "") if v in known else (len(known), v.name)


SELECTION_KEYS = ("heldout", "steps_to_80", "derive_auc", "train_truncated")
CURVE_KEYS = ("reward", "accuracy", "derive_share")


def grid_table(groups: dict, grid: str, sizes: list[int], window: int) -> dict | None:
    """The balanced table of one grid: only the seeds that *every* variant of the grid
    with finished runs has, so each row (GRPO's included) averages the same seeds and
    every difference is paired on all of them."""
    names = [v for v in GRIDS[grid] if v in groups]
    if not names:
        return None
    seeds = sorted(set.intersection(*({r["seed"] for r in groups[v]} for v in names)))
    rows = {}
    for v in names:
        vr = [r for r in groups[v] if r["seed"] in seeds]
        acc = {str(n): mean_ci([r["accuracy"][n] for r in vr]) for n in sizes}
        acc["avg"] = mean_ci([r["avg"] for r in vr])
        vs = None
        if GRPO in names and v != GRPO and vr:
            base = {r["seed"]: r for r in groups[GRPO] if r["seed"] in seeds}
            vs = {str(n): paired_diff({r["seed"]: r["accuracy"][n] for r in vr},
                                      {s: b["accuracy"][n] for s, b in base.items()}) for n in sizes}
            vs["avg"] = paired_diff({r["seed"]: r["avg"] for r in vr}, {s: b["avg"] for s, b in base.items()})
        fmt = {"mean": mean_ci([r["format_error"] for r in vr]), "vs_grpo": None,
               "truncated": mean_ci([r["truncated"] for r in vr]),
               "tokens": mean_ci([r["tokens"] for r in vr]), "tokens_vs_grpo": None}
        if vs is not None:
            for k, key in (("vs_grpo", "format_error"), ("tokens_vs_grpo", "tokens")):
                fmt[k] = paired_diff({r["seed"]: r[key] for r in vr}, {s: b[key] for s, b in base.items()})
        sel = {}
        for key in SELECTION_KEYS:
            have = [r for r in vr if r.get(key) is not None]
            if not have:
                continue
            sel[key] = {"mean": mean_ci([r[key] for r in have]), "vs_grpo": None}
            if vs is not None:
                sel[key]["vs_grpo"] = paired_diff({r["seed"]: r[key] for r in have},
                                                  {s: b[key] for s, b in base.items() if b.get(key) is not None})
        rows[v.name] = {"label": v.label, "method": v.method, "n": len(vr), "accuracy": acc, "vs_grpo": vs,
                        "format_error": fmt, "selection": sel,
                        "curves": {k: curve_stats(vr, k, window) for k in CURVE_KEYS} if vr else None}
    return {"seeds": seeds, "rows": rows}


def aggregate(out, window: int = 5) -> dict:
    """Everything the report needs, from the run directories under OUT (JSON-ready)."""
    out = Path(out)
    done, unfinished = find_runs(out)
    runs = [read_run(d) for d in done]
    by_preset: dict[str, list[dict]] = {}
    for r in runs:
        by_preset.setdefault(r["preset"], []).append(r)
    study = json.loads((out / "study.json").read_text()) if (out / "study.json").exists() else {"presets": {}}
    shown = os.path.relpath(out, ROOT) if out.resolve().is_relative_to(ROOT) else str(out)
    res = {"generated": _now(), "out": shown, "presets": {}, "unfinished": [str(d) for d in unfinished],
           "invocations": _read_jsonl(out / "study_log.jsonl"), "window": window}
    for preset, rs in sorted(by_preset.items()):
        # The setting all runs must share: the one of the GRPO runs, else the commonest.
        keys = Counter(r["setting"] for r in rs if r["variant"] == GRPO) or Counter(r["setting"] for r in rs)
        ref = keys.most_common(1)[0][0]
        kept = [r for r in rs if r["setting"] == ref]
        ref_cfg = kept[0]["config"]
        excluded = [{"dir": r["dir"], "differs_in": config_diff(r["config"], ref_cfg,
                                                                RUNTIME_FIELDS | VARIANT_FIELDS)}
                    for r in rs if r["setting"] != ref]
        sizes = sorted(set.intersection(*(set(r["accuracy"]) for r in kept)))
        groups: dict[Variant, list[dict]] = {}
        for r in sorted(kept, key=lambda r: r["seed"]):
            groups.setdefault(r["variant"], []).append(r)
        variants = {}
        for v, vr in sorted(groups.items(), key=lambda kv: _variant_rank(kv[0])):
            mean_of = lambda key: float(np.mean([np.mean([m.get(key, 0.0) for m in r["metrics"]] or [0.0])  # noqa: E731
                                                 for r in vr]))
            acc = {str(n): mean_ci([r["accuracy"][n] for r in vr]) for n in sizes}
            acc["avg"] = mean_ci([r["avg"] for r in vr])
            variants[v.name] = {
                "label": v.label, "method": v.method, "alpha": v.alpha, "eta": v.eta, "order": v.order,
                "seeds": [r["seed"] for r in vr], "n": len(vr), "accuracy": acc,
                "per_seed": {str(r["seed"]): {**{str(n): r["accuracy"][n] for n in sizes}, "avg": r["avg"]}
                             for r in vr},
                "format_error": mean_ci([r["format_error"] for r in vr]),
                "timing": {"step_s": mean_of("step_s"), "sample_s": mean_of("sample_s"),
                           "update_s": mean_of("update_s"), "eval_s": float(np.mean([r["eval_s"] for r in vr])),
                           "run_wall_s": float(np.mean([r["wall_s"] for r in vr]))},
                "update_passes": (2 if v.method in ("lopti", "ar_lopti") else 1) * v.passes,
            }
        grids = {g: t for g in GRIDS if (t := grid_table(groups, g, sizes, window))}
        wpath = warm_start_eval_path(out, preset)
        warm = None
        if wpath.exists():
            wev = json.loads(wpath.read_text())
            wacc = {str(n): float(v["accuracy"]) for n, v in wev["per_size"].items() if int(n) in sizes}
            warm = {"accuracy": {**wacc, "avg": float(np.mean(list(wacc.values())))}, "model": wev.get("model"),
                    "format_error": _size_mean(wev, "format_error", sizes),
                    "truncated": _size_mean(wev, "truncated", sizes), "tokens": _size_mean(wev, "mean_tokens", sizes)}
            hpath = wpath.with_name("warm-start-heldout.json")
            if hpath.exists():
                warm["heldout"] = float(json.loads(hpath.read_text())["overall"]["accuracy"])
        P, G, S = ref_cfg["prompts_per_step"], ref_cfg["group_size"], ref_cfg["steps"]
        res["presets"][preset] = {
            "model": ref_cfg["model"], "fingerprint": study["presets"].get(preset, {}).get("fingerprint"),
            "sizes": sizes, "variants": variants, "grids": grids, "excluded": excluded, "warm_start": warm,
            "budget": {"steps": S, "prompts_per_step": P, "group_size": G, "responses_per_run": S * P * G,
                       "mini_batch_size": ref_cfg["mini_batch_size"],
                       "optimizer_steps_per_stage": math.ceil(P * G / ref_cfg["mini_batch_size"]),
                       "lr": ref_cfg["lr"], "max_new_tokens": ref_cfg["max_new_tokens"],
                       "rl_sizes": ref_cfg["rl_sizes"], "eval_per_size": ref_cfg["eval_per_size"],
                       "temperature": ref_cfg["temperature"]},
            "compute_s": float(sum(r["wall_s"] for r in rs)), "n_runs": len(rs),
        }
    return res


# =======================================================================================
# 6. Plots
# =======================================================================================

def plot_curves(table: dict, path, title: str, window: int) -> str:
    """Learning curves of a grid table: mean over its seeds with a 95% t band."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(16, 3.8))
    axes = fig.subplots(1, 3)
    for ax, key, lab in zip(axes, CURVE_KEYS, ("mean reward", "accuracy of sampled responses",
                                               "share of derivations among the samples")):
        for row in table["rows"].values():
            c = (row["curves"] or {}).get(key)
            if not c or not c["step"]:
                continue
            line, = ax.plot(c["step"], c["mean"], lw=2, label=row["label"])
            ax.fill_between(c["step"], c["lo"], c["hi"], color=line.get_color(), alpha=0.18, lw=0)
        ax.set_xlabel("RL step")
        ax.set_title(f"{lab} (moving avg {window})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}; mean over seeds {_seed_text(table['seeds'])}, 95% t band", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def plot_sizes(table: dict, sizes: list[int], path, title: str) -> str:
    """Final accuracy per size and avg of a grid table, with 95% t error bars."""
    from matplotlib.figure import Figure
    cols = [str(n) for n in sizes] + ["avg"]
    x = np.arange(len(cols))
    rows = list(table["rows"].values())
    w = 0.8 / max(len(rows), 1)
    fig = Figure(figsize=(1.3 * len(cols) + 3, 3.8))
    ax = fig.subplots()
    for i, row in enumerate(rows):
        m = [row["accuracy"][c]["mean"] for c in cols]
        h = [row["accuracy"][c]["half"] or 0.0 for c in cols]
        ax.bar(x + (i - (len(rows) - 1) / 2) * w, m, w, yerr=h, capsize=2, label=row["label"])
    ax.set_xticks(x, [f"{c} people" if c != "avg" else "avg" for c in cols])
    ax.set_ylabel("greedy accuracy (official sets)")
    ax.set_title(f"{title}; seeds {_seed_text(table['seeds'])}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


# =======================================================================================
# 7. The report (markdown)
# =======================================================================================

def _seed_text(seeds) -> str:
    seeds = list(seeds)
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds)) or "none"


def _cell(s: dict, digits: int = 3) -> str:
    if s["mean"] is None:
        return "–"
    return f"{s['mean']:.{digits}f}" + (f" ± {s['half']:.{digits}f}" if s["half"] is not None else "")


def _diff_cell(d: dict | None, digits: int = 3) -> str:
    if not d or d["mean"] is None:
        return "–"
    if d["lo"] is None:
        return f"{d['mean']:+.{digits}f} (n={d['n']})"
    star = " *" if d["excludes_zero"] else ""
    return f"{d['mean']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]{star}"


def _rel_cell(d: dict | None) -> str:
    if not d or d["rel"] is None:
        return "–"
    if d["rel_lo"] is None:
        return f"{d['rel']:+.1%}"
    return f"{d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]"


def paper_rel(model: str, method: str) -> float:
    row = PAPER_KK[model]
    return row[method][-1] / row["grpo"][-1] - 1


def statement(row: dict) -> str:
    """The automatic, conservative sentence for one method vs GRPO (avg over sizes)."""
    d = (row.get("vs_grpo") or {}).get("avg")
    if not d or d["n"] == 0:
        return f"- **{row['label']}**: no finished GRPO run on the same seeds; no comparison."
    if d["lo"] is None:
        return (f"- **{row['label']}**: {d['n']} paired seed, too few for a confidence interval; "
                f"difference {d['mean']:+.3f}; no statement.")
    rel = f" ({d['rel']:+.1%})" if d["rel"] is not None else ""
    text = (f"- **{row['label']}**: mean accuracy over sizes {row['accuracy']['avg']['mean']:.3f} vs GRPO "
            f"{d['base_mean']:.3f} on the same {d['n']} seeds; difference {d['mean']:+.3f}{rel}, "
            f"paired 95% CI [{d['lo']:+.3f}, {d['hi']:+.3f}]")
    if d["excludes_zero"]:
        text += f" excludes 0: {'higher' if d['mean'] > 0 else 'lower'} than GRPO at this scale."
    else:
        text += " includes 0: no difference from GRPO detected at this scale"
        text += (f"; with {d['n']} seeds and this seed-to-seed spread, a true difference of about "
                 f"±{d['mde80']:.3f} would have been detected with 80% power." if d.get("mde80") else ".")
    if row["method"] != "grpo":
        text += (f" (Paper, one run each: {paper_rel('Qwen2.5-3B-Instruct', row['method']):+.1%} on 3B, "
                 f"{paper_rel('Qwen2.5-7B-Instruct-1M', row['method']):+.1%} on 7B.)")
    return text


def summary(rows: list[dict]) -> str | None:
    """How many methods are above / indistinguishable from / below GRPO (avg, paired CI)."""
    judged = [r["vs_grpo"]["avg"] for r in rows if r.get("vs_grpo") and r["vs_grpo"]["avg"]["excludes_zero"] is not None]
    if not judged:
        return None
    up = sum(d["excludes_zero"] and d["mean"] > 0 for d in judged)
    down = sum(d["excludes_zero"] and d["mean"] < 0 for d in judged)
    return (f"Summary (computed): of {len(judged)} methods compared with GRPO, {up} score higher with a "
            f"paired 95% CI that excludes 0 (the direction of the paper's result), {len(judged) - up - down} "
            f"have a CI that includes 0, and {down} score lower with a CI that excludes 0. Each comparison "
            "is at the 5% level on its own; with several of them, one may exclude 0 by chance.")


def _variant_table(table: dict, sizes: list[int], warm: dict | None = None) -> list[str]:
    sz = [str(n) for n in sizes]
    lines = ["| method | " + " | ".join(f"{s} people" for s in sz) + " | avg | Δ avg vs GRPO [paired 95% CI] | relative |",
             "|" + "---|" * (len(sz) + 4)]
    if warm:            # one greedy evaluation, no seeds: a plain value
        lines.append("| warm start (no RL) | " + " | ".join(f"{warm['accuracy'][s]:.3f}" for s in sz)
                     + f" | {warm['accuracy']['avg']:.3f} | | |")
    for row in table["rows"].values():
        d = (row.get("vs_grpo") or {}).get("avg")
        lines.append(f"| {row['label']} | " + " | ".join(_cell(row["accuracy"][s]) for s in sz)
                     + f" | {_cell(row['accuracy']['avg'])} | {_diff_cell(d)} | {_rel_cell(d)} |")
    return lines


def _diff_table(table: dict, sizes: list[int]) -> list[str]:
    sz = [str(n) for n in sizes]
    lines = ["| method | " + " | ".join(f"{s} people" for s in sz) + " | avg |", "|" + "---|" * (len(sz) + 2)]
    for row in table["rows"].values():
        if row.get("vs_grpo"):
            lines.append(f"| {row['label']} | " + " | ".join(_diff_cell(row["vs_grpo"][s]) for s in sz + ["avg"]) + " |")
    return lines if len(lines) > 2 else []


def _format_table(table: dict, warm: dict | None) -> list[str]:
    """Format errors (responses without a well-formed answer block), how many of them hit
    the response budget, and the response length, means over the sizes of each run's
    final evaluation: what RL changes first in a small model."""
    lines = ["| method | format errors | Δ vs GRPO [paired 95% CI] | truncated at the budget | "
             "response tokens | Δ tokens vs GRPO [paired 95% CI] |", "|---|---|---|---|---|---|"]
    if warm and "format_error" in warm:
        lines.append(f"| warm start (no RL) | {warm['format_error']:.3f} | | {warm['truncated']:.3f} | "
                     f"{warm['tokens']:.0f} | |")
    for row in table["rows"].values():
        f = row.get("format_error")
        if f:
            lines.append(f"| {row['label']} | {_cell(f['mean'])} | {_diff_cell(f['vs_grpo'])} | "
                         f"{_cell(f['truncated'])} | {_cell(f['tokens'], 0)} | "
                         f"{_diff_cell(f['tokens_vs_grpo'], 0)} |")
    return lines


SELECTION_COLS = (("heldout", "held-out accuracy", 3), ("steps_to_80", "steps to 80% derivations", 1),
                  ("derive_auc", "derivation share AUC", 3), ("train_truncated", "sampled cut at the cap", 3))


def _selection_table(table: dict, warm: dict | None) -> list[str]:
    cols = [c for c in SELECTION_COLS if any(c[0] in r.get("selection", {}) for r in table["rows"].values())]
    if not cols:
        return []
    lines = ["| method | " + " | ".join(f"{t} | Δ vs GRPO" for _, t, _ in cols) + " |",
             "|---|" + "---|---|" * len(cols)]
    if warm and warm.get("heldout") is not None and cols[0][0] == "heldout":
        lines.append(f"| warm start (no RL) | {warm['heldout']:.3f} | |" + " | |" * (len(cols) - 1))
    for row in table["rows"].values():
        cells = []
        for key, _, dg in cols:
            c = row.get("selection", {}).get(key)
            cells += [_cell(c["mean"], dg) if c else "–", _diff_cell(c["vs_grpo"], dg) if c else "–"]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return lines


def _beside_paper(table: dict) -> list[str]:
    lines = ["| method | ours: avg | ours: relative to GRPO | paper 3B: avg | paper 3B: relative | "
             "paper 7B: avg | paper 7B: relative |", "|---|---|---|---|---|---|---|"]
    p3, p7 = "Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct-1M"
    for row in table["rows"].values():
        m = row["method"]
        d = (row.get("vs_grpo") or {}).get("avg")
        r3 = "" if m == "grpo" else f"{paper_rel(p3, m):+.1%}"
        r7 = "" if m == "grpo" else f"{paper_rel(p7, m):+.1%}"
        lines.append(f"| {row['label']} | {_cell(row['accuracy']['avg'])} | {_rel_cell(d)} | "
                     f"{PAPER_KK[p3][m][-1]:.2f} | {r3} | {PAPER_KK[p7][m][-1]:.2f} | {r7} |")
    return lines


def _paper_table() -> list[str]:
    lines = ["| model, method | 3 | 4 | 5 | 6 | 7 | avg | relative to GRPO |", "|---|---|---|---|---|---|---|---|"]
    labels = {"base": "base", "grpo": "GRPO", "ar": "GRPO+AR (α=0.2)", "lopti": "GRPO+Lopti (η=0.4)",
              "ar_lopti": "GRPO+AR+Lopti (α=0.3, η=0.5)"}
    for model, rows in PAPER_KK.items():
        for k, row in rows.items():
            rel = "" if k in ("base", "grpo") else f"{paper_rel(model, k):+.1%}"
            lines.append(f"| {model.split('-Instruct')[0]} {labels[k]} | " + " | ".join(f"{x:.2f}" for x in row)
                         + f" | {rel} |")
    return lines


def _hand_block(path: Path) -> str:
    default = ("\n_Interpretation, caveats and what to try next: written by hand, kept by "
               "`python -m lopti_minimal.study` when it regenerates this file._\n")
    if path.exists():
        text = path.read_text()
        if HAND_BEGIN in text and HAND_END in text:
            return text.split(HAND_BEGIN, 1)[1].split(HAND_END, 1)[0]
    return default


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


PROTOCOL = [
    "- Every method starts from the same warm start (its SHA-256 is given per preset) with the same "
    "seeds; a seed fixes the prompts of every step and the sampler's random stream, so runs with the "
    "same seed are paired (common random numbers).",
    "- **Equal budget**: the same RL steps x prompts per step x G sampled responses for every method. "
    "Lopti's second stage is a second optimizer pass over the *same* responses: counted as extra "
    "update compute (2 passes per batch instead of 1, see the cost table), not as extra samples.",
    "- Methods at the paper's K&K settings: AR alone α=0.2, Lopti alone η=0.4, AR+Lopti α=0.3, η=0.5. "
    "AR with α=0 is GRPO exactly, so the α=0 point of the sweep is the GRPO row.",
    "- Accuracy: share of the official test puzzles whose **greedy** response scores 3, from one "
    "evaluation at the end of each run (the paper averages its last three evaluations).",
    "- Each table uses only the seeds that all its rows have (said above it), so every row averages the "
    "same seeds. Cells: mean ± half-width of the 95% Student-t interval over seeds (n-1 degrees of "
    "freedom). Δ vs GRPO: mean of the per-seed differences with its paired 95% t interval; `*` marks an "
    "interval that excludes 0. Relative = Δ / GRPO mean (its interval treats the GRPO mean as fixed). "
    "No correction for multiple comparisons.",
]


def write_report(res: dict, path, figures_dir, plots: bool = True) -> str:
    """docs/RESULTS.md (or ``path``) from the aggregated results; figures into
    ``figures_dir``, linked relative to the report. The hand-written block is kept."""
    path, figures_dir = Path(path), Path(figures_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    hand = _hand_block(path)
    rel = lambda p: os.path.relpath(p, path.parent).replace(os.sep, "/")   # noqa: E731
    L = ["# Results: GRPO vs AR vs Lopti on Knights and Knaves, at small scale", "",
         f"_Generated by `python -m lopti_minimal.study` on {res['generated']} from the runs in "
         f"`{res['out']}`; regenerate with `python -m lopti_minimal.study --report-only`. "
         "Every number below is computed from those runs, except the paper's (from Yang et al. "
         "2025, arXiv 2505.12929, the K&K results table). Only the Discussion is written by hand._", "",
         "## Protocol", "", *PROTOCOL, ""]
    if not res["presets"]:
        L += ["## Status", "", "No finished runs yet. Run `python -m lopti_minimal.study` "
              "(`--help` for the options, `--dry-run` for the plan and a time estimate).", ""]
    for preset, pr in res["presets"].items():
        b, sizes = pr["budget"], pr["sizes"]
        L += [f"## Preset `{preset}`", "",
              f"Model `{pr['model']}` (warm start {pr['fingerprint'] or 'not recorded'}). Budget per run, the "
              f"same for every method: {b['steps']} RL steps x {b['prompts_per_step']} prompts x G={b['group_size']} "
              f"= **{b['responses_per_run']} sampled responses**; {b['optimizer_steps_per_stage']} optimizer "
              f"step(s) per update pass (mini-batch {b['mini_batch_size']}); lr {b['lr']:g}, T {b['temperature']}, "
              f"RL puzzles of {', '.join(map(str, b['rl_sizes']))} people, responses up to {b['max_new_tokens']} "
              f"tokens. Evaluation: {b['eval_per_size']} official puzzles per size, sizes "
              f"{', '.join(map(str, sizes))}.", ""]
        if pr["excluded"]:
            L += ["Left out (config differs from the other runs of this preset): " +
                  "; ".join(f"`{e['dir']}` ({', '.join(e['differs_in'])})" for e in pr["excluded"]), ""]
        main_names = set(pr["grids"].get("main", {}).get("rows", {}))
        for grid, table in pr["grids"].items():
            if grid != "main" and set(table["rows"]) <= main_names | {GRPO.name}:
                continue            # a sweep with no run of its own repeats the main table
            rows = list(table["rows"].values())
            L += [f"### {GRID_TITLES[grid]}", "", f"Seeds {_seed_text(table['seeds'])} "
                  f"(n = {len(table['seeds'])} per row)." + (" The first row is the starting policy, evaluated once "
                  "in the same way (`warm-start-eval.json`)." if grid == "main" and pr.get("warm_start") else ""),
                  ""] + _variant_table(table, sizes, pr.get("warm_start") if grid == "main" else None) + [""]
            dt = _diff_table(table, sizes)
            if dt:
                L += ["Difference from GRPO per size (paired by seed, 95% CI):", ""] + dt + [""]
            if grid == "main":
                comp = [r for r in rows if r["method"] != "grpo"]
                L += ["Against GRPO, on the average over sizes:", ""] + [statement(r) for r in comp] + [""]
                s = summary(comp)
                L += [s, ""] if s else []
            L += ["Format errors (share of greedy responses without a well-formed answer block; the "
                  "others are right or wrong answers), the share of responses cut at the response budget, "
                  "and the mean response length in tokens; means over sizes, same seeds:", ""]
            L += _format_table(table, pr.get("warm_start") if grid == "main" else None) + [""]
            st = _selection_table(table, pr.get("warm_start") if grid in ("main", "control") else None)
            if st:
                L += ["What RL selects, and accuracy on the held-out set (400 three-person puzzles outside "
                      "the official, RL and warm-start sets: `data/heldout3.jsonl`, greedy): steps until "
                      f"derivations are at least {SELECT_AT:.0%} of a step's samples (never = steps + 1), the "
                      "area under the share-of-derivations curve (mean share per step), and the share of "
                      "samples cut at the response cap during training; mean ± 95% t half-width over seeds, "
                      "and the paired difference from GRPO:", ""] + st + [""]
            if grid == "main":
                L += ["Beside the paper (its avg is over sizes 3..7; ours over the sizes above):", ""]
                L += _beside_paper(table) + [""]
            if plots:
                figures_dir.mkdir(parents=True, exist_ok=True)
                fc = plot_curves(table, figures_dir / f"study-{preset}-{grid}-curves.png",
                                 f"{preset}: {GRID_TITLES[grid]}", res["window"])
                L += [f"![learning curves, {grid}]({rel(fc)})", ""]
                if grid == "main":
                    fs = plot_sizes(table, sizes, figures_dir / f"study-{preset}-main-sizes.png",
                                    f"{preset}: final greedy accuracy, mean and 95% t interval")
                    L += [f"![accuracy per size]({rel(fs)})", ""]
        L += ["### Cost per method (means over all finished runs)", "",
              "| method | runs | update passes per batch | sampled responses per run | s per RL step "
              "| of which sampling | of which update | final evaluation s | run wall time |",
              "|---|---|---|---|---|---|---|---|---|"]
        for v in pr["variants"].values():
            t = v["timing"]
            L.append(f"| {v['label']} | {v['n']} | {v['update_passes']} | {b['responses_per_run']} | "
                     f"{t['step_s']:.1f} | {t['sample_s']:.1f} | {t['update_s']:.1f} | {t['eval_s']:.0f} | "
                     f"{_hours(t['run_wall_s'])} |")
        L += ["", f"Compute of this preset: {pr['n_runs']} finished runs, {_hours(pr['compute_s'])} of run "
              "wall time in total.", ""]
    L += ["## The paper's K&K table", "", "From Yang et al. 2025, the K&K results table (one run per "
          "method, 4 x 80 GB GPUs, 64 prompts x 8 responses per step, ~350 steps; accuracy = mean of the "
          "last three evaluations):", ""] + _paper_table() + [""]
    inv = res["invocations"]
    L += ["## Time and machine", ""]
    if inv:
        L.append(f"- Study wall time: {_hours(sum(i['wall_s'] for i in inv))} over {len(inv)} invocation(s) "
                 f"of `python -m lopti_minimal.study`, from {inv[0]['start']} to {inv[-1]['end']}.")
        for m in sorted({json.dumps(i["machine"], sort_keys=True) for i in inv if i.get("machine")}):
            m = json.loads(m)
            L.append(f"- Machine: {m['cpu']}, {m['cores']} cores" + (f", GPU {m['gpu']}" if m.get("gpu") else "")
                     + f"; Python {m['python']}, torch {m['torch']}.")
        cmds = dict.fromkeys(" ".join(["python -m lopti_minimal.study", *(i.get("argv") or [])]) for i in inv)
        L.append("- Commands: " + "; ".join(f"`{c}`" for c in cmds))
        par = sorted({(i.get("jobs"), i.get("threads") or 0) for i in inv})
        L.append("- Parallelism (runs at once, torch threads per run; 0 = torch's default): "
                 + ", ".join(f"({j}, {t})" for j, t in par))
    else:
        L.append("- No study invocation recorded yet.")
    if res["unfinished"]:
        L.append(f"- Unfinished runs (the same command resumes them): {len(res['unfinished'])}.")
    L += ["", "## Discussion", "", HAND_BEGIN + hand + HAND_END, ""]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(L))
    os.replace(tmp, path)
    return str(path)


# =======================================================================================
# 8. Time estimate and command line
# =======================================================================================

def estimate(todo: list[tuple[RunSpec, object, str]], out, step_seconds=None, eval_seconds=None,
             jobs: int = 1) -> str:
    """Rough time to finish ``todo``: per variant (else per method), the mean wall time of
    its finished runs (resumed runs pro rata); else steps x --step-seconds (x 1.15 per
    extra update pass) + --eval-seconds. With jobs > 1 the sum is divided by jobs: right
    when the finished runs' wall times were measured with as many runs at once."""
    done, _ = find_runs(out)
    by_name: dict[tuple, list[float]] = {}
    by_method: dict[tuple, list[float]] = {}
    for d in done:
        r = read_run(d)
        by_name.setdefault((r["preset"], r["variant"].name), []).append(r["wall_s"])
        by_method.setdefault((r["preset"], r["variant"].method), []).append(r["wall_s"])
    total, unknown = 0.0, 0
    for spec, cfg, status in todo:
        passes = (2 if spec.variant.method in ("lopti", "ar_lopti") else 1) * spec.variant.passes
        known = by_name.get((spec.preset, spec.variant.name)) or by_method.get((spec.preset, spec.variant.method)) \
            or [w for (p, _), ws in by_method.items() if p == spec.preset for w in ws]
        if known:
            est = float(np.mean(known))
        elif step_seconds:
            est = cfg.steps * step_seconds * 1.15 ** (passes - 1) + (eval_seconds or 0.0)
        else:
            unknown += 1
            continue
        if status == "resume":
            ck = runs.checkpoints(cfg.run_dir)
            est *= 1 - (ck[-1][0] / cfg.steps if ck else 0.0)
        total += est
    if unknown == len(todo) and todo:
        return "no estimate yet (finish one run, or pass --step-seconds S [--eval-seconds E])"
    s = f"about {_hours(total)} for {len(todo) - unknown} run(s) at one run at a time"
    if jobs > 1:
        s += f" (about {_hours(total / jobs)} with --jobs {jobs})"
    return s + (f", {unknown} without an estimate" if unknown else "")


def parse_set(items) -> dict:
    """--set KEY=VALUE: VALUE is JSON if it parses (numbers, lists), else a string."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise StudyError(f"--set {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        k = k.strip().replace("-", "_")
        try:
            v = json.loads(v)
        except ValueError:
            pass
        out[k] = tuple(v) if isinstance(v, list) else v
    return out


def build_overrides(a) -> dict:
    o = {"steps": a.steps, "prompts_per_step": a.prompts_per_step, "group_size": a.group_size, "lr": a.lr,
         "max_new_tokens": a.max_new_tokens, "model": a.model, "eval_per_size": a.eval_per_size,
         "save_every": a.save_every,
         "eval_sizes": tuple(int(s) for s in a.eval_sizes.split(",")) if a.eval_sizes else None}
    o = {k: v for k, v in o.items() if v is not None}
    o.update(parse_set(a.set))
    bad = (VARIANT_FIELDS | RUNTIME_FIELDS | {"final_eval"}) & set(o)
    if bad:
        raise StudyError(f"--set cannot change {', '.join(sorted(bad))}: the study sets these per run")
    return o


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m lopti_minimal.study",
        description="GRPO / AR / Lopti / AR+Lopti from one warm start, equal budgets, several seeds; "
                    "writes docs/RESULTS.md.", formatter_class=HelpFormatter)
    ap.add_argument("--grid", nargs="+", default=["main", "control"], help=f"grids: {', '.join(GRIDS)}, all")
    ap.add_argument("--heldout", default=DEFAULT_HELDOUT,
                    help="K&K file every run's final policy is also evaluated on ('' for none)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 of the main grid")
    ap.add_argument("--sweep-seeds", type=int, default=3, help="seeds 0..N-1 of the sweeps")
    ap.add_argument("--only", help="comma-separated methods or variant names to keep (e.g. grpo,ar_lopti)")
    ap.add_argument("--preset", default="cpu-tiny", help=f"one of: {', '.join(trainer.PRESETS)}")
    ap.add_argument("--steps", type=int, help="RL steps of every run (preset default otherwise)")
    ap.add_argument("--prompts-per-step", type=int)
    ap.add_argument("--group-size", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--model", help="warm start (default: the preset's)")
    ap.add_argument("--eval-sizes", help="comma-separated official sizes to evaluate (default: the preset's)")
    ap.add_argument("--eval-per-size", type=int)
    ap.add_argument("--save-every", type=int, help="checkpoint every N steps (what a crash can lose)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="any other TrainConfig field, for all runs")
    ap.add_argument("--out", default=DEFAULT_OUT, help="study folder: OUT/<preset>/<variant>-s<seed>/")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (separate processes)")
    ap.add_argument("--threads", type=int, help="torch threads per run (default: cores / jobs)")
    ap.add_argument("--report", default=DEFAULT_REPORT, help="markdown report to (re)write")
    ap.add_argument("--figures", default=DEFAULT_FIGURES, help="folder for the report's figures")
    ap.add_argument("--window", type=int, default=5, help="moving-average window of the learning curves")
    ap.add_argument("--report-only", action="store_true", help="no training: aggregate and rewrite the report")
    ap.add_argument("--no-report", action="store_true", help="train only")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and a time estimate, run nothing")
    ap.add_argument("--step-seconds", type=float, help="for --dry-run before any run finished: s per RL step")
    ap.add_argument("--eval-seconds", type=float, help="for --dry-run: s per final evaluation")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def _abs(p: str) -> Path:
    return Path(p) if os.path.isabs(p) else ROOT / p


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt     # a `kill` stops the study like Ctrl-C: invocation logged, nothing queued starts


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    _quiet_transformers()
    out = _abs(a.out)
    try:
        if not a.report_only:
            overrides = build_overrides(a)
            only = set(a.only.split(",")) if a.only else None
            specs = plan_runs(a.grid, a.seeds, a.sweep_seeds, a.preset, only)
            specs, dropped = _supported(specs, out, overrides)
            if dropped:
                print(f"[study] skipped {len(dropped)} run(s) of variants the trainer cannot run: {dropped[0]}",
                      file=sys.stderr)
            if a.dry_run:
                return _dry_run(specs, out, overrides, a)
            r = run_study(specs, out, overrides, jobs=a.jobs, threads=a.threads, progress=not a.no_progress,
                          argv=argv, eval_warm_start=True, heldout=a.heldout or None)
            print(f"[study] this invocation: {_hours(r['wall_s'])}; ran {len(r['done'])}, "
                  f"skipped {len(r['skipped'])}, failed {len(r['failed'])}")
        if not a.no_report:
            res = aggregate(out, a.window)
            out.mkdir(parents=True, exist_ok=True)
            _write_json(out / "study_results.json", res)
            print(f"[study] report: {write_report(res, _abs(a.report), _abs(a.figures))} "
                  f"(aggregate: {out / 'study_results.json'})")
    except (StudyError, TrainError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume the study", file=sys.stderr)
        return 130
    return 1 if not a.report_only and r["failed"] else 0


def _supported(specs, out, overrides):
    """Drop runs whose variant the trainer cannot express (high-first Lopti needs
    TrainConfig.lopti_order); every other config error is raised."""
    keep, dropped = [], []
    for s in specs:
        try:
            run_config(s, out, overrides)
            keep.append(s)
        except TrainError as e:
            if "lopti_order" not in str(e):
                raise
            dropped.append(f"{s.variant.name}-s{s.seed} ({e})")
    return keep, dropped


def _dry_run(specs, out, overrides, a) -> int:
    rows = []
    for s in specs:
        cfg = run_config(s, out, overrides, a.threads)
        status = run_status(cfg.run_dir)
        if status != "new":
            check_existing(cfg.run_dir, cfg)
        rows.append((s, cfg, status))
    print(f"{'grid':6} {'run':40} status")
    for s, cfg, status in rows:
        print(f"{s.grid:6} {s.preset + '/' + s.variant.name + '-s' + str(s.seed):40} {status}")
    cfg0 = rows[0][1] if rows else None
    if cfg0:
        print(f"budget per run: {cfg0.steps} steps x {cfg0.prompts_per_step} prompts x G={cfg0.group_size} = "
              f"{cfg0.steps * cfg0.prompts_per_step * cfg0.group_size} sampled responses (every method)")
    todo = [r for r in rows if r[2] != "done"]
    print(f"{len(rows)} runs, {len(todo)} to do: " + estimate(todo, out, a.step_seconds, a.eval_seconds, a.jobs))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    sys.exit(main())
