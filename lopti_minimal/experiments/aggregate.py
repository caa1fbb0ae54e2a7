"""The study's aggregation: finished run directories -> one JSON (`aggregate`), what the
report (report.py) writes docs/RESULTS.md from.

Design choices (study.py, design choices 5 and 6):

1. Runs are compared only within one setting (grid.setting_key); a run of another setting
   is listed as excluded, with the fields it differs in. A seed whose arms ran on different
   machines (CPU model, torch, threads), or at commits not shown to compute the same, leaves
   the grid's table (grid.py, choice 4).
2. Per grid a balanced table: the seeds all its rows have, means with 95% t intervals, the
   paired difference from GRPO (and the grid's other pairs) with its interval (stats.py).
3. Reproducible: nothing in the aggregate depends on when or where it is made (no
   timestamp; paths as grid.portable shows them), so the same runs give the same bytes.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

from .. import runs
from ..runs import read_jsonl
from .grid import (GRID_PAIRS, GRIDS, GRPO, HELDOUT_FILE, RUNTIME_FIELDS, VARIANT_FIELDS, Variant,
                   code_key, config_diff, machine_key, portable, same_machine_seeds, setting_key,
                   warm_start_eval_path)
from .mechanism_report import MECH_KEYS, run_scalars
from .mechanism_report import curves as mechanism_curves
from .declared import code_class, commit_classes, declared_table
from .stats import mean_ci, paired_diff, t975


def _size_mean(report: dict, key: str, sizes=None) -> float:
    """Mean over the sizes of an evaluation report (evaluate.py) of one per-size field."""
    return float(np.mean([v.get(key, 0.0) for n, v in report["per_size"].items()
                          if sizes is None or int(n) in sizes]))


def read_run(run_dir) -> dict:
    """One finished run: its variant, seed, config, per-size final accuracy, curves, times."""
    run_dir = Path(run_dir)
    cfg = runs.saved_config(run_dir)
    ev = json.loads((run_dir / "eval_final.json").read_text())
    acc = {int(n): float(v["accuracy"]) for n, v in ev["per_size"].items()}
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    hfile = run_dir / HELDOUT_FILE
    hev = json.loads(hfile.read_text()) if hfile.exists() else None
    # Wall time: the study's record of the run's sessions; at least its own step and evaluation
    # times, which a run made outside the study has only, and which also stand in for a session
    # the record lost (a worker killed before it could write it: a later session adding only
    # the held-out evaluation would otherwise count as the whole run).
    own = sum(m.get("step_s", 0.0) for m in metrics) + float(ev.get("seconds", 0.0))
    tfile = run_dir / "study_time.json"
    wall = max(json.loads(tfile.read_text())["wall_s"], own) if tfile.exists() else own
    run_json = json.loads((run_dir / "run.json").read_text())
    code = run_json.get("code")
    return {"dir": str(run_dir), "preset": cfg.get("preset", "?"), "variant": Variant.from_config(cfg),
            "code": (code["commit"][:12] + ("+changes" if code["dirty"] else "")) if code else "not recorded",
            "machine": machine_key(run_json), "code_key": code_key(run_json),
            "seed": int(cfg["seed"]), "config": cfg, "setting": setting_key(cfg),
            "accuracy": acc, "avg": float(np.mean(list(acc.values()))),
            "format_error": _size_mean(ev, "format_error"), "truncated": _size_mean(ev, "truncated"),
            "tokens": _size_mean(ev, "mean_tokens"),
            "metrics": metrics, "eval_s": float(ev.get("seconds", 0.0)), "wall_s": float(wall),
            "heldout": float(hev["overall"]["accuracy"]) if hev else None,
            "heldout_s": float(hev["seconds"]) if hev and "seconds" in hev else None,
            "heldout_along": heldout_along(run_dir, cfg),
            **selection(metrics), **token_split(metrics, cfg), **run_scalars(metrics)}


def heldout_along(run_dir: Path, cfg: dict) -> dict[int, float]:
    """{step: held-out accuracy} of the evaluations the trainer made along the run
    (TrainConfig.heldout_steps, RUN_DIR/eval_heldout_step<N>.json), those it has."""
    out = {}
    for step in cfg.get("heldout_steps") or ():
        f = run_dir / runs.heldout_step_file(step)
        if f.exists():
            out[int(step)] = float(json.loads(f.read_text())["overall"]["accuracy"])
    return out


SELECT_AT = 0.8          # "the behaviour is selected": derivations are >= 80% of the samples


def selection(metrics: list[dict]) -> dict:
    """How fast RL selects the derivations (behaviours.py), from one run's metrics:
    steps_to_80 = the first step whose samples are >= 80% derivations (a run that never
    gets there counts as steps + 1, so a slower method never looks faster), derive_auc =
    the area under the share-of-derivations curve per step (its mean over the steps: 1 =
    derivations from the first step on), and train_truncated = the mean share of samples
    cut at the response cap."""
    ds = [m["derive_share"] for m in metrics if "derive_share" in m]
    if not ds:
        return {"steps_to_80": None, "derive_auc": None, "train_truncated": None}
    hit = next((i + 1 for i, v in enumerate(ds) if v >= SELECT_AT), len(ds) + 1)
    return {"steps_to_80": float(hit), "derive_auc": float(np.mean(ds)),
            "train_truncated": float(np.mean([m.get("truncated", 0.0) for m in metrics]))}


def token_split(metrics: list[dict], cfg: dict) -> dict:
    """What Lopti's first stage holds, from one run's metrics: the logged `low_fraction`
    (the share of response tokens with pi_old < eta; every method logs it, with the run's
    eta, or config.LOW_FRACTION_ETA without Lopti) at step 1 and averaged over the steps, and the share of derivations among the
    last step's samples."""
    low = [m["low_fraction"] for m in metrics if "low_fraction" in m]
    ds = [m["derive_share"] for m in metrics if "derive_share" in m]
    return {"eta": runs.config_from_json(cfg).low_eta, "low_step1": low[0] if low else None,
            "low_mean": float(np.mean(low)) if low else None, "derive_last": ds[-1] if ds else None}


def find_runs(out) -> tuple[list[Path], list[Path]]:
    """(finished, unfinished) run directories under OUT."""
    done, open_ = [], []
    for rj in sorted(Path(out).rglob("run.json")):
        d = rj.parent
        if runs.is_run_dir(d):
            (done if (d / "eval_final.json").exists() else open_).append(d)
    return done, open_


def curve_stats(runs: list[dict], key: str, window: int) -> dict:
    """Per step, over seeds: mean and 95% t band of the per-seed moving average of ``key``."""
    from ..plots import moving_average
    series = [[m[key] for m in r["metrics"] if key in m] for r in runs]
    T = min((len(s) for s in series), default=0)
    if T == 0:
        return {"step": [], "mean": [], "lo": [], "hi": []}
    Y = np.array([moving_average(s[:T], window) for s in series])
    mean = Y.mean(0)
    if len(Y) > 1:
        half = t975(len(Y) - 1) * Y.std(0, ddof=1) / math.sqrt(len(Y))
        lo, hi = mean - half, mean + half
    else:
        lo = hi = mean
    steps = [m["step"] for m in runs[0]["metrics"][:T]]
    r6 = lambda a: [round(float(v), 6) for v in a]     # noqa: E731
    return {"step": steps, "mean": r6(mean), "lo": r6(lo), "hi": r6(hi)}


def _variant_rank(v: Variant) -> tuple:
    """Report order: the grids' order (main first), then anything else by name."""
    known = list(dict.fromkeys(x for g in GRIDS.values() for x in g))
    return (known.index(v), "") if v in known else (len(known), v.name)


SELECTION_KEYS = ("heldout", "steps_to_80", "derive_auc", "train_truncated")
CURVE_KEYS = ("reward", "accuracy", "derive_share")


def _paired(ra: list[dict], rb: dict, get) -> dict:
    """Runs ``ra`` minus the runs ``rb`` (by seed), paired by seed, of ``get(run)``; runs
    where it is None are left out."""
    return paired_diff({r["seed"]: get(r) for r in ra if get(r) is not None},
                       {s: get(r) for s, r in rb.items() if get(r) is not None})


def pair_diffs(groups: dict, a: Variant, b: Variant, seeds) -> dict | None:
    """a minus b, paired by seed (only ``seeds``), on the average accuracy, the selection
    figures and the held-out accuracy along the run (GRID_PAIRS); None if either has no runs."""
    if a not in groups or b not in groups:
        return None
    ra = [r for r in groups[a] if r["seed"] in seeds]
    rb = {r["seed"]: r for r in groups[b] if r["seed"] in seeds}
    out = {"a": a.label, "b": b.label, "avg": _paired(ra, rb, lambda r: r["avg"])}
    for key in SELECTION_KEYS:
        if any(r.get(key) is not None for r in ra):
            out[key] = _paired(ra, rb, lambda r, k=key: r.get(k))
    steps = _along_steps(ra + list(rb.values()))
    if steps:
        out["heldout_along"] = {str(k): _paired(ra, rb, lambda r, k=k: r["heldout_along"].get(k)) for k in steps}
    return out


def _along_steps(rs: list[dict]) -> list[int]:
    """The steps after which some of the runs ``rs`` were evaluated on the held-out set."""
    return sorted({k for r in rs for k in r.get("heldout_along", {})})


def heldout_along_rows(vr: list[dict], base: dict | None, steps: list[int]) -> dict:
    """Held-out accuracy after each of ``steps`` and at the end ("final"), over the runs
    ``vr`` that have it: mean and 95% t interval, and (``base``: GRPO's runs by seed) the
    difference from GRPO paired by seed. Each cell's n is in its interval."""
    getters = {str(k): (lambda r, k=k: r["heldout_along"].get(k)) for k in steps}
    getters["final"] = lambda r: r.get("heldout")
    out = {}
    for col, get in getters.items():
        have = [r for r in vr if get(r) is not None]
        out[col] = {"mean": mean_ci([get(r) for r in have]),
                    "vs_grpo": _paired(have, base, get) if base is not None else None}
    return out


def _pair(groups: dict, a: Variant, b: Variant, table_seeds: list) -> dict | None:
    """One GRID_PAIRS comparison, over the seeds that both its arms have and ran alike
    (choice 4 applies to the two arms compared, not to the whole grid: REINFORCE++ with and
    without AR+Lopti pair on a seed whose GRPO ran on another CPU). Its "seeds" are named
    only where they are not the table's."""
    if a not in groups or b not in groups:
        return None
    both = sorted({r["seed"] for r in groups[a]} & {r["seed"] for r in groups[b]})
    seeds, _ = same_machine_seeds({v: {r["seed"]: r["machine"] for r in groups[v]} for v in (a, b)}, both)
    d = pair_diffs(groups, a, b, seeds)
    return d if seeds == table_seeds else {**d, "seeds": seeds}


def grid_table(groups: dict, grid: str, sizes: list[int], window: int) -> dict | None:
    """The balanced table of one grid: only the seeds that *every* variant of the grid
    with finished runs has, so each row (GRPO's included) averages the same seeds and
    every difference from GRPO is paired on all of them; and of those only the seeds whose
    runs share one machine (grid.py, choice 4; the others under "machine_apart"). The grid's
    own pairs (GRID_PAIRS) each use the seeds their two arms share (_pair)."""
    names = [v for v in GRIDS[grid] if v in groups]
    if not names:
        return None
    seeds = sorted(set.intersection(*({r["seed"] for r in groups[v]} for v in names)))
    seeds, apart = same_machine_seeds({v: {r["seed"]: r["machine"] for r in groups[v]} for v in names}, seeds)
    rows = {}
    for v in names:
        vr = [r for r in groups[v] if r["seed"] in seeds]
        acc = {str(n): mean_ci([r["accuracy"][n] for r in vr]) for n in sizes}
        acc["avg"] = mean_ci([r["avg"] for r in vr])
        vs = None
        if GRPO in names and v != GRPO and vr:
            base = {r["seed"]: r for r in groups[GRPO] if r["seed"] in seeds}
            vs = {str(n): _paired(vr, base, lambda r, n=n: r["accuracy"][n]) for n in sizes}
            vs["avg"] = _paired(vr, base, lambda r: r["avg"])
        fmt = {"mean": mean_ci([r["format_error"] for r in vr]), "vs_grpo": None,
               "truncated": mean_ci([r["truncated"] for r in vr]),
               "tokens": mean_ci([r["tokens"] for r in vr]), "tokens_vs_grpo": None}
        if vs is not None:
            for k, key in (("vs_grpo", "format_error"), ("tokens_vs_grpo", "tokens")):
                fmt[k] = _paired(vr, base, lambda r, key=key: r[key])
        sel, mech = {}, {}
        for keys, into in ((SELECTION_KEYS, sel), (MECH_KEYS, mech)):
            for key in keys:
                have = [r for r in vr if r.get(key) is not None]
                if not have:
                    continue
                into[key] = {"mean": mean_ci([r[key] for r in have]),
                             "vs_grpo": _paired(have, base, lambda r, key=key: r.get(key)) if vs is not None else None}
        along = _along_steps([r for u in names for r in groups[u] if r["seed"] in seeds])
        held = heldout_along_rows(vr, base if vs is not None else None, along) if along else None
        rows[v.name] = {"label": v.label, "method": v.method, "n": len(vr), "accuracy": acc, "vs_grpo": vs,
                        "format_error": fmt, "selection": sel, "mechanism": mech, "heldout_along": held,
                        "curves": {k: curve_stats(vr, k, window) for k in CURVE_KEYS} if vr else None,
                        "mechanism_curves": mechanism_curves(vr, window) if vr else None}
    pairs = [_pair(groups, a, b, seeds) for a, b in GRID_PAIRS.get(grid, ())]
    out = {"seeds": seeds, "rows": rows, "pairs": [d for d in pairs if d]}
    if apart:        # only then: the aggregate of a study on one machine keeps its bytes
        out["machine_apart"] = apart
    return out


def _mean_of(rs: list[dict], key: str) -> float | None:
    """The mean of ``key`` over the runs that have it (None if none does)."""
    vals = [r[key] for r in rs if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def aggregate(out, window: int = 5) -> dict:
    """Everything the report needs, from the run directories under OUT (JSON-ready)."""
    out = Path(out)
    done, unfinished = find_runs(out)
    runs = [read_run(d) for d in done]
    checks = read_jsonl(out / "commit_checks.jsonl")
    classes = commit_classes(checks)
    for r in runs:              # pairing by code too (grid.py, choice 4): the run's commit class
        r["machine"] = {**r["machine"], "code": code_class(r, classes)}
    by_preset: dict[str, list[dict]] = {}
    for r in runs:
        by_preset.setdefault(r["preset"], []).append(r)
    study = json.loads((out / "study.json").read_text()) if (out / "study.json").exists() else {"presets": {}}
    res = {"out": portable(str(out.resolve())), "presets": {}, "unfinished": [portable(str(Path(d).resolve())) for d in unfinished],
           "invocations": read_jsonl(out / "study_log.jsonl"), "window": window}
    for preset, rs in sorted(by_preset.items()):
        # The setting all runs must share: the one of the GRPO runs, else the commonest.
        keys = Counter(r["setting"] for r in rs if r["variant"] == GRPO) or Counter(r["setting"] for r in rs)
        ref = keys.most_common(1)[0][0]
        kept = [r for r in rs if r["setting"] == ref]
        ref_cfg = kept[0]["config"]
        excluded = [{"dir": portable(str(Path(r["dir"]).resolve())), "differs_in": config_diff(r["config"], ref_cfg,
                                                                RUNTIME_FIELDS | VARIANT_FIELDS)}
                    for r in rs if r["setting"] != ref]
        sizes = sorted(set.intersection(*(set(r["accuracy"]) for r in kept)))
        groups: dict[Variant, list[dict]] = {}
        for r in sorted(kept, key=lambda r: r["seed"]):
            groups.setdefault(r["variant"], []).append(r)
        variants = {}
        for v, vr in sorted(groups.items(), key=lambda kv: _variant_rank(kv[0])):
            def per_step_mean(key, vr=vr):      # a timing's mean over each run's steps, then over the runs
                return float(np.mean([np.mean([m.get(key, 0.0) for m in r["metrics"]] or [0.0]) for r in vr]))
            acc = {str(n): mean_ci([r["accuracy"][n] for r in vr]) for n in sizes}
            acc["avg"] = mean_ci([r["avg"] for r in vr])
            variants[v.name] = {
                "label": v.label, "method": v.method, "alpha": v.alpha, "eta": v.eta, "order": v.order,
                "seeds": [r["seed"] for r in vr], "n": len(vr), "accuracy": acc,
                "per_seed": {str(r["seed"]): {**{str(n): r["accuracy"][n] for n in sizes}, "avg": r["avg"]}
                             for r in vr},
                "format_error": mean_ci([r["format_error"] for r in vr]),
                "timing": {"step_s": per_step_mean("step_s"), "sample_s": per_step_mean("sample_s"),
                           "update_s": per_step_mean("update_s"), "eval_s": float(np.mean([r["eval_s"] for r in vr])),
                           "run_wall_s": float(np.mean([r["wall_s"] for r in vr]))},
                "update_passes": v.update_passes,
                "token_split": {k: _mean_of(vr, k) for k in ("eta", "low_step1", "low_mean", "derive_last")},
                "derive_last_range": [min(r["derive_last"] for r in vr), max(r["derive_last"] for r in vr)]
                if all(r["derive_last"] is not None for r in vr) else None,
            }
        grids = {g: t for g in GRIDS if (t := grid_table(groups, g, sizes, window))}
        declared = declared_table(groups, checks)   # docs/STUDY.md
        wpath = warm_start_eval_path(out, preset)
        warm = None
        if wpath.exists():
            wev = json.loads(wpath.read_text())
            wacc = {str(n): float(v["accuracy"]) for n, v in wev["per_size"].items() if int(n) in sizes}
            warm = {"accuracy": {**wacc, "avg": float(np.mean(list(wacc.values())))}, "model": portable(wev["model"]) if wev.get("model") else None,
                    "format_error": _size_mean(wev, "format_error", sizes),
                    "truncated": _size_mean(wev, "truncated", sizes), "tokens": _size_mean(wev, "mean_tokens", sizes)}
            hpath = wpath.with_name("warm-start-heldout.json")
            if hpath.exists():
                warm["heldout"] = float(json.loads(hpath.read_text())["overall"]["accuracy"])
        P, G, S = ref_cfg["prompts_per_step"], ref_cfg["group_size"], ref_cfg["steps"]
        res["presets"][preset] = {
            "model": portable(ref_cfg["model"]), "fingerprint": study["presets"].get(preset, {}).get("fingerprint"),
            "sizes": sizes, "variants": variants, "grids": grids, "declared": declared, "excluded": excluded,
            "warm_start": warm,
            "budget": {"steps": S, "prompts_per_step": P, "group_size": G, "responses_per_run": S * P * G,
                       "mini_batch_size": ref_cfg["mini_batch_size"],
                       "optimizer_steps_per_stage": math.ceil(P * G / ref_cfg["mini_batch_size"]),
                       "lr": ref_cfg["lr"], "max_new_tokens": ref_cfg["max_new_tokens"],
                       "rl_sizes": ref_cfg["rl_sizes"], "eval_per_size": ref_cfg["eval_per_size"],
                       "temperature": ref_cfg["temperature"]},
            "compute_s": float(sum(r["wall_s"] for r in rs)), "n_runs": len(rs),
            "code": dict(Counter(r["code"] for r in rs)),
        }
    return res
