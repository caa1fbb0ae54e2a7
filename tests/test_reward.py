"""The Logic-RL reward (lopti_minimal/task/reward.py): totals, parts, robustness, fooling."""
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lopti_minimal.task import kk
from lopti_minimal.task.reward import RewardResult, score_response

OFFICIAL = kk.load_official()
R = OFFICIAL[0]  # Amelia knight, Penelope knight, Evelyn knave
GOLD = R["solution_text_format"]
TOTALS = {3.0, -0.5, -1.0, -3.0}


def wrap(answer, think="reasoning"):
    return f" {think} </think>\n<answer> {answer} </answer>"


def both(resp, truth=R):
    """(default = faithful Logic-RL, strict) totals."""
    a, b = score_response(resp, truth), score_response(resp, truth, strict=True)
    return a.total, b.total


def test_gold_answer_scores_3_for_all_official():
    for r in OFFICIAL:
        for truth in (r, r["solution_text_format"]):
            res = score_response(wrap(r["solution_text_format"]), truth)
            assert isinstance(res, RewardResult)
            assert res.total == 3 and res.format_ok and res.correct
            assert res.parsed_roles == dict(zip(r["names"], r["solution"]))
            assert res.answer_text == r["solution_text_format"]


def test_the_four_totals():
    assert both(wrap(GOLD)) == (3, 3)
    wrong = GOLD.replace("Evelyn is a knave", "Evelyn is a knight")
    assert both(wrap(wrong)) == (-0.5, -0.5)
    res = score_response(wrap(wrong), R)
    assert res.format_ok and not res.correct and res.parsed_roles["Evelyn"] is True
    assert both(wrap("Amelia is a knight")) == (-1, -1)  # too few roles
    assert both(wrap("")) == (-1, -1)  # empty answer
    assert both(GOLD) == (-3, -3)  # no tags at all
    assert both("<think>" + wrap(GOLD)) == (-3, -3)  # a second <think>
    assert both(f"<answer>{GOLD}</answer></think>") == (-3, -3)  # wrong order
    assert both("") == (-3, -3)
    assert both(wrap(GOLD) + " trailing text") == (3, 3)  # Logic-RL ignores text after


def test_format_variants_and_case():
    assert both(wrap(GOLD.upper())) == (3, 3)  # names and roles case-insensitive
    assert both(wrap("Evelyn is a knave, Amelia is a knight, Penelope is a knight")) == (3, 3)
    assert both(wrap("Amelia   is\na knight; Penelope is a knight; Evelyn is a knave")) == (3, 3)
    assert both(wrap(GOLD + " (the knights tell the truth)")) == (-1, -1)  # count 4


def test_cannot_be_fooled():
    cases = {
        "both roles": "Amelia is a knight, Amelia is a knave, Penelope is a knight, "
                      "Evelyn is a knave",
        "both roles, count-preserving": "Amelia is a knight or a knave, Penelope is a knight",
        "repeated person": "Amelia is a knight, Amelia is a knight, Penelope is a knight",
        "extra person": GOLD + "\n(4) Zoey is a knight",
        "missing person": "Amelia is a knight, Penelope is a knight, Zoey is a knave",
        "role as part of a word": "Amelia is a knightly, Penelope is a knight, Evelyn is a knave",
    }
    for name, ans in cases.items():
        assert max(both(wrap(ans))) < 3, name
    hidden = wrap("Amelia is a knave") + "<answer> " + GOLD + " </answer>"
    assert both(hidden) == (-3, -3)  # a second <answer> block breaks the format
    hidden2 = " x </think>\n<answer> " + GOLD + " <answer> junk </answer>"
    assert max(both(hidden2)) < 3


def test_unicode_look_alikes_never_score_3():
    # re.IGNORECASE folds 'ı' (dotless i) onto 'i', but str.lower().count does not see
    # "knıght": Logic-RL matches it yet stores the odd role string, so it is wrong, not 3.
    ans = "Amelia is a kn\u0131ght, Amelia is a knave, Penelope is a knight, Evelyn is a knave"
    faithful = score_response(wrap(ans), R)
    assert faithful.total == -0.5 and faithful.parsed_roles["Amelia"] is None
    strict = score_response(wrap(ans), R, strict=True)  # ignores the look-alike word
    assert strict.total == -0.5 and strict.parsed_roles["Amelia"] is False
    kelvin = GOLD.replace("Amelia is a knight", "Amelia is a \u212anight")
    assert score_response(wrap(kelvin), R).total == 3  # Kelvin sign lower()s to 'k'
    assert score_response(wrap(kelvin), R, strict=True).total == -1  # ASCII only


def test_never_raises_on_odd_inputs():
    odd = ["", "<think>" * 1000, "</answer>" * 3, "\x00\udcff", "<answer>" + "a" * 10 ** 6,
           None, 12, wrap(GOLD) * 2, "\n".join(["</think><answer>"] * 50)]
    for x in odd:
        assert score_response(x, R).total in TOTALS
    assert score_response(wrap(GOLD), {"solution_text_format": ""}).total in TOTALS
    assert score_response(wrap(GOLD), None).total in TOTALS


def test_megabyte_response_is_fast():
    big = wrap(GOLD, think="Amelia is a knight " * 60_000)
    t = time.perf_counter()
    assert score_response(big, R).total == 3
    assert score_response("x " * 500_000 + wrap(GOLD), R, strict=True).total == 3
    assert time.perf_counter() - t < 5


PIECES = ["<think>", "</think>", "<answer>", "</answer>", "Amelia", "Penelope", "Evelyn",
          "Zoey", " is a ", "knight", "knave", " ", "\n", ",", "(1)", "not", "is", "a",
          "KNIGHT", "ı", "K"]
_fast = settings(max_examples=300, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@_fast
@given(st.text(max_size=300))
def test_property_any_text_scores_a_valid_total(text):
    for strict in (False, True):
        res = score_response(text, R, strict=strict)
        assert res.total in TOTALS
        assert res.total == res.format_score + res.answer_score
        assert (res.total == 3) == res.correct


@_fast
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_property_tag_soup(pieces):
    text = "".join(pieces)
    res = score_response(text, R)
    assert res.total in TOTALS
    full = "<think>" + text
    if not all(full.count(t) == 1 for t in ("<think>", "</think>", "<answer>", "</answer>")):
        assert res.total == -3 and not res.format_ok


ASCII_PIECES = [p for p in PIECES if p.isascii() and "<" not in p] + ["Amelia is a knight",
                "Penelope is a knight", "Evelyn is a knave", "Evelyn is a knight"]


@_fast
@given(st.lists(st.sampled_from(ASCII_PIECES), max_size=25))
def test_property_strict_equals_faithful_on_ascii(pieces):
    resp = wrap("".join(pieces))
    a, b = score_response(resp, R), score_response(resp, R, strict=True)
    assert (a.total, a.parsed_roles) == (b.total, b.parsed_roles)


@_fast
@given(st.permutations(GOLD.split("\n")), st.sampled_from([" ", "\n", ", ", "; "]))
def test_property_any_order_of_the_gold_lines_scores_3(lines, sep):
    assert both(wrap(sep.join(lines))) == (3, 3)


@_fast
@given(st.lists(st.tuples(st.sampled_from(["Amelia", "Penelope", "Evelyn", "Zoey"]),
                          st.booleans()), max_size=6))
def test_property_score_3_iff_exactly_the_right_roles(claims):
    ans = "\n".join(f"{nm} is a {'knight' if k else 'knave'}" for nm, k in claims)
    res = score_response(wrap(ans), R)
    assert res.total == score_response(wrap(ans), R, strict=True).total
    right = sorted(claims) == sorted(zip(R["names"], R["solution"]))
    assert (res.total == 3) == right
