"""The study report's figures: each grid's learning curves and the main grid's accuracy per
puzzle size (report.write_report draws them; the mechanism's figure is in mechanism_report.py).
"""
from __future__ import annotations

import numpy as np

from .aggregate import CURVE_KEYS


def _seed_text(seeds) -> str:
    """0, 1, 2, 3 -> "0-3"; 0, 2 -> "0, 2" (the report's words for a table's seeds)."""
    seeds = list(seeds)
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds)) or "none"


# =======================================================================================
# 6. Plots
# =======================================================================================

def plot_curves(table: dict, path, title: str, window: int) -> str:
    """Learning curves of a grid table: mean over its seeds with a 95% t band."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(16, 3.8))
    axes = fig.subplots(1, 3)
    for ax, key, lab in zip(axes, CURVE_KEYS, ("mean reward", "accuracy of sampled responses",
                                               "share of derivations among the samples")):
        for row in table["rows"].values():
            c = (row["curves"] or {}).get(key)
            if not c or not c["step"]:
                continue
            line, = ax.plot(c["step"], c["mean"], lw=2, label=row["label"])
            ax.fill_between(c["step"], c["lo"], c["hi"], color=line.get_color(), alpha=0.18, lw=0)
        ax.set_xlabel("RL step")
        ax.set_title(f"{lab} (moving avg {window})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}; mean over seeds {_seed_text(table['seeds'])}, 95% t band", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def plot_sizes(table: dict, sizes: list[int], path, title: str) -> str:
    """Final accuracy per size and avg of a grid table, with 95% t error bars."""
    from matplotlib.figure import Figure
    cols = [str(n) for n in sizes] + ["avg"]
    x = np.arange(len(cols))
    rows = list(table["rows"].values())
    w = 0.8 / max(len(rows), 1)
    fig = Figure(figsize=(1.3 * len(cols) + 3, 3.8))
    ax = fig.subplots()
    for i, row in enumerate(rows):
        m = [row["accuracy"][c]["mean"] for c in cols]
        h = [row["accuracy"][c]["half"] or 0.0 for c in cols]
        ax.bar(x + (i - (len(rows) - 1) / 2) * w, m, w, yerr=h, capsize=2, label=row["label"])
    ax.set_xticks(x, [f"{c} people" if c != "avg" else "avg" for c in cols])
    ax.set_ylabel("greedy accuracy (official sets)")
    ax.set_title(f"{title}; seeds {_seed_text(table['seeds'])}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)
