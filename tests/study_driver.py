"""A study process for tests/test_study_signals.py: two parallel runs of a fake trainer that
records its pid and sleeps, so a test can signal the study while its runs are in flight.

    python tests/study_driver.py OUT MODEL
"""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lopti_minimal import runs  # noqa: E402
from lopti_minimal.runs import config_to_json  # noqa: E402


def slow_train(cfg, resume=False, log=None, reward_fn=None):
    """A run that starts (run.json, its pid) and then takes a minute."""
    rd = Path(cfg.run_dir)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": config_to_json(cfg)}))
    (rd / "pid").write_text(str(os.getpid()))
    time.sleep(60)


if __name__ == "__main__":
    from lopti_minimal.experiments import study as S
    out, model = sys.argv[1], sys.argv[2]
    import signal
    signal.signal(signal.SIGTERM, S._interrupt_on_sigterm)      # as the command installs it
    specs = S.plan_runs(["main"], 2, 0, "ci", only={"grpo", "ar"})
    try:
        S.run_study(specs, out, {"model": model}, train_fn=slow_train, jobs=2, threads=1, progress=False)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
