"""One LoptiGRPOTrainer update on fixed completions, run by every process of
`accelerate launch` (tests/test_trl_multiprocess.py); not a test module itself.

    accelerate launch --cpu --num_processes 2 tests/trl_ddp_update.py SETTING.json OUT_DIR

SETTING.json: the model folder, prompts and completions of test_trl_grpo's `setting`. Each
process writes OUT_DIR/rank<r>.pt: per variant the parameters before and after, the gradient
of each optimizer step (after DDP's all-reduce) and its rows of the scored generation batch.
Variants: "global", the trainer as shipped; "per_rank", the same with each process's
token-mean taken over its own tokens only (the wrong denominator the test must catch).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_trl_grpo as base  # noqa: E402


def per_rank_denominator(trainer):
    """Replace the generation batch's global token count by this process's own count x the
    process count, so TRL's normalizer (count / processes) is the local count."""
    orig = trainer._generate_and_score_completions

    def score(inputs):
        out = orig(inputs)
        local = out["completion_mask"].sum()
        out["num_items_in_batch"] = local * trainer.accelerator.num_processes
        return out
    trainer._generate_and_score_completions = score


def run(setting_path: str, out_dir: str, method: str = "ar_lopti") -> dict:
    from transformers import AutoTokenizer
    torch.set_num_threads(1)
    setting = json.load(open(setting_path))
    setting["tok"] = AutoTokenizer.from_pretrained(setting["dir"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    results = {}
    for variant, patch in (("global", None), ("per_rank", per_rank_denominator)):
        scored = []
        p0, p1, grads = base.run_trl(setting, method, tmp=os.path.join(out_dir, "trl"), scored=scored,
                                     num_processes=world, patch=patch)
        keep = ("completion_ids", "completion_mask", "old_per_token_logps", "advantages", "num_items_in_batch")
        results[variant] = dict(p0=p0, p1=p1, grads=grads, scored={k: scored[0][k] for k in keep})
    rank = int(os.environ.get("RANK", "0"))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    return results


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
