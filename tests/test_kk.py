"""K&K grammar, solver, official sampler/renderer and records (lopti_minimal/task/kk.py)."""
import ast
import itertools
import json
import random

import numpy as np
import pytest

from conftest import ref_eval, ref_solutions
from lopti_minimal.task import dataset, kk

OFFICIAL = kk.load_official()


# ---------------------------------------------------------------- independent reference
def random_statement(rng, n, depth):
    if depth == 1 or rng.random() < 0.3:
        return (rng.choice(["telling-truth", "lying"]), rng.randrange(n))
    op = rng.choice(["not", "and", "or", "->", "<=>"])
    if op == "not":
        return ("not", random_statement(rng, n, depth - 1))
    k = rng.randint(2, 3) if op in ("and", "or") else 2
    return (op,) + tuple(random_statement(rng, n, depth - 1) for _ in range(k))


# ---------------------------------------------------------------- official acceptance
def test_official_files_shape():
    assert len(OFFICIAL) == 500
    for r in OFFICIAL:
        assert set(r) == set(kk.RECORD_FIELDS)
        assert r["data_source"] == f"kk_logic{r['n_people']}"


def test_official_statements_load_with_literal_eval_and_solve_uniquely():
    for r in OFFICIAL:
        stmts = ast.literal_eval(r["statements"])
        kk.validate_statements(stmts)
        assert stmts == kk.record_statements(r)
        sols = kk.solve(stmts)
        assert sols == [tuple(r["solution"])]
        assert kk.count_solutions(stmts) == 1
        assert kk.is_consistent(stmts, r["solution"])


def test_official_rendered_parts_appear_verbatim():
    for r in OFFICIAL:
        stmts, names, quiz = kk.record_statements(r), r["names"], r["quiz"]
        assert quiz.startswith(kk.render_intro(names))
        assert quiz.endswith(" " + kk.QUESTION)
        for i, s in enumerate(stmts):
            content = kk.format_statement(names, s)
            assert any(kk.render_speech(t, names[i], content) in quiz
                       for t in range(len(kk.SPEECH_TEMPLATES))), (content, quiz)
        assert kk.solution_text(names, r["solution"]) == r["solution_text"]
        assert kk.solution_text_format(names, r["solution"]) == r["solution_text_format"]


def test_common_names_are_the_51_official_names():
    assert len(kk.COMMON_NAMES) == 51 == len(set(kk.COMMON_NAMES))
    assert {nm for r in OFFICIAL for nm in r["names"]} == set(kk.COMMON_NAMES)
    assert len(kk.SPEECH_TEMPLATES) == 18


def test_numpy_choice_equals_integers_stream():
    # KKSampler calls integers(0, k) where the original called Generator.choice(list).
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    for k in (2, 18):
        items = list(range(k))
        assert [int(a.choice(items)) for _ in range(500)] == \
               [int(b.integers(0, k)) for _ in range(500)]


@pytest.mark.parametrize("n", range(3, 8))
def test_seed_1234_reproduces_the_official_records(n):
    """The official test puzzles are problems 1000..1099 of the original generator with
    seed 1234 (surface seed 1234 + index): we reproduce every field byte for byte."""
    probs = kk.generate_problems(n, 1100, seed=1234, dedup="exact")
    for r in kk.load_official([n]):
        p = probs[r["index"]]
        assert p["statements"] == kk.record_statements(r)
        assert dataset.make_record(p["statements"], p["solution"], r["index"],
                              1234 + r["index"]) == r


@pytest.mark.parametrize("n", [3, 7])
def test_exclusion_skips_exactly_the_official_puzzles(n):
    official = kk.keys_of(kk.load_official([n]))
    stats = {}
    probs = kk.generate_problems(n, 1100, seed=1234, dedup="exact", exclude=official,
                                 stats=stats)
    assert stats["excluded"] == 100
    assert not {kk.puzzle_key(p["statements"]) for p in probs} & official


# ---------------------------------------------------------------- 10,000 per size
@pytest.mark.parametrize("n", range(3, 8))
def test_10000_generated_puzzles_unique_distinct_not_official(n):
    official = kk.official_keys()
    official_exact = {kk.record_statements(r) for r in OFFICIAL}
    probs = kk.generate_problems(n, 10_000, seed=0, exclude=official)
    assert len(probs) == 10_000
    stmts = [p["statements"] for p in probs]
    assert len(set(stmts)) == 10_000
    assert len({kk.puzzle_key(s) for s in stmts}) == 10_000
    assert not set(stmts) & official_exact
    assert not {kk.puzzle_key(s) for s in stmts} & official
    for p in probs:  # independent brute force
        assert ref_solutions(p["statements"]) == [p["solution"]]


# ---------------------------------------------------------------- grammar and solver
def test_evaluate_and_truth_table_agree_with_reference():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 6)
        s = random_statement(rng, n, rng.randint(1, 3))
        table = kk.truth_table(s, n)
        for a, x in enumerate(itertools.product((True, False), repeat=n)):
            assert kk.evaluate(s, x) == ref_eval(s, x) == bool(table >> a & 1)


def test_solve_matches_reference_on_random_puzzles():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(2, 6)
        stmts = tuple(random_statement(rng, n, 2) for _ in range(n))
        assert kk.solve(stmts) == ref_solutions(stmts)
        assert kk.count_solutions(stmts) == len(ref_solutions(stmts))


def test_solve_n12():
    # Person i says "person i+1 is a knight"; the last says "person 0 is a knave" -> a
    # cycle with an odd number of knave-links: no solution.  Replacing it with a knight
    # claim gives exactly two (all knights / all knaves).
    n = 12
    chain = tuple(("telling-truth", i + 1) for i in range(n - 1))
    assert kk.solve(chain + (("lying", 0),)) == []
    assert kk.solve(chain + (("telling-truth", 0),)) == [(True,) * n, (False,) * n]
    probs = kk.generate_problems(12, 3, seed=5)
    for p in probs:
        assert kk.solve(p["statements"]) == [p["solution"]]
        assert kk.is_consistent(p["statements"], p["solution"])


def test_sampler_deterministic_and_configurable():
    a = kk.generate_problems(4, 50, seed=7)
    b = kk.generate_problems(4, 50, seed=7)
    c = kk.generate_problems(4, 50, seed=8)
    assert a == b and a != c
    for n in (2, 8):
        assert len(kk.generate_problems(n, 5, seed=0)) == 5
    deep = kk.generate_problems(3, 20, seed=0, depth=3, width=3)
    assert any(len(s) == 4 for p in deep for s in p["statements"] if s[0] in ("and", "or"))
    assert max(_depth(s) for p in deep for s in p["statements"]) == 3
    for p in deep:
        kk.validate_statements(p["statements"])
        assert kk.format_statement(["A", "B", "C"], p["statements"][0])
    assert kk.sample_statements(3, seed=9) == kk.KKSampler(9, 3).sample()
    shallow = kk.KKSampler(0, 3, depth=1)  # leaves only (rarely uniquely solvable)
    assert all(s[0] in kk.LEAVES for _ in range(50) for s in shallow.sample())


def _depth(s):
    return 1 if s[0] in kk.LEAVES else 1 + max(_depth(t) for t in s[1:])


def test_no_self_knave_leaf():
    for p in kk.generate_problems(3, 300, seed=2):
        for i, s in enumerate(p["statements"]):
            assert not _has_leaf(s, ("lying", i))


def _has_leaf(s, leaf):
    return s == leaf or (s[0] not in kk.LEAVES and any(_has_leaf(t, leaf) for t in s[1:]))


def test_validate_rejects_malformed():
    for bad in [(("lying", 3),), (("maybe", 0),), (("and", ("lying", 0)),),
                (("->", ("lying", 0)),), ((),)]:
        with pytest.raises(ValueError):
            kk.validate_statements(bad)


def test_canonical_key_ignores_operand_order_only():
    a = (("or", ("telling-truth", 1), ("lying", 0)), ("lying", 0))
    b = (("or", ("lying", 0), ("telling-truth", 1)), ("lying", 0))
    c = (("->", ("lying", 0), ("telling-truth", 1)), ("lying", 0))
    d = (("->", ("telling-truth", 1), ("lying", 0)), ("lying", 0))
    assert kk.puzzle_key(a) == kk.puzzle_key(b)
    assert kk.puzzle_key(c) != kk.puzzle_key(d)


def test_infeasible_requests():
    with pytest.raises(kk.InfeasibleRequest):
        kk.generate_problems(2, 10 ** 6)  # more than the counting bound
    with pytest.raises(kk.InfeasibleRequest):
        kk.generate_problems(2, 800, max_failures=2000)  # fewer than 800 exist
    with pytest.raises(ValueError):
        kk.KKSampler(0, 1)


# ---------------------------------------------------------------- records, files, splits
def test_generated_records_roundtrip_and_fields(tmp_path):
    recs = dataset.generate_records(3, 20, seed=3)
    for i, r in enumerate(recs):
        assert tuple(r) == kk.RECORD_FIELDS and r["index"] == i
        assert kk.solve(kk.record_statements(r)) == [tuple(r["solution"])]
        assert r["prompt"].endswith(r["quiz"] + "\n<|im_end|>\n<|im_start|>assistant\n<think>")
    path = tmp_path / "x.jsonl"
    kk.save_jsonl(recs, path)
    assert kk.load_jsonl(path) == json.loads(json.dumps(recs))
    with pytest.raises(FileExistsError):
        kk.save_jsonl(recs, path)
    kk.save_jsonl(recs[:2], path, overwrite=True)
    assert len(kk.load_jsonl(path)) == 2
    # start_index continues the same stream
    assert dataset.generate_records(3, 5, seed=3, start_index=15) == recs[15:20]


def test_split_never_shares_a_puzzle():
    recs = dataset.generate_records(3, 60, seed=4)
    recs.append(dict(recs[0]))  # an exact duplicate must end on one side only
    train, test = kk.split_records(recs, n_test=20, seed=0)
    assert len(train) + len(test) == len(recs)
    assert 20 <= len(test) <= 21
    assert kk.disjoint(train, test)
    assert not kk.disjoint(recs[:5], recs[3:8])


def test_save_jsonl_while_another_process_writes_the_same_file(tmp_path):
    """Two processes caching the same file at once (the ranks of `accelerate launch`, a
    study's parallel jobs) both succeed: each writes its own temporary file. Here a second
    process writes the whole file while the first is halfway through its own."""
    import subprocess
    import sys
    from conftest import ROOT
    from lopti_minimal.task.kk import load_jsonl, save_jsonl
    path = tmp_path / "set.jsonl"
    other = ("import sys; from lopti_minimal.task.kk import save_jsonl; "
             "save_jsonl([{'i': 0}, {'i': 1}], sys.argv[1], overwrite=True)")

    def records():
        yield {"i": 0}
        subprocess.run([sys.executable, "-c", other, str(path)], cwd=ROOT, check=True)
        yield {"i": 1}
    save_jsonl(records(), path, overwrite=True)
    assert load_jsonl(path) == [{"i": 0}, {"i": 1}]
    assert not list(tmp_path.glob("*.tmp"))
