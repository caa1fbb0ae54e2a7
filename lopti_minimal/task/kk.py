"""Knights & Knaves (K&K) logic puzzles: grammar, solver, official sampler, renderer, records.

The benchmark on which the paper (Yang et al. 2025, arXiv 2505.12929) measured GRPO, AR and
Lopti. The sources and the statement grammar in full: docs/TASK_AND_MODELS.md.

Design choices:

1. The generator of Xie et al. 2024 (mem-kk-logic's `lib_kk.py` and `data_gen_kk.py`, MIT
   licence; as prepared for RL by Logic-RL), written anew from that description, with the
   random draws in the same order and the same numpy `Generator` calls: for the same seed
   it produces the same puzzles, names and speech templates (the tests check this against
   the official test files, problems 1000.. of seed 1234).
2. Statements are plain tuples, exactly the grammar of the official `statements` field
   (`ast.literal_eval(record["statements"])` is accepted everywhere): 'telling-truth',
   'lying', 'not', 'and', 'or', '->', '<=>'; people are numbered from 0.
3. A puzzle is kept only when exactly one of the 2^n assignments is consistent
   (x_i == S_i(x) for every i: knights tell the truth, knaves lie).
4. Whole records (quiz, solution, explanation, prompt) and the CLI are in dataset.py
   (`make_record`, `generate_records`), so the dependencies run one way:
   `python -m lopti_minimal.task.dataset --n-people 3 --count 1000 --seed 0 --out train.jsonl`.

Main names: `evaluate`, `solve`, `count_solutions`, `KKSampler`, `sample_statements`,
`generate_problems`, `render_quiz`, `format_statement`, `load_jsonl`, `save_jsonl`,
`load_official`, `OFFICIAL_DIR`, `canonical`, `puzzle_key`, `split_records`.
"""
from __future__ import annotations

import ast
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..paths import shipped

# --------------------------------------------------------------------------------------
# Grammar
# --------------------------------------------------------------------------------------
KNIGHT, KNAVE = "telling-truth", "lying"  # leaf tags, as in the official files
LEAVES = (KNIGHT, KNAVE)
OPERATORS = ("not", "and", "or", "->", "<=>")
COMMUTATIVE = ("and", "or", "<=>")  # operand order does not change the meaning

Statement = tuple  # a nested tuple in the grammar above


def parse_statements(text: str) -> tuple:
    """The official `statements` string -> tuple of statements (one per speaker).

    `ast.literal_eval` only accepts Python literals, so this is safe on untrusted files."""
    stmts = ast.literal_eval(text)
    validate_statements(stmts)
    return stmts


def validate_statements(stmts: Sequence[Statement]) -> None:
    """Raise ValueError unless `stmts` is a well-formed tuple of statements over len(stmts)
    people.  Cheap; used when loading files so that errors surface early and clearly."""
    n = len(stmts)

    def check(s):
        if not isinstance(s, tuple) or not s:
            raise ValueError(f"not a statement: {s!r}")
        tag = s[0]
        if tag in LEAVES:
            if len(s) != 2 or not isinstance(s[1], int) or not 0 <= s[1] < n:
                raise ValueError(f"bad leaf {s!r} for {n} people")
        elif tag == "not":
            if len(s) != 2:
                raise ValueError(f"'not' takes one operand: {s!r}")
            check(s[1])
        elif tag in ("and", "or"):
            if len(s) < 3:
                raise ValueError(f"{tag!r} takes at least two operands: {s!r}")
            for sub in s[1:]:
                check(sub)
        elif tag in ("->", "<=>"):
            if len(s) != 3:
                raise ValueError(f"{tag!r} takes two operands: {s!r}")
            check(s[1])
            check(s[2])
        else:
            raise ValueError(f"unknown statement type {tag!r}")

    for s in stmts:
        check(s)


def evaluate(stmt: Statement, assignment: Sequence[bool]) -> bool:
    """Truth value of `stmt` when person i is a knight iff assignment[i] is True.

    The readable reference evaluator (the solver below uses truth tables for speed)."""
    tag = stmt[0]
    if tag == KNIGHT:
        return bool(assignment[stmt[1]])
    if tag == KNAVE:
        return not assignment[stmt[1]]
    if tag == "not":
        return not evaluate(stmt[1], assignment)
    if tag == "and":
        return all(evaluate(s, assignment) for s in stmt[1:])
    if tag == "or":
        return any(evaluate(s, assignment) for s in stmt[1:])
    if tag == "->":
        return (not evaluate(stmt[1], assignment)) or evaluate(stmt[2], assignment)
    if tag == "<=>":
        return evaluate(stmt[1], assignment) == evaluate(stmt[2], assignment)
    raise ValueError(f"unknown statement type {tag!r}")


def is_consistent(statements: Sequence[Statement], assignment: Sequence[bool]) -> bool:
    """Knights tell the truth and knaves lie: x_i == S_i(x) for every speaker i."""
    return all(bool(x) == evaluate(s, assignment) for s, x in zip(statements, assignment))


def mentioned_people(stmt: Statement) -> list[int]:
    """Indices of the people a statement talks about, in reading order (with repeats)."""
    if stmt[0] in LEAVES:
        return [stmt[1]]
    return [p for sub in stmt[1:] for p in mentioned_people(sub)]


def canonical(stmt: Statement) -> Statement:
    """A canonical form: operands of commutative operators (and, or, <=>) sorted.

    Two statements with the same canonical form say the same thing in a different order
    ("A or B" vs "B or A"); `puzzle_key` uses this so that exclusion of the official test
    puzzles and train/test splits also catch such trivial re-orderings."""
    if stmt[0] in LEAVES:
        return (stmt[0], int(stmt[1]))
    subs = tuple(canonical(s) for s in stmt[1:])
    if stmt[0] in COMMUTATIVE:
        subs = tuple(sorted(subs, key=repr))
    return (stmt[0],) + subs


def puzzle_key(statements: Sequence[Statement]) -> tuple:
    """What counts as "the same puzzle" for exclusion and splits: the same number of people
    and, speaker by speaker, the same statements up to the order of operands of and/or/<=>.
    Names and speech templates are ignored (they are surface text), so a renamed copy of a
    test puzzle is still excluded.  (Relabelling the people is not considered.)"""
    return tuple(canonical(s) for s in statements)


# --------------------------------------------------------------------------------------
# Solver: truth tables as bit masks over the 2^n assignments
# --------------------------------------------------------------------------------------
# Assignment number a in [0, 2^n) encodes: person i is a knight iff bit (n-1-i) of a is 0.
# So a = 0 is "all knights" and increasing a follows itertools.product([True, False], ...),
# the enumeration order of the official `find_solution`.  The truth table of a statement
# is a Python int whose bit a is the statement's value under assignment a; then
# not/and/or/->/<=> are single bitwise operations, and a whole puzzle is solved with about
# one big-int operation per node instead of 2^n recursive evaluations.


@lru_cache(maxsize=None)
def _knight_masks(n: int) -> tuple[tuple[int, ...], int]:
    """(K_0..K_{n-1}, FULL): K_i has bit a set iff person i is a knight in assignment a."""
    size = 1 << n
    masks = []
    for i in range(n):
        period = 1 << (n - i)  # blocks of 2^(n-1-i) knights, then as many knaves
        block = "0" * (period // 2) + "1" * (period // 2)  # written high bit first
        bits = block * (size // period)
        masks.append(int(bits, 2))  # the string is read high bit (a = size-1) first
    return tuple(masks), (1 << size) - 1


def truth_table(stmt: Statement, n: int) -> int:
    """Bit mask of the assignments (numbered as above) under which `stmt` is true."""
    masks, full = _knight_masks(n)
    return _table(stmt, masks, full)


def _table(stmt, masks, full) -> int:
    tag = stmt[0]
    if tag == KNIGHT:
        return masks[stmt[1]]
    if tag == KNAVE:
        return full ^ masks[stmt[1]]
    if tag == "not":
        return full ^ _table(stmt[1], masks, full)
    if tag == "and":
        out = full
        for s in stmt[1:]:
            out &= _table(s, masks, full)
        return out
    if tag == "or":
        out = 0
        for s in stmt[1:]:
            out |= _table(s, masks, full)
        return out
    if tag == "->":
        return (full ^ _table(stmt[1], masks, full)) | _table(stmt[2], masks, full)
    if tag == "<=>":
        return full ^ (_table(stmt[1], masks, full) ^ _table(stmt[2], masks, full))
    raise ValueError(f"unknown statement type {tag!r}")


def consistent_mask(statements: Sequence[Statement]) -> int:
    """Bit mask of all consistent assignments: AND_i (K_i XNOR T(S_i))."""
    n = len(statements)
    masks, full = _knight_masks(n)
    ok = full
    for i, s in enumerate(statements):
        ok &= full ^ (masks[i] ^ _table(s, masks, full))
        if not ok:
            break
    return ok


def _decode(a: int, n: int) -> tuple[bool, ...]:
    return tuple(not (a >> (n - 1 - i)) & 1 for i in range(n))


def solve(statements: Sequence[Statement]) -> list[tuple[bool, ...]]:
    """All consistent assignments (True = knight), in itertools.product([True, False])
    order like the official `find_solution`.  Brute force over 2^n; n = 12 takes ~1 ms."""
    n = len(statements)
    ok = consistent_mask(statements)
    out = []
    while ok:
        low = ok & -ok  # lowest set bit
        out.append(_decode(low.bit_length() - 1, n))
        ok ^= low
    return out


def count_solutions(statements: Sequence[Statement]) -> int:
    """Number of consistent assignments (popcount of the consistent mask)."""
    return consistent_mask(statements).bit_count()


# --------------------------------------------------------------------------------------
# Sampler (Xie et al. 2024, KKProblemSampler), same draws in the same order
# --------------------------------------------------------------------------------------
class KKSampler:
    """Draws random statements exactly like the official sampler.

    For a statement of person `p` with depth budget d, a die k in 0..5 is thrown first
    (always, even when d == 1).  If d == 1 or k == 0: a leaf (kind uniform over
    {knight, knave}, then person j uniform over all n), redrawn while it would be
    ('lying', p) — a speaker calling themself a knave is a paradox.  k == 1: ('not', leaf
    at depth d-1).  k == 2, 3: 'and' / 'or' with m ~ U{2..width} distinct operands of depth
    d-1.  k == 4, 5: '->' / '<=>' with 2 distinct operands of depth d-1.

    numpy's Generator.choice over a list with replacement draws `integers(0, len)` (checked
    in the tests), so we call `integers` directly, which is faster and gives the same
    stream."""

    def __init__(self, seed: int, n_people: int, depth: int = 2, width: int = 2):
        if n_people < 2:
            raise ValueError(f"n_people must be >= 2, got {n_people}")
        if depth < 1 or width < 2:
            raise ValueError(f"need depth >= 1 and width >= 2, got depth={depth} width={width}")
        self.rng = np.random.default_rng(seed)
        self.n, self.depth, self.width = n_people, depth, width

    def statement(self, person: int, depth: int) -> Statement:
        rng = self.rng
        die = int(rng.integers(0, 6))
        if depth == 1 or die == 0:
            while True:
                kind = LEAVES[int(rng.integers(0, 2))]
                j = int(rng.integers(0, self.n))
                if not (kind == KNAVE and j == person):
                    return (kind, j)
        if die == 1:
            return ("not", self.statement(person, depth - 1))
        if die in (2, 3):
            m = int(rng.integers(2, self.width + 1))
            return (("and", "or")[die - 2],) + self._operands(person, depth, m)
        return (("->", "<=>")[die - 4],) + self._operands(person, depth, 2)

    def _operands(self, person: int, depth: int, count: int) -> tuple:
        """`count` distinct operands of depth budget depth-1 (duplicates are redrawn)."""
        seen: list = []
        while len(seen) < count:
            s = self.statement(person, depth - 1)
            if s not in seen:
                seen.append(s)
        return tuple(seen)

    def sample(self) -> tuple:
        """One candidate puzzle: a statement for each of the n speakers."""
        return tuple(self.statement(p, self.depth) for p in range(self.n))


def sample_statements(n_people: int, seed: int = 0, depth: int = 2, width: int = 2) -> tuple:
    """One raw candidate puzzle (not checked for uniqueness): the first draw of
    KKSampler(seed, ...).  Use `generate_problems` for valid, distinct puzzles."""
    return KKSampler(seed, n_people, depth, width).sample()


def count_statements(n_people: int, depth: int = 2, width: int = 2) -> int:
    """How many distinct statements one speaker can make (for the feasibility bound).

    Leaves: 2n - 1 (a speaker never says "I am a knave").  A compound at depth d uses
    sub-statements of depth d-1: one for 'not', ordered tuples of m distinct ones for
    'and'/'or' (m = 2..width) and of 2 for '->'/'<=>'."""
    leaves = 2 * n_people - 1
    if depth == 1:
        return leaves
    sub = count_statements(n_people, depth - 1, width)
    ordered = lambda m: math.perm(sub, m)  # noqa: E731 - ordered, distinct operands
    return leaves + sub + 2 * sum(ordered(m) for m in range(2, width + 1)) + 2 * ordered(2)


class InfeasibleRequest(ValueError):
    """The request cannot be met (too few distinct uniquely solvable puzzles exist)."""


def _check_request(n_people: int, count: int, depth: int, width: int, dedup: str) -> None:
    """generate_problems' arguments: ValueError, or InfeasibleRequest above the bound."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if dedup not in ("canonical", "exact"):
        raise ValueError(f"dedup must be 'canonical' or 'exact', got {dedup!r}")
    bound = count_statements(n_people, depth, width) ** n_people
    if count > bound:
        raise InfeasibleRequest(
            f"at most {bound} distinct puzzles exist for n={n_people}, depth={depth}, "
            f"width={width}; {count} requested")


def generate_problems(n_people: int, count: int, seed: int = 0, depth: int = 2, width: int = 2,
                      exclude: Iterable[tuple] = (), max_failures: int = 10_000,
                      stats: dict | None = None, progress=None, dedup: str = "canonical") -> list[dict]:
    """`count` distinct, uniquely solvable puzzles, as the official `sample_valid_problems`.

    Each candidate from `KKSampler` is skipped unless it has exactly one consistent
    assignment, if it repeats an earlier one, or if it is in `exclude` (e.g. the official
    test set).  Exclusion compares `puzzle_key`s.  Repeats are judged by `puzzle_key` too
    (dedup="canonical", the default: no two puzzles that differ only in operand order), or
    by the exact statement tuples as in the original (dedup="exact"; with seed 1234 this
    reproduces the official test puzzles exactly, see the tests).  `max_failures`
    consecutive skipped draws mean the space of such puzzles is (nearly) exhausted:
    InfeasibleRequest.  (The original silently gave up after 1,000 retries.)

    Returns dicts {'statements', 'solution'}.  `stats`, if given, receives the counts
    'draws', 'duplicate', 'excluded', 'not_unique' (for the rejection-rate figures)."""
    _check_request(n_people, count, depth, width, dedup)
    sampler = KKSampler(seed, n_people, depth, width)
    excluded = set(exclude)
    seen: set = set()
    counts = dict(draws=0, duplicate=0, excluded=0, not_unique=0)
    problems: list[dict] = []
    failures = 0
    try:
        while len(problems) < count:
            if failures >= max_failures:
                raise InfeasibleRequest(
                    f"only {len(problems)} of {count} puzzles found for n={n_people}: "
                    f"{max_failures} consecutive draws were duplicates, excluded or not "
                    "uniquely solvable, so fewer distinct puzzles seem to exist for these "
                    "settings")
            stmts = sampler.sample()
            counts["draws"] += 1
            failures += 1
            ok = consistent_mask(stmts)
            if ok.bit_count() != 1:
                counts["not_unique"] += 1
                continue
            key = puzzle_key(stmts)
            seen_key = key if dedup == "canonical" else stmts
            if seen_key in seen:
                counts["duplicate"] += 1
                continue
            if key in excluded:
                counts["excluded"] += 1
                continue
            seen.add(seen_key)
            problems.append({"statements": stmts,
                             "solution": _decode(ok.bit_length() - 1, n_people)})
            failures = 0
            if progress is not None:
                progress.update(1)
    finally:  # report the counts even when giving up
        if stats is not None:
            stats.update(counts)
    return problems


# --------------------------------------------------------------------------------------
# English rendering (KKProblemFormatter of the original, default options)
# --------------------------------------------------------------------------------------
# The 51 common English first names of the original generator, in its order (the order
# matters: names are drawn by index with Generator.choice).  All 51 occur in the official
# test files; the tests check that and that the order reproduces the official names.
COMMON_NAMES = (
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella",
    "William", "Mia", "James", "Charlotte", "Benjamin", "Amelia", "Lucas", "Harper", "Henry",
    "Evelyn", "Alexander", "Abigail", "Michael", "Emily", "Daniel", "Elizabeth", "Jacob",
    "Sofia", "Logan", "Avery", "Jackson", "Ella", "Sebastian", "Scarlett", "Jack", "Grace",
    "Aiden", "Chloe", "Owen", "Victoria", "Samuel", "Riley", "Matthew", "Aria", "Joseph",
    "Lily", "Luke", "Aurora", "David", "Zoey", "Oliver", "Penelope",
)

INTRO = ("A very special island is inhabited only by knights and knaves. "
         "Knights always tell the truth, and knaves always lie. ")
QUESTION = "So who is a knight and who is a knave?"

# The 18 ways of reporting a speech, in the original's order ({name}, {content}).
SPEECH_TEMPLATES = (
    '{name} said that {content}.',
    '{name} told you that {content}.',
    '{name} said, "{content}."',
    '{name} stated, "{content}".',
    'According to {name}, "{content}".',
    'In {name}\'s words: "{content}".',
    '{name} remarked, "{content}".',
    '"{content}," {name} declared.',
    '{name} was heard saying, "{content}".',
    '{name} expressed that {content}.',
    '"{content}" - {name}.',
    'As {name} put it, "{content}".',
    '{name} asserted: "{content}".',
    '"{content}," {name} mentioned.',
    '{name} commented, "{content}".',
    'In a statement by {name}: "{content}".',
    '{name} noted, "{content}".',
    '"{content}," {name} claimed.',
)


def format_leaf(names: Sequence[str], leaf: Statement, negated: bool = False) -> str:
    """('telling-truth', j) -> "J is a knight"; ('lying', j) -> "J is a knave";
    negated: "J is not a knight"."""
    role = "a knight" if leaf[0] == KNIGHT else "a knave"
    return f"{names[leaf[1]]} is {'not ' if negated else ''}{role}"


def format_statement(names: Sequence[str], stmt: Statement) -> str:
    """The official English of a depth <= 2 statement.

    leaf: "A is a knight"; not: "A is not a knight"; and/or: "A and B (and C)";
    ->: "If A then B"; <=>: "A if and only if B".  (The original renderer only handles depth
    2; for deeper statements, which it cannot render, compound operands are put in
    parentheses and a negated compound becomes "it is not the case that (...)".)"""
    tag = stmt[0]
    if tag in LEAVES:
        return format_leaf(names, stmt)
    if tag == "not":
        if stmt[1][0] in LEAVES:
            return format_leaf(names, stmt[1], negated=True)
        return f"it is not the case that ({format_statement(names, stmt[1])})"
    parts = [_operand(names, s) for s in stmt[1:]]
    if tag in ("and", "or"):
        return f" {tag} ".join(parts)
    if tag == "->":
        return f"If {parts[0]} then {parts[1]}"
    if tag == "<=>":
        return f"{parts[0]} if and only if {parts[1]}"
    raise ValueError(f"unknown statement type {tag!r}")


def _operand(names, stmt) -> str:
    text = format_statement(names, stmt)
    return text if stmt[0] in LEAVES else f"({text})"


def render_intro(names: Sequence[str]) -> str:
    """Intro sentences up to and including the list of inhabitants."""
    listed = ", ".join(names[:-1]) + ", and " + names[-1]
    return INTRO + f"You meet {len(names)} inhabitants: {listed}."


def render_speech(template_id: int, name: str, content: str) -> str:
    return SPEECH_TEMPLATES[template_id].format(name=name, content=content)


def render_quiz(statements: Sequence[Statement], names: Sequence[str],
                template_ids: Sequence[int]) -> str:
    """The whole quiz: intro, one speech per speaker (in speaker order), question."""
    speeches = "".join(
        " " + render_speech(t, names[i], format_statement(names, s))
        for i, (s, t) in enumerate(zip(statements, template_ids)))
    return render_intro(names) + speeches + " " + QUESTION


def solution_text(names: Sequence[str], solution: Sequence[bool]) -> str:
    """ "Amelia is a knight, Penelope is a knight, and Evelyn is a knave." """
    parts = [f"{nm} is {'a knight' if x else 'a knave'}" for nm, x in zip(names, solution)]
    return ", ".join(parts[:-1]) + ", and " + parts[-1] + "."


def solution_text_format(names: Sequence[str], solution: Sequence[bool]) -> str:
    """ "(1) Amelia is a knight\\n(2) Penelope is a knight\\n(3) Evelyn is a knave" — the
    reward's ground truth."""
    return "\n".join(f"({i + 1}) {nm} is {'a knight' if x else 'a knave'}"
                     for i, (nm, x) in enumerate(zip(names, solution)))


def draw_surface(seed: int, n_people: int) -> tuple[list[str], list[int]]:
    """Names and template ids as the original formatter draws them from
    default_rng(seed): n names without replacement, then one template per speaker."""
    rng = np.random.default_rng(seed)
    names = [str(x) for x in rng.choice(COMMON_NAMES, size=n_people, replace=False)]
    templates = [int(rng.integers(0, len(SPEECH_TEMPLATES))) for _ in range(n_people)]
    return names, templates


# --------------------------------------------------------------------------------------
# Records (the field names of data/kk_benchmark/README.md)
# --------------------------------------------------------------------------------------
RECORD_FIELDS = ("n_people", "index", "data_source", "quiz", "names", "solution",
                 "solution_text", "solution_text_format", "statements", "cot_head",
                 "cot_repeat_steps", "cot_foot", "prompt")


def record_statements(record: dict) -> tuple:
    """The statements of a record as tuples (the file stores their Python repr)."""
    s = record["statements"]
    return parse_statements(s) if isinstance(s, str) else tuple(s)


def load_jsonl(path) -> list[dict]:
    """One JSON object per non-empty line."""
    return [obj for _, obj in load_jsonl_lines(path)]


def load_jsonl_lines(path) -> list[tuple[int, object]]:
    """(line number, parsed value) per non-empty line; a line that is not JSON is a
    ValueError that names its line in the file (json's own message counts within the line)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append((no, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"line {no} is not JSON: {e.msg} (column {e.colno})") from None
    return out


def save_jsonl(records: Iterable[dict], path, overwrite: bool = False) -> None:
    """Write one JSON object per line; refuses to replace an existing file unless told."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists (pass overwrite=True / --force to replace it)")
    # One temporary file per process: processes that write the same file at once (the ranks
    # of `accelerate launch`, a study's parallel jobs caching the same RL set) must not
    # share one, or the second os.replace finds it gone.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)  # atomic: no half-written file on interruption


# data/kk_benchmark in a checkout, lopti_minimal/_shipped/kk_benchmark in an installed copy
OFFICIAL_DIR = shipped("data/kk_benchmark")


def load_official(sizes: Iterable[int] = range(3, 8)) -> list[dict]:
    """The official test records (100 per size, 3..7 people), in file order."""
    out = []
    for n in sizes:
        out += load_jsonl(OFFICIAL_DIR / f"kk_test_{n}ppl.jsonl")
    return out


def keys_of(records: Iterable[dict]) -> set:
    """`puzzle_key`s of records (e.g. of the official test set, to exclude them)."""
    return {puzzle_key(record_statements(r)) for r in records}


def official_keys() -> set:
    return keys_of(load_official())


def split_records(records: Sequence[dict], n_test: int, seed: int = 0) -> tuple[list, list]:
    """Random train/test split that never shares a puzzle: records with equal `puzzle_key`
    are grouped and a group goes wholly to one side.  Returns (train, test)."""
    groups: dict = {}
    for r in records:
        groups.setdefault(puzzle_key(record_statements(r)), []).append(r)
    order = np.random.default_rng(seed).permutation(len(groups))
    keys = list(groups)
    train, test = [], []
    for k in order:
        side = test if len(test) < n_test else train
        side.extend(groups[keys[k]])
    return train, test


def disjoint(a: Iterable[dict], b: Iterable[dict]) -> bool:
    """True iff no puzzle (by `puzzle_key`) is in both collections."""
    return not (keys_of(a) & keys_of(b))
