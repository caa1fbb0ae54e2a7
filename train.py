"""RL on Knights & Knaves with GRPO, Advantage Reweighting and Lopti -- end to end.

    python train.py                      # the embedded default: CPU, tiny model, GRPO+AR+Lopti
    python train.py --method grpo        # the baseline, same budget
    python train.py --preset ci          # every part in under a minute
    python train.py --preset qwen2.5-1.5b --model Qwen/Qwen2.5-1.5B-Instruct   # one 24 GB GPU
    python train.py --resume runs/<run>  # continue an interrupted run exactly

What one run does, and why it is built this way (Yang et al. 2025, arXiv 2505.12929):

1. Prompts. RL puzzles are generated (3 people for the tiny model; the paper trains on
   3..7), with every puzzle of the official test sets excluded, and cached under cache/
   so every run and seed sees the same set. --data FILE trains on your own K&K JSONL.
2. Policy. The default policy is the shipped warm-start checkpoint checkpoints/tiny-warm:
   a 3.4M-parameter Llama trained from scratch (supervised) to do one of two things for
   each puzzle -- *guess* at once (usually) or *derive* the answer step by step
   (lopti_minimal/task/behaviours.py). RL needs a policy that is sometimes right -- a group
   whose G rewards are equal has advantage 0 and teaches nothing -- and it needs a
   behaviour to select: RL from checkpoints/tiny-derive, which always derives, does not
   raise accuracy (docs/RL_FROM_DERIVE.md). --rebuild-warmstart re-creates it (the
   README's recipe, warmstart.recipe(): 95 minutes from scratch, --warmstart-minutes, then
   10 minutes on the two behaviours). --model takes any causal LM instead: a folder, a hub
   id or a .gguf file.
3. The reference policy for the KL term is a frozen copy of the initial policy.
4. Each step samples G responses for each of a few prompts, scores them with the Logic-RL
   reward, turns the rewards into group advantages, reweights them by the old token
   probability (AR, paper Eq. 4) and updates low-probability tokens first, then the rest
   (Lopti, Algorithm 1). --method picks grpo | ar | lopti | ar_lopti.
5. Every random draw of a step is seeded by (seed, step): a run resumed from a checkpoint
   gives the same metrics as an uninterrupted one. Checkpoints are Hugging Face folders,
   written to a temporary name and renamed, every --save-every steps and at the end.
6. The end: greedy evaluation on the official 3..7-person sets (the paper's metric),
   a JSON report, plots, and the paths of everything written.

Speed on a CPU: the update runs under bf16 autocast (float32 master weights) -- about 4x
faster on CPUs with AMX/AVX-512-BF16 -- and the old log-probs are recomputed by the same
teacher-forced forward, so the first importance ratio is exactly 1. The hyperparameters
of cpu-tiny deviate from the paper's where a 3.4M-parameter model on 2 cores needs it;
lopti_minimal/trainer.py (TrainConfig) says which and why. GPU presets keep the paper's.

Bad input (unknown method, alpha outside [0, 1], eta outside (0, 1], group size < 2,
unreadable data or model, a --resume directory that is not a run) prints one line and
exits with code 2 before anything is written.
"""
from __future__ import annotations

import argparse
import os
import sys

from lopti_minimal.cli import HelpFormatter


def parse_rl_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rl-sizes takes people per puzzle like 3 or 3,4, not {text!r}")
    if not sizes or any(not 2 <= n <= 8 for n in sizes):
        raise argparse.ArgumentTypeError(f"--rl-sizes: each size must be 2..8, got {text!r}")
    return sizes


def parse_args(argv=None):
    from lopti_minimal.trainer import METHODS, PRESETS
    ap = argparse.ArgumentParser(description="GRPO / AR / Lopti RL on Knights & Knaves.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny", help=f"one of: {', '.join(PRESETS)}")
    ap.add_argument("--method", help=f"one of: {', '.join(METHODS)} (default ar_lopti)")
    ap.add_argument("--alpha", type=float, help="AR strength, paper Eq. 4, in [0, 1] (default: the "
                    "paper's for the method, 0.2 for ar, 0.3 for ar_lopti)")
    ap.add_argument("--eta", type=float, help="Lopti probability threshold, in (0, 1] (default: the "
                    "paper's for the method, 0.4 for lopti, 0.5 for ar_lopti)")
    ap.add_argument("--ppo-epochs", type=int, help="optimizer passes over each rollout (default 1; "
                    "2 = the study's control arm)")
    ap.add_argument("--estimator", choices=("grpo", "reinforce_pp"),
                    help="advantage estimator (default grpo; reinforce_pp = REINFORCE++, as the reference offers)")
    ap.add_argument("--lopti-order", choices=("low_first", "high_first"),
                    help="Lopti stage order (default low_first, Algorithm 1; high_first is the ablation)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--group-size", type=int, help="responses per prompt, G >= 2")
    ap.add_argument("--prompts-per-step", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--steps", type=int, help="RL steps (with --resume: extend the run to this many)")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--max-new-tokens", type=int, help="response budget of an RL rollout")
    ap.add_argument("--max-prompt-len", type=int, help="longer RL prompts are dropped")
    ap.add_argument("--model", help="HF folder, hub id or .gguf file (default: checkpoints/tiny-warm)")
    ap.add_argument("--rl-sizes", type=parse_rl_sizes,
                    help="people per generated RL puzzle, e.g. 3 or 3,4 (default: the preset's)")
    ap.add_argument("--data", help="train on this K&K JSON Lines file instead of generated puzzles")
    ap.add_argument("--run-dir", help="where to write the run (default runs/<time>-<preset>-<method>-s<seed>)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue this run after its latest checkpoint")
    ap.add_argument("--eval-every", type=int, help="evaluate every N steps (0: only at the end)")
    ap.add_argument("--save-every", type=int, help="checkpoint every N steps")
    ap.add_argument("--keep-checkpoints", type=int, help="periodic checkpoints kept (default 2; 0 keeps all)")
    ap.add_argument("--eval-before", action="store_true", help="also evaluate the initial policy")
    ap.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    ap.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    ap.add_argument("--tensorboard", action="store_true", help="also log to TensorBoard (if installed)")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    ap.add_argument("--rebuild-warmstart", action="store_true",
                    help="re-create checkpoints/tiny-warm by supervised warm start first")
    # = WarmStartConfig.minutes (a test checks it); a literal keeps --help free of the torch import
    ap.add_argument("--warmstart-minutes", type=float, default=95.0, help="stage-1 budget of --rebuild-warmstart")
    ap.error = one_line_error
    return ap.parse_args(argv)


def one_line_error(message: str):
    """argparse's errors as one line and exit code 2 (its default prints the usage too)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def build_config(a):
    """The TrainConfig of the command line: a preset, then the options given."""
    from lopti_minimal.trainer import make_config, resume_config
    if a.resume:
        return resume_config(a.resume, steps=a.steps, progress=not a.no_progress)
    return make_config(
        a.preset, method=a.method, alpha=a.alpha, eta=a.eta, lopti_order=a.lopti_order, ppo_epochs=a.ppo_epochs, estimator=a.estimator, seed=a.seed, group_size=a.group_size,
        prompts_per_step=a.prompts_per_step, lr=a.lr, steps=a.steps, temperature=a.temperature,
        max_new_tokens=a.max_new_tokens, max_prompt_len=a.max_prompt_len, model=a.model,
        rl_sizes=a.rl_sizes, rl_data=a.data, run_dir=a.run_dir, eval_every=a.eval_every, save_every=a.save_every,
        keep_checkpoints=a.keep_checkpoints,
        eval_before=a.eval_before or None, final_eval=False if a.no_eval else None,
        threads=a.threads, device=a.device, tensorboard=a.tensorboard or None,
        progress=False if a.no_progress else None)


def ensure_model(cfg, a) -> None:
    """The default policy is the shipped warm start; rebuild it on request, else say how."""
    from lopti_minimal.trainer import ROOT, TrainError
    default = "checkpoints/tiny-warm"
    path = cfg.model if os.path.isabs(cfg.model) else str(ROOT / cfg.model)
    if a.rebuild_warmstart:
        if cfg.model != default and os.path.abspath(cfg.model) != str(ROOT / default):
            raise TrainError("--rebuild-warmstart rebuilds checkpoints/tiny-warm; do not combine it with --model")
        from lopti_minimal import warmstart        # the README's recipe: two stages, < 2 h on 2 cores
        warmstart.main(["--recipe", "--out", path, "--minutes", f"{a.warmstart_minutes:g}",
                        "--threads", str(a.threads or os.cpu_count())] + (["--no-progress"] if a.no_progress else []))
    elif cfg.model == default and not os.path.isfile(os.path.join(path, "config.json")):
        from lopti_minimal.warmstart import STAGE2_MINUTES
        raise TrainError(f"{default} not found: run with --rebuild-warmstart "
                         f"(two warm-start runs, {a.warmstart_minutes:g} + {STAGE2_MINUTES:g} minutes of training) "
                         "or pass --model PATH")


def main(argv=None) -> int:
    a = parse_args(argv)
    from lopti_minimal.trainer import TrainError, train
    try:
        cfg = build_config(a)
        if not a.resume:
            ensure_model(cfg, a)
        result = train(cfg, resume=bool(a.resume))
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: continue with  python train.py --resume <run dir>  "
              "(from the latest checkpoint)", file=sys.stderr)
        return 130
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
