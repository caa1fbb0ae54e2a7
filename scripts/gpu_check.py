"""One command for a real GPU: a few RL steps of a GPU preset, with its settings, on a
randomly initialised model of a real shape; prints what a user needs to trust the GPU path.

    python scripts/gpu_check.py                          # qwen2.5-0.5b preset, Qwen2.5-0.5B's shape
    python scripts/gpu_check.py --preset qwen2.5-1.5b --steps 3 --out runs/gpu-check.json
    python scripts/gpu_check.py --preset qwen2.5-3b --lora-rank 16 --max-new-tokens 512
    python scripts/gpu_check.py --device cpu --shape scaled-down --prompts-per-step 2 \\
        --max-new-tokens 16                              # the same code on a CPU, in seconds

Design choices:

1. Offline and in memory: the model is a randomly initialised ``Qwen2ForCausalLM`` of the
   preset's shape (models.QWEN2_SHAPES; Qwen's 151,936-row vocabulary, so the logits cost
   what they cost), created on the device in the preset's weight dtype; the tokenizer is
   the shipped tiny one with a ChatML chat template (models.chatml_tokenizer), so prompts
   take the instruct path. Speed and memory depend on shapes, not on the weights' values.
   Nothing is written to disk: a 3B model's checkpoints would cost a minute of I/O per run.
2. The preset's settings and the trainer's own step: the policy (gradient checkpointing),
   pi_ref, the LoRA adapters (--lora-rank) and the optimizer are set up in the order
   trainer.train sets them up, and each step is trainer.rl_step (precision policy,
   micro-batches, rollout_chunk, lr, AR+Lopti); only the run directory (logs, checkpoints,
   the final save) is left out. A random model rarely samples EOS, so every response runs
   to the token budget: the worst case for time and memory. Fewer prompts per step than
   the preset (default one rollout chunk) keep the check to minutes; the peak memory does
   not depend on the number of chunks (they are sampled one at a time).
3. Memory per phase of each step (torch.cuda.max_memory_allocated, and the allocator's
   reserved memory): "sample" (trainer.rollout), "optimizer" (inside optimizer.step) and
   "update" (the rest: the forward passes of pi_old, pi_ref and the mechanism, the
   forward and backward of the update). The optimizer's state is created by its first
   step, so in step 1 neither the sampling nor the backward holds it yet: the peak of
   every later step is projected from step 1 as max(sample + state, update + state,
   optimizer), state = what step 1 left allocated; a second step measures it (and checks
   the projection). The estimate (gpu_memory.memory_estimate_gb) is computed for the rows
   and the sequence length this check ran (one rollout chunk; its prompt length plus the
   token budget), so the measured peak checks the estimator, which gives the preset's own
   figure ("estimate_preset_gb").
4. What it prints: per step the seconds of sampling and of the update, and of the
   optimizer step within it (the first step of torchao's 8-bit AdamW includes
   torch.compile of its kernels); the peaks against the estimate; the first ratio (fresh
   samples: it must be exactly 1); whether the weights moved (at lr 1e-6: float32 master
   weights or stochastic rounding must keep the update; with LoRA the adapters, and
   whether a merge into the bf16 weights, as a saved checkpoint does, keeps their update).
5. The JSON (--out) names the GPU and the versions, and is rewritten after each phase, so
   a run stopped by a timeout keeps what it measured ("complete": false).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESET_SHAPES = {"qwen2.5-0.5b": "qwen2.5-0.5b", "qwen2.5-1.5b": "qwen2.5-1.5b", "qwen2.5-3b": "qwen2.5-3b"}
PHASES = ("sample", "update", "optimizer")


def parse_args(argv=None):
    from lopti_minimal.models import QWEN2_SHAPES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESET_SHAPES))
    ap.add_argument("--shape", choices=sorted(QWEN2_SHAPES), help="model shape (default: the preset's)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts-per-step", type=int, help="default: one rollout chunk of the preset")
    ap.add_argument("--max-new-tokens", type=int, help="default: the preset's (4,096)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="train LoRA adapters of this rank instead of all weights (train.py --lora-rank; needs peft)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="also write the figures as JSON here (rewritten after each phase)")
    return ap.parse_args(argv)


def versions() -> dict:
    """What the figures were measured with: the GPU and the software."""
    import torch
    import transformers
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    for name in ("peft", "torchao"):     # without importing them (torchao is slow to import)
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 1e9, 1),
                   compute_capability=f"{props.major}.{props.minor}")
    return out


class Meter:
    """Peak GPU memory and seconds of a step's phases. A phase's peak is read, and the
    peak statistics reset, at each of its boundaries (rollout in and out, optimizer.step in
    and out, step end), so "update" is everything of the step outside the other two. On a
    CPU there are only the seconds."""

    def __init__(self, cuda: bool):
        import torch
        self.torch, self.cuda = torch, cuda
        self.start_step()

    def start_step(self):
        self.peak = {p: 0.0 for p in PHASES}
        self.reserved = {p: 0.0 for p in PHASES}
        self.optimizer_s = []
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def close(self, phase: str):
        """The interval since the last boundary belongs to ``phase``."""
        if self.cuda:
            cuda = self.torch.cuda
            cuda.synchronize()
            self.peak[phase] = max(self.peak[phase], cuda.max_memory_allocated() / 1e9)
            self.reserved[phase] = max(self.reserved[phase], cuda.max_memory_reserved() / 1e9)
            cuda.reset_peak_memory_stats()

    def allocated_gb(self) -> float | None:
        return self.torch.cuda.memory_allocated() / 1e9 if self.cuda else None

    def wrap_rollout(self, rollout, on_sampled):
        def measured(*args, **kw):
            self.close("update")
            t = time.perf_counter()
            batch = rollout(*args, **kw)
            self.close("sample")
            on_sampled(batch, time.perf_counter() - t)
            return batch
        return measured

    def wrap_optimizer(self, optimizer):
        step = optimizer.step

        def measured(*args, **kw):
            self.close("update")
            t = time.perf_counter()
            out = step(*args, **kw)
            if self.cuda:
                self.torch.cuda.synchronize()
            self.optimizer_s.append(time.perf_counter() - t)
            self.close("optimizer")
            return out
        optimizer.step = measured


def watched_parameter(model):
    """(name, parameter) whose movement says whether the update was kept: layer 0's MLP
    up-projection, or with LoRA its B adapter (zero at the start: any update shows)."""
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad and "layers.0.mlp.up_proj" in n]
    return next(((n, p) for n, p in trained if "lora_B" in n), trained[0])


def run(a, write=lambda r: None) -> dict:
    import torch
    from transformers import AutoTokenizer
    from lopti_minimal import models, plumbing, precision, trainer
    from lopti_minimal.config import make_config
    preset = make_config(a.preset, device=a.device)
    precision.check_hardware(preset)       # no CUDA, or no bf16: say so (a TrainError) before building
    shape = a.shape or PRESET_SHAPES[a.preset]
    cfg = make_config(
        a.preset, model=f"random {shape}", device=a.device, steps=a.steps,
        prompts_per_step=a.prompts_per_step or preset.rollout_chunk, lora_rank=a.lora_rank,
        max_new_tokens=a.max_new_tokens, max_prompt_len=1024, rl_sizes=(3,), rl_per_size=64,
        final_eval=False, eval_every=0, save_every=0, progress=False, plots=False)
    device = plumbing.resolve_device(cfg)
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    r = {"preset": a.preset, "shape": shape, "lora_rank": cfg.lora_rank, "device": str(device),
         **versions(), "dtype": cfg.dtype, "optimizer": cfg.optimizer, "lr": cfg.lr,
         "prompts_per_step": cfg.prompts_per_step, "group_size": cfg.group_size,
         "rollout_rows": min(cfg.rollout_chunk or cfg.prompts_per_step, cfg.prompts_per_step) * cfg.group_size,
         "max_new_tokens": cfg.max_new_tokens, "steps": [], "complete": False}

    # The policy, pi_ref, the adapters and the optimizer, in trainer.train's order
    # (plumbing.load_policy: master dtype on the device, gradient checkpointing).
    tok = models.chatml_tokenizer(AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "tiny-warm"))
    vocab = models.QWEN2_VOCAB if shape != "scaled-down" else None
    model = models.random_qwen2(tok, shape, vocab_size=vocab, device=device,
                                dtype=precision.master_dtype(cfg)).eval()
    models.set_gradient_checkpointing(model, cfg.gradient_checkpointing)
    c = model.config
    arch = {"params": models.count_parameters(model), "layers": c.num_hidden_layers,
            "kv_heads": c.num_key_value_heads, "head_dim": c.hidden_size // c.num_attention_heads,
            "vocab": c.vocab_size}
    ref = precision.reference_copy(model, precision.ref_dtype(cfg)) if cfg.kl_coef else None
    base_up = model.model.layers[0].mlp.up_proj.weight.detach().float().cpu().clone()
    if cfg.lora_rank:
        from lopti_minimal.lora import add_lora
        model = add_lora(model, cfg.lora_rank, seed=cfg.seed)
    optimizer = precision.build_optimizer(model, cfg)
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    records, prompt_ids = models.encode_prompts(records, tok, cfg.prompt_style, cfg.max_prompt_len)
    name, watched = watched_parameter(model)
    w0 = watched.detach().float().cpu().clone()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    r.update(params=arch["params"], trainable_params=trainable, watched=name,
             build_s=round(time.perf_counter() - t0, 1))

    meter = Meter(cuda)
    sampled = {}

    def on_sampled(batch, seconds):   # the rollout's shape; its figures, kept should the update not end
        sampled.update(prompt_len=batch.prompt_len, width=batch.response_ids.shape[1])
        r["prompt_len"] = batch.prompt_len
        r["last_sampling"] = {"step": len(r["steps"]) + 1, "seconds": round(seconds, 2), "width": sampled["width"],
                              "peak_gb": round(meter.peak["sample"], 3) if cuda else None,
                              "reserved_gb": round(meter.reserved["sample"], 3) if cuda else None}
        write(r)
    rollout = trainer.rollout
    trainer.rollout = meter.wrap_rollout(rollout, on_sampled)   # rl_step calls it by this name
    meter.wrap_optimizer(optimizer)
    try:
        run_steps(model, ref, optimizer, tok, records, prompt_ids, cfg, meter, sampled, r, write)
    finally:
        trainer.rollout = rollout

    moved = float((watched.detach().float().cpu() != w0).float().mean())

    r["weights_moved_share"] = moved
    if cfg.lora_rank:
        # What a saved checkpoint keeps: the adapters merged into the base weights (in
        # float32, whatever the base's dtype: lora.py, choice 4), as runs.save_hf_atomic writes them.
        from lopti_minimal.lora import merged_copy
        meter.start_step()
        merged = merged_copy(model)
        meter.close("update")
        w = merged.model.layers[0].mlp.up_proj.weight.detach().float().cpu()
        r["merged_moved_share"] = float((w != base_up).float().mean())
        r["merge_peak_gb"] = round(meter.peak["update"], 3) if cuda else None
        del merged, w
    r.update(memory_summary(r["steps"]) if cuda else {"peak_gb": None})
    # The estimate for what ran (one rollout chunk; its prompt length plus the budget) ...
    from lopti_minimal.lora import adapter_parameters
    from lopti_minimal.gpu_memory import memory_estimate_gb, optimizer_states
    lora = adapter_parameters(c, cfg.lora_rank) if cfg.lora_rank else 0

    def estimate(rows, prompt, new):
        e = memory_estimate_gb(arch["params"], arch["layers"], arch["kv_heads"], arch["head_dim"],
                               arch["vocab"], rows=rows, seq=prompt + new, micro_batch=cfg.micro_batch_size,
                               optimizer=cfg.optimizer, weights=cfg.dtype, ref=cfg.ref_dtype,
                               new_tokens=new, lora_params=lora, optimizer_states=optimizer_states(cfg))
        base = e["weights"] + e["optimizer"] + e["reference"]
        return {**e, "sample": base + e["kv_cache"], "update": base + e["grads"] + e["logits"]}
    r["estimate_gb"] = estimate(r["rollout_rows"], sampled.get("prompt_len", cfg.max_prompt_len),
                                sampled.get("width", cfg.max_new_tokens))
    # ... and for the preset's own sizes (its rollout chunk, 400 + 4,096 tokens)
    r["estimate_preset_gb"] = estimate(preset.rollout_chunk * preset.group_size, preset.max_prompt_len,
                                       preset.max_new_tokens)
    r.update(wall_s=round(time.perf_counter() - t0, 1), complete=True)
    write(r)
    return r


def run_steps(model, ref, optimizer, tok, records, prompt_ids, cfg, meter, sampled, r, write) -> None:
    """cfg.steps steps of trainer.rl_step, each step's figures appended to r["steps"]."""
    from lopti_minimal import plumbing, trainer
    for step in range(cfg.steps):
        meter.start_step()
        before = meter.allocated_gb()
        idx = plumbing.step_prompt_indices(cfg.seed, step, cfg.prompts_per_step, len(records))
        m = trainer.rl_step(model, ref, optimizer, tok, [records[i] for i in idx], [prompt_ids[i] for i in idx],
                            cfg, step)
        meter.close("update")
        opt_s = sum(meter.optimizer_s)
        r["steps"].append({
            **{k: m[k] for k in ("step", "sample_s", "update_s", "step_s", "response_len", "tokens",
                                 "ratio_min", "ratio_max")},
            "optimizer_s": round(opt_s, 3),
            "optimizer_calls": len(meter.optimizer_s),
            # per-token decode time (a random model's responses all run to the budget) and the
            # update's time per response without the optimizer (whose first step compiles)
            "sample_ms_per_token": round(1e3 * m["sample_s"] / max(sampled.get("width", 0), 1), 2),
            "update_s_per_row": round((m["update_s"] - opt_s) / (cfg.prompts_per_step * cfg.group_size), 3),
            "peak_gb": {k: round(v, 3) for k, v in meter.peak.items()} if meter.cuda else None,
            "reserved_gb": {k: round(v, 3) for k, v in meter.reserved.items()} if meter.cuda else None,
            "allocated_before_gb": before, "allocated_after_gb": meter.allocated_gb()})
        r["first_ratio"] = [r["steps"][0]["ratio_min"], r["steps"][0]["ratio_max"]]
        write(r)


def memory_summary(steps: list[dict]) -> dict:
    """The measured peak, and the peak of a step that holds the optimizer state from its
    start: step 2's where it ran, and always as projected from step 1 (design choice 3)."""
    first = steps[0]
    state = first["allocated_after_gb"] - first["allocated_before_gb"]    # what step 1 created and kept
    pk = first["peak_gb"]
    projected = max(pk["sample"] + state, pk["update"] + state, pk["optimizer"])
    later = [max(s["peak_gb"].values()) for s in steps[1:]]
    return {"peak_gb": round(max(max(s["peak_gb"].values()) for s in steps), 3),
            "reserved_peak_gb": round(max(max(s["reserved_gb"].values()) for s in steps), 3),
            "optimizer_state_gb": round(state, 3),
            "projected_steady_peak_gb": round(projected, 3),
            "steady_peak_gb": round(max(later), 3) if later else round(projected, 3),
            "steady_peak_from": "measured (step 2 on)" if later else "projected from step 1"}


def report(r: dict) -> str:
    lora = f" + LoRA r{r['lora_rank']}" if r["lora_rank"] else ""
    lines = [f"gpu check: preset {r['preset']}{lora}, shape {r['shape']} ({r['params'] / 1e6:.1f}M params, "
             f"{r['trainable_params'] / 1e6:.1f}M trained, random init), {r['dtype']} weights, {r['optimizer']}, "
             f"device {r['device']} {r.get('gpu') or ''}",
             f"per step: {r['prompts_per_step']} prompts x G={r['group_size']}, prompt {r.get('prompt_len')} "
             f"+ up to {r['max_new_tokens']} new tokens; torch {r['torch']}, transformers {r['transformers']}",
             "step | sample s | update s | (optimizer s) | ms/token | peak GB sample / update / optimizer"]
    for s in r["steps"]:
        pk = " / ".join(f"{s['peak_gb'][p]:.2f}" for p in PHASES) if s["peak_gb"] else "n/a (no CUDA)"
        lines.append(f"{s['step']:>4} | {s['sample_s']:8.1f} | {s['update_s']:8.1f} | {s['optimizer_s']:13.1f} | "
                     f"{s['sample_ms_per_token']:8.1f} | {pk}")
    e = r["estimate_gb"]
    if r["peak_gb"] is not None:
        lines.append(f"peak memory: {r['peak_gb']:.2f} GB (reserved {r['reserved_peak_gb']:.2f}); a step holding "
                     f"the optimizer state: {r['steady_peak_gb']:.2f} GB ({r['steady_peak_from']})")
    else:
        lines.append("peak memory: n/a (no CUDA)")
    lines += [f"estimate for this run: sample {e['sample']:.2f} GB, update {e['update']:.2f} GB (weights "
              f"{e['weights']:.2f}, grads {e['grads']:.2f}, optimizer {e['optimizer']:.2f}, reference "
              f"{e['reference']:.2f}, KV {e['kv_cache']:.2f}, logits {e['logits']:.2f}); for the preset's own "
              f"sizes: {r['estimate_preset_gb']['peak']:.1f} GB",
              f"first ratio: min {r['first_ratio'][0]} max {r['first_ratio'][1]} "
              f"({'OK' if r['first_ratio'] == [1.0, 1.0] else 'NOT 1: investigate'})",
              f"weights moved: {r['weights_moved_share']:.1%} of {r['watched']} "
              f"({'OK' if r['weights_moved_share'] > 0 else 'NO UPDATE: investigate'})"]
    if r["lora_rank"]:
        lines.append(f"merged into the {r['dtype']} weights (a saved checkpoint): {r['merged_moved_share']:.2%} "
                     f"of layer 0's up-projection changed")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    from lopti_minimal.config import TrainError

    def write(r):
        if a.out:                            # atomically: a reader never sees half a file
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            tmp = Path(a.out + ".tmp")
            tmp.write_text(json.dumps(r, indent=1))
            os.replace(tmp, a.out)
    try:
        r = run(a, write)
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(r))
    return 0 if r["first_ratio"] == [1.0, 1.0] and r["weights_moved_share"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
