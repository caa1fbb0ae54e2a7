"""Loading a run runs no code from it (runs.py, choice 3): a resume reads the state files
(a checkpoint's trainer_state.pt, the warm start's warmstart_state.pt) with the weights-only
unpickler, and a file not in that form -- a pickle that would run a command, a truncated
file, a file of the first format -- is refused with one line and exit code 2, before
anything is changed. The exact-resume tests (test_trainer.py, test_lora.py,
test_warmstart.py) show that the plain form still resumes bit for bit."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import train as train_cli
from conftest import ROOT
from test_trainer import length_reward, small_cfg
from lopti_minimal import trainer
from lopti_minimal.experiments import warmstart
from lopti_minimal.experiments.warmstart import WarmStartConfig


class RunsACommand:
    """What an attacker adds to a state file: unpickled by the full unpickler, it runs a
    shell command (here one that writes a marker file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"echo ran > {shlex.quote(str(self.marker))}",)


def plant_command(state_file: Path, marker: Path) -> None:
    """Re-save ``state_file`` with one more entry whose unpickling runs a command, and show
    that the full unpickler would run it, so the refusal below is not vacuous."""
    state = torch.load(state_file, weights_only=True)
    state["extra"] = RunsACommand(marker)
    torch.save(state, state_file)
    torch.load(state_file, weights_only=False)        # the full unpickler runs the command...
    assert marker.exists()
    marker.unlink()                                   # ...a resume must not


def truncate(state_file: Path) -> None:
    data = state_file.read_bytes()
    state_file.write_bytes(data[:len(data) // 2])


def first_format(state_file: Path) -> None:
    """The state as the first format wrote it: numpy's RNG state as an array (which only
    the full unpickler loads), no "format" entry."""
    state = torch.load(state_file, weights_only=True)
    del state["format"]
    state["rng"]["numpy"] = np.random.get_state()
    torch.save(state, state_file)


def is_plain(x) -> bool:
    """Only tensors, numbers, strings, None and plain containers of them."""
    if type(x) in (dict, list, tuple):
        items = [v for kv in x.items() for v in kv] if type(x) is dict else x
        return all(is_plain(v) for v in items)
    return type(x) in (str, int, float, bool, type(None), torch.Tensor)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------- RL runs

@pytest.fixture
def rl_run(nano_dir, tmp_path):
    """(run directory, its checkpoint's trainer_state.pt): a finished one-step run."""
    cfg = small_cfg(nano_dir, tmp_path, steps=1, method="grpo", threads=1)
    trainer.train(cfg, reward_fn=length_reward, log=lambda s: None)
    run = Path(cfg.run_dir)
    return run, run / "ckpt-000001" / "trainer_state.pt"


def test_trainer_state_is_plain_data(rl_run):
    state = torch.load(rl_run[1], weights_only=True)
    assert is_plain(state) and state["format"] == 2 and state["step"] == 1
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda"}


def test_resuming_a_run_whose_state_runs_a_command_runs_nothing(rl_run, tmp_path):
    """The attack: a run directory handed over with a trainer_state.pt that runs a shell
    command when unpickled. `python train.py --resume RUN` refuses it: exit 2, one line,
    the command not run, the run directory unchanged."""
    run, state_file = rl_run
    marker = tmp_path / "marker"
    plant_command(state_file, marker)
    metrics = (run / "metrics.jsonl").read_text()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), "--resume", str(run), "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert not marker.exists()
    assert p.returncode == 2, p.stderr[-2000:]
    line = one_line(p.stderr)
    assert str(state_file) in line and "nothing in it ran" in line, line
    assert (run / "metrics.jsonl").read_text() == metrics


@pytest.mark.parametrize("spoil", [truncate, first_format])
def test_a_truncated_or_first_format_trainer_state_is_refused(rl_run, spoil, capsys):
    run, state_file = rl_run
    spoil(state_file)
    assert train_cli.main(["--resume", str(run), "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err)
    assert str(state_file) in line and f"delete {state_file.parent}" in line, line


# ------------------------------------------------------------------------ the warm start

@pytest.fixture
def warm_run(kk_tokenizer, tmp_path):
    """(OUT, OUT.resume/warmstart_state.pt): a warm start interrupted after its state at
    step 2 was saved."""
    out = tmp_path / "warm"
    cfg = WarmStartConfig(preset="nano", out=str(out), steps=4, lr=5e-3, warmup_steps=2,
                          tokens_per_batch=512, curriculum=((0.0, {2: 1}),), eval_per_size=0,
                          heldout_per_size=0, final_eval_per_size=0, state_every_steps=2,
                          progress=False, threads=1)

    def stop(line):
        if line.startswith("[state] step 2"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        warmstart.warm_start(cfg, tokenizer=kk_tokenizer, log=stop)
    return out, Path(warmstart.resume_dir(str(out))) / warmstart.STATE_FILE


def test_warm_start_state_is_plain_data(warm_run):
    state = torch.load(warm_run[1], weights_only=True)
    assert is_plain(state) and state["format"] == 2 and state["step"] == 2
    assert state["style"] == "compact" and state["stream"]["calls"] > 0


def test_resuming_a_warm_start_whose_state_runs_a_command_runs_nothing(warm_run, tmp_path):
    out, state_file = warm_run
    marker = tmp_path / "marker"
    plant_command(state_file, marker)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "lopti_minimal.experiments.warmstart", "--resume", str(out),
                        "--threads", "1", "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert not marker.exists()
    assert p.returncode == 2, p.stderr[-2000:]
    line = one_line(p.stderr)
    assert str(state_file) in line and "nothing in it ran" in line, line
    assert not out.exists()                       # no checkpoint written


def test_a_truncated_warm_start_state_is_refused(warm_run, capsys):
    out, state_file = warm_run
    truncate(state_file)
    with pytest.raises(SystemExit) as e:
        warmstart.main(["--resume", str(out), "--threads", "1", "--no-progress"])
    assert e.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert str(state_file) in line and f"delete {state_file.parent}" in line, line
