"""How many of a phrased derivation's tokens are free choices: the ceiling phrasing sets on
the share of sampled tokens below pi_old = 0.5.

    python scripts/phrasing_choices.py                  # 3..5 people, 100 puzzles each

Each choice of phrasing.py (a node word, an equals word, a verdict, a tail word, an ending,
an answer mark) is decided by exactly one token: the option itself, or for an empty ending
the newline after it (tests/test_phrasing.py checks both).  Its options are drawn
uniformly, so a model that has learned the targets gives each sampled choice token about
1/3 (1/4 for a wrong check's verdict): below 0.5.  The share of response tokens that are
choices (the target's tokens after the think tag, with eos, as the warm start trains on
them) is then roughly the share below 0.5 such a model's derivations reach at T = 1
(temperature 0.7 sharpens any unevenly learned choice); the tokens a model is unsure of
for other reasons come on top (scripts/token_bins.py measures a model).

Prints, per size, the mean response tokens, the mean number of choices and their share,
for the phrasing with and without tail words (--phrase-tails); and the longest target
among those puzzles and as many unsolvable ones (a full search that finds nothing, the
longest kind), against the RL response cap.  Generated puzzles (seed 777 + n), not the
official sets.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CountingRandom(random.Random):
    """random.Random that counts its choice() calls: one per phrasing choice."""

    def __init__(self, seed):
        super().__init__(seed)
        self.choices = 0

    def choice(self, seq):
        self.choices += 1
        return super().choice(seq)


def measure(records, tokenizer, tails: bool) -> list[tuple[int, int]]:
    """Per record: (response tokens with eos, choices) of its phrased target; record i
    is phrased with seed i."""
    from lopti_minimal.task.behaviours import derive_response
    out = []
    for i, r in enumerate(records):
        rng = CountingRandom(i)
        text = derive_response(r, rng, tails)
        out.append((len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1, rng.choices))
    return out


def choice_share(measured: list[tuple[int, int]]) -> dict:
    """Mean tokens and choices per target, and the choices' share of all tokens."""
    tokens, choices = (sum(col) for col in zip(*measured))
    return {"tokens": tokens / len(measured), "choices": choices / len(measured), "share": choices / tokens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 4, 5])
    ap.add_argument("--puzzles", type=int, default=100)
    ap.add_argument("--tokenizer", default="checkpoints/tiny-warm", help="a folder with the tiny tokenizer")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer
    from lopti_minimal.task import dataset, kk
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    print("| people | phrasing | response tokens | choices | share of tokens | longest, with unsolvable |\n"
          "|---|---|---|---|---|---|")
    for n in a.sizes:
        recs = dataset.generate_records(n, a.puzzles, seed=777 + n, exclude=kk.official_keys())
        unsolvable = dataset.generate_unsolvable_records(n, a.puzzles, seed=1)
        for tails in (False, True):
            m = measure(recs + unsolvable, tok, tails)          # the solvable ones first
            s = choice_share(m[:len(recs)])
            print(f"| {n} | {'--phrased --phrase-tails' if tails else '--phrased'} | {s['tokens']:.1f} "
                  f"| {s['choices']:.1f} | {s['share']:.3f} | {max(t for t, _ in m)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
