"""scripts/smollm2_kk_summary.py: the supervised control's budget (the RL run's wall time in
supervised steps) and the differences from the start, paired by held-out puzzle. Synthetic
folders: no model is run."""
from __future__ import annotations

import json

import pytest

from conftest import load_script

summary = load_script("scripts/smollm2_kk_summary.py")


def _write_eval(folder, correct: list[bool], format_error: float = 0.0):
    folder.mkdir(parents=True, exist_ok=True)
    acc = sum(correct) / len(correct)
    (folder / "eval_heldout3.json").write_text(json.dumps(
        {"overall": {"accuracy": acc, "format_error": format_error}}))
    (folder / "eval_heldout3.responses.jsonl").write_text("".join(
        json.dumps({"n_people": 3, "index": i, "response": "", "reward": 3.0 if c else -0.5, "correct": c}) + "\n"
        for i, c in enumerate(correct)))


def test_control_steps_match_the_rl_wall_time(tmp_path):
    run, start = tmp_path / "run", tmp_path / "start"
    run.mkdir(), start.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "step_s": 120.0}) + "\n" for k in range(1, 31)))
    history = [{"step": k, "loss": 1.0, "lr": 1e-3, "seconds": 12.0 * k} for k in range(1, 251)]
    (start / "warmstart.json").write_text(json.dumps({"history": history}))
    assert summary.control_steps(run, start) == 300           # 3,600 s / 12 s per step


def test_differences_pair_by_puzzle(tmp_path):
    """One puzzle lost, three gained: +0.2 on 10 puzzles; the interval is the per-puzzle t
    interval, not the one of two independent proportions."""
    start = [True, True, False, False, False, False, False, False, False, False]
    rl = [True, False, True, True, True, False, False, False, False, False]
    _write_eval(tmp_path / "start", start)
    _write_eval(tmp_path / "rl-s0", rl)
    rows = {r["name"]: r for r in summary.rows(tmp_path)}
    d = rows["rl-s0"]["vs_start"]
    assert rows["start"]["vs_start"] is None
    assert d["n"] == 10 and d["mean"] == pytest.approx(0.2)
    diffs = [a - b for a, b in zip(rl, start)]
    sd = (sum((x - 0.2) ** 2 for x in diffs) / 9) ** 0.5
    assert d["hi"] - d["mean"] == pytest.approx(2.262 * sd / 10 ** 0.5)
    text = summary.markdown(list(rows.values()))
    assert "| rl-s0 | 0.400 | +0.200 [" in text
    summary.figure(list(rows.values()), tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
