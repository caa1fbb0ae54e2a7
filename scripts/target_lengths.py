"""How long is the faithful trace? Token lengths of the supervised target of every puzzle.

    python scripts/target_lengths.py data/heldout3.jsonl data/heldout4.jsonl data/heldout5.jsonl
    python scripts/target_lengths.py data/heldout4.jsonl --budgets 768 1024 --style compact

An RL run samples at most max_new_tokens per response, and a response cut off there scores
as a format error (task/reward.py: -3, the worst reward). So a budget shorter than the
trace a start was taught to write punishes that trace wherever it is long, and prefers any
shorter response. This prints, for each file, the quantiles of the target's length (the
trace and the answer that lm_warmstart trains on, its end-of-turn token counted, as the
sampler counts it) in the model's tokenizer, and the share of puzzles whose target is
longer than each budget: what a run sampling at that budget would cut off if the policy
wrote the faithful trace on every puzzle. No model is run: a tokenizer only, seconds.

Design choice: the target is lm_warmstart.encode's (the prompt as train.py encodes it, then
prompts.target_response in the chosen style), so a length here is the length the
warm start trained on and the sampler would count; lm_warmstart trains only on targets of
at most its --max-response-tokens (384 for the shipped adapters), so the puzzles over it
are ones whose whole trace the start never saw.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def target_lengths(records: list[dict], tokenizer, style: str) -> list[int]:
    """Response tokens (the end-of-turn token included) of each record's supervised target."""
    from lopti_minimal.experiments.lm_warmstart import encode
    out = []
    for r in records:
        ids, prompt_len = encode(tokenizer, r, style)
        out.append(len(ids) - prompt_len)
    return out


def describe(lengths: list[int], budgets: list[int]) -> dict:
    """Quantiles (50/90/99, max) and the share of targets longer than each budget."""
    import numpy as np
    a = np.asarray(lengths)
    q = np.percentile(a, [50, 90, 99])
    return {"puzzles": len(a), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": int(a.max()),
            "over": {b: float((a > b).mean()) for b in budgets}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="+", help="K&K JSON Lines files")
    ap.add_argument("--budgets", type=int, nargs="+", default=[384, 512, 768, 1024])
    ap.add_argument("--style", default="compact", choices=["compact", "backtracking"])
    ap.add_argument("--tokenizer", default="models/smollm2-135m-instruct")
    a = ap.parse_args(argv)
    for f in a.data:
        if not os.path.isfile(f):
            print(f"error: {f}: no such file (python scripts/heldout_set.py --size N makes data/heldoutN.jsonl)",
                  file=sys.stderr)
            return 2
    if not os.path.isdir(a.tokenizer):
        print(f"error: {a.tokenizer}: no tokenizer folder (python scripts/fetch_smollm2.py makes it)", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer
    from lopti_minimal.task import kk
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    print(f"{'file':28s} {'puzzles':>7s} {'p50':>5s} {'p90':>5s} {'p99':>5s} {'max':>5s}  "
          + "  ".join(f"over {b}" for b in a.budgets))
    for f in a.data:
        d = describe(target_lengths(kk.load_jsonl(f), tok, a.style), a.budgets)
        print(f"{f:28s} {d['puzzles']:7d} {d['p50']:5.0f} {d['p90']:5.0f} {d['p99']:5.0f} {d['max']:5d}  "
              + "  ".join(f"{d['over'][b]:{len(f'over {b}')}.3f}" for b in a.budgets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
