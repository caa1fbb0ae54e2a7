"""Where does a compact-trace response first leave the search it should write?

    python eval.py --model DIR --data data/heldout3.jsonl --save-responses --out OUT/eval_heldout3.json
    python scripts/trace_errors.py OUT/eval_heldout3.responses.jsonl [MORE.responses.jsonl ...]
    python scripts/trace_errors.py --start START.responses.jsonl POLICY.responses.jsonl

A policy trained on the compact trace (explain.compact_explanation: restate each claim
with the person at which it becomes decidable, a depth-first search in speaker order, each
due claim checked by look-up) should write exactly that trace, line for line, and then the
answer. Greedy decoding is deterministic, so a response's *first* line that differs from
the reference trace is where it went wrong; this script names the kind of that line:

    faithful              every line of the reference trace, in order
    restates a claim      a claim line ("  Ava: not Ben (at Ben)") differs
    checks too early      a check written where the reference tries the next node, of a
                          claim that mentions a person the node has not assigned yet (the
                          claim's "at" person is deeper: the value written there is made up)
    checks after "bad"    the same, after a failed check (the reference stops at the first)
    checks again          the same, of a claim whose people are all assigned (it was due,
                          and checked, at an earlier node)
    skips a check         the next node tried where the reference still checks a claim
    checks another claim  a check of another speaker's claim than the reference's
    substitutes wrongly   the right speaker's check with other values copied in
    evaluates wrongly     the right substitution, the wrong truth value or verdict
    tries another node    a "try" line with another assignment
    other                 anything else (the "found" line, the end of the trace)

Printed per file: how many responses have each first deviation, and how many of those
answered right (a wrong step can still land on the solution). With ``--start``, the same
for the puzzles each policy lost (the start right, the policy wrong) and gained. With
``--tokens-over N``, also how many of each kind are longer than N tokens (the model's
tokenizer, the end-of-turn token counted as a sampler counts it): what an RL run sampling
at most N new tokens would have cut off and scored as a format error.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.task import explain  # noqa: E402
from lopti_minimal.task.explain import line_kind  # noqa: E402
from lopti_minimal.task.kk import load_jsonl  # noqa: E402

KINDS = ["faithful", "restates a claim", "checks too early", 'checks after "bad"', "checks again",
         "skips a check", "checks another claim",
         "substitutes wrongly", "evaluates wrongly", "tries another node", "other"]


def _check_parts(line: str) -> tuple[str, str, str]:
    """'  Ava=T: not Ben=F = T ok' -> ('Ava=T', 'not Ben=F', 'T ok')."""
    speaker, _, rest = line.strip().partition(": ")
    claim, _, result = rest.rpartition(" = ")
    return speaker, claim, result


def classify(want: str, have: str, before: list[str]) -> str:
    """The kind of a first deviation: the reference line ``want``, the response's ``have``,
    ``before`` the lines both wrote before it."""
    wk, hk = line_kind(want), line_kind(have)
    if wk == "claim":
        return "restates a claim"
    if wk == "try" and hk == "check":
        if before and before[-1].endswith(" bad"):
            return 'checks after "bad"'
        node = next((line for line in reversed(before) if line.startswith("try ")), "try ")
        assigned = {word.split("=")[0] for word in node[4:].split()}
        mentioned = {word.split("=")[0] for word in _check_parts(have)[1].replace("(", " ").split() if "=" in word}
        return "checks too early" if mentioned - assigned else "checks again"
    if wk == "check" and hk in ("try", "found"):
        return "skips a check"
    if wk == "check" and hk == "check":
        (ws, wc, _), (hs, hc, _) = _check_parts(want), _check_parts(have)
        if ws != hs:
            return "checks another claim"
        return "substitutes wrongly" if wc != hc else "evaluates wrongly"
    if wk == "try" and hk == "try":
        return "tries another node"
    return "other"


def first_deviation(response: str, record: dict) -> str:
    """The kind of the response's first line that is not the reference trace's."""
    reference = explain.compact_explanation(record).split("\n")
    written = response.split("</think>")[0].strip("\n").split("\n")
    for k, want in enumerate(reference):
        have = written[k] if k < len(written) else ""
        if have != want:
            return classify(want, have, reference[:k])
    return "faithful" if len(written) == len(reference) else "other"


def kinds(path, puzzles: dict[int, dict]) -> dict[int, tuple[str, bool]]:
    """{puzzle index: (first deviation, answered right)} for one file of saved responses."""
    return {int(r["index"]): (first_deviation(r["response"], puzzles[int(r["index"])]), bool(r["correct"]))
            for r in load_jsonl(path)}


def response_tokens(path, tokenizer) -> dict[int, int]:
    """{puzzle index: the response's length in tokens, + 1 for the end-of-turn token}."""
    return {int(r["index"]): len(tokenizer(r["response"], add_special_tokens=False)["input_ids"]) + 1
            for r in load_jsonl(path)}


def table(found: dict[int, tuple[str, bool]], only=None, over: set | None = None) -> str:
    """One line per kind: responses (of which right; of which in ``over``, when given)."""
    ids = list(only if only is not None else found)

    def line(name: str, these: list[int]) -> str:
        text = f"  {name:<22} {len(these):4d}  ({sum(found[i][1] for i in these)} right"
        return text + (f", {sum(i in over for i in these)} over the budget)" if over is not None else ")")

    by_kind = {kind: [i for i in ids if found[i][0] == kind] for kind in KINDS}
    return "\n".join([line(kind, these) for kind, these in by_kind.items() if these] + [line("all", ids)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("responses", nargs="+", help="JSON Lines written by eval.py --save-responses")
    ap.add_argument("--data", default="data/heldout3.jsonl", help="the puzzles the responses answer")
    ap.add_argument("--start", help="the start's responses: also break down each policy's lost and gained puzzles")
    ap.add_argument("--tokens-over", type=int, metavar="N", help="also count the responses longer than N tokens")
    ap.add_argument("--tokenizer", default="models/smollm2-135m-instruct", help="the tokenizer of --tokens-over")
    a = ap.parse_args(argv)
    puzzles = {int(p["index"]): p for p in load_jsonl(a.data)}
    tokenizer = None
    if a.tokens_over is not None:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(a.tokenizer)

    def over(path) -> set | None:
        if tokenizer is None:
            return None
        return {i for i, n in response_tokens(path, tokenizer).items() if n > a.tokens_over}

    start = kinds(a.start, puzzles) if a.start else None
    if start:
        print(f"{a.start} (the start)\n{table(start, over=over(a.start))}")
    for path in a.responses:
        found, long = kinds(path, puzzles), over(path)
        print(f"{path}\n{table(found, over=long)}")
        if start:
            lost = [i for i in found if start[i][1] and not found[i][1]]
            gained = [i for i in found if found[i][1] and not start[i][1]]
            print(f" lost ({len(lost)} puzzles the start answered right): its first deviation there\n"
                  f"{table(found, lost, long)}")
            print(f" gained ({len(gained)}):\n{table(found, gained, long)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
