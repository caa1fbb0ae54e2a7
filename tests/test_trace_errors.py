"""scripts/trace_errors.py: the first line where a response leaves the compact trace, and its
kind. The reference trace of a shipped held-out puzzle, edited the ways a policy goes wrong."""
from __future__ import annotations

import json

import pytest

from conftest import ROOT, load_script
from lopti_minimal.task import explain

trace_errors = load_script("scripts/trace_errors.py")

RECORD = json.loads((ROOT / "data" / "heldout3.jsonl").open().readline())
REFERENCE = explain.compact_explanation(RECORD).split("\n")
ANSWER = "\n</think>\n<answer> (1) Oliver is a knight\n(2) Penelope is a knight\n(3) Daniel is a knight </answer>"


def _response(lines: list[str]) -> str:
    return "\n" + "\n".join(lines) + ANSWER


def _edit(k: int, *, insert: str | None = None, replace: str | None = None, drop: bool = False) -> str:
    lines = list(REFERENCE)
    if insert is not None:
        lines.insert(k, insert)
    elif replace is not None:
        lines[k] = replace
    elif drop:
        del lines[k]
    return _response(lines)


def test_the_reference_trace_is_faithful():
    assert REFERENCE[4] == "try Oliver=T Penelope=T"           # the puzzle this test was written for
    assert trace_errors.first_deviation(_response(REFERENCE), RECORD) == "faithful"
    # a trace that goes on after its last line is not faithful
    assert trace_errors.first_deviation(_response(REFERENCE + ["try Oliver=F"]), RECORD) == "other"


@pytest.mark.parametrize("edit,kind", [
    # Oliver's claim checked at "Oliver=T Penelope=T": Daniel (its "at") has no value yet
    (dict(k=5, insert="  Oliver=T: if Daniel=T then Penelope=T = T ok"), "checks too early"),
    (dict(k=8, drop=True), "skips a check"),          # "found" where Daniel's claim is still due
    (dict(k=6, replace="  Penelope=T: if Oliver=T then Daniel=T = T ok"), "checks another claim"),
    (dict(k=6, replace="  Oliver=T: if Daniel=F then Penelope=T = T ok"), "substitutes wrongly"),
    (dict(k=6, replace="  Oliver=T: if Daniel=T then Penelope=T = F bad"), "evaluates wrongly"),
    (dict(k=0, replace="  Oliver: if Penelope then Daniel (at Daniel)"), "restates a claim"),
    (dict(k=4, replace="try Oliver=T Penelope=F"), "tries another node"),
])
def test_each_kind_of_first_deviation(edit, kind):
    assert trace_errors.first_deviation(_edit(**edit), RECORD) == kind


def test_a_check_after_a_failed_one_and_a_repeated_check_are_told_apart():
    failed = REFERENCE[:6] + ["  Oliver=T: if Daniel=T then Penelope=T = F bad"]
    # after a failing check the reference tries the next node: a further check is 'after "bad"'
    assert trace_errors.classify("try Oliver=T Penelope=T Daniel=F",
                                 "  Penelope=T: if Oliver=T then Daniel=T = T ok", failed) == 'checks after "bad"'
    # every person the check mentions is assigned: a claim checked again, not too early
    assert trace_errors.classify("try Oliver=F", "  Oliver=T: if Daniel=T then Penelope=T = T ok",
                                 REFERENCE[:9]) == "checks again"


def test_the_table_counts_right_answers_per_kind(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"index": i, "n_people": 3, "response": text, "correct": True}) + "\n"
                            for i, text in enumerate([_response(REFERENCE), _edit(k=8, drop=True)])))
    assert trace_errors.kinds(path, {0: RECORD, 1: RECORD}) == {0: ("faithful", True), 1: ("skips a check", True)}
    text = trace_errors.table({0: ("faithful", True), 1: ("skips a check", True), 2: ("skips a check", False)})
    assert "skips a check             2  (1 right)" in text and "all                       3  (2 right)" in text


def test_the_table_counts_responses_over_a_token_budget(tmp_path):
    """--tokens-over N: per kind, the responses an RL run sampling N new tokens would cut off
    (the end-of-turn token counted)."""
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"index": i, "response": text, "correct": True}) + "\n"
                            for i, text in enumerate(["a b c", "a b c d e"])))
    words = lambda text, add_special_tokens: {"input_ids": text.split()}   # noqa: E731  one token a word
    assert trace_errors.response_tokens(path, words) == {0: 4, 1: 6}
    found = {0: ("faithful", True), 1: ("skips a check", True), 2: ("skips a check", False)}
    text = trace_errors.table(found, over={1, 2})
    assert "faithful                  1  (1 right, 0 over the budget)" in text
    assert "skips a check             2  (1 right, 2 over the budget)" in text
    assert "all                       3  (2 right, 2 over the budget)" in text
    assert "over" not in trace_errors.table(found)
