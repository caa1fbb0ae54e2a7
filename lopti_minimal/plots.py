"""Plots of a run: training curves, the evaluation curve, per-size accuracy bars.

Design choices:

1. matplotlib figures written to PNG files; no display needed.
2. Training curves (mean reward, sampled-response accuracy, share of derivations and
   response length per RL step) carry a moving average: single steps are noisy (a few
   prompts x G responses each).
3. The evaluation curve is official accuracy per size at each periodic evaluation; the
   bars compare one or more evaluation reports per size (e.g. warm start vs after RL).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
# Figures are built without pyplot, so importing this module changes no global
# matplotlib state (a notebook keeps its inline backend; a server needs no display).
from matplotlib.figure import Figure

from .runs import read_jsonl


def moving_average(x, k: int):
    x = np.asarray(x, dtype=float)
    if len(x) < k or k <= 1:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    head = [x[:i + 1].mean() for i in range(k - 1)]      # shorter windows at the start
    return np.concatenate([head, (c[k:] - c[:-k]) / k])


TRAINING_PANELS = (("reward", "mean reward"), ("accuracy", "accuracy of sampled responses"),
                   ("derive_share", "share of derivations (behaviours.py)"),
                   ("response_len", "response tokens"))


def _training_figure(panels, path, draw) -> str:
    """One panel per (metric, title) of ``panels``; ``draw(ax, key)`` plots into each."""
    fig = Figure(figsize=(4.3 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels))
    for ax, (key, label) in zip(axes, panels):
        draw(ax, key)
        ax.set_xlabel("RL step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def plot_training(metrics: list[dict], path, window: int = 5) -> str:
    """One panel per metric of TRAINING_PANELS that the run logged (runs written before
    the derivation share existed have three)."""
    steps = [m["step"] for m in metrics]
    panels = [(k, label) for k, label in TRAINING_PANELS if all(k in m for m in metrics)]

    def draw(ax, key):
        y = [m[key] for m in metrics]
        ax.plot(steps, y, alpha=0.35, lw=1, label="per step")
        ax.plot(steps, moving_average(y, window), lw=2, label=f"moving avg ({window})")
    return _training_figure(panels, path, draw)


def plot_runs(runs: dict, path) -> str:
    """Several runs' training curves, one line per run: {label: metrics (per-step dicts)}
    (scripts/rl_summary.py: the seeds of the default run, the README's figure)."""
    def draw(ax, key):
        for label, metrics in runs.items():
            ax.plot([m["step"] for m in metrics], [m[key] for m in metrics], lw=1.5, marker=".", label=label)
    return _training_figure(TRAINING_PANELS, path, draw)


def plot_eval_curve(evals: list[dict], path) -> str:
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    sizes = sorted({s for e in evals for s in e["accuracy"]}, key=int)
    for s in sizes:
        pts = [(e["step"], e["accuracy"][s]) for e in evals if s in e["accuracy"]]
        ax.plot(*zip(*pts), marker="o", label=f"{s} people")
    ax.plot([e["step"] for e in evals], [e["mean_accuracy"] for e in evals], "k--", lw=2, label="mean")
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy accuracy (official sets)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def plot_size_bars(reports: dict, path, title: str = "accuracy per puzzle size") -> str:
    """reports: {label: evaluation report (evaluate.py)}; grouped bars per size."""
    labels = list(reports)
    sizes = sorted({str(n) for r in reports.values() for n in r["per_size"]}, key=int)
    x = np.arange(len(sizes))
    w = 0.8 / max(len(labels), 1)
    fig = Figure(figsize=(1.2 * len(sizes) + 3, 3.6))
    ax = fig.subplots()
    for i, lab in enumerate(labels):
        per = {str(k): v for k, v in reports[lab]["per_size"].items()}
        ys = [per.get(s, {}).get("accuracy", np.nan) for s in sizes]
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * w, ys, w, label=lab)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(x, [f"{s} people" for s in sizes])
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def plot_run(run_dir) -> list[str]:
    """All plots of a run directory (runs.py layout); returns the files written."""
    run_dir = Path(run_dir)
    out = []
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    if metrics:
        out.append(plot_training(metrics, run_dir / "training.png"))
    evals = read_jsonl(run_dir / "evals.jsonl")
    if len(evals) > 1:
        out.append(plot_eval_curve(evals, run_dir / "eval_curve.png"))
    reports = {}
    for name, label in (("eval_before.json", "before RL"), ("eval_final.json", "after RL")):
        if (run_dir / name).exists():
            reports[label] = json.loads((run_dir / name).read_text())
    if reports:
        out.append(plot_size_bars(reports, run_dir / "accuracy_by_size.png"))
    return out
