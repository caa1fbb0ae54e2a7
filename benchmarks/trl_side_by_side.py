"""Seconds per GRPO step: ours against TRL's GRPOTrainer, same model, same work, one run.
A printed figure, not a test.

TRL is not a dependency of the package: it is an optional extra, pinned in the repository
root's requirements-trl.txt (the version the TRL subclass and its tests use):

    pip install -r requirements.txt
    python benchmarks/trl_side_by_side.py --threads 2
    python benchmarks/trl_side_by_side.py --threads 2 --preset smollm2-cpu --steps 2

Both trainers run in this one process, with the same torch, the same thread count, one
after the other (TRL first, then ours; --order ours-first swaps them), and are given:

- the same model folder (loaded in float32 by both) and the same tokenizer object;
- the same prompts in the same order: the K&K prompts `train.py` would use for steps
  0 .. W+N-1 (W warm-up steps, N measured), as plain text with `models.kk_prompt`; the
  script checks that TRL's tokenization of them equals ours;
- the same group size G, prompts per step P (one optimizer step per P x G completions),
  maximum new tokens R, temperature (no top-k / top-p), learning rate, AdamW betas and
  weight decay, gradient clipping 1.0, clip range 0.20 / 0.24, KL coefficient (k3, to a
  frozen copy of the initial model), token-mean over the whole step ("dapo" in TRL,
  grad_accum="global" here), micro-batches of the same size (TRL: per-device batch =
  micro-batch, gradient accumulation = P x G / micro-batch, one generation per
  optimizer step), bf16 mixed precision (TRL: bf16=True, i.e. accelerate wraps the
  model's forward in CPU autocast, generation included, entered anew at every forward
  call; ours: autocast_bf16, one autocast region per phase) and gradient checkpointing as
  the preset says (off on cpu-tiny and smollm2-cpu);
- the same reward: `lopti_minimal.task.reward.score_response(...).total`.

What cannot be matched exactly, and is part of what is compared:

- generation: TRL calls transformers `model.generate` (a dynamic KV cache by default);
  ours is `sampling.sample_groups` (a static KV cache, log-probs recorded while sampling);
- old log-probs: with one generation per optimizer step TRL skips them (it uses the
  detached current log-probs, ratio 1); ours recomputes them by a teacher-forced forward
  (`recompute_old_logprobs=True`, as verl does), one extra no-grad forward per step --
  pass --no-recompute-old to drop it from ours as well;
- the loss is the same token-level clipped surrogate plus beta x k3: the dual clip
  (clip_ratio_c = 10) is TRL's `delta`, the plain k3 needs use_bias_correction_kl=False
  (TRL 1.16 multiplies it by the ratio by default), rewards are normalised by the group
  std (scale_rewards="group") like ours;
- --method ar | lopti | ar_lopti runs our subclass `LoptiGRPOTrainer`
  (lopti_minimal/trl_grpo.py, configured by its `make_trl_config`) on the TRL side; a
  Lopti RL step is two TRL optimizer steps (num_iterations=2), timed together;
- the samplers' random streams differ, and so do the responses and their lengths: the
  tokens generated per step are printed beside the times (and seconds per 1,000 response
  tokens), so an unequal amount of work is visible;
- TRL's step includes its own bookkeeping (dataloader, logging metrics it computes
  every step, entropy-free log-prob passes through its fused LM head); ours is the time
  of `trainer.rl_step` (sampling, reward, old and reference log-probs, update, metrics).

Timing: TRL's seconds per step are the intervals between consecutive `on_step_end`
callbacks (everything the Trainer does for one optimizer step), and the window
`on_step_begin` .. `on_step_end`; its sampling time is the time in its generation call
(`_generate_single_turn`) and its "score" time the rest of `_generate_and_score_completions`
(reference log-probs, rewards, advantages), both by wrapping those methods on the
instance. Ours: wall time of each `rl_step` call, split as it reports it. The first W
steps of each are warm-up and are not counted; medians over the N measured steps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from lopti_minimal.runs import machine_info  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny", help="trainer preset whose settings both use")
    ap.add_argument("--model", help="model folder (default: the preset's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, help="prompts per step P (default: the preset's)")
    ap.add_argument("--group-size", type=int, help="G (default: the preset's)")
    ap.add_argument("--max-new-tokens", type=int, help="R (default: the preset's)")
    ap.add_argument("--micro-batch-size", type=int, help="default: the preset's (capped at P x G)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps N")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured first steps W")
    ap.add_argument("--method", default="grpo",
                    help="grpo: TRL's GRPOTrainer; ar | lopti | ar_lopti: our subclass LoptiGRPOTrainer "
                         "(lopti_minimal/trl_grpo.py) on the TRL side, the same method on ours")
    ap.add_argument("--no-recompute-old", action="store_true",
                    help="ours without the teacher-forced recompute of pi_old (as TRL here)")
    ap.add_argument("--order", choices=["trl-first", "ours-first"], default="trl-first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    return ap.parse_args(argv)


def load_setting(args):
    from lopti_minimal import models, plumbing
    from lopti_minimal.config import make_config
    from lopti_minimal.models import kk_prompt
    cfg = make_config(args.preset, model=args.model, prompts_per_step=args.prompts,
                        group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                        micro_batch_size=args.micro_batch_size, threads=args.threads,
                        seed=args.seed, method=args.method, progress=False, plots=False,
                        final_eval=False,
                        recompute_old_logprobs=False if args.no_recompute_old else None)
    n_rows = cfg.prompts_per_step * cfg.group_size
    mb = min(cfg.micro_batch_size, n_rows)
    if n_rows % mb:
        raise SystemExit(f"P x G = {n_rows} must be a multiple of the micro-batch {mb} "
                         "(TRL accumulates whole per-device batches)")
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    _, tok = plumbing.load_policy(cfg)
    records, prompt_ids = models.encode_prompts(records, tok, cfg.prompt_style, cfg.max_prompt_len)
    total = args.warmup + args.steps
    steps = []
    for s in range(total):
        idx = plumbing.step_prompt_indices(cfg.seed, s, cfg.prompts_per_step, len(records))
        steps.append(([records[i] for i in idx], [prompt_ids[i] for i in idx]))
    texts = [[kk_prompt(r, tok, cfg.prompt_style) for r in recs] for recs, _ in steps]
    return cfg, tok, steps, texts, mb


def model_path(cfg) -> str:
    p = cfg.model
    if not os.path.isabs(p) and not os.path.exists(p) and os.path.exists(os.path.join(ROOT, p)):
        p = os.path.join(ROOT, p)
    return p


# ------------------------------------------------------------------------------- TRL


def run_trl(cfg, tok, steps, texts, mb, args) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from lopti_minimal.task.reward import score_response

    # TRL tokenizes plain-text prompts with tokenizer(text) (special tokens on): check that
    # this gives the very ids our trainer samples from.
    for (_, ids), txt in zip(steps, texts):
        for i, t in zip(ids, txt):
            if tok(text=t)["input_ids"] != i:
                print("WARNING: TRL's prompt tokenization differs from ours (special tokens?)")
                break

    rows = [{"prompt": t, "kk_record": json.dumps(r)} for (recs, _), txt in zip(steps, texts)
            for r, t in zip(recs, txt)]
    dataset = Dataset.from_list(rows)
    n_rows = cfg.prompts_per_step * cfg.group_size
    seen = {"prompts": [], "tokens": []}

    def kk_reward(completions, kk_record, completion_ids=None, **_):
        seen["prompts"].append(sorted(set(kk_record)))
        seen["tokens"].append(sum(len(c) for c in completion_ids) if completion_ids is not None else 0)
        return [float(score_response(c, json.loads(r)).total) for c, r in zip(completions, kk_record)]

    out_dir = tempfile.mkdtemp(prefix="trl-bench-")
    # One RL step = `passes` TRL optimizer steps: 2 for Lopti (one per stage, TRL's
    # num_iterations=2 over the same generation), else 1.
    passes = 2 if cfg.uses_lopti else 1
    if cfg.method != "grpo":
        # AR / Lopti: our subclass, configured by its own mapping (lopti_minimal/trl_grpo.py).
        from lopti_minimal.trl_grpo import LoptiGRPOTrainer, make_trl_config
        targs = make_trl_config(
            cfg, out_dir, report_to="none", save_strategy="no", logging_steps=10**6, disable_tqdm=True,
            max_steps=(args.warmup + args.steps) * passes, shuffle_dataset=False,
            dataloader_num_workers=0, log_completions=False, use_cpu=True)
    else:
        targs = None
    targs = targs or GRPOConfig(
        output_dir=out_dir, report_to="none", save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, use_cpu=True, bf16=bool(cfg.autocast_bf16), fp16=False,
        gradient_checkpointing=bool(cfg.gradient_checkpointing), seed=cfg.seed,
        model_init_kwargs={"dtype": "float32"},
        max_steps=args.warmup + args.steps, shuffle_dataset=False, dataloader_num_workers=0,
        per_device_train_batch_size=mb, gradient_accumulation_steps=n_rows // mb,
        num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=cfg.weight_decay, adam_beta1=0.9, adam_beta2=0.999, optim="adamw_torch",
        max_grad_norm=cfg.grad_clip, beta=cfg.kl_coef, epsilon=cfg.eps_low,
        epsilon_high=cfg.eps_high, delta=cfg.clip_c, use_bias_correction_kl=False,
        num_iterations=1, loss_type="dapo", scale_rewards="group",
        mask_truncated_completions=False, log_completions=False,
    )

    times = {"begin": [], "end": []}

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            times["begin"].append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            times["end"].append(time.perf_counter())

    if cfg.method == "grpo":
        trainer = GRPOTrainer(model=model_path(cfg), reward_funcs=kk_reward, args=targs,
                              train_dataset=dataset, processing_class=tok, callbacks=[Timer()])
    else:
        trainer = LoptiGRPOTrainer(model=model_path(cfg), reward_funcs=kk_reward, args=targs,
                                   train_dataset=dataset, processing_class=tok, callbacks=[Timer()],
                                   cfg=cfg)
    phase = {"gen": [], "score": []}
    gen_orig, score_orig = trainer._generate_single_turn, trainer._generate_and_score_completions

    def gen(*a, **k):
        t = time.perf_counter()
        out = gen_orig(*a, **k)
        phase["gen"].append(time.perf_counter() - t)
        return out

    def score(*a, **k):
        t = time.perf_counter()
        out = score_orig(*a, **k)
        phase["score"].append(time.perf_counter() - t)
        return out

    trainer._generate_single_turn, trainer._generate_and_score_completions = gen, score
    t_start = time.perf_counter()
    trainer.train()
    W = args.warmup
    # Group TRL's optimizer steps into RL steps (the last optimizer step of each generation).
    ends = [t_start] + times["end"][passes - 1::passes]
    begins = times["begin"][::passes]
    interval = [b - a for a, b in zip(ends[:-1], ends[1:])][W:]
    window = [e - b for b, e in zip(begins, times["end"][passes - 1::passes])][W:]
    gen_s = phase["gen"][W:]
    score_s = [s - g for s, g in zip(phase["score"], phase["gen"])][W:]
    tokens = seen["tokens"][W:]
    expected = [sorted(set(json.dumps(r) for r in recs)) for recs, _ in steps]
    same_prompts = seen["prompts"] == expected
    return {"step_s": statistics.median(interval), "window_s": statistics.median(window),
            "sampling_s": statistics.median(gen_s), "score_ref_s": statistics.median(score_s),
            "update_s": statistics.median(w - g - s for w, g, s in zip(window, gen_s, score_s)),
            "tokens": statistics.median(tokens), "per_step_s": interval, "per_step_tokens": tokens,
            "same_prompts_as_ours": same_prompts,
            "s_per_1k_tokens": statistics.median(1000 * t / max(n, 1) for t, n in zip(interval, tokens))}


# ------------------------------------------------------------------------------- ours


def run_ours(cfg, steps, args) -> dict:
    from lopti_minimal import plumbing, trainer as T
    from lopti_minimal.precision import build_optimizer, reference_copy
    model, tok = plumbing.load_policy(cfg)
    ref = reference_copy(model) if cfg.kl_coef else None
    opt = build_optimizer(model, cfg)
    per = []
    for s, (recs, ids) in enumerate(steps):
        t = time.perf_counter()
        m = T.rl_step(model, ref, opt, tok, recs, ids, cfg, s)
        per.append((time.perf_counter() - t, m))
    per = per[args.warmup:]
    step_s = [t for t, _ in per]
    tokens = [m["tokens"] for _, m in per]
    return {"step_s": statistics.median(step_s),
            "sampling_s": statistics.median(m["sample_s"] for _, m in per),
            "update_s": statistics.median(m["update_s"] for _, m in per),
            "score_ref_s": statistics.median(t - m["sample_s"] - m["update_s"] for t, m in per),
            "tokens": statistics.median(tokens), "per_step_s": step_s, "per_step_tokens": tokens,
            "s_per_1k_tokens": statistics.median(1000 * t / max(n, 1) for t, n in zip(step_s, tokens))}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers
    import trl
    cfg, tok, steps, texts, mb = load_setting(args)
    # the host-memory settings of a run of ours (host_memory.py), for both sides: one
    # process, one allocator, so neither side runs under settings the other does not
    from lopti_minimal import host_memory
    host_memory.bound_process_memory(cfg.mmap_threshold_mb)
    res = {}
    order = ("trl", "ours") if args.order == "trl-first" else ("ours", "trl")
    for who in order:
        torch.manual_seed(cfg.seed)
        res[who] = run_trl(cfg, tok, steps, texts, mb, args) if who == "trl" else run_ours(cfg, steps, args)
    cpu = machine_info()["cpu"]
    print(f"\n{cfg.model}: P={cfg.prompts_per_step} prompts x G={cfg.group_size}, <= {cfg.max_new_tokens} "
          f"new tokens, micro-batch {mb}, bf16 autocast {cfg.autocast_bf16}, gradient checkpointing "
          f"{cfg.gradient_checkpointing}, ours: {cfg.method}, recompute pi_old {cfg.recompute_old_logprobs}")
    print(f"{cpu}, {os.cpu_count()} cores, {args.threads} torch thread(s), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, trl {trl.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"median of {args.steps} steps after {args.warmup} warm-up, order {args.order}")
    print(f"{'':6}{'s/step':>9}{'sampling':>10}{'ref+score':>10}{'update':>9}{'tokens':>8}{'s/1k tok':>10}")
    for who in ("trl", "ours"):
        r = res[who]
        print(f"{who:6}{r['step_s']:>9.2f}{r['sampling_s']:>10.2f}{r['score_ref_s']:>10.2f}{r['update_s']:>9.2f}"
              f"{r['tokens']:>8.0f}{r['s_per_1k_tokens']:>10.2f}")
    ratio = res["trl"]["step_s"] / res["ours"]["step_s"]
    ratio_tok = res["trl"]["s_per_1k_tokens"] / res["ours"]["s_per_1k_tokens"]
    print(f"TRL s/step / ours s/step = {ratio:.2f}; per 1k response tokens {ratio_tok:.2f} "
          "(goal per 1k tokens: >= 4 on the tiny model, >= 1.5 on SmolLM2-135M)")
    print("(TRL's 'ref+score' includes reference log-probs, rewards and advantages; ours also "
          "includes the pi_old recompute. TRL window on_step_begin..end: "
          f"{res['trl']['window_s']:.2f}s; same prompts per step as ours: {res['trl']['same_prompts_as_ours']})")
    res.update(ratio=ratio, ratio_per_token=ratio_tok, threads=args.threads,
               versions={"torch": torch.__version__, "transformers": transformers.__version__,
                         "trl": trl.__version__})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
