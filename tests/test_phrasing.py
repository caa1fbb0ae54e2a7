"""Free phrasing (lopti_minimal/task/phrasing.py) and the two behaviours (behaviours.py).

Claims: every phrasing of a derivation is the same derivation (it replays step by step,
through `phrasing.canonical`) and scores 3; phrasing varies every kind of line; each
option (tail words too) starts with its own token, so a verdict is one token; a guess is a well-formed,
random answer; the behaviour of a response is read from what precedes "</think>"."""
import collections
import os
import random
import re

import pytest
from conftest import ROOT, load_script
from test_explain import replay_compact

from lopti_minimal.task import behaviours, dataset, explain, kk, phrasing
from lopti_minimal.task.behaviours import DERIVE, GUESS, TwoBehaviourTargets, behaviour_of
from lopti_minimal.task.reward import score_response

SHIPPED = os.path.join(ROOT, "checkpoints", "tiny-warm")

GENERATED = {n: dataset.generate_records(n, 40, seed=5, exclude=kk.official_keys()) for n in range(3, 8)}


@pytest.mark.parametrize("tails", [False, True])
@pytest.mark.parametrize("n", range(3, 8))
def test_every_phrased_derivation_replays_and_scores_3(n, tails):
    rng = random.Random(n)
    for r in GENERATED[n]:
        for _ in range(3):
            response = behaviours.derive_response(r, rng, tails)
            assert score_response(response, r).total == 3.0, response
            text = response.split("\n</think>")[0][1:]
            assert phrasing.canonical(text) == explain.compact_explanation(r)
            replay_compact(phrasing.canonical(text), kk.record_statements(r), r["names"])


def test_unsolvable_searches_are_phrased_too():
    for r in dataset.generate_unsolvable_records(3, 10, seed=1):
        text = phrasing.vary(explain.compact_explanation(r), random.Random(0))
        assert phrasing.canonical(text) == explain.compact_explanation(r)


def test_canonical_text_is_its_own_canonical_form():
    for r in GENERATED[4]:
        text = explain.compact_explanation(r)
        assert phrasing.canonical(text) == text


def test_every_option_is_used_and_choices_are_near_uniform():
    """Over many lines each option of each choice appears and none dominates (uniform
    draws: a model that learns them gives each about 1/k, below 0.5)."""
    rng = random.Random(0)
    lines = [line for r in GENERATED[3] for line in
             phrasing.vary(explain.compact_explanation(r), rng).split("\n")]
    starts = collections.Counter(line.split(" ")[0] for line in lines if not line.startswith(" "))
    for word in phrasing.NODE_WORDS:
        assert starts[word] > 0.2 * sum(starts[w] for w in phrasing.NODE_WORDS), starts
    checks = [line for line in lines if line.startswith("  ") and "(at " not in line]
    for group in (phrasing.EQUALS, phrasing.OK_WORDS + phrasing.BAD_WORDS, phrasing.ENDINGS[1:]):
        used = collections.Counter(w for line in checks for w in group
                                   if re.search(re.escape(w) + r"(?![a-z])", line))
        assert all(used[w] > 0 for w in group), (group, used)
    ends = collections.Counter(line[-1] for line in lines if not line.startswith("found"))
    assert ends["."] > 0.2 * len(lines) and ends[";"] > 0.2 * len(lines), ends
    tailed = [line.rstrip(".;") for r in GENERATED[3] for line in
              phrasing.vary(explain.compact_explanation(r), rng, tails=True).split("\n")
              if not line.startswith("found")]
    tails = collections.Counter(next((t for t in phrasing.TAILS if line.endswith(t)), "")
                                for line in tailed)
    assert all(tails[t] > 0.25 * len(tailed) for t in phrasing.TAILS) and not tails[""], tails
    marks = collections.Counter(phrasing.vary_answer(GENERATED[3][0]["solution_text_format"], rng)[0]
                                for _ in range(300))
    assert set(marks) == {"(", "1", "-"} and min(marks.values()) > 60, marks


def test_each_option_is_one_token_and_the_options_of_a_choice_differ():
    """A choice in the derivation is one token (then it has low probability for a model
    that has learned the targets, and the verdict stays one token as in the canonical
    form); its options are different tokens, also from what follows when the option is
    empty.  The answer marks differ in their first token."""
    from lopti_minimal.models import load_model_and_tokenizer
    _, tok = load_model_and_tokenizer(SHIPPED, device="cpu")

    def new_tokens(prefix, text):
        base = tok(prefix, add_special_tokens=False)["input_ids"]
        ids = tok(prefix + text, add_special_tokens=False)["input_ids"]
        assert ids[:len(base)] == base, (prefix, text)
        return ids[len(base):]

    answer = "</think>\n<answer>"
    for prefix, group, after in (("\n", phrasing.NODE_WORDS, " Amelia"),
                                 ("  Amelia=T: not Evelyn=F", phrasing.EQUALS, " T"),
                                 ("  Amelia=T: not Evelyn=F = T", phrasing.OK_WORDS + phrasing.BAD_WORDS, "\n"),
                                 ("  Amelia=T: not Evelyn=F = T ok", phrasing.ENDINGS, "\n"),
                                 ("  Amelia: not Evelyn (at Evelyn)", phrasing.ENDINGS, "\n")):
        firsts = []
        for w in group:
            ids = new_tokens(prefix, w + after)
            if w:                                   # the option itself is exactly one token
                assert ids[1:] == new_tokens(prefix + w, after), (prefix, w)
            firsts.append(ids[0])
        assert len(set(firsts)) == len(firsts), (prefix, group)
    # The tail words (--phrase-tails), in front of each ending, at the end of each kind of line.
    for prefix in ("  Amelia=T: not Evelyn=F = T ok", "  Amelia: not Evelyn (at Evelyn)", "\nlet Amelia=T"):
        for after in phrasing.ENDINGS[1:] + ("\n",):
            firsts = []
            for w in phrasing.TAILS:
                ids = new_tokens(prefix, w + after)
                assert ids[1:] == new_tokens(prefix + w, after), (prefix, w, after)
                firsts.append(ids[0])
            assert len(set(firsts)) == len(firsts), (prefix, after)
    # The answer marks ("(1)", "1.", "-") differ in their first token.
    for prefix, space, i in ((answer, " ", 1), (answer + " (1) Amelia is a knight\n", "", 2)):
        firsts = {new_tokens(prefix, space + m.format(i=i) + " Amelia")[0] for m in phrasing.ANSWER_MARKS}
        assert len(firsts) == len(phrasing.ANSWER_MARKS), prefix


def test_guesses_are_well_formed_random_answers():
    rng = random.Random(0)
    r = GENERATED[3][0]
    results = [score_response(behaviours.guess_response(r, rng), r) for _ in range(400)]
    assert all(x.format_ok and x.parsed_roles is not None for x in results)
    right = sum(x.correct for x in results) / len(results)
    assert 0.07 < right < 0.19, right                     # chance: 1/8
    assert all(x.total in (3.0, -0.5) for x in results)


def test_behaviour_of_a_response():
    r = GENERATED[3][1]
    assert behaviour_of(behaviours.guess_response(r, random.Random(1))) == GUESS
    assert behaviour_of(behaviours.derive_response(r)) == DERIVE
    assert behaviour_of(" \n</think>\n<answer> x </answer>") == GUESS
    assert behaviour_of("\ntry Amelia=T") == DERIVE                   # cut before </think>
    assert behaviour_of("<think> I think... </think><answer>") == DERIVE
    assert behaviours.derive_share([]) == 0.0
    assert behaviours.derive_share(["\n</think>", "x</think>", "y", "\n</think>"]) == 0.5


def test_two_behaviour_targets_mix_the_asked_share_deterministically():
    targets = TwoBehaviourTargets(0.7, phrased=True, seed=3)
    recs = dataset.generate_records(3, 300, seed=9)
    texts = [targets(r) for r in recs]
    assert texts == [TwoBehaviourTargets(0.7, phrased=True, seed=3)(r) for r in recs]
    share = sum(behaviour_of(t) == GUESS for t in texts) / len(texts)
    assert 0.63 < share < 0.77, share
    assert all(score_response(t, r).total == 3.0 for t, r in zip(texts, recs) if behaviour_of(t) == DERIVE)
    tailed = TwoBehaviourTargets(0.7, phrased=True, seed=3, tails=True)
    assert [tailed(r) for r in recs[:50]] == [tailed(r) for r in recs[:50]]
    assert any(" then" in tailed(r) for r in recs[:50])
    assert all(score_response(tailed(r), r).total == 3.0 for r in recs if behaviour_of(tailed(r)) == DERIVE)
    plain = TwoBehaviourTargets(0.0, phrased=False)
    assert plain(recs[0]) == behaviours.derive_response(recs[0])
    with pytest.raises(ValueError):
        TwoBehaviourTargets(1.0)


def test_tail_words_lift_the_share_of_choice_tokens_above_a_fifth():
    """scripts/phrasing_choices.py: the choices without tail words are under 20% of a
    3-person derivation's tokens, with tail words over 20% -- the
    ceiling each sets on the share of sampled tokens below pi_old = 0.5."""
    from transformers import AutoTokenizer
    pc = load_script("scripts/phrasing_choices.py")
    tok = AutoTokenizer.from_pretrained(SHIPPED)
    plain, tailed = (pc.choice_share(pc.measure(GENERATED[3], tok, tails)) for tails in (False, True))
    assert 0.14 < plain["share"] < 0.19 < 0.20 < tailed["share"] < 0.25, (plain, tailed)
    assert tailed["choices"] > plain["choices"] + 10


class RecordingRandom(random.Random):
    """random.Random that records each choice(): (the options it chose from, the option)."""

    def __init__(self, seed):
        super().__init__(seed)
        self.taken = []

    def choice(self, seq):
        value = super().choice(seq)
        self.taken.append((tuple(seq), value))
        return value


@pytest.mark.parametrize("n", [3, 4, 5])
def test_choices_reads_back_every_draw(n):
    """phrasing.choices recovers, kind by kind and in order, exactly the options the
    phrasing drew (with tail words), from the whole response the warm start trains on."""
    kind_of = {tuple(opts): kind for kind, opts in phrasing.CHOICE_KINDS.items()}
    for i, r in enumerate(dataset.generate_records(n, 20, seed=40 + n)):
        rng = RecordingRandom(i)
        text = behaviours.derive_response(r, rng, tails=True)
        drawn = {k: [] for k in phrasing.CHOICE_KINDS}
        for seq, value in rng.taken:
            drawn[kind_of[seq]].append(value)
        assert phrasing.choices(text) == drawn
    # A guess has no derivation lines, only answer marks; a line out of the phrasing is skipped.
    assert phrasing.choices("\n</think>\n<answer> (1) A is a knight\n2. B is a knave </answer>")["answer mark"] \
        == ["({i})", "{i}."]
    assert phrasing.choices("hello world\n</think>") == {k: [] for k in phrasing.CHOICE_KINDS}


def test_phrasing_diversity_entropy():
    pd = load_script("scripts/phrasing_diversity.py")
    assert pd.normalised_entropy(["a", "b", "c"] * 5, 3) == pytest.approx(1.0)
    assert pd.normalised_entropy(["a"] * 9, 3) == 0.0
    assert pd.normalised_entropy([], 3) is None
    assert pd.normalised_entropy(["a", "b"] * 4, 4) == pytest.approx(0.5)       # 2 of 4 options
    rng = random.Random(0)
    recs = dataset.generate_records(3, 30, seed=9)
    d = pd.diversity([behaviours.derive_response(r, rng, tails=True) for r in recs] + ["\n</think>\n<answer> x </answer>"])
    assert d["derivations"] == 30 and 0.9 < d["mean"] <= 1.0        # uniform draws, as taught
    same = [behaviours.derive_response(r, random.Random(1), tails=True) for r in recs[:1]] * 5
    assert pd.diversity(same)["mean"] < d["mean"]


def test_phrasing_correlation_within_methods_removes_the_arms_difference():
    pd = load_script("scripts/phrasing_diversity.py")
    # Method A: high entropy and accuracy; method B: low both. Within each, the relation is
    # reversed: across runs r > 0 (the arms), within methods r = -1 (the seeds).
    a = [(0.99, 0.50), (0.98, 0.52), (0.97, 0.54)]
    b = [(0.90, 0.30), (0.89, 0.32), (0.88, 0.34)]
    c = pd.correlations([a, b, [(0.95, 0.4)]])          # a one-run method adds no within pair
    assert c["n_runs"] == 7 and c["n_within"] == 6
    assert c["corr_entropy_heldout"] > 0.9
    assert c["corr_within_methods"] == pytest.approx(-1.0)
    assert pd.correlations([a[:1]])["corr_entropy_heldout"] is None


def test_choice_spans_are_where_the_choices_stand():
    """phrasing.choice_spans: in the thinking, the text under the spans is, in order, every
    non-empty option `choices` reads back (a verdict without its space); in the answer, one
    mark per line, as vary_answer writes it."""
    import random
    import re
    from lopti_minimal.task import behaviours, dataset, phrasing
    for seed, rec in enumerate(dataset.generate_records(4, 5, seed=21)):
        for text in (behaviours.derive_response(rec, random.Random(seed), tails=True),
                     behaviours.guess_response(rec, random.Random(seed))):
            spans = phrasing.choice_spans(text)
            a0 = text.find("<answer>")
            under = [text[a:b].strip() for a, b in spans if a < a0]
            read = [v.strip() for k, vs in phrasing.choices(text).items() if k != "answer mark" for v in vs if v]
            assert sorted(under) == sorted(read) and (len(under) > 10) == (behaviours.behaviour_of(text) == behaviours.DERIVE)
            marks = [text[a:b] for a, b in spans if a > a0]
            assert len(marks) == len(rec["names"]) and all(re.fullmatch(r"\(\d\)|\d\.|-", m) for m in marks)
