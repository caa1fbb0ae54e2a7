"""Step-by-step derivations of K&K solutions, for the supervised warm start.

Both styles are correct by construction (tests/test_explain.py replays every step). The
two styles and the compact claim notation in full: docs/TASK_AND_MODELS.md.

Design choices:

1. `backtracking_explanation` is the official style of the K&K generator (Xie et al. 2024,
   `generate_chain_of_thoughts` + `format_chain_of_thoughts` with both "repeat claim"
   options on: the `cot_head` / `cot_repeat_steps` / `cot_foot` fields); we reproduce the
   official text for all 500 official puzzles.
2. `compact_explanation` is a short, regular trace for a ~3M-parameter model trained on CPU
   (n = 3..5), by one design rule: every token is predictable from nearby context by a
   short local lookup. So each claim is restated once with the person at which it becomes
   decidable ("at X"), the depth-first search runs in speaker order (T = knight first),
   each node line re-writes the whole partial assignment, and each check copies the claim
   with every person's value written next to their name.
3. Every line that starts with a name is indented ("  Amelia"), so a name is always the
   same token (" Amelia") and a lookup is an exact token match (bare T/F in place of the
   names would need two chained lookups per value).
4. Compact claim notation: literals "X" / "not X", a negated leaf simplified, operators
   "A and B", "A or B", "if A then B", "A iff B", compound operands (only at depth > 2) in
   parentheses.
"""
from __future__ import annotations

from typing import Sequence

from . import kk

COT_HEAD = ("Let's think step by step, by considering whether each person is lying and "
            "if that leads to contradiction.")
COT_SUCCESS = "This leads to a feasible solution."
COT_FAIL = "All the configurations lead to contradictions."


def cot_foot(success: bool) -> str:
    return COT_SUCCESS if success else COT_FAIL


def _statements_and_names(record, statements, names):
    if record is not None:
        return kk.record_statements(record), list(record["names"])
    if statements is None or names is None:
        raise ValueError("pass a record, or statements and names")
    return tuple(statements), list(names)


# --------------------------------------------------------------------------------------
# (a) official backtracking search
# --------------------------------------------------------------------------------------
def _first_unsatisfiable(statements, assignment) -> int | None:
    """The lowest-index assigned person whose claim (negated for a knave) is false under
    every completion of the unassigned people, or None.  Each claim is tested on its own,
    as in the original `can_be_falsified_v2`; with truth tables a completion exists iff
    the claim's table meets the set of assignments that agree with the partial one."""
    n = len(statements)
    masks, full = kk._knight_masks(n)
    agree = full
    for j, x in enumerate(assignment):
        if x is not None:
            agree &= masks[j] if x else full ^ masks[j]
    for p, x in enumerate(assignment):
        if x is None:
            continue
        table = kk.truth_table(statements[p], n)
        if not (table if x else full ^ table) & agree:
            return p
    return None


def _move_mentioned_first(queue: tuple, mentioned: list[int]) -> tuple:
    """People mentioned by the last speaker go to the front, in order of first mention;
    the others keep their order."""
    front = []
    for p in mentioned:
        if p in queue and p not in front:
            front.append(p)
    return tuple(front) + tuple(p for p in queue if p not in front)


def backtracking_tape(statements: Sequence[kk.Statement]) -> list[tuple]:
    """The search as a list of steps:
    ('proposal', person, value, None)            assumption without contradiction
    ('proposal', person, value, (q, value_q))    contradiction with q's claim
    ('reconsider', person, [exhausted people])   backtrack
    ('success', assignment) or ('fail',)         last step."""
    n = len(statements)
    tape: list[tuple] = []
    assignment: list = [None] * n
    options = {p: [False, True] for p in range(n)}  # pop() tries knight (True) first
    queue = tuple(range(n))
    cursor = 0
    while True:
        if cursor >= n:
            tape.append(("success", tuple(assignment)))
            return tape
        if not options[queue[cursor]]:  # both values failed: backtrack
            exhausted = []
            while cursor >= 0 and not options[queue[cursor]]:
                p = queue[cursor]
                options[p], assignment[p] = [False, True], None
                exhausted.append(p)
                cursor -= 1
            if cursor < 0:
                tape.append(("fail",))
                return tape
            tape.append(("reconsider", queue[cursor], exhausted))
        person = queue[cursor]
        assignment[person] = options[person].pop()
        bad = _first_unsatisfiable(statements, assignment)
        if bad is None:
            tape.append(("proposal", person, assignment[person], None))
            cursor += 1
            queue = queue[:cursor] + _move_mentioned_first(
                queue[cursor:], kk.mentioned_people(statements[person]))
        else:
            tape.append(("proposal", person, assignment[person], (bad, assignment[bad])))


def _role(value: bool) -> str:
    return "a knight" if value else "a knave"


def _list_people(people: list[str]) -> str:
    """ "A", "A and B", "A, B, and C" """
    if len(people) <= 2:
        return " and ".join(people)
    return ", ".join(people[:-1]) + ", and " + people[-1]


def format_step(step: tuple, statements, names) -> str:
    """One tape step in the official English."""
    claim = lambda p: kk.format_statement(names, statements[p])  # noqa: E731
    if step[0] == "proposal":
        _, p, value, conflict = step
        if conflict is None:
            false = "" if value else "false "
            return (f"Assume {names[p]} is {_role(value)}. No contradiction is found in "
                    f"their {false}claim that {claim(p)}.")
        q, value_q = conflict
        false = "" if value_q else "false "
        whose = "their own" if q == p else names[q]
        return (f"{names[p]} cannot be {_role(value)}, because this would contradict the "
                f"{false}claim of {whose} that {claim(q)}.")
    if step[0] == "reconsider":
        _, p, exhausted = step
        return (f"We have exhausted all possibilities for "
                f"{_list_people([names[e] for e in exhausted])}, so let us go back and "
                f"reconsider {names[p]}.")
    raise ValueError(f"not a formattable step: {step!r}")


def backtracking_steps(statements, names) -> tuple[list[str], bool]:
    """(the official `cot_repeat_steps`, whether the search succeeded)."""
    tape = backtracking_tape(statements)
    steps = [format_step(s, statements, names) for s in tape[:-1]]
    return steps, tape[-1][0] == "success"


def backtracking_explanation(record: dict | None = None, *, statements=None,
                             names=None) -> str:
    """cot_head, the steps and cot_foot, one per line."""
    statements, names = _statements_and_names(record, statements, names)
    steps, success = backtracking_steps(statements, names)
    return "\n".join([COT_HEAD, *steps, cot_foot(success)])


# --------------------------------------------------------------------------------------
# (b) compact explanation for the tiny model
# --------------------------------------------------------------------------------------
def compact_claim(stmt: kk.Statement, labels: Sequence[str]) -> str:
    """A statement in compact notation, person j written as labels[j] (a name, or the
    person's value "T"/"F" when substituting)."""
    tag = stmt[0]
    if tag in kk.LEAVES:
        return _literal(stmt, labels, negated=False)
    if tag == "not":
        if stmt[1][0] in kk.LEAVES:
            return _literal(stmt[1], labels, negated=True)
        return f"not ({compact_claim(stmt[1], labels)})"
    parts = [_compact_operand(s, labels) for s in stmt[1:]]
    if tag in ("and", "or"):
        return f" {tag} ".join(parts)
    if tag == "->":
        return f"if {parts[0]} then {parts[1]}"
    if tag == "<=>":
        return f"{parts[0]} iff {parts[1]}"
    raise ValueError(f"unknown statement type {tag!r}")


def _literal(leaf, labels, negated: bool) -> str:
    positive = (leaf[0] == kk.KNIGHT) != negated  # "not a knave" is "a knight"
    return labels[leaf[1]] if positive else f"not {labels[leaf[1]]}"


def _compact_operand(stmt, labels) -> str:
    text = compact_claim(stmt, labels)
    return text if stmt[0] in kk.LEAVES or stmt[0] == "not" and stmt[1][0] in kk.LEAVES \
        else f"({text})"


def _tf(value: bool) -> str:
    return "T" if value else "F"


def decidable_at(statements) -> list[list[int]]:
    """decidable_at(S)[k]: the speakers whose claim becomes decidable when person k (in
    speaker order) is assigned: max({i} | people mentioned by i) == k."""
    out: list[list[int]] = [[] for _ in statements]
    for i, s in enumerate(statements):
        out[max([i, *kk.mentioned_people(s)])].append(i)
    return out


def compact_trace(statements) -> list[tuple]:
    """The compact search as events: ('node', assignment tuple), ('check', speaker,
    claim value, ok), ('found', assignment), or ('guess', all knaves) when the search ends
    without a solution (unsolvable puzzles only).  DFS in speaker order, T before F; a node's
    checks stop at the first failing one; the search stops at the first full assignment
    whose checks all pass (the unique solution of a valid puzzle)."""
    n = len(statements)
    due = decidable_at(statements)
    events: list[tuple] = []

    def visit(prefix: tuple) -> bool:
        k = len(prefix)
        for value in (True, False):
            node = prefix + (value,)
            events.append(("node", node))
            fine = True
            for i in due[k]:
                claim = kk.evaluate(statements[i], node + (False,) * (n - k - 1))
                fine = claim == node[i]
                events.append(("check", i, claim, fine))
                if not fine:
                    break
            if fine and (k == n - 1 or visit(node)):
                if k == n - 1:
                    events.append(("found", node))
                return True
        return False

    if not visit(()):
        # No assignment passes (an unsolvable puzzle, or -- for the model -- one of its own
        # wrong checks rejected the solution): the search has run out of candidates.  The
        # trace still ends in an answer, a fixed guess (everyone a knave), so a model that
        # has seen this closes its response instead of re-trying nodes it has already
        # tried (a warm start that never saw this made format errors only by such loops,
        # scripts/format_errors.py).
        events.append(("guess", (False,) * n))
    return events


def compact_explanation(record: dict | None = None, *, statements=None, names=None) -> str:
    """The compact trace as text (see the module docstring).  Example (3 people):

          Amelia: not Evelyn (at Evelyn)
          Penelope: Penelope or not Evelyn (at Evelyn)
          Evelyn: Penelope iff not Penelope (at Evelyn)
        try Amelia=T
        try Amelia=T Penelope=T
        try Amelia=T Penelope=T Evelyn=T
          Amelia=T: not Evelyn=T = F bad
        try Amelia=T Penelope=T Evelyn=F
          Amelia=T: not Evelyn=F = T ok
          Penelope=T: Penelope=T or not Evelyn=F = T ok
          Evelyn=F: Penelope=T iff not Penelope=T = F ok
        found Amelia=T Penelope=T Evelyn=F
    """
    statements, names = _statements_and_names(record, statements, names)
    n = len(names)
    at = {i: k for k, speakers in enumerate(decidable_at(statements)) for i in speakers}
    lines = [f"  {names[i]}: {compact_claim(s, names)} (at {names[at[i]]})"
             for i, s in enumerate(statements)]
    node: tuple = ()
    for event in compact_trace(statements):
        if event[0] == "node":
            node = event[1]
            lines.append("try " + _assignment(node, names))
        elif event[0] == "check":
            _, i, claim, fine = event
            # Each person written with their value: "Evelyn=F".  Every person a decidable
            # claim mentions is assigned; "?" would mark one that is not (never happens).
            labels = [f"{names[j]}={_tf(node[j]) if j < len(node) else '?'}" for j in range(n)]
            lines.append(f"  {names[i]}={_tf(node[i])}: {compact_claim(statements[i], labels)}"
                         f" = {_tf(claim)} {'ok' if fine else 'bad'}")
        else:                                   # "found" (the solution) or "guess"
            lines.append(f"{event[0]} " + _assignment(event[1], names))
    return "\n".join(lines)


def line_kind(line: str) -> str:
    """A compact-trace line's kind, by its shape: "claim" ("  Amelia: not Evelyn (at
    Evelyn)"), "try" (a node), "check" ("  Amelia=T: not Evelyn=F = T ok"), "found" (the
    solution, or the guess that ends a search that ran out) or "other" (tags, the answer)."""
    if line.startswith("try"):
        return "try"
    if line.startswith(("found", "guess")):
        return "found"
    if line.endswith(")") and "(at " in line:
        return "claim"
    if line.endswith((" ok", " bad")):
        return "check"
    return "other"


def _assignment(node: tuple, names) -> str:
    return " ".join(f"{names[j]}={_tf(v)}" for j, v in enumerate(node))
