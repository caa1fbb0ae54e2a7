"""Is an RL update's *direction* what changed a policy's accuracy, or only its size?

    python scripts/mirror_update.py --start checkpoints/smollm2-kk-sft-compact \\
        --policy runs/RUN/final --out runs/RUN-mirror
    python eval.py --model runs/RUN-mirror --data data/heldout3.jsonl --save-responses --out DIR/eval_heldout3.json

Writes the start moved by the policy's update with its sign flipped: every weight
W_start - (W_policy - W_start). The mirror is as far from the start as the policy (the same
norm, layer by layer), in the opposite direction. Evaluated on the same puzzles:

- the policy loses and the mirror gains: the update's direction is what lost (RL learned
  something, and it was the wrong thing);
- both lose about as much: any change of that size costs accuracy (the start's greedy
  decisions sit near ties, and a small move of either sign flips them), so the loss says
  nothing about what RL learned in so few steps.

Design choices:

1. **Weights in float32**, the start's own dtype on a CPU: the difference of two float32
   models is exact to float32 rounding, far below an update of RL (its relative norm is
   printed). Evaluation then decodes under bf16 autocast like every other policy (eval.py).
2. **The start as eval.py loads it** (models.load_model_and_tokenizer: a LoRA adapter folder
   merged into its base), so W_start is the very matrix the start's evaluation ran on.
3. Printed: the update's relative norm ||W_policy - W_start|| / ||W_start|| over all weights
   and the number of tensors it touched (LoRA touches only the adapted projections).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.models import load_model_and_tokenizer  # noqa: E402
from lopti_minimal.runs import save_hf_atomic  # noqa: E402


def mirror_state(start: dict, policy: dict) -> tuple[dict, float, int]:
    """(start - (policy - start), the update's relative norm, the tensors it changed)."""
    if start.keys() != policy.keys():
        raise SystemExit("the start and the policy have different parameters: not the same model")
    out, moved, total, changed = {}, 0.0, 0.0, 0
    for name, w in start.items():
        delta = policy[name].float() - w.float()
        out[name] = (w.float() - delta).to(w.dtype)
        moved += float(delta.pow(2).sum())
        total += float(w.float().pow(2).sum())
        changed += bool(delta.abs().max() > 0)
    return out, (moved / total) ** 0.5, changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--start", required=True, help="the policy RL started from (a model folder or LoRA adapter folder)")
    ap.add_argument("--policy", required=True, help="the RL run's policy (e.g. RUN/final)")
    ap.add_argument("--out", required=True, help="where to write the mirrored policy (a model folder)")
    a = ap.parse_args(argv)
    start, tokenizer = load_model_and_tokenizer(a.start, dtype=torch.float32, device="cpu")
    policy, _ = load_model_and_tokenizer(a.policy, dtype=torch.float32, device="cpu")
    state, rel, changed = mirror_state(start.state_dict(), policy.state_dict())
    start.load_state_dict(state)
    save_hf_atomic(start, tokenizer, a.out)
    print(f"update: relative norm {rel:.2e} over {changed} tensors; mirror written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
