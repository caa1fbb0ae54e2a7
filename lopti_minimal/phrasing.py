"""Free phrasing of the compact derivation: the same steps, said in several ways.

Why this exists.  The paper's phenomenon needs tokens of every probability: in its Fig. 1a
(Qwen2.5-7B on K&K) 39% of the sampled response tokens have pi_old < 0.5.  A tiny model
trained to write the one canonical derivation of `explain.compact_explanation` is nearly
deterministic (96.5% of its sampled tokens have pi_old >= 0.9), so AR and Lopti would act
on almost nothing.  Real language is not like that: most words could have been other
words without changing the meaning.  We give the tiny model the same freedom.  Each
choice below is drawn uniformly and independently per occurrence, so a model that has
learned the targets puts about 1/3 or 1/4 of its probability on each option: those
tokens have pi_old < 0.5 at any temperature, and they are irrelevant to the reward (a
derivation scores 3 whatever words it uses, tests/test_phrasing.py).

Where the choices are (canonical form on the left, `explain.compact_explanation`):

    "  Amelia: not Evelyn (at Evelyn)"     the speaker's separator   ":" said stated claimed
                                           the marker word           at on in
    "try Amelia=T Penelope=T"              the node word             try let go
                                           between two people        " " ", " " and "
                                           the line's end            (none) . ;
    "  Amelia=T: not Evelyn=F = T ok"      the separator             (as above)
                                           the equals word           = is so
                                           the verdict, ok           ok feasible truth
                                           the verdict, bad          bad contradiction lie false
                                           the line's end            (as above)
    "found Amelia=T Penelope=T Evelyn=F"   between two people        (as above)

Nothing that carries the reasoning changes: the names, the values T/F, the claims, the
order of the search, and the answer block.  Every option is one token of the tiny model's
tokenizer (a test checks it), so a choice is one draw, and the verdict stays one token as
in the canonical form.  (A first version also had words of several tokens -- " sound" is
" s" + "ound" -- and an optional word before a check's speaker; after 20 minutes of
training its derivations fell apart into half-words and checks of the wrong claim, right
0.19 of the time on the official 3-person set against 0.50 for the canonical form.)
`canonical` maps any phrased derivation back to the canonical text, so the replay tests
and the error scripts read one form.
"""
from __future__ import annotations

import random
import re

SAID = (":", " said", " stated", " claimed")
AT_WORDS = ("at", "on", "in")
NODE_WORDS = ("try", "let", "go")
BETWEEN = (" ", ", ", " and ")
EQUALS = (" =", " is", " so")
OK_WORDS = (" ok", " feasible", " truth")
BAD_WORDS = (" bad", " contradiction", " lie", " false")
ENDINGS = ("", ".", ";")

_alt = lambda words: "|".join(re.escape(w) for w in words)  # noqa: E731
_PAIR = r"\w+=[TF]"
_PAIRS = rf"{_PAIR}(?:(?:{_alt(BETWEEN)}){_PAIR})*"
_CLAIM_LINE = re.compile(rf"  (\w+)(?:{_alt(SAID)}) (.*) \((?:{_alt(AT_WORDS)}) (\w+)\)")
_END = rf"(?:{_alt(ENDINGS[1:])})?"
_NODE_LINE = re.compile(rf"(?:{_alt(NODE_WORDS)}) ({_PAIRS}){_END}")
_CHECK_LINE = re.compile(rf"  (\w+=[TF])(?:{_alt(SAID)}) (.*)(?:{_alt(EQUALS)}) ([TF]) "
                         rf"({_alt([w.strip() for w in OK_WORDS + BAD_WORDS])}){_END}")
_END_LINE = re.compile(rf"(found|guess) ({_PAIRS})")
_PAIR_RE = re.compile(_PAIR)


def _pairs(text: str, rng: random.Random) -> str:
    """ "Amelia=T Penelope=F" with a random separator between each two people."""
    pairs = text.split(" ")
    out = pairs[0]
    for p in pairs[1:]:
        out += rng.choice(BETWEEN) + p
    return out


def vary_line(line: str, rng: random.Random) -> str:
    """One canonical line of the compact derivation, phrased with random choices."""
    if m := re.fullmatch(r"  (\w+=[TF]): (.*) = ([TF]) (ok|bad)", line):       # a check
        verdict = OK_WORDS if m[4] == "ok" else BAD_WORDS
        return (f"  {m[1]}{rng.choice(SAID)} {m[2]}{rng.choice(EQUALS)} {m[3]}"
                f"{rng.choice(verdict)}{rng.choice(ENDINGS)}")
    if m := re.fullmatch(r"  (\w+): (.*) \(at (\w+)\)", line):                # a claim
        return f"  {m[1]}{rng.choice(SAID)} {m[2]} ({rng.choice(AT_WORDS)} {m[3]})"
    if m := re.fullmatch(r"try (.*)", line):                                   # a node
        return f"{rng.choice(NODE_WORDS)} {_pairs(m[1], rng)}{rng.choice(ENDINGS)}"
    if m := re.fullmatch(r"(found|guess) (.*)", line):                         # the end
        return f"{m[1]} {_pairs(m[2], rng)}"
    raise ValueError(f"not a line of the compact derivation: {line!r}")


def vary(explanation: str, rng: random.Random) -> str:
    """A canonical compact derivation (explain.compact_explanation), phrased at random."""
    return "\n".join(vary_line(line, rng) for line in explanation.split("\n"))


def canonical_line(line: str) -> str:
    """The canonical form of one phrased line (a canonical line maps to itself); a line
    that is no phrasing of a derivation line is returned unchanged."""
    if m := _CHECK_LINE.fullmatch(line):
        verdict = "ok" if " " + m[4] in OK_WORDS else "bad"
        return f"  {m[1]}: {m[2]} = {m[3]} {verdict}"
    if m := _CLAIM_LINE.fullmatch(line):
        return f"  {m[1]}: {m[2]} (at {m[3]})"
    if m := _NODE_LINE.fullmatch(line):
        return "try " + " ".join(_PAIR_RE.findall(m[1]))
    if m := _END_LINE.fullmatch(line):
        return f"{m[1]} " + " ".join(_PAIR_RE.findall(m[2]))
    return line


def canonical(text: str) -> str:
    """Every line of a (phrased) derivation in its canonical form."""
    return "\n".join(canonical_line(line) for line in text.split("\n"))
