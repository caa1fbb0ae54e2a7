"""The held-out 3-person puzzles: generated, and seen by no training run.

    python scripts/heldout_set.py            # -> data/heldout3.jsonl (400 puzzles), ~5 min
    python eval.py --model M --data data/heldout3.jsonl [--samples 4]

The official test sets have only 100 puzzles per size (a standard error of ~0.05 on an
accuracy near 0.5); 400 more give ~0.025.  "Seen by no run" means three exclusions:

1. the official test sets (always excluded by the generator);
2. the RL prompt sets of the default run (3 people) and of the earlier default (3 and 4
   people), as plumbing.rl_prompt_set builds and caches them;
3. every 3-person puzzle the warm start's training stream can have drawn.  The stream
   (experiments/warmstart_data.PuzzleStream, seed 0 for every shipped checkpoint) draws chunks of 256
   puzzles with generator seed `PuzzleStream._chunk_seed`, one per chunk of any size;
   we regenerate the 3-person chunk of each of the first --chunks chunk numbers (a
   superset of those the shipped runs used: ~1,200 chunks of all sizes for the 95-minute
   stage 1), with a margin of 16 puzzles per chunk for the few the runs excluded.

The 3-person puzzle space is small: 3,000 chunks hold 87,520 distinct puzzles, and a
400-puzzle set drawn without (3) shares 396 with them (measured, printed by the script):
the warm start's stream nearly exhausts the space, so earlier "held-out" sets of generated
3-person puzzles were mostly puzzles the warm start had trained on.  The 400 left here are
puzzles the sampler draws rarely (for example those with few equivalent orderings of their
operands), so this set need not be as hard as the official one; report both.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stream_keys(chunks: int, n: int = 3, progress: bool = True) -> set:
    """Puzzle keys of the 3-person chunks of the first `chunks` chunk numbers of the
    warm start's stream (seed 0)."""
    from tqdm import tqdm
    from lopti_minimal.task import kk
    from lopti_minimal.experiments.warmstart_data import PuzzleStream
    stream = PuzzleStream(seed=0, exclude=set())
    keys = set()
    for _ in tqdm(range(chunks), desc="warm-start stream", disable=not progress, file=sys.stderr):
        problems = kk.generate_problems(n, stream.chunk + 16, seed=stream._chunk_seed(n))
        keys |= {kk.puzzle_key(p["statements"]) for p in problems}
    return keys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/heldout3.jsonl")
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--seed", type=int, default=424242)
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    from lopti_minimal.config import make_config
    from lopti_minimal.plumbing import rl_prompt_set
    from lopti_minimal.task import dataset, kk
    if os.path.exists(a.out) and not a.force:
        print(f"error: {a.out} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    rl = set()
    for sizes in ((3,), (3, 4)):
        records, path = rl_prompt_set(make_config("cpu-tiny", rl_sizes=sizes), progress=not a.no_progress)
        rl |= kk.keys_of(records)
    seen = stream_keys(a.chunks, progress=not a.no_progress)
    naive = dataset.generate_records(3, a.count, seed=a.seed, exclude=kk.official_keys() | rl)
    overlap = sum(k in seen for k in kk.keys_of(naive)) if naive else 0
    print(f"{len(seen):,} distinct 3-person puzzles in the warm start's stream superset; "
          f"a set of {a.count} without excluding them would share {overlap} with it", file=sys.stderr)
    records = dataset.generate_records(3, a.count, seed=a.seed, exclude=kk.official_keys() | rl | seen)
    kk.save_jsonl(records, a.out, overwrite=a.force)
    print(f"wrote {len(records)} puzzles to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
