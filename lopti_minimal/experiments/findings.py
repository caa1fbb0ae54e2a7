"""The report's opening: the study's answer by the declared test (docs/STUDY.md), computed.

declared.py holds the test (families, measures, margins) and computes it on the runs
(aggregate.py stores it per preset); this module writes it for a reader: a sentence per
comparison of the primary family worded by its verdict, the legend, the primary table
(per-seed differences, paired t interval, exact sign-flip p and Holm's adjustment, the
equivalence p, the verdict) in the report, both families in the full tables.
"""
from __future__ import annotations

from .declared import MEASURE_WORDS
from .grid import short


MEASURE_DIGITS = {"steps_to_80": 1, "derive_auc": 3, "heldout": 3}


def _p(x: float) -> str:
    return f"{x:.4g}"          # exact p values of a sign-flip test: k / 2^n


def declared_rows(rows: list[dict]) -> list[str]:
    """The declared test's table: a row per comparison and measure."""
    lines = ["| A minus B | measure | seeds | mean [95% CI] | per seed | p (Holm) | equivalence p (Holm) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dg = MEASURE_DIGITS[r["measure"]]
        ci = f" [{r['lo']:+.{dg}f}, {r['hi']:+.{dg}f}]" if r["lo"] is not None else ""
        lines.append(f"| {short(r['a'])} minus {short(r['b'])} | {MEASURE_WORDS[r['measure']]} | {r['n']} | "
                     f"{r['mean']:+.{dg}f}{ci} | {', '.join(f'{x:+.{dg if dg > 1 else 0}f}' for x in r['diffs'])} | "
                     f"{_p(r['p'])} ({_p(r['p_holm'])}) | {_p(r['tost'])} ({_p(r['tost_holm'])}) | {r['verdict']} |")
    return lines


def _pairing_line(rows: list[dict], equal: list) -> str:
    """How the seeds pair: by machine and commit; the commits shown equal; the seeds a
    comparison leaves apart for their commits."""
    same = "; ".join(f"{a[:7]} = {b[:7]}" for a, b in equal) or "none yet"
    apart = {}
    for r in rows:
        if r.get("apart"):
            apart.setdefault(f"{short(r['a'])} minus {short(r['b'])}", r["apart"])
    text = ("Pairs: a seed's arms on one kind of CPU, torch, thread count and commit (commits that "
            f"scripts/commit_check.py shows equal count as one: {same}).")
    if apart:
        text += " Apart for their commits until checked: " + "; ".join(
            f"{k}, seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}" for k, v in apart.items()) + "."
    return text


def declared_section(dec: dict, tables_link: str | None) -> list[str]:
    """The study's answer first: the declared test (docs/STUDY.md) on the primary family,
    a computed sentence per comparison, the legend; the secondary family in the tables."""
    prim = dec["families"].get("primary") or []
    if not prim:
        return []
    n = min(r["n"] for r in prim)
    m = dec["margins"]
    L = [f"## Findings: what carries Lopti's head start (the declared test, n = {n}"
         + (f" of the declared {dec['declared_n']} seeds: interim)" if n < dec["declared_n"] else " seeds)"), "",
         "Declared in [STUDY.md](STUDY.md) before seeds 5-9 ran. **Different**: Holm-adjusted exact "
         "sign-flip p < 0.05; **equivalent**: two one-sided sign-flip tests (Holm) place the mean "
         f"difference within ±{m['steps_to_80']:g} steps, ±{m['derive_auc']:g} of derivation-share area or "
         f"±{m['heldout']:g} of held-out accuracy; **undetermined**: neither. "
         f"With {n} seeds the smallest possible p is {2 / 2 ** n:.3g}. Elsewhere, \"not seen\": a 95% "
         "interval that includes 0.", ""]
    by_pair: dict = {}
    for r in prim:
        by_pair.setdefault((r["a"], r["b"]), []).append(r)
    for (a, b), rs in by_pair.items():
        L.append(f"- **{short(a)} minus {short(b)}**: " + "; ".join(
            f"{MEASURE_WORDS[r['measure']]} {r['mean']:+.{MEASURE_DIGITS[r['measure']]}f}, {r['verdict']}"
            for r in rs) + ".")
    L += ["", "The primary family (Lopti alone, eta 0.4):", ""] + declared_rows(prim) + [""]
    L += [_pairing_line(prim, dec.get("equal_commits") or []), ""]
    sec = dec["families"].get("secondary") or []
    if sec:
        counts = {v: sum(r["verdict"] == v for r in sec) for v in ("different", "equivalent", "undetermined")}
        L += [f"The secondary family (the same four for AR+Lopti): {counts['different']} different, "
              f"{counts['equivalent']} equivalent, {counts['undetermined']} undetermined of {len(sec)}"
              + (f" ([full tables]({tables_link}))." if tables_link else "."), ""]
    return L
