"""Explanations (lopti_minimal/task/explain.py): the official backtracking text is reproduced,
and both styles are replayed step by step against the logic by independent checkers."""
import itertools
import re

import pytest

from conftest import ref_eval, ref_solutions
from lopti_minimal.task import dataset, explain, kk

OFFICIAL = kk.load_official()
GENERATED = {n: dataset.generate_records(n, 60, seed=11, exclude=kk.official_keys())
             for n in range(3, 7)}


def _people(s):
    return [s[1]] if s[0] in ("telling-truth", "lying") else \
        [p for t in s[1:] for p in _people(t)]


def satisfiable_alone(stmt, value, partial, n):
    """Some completion of the unassigned people makes stmt == value (the official check,
    one claim at a time)."""
    free = [p for p in range(n) if p not in partial]
    for vals in itertools.product((True, False), repeat=len(free)):
        x = {**partial, **dict(zip(free, vals))}
        if ref_eval(stmt, [x[p] for p in range(n)]) == value:
            return True
    return False


# ---------------------------------------------------------------- (a) backtracking
def test_backtracking_reproduces_official_cot():
    for r in OFFICIAL:
        steps, ok = explain.backtracking_steps(kk.record_statements(r), r["names"])
        assert steps == r["cot_repeat_steps"]
        assert explain.cot_foot(ok) == r["cot_foot"]
        assert explain.COT_HEAD == r["cot_head"]
        text = explain.backtracking_explanation(r)
        assert text == "\n".join([r["cot_head"], *r["cot_repeat_steps"], r["cot_foot"]])
        assert explain.backtracking_explanation(
            statements=kk.record_statements(r), names=r["names"]) == text


ASSUME = re.compile(r"Assume (\w+) is a (knight|knave)\. No contradiction is found in "
                    r"their (false )?claim that (.*)\.")
CANNOT = re.compile(r"(\w+) cannot be a (knight|knave), because this would contradict the "
                    r"(false )?claim of (their own|\w+) that (.*)\.")
BACK = re.compile(r"We have exhausted all possibilities for (.*), so let us go back and "
                  r"reconsider (\w+)\.")


def replay_backtracking(text, stmts, names):
    """Check every sentence of a backtracking explanation against the logic."""
    n, idx = len(stmts), {nm: i for i, nm in enumerate(names)}
    lines = text.split("\n")
    assert lines[0] == explain.COT_HEAD and lines[-1] == explain.COT_SUCCESS
    partial, stack, tried = {}, [], {p: set() for p in range(n)}
    pending = None  # the person being decided (after a contradiction)
    for line in lines[1:-1]:
        if m := ASSUME.fullmatch(line):
            x, val = idx[m[1]], m[2] == "knight"
            assert x not in partial and val not in tried[x]
            assert pending in (None, x)
            if not tried[x]:
                assert val is True  # knight is always tried first
            assert (m[3] is None) == val
            assert m[4] == kk.format_statement(names, stmts[x])
            partial[x] = val
            tried[x].add(val)
            for p, v in partial.items():
                assert satisfiable_alone(stmts[p], v, partial, n)
            stack.append(x)
            pending = None
        elif m := CANNOT.fullmatch(line):
            x, val = idx[m[1]], m[2] == "knight"
            assert x not in partial and val not in tried[x] and pending in (None, x)
            if not tried[x]:
                assert val is True
            y = x if m[4] == "their own" else idx[m[4]]
            trial = {**partial, x: val}
            assert y in trial and (m[3] is None) == trial[y]
            assert m[5] == kk.format_statement(names, stmts[y])
            assert not satisfiable_alone(stmts[y], trial[y], trial, n)
            tried[x].add(val)
            pending = x
        elif m := BACK.fullmatch(line):
            listed = [idx[w] for w in re.split(r", and |, | and ", m[1])]
            assert listed[0] == pending and tried[pending] == {True, False}
            tried[pending] = set()
            for e in listed[1:]:
                assert stack and stack[-1] == e and tried[e] == {True, False}
                stack.pop()
                del partial[e]
                tried[e] = set()
            w = idx[m[2]]
            assert stack and stack[-1] == w and len(tried[w]) == 1
            stack.pop()
            del partial[w]
            pending = w
        else:
            raise AssertionError(f"unknown step: {line!r}")
    assert len(partial) == n
    sol = tuple(partial[p] for p in range(n))
    assert ref_solutions(stmts) == [sol]


def test_backtracking_replay_official_and_generated():
    records = OFFICIAL + [r for recs in GENERATED.values() for r in recs]
    for r in records:
        replay_backtracking(explain.backtracking_explanation(r), kk.record_statements(r),
                            r["names"])


def test_backtracking_reports_failure_on_unsolvable():
    stmts = (("lying", 1), ("telling-truth", 0))  # A: B knave; B: A knight -> no solution
    tape = explain.backtracking_tape(stmts)
    assert tape[-1] == ("fail",)
    steps, ok = explain.backtracking_steps(stmts, ["A", "B"])
    assert not ok and explain.cot_foot(ok) == explain.COT_FAIL


# ---------------------------------------------------------------- (b) compact
def tokenize(text):
    return re.findall(r"\(|\)|[^\s()]+", text)


def parse_claim(text):
    """Parser for the compact claim language, written for the test."""
    toks = tokenize(text)
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take(expected=None):
        t = toks[pos[0]]
        assert expected is None or t == expected, (t, expected, text)
        pos[0] += 1
        return t

    def expr():
        if peek() == "if":
            take("if")
            a = iff()
            take("then")
            return ("->", a, iff())
        return iff()

    def iff():
        a = orx()
        if peek() == "iff":
            take()
            return ("<=>", a, orx())
        return a

    def orx():
        parts = [andx()]
        while peek() == "or":
            take()
            parts.append(andx())
        return parts[0] if len(parts) == 1 else ("or", *parts)

    def andx():
        parts = [unary()]
        while peek() == "and":
            take()
            parts.append(unary())
        return parts[0] if len(parts) == 1 else ("and", *parts)

    def unary():
        if peek() == "not":
            take()
            return ("not", unary())
        if peek() == "(":
            take("(")
            e = expr()
            take(")")
            return e
        return ("atom", take())

    tree = expr()
    assert pos[0] == len(toks), text
    return tree


def eval_claim(tree, env):
    op = tree[0]
    if op == "atom":
        return env[tree[1]]
    vals = [eval_claim(t, env) for t in tree[1:]]
    return {"not": lambda: not vals[0], "and": lambda: all(vals), "or": lambda: any(vals),
            "->": lambda: (not vals[0]) or vals[1], "<=>": lambda: vals[0] == vals[1]}[op]()


def next_dfs_node(node, n, last_ok):
    """The next node of a speaker-order DFS (T first) after `node`."""
    if last_ok and len(node) < n:
        return node + (True,)
    node = list(node)
    while node and node[-1] is False:
        node.pop()
    assert node, "search space exhausted"
    node[-1] = False
    return tuple(node)


def replay_compact(text, stmts, names):
    n = len(stmts)
    idx = {nm: i for i, nm in enumerate(names)}
    lines = text.split("\n")
    claims = []
    due = [[i for i in range(n) if max([i, *_people(stmts[i])]) == k] for k in range(n)]
    for i in range(n):  # 1. restated claims: same meaning as the statement, and "at" right
        m = re.fullmatch(r"  (\w+): (.*) \(at (\w+)\)", lines[i])
        assert m, lines[i]
        who, claim, at = m[1], m[2], m[3]
        assert who == names[i]
        assert i in due[idx[at]]
        tree = parse_claim(claim)
        for x in itertools.product((True, False), repeat=n):
            assert eval_claim(tree, dict(zip(names, x))) == ref_eval(stmts[i], x)
        claims.append(claim)
    node, expected_node, checks, last_ok = None, (True,), [], True
    header = re.compile(r"try ((?:\w+=[TF] ?)+)")

    def close_node():  # the checks of the finished node: the decidable ones, up to a bad
        k = len(node) - 1
        assert [c[0] for c in checks] == due[k][:len(checks)]
        assert all(c[1] for c in checks[:-1])
        if checks and not checks[-1][1]:
            return False
        assert len(checks) == len(due[k])
        return True

    for line in lines[n:-1]:
        if m := header.fullmatch(line):
            if node is not None:
                last_ok = close_node()
                expected_node = next_dfs_node(node, n, last_ok)
            pairs = [p.split("=") for p in m[1].split()]
            assert [idx[a] for a, _ in pairs] == list(range(len(pairs)))
            node = tuple(v == "T" for _, v in pairs)
            assert node == expected_node
            checks = []
        else:
            m = re.fullmatch(r"  (\w+)=([TF]): (.*) = ([TF]) (ok|bad)", line)
            assert m, line
            i, role = idx[m[1]], m[2] == "T"
            assert role == node[i]
            subst = tokenize(m[3])
            # Every name of the claim, in place, with its value in the current node.
            want = [f"{t}={'T' if node[idx[t]] else 'F'}" if t in idx else t
                    for t in tokenize(claims[i])]
            assert subst == want
            env = {t: t.endswith("=T") for t in subst if "=" in t}
            value = eval_claim(parse_claim(m[3]), env)
            assert (m[4] == "T") == value
            assert (m[5] == "ok") == (value == role)
            checks.append((i, m[5] == "ok"))
    if lines[-1].startswith("guess "):       # the search ran out: unsolvable puzzles only
        assert not close_node() and not any(node), "the search is not exhausted"
        assert lines[-1] == "guess " + " ".join(f"{nm}=F" for nm in names)
        assert ref_solutions(stmts) == []
        return
    assert close_node() and len(node) == n
    m = re.fullmatch(r"found ((?:\w+=[TF] ?)+)", lines[-1])
    assert m
    found = tuple(p.split("=")[1] == "T" for p in m[1].split())
    assert found == node
    assert ref_solutions(stmts) == [found]


def test_unsolvable_puzzles_search_every_node_then_guess():
    """dataset.generate_unsolvable_records (warm-start data only): the trace is a full, correct
    search that finds nothing, then the fixed guess; the answer block says that guess."""
    from lopti_minimal.task import prompts
    for n in (2, 3, 4, 5):
        records = dataset.generate_unsolvable_records(n, 30, seed=n)
        assert dataset.generate_unsolvable_records(n, 30, seed=n) == records        # deterministic
        for r in records:
            assert r["solvable"] is False and r["solution"] == [False] * n
            replay_compact(explain.compact_explanation(r), kk.record_statements(r), r["names"])
            assert prompts.target_response(r).endswith(
                "\n</think>\n<answer> " + r["solution_text_format"] + " </answer>")
    solvable = GENERATED[3][0]
    with pytest.raises(AssertionError):     # a solvable puzzle's trace cannot end in a guess
        text = explain.compact_explanation(solvable).rsplit("\n", 1)[0] + "\nguess " + \
            " ".join(f"{nm}=F" for nm in solvable["names"])
        replay_compact(text, kk.record_statements(solvable), solvable["names"])


def test_compact_example_from_docstring():
    r = OFFICIAL[0]
    assert explain.compact_explanation(r) == "\n".join([
        "  Amelia: not Evelyn (at Evelyn)",
        "  Penelope: Penelope or not Evelyn (at Evelyn)",
        "  Evelyn: Penelope iff not Penelope (at Evelyn)",
        "try Amelia=T",
        "try Amelia=T Penelope=T",
        "try Amelia=T Penelope=T Evelyn=T",
        "  Amelia=T: not Evelyn=T = F bad",
        "try Amelia=T Penelope=T Evelyn=F",
        "  Amelia=T: not Evelyn=F = T ok",
        "  Penelope=T: Penelope=T or not Evelyn=F = T ok",
        "  Evelyn=F: Penelope=T iff not Penelope=T = F ok",
        "found Amelia=T Penelope=T Evelyn=F"])


def test_compact_replay_official_and_generated():
    records = OFFICIAL + [r for recs in GENERATED.values() for r in recs]
    for r in records:
        replay_compact(explain.compact_explanation(r), kk.record_statements(r), r["names"])


def test_compact_replay_catches_a_wrong_step():
    r = OFFICIAL[0]
    good = explain.compact_explanation(r)
    for bad in (good.replace("= F bad", "= T ok", 1),
                good.replace("try Amelia=T Penelope=T Evelyn=F", "try Amelia=F"),
                good.replace("found Amelia=T", "found Amelia=F"),
                good.replace("not Evelyn=F = T ok", "not Evelyn=T = T ok"),
                good.replace("(at Evelyn)", "(at Penelope)", 1)):
        assert bad != good
        with pytest.raises(AssertionError):
            replay_compact(bad, kk.record_statements(r), r["names"])


def test_compact_claim_notation_all_operators():
    names = ["A", "B", "C"]
    cases = {
        ("telling-truth", 1): "B", ("lying", 1): "not B",
        ("not", ("telling-truth", 1)): "not B", ("not", ("lying", 1)): "B",
        ("and", ("lying", 0), ("telling-truth", 2)): "not A and C",
        ("or", ("lying", 0), ("telling-truth", 2), ("lying", 1)): "not A or C or not B",
        ("->", ("lying", 0), ("telling-truth", 2)): "if not A then C",
        ("<=>", ("telling-truth", 0), ("telling-truth", 2)): "A iff C",
        ("or", ("and", ("lying", 0), ("telling-truth", 1)), ("not", ("telling-truth", 2))):
            "(not A and B) or not C",
        ("not", ("or", ("lying", 0), ("telling-truth", 1))): "not (not A or B)",
    }
    for stmt, text in cases.items():
        assert explain.compact_claim(stmt, names) == text
        tree = parse_claim(text)
        for x in itertools.product((True, False), repeat=3):
            assert eval_claim(tree, dict(zip(names, x))) == ref_eval(stmt, x)


def test_compact_deep_statements_replay():
    for p in kk.generate_problems(3, 30, seed=2, depth=3, width=3):
        names = ["Emma", "Liam", "Noah"]
        replay_compact(explain.compact_explanation(statements=p["statements"], names=names),
                       p["statements"], names)


def test_compact_is_short_for_three_people():
    lengths = [len(explain.compact_explanation(r)) for r in GENERATED[3]]
    assert sum(lengths) / len(lengths) < 700
