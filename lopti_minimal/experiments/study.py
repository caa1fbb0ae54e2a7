"""The study: GRPO vs GRPO+AR vs GRPO+Lopti vs GRPO+AR+Lopti, several seeds, equal budgets,
confidence intervals, and the report docs/RESULTS.md.

    python -m lopti_minimal.experiments.study               # main grid and control x 5 seeds, cpu-tiny
    python -m lopti_minimal.experiments.study --grid criterion  # what carries Lopti's effect
    python -m lopti_minimal.experiments.study --grid isolation  # Lopti with an optimizer per stage
    python -m lopti_minimal.experiments.study --grid all    # + REINFORCE++, alpha, eta, order sweeps
    python -m lopti_minimal.experiments.study --dry-run     # the plan, what is done, a time estimate
    python -m lopti_minimal.experiments.study --report-only # aggregate finished runs: OUT/RESULTS.md
    python -m lopti_minimal.experiments.study --preset smollm2-cpu --seeds 3 --only grpo,ar_lopti

Design choices (why, in full: docs/STUDY.md; the paper reports one run per method, and at
our scale seed-to-seed noise is large):

1. One run = one ordinary trainer run in OUT/<preset>/<variant>-s<seed>: finished runs are
   skipped, started ones resumed exactly, a config mismatch is an error, a failing run is
   logged and the study goes on.
2. Same warm start (its SHA-256 is checked), same seeds: common random numbers, so the
   comparison with GRPO is paired by seed.
3. Equal budgets in sampled responses; Lopti's second pass is counted as update compute,
   and the report shows passes per batch and seconds per step.
4. The paper's per-method K&K settings (the reference's launch scripts): AR alpha 0.2, Lopti
   eta 0.4, AR+Lopti alpha 0.3 and eta 0.5; controls and one-knob sweeps; runs ordered
   seed-major (plan.py).
5. Statistics: the paper's accuracy (official 3..7-person sets, final evaluation), balanced
   tables, 95% Student-t intervals, paired differences from GRPO (stats.py); held-out
   accuracy after steps 5 and 10 (the trainer's, --heldout-steps) and at the end (here).
6. The report states only what is computed; the HAND-WRITTEN block is the author's. It is
   reproducible: no timestamp or machine path in it, and --report-only writes only what
   it is asked to (the report and figures where --report / --figures say, else in OUT;
   study_results.json with --write-aggregate), so a rerun changes no byte. The report has a
   row per arm; every table in full goes to a second file it links (--tables).
7. --jobs J runs J trainer runs at once, threads = cores / J; wall times are recorded.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import torch
from tqdm import tqdm

from .. import cli, plumbing, runs, trainer
from ..cli import HelpFormatter
from ..config import PRESETS, TrainConfig, TrainError
from ..runs import config_from_json, config_to_json
from ..plumbing import ROOT
from ..task.evaluate import write_eval_json
from ..task.kk import load_jsonl
from .aggregate import aggregate
from .grid import (GRIDS, HELDOUT_FILE, RUNTIME_FIELDS, VARIANT_FIELDS, StudyError, portable,
                   warm_start_eval_path)
from .plan import (RunSpec, check_existing, dry_run, estimate, plan_runs, run_config,  # noqa: F401 (API)
                   run_status, supported)
from .report import format_hours, write_report

DEFAULT_OUT = "runs/study"
DEFAULT_HELDOUT = "data/heldout3.jsonl"
# Held-out accuracy along the way, at fixed budgets: after these RL steps of every run (the
# trainer's evaluation, TrainConfig.heldout_steps), and at the end (evaluate_heldout).
DEFAULT_HELDOUT_STEPS = (5, 10)


# =======================================================================================
# 2. The warm start: recorded, checked, evaluated once (the plan itself: plan.py)
# =======================================================================================

def model_fingerprint(model: str) -> str:
    """SHA-256 of a local model's weights and tokenizer (a folder or a file); for a hub id,
    the id itself (it cannot be hashed without downloading it). A LoRA adapter folder
    (lora.is_adapter_folder) is hashed with its config and its base model's fingerprint: a
    start is the adapter on its base, and either may change."""
    from ..lora import adapter_base, is_adapter_folder
    p = Path(model)
    if not p.is_absolute() and not p.exists() and (ROOT / model).exists():
        p = ROOT / model
    if not p.exists():
        return f"id:{model}"
    files = [p] if p.is_file() else sorted(
        f for f in p.iterdir() if f.is_file() and (f.suffix in (".safetensors", ".bin", ".gguf")
                                                  or f.name in ("config.json", "tokenizer.json",
                                                                "adapter_config.json")))
    h = hashlib.sha256()
    if p.is_dir() and is_adapter_folder(str(p)):
        h.update(model_fingerprint(adapter_base(str(p))).encode())
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


def check_warm_start(out, preset: str, model: str) -> str:
    """Record the warm start of a preset in OUT/study.json, or check it is unchanged."""
    path = Path(out) / "study.json"
    state = json.loads(path.read_text()) if path.exists() else {"created": _now(), "presets": {}}
    fp = model_fingerprint(model)
    first = model.split("/")[0]
    if fp.startswith("id:") and (model.startswith((".", "/", "~")) or model.count("/") != 1
                                 or first in ("checkpoints", "models") or (ROOT / first).is_dir()):
        raise StudyError(f"warm start {model} not found: for the tiny model run `python train.py "
                         "--rebuild-warmstart`, for SmolLM2 `python scripts/fetch_smollm2.py`, or pass --model")
    known = state["presets"].get(preset)
    if known and (known["model"], known["fingerprint"]) != (model, fp):
        raise StudyError(f"the warm start of preset {preset} changed since this study began "
                         f"({known['model']} {known['fingerprint'][:19]} -> {model} {fp[:19]}): "
                         "use another --out")
    if not known:
        state["presets"][preset] = {"model": model, "fingerprint": fp, "recorded": _now()}
        path.parent.mkdir(parents=True, exist_ok=True)
        runs.write_json(path, state)
    return fp


def evaluate_warm_start(out, cfg, echo=print, heldout: str | None = None) -> Path:
    """The reference row "warm start (no RL)": the starting policy of a preset, evaluated
    once, greedy, with exactly the final evaluation of the runs (cfg: any run config of
    the preset). RL at small scale can lower accuracy; the Δ vs GRPO columns cannot show
    that, this row does. Skipped when its file exists (greedy decoding is deterministic)."""
    path = warm_start_eval_path(out, cfg.preset)
    hpath = path.with_name("warm-start-heldout.json")
    if heldout and not hpath.exists():
        echo(f"[study] evaluating the warm start {cfg.model} on {heldout} -> {hpath}")
        _write_heldout(cfg, heldout, hpath)
    if path.exists():
        return path
    echo(f"[study] evaluating the warm start {cfg.model} ({cfg.preset}) -> {path}")
    t0 = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = plumbing.load_policy(cfg)
    report = plumbing.evaluate_policy(model, tok, cfg, progress=False)
    report.update(model=cfg.model, threads=cfg.threads, wall_s=round(time.perf_counter() - t0, 1))
    write_eval_json(report, path)
    return path


# =======================================================================================
# 3. Running: skip, resume, or start; one process or several
# =======================================================================================

def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _file_log(path: Path):
    """A trainer log that appends to RUN_DIR/train.log. It opens the file per line, so it
    never creates the run directory itself (the trainer refuses a non-empty new one)."""
    def log(s: str) -> None:
        if path.parent.exists():
            with open(path, "a") as f:
                f.write(s + "\n")
    return log




def evaluate_heldout(run_dir, cfg, heldout) -> Path:
    """Greedy accuracy of a finished run's final policy on a held-out K&K file (default
    data/heldout3.jsonl: 400 three-person puzzles outside the official sets, the RL set and
    the warm start's stream; the official 3-person set has only 100, so its accuracy has a
    standard error of ~0.05). Same numerics and budget as the final evaluation."""
    run_dir = Path(run_dir)
    return _write_heldout(cfg, heldout, run_dir / HELDOUT_FILE, source=str(run_dir / "final"))


def _write_heldout(cfg, heldout, path: Path, source: str | None = None) -> Path:
    """Evaluate the policy at ``source`` (default cfg.model) on the K&K file ``heldout``, as
    the trainer evaluates it along the run (plumbing.evaluate_on)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = plumbing.load_policy(cfg, source=source)
    report = plumbing.evaluate_on(model, tok, cfg, load_jsonl(_abs(heldout)), progress=False)
    report.update(model=source or cfg.model, data=str(heldout))
    write_eval_json(report, path)
    return path


def execute(cfg, status: str, train_fn=None, heldout: str | None = None) -> dict:
    """One run: start it, or resume it after its latest checkpoint, then (``heldout``) its
    held-out evaluation; status "heldout" runs that evaluation only. Never raises except on
    KeyboardInterrupt; a failure is returned and written to RUN_DIR/study_error.txt."""
    train_fn = train_fn or trainer.train
    run_dir = Path(cfg.run_dir)
    log = _file_log(run_dir / "train.log")
    t0, start = time.perf_counter(), _now()
    ok, err = False, None
    try:
        if status == "resume":
            rcfg = plumbing.resume_config(run_dir, progress=False)
            rcfg.threads = cfg.threads
            train_fn(rcfg, resume=True, log=log)
        elif status == "new":
            train_fn(cfg, resume=False, log=log)
        if heldout and not (run_dir / HELDOUT_FILE).exists():
            evaluate_heldout(run_dir, cfg, heldout)
        ok = True
    except KeyboardInterrupt:
        err = "interrupted"
        raise
    except Exception as e:                       # noqa: BLE001 -- a study outlives one bad run
        err = f"{type(e).__name__}: {e}"
        # Inside the run only if it is one of our runs: a stray file in a directory
        # without run.json would make the trainer refuse to start it next time.
        if runs.is_run_dir(run_dir):
            (run_dir / "study_error.txt").write_text(traceback.format_exc())
        else:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            (run_dir.parent / f"{run_dir.name}.study_error.txt").write_text(traceback.format_exc())
    finally:
        wall = time.perf_counter() - t0
        if runs.is_run_dir(run_dir):
            tpath = run_dir / "study_time.json"
            rec = json.loads(tpath.read_text()) if tpath.exists() else {"wall_s": 0.0, "sessions": []}
            rec["wall_s"] = round(rec["wall_s"] + wall, 1)
            rec["sessions"].append({"start": start, "wall_s": round(wall, 1), "status": status,
                                    "ok": ok, "error": err, "threads": cfg.threads})
            runs.write_json(tpath, rec)
    return {"run_dir": str(run_dir), "ok": ok, "error": err, "wall_s": wall}


def _quiet_transformers() -> None:
    """No "Writing model shards" bars from save_pretrained under the study's own bar."""
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except Exception:                           # noqa: BLE001 -- cosmetic only
        pass


_IN_RUN = False          # in a worker: whether a run is executing (_worker_init's SIGTERM handler)


def _execute_in_worker(cfg_json: dict, status: str, train_fn, heldout) -> dict:
    """Process-pool entry point (module level, so it pickles)."""
    global _IN_RUN
    _quiet_transformers()
    _IN_RUN = True
    try:
        return execute(config_from_json(cfg_json), status, train_fn, heldout)
    finally:
        _IN_RUN = False


# How often a worker checks that the study that started it is alive (seconds).
PARENT_CHECK_S = 1.0


def _worker_init(parent_pid: int) -> None:
    """Each worker process: SIGTERM stops its run like Ctrl-C (execute records the session,
    the run resumes from its checkpoint), and a thread ends the worker within PARENT_CHECK_S
    once the study's process is gone (killed with SIGKILL, it could not stop its workers):
    no run goes on, and no process stays behind, without the study that owns it."""
    import threading

    def on_sigterm(signum, frame):
        if _IN_RUN:
            raise KeyboardInterrupt      # execute records the interrupted session
        os._exit(143)                    # idle: nothing to record, no traceback
    signal.signal(signal.SIGTERM, on_sigterm)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(143)            # the parent is gone: its runs' checkpoints are complete files
    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _stop_workers(pool, grace_s: float = 10.0) -> None:
    """Stop the runs in flight at once (the first Ctrl-C or SIGTERM): SIGTERM to every
    worker, SIGKILL to any still alive after ``grace_s``. Further signals are ignored while
    the pool shuts down, so a second Ctrl-C cannot leave it half closed."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        procs = list((getattr(pool, "_processes", None) or {}).values())   # CPython's {pid: Process}
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
        pool.shutdown(wait=True, cancel_futures=True)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def run_study(specs: list[RunSpec], out, overrides: dict | None = None, *, train_fn=None, jobs: int = 1,
              threads: int | None = None, progress: bool = True, echo=print, argv=None,
              eval_warm_start: bool = False, heldout: str | None = None) -> dict:
    """Run every spec that is not finished. Returns {"done", "skipped", "failed", "wall_s"}.
    train_fn(cfg, resume=..., log=...) defaults to trainer.train (tests inject a fake).
    eval_warm_start: first evaluate each preset's warm start (`evaluate_warm_start`; the
    command line does, tests of the orchestration with fake models do not).
    heldout: a K&K file every finished run is also evaluated on (`evaluate_heldout`); a
    finished run without that evaluation gets it (status "heldout")."""
    out = Path(out)
    jobs = max(1, int(jobs))
    if threads is None and jobs > 1:
        threads = max(1, (os.cpu_count() or 1) // jobs)
    t0, start = time.perf_counter(), _now()
    todo, skipped, checked = [], [], set()
    for spec in specs:                    # all checks first: refuse before anything runs
        cfg = run_config(spec, out, overrides, threads)
        if (spec.preset, cfg.model) not in checked:
            check_warm_start(out, spec.preset, cfg.model)
            checked.add((spec.preset, cfg.model))
        status = run_status(cfg.run_dir)
        if status != "new":
            check_existing(cfg.run_dir, cfg)
        if status == "done" and heldout and not (Path(cfg.run_dir) / HELDOUT_FILE).exists():
            status = "heldout"
        (skipped if status == "done" else todo).append((spec, cfg, status))
    # Held-out evaluations along the run need the policy at that step: a run finished without
    # them (before they existed, or with other --heldout-steps) keeps its gap; the report
    # gives each cell's n.
    gaps = [c.run_dir for _, c, _ in skipped
            if any(not (Path(c.run_dir) / runs.heldout_step_file(k)).exists() for k in c.heldout_steps)]
    if gaps:
        echo(f"[study] {len(gaps)} finished run(s) lack a held-out evaluation along the run "
             f"(e.g. {portable(str(gaps[0]))}): it cannot be added after the run")
    if eval_warm_start:
        for preset in dict.fromkeys(spec.preset for spec, _, _ in todo + skipped):
            cfg = next(c for sp, c, _ in todo + skipped if sp.preset == preset)
            evaluate_warm_start(out, cfg, echo, heldout)
    echo(f"[study] {len(specs)} runs: {len(skipped)} finished (skipped), "
         f"{sum(s == 'resume' for _, _, s in todo)} to resume, {sum(s == 'new' for _, _, s in todo)} to start"
         f" | jobs {jobs}, threads per run {threads or 'default'} | {out}")
    results = []
    bar = tqdm(total=len(todo), desc="study runs", unit="run", disable=not progress, file=sys.stderr)
    try:
        if jobs == 1:
            for spec, cfg, status in todo:
                bar.set_postfix_str(f"{spec.preset}/{spec.variant.name}-s{spec.seed} ({status})")
                r = execute(cfg, status, train_fn, heldout)
                results.append(r)
                if not r["ok"]:
                    echo(f"[study] FAILED {r['run_dir']}: {r['error']}")
                bar.update(1)
        else:
            import multiprocessing as mp
            from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
            queue = iter(todo)
            with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                     initargs=(os.getpid(),)) as pool:
                def submit_next(running: set) -> None:
                    # One run per free worker, submitted when it frees: the pool forwards
                    # submitted calls to its workers ahead of time, and a forwarded call
                    # can no longer be cancelled, so nothing is submitted early.
                    item = next(queue, None)
                    if item is not None:
                        _, cfg, status = item
                        running.add(pool.submit(_execute_in_worker, config_to_json(cfg), status, train_fn,
                                                heldout))
                running: set = set()
                for _ in range(jobs):
                    submit_next(running)
                try:
                    while running:
                        finished, running = wait(running, return_when=FIRST_COMPLETED)
                        for f in finished:
                            r = f.result()
                            results.append(r)
                            if not r["ok"]:
                                echo(f"[study] FAILED {r['run_dir']}: {r['error']}")
                            bar.set_postfix_str(Path(r["run_dir"]).name)
                            bar.update(1)
                            submit_next(running)
                except KeyboardInterrupt:
                    # No run is queued (see submit_next); the runs in flight stop now and
                    # resume from their latest checkpoint next time.
                    _stop_workers(pool)
                    raise
    finally:
        bar.close()
        wall = time.perf_counter() - t0
        out.mkdir(parents=True, exist_ok=True)
        runs.append_jsonl(out / "study_log.jsonl", {
            "start": start, "end": _now(), "wall_s": round(wall, 1), "argv": argv,
            "jobs": jobs, "threads": threads, "planned": len(specs), "skipped": len(skipped),
            "ran": len(results), "failed": sum(not r["ok"] for r in results), "machine": runs.machine_info()})
    failed = [r for r in results if not r["ok"]]
    return {"done": [r["run_dir"] for r in results if r["ok"]], "skipped": [str(c.run_dir) for _, c, _ in skipped],
            "failed": failed, "wall_s": wall}


# =======================================================================================
# 4. The command line and the report's files
# =======================================================================================

def parse_set(items) -> dict:
    """--set KEY=VALUE: VALUE is JSON if it parses (numbers, lists), else a string."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise StudyError(f"--set {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        k = k.strip().replace("-", "_")
        try:
            v = json.loads(v)
        except ValueError:
            pass
        out[k] = tuple(v) if isinstance(v, list) else v
    return out


# The TrainConfig options the study's command line takes directly (declared once, in
# config.py); any other field: --set KEY=VALUE.
STUDY_OPTIONS = ("model", "steps", "prompts_per_step", "group_size", "lr", "max_new_tokens",
                 "eval_sizes", "eval_per_size", "save_every")


def build_overrides(a) -> dict:
    """Every run's TrainConfig fields from the command line: the STUDY_OPTIONS given, --set,
    and the held-out evaluations along the run (--heldout, --heldout-steps)."""
    o = cli.given(a, TrainConfig, only=STUDY_OPTIONS)
    o.update(parse_set(a.set))
    bad = (VARIANT_FIELDS | RUNTIME_FIELDS | {"final_eval"}) & set(o)
    if bad:
        raise StudyError(f"--set cannot change {', '.join(sorted(bad))}: the study sets these per run")
    if a.heldout and a.heldout_steps:
        o.update(heldout_data=a.heldout, heldout_steps=tuple(a.heldout_steps))
    return o


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m lopti_minimal.experiments.study",
        description="GRPO / AR / Lopti / AR+Lopti from one warm start, equal budgets, several seeds; "
                    "writes OUT/RESULTS.md.", formatter_class=HelpFormatter)
    ap.add_argument("--grid", nargs="+", default=["main", "control"], help=f"grids: {', '.join(GRIDS)}, all")
    ap.add_argument("--heldout", default=DEFAULT_HELDOUT,
                    help="K&K file every run's final policy is also evaluated on ('' for none)")
    ap.add_argument("--heldout-steps", nargs="*", type=int, default=list(DEFAULT_HELDOUT_STEPS),
                    help="and the policy after these RL steps, by the trainer (none: no values)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 of the main grid")
    ap.add_argument("--sweep-seeds", type=int, default=3, help="seeds 0..N-1 of the sweeps")
    ap.add_argument("--skip-seeds", nargs="+", type=int, default=[], metavar="S",
                    help="leave these seeds out of this invocation (e.g. a seed whose baselines ran on another "
                    "kind of CPU: run it there, so that its arms pair)")
    ap.add_argument("--only", help="comma-separated methods or variant names to keep (e.g. grpo,ar_lopti)")
    ap.add_argument("--preset", default="cpu-tiny", help=f"one of: {', '.join(PRESETS)}")
    cli.add_options(ap.add_argument_group("every run's options (the preset's unless given)"), TrainConfig,
                    shown="cpu-tiny", only=STUDY_OPTIONS)
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="any other TrainConfig field, for all runs")
    ap.add_argument("--out", default=DEFAULT_OUT, help="study folder: OUT/<preset>/<variant>-s<seed>/")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (separate processes)")
    ap.add_argument("--threads", type=int, help="torch threads per run (default: cores / jobs)")
    ap.add_argument("--report", help="markdown report to (re)write (default OUT/RESULTS.md; the shipped "
                    "report is docs/RESULTS.md, written only when named here)")
    ap.add_argument("--figures", help="folder for the report's figures (default OUT/figures)")
    ap.add_argument("--tables", help="markdown file for every table in full, which the report links "
                    "(default: OUT/RESULTS_TABLES.md; with --report-only and --report: beside the report, "
                    "REPORT_TABLES.md)")
    ap.add_argument("--window", type=int, default=5, help="moving-average window of the learning curves")
    ap.add_argument("--report-only", action="store_true",
                    help="no training: aggregate the runs in OUT and write the report, nothing else")
    ap.add_argument("--write-aggregate", action="store_true",
                    help="with --report-only: also (re)write OUT/study_results.json (training always does)")
    ap.add_argument("--no-report", action="store_true", help="train only")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and a time estimate, run nothing")
    ap.add_argument("--estimate-from", metavar="DIR",
                    help="for --dry-run: time runs by the finished runs of this study folder (default OUT)")
    ap.add_argument("--step-seconds", type=float, help="for --dry-run before any run finished: s per RL step")
    ap.add_argument("--eval-seconds", type=float, help="for --dry-run: s per final evaluation")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def check_args(a, out: Path) -> None:
    """The command's own options, refused in one line before anything runs (StudyError):
    numbers of jobs, threads and seeds, names that select nothing, an --out that is a file."""
    for name in ("jobs", "threads", "seeds", "sweep_seeds"):
        v = getattr(a, name)
        if v is not None and v < (0 if name == "sweep_seeds" else 1):
            raise StudyError(f"--{name.replace('_', '-')} must be >= {0 if name == 'sweep_seeds' else 1}, got {v}")
    if a.only:
        known = {x for g in GRIDS.values() for v in g for x in (v.method, v.name)}
        unknown = sorted(set(a.only.split(",")) - known)
        if unknown:
            raise StudyError(f"--only {','.join(unknown)}: no such method or variant (e.g. grpo, "
                             "grpo-x2, lopti-e0.4, ar_lopti-a0.3-e0.5)")
    if out.exists() and not out.is_dir():
        raise StudyError(f"--out {out} is a file: a study folder holds its runs")


def _abs(p: str) -> Path:
    return Path(p) if os.path.isabs(p) else ROOT / p


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt     # a `kill` stops the study like Ctrl-C: invocation logged, nothing queued starts


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    _quiet_transformers()
    out = _abs(a.out)
    try:
        check_args(a, out)
        if not a.report_only:
            overrides = build_overrides(a)
            only = set(a.only.split(",")) if a.only else None
            specs = plan_runs(a.grid, a.seeds, a.sweep_seeds, a.preset, only, set(a.skip_seeds))
            specs, dropped = supported(specs, out, overrides)
            if dropped:
                print(f"[study] skipped {len(dropped)} run(s) of variants the trainer cannot run: {dropped[0]}",
                      file=sys.stderr)
            if a.dry_run:
                if a.estimate_from:
                    a.estimate_from = _abs(a.estimate_from)
                return dry_run(specs, out, overrides, a)
            r = run_study(specs, out, overrides, jobs=a.jobs, threads=a.threads, progress=not a.no_progress,
                          argv=argv, eval_warm_start=True, heldout=a.heldout or None)
            print(f"[study] this invocation: {format_hours(r['wall_s'])}; ran {len(r['done'])}, "
                  f"skipped {len(r['skipped'])}, failed {len(r['failed'])}")
        if not a.no_report:
            write_outputs(a, out)
    except (StudyError, TrainError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume the study", file=sys.stderr)
        return 130
    return 1 if not a.report_only and r["failed"] else 0


def write_outputs(a, out: Path) -> None:
    """The report of the runs in OUT (design choice 6): OUT/RESULTS.md, OUT/figures and
    OUT/RESULTS_TABLES.md unless --report / --figures / --tables say otherwise (a tracked
    file such as docs/RESULTS.md is written only when named), and after training
    OUT/study_results.json. The report names its own regenerating command, with portable paths."""
    report = _abs(a.report) if a.report else out / "RESULTS.md"
    figures = _abs(a.figures) if a.figures else out / "figures"
    if a.tables:
        tables = _abs(a.tables)
    elif a.report_only and a.report:          # --report-only writes into OUT only what it is asked
        tables = report.with_name(report.stem + "_TABLES.md")
    else:
        tables = out / "RESULTS_TABLES.md"
    res = aggregate(out, a.window)
    if not a.report_only or a.write_aggregate:
        out.mkdir(parents=True, exist_ok=True)
        runs.write_json(out / "study_results.json", res)
    again = (f"python -m lopti_minimal.experiments.study --out {portable(str(out))} --report-only "
             f"--report {portable(str(report))} --figures {portable(str(figures))} --tables {portable(str(tables))}")
    print(f"[study] report: {write_report(res, report, figures, regenerate=again, tables=tables)}")


def command() -> int:
    """`python -m lopti_minimal.experiments.study`: main(), with SIGTERM stopping the study
    like Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    return main()


if __name__ == "__main__":
    sys.exit(command())
