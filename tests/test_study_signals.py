"""The study runner under signals (study.py, design choice 1): the first SIGTERM stops the
runs in flight, and a study killed outright leaves no worker behind. Each test starts a real
study process (tests/study_driver.py) whose two fake runs sleep."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process-group semantics of Linux")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def start_study(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    out = tmp_path / "study"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "study_driver.py"), str(out), str(model)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:          # both workers have started their runs
        pids = [int(p.read_text()) for p in out.glob("ci/*/pid") if p.read_text()]
        if len(pids) == 2:
            return proc, out, pids
        if proc.poll() is not None:
            pytest.fail(f"the study ended early: {proc.stdout.read()}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the study's runs did not start within 120 s")


def wait_gone(pids, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def test_first_sigterm_stops_the_runs_in_flight(tmp_path):
    proc, out, pids = start_study(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)            # a second one while it stops: no hang, no traceback
    proc.wait(timeout=30)                       # not the minute the runs would take
    assert time.monotonic() - t0 < 30 and proc.returncode == 130
    assert "Traceback" not in proc.stdout.read()
    assert wait_gone(pids, 5) == []
    # each stopped run recorded its interrupted session (it resumes next time)
    for run in out.glob("ci/*-s0"):
        assert '"interrupted"' in (run / "study_time.json").read_text()


def test_a_killed_study_leaves_no_worker_alive(tmp_path):
    proc, out, pids = start_study(tmp_path)
    proc.kill()                                 # SIGKILL: the study cannot stop anything itself
    proc.wait(timeout=10)
    assert wait_gone(pids, 10) == [], "workers outlived their study by 10 s"
