"""Nothing lost, nothing mislabelled: each resume, option and input file either does what
it says or is refused in one line, exit code 2, before anything is written (train.py,
plumbing.Run, config.validate, task/evaluate.read_records; the study runner's signals:
tests/test_study_signals.py)."""
import hashlib
import json
from pathlib import Path

import pytest

import train as train_cli
from test_resume_safety import one_line
from test_trainer import interrupting_reward, length_reward, small_cfg
from lopti_minimal import runs, trainer
from lopti_minimal.task import dataset, kk
from lopti_minimal.task.evaluate import read_records


def snapshot(folder: Path) -> dict:
    """{relative path: md5} of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def interrupted(nano_dir, tmp_path):
    """A 4-step run stopped during step 3, its latest checkpoint ckpt-000002."""
    cfg = small_cfg(nano_dir, tmp_path, threads=1, run_dir=str(tmp_path / "interrupted"))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg, reward_fn=interrupting_reward(2))
    run = Path(cfg.run_dir)
    assert [s for s, _ in runs.checkpoints(run)] == [2]
    return run


@pytest.fixture
def finished(nano_dir, tmp_path):
    """A finished 2-step run with its final evaluation (4 official 3-person puzzles)."""
    cfg = small_cfg(nano_dir, tmp_path, steps=2, threads=1, final_eval=True, eval_per_size=4,
                    eval_max_new_tokens={3: 8}, run_dir=str(tmp_path / "finished"))
    trainer.train(cfg, reward_fn=length_reward)
    return Path(cfg.run_dir)


def test_a_resume_that_would_shrink_a_run_is_refused_and_writes_nothing(interrupted, finished, capsys):
    for run in (interrupted, finished):
        before = snapshot(run)
        assert train_cli.main(["--resume", str(run), "--steps", "1", "--no-progress"]) == 2
        assert "not shrink it" in one_line(capsys.readouterr().err)
        assert snapshot(run) == before


def test_a_finished_run_resumed_at_its_length_changes_nothing(finished, capsys):
    before = snapshot(finished)
    for _ in range(3):
        assert train_cli.main(["--resume", str(finished), "--no-progress"]) == 0
        assert "nothing to do" in capsys.readouterr().out
    assert snapshot(finished) == before
    assert (finished / "evals.jsonl").read_text().count('"final"') == 1


def test_extending_a_finished_run_keeps_one_final_evaluation(finished):
    cfg = train_cli.build_config(train_cli.parse_args(["--resume", str(finished), "--steps", "3",
                                                       "--no-progress"]))
    trainer.train(cfg, resume=True, reward_fn=length_reward)
    lines = runs.read_jsonl(finished / "evals.jsonl")
    assert [x["step"] for x in lines if x.get("final")] == [3]
    assert json.loads((finished / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("extra, words", [
    (["--run-dir", "elsewhere"], "its own folder"),
    (["--preset", "cpu-tiny"], "--preset cpu-tiny (saved: ci)"),
    (["--rebuild-warmstart"], "run them apart"),
])
def test_options_a_resume_would_drop_are_refused(interrupted, extra, words, capsys):
    before = snapshot(interrupted)
    with pytest.raises(SystemExit) as e:
        raise SystemExit(train_cli.main(["--resume", str(interrupted), "--no-progress"] + extra))
    assert e.value.code == 2 and words in one_line(capsys.readouterr().err)
    assert snapshot(interrupted) == before


def test_the_saved_preset_repeated_on_resume_is_fine(interrupted):
    cfg = train_cli.build_config(train_cli.parse_args(["--resume", str(interrupted), "--preset", "ci"]))
    assert cfg.preset == "ci" and cfg.run_dir == str(interrupted)


def k_and_k_file(path: Path, n: int = 10) -> Path:
    kk.save_jsonl(dataset.generate_records(3, n, seed=77), path)
    return path


def test_a_changed_data_file_is_refused_on_resume_unless_allowed(nano_dir, tmp_path, capsys):
    data = k_and_k_file(tmp_path / "puzzles.jsonl")
    cfg = small_cfg(nano_dir, tmp_path, threads=1, rl_data=str(data))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg, reward_fn=interrupting_reward(2))
    run = Path(cfg.run_dir)
    saved = json.loads((run / "run.json").read_text())
    assert saved["data_sha256"] == runs.file_sha256(data)
    kk.save_jsonl(dataset.generate_records(3, 10, seed=78), data, overwrite=True)   # other puzzles
    before = snapshot(run)
    capsys.readouterr()
    assert train_cli.main(["--resume", str(run), "--no-progress"]) == 2
    assert "changed since" in one_line(capsys.readouterr().err) and snapshot(run) == before
    # told, it goes on, and run.json says so
    cfg = train_cli.build_config(train_cli.parse_args(["--resume", str(run), "--allow-changed-data"]))
    trainer.train(cfg, resume=True, reward_fn=length_reward, allow_changed_data=True)
    saved = json.loads((run / "run.json").read_text())
    assert saved["resumed"][-1]["data_changed_from"] != saved["data_sha256"] == runs.file_sha256(data)


def test_allow_changed_data_without_resume_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        train_cli.parse_args(["--allow-changed-data"])
    assert e.value.code == 2 and "for --resume" in one_line(capsys.readouterr().err)


def bad_record_file(tmp_path, change) -> Path:
    recs = dataset.generate_records(3, 3, seed=5)
    lines = [json.dumps(r) for r in recs]
    lines[2] = change(recs[2])
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines[:1] + [""] + lines[1:]) + "\n")    # a blank line: line 4 holds record 3
    return p


@pytest.mark.parametrize("change, words", [
    (lambda r: json.dumps({**r, "solution": r["solution"][:2]}), "line 4 is not a K&K record: solution: 3"),
    (lambda r: json.dumps({**r, "n_people": 4}), "line 4 is not a K&K record: n_people 4"),
    (lambda r: json.dumps({**r, "names": r["names"][:2]}), "line 4 is not a K&K record: solution_text_format names"),
    (lambda r: json.dumps({**r, "solution": [not x for x in r["solution"]]}), "solution disagrees"),
    (lambda r: json.dumps({**r, "quiz": ""}), "quiz: missing or empty"),
    (lambda r: json.dumps(r)[:-5], "line 4 is not JSON"),
    (lambda r: "[1, 2]", "a K&K record is a JSON object"),
])
def test_k_and_k_records_are_checked_field_by_field_with_their_line(tmp_path, change, words):
    with pytest.raises(ValueError) as e:
        read_records(bad_record_file(tmp_path, change))
    assert words in str(e.value) and len(str(e.value).splitlines()) == 1


def test_strict_json_lines_round_trip(tmp_path):
    p = tmp_path / "m.jsonl"
    runs.append_jsonl(p, {"step": 1, "reward": float("nan"), "bins": [0.5, float("inf")], "ok": 2.0})

    def refuse(c):
        raise ValueError(c)
    line = json.loads(p.read_text(), parse_constant=refuse)
    assert line["reward"] is None and line["bins"] == [0.5, None]
    assert line[runs.NONFINITE_FIELD] == {"reward": "nan", "bins.1": "inf"}
    back = runs.read_jsonl(p)[0]
    assert back["reward"] != back["reward"] and back["bins"] == [0.5, float("inf")] and back["ok"] == 2.0
    runs.truncate_jsonl(p, 1)
    assert runs.read_jsonl(p)[0]["bins"][1] == float("inf")


def test_a_full_disk_leaves_the_last_checkpoint_and_says_so_in_one_line(interrupted, monkeypatch, capsys):
    """A write that fails (here: save_pretrained on a full disk) removes its temporary folder,
    leaves the previous checkpoint as it was, and train.py says it in one line, exit 1."""
    import errno
    import transformers
    before = snapshot(interrupted / "ckpt-000002")

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    capsys.readouterr()
    assert train_cli.main(["--resume", str(interrupted), "--no-progress"]) == 1
    err = one_line(capsys.readouterr().err.split("it/s]")[-1])
    assert "cannot write" in err and "No space left" in err and "--resume" in err
    assert snapshot(interrupted / "ckpt-000002") == before
    assert not list(interrupted.glob("*.tmp")) and not (interrupted / ".lock").exists()


def test_one_process_writes_a_run_at_a_time(interrupted, capsys):
    """RUN_DIR/.lock: a resume while another process holds the run is refused in one line;
    a lock left by a process that is gone is taken over."""
    import subprocess
    import sys
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (interrupted / ".lock").write_text(str(other.pid))
        before = snapshot(interrupted)
        assert train_cli.main(["--resume", str(interrupted), "--no-progress"]) == 2
        assert f"in use by process {other.pid}" in one_line(capsys.readouterr().err)
        assert snapshot(interrupted) == before
    finally:
        other.kill()
        other.wait()
    cfg = train_cli.build_config(train_cli.parse_args(["--resume", str(interrupted)]))
    trainer.train(cfg, resume=True, reward_fn=length_reward)       # the dead process's lock is taken over
    assert not (interrupted / ".lock").exists() and (interrupted / "final").is_dir()


def test_a_run_folder_that_cannot_be_made_is_refused_before_loading(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert train_cli.main(["--preset", "ci", "--run-dir", str(tmp_path / "afile" / "run"), "--no-progress"]) == 2
    assert "cannot create it" in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("args, words", [
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--threads", "-1"], "--threads must be >= 1"),
    (["--only", "nosuch"], "no such method or variant"),
])
def test_study_options_that_select_nothing_are_refused(args, words, tmp_path, capsys):
    from lopti_minimal.experiments import study
    assert study.main(["--preset", "ci", "--out", str(tmp_path / "st"), "--dry-run"] + args) == 2
    assert words in one_line(capsys.readouterr().err) and not (tmp_path / "st").exists()
    (tmp_path / "file").write_text("x")
    assert study.main(["--preset", "ci", "--out", str(tmp_path / "file"), "--dry-run"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_sigterm_stops_train_py_like_ctrl_c():
    with pytest.raises(KeyboardInterrupt):
        train_cli._interrupt(15, None)
