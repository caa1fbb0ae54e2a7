"""What keeps a run directory true to its name while processes write it (plumbing.Run).

A run directory holds one run: its checkpoints are the weights of the steps they name, its
logs the run's steps, its data the data it began with. What could break that, refused in one
line (TrainError) before anything is written, or said (RunFinished):

1. Two processes writing one folder (two runs given one --run-dir, two resumes of a run):
   RUN_DIR/.lock holds the writer's pid (`RunLock`); a lock whose process is gone (killed)
   is taken over.
2. A resume that would shrink the run: --steps below the latest checkpoint would write that
   checkpoint's weights under an earlier step's name (`check_length`). A finished run
   resumed at its own length has nothing to do: RunFinished, nothing written, its final
   evaluation not redone. Extending stays allowed.
3. Other data under the same run: run.json records the RL data's SHA-256; a resume with a
   changed file is refused unless told (`check_data`; the resumed session records it).
4. A folder that cannot be made (a parent that is a file, no permission): found before a
   model loads (`check_writable`).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from . import runs
from .config import TrainError


class RunFinished(Exception):
    """--resume of a run that is finished at the length asked: nothing to do (not an error)."""


class RunLock:
    """RUN_DIR/.lock, holding this process's pid while it writes the run (choice 1)."""

    NAME = ".lock"

    def __init__(self, run_dir: Path):
        self.path, self.held = Path(run_dir) / self.NAME, False

    def acquire(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pid = _pid_in(self.path)
                if pid and pid != os.getpid() and _alive(pid):
                    raise TrainError(f"{self.path.parent} is in use by process {pid} (another run or resume "
                                     f"of it): wait for it, or delete {self.path} if that process is gone") from None
                self.path.unlink(missing_ok=True)          # left by a killed process
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self.held = True
            return

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _pid_in(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:               # someone else's process: alive
        return True
    return True


def check_length(run_dir: Path, cfg, done: int) -> None:
    """Choice 2: ``done`` is the step of the run's latest checkpoint (0: none)."""
    if cfg.steps < done:
        raise TrainError(f"--steps {cfg.steps}: {run_dir} has a checkpoint at step {done}; a resume can "
                         "extend a run, not shrink it (start a new run, or evaluate a checkpoint with "
                         f"python eval.py --model {runs.checkpoints(run_dir)[-1][1]})")
    if (cfg.steps == done and (run_dir / "final").is_dir() and (run_dir / "summary.json").exists()
            and (run_dir / "eval_final.json").exists() == bool(cfg.final_eval)):
        raise RunFinished(f"{run_dir} finished at step {done}: nothing to do (--steps N > {done} extends it)")


def check_data(run_dir: Path, data_path: str, resume: bool, allow_changed: bool) -> tuple[str, dict | None]:
    """Choice 3: (the data's hash, what record_session records of a change, or None). Runs
    from before the record are not checked."""
    digest = runs.file_sha256(data_path)
    if not resume:
        return digest, None
    known = json.loads((Path(run_dir) / "run.json").read_text()).get("data_sha256")
    if not known or known == digest:
        return digest, None
    if not allow_changed:
        raise TrainError(f"the RL data {data_path} changed since {run_dir} began ({known[:19]} -> {digest[:19]}): "
                         "restore it, start a new run, or pass --allow-changed-data (recorded in run.json)")
    return digest, {"data_changed_from": known, "data_sha256": digest}


def check_writable(run_dir: Path) -> None:
    """Choice 4: the nearest existing parent is a folder in which a folder can be created
    (one is, and removed at once)."""
    parent = Path(run_dir).absolute()
    while not parent.exists():
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise NotADirectoryError(f"{parent} is a file")
        os.rmdir(tempfile.mkdtemp(prefix=".lopti-write-check-", dir=parent))
    except OSError as e:
        raise TrainError(f"run directory {run_dir}: cannot create it in {parent} ({e.strerror or e})") from None
