"""Free phrasing of the compact derivation: the same steps, said in several ways.

The shipped warm start (checkpoints/tiny-warm) learned its derivations phrased this way,
with tail words (experiments/warmstart.py `--phrased --phrase-tails`). Why it exists, where the choices
are and what it cost, in full: docs/TASK_AND_MODELS.md. `choices` reads the choices back
from a sampled derivation, to measure what RL does to them.

Design choices:

1. Tokens of every probability: the paper's phenomenon needs them (its Fig. 1a, Qwen2.5-7B
   on K&K: 29% of sampled response tokens have pi_old < 0.5), while the canonical
   derivation leaves about 1% of the tiny model's sampled tokens below 0.5
   (scripts/token_bins.py).
2. Each choice is drawn uniformly and independently per occurrence, and each option is one
   token of the tiny model's tokenizer (a test checks it): a trained model puts about 1/3
   or 1/4 of its probability on each, and a derivation scores 3 whatever words it uses
   (tests/test_phrasing.py).
3. Only where nothing is copied next (a node line's start, in front of a check's result,
   the ends of lines, the answer lines' marks), never between a name and what follows it:
   a choice inside a copied span makes the look-up harder for a model this small.
4. Learned from the first step of the warm start (with tail words), phrased derivations are
   right about as often as canonical ones (0.48 against 0.50 when forced, 3 people) and
   leave about 22% of the sampled tokens below pi_old = 0.5 instead of about 1%
   (scripts/token_bins.py measures it; tests/test_warmstart.py checks the shipped one).
5. `canonical` maps any phrased derivation back to the canonical text, so the replay tests
   and the error scripts read one form.
6. The choices set a ceiling on the share of tokens below 0.5: about 17% of a phrased
   3-person derivation's tokens are choices, short of the 20% asked of the warm start;
   `tails=True` (`--phrase-tails`) adds a word at each line's end and reaches about 22%
   (scripts/phrasing_choices.py).
"""
from __future__ import annotations

import random
import re

NODE_WORDS = ("try", "let", "go")
EQUALS = (" =", " is", " so")
OK_WORDS = (" ok", " feasible", " truth")
BAD_WORDS = (" bad", " contradiction", " lie", " false")
ENDINGS = ("", ".", ";")
# With tails=True (`--phrase-tails`): a word at the end of every derivation line, in front
# of the ending -- a second choice next to the ending's, so nothing copied follows it.
# Never empty: an empty tail would leave its choice to the ending's token (one token, two
# choices). It raises the share of choice tokens in a 3-person derivation from about 16%
# to about 22% (scripts/phrasing_choices.py), above the 20% of sampled tokens below
# pi_old = 0.5 the warm start is asked for, which the other choices alone cannot reach.
TAILS = (" then", " so", " on")
ANSWER_MARKS = ("({i})", "{i}.", "-")

_alt = lambda words: "|".join(re.escape(w) for w in words)  # noqa: E731
_END = rf"(?:{_alt(TAILS)})?(?:{_alt(ENDINGS[1:])})?"
_CLAIM_LINE = re.compile(rf"(  \w+: .* \(at \w+\)){_END}")
_NODE_LINE = re.compile(rf"(?:{_alt(NODE_WORDS)}) (\w+=[TF](?: \w+=[TF])*){_END}")
_CHECK_LINE = re.compile(rf"  (\w+=[TF]): (.*)(?:{_alt(EQUALS)}) ([TF]) "
                         rf"({_alt([w.strip() for w in OK_WORDS + BAD_WORDS])}){_END}")


def vary_line(line: str, rng: random.Random, tails: bool = False) -> str:
    """One canonical line of the compact derivation, phrased with random choices (and a
    tail word in front of the ending with ``tails``)."""
    end = lambda: (rng.choice(TAILS) if tails else "") + rng.choice(ENDINGS)   # noqa: E731
    if m := re.fullmatch(r"  (\w+=[TF]): (.*) = ([TF]) (ok|bad)", line):       # a check
        verdict = OK_WORDS if m[4] == "ok" else BAD_WORDS
        return f"  {m[1]}: {m[2]}{rng.choice(EQUALS)} {m[3]}{rng.choice(verdict)}{end()}"
    if re.fullmatch(r"  \w+: .* \(at \w+\)", line):                             # a claim
        return line + end()
    if m := re.fullmatch(r"try (.*)", line):                                   # a node
        return f"{rng.choice(NODE_WORDS)} {m[1]}{end()}"
    if re.fullmatch(r"(found|guess) .*", line):                                # the end
        return line
    raise ValueError(f"not a line of the compact derivation: {line!r}")


def vary(explanation: str, rng: random.Random, tails: bool = False) -> str:
    """A canonical compact derivation (explain.compact_explanation), phrased at random."""
    return "\n".join(vary_line(line, rng, tails) for line in explanation.split("\n"))


def vary_answer(solution_text_format: str, rng: random.Random) -> str:
    """ "(1) Amelia is a knight\\n(2) ..." with a random mark in front of each line (the
    reward reads only "<name> is a knight|knave")."""
    lines = []
    for i, line in enumerate(solution_text_format.split("\n")):
        mark, rest = line.split(" ", 1)
        lines.append(rng.choice(ANSWER_MARKS).format(i=i + 1) + " " + rest)
    return "\n".join(lines)


def canonical_line(line: str) -> str:
    """The canonical form of one phrased line (a canonical line maps to itself); a line
    that is no phrasing of a derivation line is returned unchanged."""
    if m := _CHECK_LINE.fullmatch(line):
        verdict = "ok" if " " + m[4] in OK_WORDS else "bad"
        return f"  {m[1]}: {m[2]} = {m[3]} {verdict}"
    if m := _CLAIM_LINE.fullmatch(line):
        return m[1]
    if m := _NODE_LINE.fullmatch(line):
        return "try " + m[1]
    return line


# ------------------------------------------------- reading the choices back (RL's effect)

# The options of each kind of choice, as vary_line / vary_answer draw them.
CHOICE_KINDS = {"node word": NODE_WORDS, "equals word": EQUALS, "ok word": OK_WORDS,
                "bad word": BAD_WORDS, "tail word": TAILS, "ending": ENDINGS, "answer mark": ANSWER_MARKS}
_END_CHOICES = rf"({_alt(TAILS)})?({_alt(ENDINGS[1:])})?"
_NODE_CHOICE = re.compile(rf"({_alt(NODE_WORDS)}) \w+=[TF](?: \w+=[TF])*{_END_CHOICES}")
_CHECK_CHOICE = re.compile(rf"  \w+=[TF]: .*({_alt(EQUALS)}) [TF] "
                           rf"({_alt([w.strip() for w in OK_WORDS + BAD_WORDS])}){_END_CHOICES}")
_CLAIM_CHOICE = re.compile(rf"  \w+: .* \(at \w+\){_END_CHOICES}")
_MARKS = ((re.compile(r"\(\d+\) "), "({i})"), (re.compile(r"\d+\. "), "{i}."), (re.compile(r"- "), "-"))


def choices(response: str) -> dict[str, list[str]]:
    """The phrasing choices a (sampled) derivation made, by kind (CHOICE_KINDS): the option
    taken at every line that reads as a phrased derivation line, and the mark of every
    answer line. A line without a tail word counts as the tail "" (not an option the warm
    start was taught). Lines that match nothing are skipped."""
    out = {k: [] for k in CHOICE_KINDS}
    think, _, rest = response.partition("</think>")
    for line in think.split("\n"):
        for rx, kinds in ((_NODE_CHOICE, ("node word",)), (_CHECK_CHOICE, ("equals word", "verdict")),
                          (_CLAIM_CHOICE, ())):
            m = rx.fullmatch(line)
            if not m:
                continue
            for kind, value in zip(kinds, m.groups()):
                if kind == "verdict":
                    kind = "ok word" if " " + value in OK_WORDS else "bad word"
                    value = " " + value
                out[kind].append(value)
            out["tail word"].append(m.groups()[-2] or "")
            out["ending"].append(m.groups()[-1] or "")
            break
    answer = rest.partition("<answer>")[2].partition("</answer>")[0]
    for line in answer.split("\n"):
        line = line.strip() + " "
        out["answer mark"] += [mark for rx, mark in _MARKS if rx.match(line)][:1]
    return out


def choice_spans(response: str) -> list[tuple[int, int]]:
    """The character spans [start, end) of the phrasing choices a response made (`choices`'
    options where they stand: node, equals, verdict and tail words, endings, answer marks),
    so that a token of the response can be told to be a choice or not (scripts/headroom.py:
    what the tokens below pi_old 0.5 are). Empty options take no span."""
    spans, pos = [], 0
    think_end = response.find("</think>")
    for line in response.split("\n"):
        if think_end < 0 or pos < think_end:
            for rx in (_NODE_CHOICE, _CHECK_CHOICE, _CLAIM_CHOICE):
                m = rx.fullmatch(line)
                if m:
                    spans += [(pos + m.start(g), pos + m.end(g)) for g in range(1, len(m.groups()) + 1)
                              if m.start(g) < m.end(g)]
                    break
        pos += len(line) + 1
    a = response.find("<answer>")
    if a >= 0:
        pos = a + len("<answer>")
        for line in response[pos:].partition("</answer>")[0].split("\n"):
            lead = len(line) - len(line.lstrip())
            for rx, _ in _MARKS:
                if m := rx.match(line[lead:] + " "):
                    spans.append((pos + lead, pos + lead + len(m.group(0).rstrip())))
                    break
            pos += len(line) + 1
    return sorted(spans)


def canonical(text: str) -> str:
    """Every line of a (phrased) derivation in its canonical form."""
    return "\n".join(canonical_line(line) for line in text.split("\n"))
