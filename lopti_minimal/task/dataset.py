"""The task's data: a generated puzzle made into a full record, and the generator command.

    python -m lopti_minimal.task.dataset --n-people 3 --count 1000 --seed 0 --out train.jsonl

Design choices:

1. A full record is the quiz, the solution, the official backtracking explanation
   (explain.py) and the paper's prompt (prompts.py), from a generated puzzle (kk.py); the
   command writes generated records as JSON Lines.
2. Kept apart from kk.py so that the dependencies run one way: kk (logic, generator,
   renderer, records I/O) <- explain <- prompts <- dataset.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Iterable, Sequence

from .explain import COT_HEAD, backtracking_steps, compact_trace, cot_foot
from .kk import (InfeasibleRequest, KKSampler, Statement, count_solutions, draw_surface,
                 generate_problems, keys_of, load_jsonl, official_keys, render_quiz,
                 save_jsonl, solution_text, solution_text_format)
from .prompts import qwen_prompt


def make_record(statements: Sequence[Statement], solution: Sequence[bool], index: int,
                surface_seed: int) -> dict:
    """A full record for one puzzle.  As in the original data script, the surface (names,
    templates) of problem i is drawn from default_rng(seed + i)."""
    n = len(statements)
    names, templates = draw_surface(surface_seed, n)
    quiz = render_quiz(statements, names, templates)
    steps, success = backtracking_steps(statements, names)
    return {
        "n_people": n,
        "index": int(index),
        "data_source": f"kk_logic{n}",
        "quiz": quiz,
        "names": names,
        "solution": [bool(x) for x in solution],
        "solution_text": solution_text(names, solution),
        "solution_text_format": solution_text_format(names, solution),
        "statements": str(tuple(statements)),
        "cot_head": COT_HEAD,
        "cot_repeat_steps": steps,
        "cot_foot": cot_foot(success),
        "prompt": qwen_prompt(quiz),
    }


def generate_records(n_people: int, count: int, seed: int = 0, depth: int = 2,
                     width: int = 2, exclude: Iterable[tuple] = (), start_index: int = 0,
                     stats: dict | None = None, progress=None, **kw) -> list[dict]:
    """Generate `count` puzzles and render them as records with indices
    start_index.. (problem i gets surface seed seed + i, as in the original)."""
    problems = generate_problems(n_people, count + start_index, seed, depth, width, exclude,
                                 stats=stats, progress=progress, **kw)[start_index:]
    return [make_record(p["statements"], p["solution"], start_index + k, seed + start_index + k)
            for k, p in enumerate(problems)]


def generate_unsolvable_records(n_people: int, count: int, seed: int = 0, depth: int = 2,
                                width: int = 2) -> list[dict]:
    """`count` random puzzles that have *no* consistent assignment (no knight/knave roles
    make every statement right), drawn with the official sampler and kept only when
    `count_solutions` is 0.  Not K&K test material: the warm start mixes a few in
    (WarmStartConfig.unsolvable_share) so that the model sees a search that runs out of
    candidates and still closes its answer (explain.compact_trace, "guess").  The record's
    "solution" is that trace's guess (everyone a knave) and "solvable" is False."""
    sampler = KKSampler(seed, n_people, depth, width)
    out: list[dict] = []
    while len(out) < count:
        statements = sampler.sample()
        if count_solutions(statements) == 0:
            kind, guess = compact_trace(statements)[-1]
            assert kind == "guess"
            record = make_record(statements, guess, len(out), seed + len(out))
            record["solvable"] = False
            out.append(record)
    return out


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------
def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m lopti_minimal.task.dataset",
        description="Generate K&K puzzles (Xie et al. 2024 generator) as JSON Lines records. "
                    "The official test puzzles are always excluded.")
    p.add_argument("--n-people", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--width", type=int, default=2)
    p.add_argument("--exclude", nargs="*", default=[], metavar="FILE",
                   help="JSON Lines files whose puzzles must not be generated")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    a = _parse_args(argv)
    if a.n_people < 2:
        return _fail(f"--n-people must be at least 2 (got {a.n_people})")
    if a.count < 1:
        return _fail(f"--count must be at least 1 (got {a.count})")
    if a.depth < 1 or a.width < 2:
        return _fail("--depth must be >= 1 and --width >= 2")
    if os.path.exists(a.out) and not a.force:
        return _fail(f"{a.out} exists; pass --force to overwrite it")
    exclude = official_keys()
    for f in a.exclude:
        try:
            exclude |= keys_of(load_jsonl(f))
        except (OSError, ValueError, KeyError, SyntaxError, TypeError) as e:
            return _fail(f"cannot read exclude file {f}: {type(e).__name__}: {e}")
    from tqdm import tqdm

    with tqdm(total=a.count, desc=f"K&K n={a.n_people}", disable=a.no_progress,
              file=sys.stderr) as bar:
        try:
            records = generate_records(a.n_people, a.count, a.seed, a.depth, a.width,
                                       exclude=exclude, progress=bar)
        except InfeasibleRequest as e:
            bar.close()
            return _fail(str(e))
    try:
        save_jsonl(records, a.out, overwrite=a.force)
    except OSError as e:
        return _fail(f"cannot write {a.out}: {e}")
    print(f"wrote {len(records)} puzzles to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
