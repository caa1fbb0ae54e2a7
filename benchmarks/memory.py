"""Peak resident memory of the default run, per phase, and of TRL's trainer on the same work:
printed figures, not a test.

    python benchmarks/memory.py                              # tiny-warm, cpu-tiny preset
    python benchmarks/memory.py --steps 5 --eval-sizes 3 7 --variants shipped
    python benchmarks/memory.py --trl                        # + TRL's GRPOTrainer (needs trl)
    python benchmarks/memory.py --variants --repeat 10 --model runs/default-s0/final
    python benchmarks/memory.py --preset smollm2-cpu --model models/smollm2-135m-instruct

Each variant runs in a fresh process (so no variant sees another's allocator state) the
real `trainer.train` of the preset, for --steps RL steps, then the run's final evaluation on
--eval-sizes (default 7 people only: the longest answers, the largest KV cache of the
evaluation; --eval-per-size puzzles, as many as the preset evaluates per size, in the
preset's eval batches). Around the functions the step calls (sampling `trainer.rollout`;
`batch_logprobs` for log pi_old and log pi_ref, told apart by the model passed; the update
`grpo_update` / `lopti_update`; the evaluation `plumbing.evaluate_policy`) the kernel's
high-water mark of the resident set is reset before and read after (host_memory.py), so each
phase's figure is the peak resident memory of the whole process while that phase ran (the
weights, optimizer state and pi_ref included), the largest over the steps; "s/step" is the
median step time, since memory returned to the kernel costs time (config.mmap_threshold_mb).
"steps" lists the peak of each step (metrics.jsonl's `peak_rss_gb`): flat over the run means
the last within 10% of the second.

The variants: "shipped" (the defaults: glibc's mmap threshold fixed at
config.mmap_threshold_mb, host_memory.bound_process_memory; gradient checkpointing on),
"no-mallopt" (--mmap-threshold-mb 0: glibc's dynamic threshold), "no-checkpointing", and
"neither". They run the same floating-point path (checkpointing gives the same gradients
bit for bit, the mmap threshold only moves bytes), so each samples the same tokens: the
`tokens` column shows it. --set KEY=VALUE changes a config field for every variant, e.g.
`--set mmap_threshold_mb=1` for another threshold or `--set micro_batch_size=32` for the
old micro-batch.

--repeat K: growth at equal work. A run's steps do different work (its responses lengthen as
RL selects derivations), so its per-step peaks are not comparable; here one step (the
prompts and generator of step --repeat-step) runs K times in one process, each time from
the same weights and optimizer state (restored before it), so every repetition samples
the same tokens: a peak that still rises is the allocator's, not the work's. Use --model
with a trained policy (e.g. a default run's `final/`) for the long responses of late steps.

--trl: GRPO by TRL's GRPOTrainer in its own process on the first --steps steps' prompts of the
same preset (benchmarks/trl_side_by_side.py's setting: same model, prompts, G, lengths,
micro-batches, bf16 autocast, checkpointing as the preset), and ours on the same steps in
another (`trl_side_by_side.run_ours`, no evaluation, the shipped defaults: --set does not
reach this comparison): the whole process's peak (model loading included) of each. Machine
and date are printed with the figures (--json writes them).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# name: (mmap_threshold_mb, gradient_checkpointing); None = the config's default
VARIANTS = {"shipped": (None, True), "no-mallopt": (0, True),
            "no-checkpointing": (None, False), "neither": (0, False)}
PHASES = ("sampling", "old log-probs", "ref log-probs", "update", "evaluation")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--model", help="model folder (default: the preset's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    ap.add_argument("--steps", type=int, default=3, help="RL steps per variant")
    ap.add_argument("--eval-sizes", type=int, nargs="+", default=[7], help="sizes of the final evaluation")
    ap.add_argument("--eval-per-size", type=int, help="puzzles per size (default: the preset's)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                    help="(none: skip the run)")
    ap.add_argument("--repeat", type=int, default=0, help="K repetitions of one step at equal work (0: none)")
    ap.add_argument("--repeat-step", type=int, default=0, help="whose prompts and generator --repeat uses")
    ap.add_argument("--trl", action="store_true", help="also TRL's trainer and ours on the same steps")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="a TrainConfig field for every variant, e.g. micro_batch_size=32 (the old default)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ------------------------------------------------------------------ in a child process


@contextlib.contextmanager
def phase_peaks(peaks: dict):
    """Wrap the functions of each phase: the resident peak while it runs, max over calls."""
    from lopti_minimal import host_memory, plumbing, trainer
    in_step = {"peak": 0.0}     # the phases reset the high-water mark: the step's own is their max

    def wrap(owner, name, label):
        fn = getattr(owner, name)

        def wrapped(*a, **k):
            host_memory.take_peak_rss_gb()
            try:
                return fn(*a, **k)
            finally:
                key, peak = label(a) if callable(label) else label, host_memory.take_peak_rss_gb()
                peaks[key] = max(peaks.get(key, 0.0), peak)
                in_step["peak"] = max(in_step["peak"], peak)
        return owner, name, fn, wrapped

    policy = {}
    patches = [wrap(trainer, "rollout", "sampling"),
               wrap(trainer, "batch_logprobs",
                    lambda a: "old log-probs" if a[0] is policy.get("model", a[0]) else "ref log-probs"),
               wrap(trainer, "grpo_update", "update"), wrap(trainer, "lopti_update", "update"),
               wrap(plumbing, "evaluate_policy", "evaluation")]
    load = plumbing.load_policy

    def load_and_note(*a, **k):        # the first model loaded is the policy (pi_ref is a copy)
        model, tok = load(*a, **k)
        policy.setdefault("model", model)
        return model, tok
    patches.append((plumbing, "load_policy", load, load_and_note))
    metrics = plumbing.step_metrics

    def step_metrics(*a, **k):         # the step's peak: its phases' and the rest's
        m = metrics(*a, **k)
        m["peak_rss_gb"], in_step["peak"] = max(m["peak_rss_gb"], in_step["peak"]), 0.0
        return m
    patches.append((plumbing, "step_metrics", metrics, step_metrics))
    for owner, name, _, new in patches:
        setattr(owner, name, new)
    try:
        yield
    finally:
        for owner, name, old, _ in patches:
            setattr(owner, name, old)


def child_run(args, variant: str) -> dict:
    import torch
    from lopti_minimal import trainer
    from lopti_minimal.config import make_config
    from lopti_minimal.experiments.study import parse_set
    threshold, ckpt = VARIANTS[variant]
    torch.set_num_threads(args.threads)
    peaks = {}
    sets = dict(parse_set(args.set or []))
    if threshold is not None:
        sets["mmap_threshold_mb"] = threshold
    with tempfile.TemporaryDirectory() as d, phase_peaks(peaks):
        cfg = make_config(args.preset, model=args.model, steps=args.steps, threads=args.threads,
                          gradient_checkpointing=ckpt, **sets, eval_every=0, save_every=0, final_eval=True,
                          eval_sizes=tuple(args.eval_sizes), eval_per_size=args.eval_per_size,
                          run_dir=os.path.join(d, "run"), progress=False, plots=False, tensorboard=False)
        t = time.perf_counter()
        res = trainer.train(cfg, log=lambda s: None)
        seconds = time.perf_counter() - t
    steps = [m["peak_rss_gb"] for m in res["metrics"]]
    return {"variant": variant, "mmap_threshold_mb": cfg.mmap_threshold_mb, "checkpointing": ckpt,
            "micro_batch_size": cfg.micro_batch_size, "phases": peaks, "seconds_by_step":
            [m["step_s"] for m in res["metrics"]],
            "steps": steps, "tokens": [m["tokens"] for m in res["metrics"]],
            "update_s": [m["update_s"] for m in res["metrics"]], "seconds": round(seconds, 1),
            "process_peak_gb": max(steps + [peaks.get("evaluation", 0.0)])}


def child_side(args, who: str) -> dict:
    import torch
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import trl_side_by_side as tsbs
    from lopti_minimal import host_memory
    if who == "ours":
        host_memory.bound_process_memory()   # as a run of ours does (plumbing.Run); TRL's side as TRL runs
    torch.set_num_threads(args.threads)
    a = tsbs.parse_args(["--preset", args.preset, "--threads", str(args.threads), "--steps", str(args.steps),
                         "--warmup", "0"] + (["--model", args.model] if args.model else []))
    cfg, tok, steps, texts, mb = tsbs.load_setting(a)
    torch.manual_seed(cfg.seed)
    r = tsbs.run_trl(cfg, tok, steps, texts, mb, a) if who == "trl" else tsbs.run_ours(cfg, steps, a)
    return {"side": who, "process_peak_gb": round(host_memory.peak_rss_gb(), 3),
            "tokens": r["per_step_tokens"], "step_s": r["per_step_s"]}


def child_repeat(args) -> dict:
    """One step's work K times from the same weights and optimizer state (shipped variant)."""
    import copy
    import torch
    from lopti_minimal import host_memory, models, plumbing, precision, trainer
    from lopti_minimal.config import make_config
    from lopti_minimal.experiments.study import parse_set
    torch.set_num_threads(args.threads)
    cfg = make_config(args.preset, model=args.model, threads=args.threads, progress=False,
                      **parse_set(args.set or []))
    host_memory.bound_process_memory(cfg.mmap_threshold_mb)    # as plumbing.Run does
    model, tok = plumbing.load_policy(cfg)
    ref = precision.reference_copy(model, precision.ref_dtype(cfg)) if cfg.kl_coef else None
    opt = precision.build_optimizer(model, cfg)
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    records, ids = models.encode_prompts(records, tok, cfg.prompt_style, cfg.max_prompt_len)
    idx = plumbing.step_prompt_indices(cfg.seed, args.repeat_step, cfg.prompts_per_step, len(records))
    rec, pr = [records[i] for i in idx], [ids[i] for i in idx]
    weights = copy.deepcopy(model.state_dict())
    trainer.rl_step(model, ref, opt, tok, rec, pr, cfg, args.repeat_step)   # allocates AdamW's state
    state = copy.deepcopy(opt.state_dict())
    peaks, tokens = [], []
    for _ in range(args.repeat):
        model.load_state_dict(weights)
        opt.load_state_dict(copy.deepcopy(state))
        host_memory.take_peak_rss_gb()
        m = trainer.rl_step(model, ref, opt, tok, rec, pr, cfg, args.repeat_step)
        peaks.append(m["peak_rss_gb"])
        tokens.append(m["tokens"])
    return {"peaks": peaks, "tokens": tokens}


# ------------------------------------------------------------------------- the parent


def in_child(kind: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child", kind]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        kind = args.child
        res = (child_side(args, kind[5:]) if kind.startswith("side-") else
               child_repeat(args) if kind == "repeat" else child_run(args, kind))
        print(json.dumps(res))
        return 0
    import torch
    import transformers
    from lopti_minimal.runs import machine_info
    mi = machine_info()
    print(f"{mi['cpu']}, {mi['cores']} cores, {args.threads} torch thread(s) per process, torch "
          f"{torch.__version__}, transformers {transformers.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load avg {os.getloadavg()[0]:.2f}")
    print(f"preset {args.preset}{', model ' + args.model if args.model else ''}: {args.steps} RL steps, "
          f"then the evaluation on sizes {args.eval_sizes}; peak resident memory in GB (fresh process each)")
    res = {"machine": mi, "argv": sys.argv[1:], "variants": {}}
    if args.variants:
        print(f"{'variant':18}" + "".join(f"{p:>15}" for p in PHASES) + f"{'process':>9}{'s/step':>8}"
              "  steps; tokens")
    for v in args.variants:
        r = in_child(v)
        res["variants"][v] = r
        print(f"{v:18}" + "".join(f"{r['phases'].get(p, float('nan')):>15.2f}" for p in PHASES)
              + f"{r['process_peak_gb']:>9.2f}{statistics.median(r['seconds_by_step']):>8.1f}  "
              + " ".join(f"{x:.2f}" for x in r["steps"])
              + "; " + " ".join(str(t) for t in r["tokens"]))
    if args.repeat:
        r = res["repeat"] = in_child("repeat")
        print(f"\nthe work of step {args.repeat_step} repeated {args.repeat} times from the same weights "
              f"(tokens {sorted(set(r['tokens']))}): peak per repetition "
              + " ".join(f"{x:.2f}" for x in r["peaks"]))
        if len(r["peaks"]) >= 2:
            print(f"last / second = {r['peaks'][-1] / r['peaks'][1]:.2f} (flat: <= 1.10)")
    if args.trl:
        print(f"\nGRPO (TRL's GRPOTrainer and ours, trl_side_by_side's setting), the first {args.steps} steps' "
              "prompts, no evaluation: whole-process peak (model loading included)")
        for who in ("trl", "ours"):
            r = in_child("side-" + who)
            res[who] = r
            print(f"{who:6}{r['process_peak_gb']:>8.2f} GB   tokens per step {r['tokens']}")
        print(f"TRL / ours = {res['trl']['process_peak_gb'] / res['ours']['process_peak_gb']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
