"""RL on Knights & Knaves with GRPO, Advantage Reweighting and Lopti -- end to end.

    python train.py                      # the embedded default: CPU, tiny model, GRPO+AR+Lopti
    python train.py --method grpo        # the baseline, same budget
    python train.py --preset ci          # every part in under a minute
    python train.py --preset qwen2.5-1.5b --model Qwen/Qwen2.5-1.5B-Instruct   # one 24 GB GPU
    python train.py --resume runs/<run>  # continue an interrupted run exactly

Design choices (Yang et al. 2025, arXiv 2505.12929; in full: docs/ARCHITECTURE.md):

1. Prompts: generated RL puzzles, the official test puzzles excluded, cached under cache/
   so every run and seed sees the same set (--data FILE: your own K&K JSONL).
2. Policy: the shipped warm start checkpoints/tiny-warm, which guesses or derives: RL needs
   a policy that is sometimes right and a behaviour to select (task/behaviours.py).
   --rebuild-warmstart re-creates it; --model takes any causal LM.
3. The reference policy for the KL term is a frozen copy of the initial policy.
4. Each step: G responses per prompt, the Logic-RL reward, group advantages, AR (paper
   Eq. 4), Lopti (Algorithm 1); --method picks grpo | ar | lopti | ar_lopti.
5. Every random draw of a step is seeded by (seed, step), so --resume is exact; checkpoints
   are Hugging Face folders written atomically.
6. The end: greedy evaluation on the official 3..7-person sets (the paper's metric).
7. bf16 autocast on float32 master weights; cpu-tiny deviates from the paper's
   hyperparameters only where it must (config.py says which and why).

Bad input (unknown method, any number outside its range -- alpha outside [0, 1], top-p
outside (0, 1], an infinite lr: config.RANGES --, unreadable data or model, a --resume
directory that is not a run, a checkpoint whose trainer_state.pt is not plain data:
runs.read_state; a resume that would shrink the run, or whose data changed) prints one line
and exits with code 2 before anything is written. A
non-finite reward, advantage, loss or gradient norm during the run updates nothing: by
default the run stops with one line that names it and its step, exit code 3, its last
checkpoint good (--resume continues from it); --on-nonfinite skip skips such updates
(precision.py, choice 7).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from lopti_minimal.cli import HelpFormatter, one_line_error


def parse_args(argv=None):
    """The run's options come from TrainConfig's fields (config.add_options: one declaration
    per option, its default and help in config.py); the ones below are about the command."""
    from lopti_minimal.config import PRESETS, add_options
    ap = argparse.ArgumentParser(description="GRPO / AR / Lopti RL on Knights & Knaves.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--preset", help=f"one of: {', '.join(PRESETS)} (default: cpu-tiny)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue this run after its latest checkpoint")
    ap.add_argument("--allow-changed-data", action="store_true",
                    help="with --resume: go on although the RL data file changed since the run began "
                         "(recorded in run.json)")
    ap.add_argument("--rebuild-warmstart", action="store_true",
                    help="re-create checkpoints/tiny-warm by supervised warm start first (run "
                         "again after an interruption: it goes on where it stopped)")
    # = experiments.warmstart.STAGE1_STEPS (a test checks it); a literal keeps --help free of
    # the torch import
    ap.add_argument("--warmstart-minutes", type=float, default=None,
                    help="bound stage 1 of --rebuild-warmstart by minutes instead of its 14,082 steps "
                         "(about 2.7 hours on a 2-core AMD EPYC; fewer minutes: a weaker warm start)")
    add_options(ap.add_argument_group("run options (preset values unless given)"))
    ap.error = one_line_error
    a = ap.parse_args(argv)
    from lopti_minimal.config import Range, TrainError, check_range
    try:        # the run options are checked by config.validate; these are the command's
        check_range("warmstart-minutes", a.warmstart_minutes, Range(0, ends="()"))
        check_command(a)
    except TrainError as e:
        ap.error(str(e))
    return a


def check_command(a) -> None:
    """Options of the command that do nothing together are refused, not dropped: a resume
    continues its run where it is, with its own preset and warm start."""
    from lopti_minimal.config import TrainError
    if a.warmstart_minutes is not None and not a.rebuild_warmstart:
        raise TrainError("--warmstart-minutes bounds --rebuild-warmstart: give both, or neither")
    if a.allow_changed_data and not a.resume:
        raise TrainError("--allow-changed-data is for --resume (a new run records its data)")
    if a.resume:
        if a.rebuild_warmstart:
            raise TrainError("--rebuild-warmstart makes a new warm start; --resume continues a run "
                             "from its own: run them apart")
        if a.run_dir is not None and os.path.abspath(a.run_dir) != os.path.abspath(a.resume):
            raise TrainError(f"--resume {a.resume} continues in its own folder; --run-dir {a.run_dir} "
                             "would be ignored (copy the folder first to continue it elsewhere)")


def build_config(a):
    """The TrainConfig of the command line: a preset, then the options given."""
    from lopti_minimal.config import TrainError, make_config, overrides
    from lopti_minimal.plumbing import resume_config
    if a.resume:
        cfg = resume_config(a.resume, steps=a.steps, progress=a.progress is not False,
                            on_nonfinite=a.on_nonfinite, threads=a.threads)
        refuse_changes_on_resume(cfg, overrides(a))
        if a.preset is not None and a.preset != cfg.preset:
            raise TrainError(f"--resume continues {cfg.run_dir} as it was saved; --preset {a.preset} "
                             f"(saved: {cfg.preset}) would change it: start a new run (--run-dir) to change it")
        return cfg
    return make_config(a.preset or "cpu-tiny", **overrides(a))


# What --resume may set: the run's length and how it runs here, none of which changes a step.
RESUME_MAY_SET = {"steps", "progress", "on_nonfinite", "threads", "run_dir"}


def refuse_changes_on_resume(cfg, given: dict) -> None:
    """--resume continues the run as it was saved (exactly: plumbing.py, choice 1); an option
    that would change it (another lr, budget, method ...) is refused in one line, never
    silently ignored. An option equal to the saved value is fine (scripts repeat theirs)."""
    import json
    from lopti_minimal.config import TrainError

    def same(x, y) -> bool:
        return json.dumps(x, sort_keys=True, default=str) == json.dumps(y, sort_keys=True, default=str)

    changed = [k for k, v in given.items() if k not in RESUME_MAY_SET and not same(v, getattr(cfg, k))]
    if changed:
        opts = ", ".join(f"--{k.replace('_', '-')} {given[k]} (saved: {getattr(cfg, k)})" for k in changed)
        raise TrainError(f"--resume continues {cfg.run_dir} as it was saved; {opts} would change it: "
                         "start a new run (--run-dir) to change it")


def ensure_model(cfg, a) -> None:
    """The default policy is the shipped warm start; rebuild it on request, else say how."""
    from lopti_minimal.config import TrainError
    from lopti_minimal.paths import work_root
    ROOT = work_root()
    default = "checkpoints/tiny-warm"
    path = cfg.model if os.path.isabs(cfg.model) else str(ROOT / cfg.model)
    if a.rebuild_warmstart:
        if cfg.model != default and os.path.abspath(cfg.model) != str(ROOT / default):
            raise TrainError("--rebuild-warmstart rebuilds checkpoints/tiny-warm; do not combine it with --model")
        # the recipe: two stages (experiments/warmstart.py, recipe); asked for by name here
        from lopti_minimal.experiments import warmstart
        budget = ["--minutes", f"{a.warmstart_minutes:g}"] if a.warmstart_minutes else []
        warmstart.main(["--recipe", "--out", path, "--overwrite-shipped",
                        "--threads", str(a.threads or os.cpu_count())] + budget
                       + (["--no-progress"] if a.progress is False else []))
    elif cfg.model == default and not os.path.isfile(os.path.join(path, "config.json")):
        raise TrainError(f"{default} not found: run with --rebuild-warmstart (two warm-start runs: "
                         "14,082 steps, about 2.7 hours on 2 cores, then 10 minutes) "
                         "or pass --model PATH")


def _interrupt(signum, frame):
    raise KeyboardInterrupt      # a `kill` stops the run like Ctrl-C: one line, exit 130


def main(argv=None) -> int:
    a = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    from lopti_minimal.config import TrainError
    from lopti_minimal.run_guard import RunFinished
    from lopti_minimal.precision import NonFiniteError
    from lopti_minimal.trainer import train
    try:
        cfg = build_config(a)
        if not a.resume:
            ensure_model(cfg, a)
        result = train(cfg, resume=bool(a.resume), allow_changed_data=a.allow_changed_data)
    except RunFinished as e:             # nothing written, nothing redone
        print(e)
        return 0
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:          # the run stopped on a NaN; its last checkpoint is good
        print(f"error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("\ninterrupted: continue with  python train.py --resume <run dir>  "
              "(from the latest checkpoint)", file=sys.stderr)
        return 130
    except OSError as e:                 # a full disk, a lost mount: writes are atomic (runs.py)
        print(f"error: {e}; the run's latest complete checkpoint stands: free the space, then "
              "python train.py --resume <run dir>", file=sys.stderr)
        return 1
    p = result["paths"]
    print(f"\nDone. Everything is in {p['run_dir']}:")
    print(f"  config            {os.path.join(p['run_dir'], 'run.json')}")
    print(f"  per-step metrics  {p['metrics']}")
    print(f"  final policy      {p['final_model']}   (python eval.py --model {p['run_dir']})")
    if "eval" in p:
        from lopti_minimal.task.evaluate import format_table
        print(f"  evaluation        {p['eval']}")
        print(format_table(result["final_eval"]))
    for f in p.get("plots", []):
        print(f"  plot              {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
