"""The warm start's data: generated puzzles, their target responses, and the batches.

Design choices (the warm start itself: warmstart.py):

1. An endless, deterministic stream of generated puzzles per size (`PuzzleStream`), the
   official test sets and the held-out puzzles excluded by puzzle key; a share of them can
   be unsolvable (their trace runs out of candidates and ends in a guess).
2. The target response is a function of the record (RESPONSE_STYLES, or
   task.behaviours.TwoBehaviourTargets for the two behaviours).
3. Batches of one puzzle size, length-bucketed (`bucketed_batches`), right-padded to a
   multiple of 64 (`collate`): padding ~35% -> ~10%, and a few recurring shapes.
"""
from __future__ import annotations

import random

import torch

from ..task import dataset, explain, kk, prompts


def default_prompt(record: dict) -> str:
    return prompts.compact_prompt(record["quiz"])


def default_response(record: dict) -> str:
    return prompts.target_response(record, "compact")


def numbered_response(record: dict) -> str:
    """Variant target: the compact explanation with people written as their numbers
    1..n (the numbering of the answer, "(1) Amelia ..."): only the restated claims and the
    answer then depend on the names, so far fewer tokens need a name lookup."""
    n = record["n_people"]
    text = explain.compact_explanation(statements=kk.record_statements(record),
                                       names=[str(i + 1) for i in range(n)])
    return "\n" + text + "\n" + prompts.answer_block(record["solution_text_format"])


def direct_response(record: dict) -> str:
    """Variant target without explanation: close the thinking at once, then the answer."""
    return "\n" + prompts.answer_block(record["solution_text_format"])


RESPONSE_STYLES = {"compact": default_response, "numbered": numbered_response, "direct": direct_response}


class PuzzleStream:
    """An endless supply of generated training records per size, excluding held-out puzzles.

    Records come in chunks from dataset.generate_records with a fresh seed per chunk (so the
    stream is deterministic for cfg.seed); puzzles of the official test sets and of our
    held-out set are excluded by puzzle key.  Tiny sizes have few distinct puzzles
    (about 180 for 2 people), so a chunk request is capped by what exists.
    """

    def __init__(self, seed: int, exclude: set, chunk: int = 256, unsolvable_share: float = 0.0):
        self.seed, self.exclude, self.chunk = seed, exclude, chunk
        self.buffers: dict[int, list] = {}
        self.calls = 0
        self.unsolvable_share = unsolvable_share
        self.unsolvable: dict[int, list] = {}
        self.coin = random.Random(seed * 31 + 17)     # its own stream: share 0 changes nothing

    def next(self, n: int) -> dict:
        if self.unsolvable_share > 0 and self.coin.random() < self.unsolvable_share:
            return self._next_unsolvable(n)
        buf = self.buffers.setdefault(n, [])
        if not buf:
            seed = self._chunk_seed(n)
            count = self.chunk
            while True:
                try:
                    recs = dataset.generate_records(n, count, seed=seed, exclude=self.exclude)
                    break
                except kk.InfeasibleRequest:
                    count //= 2   # small n: fewer distinct puzzles than a chunk
            random.Random(seed).shuffle(recs)
            buf.extend(recs)
        return buf.pop()

    def _next_unsolvable(self, n: int) -> dict:
        buf = self.unsolvable.setdefault(n, [])
        if not buf:
            buf.extend(dataset.generate_unsolvable_records(n, 64, seed=self._chunk_seed(n)))
        return buf.pop()

    def state(self) -> dict:
        """Where the stream stands, as plain data (runs.read_state's form): the records
        drawn and not yet used, the chunk counter, the coin's state. The rest is the
        constructor's arguments, which a resumed run passes again."""
        return {"buffers": self.buffers, "unsolvable": self.unsolvable, "calls": self.calls,
                "coin": self.coin.getstate()}

    def restore(self, state: dict) -> None:
        """Go on from a `state`."""
        self.buffers, self.unsolvable, self.calls = state["buffers"], state["unsolvable"], state["calls"]
        self.coin.setstate(state["coin"])

    def _chunk_seed(self, n: int) -> int:
        """A fresh generator seed for every chunk (solvable or not), from cfg.seed."""
        self.calls += 1
        return self.seed * 1_000_003 + self.calls * 7919 + n


def encode_example(tokenizer, prompt: str, response: str) -> tuple[list[int], int]:
    """Token ids of prompt + response + eos, and the prompt length (the loss starts there).

    Prompt and response are tokenized separately, exactly as at sampling time, where the
    model continues the tokenized prompt; the tokenizer adds bos in front of the prompt."""
    p = tokenizer(prompt)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + r, len(p)


PAD_MULTIPLE = 64


def collate(examples: list[tuple[list[int], int]], pad_id: int, multiple: int = PAD_MULTIPLE):
    """Right-padded batch: input_ids, attention_mask, loss_mask ([B, T]).

    loss_mask[b, t] = 1 where token t+1 is a response token (or the final eos), i.e. it
    marks the positions whose next-token prediction is trained.

    T is rounded up to a multiple of 64: the CPU's bf16 matmul kernels (oneDNN) are built
    per input shape, and with a new shape every step training ran 2.5x slower and its
    memory kept growing (measured); a few recurring shapes avoid that."""
    T = max(len(ids) for ids, _ in examples)
    T = -(-T // multiple) * multiple
    B = len(examples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T - 1)
    for b, (ids, n_prompt) in enumerate(examples):
        input_ids[b, :len(ids)] = torch.tensor(ids)
        attn[b, :len(ids)] = 1
        loss_mask[b, n_prompt - 1:len(ids) - 1] = 1.0
    return input_ids, attn, loss_mask


def batch_size_for(stream, n: int, tokenizer, response_fn, tokens_per_batch: int,
                   response_tokens: bool = False):
    """Puzzles per batch of size ``n``: ``tokens_per_batch`` over the mean encoded length of
    32 puzzles of that size (fixed per size afterwards, so the shapes recur; see collate).
    With ``response_tokens``: (that, the mean number of response tokens of a puzzle)."""
    sample = [encode_example(tokenizer, default_prompt(r), response_fn(r)) for r in
              (stream.next(n) for _ in range(32))]
    mean = sum(len(ids) for ids, _ in sample) / len(sample)
    size = max(1, round(tokens_per_batch / mean))
    if response_tokens:
        return size, sum(len(ids) - n_prompt for ids, n_prompt in sample) / len(sample)
    return size


def bucketed_batches(examples: list, batch_size: int, rng: random.Random) -> list[list]:
    """Cut ``examples`` into batches of ``batch_size`` neighbours in length, in random order.

    A batch is padded to its longest row, so random batches of one puzzle size waste about
    a third of their positions on padding (the explanation's length varies with the search);
    sorted neighbours waste little.  The order of the batches is shuffled, so the model
    does not see short puzzles first and long ones last."""
    ordered = sorted(examples, key=lambda e: len(e[0]))
    batches = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
    rng.shuffle(batches)
    return batches


def heldout_records(sizes, per_size: int, seed: int = 99_991, exclude: set = frozenset()) -> list[dict]:
    """Generated puzzles kept out of training (a fixed seed, disjoint from the official set)."""
    out = []
    for n in sizes:
        out += dataset.generate_records(n, per_size, seed=seed + n, exclude=exclude)
    return out
