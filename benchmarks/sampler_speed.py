"""Sampler speed, old and new decode loop side by side in one process: printed figures, not
a test.

    python benchmarks/sampler_speed.py                       # tiny-warm, 8 x 8 rows, <= 640 tokens
    python benchmarks/sampler_speed.py --threads 1 --repeats 5 --modes eos
    python benchmarks/sampler_speed.py --profile --modes eos # and torch.profiler's top ops

What runs is the RL step's sampling call: sampling.sample_groups with the arguments
`trainer.rollout` passes (the preset's temperature, top-p/top-k, log-probs only where the
trainer does not recompute them, under the preset's bf16 autocast) on the prompts of RL
steps 0, 1, ... exactly as `train.py` picks them, once with each decoder (TrainConfig.decoder,
sample_groups' `decoder` option: "hf" transformers' forward with the static cache, the
samples of the shipped runs; "lean" decode.py, what "auto" runs on a CPU). Two modes:

eos    rows stop at EOS, as in training. The two decoders' samples differ (decode.py's
       docstring says why), so they do different work: compare tokens per second.
fixed  EOS disabled (eos_token_id=[]): every row runs to --max-new-tokens, both decoders
       produce exactly rows x R tokens (equal work).

Repeat r uses step r's prompts and generator for every decoder, and the decoders' order
alternates between repeats (hf, lean, then lean, hf, ...) so that a change in the machine's
load hits both alike. Printed per decoder: median tokens/s (wall clock), median CPU seconds
per 1k tokens (process time: less sensitive to other processes than the wall clock on a
loaded machine), and the speed ratio to hf as the median of the per-repeat ratios. The
machine (CPU model, cores, torch threads, load average before and after) comes first, and
after each table the number of rows the decoders sampled identically (decode.py's
docstring says why the lean decoder's samples drift from hf's).
Absolute figures on a shared machine are noise; the ratios measured side by side are not.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny", help="trainer preset whose settings are used")
    ap.add_argument("--model", help="model folder (default: the preset's)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--prompts", type=int, help="prompts per step (default: the preset's)")
    ap.add_argument("--group-size", type=int, help="G (default: the preset's)")
    ap.add_argument("--max-new-tokens", type=int, help="default: the preset's")
    ap.add_argument("--repeats", type=int, default=3, help="measured repeats per decoder and mode")
    ap.add_argument("--modes", nargs="+", default=["eos", "fixed"], choices=["eos", "fixed"])
    ap.add_argument("--decoders", nargs="+", default=["hf", "lean"], choices=["hf", "lean"])
    ap.add_argument("--profile", action="store_true",
                    help="also profile one rollout of each decoder (the first of --modes)")
    ap.add_argument("--profile-tokens", type=int, help="its max new tokens (default: the preset's)")
    ap.add_argument("--top", type=int, default=15, help="operators shown per profile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    return ap.parse_args(argv)


def load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from benchmarks.rl_step import Setup, machine_info
    from lopti_minimal.config import make_config
    from lopti_minimal.plumbing import step_generator
    from lopti_minimal.precision import autocast
    from lopti_minimal.sampling import sample_groups
    info = machine_info(args.threads)
    cfg = make_config(args.preset, model=args.model, prompts_per_step=args.prompts,
                        group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                        threads=args.threads, seed=args.seed, progress=False, plots=False,
                        final_eval=False)
    print(f"machine: {info['cpu']}, {info['cores']} cores, {args.threads} torch thread(s), "
          f"torch {info['torch']}, transformers {info['transformers']}, {info['date']}, "
          f"load avg (1 min) {info.get('loadavg_1m', float('nan')):.2f}")
    S = Setup(cfg)
    G, R = cfg.group_size, cfg.max_new_tokens
    print(f"model: {cfg.model}, preset {cfg.preset}, {cfg.prompts_per_step} prompts x G={G} = "
          f"{cfg.prompts_per_step * G} rows, <= {R} new tokens, T {cfg.temperature}, "
          f"bf16 autocast {cfg.autocast_bf16}")

    def rollout(decoder: str, mode: str, rep: int, max_new_tokens: int = R):
        _, prompts = S.step_prompts(rep)
        gen = step_generator(cfg.seed, rep, S.device)
        with autocast(cfg, S.device):
            ro = sample_groups(S.model, prompts, G, max_new_tokens, temperature=cfg.temperature,
                               top_p=cfg.top_p, top_k=cfg.top_k,
                               eos_token_id=S.tok.eos_token_id if mode == "eos" else [],
                               pad_token_id=S.tok.pad_token_id, generator=gen,
                               logprobs=not cfg.recompute_old_logprobs, decoder=decoder)
        return ro

    res = {"machine": info, "rows": cfg.prompts_per_step * G, "max_new_tokens": R,
           "threads": args.threads, "load_before": load()}
    for mode in args.modes:
        for d in args.decoders:                     # warm-up, unmeasured
            t = time.perf_counter()
            rollout(d, mode, 10_000, max_new_tokens=min(R, 64))
            res[f"{mode}_{d}_warmup_s"] = time.perf_counter() - t
        runs = {d: [] for d in args.decoders}
        same = []                # per repeat: rows whose response is the same for all decoders
        for rep in range(args.repeats):
            resp = {}
            order = args.decoders if rep % 2 == 0 else args.decoders[::-1]
            for d in order:
                t, c = time.perf_counter(), time.process_time()
                ro = rollout(d, mode, rep)
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                n = int(ro.response_mask.sum())
                runs[d].append(dict(wall=wall, cpu=cpu, tokens=n, width=ro.response_ids.shape[1],
                                    load=load()))
                resp[d] = [r[:int(m.sum())] for r, m in zip(ro.response_ids.tolist(), ro.response_mask)]
            same.append(sum(len(set(map(tuple, rows))) == 1 for rows in zip(*resp.values())))
        print(f"\n[{mode}] {'rows stop at EOS' if mode == 'eos' else 'EOS off: equal work'}, "
              f"median of {args.repeats} (repeat r: the prompts and generator of RL step r)")
        print(f"{'decoder':9}{'tokens':>8}{'iters':>7}{'seconds':>9}{'tokens/s':>10}"
              f"{'CPU s/1k tok':>14}{'x hf (wall)':>13}{'x hf (CPU)':>12}")
        for d in args.decoders:
            rs = runs[d]
            tps = [r["tokens"] / r["wall"] for r in rs]
            cpk = [1000 * r["cpu"] / r["tokens"] for r in rs]
            row = dict(tokens=statistics.median(r["tokens"] for r in rs),
                       iters=statistics.median(r["width"] for r in rs),
                       seconds=statistics.median(r["wall"] for r in rs),
                       tok_s=statistics.median(tps), cpu_s_per_1k=statistics.median(cpk), runs=rs)
            if "hf" in runs:
                row["x_hf_wall"] = statistics.median(
                    (r["tokens"] / r["wall"]) / (h["tokens"] / h["wall"]) for r, h in zip(rs, runs["hf"]))
                row["x_hf_cpu"] = statistics.median(
                    (h["cpu"] / h["tokens"]) / (r["cpu"] / r["tokens"]) for r, h in zip(rs, runs["hf"]))
            res[f"{mode}_{d}"] = row
            print(f"{d:9}{row['tokens']:>8.0f}{row['iters']:>7.0f}{row['seconds']:>9.2f}"
                  f"{row['tok_s']:>10.0f}{row['cpu_s_per_1k']:>14.3f}"
                  f"{row.get('x_hf_wall', float('nan')):>13.2f}{row.get('x_hf_cpu', float('nan')):>12.2f}")
        res[f"{mode}_rows_identical"] = same
        if len(args.decoders) > 1:
            print(f"rows sampled identically by {' and '.join(args.decoders)} (same generator): "
                  f"{same} of {res['rows']} per repeat")
    res["load_after"] = load()
    print(f"\nload avg (1 min) before {res['load_before']:.2f}, after {res['load_after']:.2f} "
          f"({info['cores']} cores)")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        mode, n = args.modes[0], args.profile_tokens or R
        for d in args.decoders:
            with profile(activities=[ProfilerActivity.CPU]) as p:
                t = time.perf_counter()
                ro = rollout(d, mode, 0, n)
                wall = time.perf_counter() - t
            print(f"\n[profile] decoder {d}: the rollout of repeat 0, mode {mode}, <= {n} tokens: "
                  f"{int(ro.response_mask.sum())} tokens, {ro.response_ids.shape[1]} iterations, "
                  f"{wall:.2f} s under the profiler")
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
