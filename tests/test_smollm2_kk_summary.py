"""scripts/smollm2_kk_summary.py: the supervised control's budget (the RL run's wall time in
supervised steps) and the differences from the start, paired by held-out puzzle. Synthetic
folders: no model is run."""
from __future__ import annotations

import json

import pytest

from conftest import load_script

summary = load_script("scripts/smollm2_kk_summary.py")


NAMES = ["Ava", "Ben", "Cy"]
NAMES4 = ["Ava", "Ben", "Cy", "Dee"]


def _puzzles(path, solutions: list[tuple]) -> str:
    """A synthetic held-out set: only the fields the summary reads (names: one per role)."""
    path.write_text("".join(json.dumps({"index": i, "names": _names(sol), "solution": list(sol),
                                        "solution_text_format": _answer(sol)}) + "\n"
                            for i, sol in enumerate(solutions)))
    return str(path)


def _names(roles: tuple) -> list[str]:
    return NAMES if len(roles) == 3 else NAMES4


def _answer(roles: tuple) -> str:
    return "\n".join(f"({k + 1}) {n} is a {'knight' if r else 'knave'}"
                     for k, (n, r) in enumerate(zip(_names(roles), roles)))


def _write_eval(folder, correct: list[bool], format_error: float = 0.0, answers: list[tuple] | None = None,
                size: int = 3):
    """eval.py's held-out evaluation of a policy on size-person puzzles, its responses saved."""
    folder.mkdir(parents=True, exist_ok=True)
    acc = sum(correct) / len(correct)
    (folder / f"eval_heldout{size}.json").write_text(json.dumps(
        {"overall": {"accuracy": acc, "format_error": format_error}}))
    text = [f" x </think>\n<answer> {_answer(a)} </answer>" if answers else "" for a in (answers or correct)]
    (folder / f"eval_heldout{size}.responses.jsonl").write_text("".join(
        json.dumps({"n_people": size, "index": i, "response": t, "reward": 3.0 if c else -0.5, "correct": c}) + "\n"
        for i, (c, t) in enumerate(zip(correct, text))))


def _write_run(folder, method: str, metrics: list[dict], rl_sizes=(4,), alpha=None, eta=None):
    """An RL run's run.json (its config) and metrics.jsonl (step_s and reward added)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps({"config": {"method": method, "alpha": alpha, "eta": eta,
                                                            "rl_sizes": list(rl_sizes)}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(dict(m, step=k + 1, step_s=60.0, reward=1.0)) + "\n"
                                                  for k, m in enumerate(metrics)))


def _official(folder, name: str, size: int, accuracy: float):
    (folder / name).write_text(json.dumps({"per_size": {str(size): {"accuracy": accuracy}},
                                           "overall": {"accuracy": accuracy}}))


def test_control_steps_match_the_rl_wall_time(tmp_path):
    run, start = tmp_path / "run", tmp_path / "start"
    run.mkdir(), start.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "step_s": 120.0}) + "\n" for k in range(1, 31)))
    history = [{"step": k, "loss": 1.0, "lr": 1e-3, "seconds": 12.0 * k} for k in range(1, 251)]
    (start / "warmstart.json").write_text(json.dumps({"history": history}))
    assert summary.control_steps(run, start) == 300           # 3,600 s / 12 s per step
    assert summary.training_minutes(run) == 60.0              # RL: the summed step times
    assert summary.training_minutes(start) == 50.0            # supervised: 250 x 12 s
    assert summary.training_minutes(tmp_path) is None


def test_differences_pair_by_puzzle(tmp_path):
    """One puzzle lost, three gained: +0.2 on 10 puzzles; the interval is the per-puzzle t
    interval, not the one of two independent proportions."""
    start = [True, True, False, False, False, False, False, False, False, False]
    rl = [True, False, True, True, True, False, False, False, False, False]
    _write_eval(tmp_path / "start", start)
    _write_eval(tmp_path / "rl-s0", rl)
    _write_eval(tmp_path / "pilot-rl-s0-step10", start)     # an unfinished run's checkpoint
    heldout = _puzzles(tmp_path / "set.jsonl", [(True, True, True)] * 10)
    rows = {r["name"]: r for r in summary.rows(tmp_path, heldout)}
    assert list(rows) == ["start", "rl-s0", "pilot-rl-s0-step10"]
    assert rows["pilot-rl-s0-step10"]["vs_start"]["mean"] == 0.0
    d = rows["rl-s0"]["vs_start"]
    assert rows["start"]["vs_start"] is None
    assert d["n"] == 10 and d["mean"] == pytest.approx(0.2)
    diffs = [a - b for a, b in zip(rl, start)]
    sd = (sum((x - 0.2) ** 2 for x in diffs) / 9) ** 0.5
    assert d["hi"] - d["mean"] == pytest.approx(2.262 * sd / 10 ** 0.5)
    text = summary.markdown(list(rows.values()))
    assert "| rl-s0 | 0.400 | +0.200 [" in text and "(lost 1, gained 3)" in text
    summary.figure(list(rows.values()), tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_identical_responses_count_the_puzzles_where_the_policy_did_not_change(tmp_path):
    """Same accuracy is not the same policy: a run that loses one puzzle and gains another
    is level (+0.000) but changed two responses; a copy of the start changed none."""
    knights, other = (True, True, True), (True, False, True)
    solutions = [knights, other, knights, other]
    heldout = _puzzles(tmp_path / "set.jsonl", solutions)
    _write_eval(tmp_path / "start", [True, False, True, True], answers=[knights, knights, knights, other])
    _write_eval(tmp_path / "rl-s0", [False, True, True, True], answers=[other, other, knights, other])
    _write_eval(tmp_path / "rl-s1", [True, False, True, True], answers=[knights, knights, knights, other])
    rows = {r["name"]: r for r in summary.rows(tmp_path, heldout)}
    assert rows["rl-s0"]["vs_start"]["mean"] == 0.0 and rows["rl-s0"]["identical"] == 2
    assert rows["rl-s1"]["identical"] == 4 and "identical" not in rows["start"]
    text = summary.markdown(list(rows.values()))
    assert text.splitlines()[3].endswith("| 2 of 4 |") and text.splitlines()[2].endswith("|  |")


def test_a_constant_answer_shows_as_the_answer_prior(tmp_path):
    """A policy that answers "all knights" everywhere is right exactly on the all-knight
    puzzles: its accuracy equals the constant-answer score, every answer is the same one,
    and it gets none of the other puzzles; a policy that gives each puzzle its solution
    gets them all."""
    knights, other = (True, True, True), (True, False, True)
    solutions = [knights] * 3 + [other] * 2 + [(False, False, True)] * 2 + [(False, True, False)]
    heldout = _puzzles(tmp_path / "set.jsonl", solutions)
    _write_eval(tmp_path / "start", [True] * 8, answers=solutions)
    _write_eval(tmp_path / "rl-s0", [s == knights for s in solutions], answers=[knights] * 8)
    rows = {r["name"]: r for r in summary.rows(tmp_path, heldout)}
    puzzles = {i: json.loads(line) for i, line in enumerate((tmp_path / "set.jsonl").read_text().splitlines())}
    assert summary.commonest_solution(puzzles) == (knights, 3 / 8)
    assert rows["rl-s0"]["heldout"] == 3 / 8
    assert rows["rl-s0"]["prior"] == {"same_answer": 1.0, "rest": 0.0, "rest_n": 5}
    assert rows["start"]["prior"] == {"same_answer": 3 / 8, "rest": 1.0, "rest_n": 5}
    assert "| rl-s0 | 0.375 |" in summary.markdown(list(rows.values()))


def test_several_folders_get_their_own_summary_and_one_figure(tmp_path, capsys, monkeypatch):
    """Each OUT keeps its own summary.md (differences from its own start); --figure draws
    the rows of all of them, each labelled with its folder."""
    heldout = _puzzles(tmp_path / "set.jsonl", [(True, True, True)] * 4)
    for name, start, rl in (("a", [True, False, False, False], [True, True, False, False]),
                            ("b", [True, True, True, False], [True, True, False, False])):
        _write_eval(tmp_path / name / "start", start)
        _write_eval(tmp_path / name / "rl-s0", rl)
    png, drawn, draw = tmp_path / "both.png", [], summary.figure
    monkeypatch.setattr(summary, "figure", lambda table, path: drawn.append(table) or draw(table, path))
    assert summary.main([str(tmp_path / "a"), str(tmp_path / "b"), "--heldout", heldout, "--figure", str(png)]) == 0
    assert "| rl-s0 | 0.500 | +0.250 [" in (tmp_path / "a" / "summary.md").read_text()
    assert "| rl-s0 | 0.500 | -0.250 [" in (tmp_path / "b" / "summary.md").read_text()
    assert png.stat().st_size > 0 and (tmp_path / "b" / "smollm2-kk-rl.png").exists()
    assert str(png) in capsys.readouterr().out
    assert [r.get("label") for r in drawn[-1]] == ["a: start", "a: rl-s0", "b: start", "b: rl-s0"]


def _four_person_folder(tmp_path):
    """After RL on 4 people (smollm2_kk_rl.sh SIZE=4): every policy evaluated on held-out 4-
    and 3-person puzzles, GRPO and AR+Lopti runs (the latter with dynamic sampling) logging
    the token metrics, a supervised control, the official 4-person set."""
    out = tmp_path / "kk4"
    _puzzles(tmp_path / "set4.jsonl", [(True, True, True, True)] * 4)
    _puzzles(tmp_path / "set3.jsonl", [(True, True, True)] * 4)
    _write_eval(out / "start", [True, False, False, False], size=4)
    _write_eval(out / "start", [True, True, True, False], size=3)
    _official(out / "start", "eval_official4.json", 4, 0.4)
    _write_run(out / "rl-grpo-s0", "grpo", [{"zero_adv_groups": 0.5, "pi_old_below_half": 0.02},
                                            {"zero_adv_groups": 0.25, "pi_old_below_half": 0.04}])
    _official(out / "rl-grpo-s0", "eval_final.json", 4, 0.5)
    _write_eval(out / "rl-grpo-s0", [True, True, True, False], size=4)       # +0.5 on 4 people
    _write_eval(out / "rl-grpo-s0", [True, True, False, False], size=3)      # -0.25 on 3
    _write_run(out / "rl-ar_lopti-s0", "ar_lopti", [
        {"zero_adv_groups": 0.5, "pi_old_below_half": 0.1, "ar_weight": 0.8, "stage1_share": 0.1,
         "kept_groups": 4, "gen_rounds": 2},
        {"zero_adv_groups": 0.0, "pi_old_below_half": 0.2, "ar_weight": 0.9, "stage1_share": 0.2,
         "kept_groups": 3, "gen_rounds": 1}], alpha=0.3, eta=0.5)
    _write_eval(out / "rl-ar_lopti-s0", [True, True, False, False], size=4)
    _write_eval(out / "rl-ar_lopti-s0", [True, True, True, False], size=3)
    _write_eval(out / "sft-s0", [True, False, True, False], size=4)
    (out / "sft-s0" / "warmstart.json").write_text(json.dumps({"history": [{"step": 10, "seconds": 600.0}]}))
    return out


def test_a_four_person_folder_gets_a_table_per_size_and_the_token_table(tmp_path):
    out = _four_person_folder(tmp_path)
    assert summary.heldout_sizes(out) == [4, 3]                 # the runs' rl_sizes first
    assert summary.heldout_sizes(out, 3) == [3, 4]              # --size
    assert summary.main([str(out), "--heldout", str(tmp_path / "set{n}.jsonl")]) == 0
    text = (out / "summary.md").read_text()
    four, three = text.index("**Held-out 4-person puzzles**"), text.index("**Held-out 3-person puzzles**")
    tokens = text.index("Per RL run")
    assert four < three < tokens
    t4, t3 = text[four:three], text[three:tokens]
    assert "official 4-person (100)" in t4 and "official 3-person (100)" in t3
    # paired against the start on each size's own puzzles; the official column from
    # eval_official4.json (start) and train.py's eval_final.json (RL), none on 3 people
    assert "| start | 0.250 |  | 0.000 |" in t4 and "| 0.400 |" in t4.split("\n| rl-")[0]
    assert "| rl-grpo-s0 | 0.750 | +0.500 [" in t4 and "(lost 0, gained 2)" in t4 and "| 0.500 | 2.0 | 2 |" in t4
    assert "| rl-grpo-s0 | 0.500 | -0.250 [" in t3 and "(lost 1, gained 0)" in t3
    assert "| sft-s0 | 0.500 | +0.250 [" in t4 and "| sft-s0 |  |" in t3     # the control: no 3-person eval
    # the order of the rows: start, rl-* (sorted), sft-*
    assert [line.split(" | ")[0] for line in t4.splitlines() if line.startswith("| ") and "---" not in line][1:] == \
        ["| start", "| rl-ar_lopti-s0", "| rl-grpo-s0", "| sft-s0"]
    # per run, the means over its steps; "–" where its method logs nothing
    assert ("| rl-ar_lopti-s0 | ar_lopti (alpha 0.3, eta 0.5) | 2 | 0.250 | 0.1500 | 0.850 | 0.1500 | 3.50 | 1.50 |"
            in text[tokens:])
    assert "| rl-grpo-s0 | grpo | 2 | 0.375 | 0.0300 | – | – | – | – |" in text[tokens:]
    assert "sft-s0" not in text[tokens:]
    assert (out / "smollm2-kk-rl.png").stat().st_size > 0
    # the trained size is the runs' own, not the largest evaluated
    for run in ("rl-grpo-s0", "rl-ar_lopti-s0"):
        cfg = json.loads((out / run / "run.json").read_text())
        cfg["config"]["rl_sizes"] = [3]
        (out / run / "run.json").write_text(json.dumps(cfg))
    assert summary.heldout_sizes(out) == [3, 4]


def test_an_older_folder_keeps_its_one_table_and_gets_dashes_for_the_new_metrics(tmp_path):
    """A 3-person folder from before the token metrics: the one table it always had, no
    heading, and its runs' groups of equal rewards (logged since the first runs) beside –."""
    heldout = _puzzles(tmp_path / "set.jsonl", [(True, True, True)] * 4)
    _write_eval(tmp_path / "start", [True, False, False, False])
    _write_eval(tmp_path / "rl-s0", [True, True, False, False])
    _write_run(tmp_path / "rl-s0", "ar_lopti", [{"zero_adv_groups": 0.75}, {"zero_adv_groups": 0.25}],
               rl_sizes=(3,), alpha=0.3, eta=0.5)
    assert summary.main([str(tmp_path), "--heldout", heldout]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("| policy | held-out greedy (400) |") and "**Held-out" not in text
    assert "official 3-person (100)" in text
    assert "| rl-s0 | ar_lopti (alpha 0.3, eta 0.5) | 2 | 0.500 | – | – | – | – | – |" in text


def test_bad_held_out_options_are_one_line_and_exit_2(tmp_path, capsys):
    out = _four_person_folder(tmp_path)
    assert summary.main([str(out), "--heldout", str(tmp_path / "set4.jsonl")]) == 2      # two sizes, one set
    assert summary.main([str(out), "--heldout", str(tmp_path / "nope{n}.jsonl")]) == 2   # no such set
    assert summary.main([str(out), "--size", "5", "--heldout", str(tmp_path / "set{n}.jsonl")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "with {n}" in err[0] and "no such held-out set" in err[1] and "5-person" in err[2]


def test_an_older_runs_low_fraction_is_read_as_the_token_shares_it_equals():
    """Before pi_old_below_half and stage1_share were logged, low_fraction was the share of
    tokens below the run's eta (0.5 unless a Lopti method set another)."""
    steps = [{"low_fraction": 0.1}, {"low_fraction": 0.3}]
    ar_lopti = summary.token_means(steps, {"method": "ar_lopti", "alpha": 0.3, "eta": 0.5})
    assert ar_lopti["pi_old_below_half"] == pytest.approx(0.2) == ar_lopti["stage1_share"]
    lopti = summary.token_means(steps, {"method": "lopti", "eta": 0.4})        # eta 0.4: not the 0.5 share
    assert lopti["pi_old_below_half"] is None and lopti["stage1_share"] == pytest.approx(0.2)
    high = summary.token_means(steps, {"method": "lopti", "eta": 0.5, "lopti_order": "high_first"})
    assert high["stage1_share"] is None and high["pi_old_below_half"] == pytest.approx(0.2)
    grpo = summary.token_means(steps + [{"low_fraction": 0.5, "pi_old_below_half": 0.6}], {"method": "grpo"})
    assert grpo["pi_old_below_half"] == pytest.approx(1.0 / 3) and grpo["stage1_share"] is None


def test_the_reward_trend_compares_disjoint_steps():
    """First and last k steps, k = 5 or half a shorter run: a 6-step run's first and last
    three, not two windows of five that share four steps."""
    steps = lambda n: [{"reward": float(r)} for r in range(n)]    # noqa: E731
    assert summary._reward_trend(steps(6)) == "+1.000 -> +4.000"
    assert summary._reward_trend(steps(30)) == "+2.000 -> +27.000"
    assert summary._reward_trend(steps(1)) == "+0.000 -> +0.000"
    assert summary._reward_trend([]) == ""
