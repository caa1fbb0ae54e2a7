"""The study's plan: which runs, with which configs, what is already done, and about how
long the rest takes (study.py runs the plan; `--dry-run` prints it).

Design choices (study.py, design choices 1, 2 and 4):

1. One run = one variant x one seed of a preset, in OUT/<preset>/<variant>-s<seed>;
   runs that several grids ask for are planned once.
2. The grids compared with the main one run seed-major with it (PAIRED_GRIDS: all their
   arms of seed 0, then of seed 1, ...), so a study stopped early has complete, paired
   seeds; the sweeps follow with their own seed count.
3. A run's config is the preset, the study-wide overrides, the variant and the seed; the
   held-out evaluations along the run are kept to the steps before its end (the final
   policy's is the study's own, eval_heldout.json).
4. The time estimate is measured, not modelled: per variant (else per method, else any run
   of the preset) the mean wall time of finished runs, of this study or of another one on
   the same machine (--estimate-from, e.g. an archive), plus the held-out evaluations those
   runs did not make.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import runs
from ..config import TrainError, make_config
from .aggregate import find_runs, read_run
from .grid import GRIDS, StudyError, Variant, config_diff
from .report import format_hours

# The grids that share the main grid's seeds (--seeds) and run seed-major with it; the
# others are sweeps (--sweep-seeds).
PAIRED_GRIDS = ("main", "control", "criterion", "isolation")


@dataclass(frozen=True)
class RunSpec:
    preset: str
    variant: Variant
    seed: int
    grid: str                          # the first grid that asked for it

    def run_dir(self, out) -> Path:
        return Path(out) / self.preset / f"{self.variant.name}-s{self.seed}"


def plan_runs(grids, seeds: int, sweep_seeds: int, preset: str, only=None, skip_seeds=()) -> list[RunSpec]:
    """Deduplicated runs, the paired grids first and seed-major, then the sweeps (choice 2).
    ``only``: keep these methods (or variant names) only. ``skip_seeds``: leave these seeds out
    of this invocation (a seed whose baselines ran on another kind of CPU is run there, so that
    its arms pair: grid.same_machine_seeds reports a mixed seed apart)."""
    names = list(GRIDS) if "all" in grids else list(grids)
    for g in names:
        if g not in GRIDS:
            raise StudyError(f"unknown grid {g!r}: choose from {', '.join(GRIDS)}, all")
    names.sort(key=list(GRIDS).index)
    out, seen = [], set()

    def add(g, v, seed):
        if (only and v.method not in only and v.name not in only) or seed in skip_seeds:
            return
        if (v, seed) not in seen:
            seen.add((v, seed))
            out.append(RunSpec(preset, v, seed, g))

    first = [g for g in names if g in PAIRED_GRIDS]
    for seed in range(seeds):
        for g in first:
            for v in GRIDS[g]:
                add(g, v, seed)
    for g in names:
        if g not in first:
            for seed in range(sweep_seeds):
                for v in GRIDS[g]:
                    add(g, v, seed)
    return out


def run_config(spec: RunSpec, out, overrides: dict | None = None, threads: int | None = None):
    """The TrainConfig of one run: the preset, the study-wide overrides, the variant, the
    seed, and the study's fixed choices (final evaluation on, no tqdm bars inside runs).
    Held-out evaluations along the run only at steps before its end (choice 3)."""
    values = dict(overrides or {})
    values.update(spec.variant.overrides(), seed=spec.seed, run_dir=str(spec.run_dir(out)),
                  final_eval=True, progress=False, threads=threads)
    cfg = make_config(spec.preset, **values)
    cfg.heldout_steps = tuple(s for s in cfg.heldout_steps if s < cfg.steps)
    if not cfg.heldout_steps:
        cfg.heldout_data = None
    return cfg


def run_status(run_dir) -> str:
    """"done" (final evaluation written), "resume" (one of our runs, unfinished) or "new"."""
    run_dir = Path(run_dir)
    if runs.is_run_dir(run_dir):
        return "done" if (run_dir / "eval_final.json").exists() else "resume"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise StudyError(f"{run_dir} exists but is not a lopti-minimal run: move it away")
    return "new"


def check_existing(run_dir, cfg) -> None:
    """A run to skip or resume must have been made with the config we would use now."""
    saved = runs.saved_config(run_dir)
    diff = config_diff(saved, cfg)
    if diff:
        raise StudyError(f"{run_dir} was made with a different config ({', '.join(diff)}): "
                         "use another --out, or the options it was made with")


def supported(specs, out, overrides):
    """Drop runs whose variant the trainer cannot express (a TrainConfig field it lacks,
    e.g. lopti_order in an older checkout); every other config error is raised."""
    keep, dropped = [], []
    for s in specs:
        try:
            run_config(s, out, overrides)
            keep.append(s)
        except TrainError as e:
            knobs = set(s.variant.overrides()) - {"method"}
            if "unknown config field" not in str(e) or not any(k in str(e) for k in knobs):
                raise
            dropped.append(f"{s.variant.name}-s{s.seed} ({e})")
    return keep, dropped


# =======================================================================================
# The time estimate
# =======================================================================================

def estimate(todo: list[tuple[RunSpec, object, str]], out, step_seconds=None, eval_seconds=None,
             jobs: int = 1, reference=None) -> str:
    """Rough time to finish ``todo``: per variant (else per method, else any run of the
    preset), the mean wall time of the finished runs in ``reference`` (default: OUT; resumed
    runs pro rata), plus, per held-out evaluation along the run that those runs did not
    make, one final held-out evaluation's time; else steps x --step-seconds (x 1.15 per
    extra update pass) + --eval-seconds. With jobs > 1 the sum is divided by jobs: right
    when the finished runs' wall times were measured with as many runs at once."""
    done, _ = find_runs(reference or out)
    by_name: dict[tuple, list[float]] = {}
    by_method: dict[tuple, list[float]] = {}
    held_s, held_done = [], []
    for d in done:
        r = read_run(d)
        by_name.setdefault((r["preset"], r["variant"].name), []).append(r["wall_s"])
        by_method.setdefault((r["preset"], r["variant"].method), []).append(r["wall_s"])
        if r["heldout_s"] is not None:
            held_s.append(r["heldout_s"])
        held_done.append(len(r["heldout_along"]))
    held_each = float(np.mean(held_s)) if held_s else 0.0
    held_had = float(np.mean(held_done)) if held_done else 0.0
    total, unknown = 0.0, 0
    for spec, cfg, status in todo:
        passes = spec.variant.update_passes
        known = by_name.get((spec.preset, spec.variant.name)) or by_method.get((spec.preset, spec.variant.method)) \
            or [w for (p, _), ws in by_method.items() if p == spec.preset for w in ws]
        if known:
            est = float(np.mean(known)) + max(0.0, len(cfg.heldout_steps) - held_had) * held_each
        elif step_seconds:
            est = cfg.steps * step_seconds * 1.15 ** (passes - 1) + (eval_seconds or 0.0)
        else:
            unknown += 1
            continue
        if status == "resume":
            ck = runs.checkpoints(cfg.run_dir)
            est *= 1 - (ck[-1][0] / cfg.steps if ck else 0.0)
        total += est
    if unknown == len(todo) and todo:
        return ("no estimate yet (finish one run, or pass --estimate-from DIR with finished runs, "
                "or --step-seconds S [--eval-seconds E])")
    s = f"about {format_hours(total)} for {len(todo) - unknown} run(s) at one run at a time"
    if jobs > 1:
        s += f" (about {format_hours(total / jobs)} with --jobs {jobs})"
    return s + (f", {unknown} without an estimate" if unknown else "")


def dry_run(specs, out, overrides, a) -> int:
    """Print the plan (grid, run, status), the budget, the held-out evaluations and the
    time estimate; run nothing."""
    rows = []
    for s in specs:
        cfg = run_config(s, out, overrides, a.threads)
        status = run_status(cfg.run_dir)
        if status != "new":
            check_existing(cfg.run_dir, cfg)
        rows.append((s, cfg, status))
    width = max([len(g) for g in GRIDS] + [4])
    print(f"{'grid':{width}} {'run':44} status")
    for s, cfg, status in rows:
        print(f"{s.grid:{width}} {s.preset + '/' + s.variant.name + '-s' + str(s.seed):44} {status}")
    cfg0 = rows[0][1] if rows else None
    if cfg0:
        print(f"budget per run: {cfg0.steps} steps x {cfg0.prompts_per_step} prompts x G={cfg0.group_size} = "
              f"{cfg0.steps * cfg0.prompts_per_step * cfg0.group_size} sampled responses (every method)")
        if a.heldout:
            along = f"after step(s) {', '.join(map(str, cfg0.heldout_steps))} and " if cfg0.heldout_steps else ""
            print(f"held-out evaluation ({a.heldout}, greedy): {along}at the end of every run")
    todo = [r for r in rows if r[2] != "done"]
    per = ", ".join(f"{g} {sum(s.grid == g for s, _, _ in rows)}" for g in dict.fromkeys(s.grid for s, _, _ in rows))
    print(f"{len(rows)} runs ({per}), {len(todo)} to do: "
          + estimate(todo, out, a.step_seconds, a.eval_seconds, a.jobs, a.estimate_from))
    return 0
