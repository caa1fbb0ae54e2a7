"""The study's report: the aggregate (aggregate.py) -> the markdown report docs/RESULTS.md
with its figures, and every table in full beside it (write_report).

Design choices (study.py, design choices 5 and 6):

1. It states what is computed, and only that: per grid a balanced table (the seeds all its
   rows have), means with 95% t intervals, the paired difference from GRPO with its
   interval, the paper's numbers beside ours, the compute of every arm.
2. Two files. The report is compact: per grid one row per arm (official and held-out
   accuracy, steps to 80% derivations, each with its difference from GRPO) and one row per
   paired comparison, so an arm adds a row, never a table. The full tables (per size,
   format errors, the selection measures, held-out accuracy along the way, the mechanism,
   the automatic statements, the cost in detail) go to a second file the report links
   (``tables``, which the study keeps with its runs).
3. The block between the HAND-WRITTEN markers is the author's and survives regeneration.
"""
from __future__ import annotations

import os
from pathlib import Path

from .aggregate import SELECT_AT
from .findings import declared_rows, declared_section
from .grid import GRID_TITLES, GRPO, PAPER_KK, portable, short
from .mechanism_report import plot_mechanism
from .mechanism_report import tables as mechanism_tables
from .study_plots import _seed_text, plot_curves, plot_sizes

HAND_BEGIN = "<!-- BEGIN HAND-WRITTEN: study.py keeps this block when it regenerates the file -->"
HAND_END = "<!-- END HAND-WRITTEN -->"


# =======================================================================================
# 7. The report (markdown)
# =======================================================================================

def _cell(s: dict, digits: int = 3) -> str:
    if s["mean"] is None:
        return "–"
    return f"{s['mean']:.{digits}f}" + (f" ± {s['half']:.{digits}f}" if s["half"] is not None else "")


# Up to this many paired seeds a difference is shown with its signs, not a t interval: with
# 2 or 3 values a t interval can have zero width (equal differences), and the smallest
# sign-flip p is then 0.25 -- no star (docs/STUDY.md, "The declared test").
SIGNS_UP_TO = 3


def _signs(diffs) -> str:
    """'3 of 3 lower', '2 of 3 higher, 1 equal': the per-seed signs of a few differences."""
    lo, hi = sum(x < 0 for x in diffs), sum(x > 0 for x in diffs)
    parts = [f"{k} of {len(diffs)} {w}" for k, w in ((lo, "lower"), (hi, "higher")) if k]
    eq = len(diffs) - lo - hi
    return ", ".join(parts + ([f"{eq} equal"] if eq else [])) if parts else f"{eq} of {eq} equal"


def _diff_cell(d: dict | None, digits: int = 3) -> str:
    if not d or d["mean"] is None:
        return "–"
    if d["n"] <= SIGNS_UP_TO and d.get("diffs"):
        return f"{d['mean']:+.{digits}f} ({_signs(d['diffs'])})"
    if d["lo"] is None:
        return f"{d['mean']:+.{digits}f} (n={d['n']})"
    star = " *" if d["excludes_zero"] else ""
    return f"{d['mean']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]{star}"


def _rel_cell(d: dict | None) -> str:
    if not d or d["rel"] is None:
        return "–"
    if d["rel_lo"] is None or d["n"] <= SIGNS_UP_TO:
        return f"{d['rel']:+.1%}"
    return f"{d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]"


def paper_rel(model: str, method: str) -> float:
    row = PAPER_KK[model]
    return row[method][-1] / row["grpo"][-1] - 1


def statement(row: dict) -> str:
    """The automatic, conservative sentence for one method vs GRPO (avg over sizes)."""
    d = (row.get("vs_grpo") or {}).get("avg")
    if not d or d["n"] == 0:
        return f"- **{row['label']}**: no finished GRPO run on the same seeds; no comparison."
    if d["lo"] is None or (d["n"] <= SIGNS_UP_TO and d.get("diffs")):
        return (f"- **{row['label']}**: {d['n']} paired seed(s), too few for an interval (signs: "
                f"{_signs(d['diffs']) if d.get('diffs') else 'n/a'}); difference {d['mean']:+.3f}; no statement.")
    rel = f" ({d['rel']:+.1%})" if d["rel"] is not None else ""
    text = (f"- **{row['label']}**: mean accuracy over sizes {row['accuracy']['avg']['mean']:.3f} vs GRPO "
            f"{d['base_mean']:.3f} on the same {d['n']} seeds; difference {d['mean']:+.3f}{rel}, "
            f"paired 95% CI [{d['lo']:+.3f}, {d['hi']:+.3f}]")
    if d["excludes_zero"]:
        text += f" excludes 0: {'higher' if d['mean'] > 0 else 'lower'} than GRPO at this scale."
    else:
        text += " includes 0: no difference from GRPO detected at this scale"
        text += (f"; with {d['n']} seeds and this seed-to-seed spread, a true difference of about "
                 f"±{d['mde80']:.3f} would have been detected with 80% power." if d.get("mde80") else ".")
    if row["method"] != "grpo":
        text += (f" (Paper, one run each: {paper_rel('Qwen2.5-3B-Instruct', row['method']):+.1%} on 3B, "
                 f"{paper_rel('Qwen2.5-7B-Instruct-1M', row['method']):+.1%} on 7B.)")
    return text


def summary(rows: list[dict]) -> str | None:
    """How many methods are above / indistinguishable from / below GRPO (avg, paired CI)."""
    judged = [r["vs_grpo"]["avg"] for r in rows if r.get("vs_grpo") and r["vs_grpo"]["avg"]["excludes_zero"] is not None
              and r["vs_grpo"]["avg"]["n"] > SIGNS_UP_TO]
    if not judged:
        return None
    up = sum(d["excludes_zero"] and d["mean"] > 0 for d in judged)
    down = sum(d["excludes_zero"] and d["mean"] < 0 for d in judged)
    return (f"Summary (computed): of {len(judged)} methods compared with GRPO, {up} score higher with a "
            f"paired 95% CI that excludes 0 (the direction of the paper's result), {len(judged) - up - down} "
            f"have a CI that includes 0, and {down} score lower with a CI that excludes 0. Each comparison "
            "is at the 5% level on its own; with several of them, one may exclude 0 by chance.")


def _variant_table(table: dict, sizes: list[int], warm: dict | None = None) -> list[str]:
    sz = [str(n) for n in sizes]
    lines = ["| method | " + " | ".join(f"{s} people" for s in sz) + " | avg | Δ avg vs GRPO [paired 95% CI] | relative |",
             "|" + "---|" * (len(sz) + 4)]
    if warm:            # one greedy evaluation, no seeds: a plain value
        lines.append("| warm start (no RL) | " + " | ".join(f"{warm['accuracy'][s]:.3f}" for s in sz)
                     + f" | {warm['accuracy']['avg']:.3f} | | |")
    for row in table["rows"].values():
        d = (row.get("vs_grpo") or {}).get("avg")
        lines.append(f"| {row['label']} | " + " | ".join(_cell(row["accuracy"][s]) for s in sz)
                     + f" | {_cell(row['accuracy']['avg'])} | {_diff_cell(d)} | {_rel_cell(d)} |")
    return lines


def _diff_table(table: dict, sizes: list[int]) -> list[str]:
    sz = [str(n) for n in sizes]
    lines = ["| method | " + " | ".join(f"{s} people" for s in sz) + " | avg |", "|" + "---|" * (len(sz) + 2)]
    for row in table["rows"].values():
        if row.get("vs_grpo"):
            lines.append(f"| {row['label']} | " + " | ".join(_diff_cell(row["vs_grpo"][s]) for s in sz + ["avg"]) + " |")
    return lines if len(lines) > 2 else []


def _format_table(table: dict, warm: dict | None) -> list[str]:
    """Format errors (responses without a well-formed answer block), how many of them hit
    the response budget, and the response length, means over the sizes of each run's
    final evaluation: what RL changes first in a small model."""
    lines = ["| method | format errors | Δ vs GRPO [paired 95% CI] | truncated at the budget | "
             "response tokens | Δ tokens vs GRPO [paired 95% CI] |", "|---|---|---|---|---|---|"]
    if warm and "format_error" in warm:
        lines.append(f"| warm start (no RL) | {warm['format_error']:.3f} | | {warm['truncated']:.3f} | "
                     f"{warm['tokens']:.0f} | |")
    for row in table["rows"].values():
        f = row.get("format_error")
        if f:
            lines.append(f"| {row['label']} | {_cell(f['mean'])} | {_diff_cell(f['vs_grpo'])} | "
                         f"{_cell(f['truncated'])} | {_cell(f['tokens'], 0)} | "
                         f"{_diff_cell(f['tokens_vs_grpo'], 0)} |")
    return lines


SELECTION_COLS = (("heldout", "held-out accuracy", 3), ("steps_to_80", "steps to 80% derivations", 1),
                  ("derive_auc", "derivation share AUC", 3), ("train_truncated", "sampled cut at the cap", 3))


def _pair_lines(table: dict) -> list[str]:
    """One line per GRID_PAIRS comparison of the grid."""
    lines = []
    for d in table.get("pairs", []):
        parts = [f"accuracy (avg over sizes) {_diff_cell(d['avg'])}"]
        parts += [f"{title} {_diff_cell(d[key], dg)}" for key, title, dg in SELECTION_COLS if key in d]
        parts += [f"held-out accuracy after step {k} {_diff_cell(c)}" for k, c in d.get("heldout_along", {}).items()]
        lines.append(f"- **{d['a']}** minus **{d['b']}**{_pair_seeds(d)}, paired by seed (95% CI): "
                     + "; ".join(parts) + ".")
    return lines


def _pair_seeds(d: dict) -> str:
    """A pair's seeds where they are not its table's (aggregate._pair)."""
    return f" (seeds {_seed_text(d['seeds'])})" if "seeds" in d else ""


def _n_cell(c: dict, n: int, digits: int = 3) -> str:
    """A mean ± half-width cell that names its n when fewer runs than the table's have it."""
    return _cell(c, digits) + (f" (n={c['n']})" if c["n"] < n else "")


def _heldout_along_table(table: dict, warm: dict | None, steps: int) -> list[str]:
    """Held-out accuracy at fixed budgets: after the steps the trainer evaluated
    (--heldout-steps) and at the end, mean ± 95% t half-width, and the difference from GRPO
    paired by seed. Faster selection shows here as accuracy at an earlier budget."""
    rows = [r for r in table["rows"].values() if r.get("heldout_along")]
    if not rows:
        return []
    cols = list(rows[0]["heldout_along"])
    names = [f"after step {c}" if c != "final" else f"final (step {steps})" for c in cols]
    start = (f" The warm start (step 0) scores {warm['heldout']:.3f}." if warm and warm.get("heldout") is not None
             else "")
    lines = ["Held-out accuracy along the way (`data/heldout3.jsonl`, 400 three-person puzzles, greedy; the "
             "trainer's evaluation after the steps shown, `eval_heldout_step<N>.json`, and the final policy's): "
             "mean ± 95% t half-width over seeds, and the paired difference from GRPO." + start, "",
             "| method | " + " | ".join(f"{t} | Δ vs GRPO" for t in names) + " |", "|---|" + "---|---|" * len(cols)]
    n = len(table["seeds"])
    for r in rows:
        cells = []
        for c in cols:
            h = r["heldout_along"][c]
            cells += [_n_cell(h["mean"], n) if h["mean"]["n"] else "–", _diff_cell(h["vs_grpo"])]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


def _selection_table(table: dict, warm: dict | None) -> list[str]:
    cols = [c for c in SELECTION_COLS if any(c[0] in r.get("selection", {}) for r in table["rows"].values())]
    if not cols:
        return []
    lines = ["| method | " + " | ".join(f"{t} | Δ vs GRPO" for _, t, _ in cols) + " |",
             "|---|" + "---|---|" * len(cols)]
    if warm and warm.get("heldout") is not None and cols[0][0] == "heldout":
        lines.append(f"| warm start (no RL) | {warm['heldout']:.3f} | |" + " | |" * (len(cols) - 1))
    for row in table["rows"].values():
        cells = []
        for key, _, dg in cols:
            c = row.get("selection", {}).get(key)
            cells += [_cell(c["mean"], dg) if c else "–", _diff_cell(c["vs_grpo"], dg) if c else "–"]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return lines


def _token_split_table(variants: dict) -> list[str]:
    """What Lopti's first stage holds, and where the selection ends, per method."""
    rows = [v for v in variants.values() if v.get("token_split", {}).get("low_mean") is not None]
    if not rows:
        return []
    lines = ["### What Lopti's first stage holds (means over all finished runs)", "",
             "The share of response tokens with pi_old below η (the run's η; methods without Lopti "
             "log it at η = 0.5) at the first RL step and averaged over the steps (`low_fraction` in "
             "metrics.jsonl), and the share of derivations among the last step's samples (mean, and "
             "the range over runs):", "",
             "| method | η | tokens below η, step 1 | tokens below η, mean over steps | derivations at the last step |",
             "|---|---|---|---|---|"]
    for v in rows:
        t, rng = v["token_split"], v.get("derive_last_range")
        last = f"{t['derive_last']:.2f}" + (f" ({rng[0]:.2f}-{rng[1]:.2f})" if rng else "") \
            if t["derive_last"] is not None else "–"
        lines.append(f"| {v['label']} | {t['eta']:g} | {t['low_step1']:.3f} | {t['low_mean']:.3f} | {last} |")
    return lines + [""]


def _beside_paper(table: dict) -> list[str]:
    lines = ["| method | ours: avg | ours: relative to GRPO | paper 3B: avg | paper 3B: relative | "
             "paper 7B: avg | paper 7B: relative |", "|---|---|---|---|---|---|---|"]
    p3, p7 = "Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct-1M"
    for row in table["rows"].values():
        m = row["method"]
        d = (row.get("vs_grpo") or {}).get("avg")
        r3 = "" if m == "grpo" else f"{paper_rel(p3, m):+.1%}"
        r7 = "" if m == "grpo" else f"{paper_rel(p7, m):+.1%}"
        lines.append(f"| {row['label']} | {_cell(row['accuracy']['avg'])} | {_rel_cell(d)} | "
                     f"{PAPER_KK[p3][m][-1]:.2f} | {r3} | {PAPER_KK[p7][m][-1]:.2f} | {r7} |")
    return lines


def _paper_table() -> list[str]:
    lines = ["| model, method | 3 | 4 | 5 | 6 | 7 | avg | relative to GRPO |", "|---|---|---|---|---|---|---|---|"]
    labels = {"base": "base", "grpo": "GRPO", "ar": "GRPO+AR (α=0.2)", "lopti": "GRPO+Lopti (η=0.4)",
              "ar_lopti": "GRPO+AR+Lopti (α=0.3, η=0.5)"}
    for model, rows in PAPER_KK.items():
        for k, row in rows.items():
            rel = "" if k in ("base", "grpo") else f"{paper_rel(model, k):+.1%}"
            lines.append(f"| {model.split('-Instruct')[0]} {labels[k]} | " + " | ".join(f"{x:.2f}" for x in row)
                         + f" | {rel} |")
    return lines


def _hand_block(path: Path) -> str:
    default = ("\n_Interpretation, caveats and what to try next: written by hand, kept by "
               "`python -m lopti_minimal.experiments.study` when it regenerates this file._\n")
    if path.exists():
        text = path.read_text()
        if HAND_BEGIN in text and HAND_END in text:
            return text.split(HAND_BEGIN, 1)[1].split(HAND_END, 1)[0]
    return default


def format_hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


PROTOCOL = [
    "- Every method starts from the same warm start (its SHA-256 is given per preset) with the same "
    "seeds; a seed fixes the prompts of every step and the sampler's random stream, so runs with the "
    "same seed are paired.",
    "- **Equal budget** in sampled responses (RL steps x prompts per step x G). Lopti's second stage is a "
    "second optimizer pass over the *same* responses: update compute (see the cost table), not samples.",
    "- The paper's K&K settings: AR alone α=0.2, Lopti alone η=0.4, AR+Lopti α=0.3, η=0.5.",
    "- Accuracy: share of the official test puzzles whose **greedy** response scores 3, at the end of each "
    "run (the paper averages its last three evaluations). Held-out: the 400 three-person puzzles of "
    "`data/heldout3.jsonl`, greedy. Steps to 80% derivations: the first RL step whose samples are at "
    f"least {SELECT_AT:.0%} derivations (never = steps + 1: censored; a difference with it is a bound).",
    "- Each table uses the seeds all its rows have. Cells: mean ± half-width of the 95% Student-t "
    "interval over seeds. Δ vs GRPO: mean of the per-seed differences with its paired 95% t interval; "
    f"`*` marks an interval that excludes 0; with {SIGNS_UP_TO} seeds or fewer, the signs instead. Relative = "
    "Δ / GRPO mean. No correction for multiple comparisons, except in the declared test above (Holm). "
    "×2 in a method's name: two optimizer steps per rollout.",
]


def _along(items) -> list[str]:
    """The RL steps after which the trainer evaluated the held-out set, as the items' keys."""
    keys: list[str] = []
    for it in items:
        keys += [k for k in (it.get("heldout_along") or {}) if k != "final" and k not in keys]
    return keys


def _md(first: str, cols: list, items, name) -> list[str]:
    """A markdown table: a row per item, its name first, then a cell per (title, cell) column."""
    return [f"| {first} | " + " | ".join(t for t, _ in cols) + " |", "|---|" + "---|" * len(cols)] + \
        [f"| {name(it)} | " + " | ".join(f(it) for _, f in cols) + " |" for it in items]


def _compact_table(table: dict, warm: dict | None, shown: set | None = None) -> list[str]:
    """One row per arm: official accuracy (avg over sizes), held-out accuracy (at the end, and
    after the steps the trainer evaluated it, as differences), steps to 80% derivations; each
    beside its paired difference from GRPO. A new arm adds a row, never a column. An arm
    already in a table above on the same seeds (``shown``: (label, seeds)) is named, not
    repeated; GRPO, the baseline, always has its row."""
    seeds, n = tuple(table["seeds"]), len(table["seeds"])
    rows = [r for r in table["rows"].values() if r["label"] == "GRPO" or (r["label"], seeds) not in (shown or set())]
    sel = lambda r, k: r.get("selection", {}).get(k)                                      # noqa: E731
    cols = [("accuracy, official (avg)", lambda r: _cell(r["accuracy"]["avg"])),
            ("Δ vs GRPO [paired 95% CI]", lambda r: _diff_cell((r.get("vs_grpo") or {}).get("avg")))]
    for key, title, dg in SELECTION_COLS[:2]:
        if any(sel(r, key) for r in rows):
            cols += [(title, lambda r, k=key, d=dg: _n_cell(sel(r, k)["mean"], n, d) if sel(r, k) else "–"),
                     ("Δ vs GRPO", lambda r, k=key, d=dg: _diff_cell(sel(r, k)["vs_grpo"], d) if sel(r, k) else "–")]
            cols += [(f"Δ held-out after step {s}", lambda r, s=s: _diff_cell(
                (r.get("heldout_along") or {}).get(s, {}).get("vs_grpo"))) for s in _along(rows) if key == "heldout"]
    lines = _md("method", cols, rows, lambda r: short(r["label"]))
    if warm:                    # one greedy evaluation, no seeds: plain values
        at = {"accuracy, official (avg)": f"{warm['accuracy']['avg']:.3f}",
              SELECTION_COLS[0][1]: f"{warm['heldout']:.3f}" if warm.get("heldout") is not None else ""}
        lines.insert(2, "| warm start (no RL) | " + " | ".join(at.get(t, "") for t, _ in cols) + " |")
    repeated = [short(r["label"]) for r in table["rows"].values() if r not in rows]
    if shown is not None:
        shown |= {(r["label"], seeds) for r in table["rows"].values()}
    return lines + (["", f"Also in this grid, with the numbers of a table above: {', '.join(repeated)}."]
                    if repeated else [])


def _compact_pairs(table: dict) -> list[str]:
    """The grid's own paired comparisons (GRID_PAIRS), one row each."""
    pairs = table.get("pairs", [])
    cols = [("accuracy, official (avg)", lambda d: _diff_cell(d["avg"]))]
    cols += [("held-out", lambda d: _diff_cell(d.get("heldout")))] if any("heldout" in d for d in pairs) else []
    cols += [(f"held-out after step {k}", lambda d, k=k: _diff_cell(d.get("heldout_along", {}).get(k)))
             for k in _along(pairs)]
    cols += [("steps to 80% derivations", lambda d: _diff_cell(d.get("steps_to_80"), 1))] \
        if any("steps_to_80" in d for d in pairs) else []
    return ["Paired comparisons within this grid (A minus B, paired by seed, 95% CI):", ""] + \
        _md("A minus B", cols, pairs, lambda d: f"{short(d['a'])} minus {short(d['b'])}{_pair_seeds(d)}") + [""] if pairs else []


def _shown_grids(pr: dict):
    """The grids with a table, in order: a grid with no run of its own repeats the tables above."""
    shown: set = set()
    for grid, table in pr["grids"].items():
        if grid != "main" and set(table["rows"]) <= shown | {GRPO.name}:
            continue
        shown |= set(table["rows"])
        yield grid, table


def _preset_intro(preset: str, pr: dict) -> list[str]:
    b, sizes = pr["budget"], pr["sizes"]
    L = [f"## Preset `{preset}`", "",
         f"Model `{pr['model']}` (warm start {pr['fingerprint'] or 'not recorded'}). Budget per run, the "
         f"same for every method: {b['steps']} RL steps x {b['prompts_per_step']} prompts x G={b['group_size']} "
         f"= **{b['responses_per_run']} sampled responses**; {b['optimizer_steps_per_stage']} optimizer "
         f"step(s) per update pass (mini-batch {b['mini_batch_size']}); lr {b['lr']:g}, T {b['temperature']}, "
         f"RL puzzles of {', '.join(map(str, b['rl_sizes']))} people, responses up to {b['max_new_tokens']} "
         f"tokens. Evaluation: {b['eval_per_size']} official puzzles per size, sizes "
         f"{', '.join(map(str, sizes))}.", ""]
    if pr["excluded"]:
        L += ["Left out (config differs from the other runs of this preset): " +
              "; ".join(f"`{e['dir']}` ({', '.join(e['differs_in'])})" for e in pr["excluded"]), ""]
    return L


def _seeds_line(grid: str, table: dict, pr: dict) -> str:
    return (f"Seeds {_seed_text(table['seeds'])} (n = {len(table['seeds'])} per row)."
            + (" The first row is the starting policy, evaluated once in the same way (`warm-start-eval.json`)."
               if grid == "main" and pr.get("warm_start") else "") + _machine_text(table))


def _machine_text(table: dict) -> str:
    """The seeds a grid left out because their arms ran on different machines (grid.py,
    choice 4): how many, which, and which recorded field differs."""
    apart = table.get("machine_apart")
    if not apart:
        return ""
    which = ", ".join(f"{a['seed']} ({', '.join(a['differs'])} differ{'s' if len(a['differs']) == 1 else ''})"
                      for a in apart)
    return (f" {len(apart)} seed(s) left out, their arms having run on different machines (the CPU model, "
            f"torch version or thread count each run recorded) or at commits not shown to compute the same "
            f"(code): seed {which}; every row and its difference "
            "from GRPO are over the seeds above only, a paired comparison below over the seeds its two arms "
            "share (named where they differ).")


def _grid_warm(grid: str, pr: dict) -> dict | None:     # the grids whose tables show the warm start
    return pr.get("warm_start") if grid in ("main", "control", "criterion", "isolation") else None


def _grid_full(grid: str, table: dict, pr: dict) -> list[str]:
    """Every table of one grid: accuracy per size and its differences, the automatic
    statements, format errors and length, what RL selects, held-out accuracy along the way,
    the mechanism, the grid's pairs, and (main grid) the paper beside ours."""
    sizes, b = pr["sizes"], pr["budget"]
    rows = list(table["rows"].values())
    L = [f"### {GRID_TITLES[grid]}", "", _seeds_line(grid, table, pr), ""]
    L += _variant_table(table, sizes, pr.get("warm_start") if grid == "main" else None) + [""]
    dt = _diff_table(table, sizes)
    if dt:
        L += ["Difference from GRPO per size (paired by seed, 95% CI):", ""] + dt + [""]
    if grid == "main":
        comp = [r for r in rows if r["method"] != "grpo"]
        L += ["Against GRPO, on the average over sizes:", ""] + [statement(r) for r in comp] + [""]
        s = summary(comp)
        L += [s, ""] if s else []
    L += ["Format errors (share of greedy responses without a well-formed answer block; the "
          "others are right or wrong answers), the share of responses cut at the response budget, "
          "and the mean response length in tokens; means over sizes, same seeds:", ""]
    L += _format_table(table, pr.get("warm_start") if grid == "main" else None) + [""]
    st = _selection_table(table, _grid_warm(grid, pr))
    if st:
        L += ["What RL selects, and accuracy on the held-out set (greedy): steps until derivations are at "
              f"least {SELECT_AT:.0%} of a step's samples (never = steps + 1), the area under the "
              "share-of-derivations curve (mean share per step), and the share of samples cut at the "
              "response cap during training; mean ± 95% t half-width over seeds, and the paired "
              "difference from GRPO:", ""] + st + [""]
    L += _heldout_along_table(table, _grid_warm(grid, pr), b["steps"])
    mt = mechanism_tables(table, _cell, _diff_cell)
    if mt:
        L += ["The mechanism (the paper's Fig. 3 and Fig. 1b at every step; lopti_minimal/mechanism.py): "
              "per bin of pi_old, the share of A > 0 tokens whose probability rose in the step's whole "
              "update, and of A < 0 tokens whose probability fell, among the tokens whose probability "
              "moved at all, averaged over the run's steps; the low bins' (pi_old < 0.5) share of the "
              "squared gradient norm of the method's loss at pi_old (bins as Lopti stages), and the mean "
              "-log pi_old of the sampled tokens (an entropy estimate). Mean ± 95% t half-width over "
              "seeds; Δ: paired difference from GRPO:", ""] + mt
    pl = _pair_lines(table)
    if pl:
        L += ["Paired comparisons within this grid:", ""] + pl + [""]
    if grid == "main":
        L += ["Beside the paper (its avg is over sizes 3..7; ours over the sizes above):", ""]
        L += _beside_paper(table) + [""]
    return L


def _grid_compact(grid: str, table: dict, pr: dict, shown: set) -> list[str]:
    L = [f"### {GRID_TITLES[grid]}", "", _seeds_line(grid, table, pr), ""]
    L += _compact_table(table, pr.get("warm_start") if grid == "main" else None, shown) + [""]
    if grid == "main":
        s = summary([r for r in table["rows"].values() if r["method"] != "grpo"])
        L += [s, ""] if s else []
        L += ["Beside the paper (its avg is over sizes 3..7, ours over the sizes above; its table per "
              "size: the full tables):", ""]
        L += _beside_paper(table) + [""]
    return L + _compact_pairs(table)


def _cost_table(pr: dict, full: bool) -> list[str]:
    """Per method: runs, update passes per batch, seconds per RL step (in full: of which
    sampling and update, the final evaluation), run wall time; means over all finished runs."""
    t = lambda v, k, f=".1f": format(v["timing"][k], f)                                  # noqa: E731
    cols = [("runs", lambda v: str(v["n"])), ("update passes per batch", lambda v: str(v["update_passes"]))]
    cols += [("sampled responses per run", lambda v: str(pr["budget"]["responses_per_run"]))] if full else []
    cols += [("s per RL step", lambda v: t(v, "step_s"))]
    cols += [("of which sampling", lambda v: t(v, "sample_s")), ("of which update", lambda v: t(v, "update_s")),
             ("final evaluation s", lambda v: t(v, "eval_s", ".0f"))] if full else []
    cols += [("run wall time", lambda v: format_hours(v["timing"]["run_wall_s"]))]
    return _md("method", cols, pr["variants"].values(), lambda v: v["label"] if full else short(v["label"])) + [""]


def _compute_line(pr: dict) -> str:
    return (f"Compute of this preset: {pr['n_runs']} finished runs, {format_hours(pr['compute_s'])} of run "
            "wall time in total. Code (the commit each run recorded in its run.json; +changes: tracked "
            "files differed from it): " + ", ".join(f"`{c}` ({n} runs)" for c, n in pr.get("code", {}).items()) + ".")


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, path)


def write_report(res: dict, path, figures_dir, plots: bool = True, regenerate: str | None = None,
                 tables=None) -> str:
    """docs/RESULTS.md (or ``path``) from the aggregated results: the compact report, a row per
    arm; every table in full into ``tables`` (default: beside the report, <stem>_TABLES.md),
    which the report links; figures into ``figures_dir``, linked relative to each file. The
    hand-written block is kept. ``regenerate``: the command both files name (default: the
    report-only command with default paths)."""
    path, figures_dir = Path(path), Path(figures_dir)
    tables = Path(tables) if tables else path.with_name(path.stem + "_TABLES.md")
    rel = lambda p, frm=path: os.path.relpath(p, Path(frm).parent).replace(os.sep, "/")   # noqa: E731
    again = regenerate or "python -m lopti_minimal.experiments.study --report-only"
    L = ["# Results: GRPO vs AR vs Lopti on Knights and Knaves, at small scale", "",
         f"_Generated by `python -m lopti_minimal.experiments.study` from the runs in "
         f"`{res['out']}`; regenerate with `{again}`. "
         "Every number below is computed from those runs, except the paper's (from Yang et al. "
         "2025, arXiv 2505.12929, the K&K results table). Only the Discussion is written by hand._", ""]
    if res["presets"]:
        L += [f"A row per arm here; every table in full: [{tables.name}]({rel(tables)}).", ""]
    for pr in res["presets"].values():
        if pr.get("declared"):
            L += declared_section(pr["declared"], rel(tables))
    L += ["## Protocol", "", *PROTOCOL, ""]
    T = ["# Full tables: GRPO vs AR vs Lopti on Knights and Knaves", "",
         f"_Every table of the study of the runs in `{res['out']}`, computed from those runs (the paper's "
         f"numbers: Yang et al. 2025). The protocol and the reading: [the report]({rel(path, tables)}). "
         f"Both are regenerated by `{again}`._", ""]
    if not res["presets"]:
        L += ["## Status", "", "No finished runs yet. Run `python -m lopti_minimal.experiments.study` "
              "(`--help` for the options, `--dry-run` for the plan and a time estimate).", ""]
    for preset, pr in res["presets"].items():
        L += _preset_intro(preset, pr)
        T += _preset_intro(preset, pr)
        shown: set = set()
        for grid, table in _shown_grids(pr):
            L += _grid_compact(grid, table, pr, shown)
            T += _grid_full(grid, table, pr)
            if plots:
                figures_dir.mkdir(parents=True, exist_ok=True)
                fc = plot_curves(table, figures_dir / f"study-{preset}-{grid}-curves.png",
                                 f"{preset}: {GRID_TITLES[grid]}", res["window"])
                L += [f"![learning curves, {grid}]({rel(fc)})", ""]
                if grid == "main":
                    fs = plot_sizes(table, pr["sizes"], figures_dir / f"study-{preset}-main-sizes.png",
                                    f"{preset}: final greedy accuracy, mean and 95% t interval")
                    L += [f"![accuracy per size]({rel(fs)})", ""]
                if mechanism_tables(table, _cell, _diff_cell):
                    fm = plot_mechanism(table, figures_dir / f"study-{preset}-{grid}-mechanism.png",
                                        f"{preset}: {GRID_TITLES[grid]}", res["window"])
                    T += [f"![mechanism, {grid}]({rel(fm, tables)})", ""]
        T += ["### Cost per method (means over all finished runs)", ""] + _cost_table(pr, True)
        T += [_compute_line(pr), ""]
        L += [f"Cost per method (update passes, seconds per RL step, wall time): [{tables.name}]({rel(tables)}). "
              + _compute_line(pr), ""]
        T += _token_split_table(pr["variants"])
        if pr.get("declared", {}).get("families"):
            T += ["### The declared test, both families (docs/STUDY.md)", ""]
            for fam, rows in pr["declared"]["families"].items():
                T += [f"The {fam} family:", ""] + declared_rows(rows) + [""]
    (T if res["presets"] else L).extend(      # with runs, the report has the paper beside ours
        ["## The paper's K&K table", "", "From Yang et al. 2025, the K&K results table (one run per method, "
         "4 x 80 GB GPUs, 64 prompts x 8 responses per step, ~350 steps; accuracy = mean of the last three "
         "evaluations):", ""] + _paper_table() + [""])
    inv = res["invocations"]
    L += ["## Time and machine", ""]
    if inv:
        L.append(f"- Study wall time: {format_hours(sum(i['wall_s'] for i in inv))} over {len(inv)} invocation(s) "
                 f"of `python -m lopti_minimal.experiments.study`, from {inv[0]['start']} to {inv[-1]['end']}.")
        machines = (i["machine"] for i in inv if i.get("machine"))
        L += list(dict.fromkeys(f"- Machine: {m['cpu']}, {m['cores']} cores" + (f", GPU {m['gpu']}" if m.get("gpu") else "")
                                + f"; Python {m['python']}, torch {m['torch']}." for m in machines))
        cmds = dict.fromkeys(" ".join(["python -m lopti_minimal.experiments.study", *map(portable, i.get("argv") or [])])
                             for i in inv)
        L.append(f"- Commands: {len(cmds)} distinct, listed in [{tables.name}]({rel(tables)})." if res["presets"]
                 else "- Commands: " + "; ".join(f"`{c}`" for c in cmds))
        T += ["## Commands", ""] + [f"- `{c}`" for c in cmds] + [""]
        par = sorted({(i.get("jobs"), i.get("threads") or 0) for i in inv})
        L.append("- Parallelism (runs at once, torch threads per run; 0 = torch's default): "
                 + ", ".join(f"({j}, {t})" for j, t in par))
    else:
        L.append("- No study invocation recorded yet.")
    if res["unfinished"]:
        L.append(f"- Unfinished runs (the same command resumes them): {len(res['unfinished'])}.")
    L += ["", "## Discussion", "", HAND_BEGIN + _hand_block(path) + HAND_END, ""]
    if res["presets"]:
        _write(tables, T)
    _write(path, L)
    return str(path)
