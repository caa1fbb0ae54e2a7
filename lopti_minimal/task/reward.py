"""The Logic-RL reward for K&K responses, with its parts for logging.

Source: `compute_score` in Logic-RL's `verl/utils/reward_score/kk.py`, which the paper's
reference implementation (Yang et al. 2025, AR/Lopti fork of verl) uses unchanged.
Re-written here in our own words.  The response is what the model wrote after a prompt
that ends in "<think>"; Logic-RL scored the text after the assistant header, which is
"<think>" (with the template's newline before it) + response, so we score
"<think>" + response.

    format   +1 if "<think>", "</think>", "<answer>", "</answer>" each occur exactly once in
             "<think>" + response and in that order; else -1.
    answer   taken from the last <answer>...</answer> (stripped).  If the format failed,
             there is no such block or it is empty: -2.  Otherwise parse it:
               * the number of occurrences of "knight" plus "knave" (substrings, any case)
                 must equal n, and
               * for every expected name, "<Name> is a knight|knave" (whole words, any case,
                 any whitespace) must occur — the first occurrence gives the role;
             unparseable: -2; all roles right: +2; parsed but wrong: -1.5.
    total    3 (correct), -0.5 (wrong), -1 (unparseable), -3 (bad format).

Can it be fooled?  We checked Logic-RL's parser against the attacks the project cares
about, and kept its exact behaviour as the default (`strict=False`):
  * both roles for one person, a repeated person, extra people: the role-word count must be
    n, and each of the n expected names needs its own "Name is a <role>" (a role word has
    one word before it), so every counted role word belongs to exactly one expected name's
    first assertion — there is no room for a second role, a repeat or an extra person;
  * a hidden second <answer> block: each tag must occur exactly once, so it fails format;
  * Unicode look-alikes: re.IGNORECASE folds "ı" (dotless i) onto "i", so
    "Amelia is a knıght" matches while "knıght" is not counted; but Logic-RL then stores
    the role string "knıght", which equals neither "knight" nor "knave", so the answer is
    wrong (-0.5), never 3.  We keep that: parsed_roles shows such a role as None.
`strict=True` selects an independent, more explicit parser (ASCII letters only; among all
"<word> is a knight|knave" assertions, exactly one per expected name and none for anyone
else).  On ASCII text both agree (property-tested); they differ only on Unicode
look-alikes (strict ignores them, e.g. a Kelvin-sign "Knight" is not a role word for it).
`score_response` never raises.
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
