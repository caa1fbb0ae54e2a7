"""scripts/smollm2_kk_summary.py: the supervised control's budget (the RL run's wall time in
supervised steps) and the differences from the start, paired by held-out puzzle. Synthetic
folders: no model is run."""
from __future__ import annotations

import json

import pytest

from conftest import load_script

summary = load_script("scripts/smollm2_kk_summary.py")


NAMES = ["Ava", "Ben", "Cy"]


def _puzzles(path, solutions: list[tuple]) -> str:
    """A synthetic held-out set: only the fields the summary reads."""
    path.write_text("".join(json.dumps({"index": i, "names": NAMES, "solution": list(sol),
                                        "solution_text_format": _answer(sol)}) + "\n"
                            for i, sol in enumerate(solutions)))
    return str(path)


def _answer(roles: tuple) -> str:
    return "\n".join(f"({k + 1}) {n} is a {'knight' if r else 'knave'}" for k, (n, r) in enumerate(zip(NAMES, roles)))


def _write_eval(folder, correct: list[bool], format_error: float = 0.0, answers: list[tuple] | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    acc = sum(correct) / len(correct)
    (folder / "eval_heldout3.json").write_text(json.dumps(
        {"overall": {"accuracy": acc, "format_error": format_error}}))
    text = [f" x </think>\n<answer> {_answer(a)} </answer>" if answers else "" for a in (answers or correct)]
    (folder / "eval_heldout3.responses.jsonl").write_text("".join(
        json.dumps({"n_people": 3, "index": i, "response": t, "reward": 3.0 if c else -0.5, "correct": c}) + "\n"
        for i, (c, t) in enumerate(zip(correct, text))))


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
