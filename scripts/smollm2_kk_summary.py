"""RL on SmolLM2-135M-Instruct against its start and against more supervised training: the
tables and figure of ``scripts/smollm2_kk_rl.sh``'s folder (docs/TASK_AND_MODELS.md).

    python scripts/smollm2_kk_summary.py OUT                 # OUT/summary.md, OUT/smollm2-kk-rl.png
    python scripts/smollm2_kk_summary.py OUT1 OUT2 --figure PNG     # each OUT's, and one figure of all
    python scripts/smollm2_kk_summary.py --control-steps RUN START   # prints N (below)

OUT holds ``start/`` (the start's evaluations), ``rl-*/`` (an RL run's files: run.json,
metrics.jsonl, eval_final.json, and eval_heldout<N>.json of its final policy) and ``sft-*/``
(the supervised control's warmstart.json and evaluations); ``pilot-*/`` (any other policy's
evaluations, e.g. an interrupted RL run's checkpoint) get a row too.

Design choices:

1. **Paired by puzzle.** Every policy is evaluated greedily on the same 400 held-out N-person
   puzzles (``data/heldout<N>.jsonl``, eval.py ``--save-responses``), so a difference of two
   accuracies is the mean of per-puzzle differences (each -1, 0 or +1) with its 95% t
   interval (experiments.stats.paired_diff, the puzzles in place of seeds). It measures the
   change of *this* policy on *these* puzzles; the seeds say how much a run varies. Beside
   it, the puzzles the start got right and the policy lost, and the ones it gained.
2. **The control's budget is wall time** (what a laptop user spends): N supervised steps =
   the RL run's summed step time / the start's own seconds per supervised step (its
   warmstart.json), both measured on the same machine and threads. Evaluation time is not
   training time and is left out of both. A shared machine's speed drifts (the start's
   steps were timed on another day), so the table gives each policy's own training minutes:
   a control that got more or less time than its RL run shows there.
3. **Greedy accuracy is the measure**; the reward curve (sampled responses at T 0.7, the RL
   run's own metrics) is drawn beside it, not compared: its puzzles differ per step.
4. **Accuracy beside the answer prior.** A policy that gives every puzzle the same answer
   scores the share of the set's puzzles with that solution: 0.325 for "all knights" on
   data/heldout3.jsonl (its puzzles are those the generator draws rarely), 0.17 on the
   official 3-person set. So each policy's row also gives the share of its greedy answers
   that are its commonest assignment, and its accuracy on the puzzles whose solution is
   *not* the set's commonest (where "all knights" on heldout3 scores 0).
5. **One table per held-out size, the trained size first.** The sizes are those of the
   eval_heldout<N>.json files in OUT's folders; the trained size is ``--size``, else the RL
   runs' own (run.json rl_sizes), else the largest. After RL on 4 people the 3-person table
   says what the larger puzzles cost on the ones the start was best at. A folder evaluated on
   3 people alone gets the one table it always had, with no heading.
6. **What each RL run's tokens looked like**: a last table, per run, the means over its
   steps of the metrics the paper's question is about (metrics.jsonl, plumbing.step_metrics):
   the groups of equal rewards (no GRPO advantage, Eq. 1), the sampled tokens with pi_old <
   0.5, AR's mean factor alpha * pi_old + 1 - alpha (Eq. 4), the share Lopti's first stage
   updates (Algorithm 1), and under dynamic sampling its kept groups and sampling rounds a
   step. "–" where a run did not log one (its method does not use it, or it predates it).
7. **How far each policy moved**: the number of its greedy held-out responses identical,
   token for token, to the start's (last column). Accuracy can stay level while a policy
   changes (as many puzzles lost as gained); identical responses say it did not change there.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lopti_minimal.experiments.stats import paired_diff  # noqa: E402
from lopti_minimal.plots import moving_average  # noqa: E402
from lopti_minimal.task.kk import load_jsonl  # noqa: E402
from lopti_minimal.task.reward import score_response  # noqa: E402

HELDOUT_SET = "data/heldout{n}.jsonl"        # {n}: the puzzles' size
POLICIES = ("rl-*", "sft-*", "pilot-*")      # OUT's folders after start/, in this order
# metrics.jsonl keys of design choice 6 and their columns, in order
TOKEN_METRICS = {"zero_adv_groups": "groups of equal rewards", "pi_old_below_half": "tokens with pi_old < 0.5",
                 "ar_weight": "AR factor (Eq. 4)", "stage1_share": "Lopti stage 1 (Algorithm 1)",
                 "kept_groups": "kept groups (dynamic sampling)", "gen_rounds": "sampling rounds"}
ABSENT = "–"


class SummaryError(Exception):
    """What is wrong with OUT or an option, in one line."""


def heldout_file(n: int) -> str:
    """A policy's evaluation on the held-out n-person puzzles (scripts/smollm2_kk_rl.sh)."""
    return f"eval_heldout{n}.json"


def responses_file(n: int) -> str:
    """Its responses, one per puzzle (eval.py --save-responses beside heldout_file(n))."""
    return heldout_file(n).replace(".json", ".responses.jsonl")


def control_steps(run_dir, start_dir) -> int:
    """Supervised steps that take as long as the RL run's steps took (design choice 2)."""
    rl_seconds = training_minutes(run_dir) * 60
    history = json.loads((Path(start_dir) / "warmstart.json").read_text())["history"]
    per_step = history[-1]["seconds"] / history[-1]["step"]
    return max(1, round(rl_seconds / per_step))


def correct_by_puzzle(folder, size: int = 3) -> dict[int, float] | None:
    """{puzzle index: 1.0 if the greedy response was right} from eval.py's saved responses."""
    path = Path(folder) / responses_file(size)
    if not path.exists():
        return None
    return {int(r["index"]): float(bool(r["correct"])) for r in load_jsonl(path)}


def response_texts(folder, size: int = 3) -> dict[int, str] | None:
    """{puzzle index: the greedy response} from eval.py's saved responses."""
    path = Path(folder) / responses_file(size)
    return {int(r["index"]): r["response"] for r in load_jsonl(path)} if path.exists() else None


def identical_responses(folder, start: dict[int, str] | None, size: int = 3) -> int | None:
    """Design choice 7: how many of the policy's greedy responses equal ``start``'s
    (response_texts of the start, read once per table), puzzle by puzzle; None when either
    has no saved responses."""
    mine = response_texts(folder, size)
    if mine is None or start is None:
        return None
    return sum(1 for i, text in mine.items() if start.get(i) == text)


def assignment(record: dict) -> tuple:
    """A puzzle's solution as a tuple of roles in the order of its names (True = knight)."""
    return tuple(bool(x) for x in record["solution"])


def answer_prior(folder, puzzles: dict[int, dict], size: int = 3) -> dict | None:
    """Design choice 4, from a policy's saved greedy responses: ``same_answer`` = the share
    of its responses that give its commonest role assignment (unparsed ones count as
    distinct), ``rest`` = its accuracy on the puzzles whose solution is not the set's
    commonest, and ``rest_n`` = how many those are."""
    path = Path(folder) / responses_file(size)
    if not path.exists():
        return None
    commonest, _ = commonest_solution(puzzles)
    given, rest = Counter(), []
    for r in load_jsonl(path):
        puzzle = puzzles[int(r["index"])]
        roles = score_response(r["response"], puzzle).parsed_roles
        given[tuple(roles[n] for n in puzzle["names"]) if roles else ("unparsed", r["index"])] += 1
        if assignment(puzzle) != commonest:
            rest.append(float(bool(r["correct"])))
    return {"same_answer": given.most_common(1)[0][1] / sum(given.values()),
            "rest": sum(rest) / len(rest) if rest else None, "rest_n": len(rest)}


def commonest_solution(puzzles: dict[int, dict]) -> tuple[tuple, float]:
    """The set's commonest solution and its share: the best score of a policy that always
    gives the same answer."""
    solution, count = Counter(assignment(p) for p in puzzles.values()).most_common(1)[0]
    return solution, count / len(puzzles)


def training_minutes(folder) -> float | None:
    """An RL run's summed step time (metrics.jsonl) or a supervised run's training time
    (warmstart.json), in minutes; evaluations excluded."""
    folder = Path(folder)
    if (folder / "metrics.jsonl").exists():
        return sum(m["step_s"] for m in load_jsonl(folder / "metrics.jsonl")) / 60
    if (folder / "warmstart.json").exists():
        return json.loads((folder / "warmstart.json").read_text())["history"][-1]["seconds"] / 60
    return None


def _overall(folder, name: str) -> dict | None:
    path = Path(folder) / name
    return json.loads(path.read_text())["overall"] if path.exists() else None


def official_accuracy(folder, size: int) -> float | None:
    """Greedy accuracy on the official size-person set: an RL run's final evaluation
    (train.py, eval_final.json) or eval.py's (eval_official<size>.json), per size."""
    for name in ("eval_final.json", f"eval_official{size}.json"):
        path = Path(folder) / name
        if path.exists():
            per_size = json.loads(path.read_text()).get("per_size", {})
            if str(size) in per_size:
                return per_size[str(size)]["accuracy"]
    return None


def policy_folders(out) -> list[tuple[str, Path]]:
    """(name, folder) of the start and every policy folder (POLICIES), in the table's order."""
    out = Path(out)
    return [("start", out / "start")] + [(p.name, p) for pattern in POLICIES
                                         for p in sorted(out.glob(pattern)) if p.is_dir()]


def run_config(folder) -> dict | None:
    """An RL run's saved config (run.json's "config"), if the folder has it."""
    path = Path(folder) / "run.json"
    return json.loads(path.read_text())["config"] if path.exists() else None


def heldout_sizes(out, size: int | None = None) -> list[int]:
    """Design choice 5: the held-out sizes OUT's policies were evaluated on, the trained size
    first (``size``, else the RL runs' own rl_sizes where one size, else the largest)."""
    folders = [f for _, f in policy_folders(out)]
    found = {int(m.group(1)) for f in folders if f.is_dir() for p in f.iterdir()
             if (m := re.fullmatch(r"eval_heldout(\d+)\.json", p.name))}
    if not found:
        raise SummaryError(f"{out}: no eval_heldout<N>.json in start/ or a policy folder "
                           "(scripts/smollm2_kk_rl.sh writes them)")
    trained = size
    if trained is None:
        own = [c["rl_sizes"][0] for f in folders if (c := run_config(f)) and len(c.get("rl_sizes") or ()) == 1]
        trained = next((n for n in own if n in found), max(found))
    if trained not in found:
        raise SummaryError(f"{out}: no policy was evaluated on held-out {trained}-person puzzles "
                           f"(no {heldout_file(trained)})")
    return [trained] + sorted(found - {trained})


def heldout_set(pattern: str, size: int) -> str:
    """The held-out set of ``size`` people: ``pattern`` with {n} replaced (a path without {n}
    is the one set, for a folder evaluated on one size)."""
    path = pattern.format(n=size) if "{n}" in pattern else pattern
    if not Path(path).exists():
        raise SummaryError(f"{path}: no such held-out set (python scripts/heldout_set.py --size {size} makes it)")
    return path


def token_means(metrics: list[dict], cfg: dict | None = None) -> dict:
    """Design choice 6: each TOKEN_METRICS key's mean over the steps that logged it (None:
    no step did). Runs from before those keys logged `low_fraction`, the share of tokens
    with pi_old below the run's threshold (eta for a Lopti method, else 0.5): where that
    threshold is 0.5 it is `pi_old_below_half`, and for a Lopti method in the paper's order
    (low first) it is `stage1_share`; read so, with ``cfg`` the run's config."""
    out = {}
    for key in TOKEN_METRICS:
        values = [v for v in (_logged(m, key, cfg or {}) for m in metrics) if v is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def _logged(m: dict, key: str, cfg: dict):
    """A step's value of ``key``, or the `low_fraction` it equals in an older run (token_means)."""
    if m.get(key) is not None or m.get("low_fraction") is None:
        return m.get(key)
    lopti = cfg.get("method") in ("lopti", "ar_lopti")
    if key == "pi_old_below_half" and cfg.get("method") and (not lopti or cfg.get("eta") == 0.5):
        return m["low_fraction"]
    if key == "stage1_share" and lopti and cfg.get("lopti_order", "low_first") == "low_first":
        return m["low_fraction"]
    return None


def rows(out, puzzles_file=None, size: int = 3) -> list[dict]:
    """One row per policy on the held-out ``size``-person set: the start, each RL run, each
    supervised control, and each ``pilot-*`` folder (a shorter run's evaluation, such as an
    unfinished run's checkpoint)."""
    out = Path(out)
    puzzles = {int(p["index"]): p for p in load_jsonl(puzzles_file or HELDOUT_SET.format(n=size))}
    start = correct_by_puzzle(out / "start", size)
    start_texts = response_texts(out / "start", size)
    table = []
    for name, folder in policy_folders(out):
        held, mine = _overall(folder, heldout_file(size)), correct_by_puzzle(folder, size)
        row = {"name": name, "heldout": held and held["accuracy"], "format_error": held and held["format_error"],
               "n": len(mine) if mine else None, "size": size,
               "official": official_accuracy(folder, size), "vs_start": None,
               "prior": answer_prior(folder, puzzles, size), "minutes": training_minutes(folder)}
        if name != "start" and mine and start:
            row["vs_start"] = paired_diff(mine, start)
            row["lost"] = sum(1 for i, c in mine.items() if start.get(i) and not c)
            row["gained"] = sum(1 for i, c in mine.items() if c and i in start and not start[i])
            row["identical"] = identical_responses(folder, start_texts, size)
        if (folder / "metrics.jsonl").exists():
            row["metrics"] = load_jsonl(folder / "metrics.jsonl")
            row["config"] = run_config(folder)
        table.append(row)
    return table


def _f(v) -> str:
    return "" if v is None else f"{v:.3f}"


def _reward_trend(ms: list[dict]) -> str:
    """Mean sampled reward over a run's first k and last k steps: k = 5, or half a run of
    fewer than 10 steps, so the two never share a step (a single step: its reward twice)."""
    if not ms:
        return ""
    k = max(1, min(5, len(ms) // 2))
    return (f"{sum(m['reward'] for m in ms[:k]) / k:+.3f} -> "
            f"{sum(m['reward'] for m in ms[-k:]) / k:+.3f}")


def markdown(table: list[dict], size: int = 3) -> str:
    lines = ["| policy | held-out greedy (400) | minus the start [paired 95% CI] (puzzles lost, gained) | "
             "format errors | same answer | held-out, solution not the commonest | "
             f"official {size}-person (100) | training minutes | RL steps | "
             "mean reward: first k -> last k steps (k = 5, or half a shorter run) | "
             "greedy responses identical to the start's |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        d = r["vs_start"]
        diff = (f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] "
                f"(lost {r['lost']}, gained {r['gained']})") if d else ""
        ms = r.get("metrics") or []
        reward = _reward_trend(ms)
        prior = r.get("prior") or {}
        rest = f"{_f(prior.get('rest'))} (of {prior['rest_n']})" if prior.get("rest_n") else ""
        minutes = "" if r.get("minutes") is None else f"{r['minutes']:.1f}"
        same = "" if r.get("identical") is None else f"{r['identical']} of {r['n']}"
        lines.append(f"| {r['name']} | {_f(r['heldout'])} | {diff} | {_f(r['format_error'])} | "
                     f"{_f(prior.get('same_answer'))} | {rest} | "
                     f"{_f(r['official'])} | {minutes} | {len(ms) or ''} | {reward} | {same} |")
    return "\n".join(lines) + "\n"


def _method(cfg: dict | None) -> str:
    """An RL run's method with the knobs it uses (config.METHODS), from its run.json."""
    if not cfg:
        return ABSENT
    knobs = [f"{k} {cfg[k]:g}" for k in ("alpha", "eta") if cfg.get(k) is not None]
    return cfg["method"] + (f" ({', '.join(knobs)})" if knobs else "")


def token_markdown(table: list[dict]) -> str:
    """Design choice 6: per RL run (each row with metrics.jsonl), its method and the means
    over its steps of TOKEN_METRICS; "" when no row has metrics."""
    runs = [r for r in table if r.get("metrics")]
    if not runs:
        return ""
    lines = ["Per RL run, means over its steps (metrics.jsonl; " + ABSENT + ": not logged by this run):", "",
             "| RL run | method | RL steps | " + " | ".join(TOKEN_METRICS.values()) + " |",
             "|---|---|---|" + "---|" * len(TOKEN_METRICS)]
    for r in runs:
        means = token_means(r["metrics"], r.get("config"))
        cells = [ABSENT if v is None else f"{v:.2f}" if k in ("kept_groups", "gen_rounds")
                 else f"{v:.4f}" if k in ("pi_old_below_half", "stage1_share") else f"{v:.3f}"
                 for k, v in means.items()]
        lines.append(f"| {r['name']} | {_method(r.get('config'))} | {len(r['metrics'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_text(tables: dict[int, list[dict]], sets: dict[int, str], puzzles: dict[int, dict]) -> str:
    """summary.md: one paired table per held-out size (design choice 5), each with its
    constant-answer bound, then the RL runs' token table (design choice 6)."""
    headed = list(tables) != [3]
    parts = []
    for k, (n, table) in enumerate(tables.items()):
        head = (f"**Held-out {n}-person puzzles** ({sets[n]}{', the trained size' if k == 0 else ''}):\n\n"
                if headed else "")
        parts.append(head + markdown(table, n) + f"\nA constant answer scores at most "
                     f"{commonest_solution(puzzles[n])[1]:.3f} on the held-out set (its commonest solution's share).\n")
    tokens = token_markdown(next(iter(tables.values())))
    return "\n".join(parts + ([tokens] if tokens else []))


def _colour(name: str) -> str:
    """The start gray, RL (``rl-*``, ``pilot-rl-*``) red, supervised training blue."""
    return "gray" if name == "start" else "tab:red" if name.startswith(("rl-", "pilot-rl-")) else "tab:blue"


def figure(table: list[dict], path) -> str:
    """Left: the RL runs' mean reward per step (moving average over 5 steps); right: held-out
    greedy accuracy of every policy with its binomial 95% half-width, one bar a row (named,
    with its training minutes; a row's ``label`` where it has one)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    have = [r for r in table if r["heldout"] is not None]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 1.6 + 0.35 * len(have)), width_ratios=(1, 1.3))
    for r in table:
        if r.get("metrics"):
            steps = [m["step"] for m in r["metrics"]]
            reward = [m["reward"] for m in r["metrics"]]
            line, = a.plot(steps, reward, alpha=0.3)
            a.plot(steps, moving_average(reward, 5), color=line.get_color(), lw=2, label=r.get("label", r["name"]))
    a.set(xlabel="RL step", ylabel="mean reward of the step's samples", title="RL from the supervised start")
    if any(r.get("metrics") for r in table):
        a.legend(fontsize="small")
    acc = [r["heldout"] for r in have]
    half = [1.96 * (r["heldout"] * (1 - r["heldout"]) / r["n"]) ** 0.5 if r["n"] else 0 for r in have]
    y = range(len(have))[::-1]                     # the table's order, top to bottom
    b.barh(y, acc, xerr=half, color=[_colour(r["name"]) for r in have])
    labels = [r.get("label", r["name"]) + ("" if r.get("minutes") is None else f" ({r['minutes']:.0f} min)")
              for r in have]
    b.set_yticks(list(y), labels, fontsize="small")
    sizes = sorted({r.get("size", 3) for r in have})
    b.set(xlabel="greedy accuracy", xlim=(0, 1), title=f"400 held-out {' and '.join(map(str, sizes))}-person puzzles")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="*", help="the folder(s) scripts/smollm2_kk_rl.sh writes")
    ap.add_argument("--heldout", default=HELDOUT_SET,
                    help="the held-out set of each size, {n} the size (a path without {n}: the one set of "
                         "a folder evaluated on one size)")
    ap.add_argument("--size", type=int, help="the trained size, whose table comes first and is drawn "
                    "(default: the RL runs' rl_sizes, else the largest size evaluated)")
    ap.add_argument("--figure", metavar="PNG", help="also one figure of every OUT's rows (each named OUT: policy)")
    ap.add_argument("--control-steps", nargs=2, metavar=("RUN", "START"),
                    help="print the supervised steps matching RUN's RL wall time")
    a = ap.parse_args(argv)
    if a.control_steps:
        print(control_steps(*a.control_steps))
        return 0
    if not a.out:
        ap.error("give OUT or --control-steps")
    try:
        every = []
        for out in a.out:
            sizes = heldout_sizes(out, a.size)
            if len(sizes) > 1 and "{n}" not in a.heldout:
                raise SummaryError(f"{out} has evaluations on {' and '.join(map(str, sizes))} people: "
                                   "give --heldout a path with {n} for the size")
            sets = {n: heldout_set(a.heldout, n) for n in sizes}
            puzzles = {n: {int(p["index"]): p for p in load_jsonl(path)} for n, path in sets.items()}
            tables = {n: rows(out, sets[n], n) for n in sizes}
            text = summary_text(tables, sets, puzzles)
            (Path(out) / "summary.md").write_text(text)
            print(text + figure(tables[sizes[0]], Path(out) / "smollm2-kk-rl.png"))
            every += [dict(r, label=f"{Path(out).name}: {r['name']}") for r in tables[sizes[0]]]
    except SummaryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.figure:
        print(figure(every, a.figure))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
