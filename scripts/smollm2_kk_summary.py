"""RL on SmolLM2-135M-Instruct against its start and against more supervised training: the
table and figure of ``scripts/smollm2_kk_rl.sh``'s folder (docs/TASK_AND_MODELS.md).

    python scripts/smollm2_kk_summary.py OUT                 # OUT/summary.md, OUT/smollm2-kk-rl.png
    python scripts/smollm2_kk_summary.py OUT1 OUT2 --figure PNG     # each OUT's, and one figure of all
    python scripts/smollm2_kk_summary.py --control-steps RUN START   # prints N (below)

OUT holds ``start/`` (the start's evaluations), ``rl-s<S>/`` (an RL run's files: metrics.jsonl,
eval_before.json, eval_final.json, and eval_heldout3.json of its final policy) and
``sft-s<S>/`` (the supervised control's warmstart.json and evaluations); ``pilot-*/`` (any
other policy's evaluations, e.g. an interrupted RL run's checkpoint) get a row too.

Design choices:

1. **Paired by puzzle.** Every policy is evaluated greedily on the same 400 held-out 3-person
   puzzles (``data/heldout3.jsonl``, eval.py ``--save-responses``), so a difference of two
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
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lopti_minimal.experiments.stats import paired_diff  # noqa: E402
from lopti_minimal.plots import moving_average  # noqa: E402
from lopti_minimal.task.kk import load_jsonl  # noqa: E402
from lopti_minimal.task.reward import score_response  # noqa: E402

HELDOUT = "eval_heldout3.json"
HELDOUT_SET = "data/heldout3.jsonl"


def control_steps(run_dir, start_dir) -> int:
    """Supervised steps that take as long as the RL run's steps took (design choice 2)."""
    rl_seconds = training_minutes(run_dir) * 60
    history = json.loads((Path(start_dir) / "warmstart.json").read_text())["history"]
    per_step = history[-1]["seconds"] / history[-1]["step"]
    return max(1, round(rl_seconds / per_step))


def correct_by_puzzle(folder) -> dict[int, float] | None:
    """{puzzle index: 1.0 if the greedy response was right} from eval.py's saved responses."""
    path = Path(folder) / HELDOUT.replace(".json", ".responses.jsonl")
    if not path.exists():
        return None
    return {int(r["index"]): float(bool(r["correct"])) for r in load_jsonl(path)}


def assignment(record: dict) -> tuple:
    """A puzzle's solution as a tuple of roles in the order of its names (True = knight)."""
    return tuple(bool(x) for x in record["solution"])


def answer_prior(folder, puzzles: dict[int, dict]) -> dict | None:
    """Design choice 4, from a policy's saved greedy responses: ``same_answer`` = the share
    of its responses that give its commonest role assignment (unparsed ones count as
    distinct), ``rest`` = its accuracy on the puzzles whose solution is not the set's
    commonest, and ``rest_n`` = how many those are."""
    path = Path(folder) / HELDOUT.replace(".json", ".responses.jsonl")
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


def rows(out, heldout_set=HELDOUT_SET) -> list[dict]:
    """One row per policy: the start, each RL run, each supervised control, and each
    ``pilot-*`` folder (a shorter run's evaluation, such as an unfinished run's checkpoint)."""
    out = Path(out)
    puzzles = {int(p["index"]): p for p in load_jsonl(heldout_set)}
    start = correct_by_puzzle(out / "start")
    found = [("start", out / "start")] + [(p.name, p) for pattern in ("rl-s*", "sft-s*", "pilot-*")
                                          for p in sorted(out.glob(pattern))]
    table = []
    for name, folder in found:
        held, mine = _overall(folder, HELDOUT), correct_by_puzzle(folder)
        official = _overall(folder, "eval_final.json") or _overall(folder, "eval_official3.json")
        row = {"name": name, "heldout": held and held["accuracy"], "format_error": held and held["format_error"],
               "n": len(mine) if mine else None,
               "official": official and official["accuracy"], "vs_start": None,
               "prior": answer_prior(folder, puzzles), "minutes": training_minutes(folder)}
        if name != "start" and mine and start:
            row["vs_start"] = paired_diff(mine, start)
            row["lost"] = sum(1 for i, c in mine.items() if start.get(i) and not c)
            row["gained"] = sum(1 for i, c in mine.items() if c and i in start and not start[i])
        if (folder / "metrics.jsonl").exists():
            row["metrics"] = load_jsonl(folder / "metrics.jsonl")
        table.append(row)
    return table


def _f(v) -> str:
    return "" if v is None else f"{v:.3f}"


def markdown(table: list[dict]) -> str:
    lines = ["| policy | held-out greedy (400) | minus the start [paired 95% CI] (puzzles lost, gained) | "
             "format errors | same answer | held-out, solution not the commonest | "
             "official 3-person (100) | training minutes | RL steps | mean reward: first 5 -> last 5 steps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        d = r["vs_start"]
        diff = (f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] "
                f"(lost {r['lost']}, gained {r['gained']})") if d else ""
        ms = r.get("metrics") or []
        reward = (f"{sum(m['reward'] for m in ms[:5]) / len(ms[:5]):+.3f} -> "
                  f"{sum(m['reward'] for m in ms[-5:]) / len(ms[-5:]):+.3f}") if ms else ""
        prior = r.get("prior") or {}
        rest = f"{_f(prior.get('rest'))} (of {prior['rest_n']})" if prior.get("rest_n") else ""
        minutes = "" if r.get("minutes") is None else f"{r['minutes']:.1f}"
        lines.append(f"| {r['name']} | {_f(r['heldout'])} | {diff} | {_f(r['format_error'])} | "
                     f"{_f(prior.get('same_answer'))} | {rest} | "
                     f"{_f(r['official'])} | {minutes} | {len(ms) or ''} | {reward} |")
    return "\n".join(lines) + "\n"


def _colour(name: str) -> str:
    """The start gray, RL (``rl-s*``, ``pilot-rl-*``) red, supervised training blue."""
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
    b.set(xlabel="greedy accuracy", xlim=(0, 1), title="400 held-out 3-person puzzles")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="*", help="the folder(s) scripts/smollm2_kk_rl.sh writes")
    ap.add_argument("--heldout", default=HELDOUT_SET, help="the held-out set the policies were evaluated on")
    ap.add_argument("--figure", metavar="PNG", help="also one figure of every OUT's rows (each named OUT: policy)")
    ap.add_argument("--control-steps", nargs=2, metavar=("RUN", "START"),
                    help="print the supervised steps matching RUN's RL wall time")
    a = ap.parse_args(argv)
    if a.control_steps:
        print(control_steps(*a.control_steps))
        return 0
    if not a.out:
        ap.error("give OUT or --control-steps")
    puzzles = {int(p["index"]): p for p in load_jsonl(a.heldout)}
    every = []
    for out in a.out:
        table = rows(out, a.heldout)
        text = markdown(table) + (f"\nA constant answer scores at most {commonest_solution(puzzles)[1]:.3f} on the "
                                  f"held-out set (its commonest solution's share).\n")
        (Path(out) / "summary.md").write_text(text)
        print(text + figure(table, Path(out) / "smollm2-kk-rl.png"))
        every += [dict(r, label=f"{Path(out).name}: {r['name']}") for r in table]
    if a.figure:
        print(figure(every, a.figure))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
