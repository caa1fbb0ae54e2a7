"""The Logic-RL reward for K&K responses, with its parts for logging.

The rule and the attacks checked, in full: docs/TASK_AND_MODELS.md.

Design choices:

1. Source: `compute_score` in Logic-RL's `verl/utils/reward_score/kk.py`, which the paper's
   reference implementation (Yang et al. 2025, AR/Lopti fork of verl) uses unchanged;
   re-written here in our own words.
2. We score "<think>" + response: the prompt ends in "<think>", and Logic-RL scored the
   text after the assistant header, which is "<think>" (with the template's newline
   before it) + response.
3. Parts: format +1 / -1 (the four tags each exactly once, in order); answer from the
   last <answer>...</answer>: +2 all roles right, -1.5 parsed but wrong, -2 unparseable
   or missing. Total 3 (correct), -0.5 (wrong), -1 (unparseable), -3 (bad format).
4. Logic-RL's exact parser is the default (`strict=False`): checked against both roles for
   one person, repeated or extra people, a hidden second <answer> block and Unicode
   look-alikes, it never scores such a response 3 (parsed_roles shows a look-alike role
   as None).
5. `strict=True` is an independent, more explicit parser (ASCII letters only; exactly one
   assertion per expected name, none for anyone else); on ASCII text both agree
   (property-tested).
6. `score_response` never raises.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
FORMAT_OK, FORMAT_BAD = 1.0, -1.0
ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSEABLE = 2.0, -1.5, -2.0
# The two totals the rest of the code reads a reward by (the RL metrics, the evaluation):
RIGHT = FORMAT_OK + ANSWER_RIGHT                # 3: the only total of a correct response
BAD_FORMAT = FORMAT_BAD + ANSWER_UNPARSEABLE    # -3: the only total of a malformed one

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Strict: ASCII-only, case-insensitive via character classes (no Unicode case folding).
_ROLE_WORD_ASCII = re.compile(r"[Kk][Nn](?:[Ii][Gg][Hh][Tt]|[Aa][Vv][Ee])")
_ASSERTION_ASCII = re.compile(
    r"\b([A-Za-z]+)\s+[Ii][Ss]\s+[Aa]\s+([Kk][Nn](?:[Ii][Gg][Hh][Tt]|[Aa][Vv][Ee]))\b",
    re.ASCII)
_GT_LINE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)


@dataclass
class RewardResult:
    """total = format part + answer part; parsed_roles maps name -> True (knight) /
    False (knave) (None for an odd role spelling), or is None when the answer could not be
    parsed; expected is the ground truth in the same form."""
    total: float
    format_ok: bool
    answer_text: str | None
    parsed_roles: dict | None
    correct: bool
    format_score: float = 0.0
    answer_score: float = 0.0
    expected: dict = field(default_factory=dict)


def parse_ground_truth(solution_text_format: str) -> dict:
    """ "(1) Amelia is a knight\\n(2) ..." -> {"Amelia": "knight", ...}: per non-empty line,
    the first ASCII word and the first later knight/knave (as Logic-RL)."""
    truth = {}
    for line in solution_text_format.split("\n"):
        m = _GT_LINE.search(line.strip())
        if m:
            truth[m.group(1)] = m.group(2).lower()
    return truth


def _as_bools(roles: dict | None) -> dict | None:
    """{"Amelia": "knight"} -> {"Amelia": True}; an odd role spelling -> None."""
    if roles is None:
        return None
    return {k: {"knight": True, "knave": False}.get(v) for k, v in roles.items()}


def check_format(text: str) -> bool:
    """Each of the four tags exactly once, in the order think, /think, answer, /answer."""
    if any(text.count(t) != 1 for t in TAGS):
        return False
    pos = [text.find(t) for t in TAGS]
    return pos == sorted(pos)


def extract_answer(text: str) -> str | None:
    """Stripped content of the last <answer>...</answer> block, or None."""
    last = None
    for m in _ANSWER_BLOCK.finditer(text):
        last = m
    return None if last is None else last.group(1).strip()


def parse_answer_faithful(answer: str, names: list[str]) -> dict | None:
    """Logic-RL's parser: role-word count == n, then the first "<Name> is a knight|knave"
    per name (Unicode case-insensitive regex).  Values are the lower-cased role strings
    ("knight", "knave", or a Unicode look-alike such as "knıght")."""
    low = answer.lower()
    if low.count("knight") + low.count("knave") != len(names):
        return None
    roles = {}
    for name in names:
        m = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer,
                      re.IGNORECASE)
        if m is None:
            return None
        roles[name] = m.group(1).lower()
    return roles


def parse_answer_strict(answer: str, names: list[str]) -> dict | None:
    """ASCII role words only; every role word must sit in a "<word> is a <role>" assertion
    (count check as Logic-RL), and the assertions must name each expected person exactly
    once (case-insensitive) and nobody else."""
    n_roles = len(_ROLE_WORD_ASCII.findall(answer))
    if n_roles != len(names):
        return None
    assertions = _ASSERTION_ASCII.findall(answer)
    if len(assertions) != len(names):
        return None
    wanted = {name.lower(): name for name in names}
    roles: dict = {}
    for who, role in assertions:
        name = wanted.get(who.lower())
        if name is None or name in roles:  # someone else, or a person twice
            return None
        roles[name] = role.lower()
    return roles


def score_response(response: str, truth, strict: bool = False) -> RewardResult:
    """Score a response (the text after a prompt ending in "<think>").

    `truth` is a record (dict with "solution_text_format") or the solution_text_format
    string itself.  Never raises: anything unexpected scores as bad format."""
    try:
        return _score(response, truth, strict)
    except Exception:  # pragma: no cover - defensive: a reward must not crash training
        return RewardResult(FORMAT_BAD + ANSWER_UNPARSEABLE, False, None, None, False,
                            FORMAT_BAD, ANSWER_UNPARSEABLE)


def _score(response, truth, strict) -> RewardResult:
    if not isinstance(response, str):
        response = "" if response is None else str(response)
    gt_text = truth["solution_text_format"] if isinstance(truth, dict) else str(truth)
    expected = parse_ground_truth(gt_text)
    text = "<think>" + response
    answer = extract_answer(text)
    format_ok = check_format(text)
    fmt = FORMAT_OK if format_ok else FORMAT_BAD
    roles = None
    if format_ok and answer:
        parse = parse_answer_strict if strict else parse_answer_faithful
        roles = parse(answer, list(expected)) or None  # Logic-RL: an empty dict fails too
    if roles is None:
        ans = ANSWER_UNPARSEABLE
    else:
        ans = ANSWER_RIGHT if roles == expected else ANSWER_WRONG
    correct = roles is not None and roles == expected
    return RewardResult(fmt + ans, format_ok, answer, _as_bools(roles), correct, fmt, ans,
                        _as_bools(expected))
