"""One command for a real GPU: a few RL steps of a GPU preset, with its settings, on a
randomly initialised model of a real shape; prints what a user needs to trust the GPU path.

    python scripts/gpu_check.py                          # qwen2.5-0.5b preset, Qwen2.5-0.5B's shape
    python scripts/gpu_check.py --preset qwen2.5-1.5b --steps 3 --out runs/gpu-check.json
    python scripts/gpu_check.py --device cpu --shape scaled-down --prompts-per-step 2 \\
        --max-new-tokens 16                              # the same code on a CPU, in seconds

Design choices:

1. Offline, nothing large carried: the model is a randomly initialised
   ``Qwen2ForCausalLM`` of the preset's shape (models.QWEN2_SHAPES; Qwen's 151,936-row
   vocabulary, so the logits cost what they cost), built on the machine itself; the
   tokenizer is the shipped tiny one with a ChatML chat template (models.chatml_tokenizer),
   so prompts take the instruct path. Speed and memory depend on shapes, not on the
   weights' values.
2. The preset's settings: precision policy, gradient checkpointing, micro-batches,
   rollout_chunk, lr, method (AR+Lopti). A random model rarely samples EOS, so every
   response runs to the token budget: the worst case for time and memory. Fewer prompts
   per step than the preset (default one rollout chunk) keep the check to minutes; the
   peak memory does not depend on the number of chunks (they are sampled one at a time).
3. What it prints: per step the seconds of sampling and of the update; the peak GPU memory
   (torch.cuda.max_memory_allocated) against plumbing.memory_estimate_gb for this shape;
   the first ratio (fresh samples: it must be exactly 1); whether the weights moved (at
   lr 1e-6: float32 master weights or stochastic rounding must keep the update).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESET_SHAPES = {"qwen2.5-0.5b": "qwen2.5-0.5b", "qwen2.5-1.5b": "qwen2.5-1.5b", "qwen2.5-3b": "qwen2.5-3b"}


def parse_args(argv=None):
    from lopti_minimal.models import QWEN2_SHAPES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESET_SHAPES))
    ap.add_argument("--shape", choices=sorted(QWEN2_SHAPES), help="model shape (default: the preset's)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts-per-step", type=int, help="default: one rollout chunk of the preset")
    ap.add_argument("--max-new-tokens", type=int, help="default: the preset's (4,096)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="also write the figures as JSON here")
    return ap.parse_args(argv)


def build_model(shape: str, folder: Path) -> dict:
    """Save a random Qwen2 of ``shape`` and the ChatML tokenizer in ``folder``."""
    from transformers import AutoTokenizer
    from lopti_minimal import models
    tok = models.chatml_tokenizer(AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "tiny-warm"))
    vocab = models.QWEN2_VOCAB if shape != "scaled-down" else None
    model = models.random_qwen2(tok, shape, vocab_size=vocab)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    c = model.config
    return {"params": models.count_parameters(model), "layers": c.num_hidden_layers,
            "kv_heads": c.num_key_value_heads, "head_dim": c.hidden_size // c.num_attention_heads,
            "vocab": c.vocab_size}


def first_weight(path: Path):
    from safetensors.torch import load_file
    w = load_file(Path(path) / "model.safetensors")
    return w["model.layers.0.mlp.up_proj.weight"].float()


def run(a) -> dict:
    import torch
    from lopti_minimal import trainer
    from lopti_minimal.config import make_config
    from lopti_minimal.plumbing import memory_estimate_gb
    from lopti_minimal.precision import check_hardware, master_dtype
    preset = make_config(a.preset, device=a.device)
    check_hardware(preset)                 # no CUDA, or no bf16: say so (a TrainError) before building
    shape = a.shape or PRESET_SHAPES[a.preset]
    with tempfile.TemporaryDirectory() as tmp:
        mdir, rdir = Path(tmp) / "model", Path(tmp) / "run"
        arch = build_model(shape, mdir)
        cfg = make_config(
            a.preset, model=str(mdir), device=a.device, steps=a.steps,
            prompts_per_step=a.prompts_per_step or preset.rollout_chunk,
            max_new_tokens=a.max_new_tokens, max_prompt_len=1024, rl_sizes=(3,), rl_per_size=64,
            final_eval=False, eval_every=0, save_every=0, run_dir=str(rdir), progress=False, plots=False)
        cuda = torch.device(cfg.device).type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = trainer.train(cfg, log=lambda s: print(s, flush=True))
        wall = time.perf_counter() - t0
        moved = float((first_weight(out["paths"]["final_model"])
                       != first_weight(mdir).to(master_dtype(cfg)).float()).float().mean())
    est = memory_estimate_gb(arch["params"], arch["layers"], arch["kv_heads"], arch["head_dim"],
                             arch["vocab"], rows=min(cfg.rollout_chunk or cfg.prompts_per_step,
                                                     cfg.prompts_per_step) * cfg.group_size,
                             seq=cfg.max_prompt_len + cfg.max_new_tokens,
                             micro_batch=cfg.micro_batch_size, optimizer=cfg.optimizer,
                             weights=cfg.dtype, ref=cfg.ref_dtype)
    m = out["metrics"]
    return {"preset": a.preset, "shape": shape, "device": str(cfg.device),
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "params": arch["params"], "dtype": cfg.dtype, "optimizer": cfg.optimizer,
            "prompts_per_step": cfg.prompts_per_step, "group_size": cfg.group_size,
            "max_new_tokens": cfg.max_new_tokens,
            "steps": [{k: s[k] for k in ("step", "sample_s", "update_s", "step_s", "response_len", "tokens")}
                      for s in m],
            "first_ratio": [m[0]["ratio_min"], m[0]["ratio_max"]],
            "weights_moved_share": moved,
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
            "estimate_gb": est, "wall_s": round(wall, 1)}


def report(r: dict) -> str:
    lines = [f"gpu check: preset {r['preset']}, shape {r['shape']} ({r['params'] / 1e6:.1f}M params, random "
             f"init), {r['dtype']} weights, {r['optimizer']}, device {r['device']} {r['gpu'] or ''}",
             f"per step: {r['prompts_per_step']} prompts x G={r['group_size']}, up to {r['max_new_tokens']} new tokens",
             "step | sample s | update s | total s | mean response tokens"]
    for s in r["steps"]:
        lines.append(f"{s['step']:>4} | {s['sample_s']:8.1f} | {s['update_s']:8.1f} | {s['step_s']:7.1f} | "
                     f"{s['response_len']:.0f}")
    e = r["estimate_gb"]
    peak = f"{r['peak_gb']:.1f} GB" if r["peak_gb"] is not None else "n/a (no CUDA)"
    lines += [f"peak memory: {peak}; estimate {e['peak']:.1f} GB (weights {e['weights']:.1f}, grads "
              f"{e['grads']:.1f}, optimizer {e['optimizer']:.1f}, reference {e['reference']:.1f}, "
              f"KV {e['kv_cache']:.1f}, logits {e['logits']:.1f})",
              f"first ratio: min {r['first_ratio'][0]} max {r['first_ratio'][1]} "
              f"({'OK' if r['first_ratio'] == [1.0, 1.0] else 'NOT 1: investigate'})",
              f"weights moved: {r['weights_moved_share']:.1%} of one MLP matrix "
              f"({'OK' if r['weights_moved_share'] > 0 else 'NO UPDATE: investigate'})"]
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    from lopti_minimal.config import TrainError
    try:
        r = run(a)
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(r))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        Path(a.out).write_text(json.dumps(r, indent=1))
    return 0 if r["first_ratio"] == [1.0, 1.0] and r["weights_moved_share"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
