"""K&K RL with TRL's GRPOTrainer + AR + Lopti (lopti_minimal/trl_grpo.py): our data, our
reward, our settings, TRL's training loop (generation, accelerate, DeepSpeed, logging).

    pip install -r requirements.txt
    python scripts/train_trl.py                                  # tiny warm start, CPU, AR+Lopti
    python scripts/train_trl.py --method grpo --steps 10         # the baseline
    python scripts/train_trl.py --preset ci                      # seconds: every part once
    accelerate launch --config_file configs/accelerate_1gpu.yaml scripts/train_trl.py \
        --preset qwen2.5-0.5b --model /path/to/Qwen2.5-0.5B-Instruct     # docs/GPU.md: Scaling out

What is the same as `train.py` (trainer.rl_step): the RL prompt set (plumbing.rl_prompt_set,
official test puzzles excluded), the prompt text (models.kk_prompt), the reward
(reward.score_response(...).total, the Logic-RL reward), the method and its paper settings
(config.paper_settings: AR alone alpha 0.2, Lopti alone eta 0.4, AR+Lopti 0.3 / 0.5), and
every optimisation setting of the preset, mapped onto TRL by trl_grpo.trl_grpo_args (the
table and what TRL cannot express are in that module). What differs: TRL samples with
transformers `generate` and its own random stream and prompt order, and it has no final
evaluation: evaluate the saved policy with `python eval.py --model RUN_DIR/final`.

One TRL optimizer step is one of our optimizer steps: --steps S makes S generation batches,
i.e. S optimizer steps for GRPO / AR and 2 S for Lopti (two stages per batch).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny", help="preset (lopti_minimal/config.py)")
    ap.add_argument("--model", help="model folder (default: the preset's)")
    ap.add_argument("--method", default="ar_lopti",
                    choices=["grpo", "ar", "lopti", "ar_lopti", "entropy_top", "cispo"],   # trl_grpo.TRL_METHODS
                    help="entropy_top and cispo: TRL's top_entropy_quantile / loss_type='cispo' "
                         "(docs/TOKEN_FIXES.md)")
    ap.add_argument("--alpha", type=float, help="AR strength (default: the paper's for the method)")
    ap.add_argument("--eta", type=float, help="Lopti threshold (default: the paper's for the method)")
    ap.add_argument("--lopti-order", default="low_first", choices=["low_first", "high_first"])
    ap.add_argument("--steps", type=int, help="generation batches (default: the preset's steps)")
    ap.add_argument("--prompts", type=int, help="prompts per step P")
    ap.add_argument("--group-size", type=int, help="G")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--micro-batch-size", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch intra-op threads")
    ap.add_argument("--device", help="cpu | cuda (default: the preset's; cpu-tiny: cuda if available)")
    ap.add_argument("--out", help="run folder (default runs/trl-<time>-<preset>-<method>-s<seed>)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    from datasets import Dataset

    from lopti_minimal import models, plumbing
    from lopti_minimal.config import make_config
    from lopti_minimal.runs import config_to_json
    from lopti_minimal.runs import RUNS_ROOT
    from lopti_minimal.models import kk_prompt
    from lopti_minimal.task.reward import score_response
    from lopti_minimal.trl_grpo import LoptiGRPOTrainer, make_trl_config

    cfg = make_config(args.preset, model=args.model, method=args.method, alpha=args.alpha,
                        eta=args.eta, lopti_order=args.lopti_order, steps=args.steps,
                        prompts_per_step=args.prompts, group_size=args.group_size,
                        max_new_tokens=args.max_new_tokens, micro_batch_size=args.micro_batch_size,
                        lr=args.lr, seed=args.seed, threads=args.threads, device=args.device,
                        progress=False, plots=False, final_eval=False)
    out = args.out or os.path.join(RUNS_ROOT, f"trl-{time.strftime('%Y%m%d-%H%M%S')}-{cfg.preset}-"
                                                 f"{cfg.method}-s{cfg.seed}")
    os.makedirs(out, exist_ok=True)

    # TRL loads the model itself from the folder (or hub id), on every process, in float32
    # (model_init_kwargs; ZeRO-3 shards it while loading). GGUF files are not supported here.
    from transformers import AutoTokenizer
    path = cfg.model
    if not os.path.isabs(path) and not os.path.exists(path) and os.path.exists(os.path.join(ROOT, path)):
        path = os.path.join(ROOT, path)
    if path.endswith(".gguf"):
        raise SystemExit("scripts/train_trl.py takes a Hugging Face folder or hub id, not a .gguf file")
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token          # as models.load_model_and_tokenizer
    tok.padding_side = "left"
    # Our prompt set and prompt text; prompts over max_prompt_len are dropped as in train.py.
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    records, prompt_ids = models.encode_prompts(records, tok, cfg.prompt_style, cfg.max_prompt_len)
    texts = [kk_prompt(r, tok, cfg.prompt_style) for r in records]
    # TRL tokenizes a text prompt with tokenizer(text): check it gives the ids we sample from.
    mismatched = sum(tok(text=t)["input_ids"] != i for t, i in zip(texts[:50], prompt_ids[:50]))
    if mismatched:
        print(f"WARNING: TRL's tokenization differs from ours on {mismatched}/50 prompts")
    dataset = Dataset.from_list([{"prompt": t, "kk_record": json.dumps(r)} for t, r in zip(texts, records)])

    def kk_reward(completions, kk_record, **_):
        """The Logic-RL reward of each completion (text after the prompt's "<think>")."""
        return [float(score_response(c, json.loads(r)).total) for c, r in zip(completions, kk_record)]

    use_cpu = plumbing.resolve_device(cfg).type == "cpu"
    # Under `accelerate launch` (configs/*.yaml) every process runs this script; our batch
    # sizes are global and trl_grpo_args divides them among the processes.
    n_proc = int(os.environ.get("WORLD_SIZE", "1"))
    n_per_batch = 2 if cfg.uses_lopti else cfg.ppo_epochs
    targs = make_trl_config(
        cfg, out, n_proc, max_steps=cfg.steps * n_per_batch, logging_steps=n_per_batch,
        report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=use_cpu,
        dataloader_num_workers=0, log_completions=False)
    trainer = LoptiGRPOTrainer(model=path, reward_funcs=kk_reward, args=targs, train_dataset=dataset,
                               processing_class=tok, cfg=cfg)
    print(f"{cfg.method} (alpha {trainer.alpha}, eta {trainer.eta}, {cfg.lopti_order}) on {cfg.model}: "
          f"{cfg.steps} steps x {cfg.prompts_per_step} prompts x G={cfg.group_size}, "
          f"<= {cfg.max_new_tokens} new tokens, lr {cfg.lr}, {len(dataset)} prompts; out {out}")
    t0 = time.perf_counter()
    trainer.train()
    trainer.save_model(os.path.join(out, "final"))
    tok.save_pretrained(os.path.join(out, "final"))
    with open(os.path.join(out, "log_history.jsonl"), "w") as f:
        for row in trainer.state.log_history:
            f.write(json.dumps(row) + "\n")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"ours": config_to_json(cfg), "trl": targs.to_dict()}, f, indent=1, default=str)
    rewards = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    print(f"done in {time.perf_counter() - t0:.0f}s; mean reward per logged step: "
          + " ".join(f"{r:+.2f}" for r in rewards))
    print(f"policy: {os.path.join(out, 'final')}  (python eval.py --model {os.path.join(out, 'final')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
