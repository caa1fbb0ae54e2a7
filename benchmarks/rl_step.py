"""RL-step speed and memory figures: printed figures, not timed tests.

    python benchmarks/rl_step.py                                   # tiny-warm, all parts
    python benchmarks/rl_step.py --preset smollm2-cpu --model models/smollm2-135m-instruct
    python benchmarks/rl_step.py --parts sampler update --threads 2 --json out.json
    python benchmarks/rl_step.py --parts profile                  # torch.profiler top ops

Every part runs the project's own functions on real K&K prompts (the cached RL prompt set
of the preset, the prompts of step 0, 1, ... exactly as `train.py` picks them), with the
preset's numerics (bf16 autocast on a CPU, float32 master weights):

sampler  rollout tokens/s: `trainer.rollout` (our `sample_groups`, the preset's decoder:
         decode.py's lean step on a CPU; "ours_hf": decoder="hf", transformers' forward
         over decode.KVCache) against transformers `model.generate` on the same model, prompts,
         batch (prompts x G rows), temperature (no top-k/top-p), length, autocast. Two modes:
         "eos"   rows stop at EOS (the RL setting; lengths differ by sampler RNG, so
                 compare tokens/s, not seconds);
         "fixed" EOS disabled in all, so all produce exactly B x R tokens (equal work):
                 ours with eos_token_id=[]; generate with min_new_tokens=R (its EOS setting
                 falls back to the model's when None is passed, so EOS is suppressed by its
                 min-new-tokens logits processor instead: one masked fill per step).
update   the update phase on one rollout batch (`trainer.make_batch`'s): `trainer.update` for
         GRPO and for AR+Lopti (seconds, response tokens/s), a no-grad log-prob pass (`grpo.batch_logprobs`,
         the cost of old / reference log-probs), and a bare forward+backward over the same
         tokens and micro-batches (`grpo.token_logprobs`, a plain summed log-likelihood,
         backward; no policy loss, no optimizer) -- the ratio update / bare is the
         overhead of everything GRPO adds (loss, KL, metrics, clipping, AdamW).
step     seconds per RL step split into sampling, reward, old log-probs, reference
         log-probs, update and the rest, for each method, by running the real
         `trainer.rl_step` with timers wrapped around the functions it calls
         (`trainer.rollout`, `grpo.batch_logprobs` -- old vs reference told apart by the
         model passed -- and the reward function; `update_s` and `step_s` come from
         rl_step's own metrics). Every measured step starts from the same weights and
         optimizer state (restored outside the timed region), so every method samples the
         very same rollouts and the comparison is at equal work; one unmeasured warm-up
         step per method comes first. "Lopti overhead" = AR+Lopti step / GRPO step.
         Beside each phase: its model FLOP/s against this machine's matmul limit at the
         phase's shapes, measured in the same run (benchmarks/flops.py), and each step's
         peak RSS. Under the run's host-memory bounds (host_memory.bound_process_memory).
memory   peak memory of one RL step without and with gradient checkpointing, each in a
         fresh subprocess: a small warm-up step allocates the gradients and AdamW state,
         the RSS then is the baseline, the kernel's peak-RSS mark is reset (write 5 to
         /proc/self/clear_refs, Linux >= 4.0; else getrusage's ru_maxrss, which would also
         see the model loading), and peak (VmHWM) - baseline is what the step itself
         needed (KV cache, activations, logits, temporaries). On a GPU:
         torch.cuda.max_memory_allocated after reset_peak_memory_stats.
profile  one RL step of the last of --methods (after a warm-up step) under torch.profiler:
         the top operators by self CPU time (--trace FILE also writes a chrome trace).
         For Python-level hot spots use py-spy on the same command, e.g.
         `py-spy record -r 200 -f raw -o spy.txt -- python benchmarks/rl_step.py --parts step`.

Machine, thread count, versions and date are printed with the figures (and written to
--json). Use --threads to match the cores you have; results on a busy machine are noise.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

PARTS = ("sampler", "update", "step", "memory", "profile")


# ------------------------------------------------------------------------------ setup


def machine_info(threads: int) -> dict:
    """runs.machine_info() and what a timing also depends on: the date, torch's threads,
    the load."""
    import transformers
    from lopti_minimal.runs import machine_info as machine
    info = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), **machine(),
            "torch_threads": threads, "transformers": transformers.__version__}
    try:
        info["loadavg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def make_cfg(args, **extra):
    from lopti_minimal.config import make_config
    from lopti_minimal.experiments.study import parse_set      # --set, as the study reads it
    return make_config(args.preset, model=args.model, prompts_per_step=args.prompts,
                       group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                       micro_batch_size=args.micro_batch_size, threads=args.threads,
                       seed=args.seed, progress=False, plots=False, final_eval=False,
                       **dict(parse_set(args.set), **extra))


class Setup:
    """Model, frozen reference, tokenizer and encoded RL prompts, as `trainer.train` makes them."""

    def __init__(self, cfg):
        from lopti_minimal import host_memory, models, plumbing, precision
        self.cfg = cfg
        torch.set_num_threads(cfg.threads or torch.get_num_threads())
        # what train.py runs under (plumbing.Run): the mmap threshold costs time on a large
        # model, so a benchmark without it would time another program than a run
        host_memory.bound_process_memory(cfg.mmap_threshold_mb)
        records, _ = plumbing.rl_prompt_set(cfg, progress=False)
        self.model, self.tok = plumbing.load_policy(cfg)
        self.ref = precision.reference_copy(self.model) if cfg.kl_coef else None
        self.records, self.prompt_ids = models.encode_prompts(records, self.tok, cfg.prompt_style,
                                                         cfg.max_prompt_len)
        self.device = next(self.model.parameters()).device
        self.initial = copy.deepcopy(self.model.state_dict())

    def step_prompts(self, step: int):
        from lopti_minimal.plumbing import step_prompt_indices
        idx = step_prompt_indices(self.cfg.seed, step, self.cfg.prompts_per_step, len(self.records))
        return [self.records[i] for i in idx], [self.prompt_ids[i] for i in idx]

    def reset_weights(self):
        self.model.load_state_dict(self.initial)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def timed(fn, sync=lambda: None):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t, out


# ---------------------------------------------------------------------------- sampler


def part_sampler(S: Setup, args) -> dict:
    from transformers import GenerationConfig
    from lopti_minimal import plumbing, trainer as T
    from lopti_minimal.precision import autocast
    from lopti_minimal.batch import group_rows
    from lopti_minimal.sampling import sample_groups
    cfg, model, tok = S.cfg, S.model, S.tok
    G, R = cfg.group_size, cfg.max_new_tokens
    _, prompts = S.step_prompts(0)
    ids, am = group_rows(prompts, G, tok.pad_token_id, S.device)      # the sampler's rows
    B, eos = ids.shape[0], tok.eos_token_id
    model.eval()

    def ours(fixed: bool, seed: int, decoder: str = cfg.decoder):
        gen = plumbing.step_generator(cfg.seed, seed, S.device)
        if not fixed:        # exactly what rl_step calls (with this decoder)
            ro = T.rollout(model, tok, prompts, replace(cfg, decoder=decoder), gen)
        else:                # the same call with EOS disabled
            with autocast(cfg, S.device):
                ro = sample_groups(model, prompts, G, R, temperature=cfg.temperature,
                                   top_p=cfg.top_p, top_k=cfg.top_k, eos_token_id=[],
                                   pad_token_id=tok.pad_token_id, generator=gen, decoder=decoder,
                                   logprobs=not cfg.recompute_old_logprobs)
        return int(ro.response_mask.sum())

    def ours_hf(fixed: bool, seed: int):            # transformers' forward as the decode step
        return ours(fixed, seed, decoder="hf")

    def hf(fixed: bool, seed: int):
        torch.manual_seed(seed)
        gc = GenerationConfig(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0,
                              max_new_tokens=R, min_new_tokens=R if fixed else None,
                              pad_token_id=tok.pad_token_id, eos_token_id=eos)
        with torch.no_grad(), autocast(cfg, S.device):
            out = model.generate(input_ids=ids, attention_mask=am, generation_config=gc)
        resp = out[:, ids.shape[1]:]
        if fixed:
            return resp.numel()
        is_eos = resp == eos
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1,
                            torch.full((B,), resp.shape[1], device=resp.device))
        return int(first.sum())

    res = {"rows": B, "prompts": len(prompts), "prompt_len_max": int(ids.shape[1]),
           "max_new_tokens": R}
    both = (("ours", ours), ("ours_hf", ours_hf))
    contenders = {mode: both + (("generate", hf),) for mode in ("fixed", "eos")}
    for mode in ("fixed", "eos"):
        fixed = mode == "fixed"
        for name, fn in contenders[mode]:
            fn(fixed, 999)                                   # warm-up
        times = {name: [] for name, _ in contenders[mode]}
        toks = {name: [] for name, _ in contenders[mode]}
        for r in range(args.repeats):
            for name, fn in contenders[mode]:
                dt, n = timed(lambda: fn(fixed, r), S.sync)
                times[name].append(dt)
                toks[name].append(n)
        for name, _ in contenders[mode]:
            tps = [n / t for n, t in zip(toks[name], times[name])]
            res[f"{mode}_{name}_tok_s"] = statistics.median(tps)
            res[f"{mode}_{name}_s"] = statistics.median(times[name])
            res[f"{mode}_{name}_tokens"] = statistics.median(toks[name])
        res[f"{mode}_speedup"] = res[f"{mode}_ours_tok_s"] / res[f"{mode}_generate_tok_s"]
        res[f"{mode}_lean_speedup"] = res[f"{mode}_ours_tok_s"] / res[f"{mode}_ours_hf_tok_s"]
    print(f"\n[sampler] {B} rows ({len(prompts)} prompts x G={G}), prompts <= {ids.shape[1]} tokens, "
          f"<= {R} new tokens, T={cfg.temperature}, median of {args.repeats}")
    print(f"{'mode':8}{'':12}{'tokens':>9}{'seconds':>10}{'tokens/s':>11}")
    for mode in ("fixed", "eos"):
        for name, _ in contenders[mode]:
            print(f"{mode:8}{name:12}{res[f'{mode}_{name}_tokens']:>9.0f}{res[f'{mode}_{name}_s']:>10.2f}"
                  f"{res[f'{mode}_{name}_tok_s']:>11.0f}")
        print(f"{mode:8}ours / generate tokens/s = {res[f'{mode}_speedup']:.2f}  (goal >= 1); ours "
              f"(decoder {cfg.decoder}) / ours_hf = {res[f'{mode}_lean_speedup']:.2f}")
    return res


# ----------------------------------------------------------------------------- update


def rollout_batch(S: Setup, step: int = 0):
    """One step's update batch as rl_step makes it (trainer.make_batch, GRPO's advantages),
    and the config of AR+Lopti with the same batch after its AR (trainer.reweight)."""
    from lopti_minimal import trainer as T
    grpo, ar_lopti = (replace(S.cfg, method=m, alpha=None, eta=None) for m in ("grpo", "ar_lopti"))
    records, prompts = S.step_prompts(step)
    batch = T.make_batch(S.model, S.ref, S.tok, records, prompts, grpo, step).batch
    return batch, grpo, T.reweight(batch, ar_lopti), ar_lopti


def bare_forward_backward(model, batch, cfg, optimizer=None):
    """The floor for the update: the same micro-batches through the same forward
    (`token_logprobs`: logits of the response positions only), a plain token-mean
    log-likelihood, backward. With `optimizer`: plus clip_grad_norm_ and its step."""
    from lopti_minimal.grpo import token_logprobs
    model.train()
    B = batch.input_ids.shape[0]
    mask = batch.response_mask
    n_tok = float(mask.sum())
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    for s in range(0, B, cfg.micro_batch_size):
        mb = slice(s, s + cfg.micro_batch_size)
        logp = token_logprobs(model, batch.input_ids[mb], batch.attention_mask[mb],
                              batch.prompt_len, cfg.temperature)
        (-(logp * mask[mb]).sum() / n_tok).backward()
    if optimizer is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
    model.zero_grad(set_to_none=True)


def part_update(S: Setup, args) -> dict:
    from lopti_minimal import trainer as T
    from lopti_minimal.grpo import batch_logprobs
    from lopti_minimal.precision import autocast, build_optimizer
    cfg = S.cfg
    S.reset_weights()
    batch, grpo, ar_batch, ar_lopti = rollout_batch(S)
    n_resp = int(batch.response_mask.sum())
    n_all = int(batch.attention_mask.sum())
    B, L = batch.input_ids.shape
    opt = build_optimizer(S.model, cfg)
    bare_fwd_bwd(S, batch, cfg, opt)                  # AdamW state exists before any timing
    opt_state = copy.deepcopy(opt.state_dict())

    def restore():
        S.reset_weights()
        opt.load_state_dict(copy.deepcopy(opt_state))

    cases = {
        "logprobs (no grad)": lambda: batch_logprobs(S.model, batch, cfg),
        "bare fwd+bwd": lambda: bare_forward_backward(S.model, batch, cfg),
        "bare fwd+bwd+AdamW": lambda: bare_forward_backward(S.model, batch, cfg, opt),
        "grpo_update": lambda: T.update(S.model, opt, batch, grpo, 0),
        "lopti_update (AR)": lambda: T.update(S.model, opt, ar_batch, ar_lopti, 0),
    }
    times = {k: [] for k in cases}
    for r in range(args.repeats + 1):                  # round 0 is the warm-up
        for name, fn in cases.items():
            restore()
            with autocast(cfg, S.device):
                dt, _ = timed(fn, S.sync)
            if r:
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"rows": B, "seq_len": L, "prompt_len": batch.prompt_len, "response_tokens": n_resp,
           "all_tokens": n_all, "micro_batch": cfg.micro_batch_size,
           **{f"{k}_s": v for k, v in med.items()},
           "update_over_bare": med["grpo_update"] / med["bare fwd+bwd"],
           "update_over_bare_opt": med["grpo_update"] / med["bare fwd+bwd+AdamW"],
           "lopti_over_grpo_update": med["lopti_update (AR)"] / med["grpo_update"],
           "update_resp_tok_s": n_resp / med["grpo_update"]}
    print(f"\n[update] {B} rows x {L} positions (prompt {batch.prompt_len}), {n_resp} response "
          f"tokens, micro-batch {cfg.micro_batch_size}, autocast bf16 {cfg.autocast_bf16 and S.device.type == 'cpu'}, "
          f"median of {args.repeats}")
    print(f"{'':22}{'seconds':>9}{'resp tok/s':>12}")
    for k, v in med.items():
        print(f"{k:22}{v:>9.3f}{n_resp / v:>12.0f}")
    print(f"grpo_update / bare fwd+bwd        = {res['update_over_bare']:.2f}  (goal <= 1.3)")
    print(f"grpo_update / bare fwd+bwd+AdamW  = {res['update_over_bare_opt']:.2f}")
    print(f"lopti_update(AR) / grpo_update    = {res['lopti_over_grpo_update']:.2f}  (two passes: floor ~2)")
    S.reset_weights()
    return res


def bare_fwd_bwd(S, batch, cfg, opt):
    from lopti_minimal.precision import autocast
    with autocast(S.cfg, S.device):
        bare_forward_backward(S.model, batch, cfg, opt)


# ------------------------------------------------------------------------------- step


class PhaseTimers:
    """Timers wrapped around the functions trainer.rl_step calls, installed for the
    duration of a `with` block. Its make_batch calls trainer.rollout and
    trainer.batch_logprobs (grpo's, imported into trainer) by their module-global names, so
    patching those attributes of trainer reaches exactly those calls (the mechanism's and
    lopti.py's own bindings are untouched)."""

    def __init__(self, ref):
        self.ref = ref
        self.t = {}
        self.batch = self.rollout = None     # the update's batch, the sampler's rollout (FLOPs)

    def add(self, k, dt):
        self.t[k] = self.t.get(k, 0.0) + dt

    def reward(self, text, record):
        from lopti_minimal.trainer import default_reward
        t = time.perf_counter()
        out = default_reward(text, record)
        self.add("reward", time.perf_counter() - t)
        return out

    @contextlib.contextmanager
    def installed(self):
        from lopti_minimal import trainer
        orig_blp, orig_rollout = trainer.batch_logprobs, trainer.rollout

        def blp(model, batch, config):
            t = time.perf_counter()
            out = orig_blp(model, batch, config)
            self.add("ref_logp" if model is self.ref else "old_logp", time.perf_counter() - t)
            self.batch = batch
            return out

        def ro(*a, **k):
            t = time.perf_counter()
            out = orig_rollout(*a, **k)
            self.add("sampling", time.perf_counter() - t)
            self.rollout = out
            return out

        trainer.batch_logprobs, trainer.rollout = blp, ro
        try:
            yield self
        finally:
            trainer.batch_logprobs, trainer.rollout = orig_blp, orig_rollout


def phase_flops(S: Setup, cfg, timers: PhaseTimers) -> dict:
    """Model FLOPs of the phases of the step `timers` watched (benchmarks/flops.py: real
    tokens, recomputation not counted): sampling, each no-grad log-prob pass, the update
    (fwd+bwd over the whole batch per optimizer pass: Lopti's two stages x ppo_epochs)."""
    import flops as F
    s, b = F.Shapes.of(S.model.config), timers.batch
    if b is None:            # neither pi_old recomputed nor pi_ref: no pass showed the batch
        return {}
    fwd = F.batch_flops(s, b.attention_mask, b.response_mask, backward=False)["total"]
    passes = cfg.ppo_epochs * (2 if cfg.uses_lopti else 1)
    return {"sampling": F.rollout_flops(s, timers.rollout, cfg.group_size)["total"],
            "old_logp": fwd if cfg.recompute_old_logprobs else 0, "ref_logp": fwd if cfg.kl_coef else 0,
            "update": passes * F.batch_flops(s, b.attention_mask, b.response_mask, backward=True)["total"]}


def phase_limits(S: Setup, timers: PhaseTimers) -> dict:
    """The machine's matmul limit of each phase at its shapes, measured now (flops.py), with
    the allocator out of the way: under the run's mmap threshold every product's output and
    oneDNN's scratch buffers would be fresh mappings (their page faults are the run's cost,
    not the machine's limit), so a 1 GiB threshold while measuring, the run's after."""
    import flops as F
    from lopti_minimal import host_memory
    s, cache, mb = F.Shapes.of(S.model.config), {}, S.cfg.micro_batch_size
    if timers.batch is None:
        return {}
    host_memory.limit_heap_growth(1 << 30)
    try:
        no_grad = F.pass_limits(s, timers.batch, mb, False, cache)
        return {"sampling": F.decode_limits(s, timers.rollout, cache), "old_logp": no_grad,
                "ref_logp": no_grad, "update": F.pass_limits(s, timers.batch, mb, True, cache)}
    finally:
        host_memory.bound_process_memory(S.cfg.mmap_threshold_mb)


def run_steps(S: Setup, method: str, steps: int, warmup_step: int = 10_000) -> list[dict]:
    """`steps` RL steps of one method, each from the same initial weights and the same
    post-warm-up optimizer state, with the phase split."""
    from lopti_minimal import host_memory, trainer as T
    from lopti_minimal.precision import build_optimizer
    cfg = replace(S.cfg, method=method)
    S.reset_weights()
    opt = build_optimizer(S.model, cfg)
    rec, pr = S.step_prompts(warmup_step)
    T.rl_step(S.model, S.ref, opt, S.tok, rec, pr, cfg, warmup_step)      # warm-up, unmeasured
    opt_state = copy.deepcopy(opt.state_dict())
    out = []
    for step in range(steps):
        S.reset_weights()
        opt.load_state_dict(copy.deepcopy(opt_state))
        rec, pr = S.step_prompts(step)
        timers = PhaseTimers(S.ref)
        host_memory.reset_peak_rss()
        with timers.installed():
            m = T.rl_step(S.model, S.ref, opt, S.tok, rec, pr, cfg, step, reward_fn=timers.reward)
        ph = {k: timers.t.get(k, 0.0) for k in ("sampling", "reward", "old_logp", "ref_logp")}
        if cfg.recompute_old_logprobs and ph["old_logp"] == 0.0:
            raise RuntimeError("rl_step no longer calls trainer.batch_logprobs for pi_old: update PhaseTimers")
        ph["update"] = m["update_s"]
        ph["step"] = m["step_s"]
        ph["other"] = ph["step"] - sum(ph[k] for k in ("sampling", "reward", "old_logp", "ref_logp", "update"))
        ph["tokens"] = m["tokens"]
        ph["peak_rss_gb"] = host_memory.peak_rss_gb()      # the process's peak during the step
        ph["flops"] = phase_flops(S, cfg, timers)
        out.append(ph)
    S.reset_weights()
    out[0]["limits"] = phase_limits(S, timers)      # the last step's shapes
    return out


def part_step(S: Setup, args) -> dict:
    cols = ("sampling", "reward", "old_logp", "ref_logp", "update", "other", "step")
    res = {}
    for method in args.methods:
        rows = run_steps(S, method, args.steps)
        res[method] = {k: statistics.median(r[k] for r in rows) for k in (*cols, "tokens", "peak_rss_gb")}
        res[method]["per_step"] = rows
        res[method]["limits"] = rows[0].pop("limits")
        res[method]["achieved"] = {k: statistics.median(r["flops"][k] / r[k] for r in rows if r[k] > 0)
                                   for k in rows[0]["flops"] if rows[0]["flops"][k]}
    cfg = S.cfg
    print(f"\n[step] {cfg.prompts_per_step} prompts x G={cfg.group_size}, <= {cfg.max_new_tokens} new "
          f"tokens, micro-batch {cfg.micro_batch_size}, median of {args.steps} steps from the same "
          f"weights (same rollouts for every method)")
    print(f"{'method':10}" + "".join(f"{c:>10}" for c in cols) + f"{'tokens':>8}{'upd tok/s':>10}{'peak GB':>9}")
    for method, r in res.items():
        print(f"{method:10}" + "".join(f"{r[c]:>10.3f}" for c in cols) + f"{r['tokens']:>8.0f}"
              f"{r['tokens'] / r['update']:>10.0f}{r['peak_rss_gb']:>9.2f}")
    print_achieved(res)
    if "grpo" in res and "ar_lopti" in res:
        res["lopti_overhead_step"] = res["ar_lopti"]["step"] / res["grpo"]["step"]
        res["lopti_overhead_update"] = res["ar_lopti"]["update"] / res["grpo"]["update"]
        print(f"Lopti overhead: AR+Lopti step / GRPO step = {res['lopti_overhead_step']:.2f} (goal <= 1.5); "
              f"update phase {res['lopti_overhead_update']:.2f}")
    return res


def print_achieved(res: dict) -> None:
    """Each phase's achieved model FLOP/s beside this machine's matmul limit at its shapes."""
    print("achieved model TFLOP/s per phase (benchmarks/flops.py) / the matmul limit at its "
          "shapes, bf16 and float32, measured in this run: achieved / the faster limit")
    for method, r in res.items():
        for phase, a in r["achieved"].items():
            lim = r["limits"][phase]
            r.setdefault("of_limit", {})[phase] = a / lim["best"]
            print(f"  {method:10}{phase:10}{a / 1e12:>8.3f}  limit bf16 {lim['bf16'] / 1e12:.3f}, float32 "
                  f"{lim['float32'] / 1e12:.3f}  -> {a / lim['best']:.1%}")


# ----------------------------------------------------------------------------- memory


def memory_child(args) -> dict:
    """In a fresh process: one small warm-up RL step, then one full step; peak - baseline."""
    from lopti_minimal import host_memory, trainer as T
    from lopti_minimal.precision import build_optimizer
    cfg = make_cfg(args, gradient_checkpointing=args.child == "on")
    S = Setup(cfg)
    opt = build_optimizer(S.model, cfg)
    small = replace(cfg, prompts_per_step=1, group_size=2, max_new_tokens=8)
    rec, pr = S.step_prompts(10_000)
    T.rl_step(S.model, S.ref, opt, S.tok, rec[:1], pr[:1], small, 10_000)
    S.reset_weights()
    if S.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = host_memory.rss_gb() * 2**30
        host_memory.reset_peak_rss()      # Linux; elsewhere the peak includes the loading
    rec, pr = S.step_prompts(0)
    t = time.perf_counter()
    m = T.rl_step(S.model, S.ref, opt, S.tok, rec, pr, cfg, 0)
    dt = time.perf_counter() - t
    if S.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = host_memory.peak_rss_gb() * 2**30    # without a reset: the process's peak so far
    return {"checkpointing": args.child == "on", "peak_step_mib": (peak - base) / 2**20,
            "baseline_mib": base / 2**20, "step_s": dt, "update_s": m["update_s"],
            "tokens": m["tokens"], "device": S.device.type}


def part_memory(args) -> dict:
    res = {}
    base_argv = list(sys.argv[1:])
    for mode in ("off", "on"):
        cmd = [sys.executable, os.path.abspath(__file__), *base_argv, "--child", mode]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        res[mode] = json.loads(out.strip().splitlines()[-1])
    off, on = res["off"], res["on"]
    print(f"\n[memory] one RL step ({args.prompts or 'preset'} prompts), fresh process per mode, "
          f"peak - baseline after a small warm-up step ({off['device']})")
    print(f"{'':24}{'peak step memory':>18}{'step s':>9}{'update s':>10}{'tokens':>8}")
    for name, r in (("without checkpointing", off), ("with checkpointing", on)):
        print(f"{name:24}{r['peak_step_mib']:>14.0f} MiB{r['step_s']:>9.2f}{r['update_s']:>10.2f}{r['tokens']:>8}")
    saved = 1 - on["peak_step_mib"] / off["peak_step_mib"]
    slower = on["step_s"] / off["step_s"]
    print(f"memory saved {saved:.0%} (goal >= 40%), step time x{slower:.2f} (goal <= 1.4)")
    print("(the two steps sample the same rollouts only if the model's numerics do not change with "
          "checkpointing; compare `tokens`)")
    return res


# ---------------------------------------------------------------------------- profile


def part_profile(S: Setup, args) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function
    from lopti_minimal import trainer as T
    from lopti_minimal.precision import build_optimizer
    cfg = replace(S.cfg, method=args.methods[-1])
    S.reset_weights()
    opt = build_optimizer(S.model, cfg)
    rec, pr = S.step_prompts(10_000)
    T.rl_step(S.model, S.ref, opt, S.tok, rec, pr, cfg, 10_000)
    S.reset_weights()
    rec, pr = S.step_prompts(0)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if S.device.type == "cuda" else [])
    with profile(activities=acts, record_shapes=False) as prof:
        with record_function("rl_step"):
            m = T.rl_step(S.model, S.ref, opt, S.tok, rec, pr, cfg, 0)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    print(f"\n[profile] one {cfg.method} step under torch.profiler (step {m['step_s']:.2f}s, "
          f"sample {m['sample_s']:.2f}s, update {m['update_s']:.2f}s; the profiler's own overhead "
          f"inflates every figure)")
    print(table)
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"chrome trace: {args.trace}")
    S.reset_weights()
    return {"method": cfg.method, "step_s": m["step_s"], "table": table}


# ------------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny", help="trainer preset whose settings are used")
    ap.add_argument("--model", help="model folder (default: the preset's)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--prompts", type=int, help="prompts per step (default: the preset's)")
    ap.add_argument("--group-size", type=int, help="G (default: the preset's)")
    ap.add_argument("--max-new-tokens", type=int, help="default: the preset's")
    ap.add_argument("--micro-batch-size", type=int, help="default: the preset's")
    ap.add_argument("--steps", type=int, default=3, help="measured RL steps per method (part step)")
    ap.add_argument("--repeats", type=int, default=3, help="measured repeats (parts sampler, update)")
    ap.add_argument("--methods", nargs="+", default=["grpo", "ar_lopti"])
    ap.add_argument("--parts", nargs="+", default=list(PARTS[:4]), choices=PARTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="another TrainConfig value, e.g. mmap_threshold_mb=8 (repeatable)")
    ap.add_argument("--top", type=int, default=25, help="operators shown by part profile")
    ap.add_argument("--trace", help="part profile: also write a chrome trace here")
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(memory_child(args)))
        return 0
    info = machine_info(args.threads)
    cfg = make_cfg(args)
    print(f"machine: {info['cpu']}, {info['cores']} cores, {args.threads} torch thread(s), "
          f"torch {info['torch']}, transformers {info['transformers']}, {info['date']}"
          + (f", load avg {info['loadavg_1m']:.2f}" if "loadavg_1m" in info else ""))
    print(f"model: {cfg.model}, preset {cfg.preset}, {cfg.prompts_per_step} prompts x G={cfg.group_size}, "
          f"<= {cfg.max_new_tokens} new tokens, T {cfg.temperature}, micro-batch {cfg.micro_batch_size}")
    results = {"machine": info, "config": {k: getattr(cfg, k) for k in (
        "model", "preset", "prompts_per_step", "group_size", "max_new_tokens", "micro_batch_size",
        "temperature", "autocast_bf16", "gradient_checkpointing", "kl_coef")}}
    S = None
    for part in args.parts:
        if part == "memory":
            results["memory"] = part_memory(args)
            continue
        if S is None:
            S = Setup(cfg)
        results[part] = {"sampler": part_sampler, "update": part_update, "step": part_step,
                         "profile": part_profile}[part](S, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
