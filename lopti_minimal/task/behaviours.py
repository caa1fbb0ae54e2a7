"""The two behaviours of the embedded default's warm start: *guess* or *derive*.

Design choices:

1. Two behaviours, because RL with an outcome reward selects among the things a policy
   already does (the paper, Yang et al. 2025, Fig. 4 and 6: instruct models reason at
   length more often as training goes on). A tiny model trained only to derive has nothing
   to select -- its errors are single wrong checks inside otherwise right derivations,
   which one reward per response cannot localise -- and RL from checkpoints/tiny-derive
   (derivations only) did not raise accuracy.
2. **guess**: close the thinking at once and answer with a *random* role assignment (its
   supervised targets are random, so its accuracy is chance, 1 / 2^n): a short response,
   `"\\n</think>\\n<answer> (1) ... </answer>"` (answer marks phrased, phrasing.vary_answer).
3. **derive**: the compact derivation (explain.compact_explanation), phrased by
   phrasing.vary with `--phrased` (and a tail word on every line with `--phrase-tails`):
   the shipped warm start, checkpoints/tiny-warm, learned its derivations with both; then
   the answer it found.
4. The first response token decides (the newline then "</think>" for a guess, the first
   derivation line otherwise); the share comes from the supervised mixture
   (experiments.warmstart.WarmStartConfig.guess_share: 0.7 for the shipped warm start), not
   from the prompt, which is the same for both.
5. With most targets guesses, greedy decoding guesses; sampled at T = 0.7 the policy
   derives now and then, and those derivations are right far more often than a guess.
   That is the behaviour RL can select, and the tokens that decide it have low
   probability: exactly where AR and Lopti act.
"""
from __future__ import annotations

import random
import zlib

from . import explain, kk, phrasing, prompts

GUESS, DERIVE = "guess", "derive"


def behaviour_of(response: str) -> str:
    """GUESS if the response closes the thinking before writing anything (only whitespace
    before "</think>"), else DERIVE -- also for a response cut before "</think>", which
    only a derivation can be.  Works for any model's response to a prompt ending in
    "<think>"."""
    head, sep, _ = response.partition("</think>")
    return GUESS if sep and not head.strip() else DERIVE


def derive_share(responses) -> float:
    """The share of DERIVE among responses (0.0 for none)."""
    responses = list(responses)
    return sum(behaviour_of(r) == DERIVE for r in responses) / max(len(responses), 1)


def guess_response(record: dict, rng: random.Random) -> str:
    """A guess: the answer block with a random role for each person, straight after the
    think tag."""
    roles = [rng.random() < 0.5 for _ in record["names"]]
    answer = phrasing.vary_answer(kk.solution_text_format(record["names"], roles), rng)
    return "\n" + prompts.answer_block(answer)


def derive_response(record: dict, rng: random.Random | None = None, tails: bool = False) -> str:
    """A derivation: the compact explanation, then the answer, phrased at random when
    ``rng`` is given (canonical otherwise; ``tails``: phrasing.TAILS too).  Scores 3
    under the Logic-RL reward."""
    if rng is None:
        return prompts.target_response(record, "compact")       # the canonical target
    text = phrasing.vary(explain.compact_explanation(record), rng, tails)
    return "\n" + text + "\n" + prompts.answer_block(phrasing.vary_answer(record["solution_text_format"], rng))


class TwoBehaviourTargets:
    """The warm start's target for a record: a guess with probability ``guess_share``,
    else a derivation (phrased when ``phrased``, with tail words when ``tails``).

    Deterministic per (seed, puzzle): the draws come from a generator seeded by the seed
    and the quiz text, so a record always gets the same target -- the batch-size probe and
    the training batch see the same text, and a rerun trains on the same data."""

    def __init__(self, guess_share: float, phrased: bool = True, seed: int = 0, tails: bool = False):
        if not 0.0 <= guess_share < 1.0:
            raise ValueError(f"guess_share must lie in [0, 1), got {guess_share}")
        self.guess_share, self.phrased, self.seed, self.tails = guess_share, phrased, seed, tails

    def __call__(self, record: dict) -> str:
        rng = random.Random(self.seed * 1_000_003 + zlib.crc32(record["quiz"].encode()))
        if rng.random() < self.guess_share:
            return guess_response(record, rng)
        return derive_response(record, rng if self.phrased else None, self.tails)
