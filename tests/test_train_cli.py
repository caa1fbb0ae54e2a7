"""train.py: the CI preset end to end, and bad input -> one line, exit code 2, nothing
written. (No timing assertions: speed is measured by benchmarks/, not by tests.)"""
import json
import os
import subprocess
import sys
import time

import pytest

import train as train_cli

from conftest import ROOT

WARM = ROOT / "checkpoints" / "tiny-warm" / "config.json"


def run_cli(*args, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("LOPTI_TEST_THREADS", "2"))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--no-progress",
                        "--threads", env["OMP_NUM_THREADS"]],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    return p, time.perf_counter() - t


def test_ci_preset_end_to_end(nano_dir, tmp_path):
    model = [] if WARM.exists() else ["--model", nano_dir]     # the shipped model once it exists
    p, _ = run_cli("--preset", "ci", "--run-dir", str(tmp_path / "run"), *model)
    assert p.returncode == 0, p.stderr[-2000:]
    run = tmp_path / "run"
    for f in ("run.json", "metrics.jsonl", "eval_final.json", "final/config.json", "training.png",
              "accuracy_by_size.png", "summary.json"):
        assert (run / f).exists(), f
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and {"reward", "accuracy", "derive_share", "kl", "clip_frac", "grad_norm",
                                "low_fraction", "step_s", "peak_rss_gb"} <= set(json.loads(lines[0]))
    # the host's peak resident memory per step and for the run (host_memory.py): a plausible size
    assert all(0.1 < json.loads(l)["peak_rss_gb"] < 8 for l in lines)
    assert 0.1 < json.loads((run / "summary.json").read_text())["peak_rss_gb_this_session"] < 8
    # the longest response of the step: at least the mean, at most the budget
    assert all(json.loads(l)["response_len"] <= json.loads(l)["max_len"] <= 48 for l in lines)
    assert "step    1/2 | reward" in p.stdout and "Done. Everything is in" in p.stdout
    # run.json names what the run ran on: bf16 results depend on the CPU and the torch build
    import torch, transformers
    machine = json.loads((run / "run.json").read_text())["machine"]
    assert machine["threads"] == int(os.environ.get("LOPTI_TEST_THREADS", "2")) and machine["torch"] == torch.__version__
    assert machine["transformers"] == transformers.__version__ and machine["cpu"]
    # Resume of a finished run with more steps extends it.
    p, _ = run_cli("--resume", str(run), "--steps", "3")
    assert p.returncode == 0, p.stderr[-2000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("args, words", [
    (["--method", "ppo"], "unknown method"),
    (["--alpha", "1.2"], "alpha"),
    (["--eta", "0"], "eta"),
    (["--group-size", "1"], "group-size"),
    (["--preset", "nope"], "unknown preset"),
    (["--alpha", "abc"], "invalid float"),
    (["--rl-sizes", "3,x"], "people per puzzle"),
    (["--rl-sizes", "1"], "2..8"),
    (["--data", "/nonexistent/puzzles.jsonl"], "cannot read"),
    (["--model", "/nonexistent/model"], "not found"),
    (["--eval-sizes", "8"], "official test sets hold 3,4,5,6,7"),       # refused before training
    (["--method", "grpo", "--lopti-optimizer", "per_stage"], "applies to Lopti"),
    (["--method", "ar", "--lopti-split", "random"], "applies to Lopti"),
    (["--warmstart-minutes", "5"], "give both, or neither"),
])
def test_bad_input_one_line_exit_2_nothing_written(args, words, tmp_path, capsys, nano_dir):
    run = tmp_path / "run"
    model = [] if "--model" in args else ["--model", nano_dir]
    with pytest.raises(SystemExit) as e:
        raise SystemExit(train_cli.main(args + model + ["--run-dir", str(run), "--no-progress",
                                                        "--preset" if "--preset" not in args else "--seed",
                                                        "ci" if "--preset" not in args else "0"]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not run.exists()


def test_resume_of_a_non_run_is_refused(tmp_path, capsys):
    (tmp_path / "somefile").write_text("x")
    assert train_cli.main(["--resume", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a lopti-minimal run" in err
    assert sorted(os.listdir(tmp_path)) == ["somefile"]


def test_existing_run_dir_is_not_overwritten(tmp_path, capsys, nano_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("mine")
    assert train_cli.main(["--preset", "ci", "--model", nano_dir, "--run-dir", str(run), "--no-progress"]) == 2
    assert "exists" in capsys.readouterr().err
    assert sorted(os.listdir(run)) == ["keep.txt"]


def test_help_shows_only_real_defaults(capsys):
    """Options that a preset (or the model) fills are None in argparse: their help must not
    print "(default: None)", while real defaults are still shown."""
    import eval as eval_cli
    from lopti_minimal.experiments import study
    for parse, real in ((train_cli.parse_args, "(default:cpu-tiny)"),
                        (eval_cli.parse_args, "(default:100)"),
                        (study.parse_args, "(default:5)")):
        with pytest.raises(SystemExit):
            parse(["--help"])
        # argparse wraps lines, also inside a hyphenated word ("cpu-" / "tiny"): compare
        # with every whitespace removed
        text = "".join(capsys.readouterr().out.split())
        assert "(default:None)" not in text and "(default:False)" not in text
        assert real in text


def test_rebuild_budget_named_in_train_py_is_the_recipe_s():
    """train.py names the recipe's stage-1 steps in literals (no torch import for --help, or
    before the missing-checkpoint error); they must not drift from experiments/warmstart.py's."""
    from lopti_minimal.experiments.warmstart import STAGE1_STEPS, STAGE2_MINUTES
    text = open(ROOT / "train.py").read()
    assert train_cli.parse_args([]).warmstart_minutes is None          # the recipe's own budget
    assert text.count(f"{STAGE1_STEPS:,} steps") == 2 and f"then {STAGE2_MINUTES:g} minutes" in text


def test_gpu_preset_without_cuda_one_line_exit_2(tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run"
    assert train_cli.main(["--preset", "qwen2.5-0.5b", "--run-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none is visible: on a CPU use --preset cpu-tiny" in err, err
    assert not run.exists()


def test_options_come_from_the_config_fields():
    """One declaration per option: every TrainConfig field with help is a train.py option,
    an option not given leaves the preset's value, and a given one overrides it."""
    import dataclasses
    from lopti_minimal.config import TrainConfig, make_config, overrides
    a = train_cli.parse_args(["--preset", "ci", "--kl-coef", "0.01", "--no-eval", "--data", "x.jsonl",
                              "--rl-sizes", "3,4", "--eta", "0.7"])
    assert overrides(a) == {"kl_coef": 0.01, "final_eval": False, "rl_data": "x.jsonl",
                            "rl_sizes": (3, 4), "eta": 0.7}
    with_help = [f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("help")]
    assert set(with_help) <= set(vars(train_cli.parse_args([])))
    cfg = make_config("ci", **overrides(train_cli.parse_args(["--method", "lopti"])))
    assert (cfg.steps, cfg.eta, cfg.alpha) == (2, 0.4, None)     # the preset's steps, the paper's eta


def test_resume_refuses_an_option_that_would_change_the_run(tmp_path, capsys, nano_dir):
    """--resume continues a run as saved: another lr is refused in one line, not ignored;
    the saved value repeated, --steps and --threads are fine (checked before any step)."""
    from lopti_minimal.config import TrainError, make_config
    cfg = make_config("ci", model=nano_dir, run_dir=str(tmp_path / "run"), lr=1e-4)
    train_cli.refuse_changes_on_resume(cfg, {"lr": 1e-4, "steps": 9, "threads": 1, "rl_sizes": (3,)})
    with pytest.raises(TrainError) as e:
        train_cli.refuse_changes_on_resume(cfg, {"lr": 2e-4, "method": cfg.method, "group_size": 8})
    msg = str(e.value)
    assert "--lr 0.0002 (saved: 0.0001)" in msg and "--group-size 8 (saved: 4)" in msg
    assert "--method" not in msg and len(msg.splitlines()) == 1
