"""The held-out 3-, 4- and 5-person puzzles: generated, and seen by no training run.

    python scripts/heldout_set.py            # -> data/heldout3.jsonl (400 puzzles), ~2.5 min
    python scripts/heldout_set.py --size 4   # -> data/heldout4.jsonl (400 puzzles), ~3 min
    python scripts/heldout_set.py --size 5   # -> data/heldout5.jsonl (400 puzzles), ~3.5 min
    python eval.py --model M --data data/heldout4.jsonl [--samples 4]

The official test sets have only 100 puzzles per size (a standard error of ~0.05 on an
accuracy near 0.5); 400 more give ~0.025.  "Seen by no run" means four exclusions, for the
set's size N:

1. the official test sets (always excluded by the generator);
2. every RL prompt set a preset (lopti_minimal/config.py PRESETS) can build with N people.
   plumbing.rl_prompt_set draws size n with its own seed, data_seed + 1000 * n, and only the
   official sets excluded, so the N-person part of a set is the same whatever other sizes
   come with it: we build, through rl_prompt_set (a cached file, as a run reads it), the sets
   of sizes (N,), of every preset's rl_sizes that holds N and of the earlier default (3, 4),
   for every preset's data_seed and rl_per_size (900, and the ci preset's 20).  A run with
   a smaller --rl-per-size draws a prefix of the same sequence, so it is covered too; a
   future preset with RL on N people (say SmolLM2 on 4, with smollm2-kk's data_seed and
   rl_per_size) is covered because only (data_seed, rl_per_size, N) matter.
3. every N-person puzzle the tiny model's warm start (experiments/warmstart.py) can have
   drawn.  Its stream (experiments/warmstart_data.PuzzleStream, seed 0 for every shipped
   checkpoint) draws chunks of 256 puzzles of one size with generator seed
   `PuzzleStream._chunk_seed`, which counts chunks of every size (and the unsolvable ones);
   we regenerate the N-person chunk of each of the first --chunks chunk numbers (a
   superset of those the shipped runs used: ~1,200 chunks of all sizes for the 95-minute
   stage 1).
4. every N-person puzzle the SmolLM2 LoRA warm starts (experiments/lm_warmstart.py) can
   have drawn: the same PuzzleStream at the run's --seed (the shipped adapters: seed 0, and
   seed 1 for the 146 steps of checkpoints/smollm2-kk-sft-compact-396; the supervised
   controls of scripts/smollm2_kk_rl.sh: seed s + 1), so --lm-seeds 0,1,2,3.  A run draws
   steps x batch_size puzzles plus those whose target was over budget (warmstart.json's
   skipped_targets); a 2-person chunk holds 128 (only ~184 exist, so the stream's 256 is
   halved), a 3- or 4-person one 256, so D puzzles take at most D / 128 + 3 chunk numbers.
   The longest run on record, checkpoints/smollm2-kk-sft-compact, drew 250 x 8 + 739 =
   2,739: at most 25 chunks.  --lm-chunks 256 covers D <= 32,384, i.e. 2,000 steps at
   batch 8 even if every second target were skipped (1 in 4 so far): 8x the longest run,
   and not so many that the set is pushed towards rare puzzles (what the exclusions
   cost, below).  Seed 0 is the
   tiny stream's seed, so its first 3,000 chunks already hold it.  Not for 3 people:
   every lm_warmstart run has left data/heldout3.jsonl out of its stream (--exclude, the
   default since lm_warmstart exists; every warmstart.json records it), so none drew one of
   its puzzles; excluding these streams now would change the set (seeds 1-3 hold 86-98
   of its 400 within 300 chunks, measured), and every result measured on it.

Stream chunks are regenerated without any exclusion and with a margin of 16 puzzles: a run
that left some puzzles out (the official sets, the tiny run's own 40 held-out puzzles per
size, a held-out file) drew past them, at most 16 further in a chunk.  The script checks
that no chunk's first 256 + 16 puzzles hold more than 16 of those (measured: at most 5
with 3 people, 1 with 4, 0 with 5).
The held-out file a run leaves out cannot shift a chunk: by construction none of its
puzzles is in one, so a run that excludes this file (lm_warmstart's default --exclude,
every data/heldout*.jsonl) draws, in the chunks covered, what it would draw without it.

What the exclusions cost (measured, printed by the script; a set of 400 drawn with 1 and
2 only, how many of its puzzles the streams hold):
- 3 people: the space is small: 3,000 chunks hold 87,520 distinct puzzles, and a
  naive set shares 396 with them: the warm start's stream nearly exhausts the space, so
  earlier "held-out" sets of generated 3-person puzzles were mostly puzzles the warm
  start had trained on.  The 400 left here are puzzles the sampler draws rarely (for
  example those with few equivalent orderings of their operands), so this set need not be
  as hard as the official one; report both.
- 4 people: the 3,000 chunks of seed 0 hold 799,558 distinct puzzles (of 816,000 drawn),
  with seeds 1-3 999,417; a naive set shares 19 with them (15 with seed 0's chunks, 2, 1
  and 1 with seeds 1-3). The space is large: the set is close to what the sampler draws
  (0.08 of it all knights, as in the official set; heldout3: 0.325, official 0.17).
- 5 people: 1,024,841 distinct (seed 0: 815,965 of 816,000); a naive set shares none with
  them. 0.07 all knights (official 0.05).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = (3, 4, 5)
CHUNK = 256                 # PuzzleStream's default chunk (3-5 people: never halved)
MARGIN = 16                 # puzzles past a chunk's 256 that a run's exclusions can reach
LM_SEEDS = (0, 1, 2, 3)     # lm_warmstart --seed: the shipped adapters 0 and 1, controls s + 1
LM_CHUNKS = 256             # chunk numbers per lm_warmstart seed (docstring, 4)
LM_EXCLUDED_SIZES = (3,)    # held-out sizes every lm_warmstart run excluded (docstring, 4)
EARLIER_RL_SIZES = ((3, 4),)    # the earlier default run's rl_sizes


def chunk_seeds(seed: int, chunks: int, n: int) -> list[int]:
    """Generator seeds of the n-person chunks a PuzzleStream(seed) would draw as its chunks
    1..`chunks` (PuzzleStream._chunk_seed: chunks of any size count)."""
    from lopti_minimal.experiments.warmstart_data import PuzzleStream
    stream = PuzzleStream(seed=seed, exclude=set())
    return [stream._chunk_seed(n) for _ in range(chunks)]


def chunk_keys(generator_seed: int, n: int) -> list:
    """Puzzle keys, in draw order, of the first CHUNK + MARGIN puzzles of a chunk: what a
    stream that excluded nothing would draw, and MARGIN more."""
    from lopti_minimal.task import kk
    return [kk.puzzle_key(p["statements"]) for p in kk.generate_problems(n, CHUNK + MARGIN, seed=generator_seed)]


def stream_keys(chunks: int, n: int = 3, progress: bool = True, seed: int = 0,
                shifters: frozenset = frozenset()) -> tuple[set, int]:
    """(keys of the n-person chunks of the first `chunks` chunk numbers of the stream at
    `seed`, the most `shifters` found in one chunk).  `shifters`: puzzles a run may have
    left out of its stream; more than MARGIN of them in a chunk would let a run draw past
    what we regenerate, so that is an error."""
    from tqdm import tqdm
    keys, most = set(), 0
    seeds = chunk_seeds(seed, chunks, n)
    for k, generator_seed in enumerate(tqdm(seeds, desc=f"stream seed {seed}", disable=not progress,
                                            file=sys.stderr), start=1):
        chunk = chunk_keys(generator_seed, n)
        most = max(most, sum(key in shifters for key in chunk))
        if most > MARGIN:
            raise SystemExit(f"error: chunk {k} of the stream at seed {seed} holds {most} excluded "
                             f"puzzles in its first {CHUNK + MARGIN}; raise MARGIN in {__file__}")
        keys.update(chunk)
    return keys, most


def stream_plan(n: int, chunks: int, lm_seeds, lm_chunks: int) -> dict:
    """{stream seed: chunk numbers to regenerate} for n people: the tiny warm start's seed 0,
    and the lm_warmstart seeds unless every such run excluded this size's set."""
    plan = {0: chunks}
    if n not in LM_EXCLUDED_SIZES:
        for s in lm_seeds:
            plan[s] = max(plan.get(s, 0), lm_chunks)
    return plan


def rl_keys(n: int, progress: bool = True) -> set:
    """Keys of the n-person records of every RL prompt set a preset can build (docstring, 2)."""
    from lopti_minimal.config import PRESETS, make_config
    from lopti_minimal.plumbing import rl_prompt_set
    from lopti_minimal.task import kk
    cfgs = [make_config(p) for p in PRESETS]
    sizes = {(n,)} | {c.rl_sizes for c in cfgs if n in c.rl_sizes} | {s for s in EARLIER_RL_SIZES if n in s}
    keys = set()
    for data_seed in sorted({c.data_seed for c in cfgs}):
        for per_size in sorted({c.rl_per_size for c in cfgs}):
            for s in sorted(sizes):
                cfg = make_config("cpu-tiny", rl_sizes=s, rl_per_size=per_size, data_seed=data_seed)
                records, _ = rl_prompt_set(cfg, progress=progress)
                keys |= kk.keys_of(r for r in records if r["n_people"] == n)
    return keys


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes seeds like 0,1,2,3, not {text!r}")
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"seeds are >= 0, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    from lopti_minimal.cli import one_line_error
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=3, help="people per puzzle: 3, 4 or 5")
    ap.add_argument("--out", default=None, help="default data/heldout{SIZE}.jsonl")
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--seed", type=int, default=424242)
    ap.add_argument("--chunks", type=int, default=3000, help="chunk numbers of the tiny warm start's stream")
    ap.add_argument("--lm-seeds", type=int_list, default=LM_SEEDS, help="lm_warmstart seeds, e.g. 0,1,2,3")
    ap.add_argument("--lm-chunks", type=int, default=LM_CHUNKS, help="chunk numbers per lm_warmstart seed")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.error = one_line_error
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.size not in SIZES:
        ap.error(f"--size {a.size}: held-out sets are made for 3, 4 or 5 people")
    if a.count < 1 or a.chunks < 1 or a.lm_chunks < 0:
        ap.error("--count and --chunks must be >= 1, --lm-chunks >= 0")
    n, progress = a.size, not a.no_progress
    out = a.out or f"data/heldout{n}.jsonl"
    from lopti_minimal.experiments.warmstart import WarmStartConfig
    from lopti_minimal.experiments.warmstart_data import heldout_records
    from lopti_minimal.task import dataset, kk
    if os.path.exists(out) and not a.force:
        print(f"error: {out} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    official = kk.official_keys()
    rl = rl_keys(n, progress)
    # What a run may have left out of its stream: the official sets and the tiny warm
    # start's own held-out puzzles (warmstart.py, WarmStartConfig's eval sizes).
    w = WarmStartConfig()
    shifters = frozenset(official | kk.keys_of(heldout_records(w.eval_sizes, w.heldout_per_size, exclude=official)))
    seen: dict[int, set] = {}
    for seed, chunks in stream_plan(n, a.chunks, a.lm_seeds, a.lm_chunks).items():
        seen[seed], most = stream_keys(chunks, n, progress, seed=seed, shifters=shifters)
        print(f"stream seed {seed}: {chunks} chunks, {len(seen[seed]):,} distinct {n}-person puzzles, "
              f"at most {most} excluded ones in a chunk's first {CHUNK + MARGIN}", file=sys.stderr)
    every = set().union(*seen.values())
    naive = dataset.generate_records(n, a.count, seed=a.seed, exclude=official | rl)
    naive_keys = kk.keys_of(naive)
    overlap = sum(k in every for k in naive_keys)
    per_seed = ", ".join(f"seed {s}: {len(naive_keys & keys)}" for s, keys in seen.items())
    print(f"{len(every):,} distinct {n}-person puzzles in the warm-start streams' superset; "
          f"a set of {a.count} without excluding them would share {overlap} with it ({per_seed})",
          file=sys.stderr)
    records = dataset.generate_records(n, a.count, seed=a.seed, exclude=official | rl | every)
    kk.save_jsonl(records, out, overwrite=a.force)
    print(f"wrote {len(records)} puzzles to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
