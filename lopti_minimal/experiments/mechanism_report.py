"""The study report's mechanism section: what each method's updates did to the tokens of
each probability bin over training, from the per-step metrics the trainer logs
(lopti_minimal/mechanism.py; the paper's Fig. 1b and Fig. 3, at every step of every run).

Per run (``run_scalars``), each a number the report averages over seeds and compares with
GRPO paired by seed:

- ``rise_b0`` .. ``rise_b3``: per bin of pi_old, the share of A > 0 tokens whose
  probability rose in the step's update, among those that moved at all
  (``rise_pos_moved``), averaged over the run's steps (steps where the bin has no such
  token are skipped);
- ``fall_b0`` .. ``fall_b3``: the same for A < 0 tokens whose probability fell;
- ``grad_low_first`` / ``grad_low_mean``: the low bins' ([0, .5)) share of the squared
  gradient norm at step 1 / averaged over the measured steps (``grad_sq_share``, logged
  every ``grad_shares_every`` steps);
- ``nll_first`` / ``nll_last``: the mean -log pi_old of the sampled tokens (an estimate
  of the policy's entropy at the rollout temperature) at the first and the last step.
"""
from __future__ import annotations

import numpy as np

from ..mechanism import BIN_LABELS, N_BINS

MECH_COLS = tuple((f"rise_b{k}", f"rose, A > 0, {BIN_LABELS[k]}", 3) for k in range(N_BINS)) + \
    tuple((f"fall_b{k}", f"fell, A < 0, {BIN_LABELS[k]}", 3) for k in range(N_BINS)) + \
    (("grad_low_first", "low bins' share of |g|², step 1", 3),
     ("grad_low_mean", "low bins' share of |g|², mean", 3),
     ("nll_first", "-log π_old, step 1", 3), ("nll_last", "-log π_old, last step", 3))
MECH_KEYS = tuple(c[0] for c in MECH_COLS)


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _low(shares) -> float | None:
    return None if shares is None or shares[0] is None else shares[0] + shares[1]


def run_scalars(metrics: list[dict]) -> dict:
    """The mechanism numbers of one run (module docstring); None where not logged."""
    out = {}
    for k in range(N_BINS):
        out[f"rise_b{k}"] = _mean(m["rise_pos_moved"][k] for m in metrics if "rise_pos_moved" in m)
        out[f"fall_b{k}"] = _mean(m["fall_neg_moved"][k] for m in metrics if "fall_neg_moved" in m)
    grads = [_low(m["grad_sq_share"]) for m in metrics if "grad_sq_share" in m]
    out["grad_low_first"] = grads[0] if grads and "grad_sq_share" in metrics[0] else None
    out["grad_low_mean"] = _mean(grads)
    nll = [m["nll"] for m in metrics if "nll" in m]
    out["nll_first"], out["nll_last"] = (nll[0], nll[-1]) if nll else (None, None)
    return out


# ------------------------------------------------------------------------ curves

# (title, series of one step's metrics or None) for the figure's panels
def _series(key, k=None):
    def get(m):
        v = m.get(key)
        if v is None:
            return None
        return v[k] if k is not None else v
    return get


PANELS = tuple((f"A > 0 that rose, {BIN_LABELS[k]}", _series("rise_pos_moved", k)) for k in range(N_BINS)) + \
    tuple((f"A < 0 that fell, {BIN_LABELS[k]}", _series("fall_neg_moved", k)) for k in range(N_BINS)) + (
    ("low bins' share of the squared gradient norm", lambda m: _low(m.get("grad_sq_share"))),
    ("tokens with pi_old < 0.5 (share)", lambda m: _low(m.get("bin_share"))),
    ("mean -log pi_old (entropy estimate)", _series("nll")),
    ("share of derivations among the samples", _series("derive_share")))


def nan_moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average that skips NaN (a step where the quantity is undefined)."""
    out = np.full(len(y), np.nan)
    for t in range(len(y)):
        w = y[max(0, t - window + 1):t + 1]
        if np.isfinite(w).any():
            out[t] = np.nanmean(w)
    return out


def panel_curve(runs: list[dict], get, window: int):
    """(steps, mean, lo, hi) over the runs of one method: per-run trailing averages, then the
    mean over seeds with a 95% t band. Only the steps where every run logged the quantity."""
    from .stats import t975
    series = [{m["step"]: get(m) for m in r["metrics"]} for r in runs]
    steps = sorted(set.intersection(*({s for s, v in d.items() if v is not None} for d in series))) \
        if series else []
    if not steps:
        return None
    Y = np.array([[d[s] for s in steps] for d in series], dtype=float)
    if window > 1 and len(steps) > 1 and steps[-1] - steps[0] == len(steps) - 1:   # every step logged
        Y = np.array([nan_moving_average(y, window) for y in Y])
    mean = np.nanmean(Y, 0)
    if len(Y) > 1:
        half = t975(len(Y) - 1) * np.nanstd(Y, 0, ddof=1) / np.sqrt(len(Y))
    else:
        half = np.zeros_like(mean)
    return steps, mean, mean - half, mean + half


def curves(runs: list[dict], window: int) -> dict:
    """{panel title: {"step", "mean", "lo", "hi"}} of one method's runs (JSON-ready)."""
    out = {}
    for title, get in PANELS:
        c = panel_curve(runs, get, window)
        if c is not None:
            out[title] = {k: [round(float(x), 6) for x in v] for k, v in zip(("step", "mean", "lo", "hi"), c)}
    return out


def plot_mechanism(table: dict, path, title: str, window: int) -> str:
    """One figure: a panel per PANELS entry, a line per method of a grid table (its seeds'
    mean and 95% t band, from the rows' ``mechanism_curves``)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(16, 10))
    axes = fig.subplots(3, 4).ravel()
    for ax, (ptitle, _) in zip(axes, PANELS):
        for row in table["rows"].values():
            c = (row.get("mechanism_curves") or {}).get(ptitle)
            if not c:
                continue
            line, = ax.plot(c["step"], c["mean"], lw=1.8, label=row["label"],
                            marker="o" if len(c["step"]) < 8 else None, ms=3)
            ax.fill_between(c["step"], c["lo"], c["hi"], color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(ptitle, fontsize=9)
        ax.set_xlabel("RL step", fontsize=8)
        ax.grid(alpha=0.3)
    drawn = [ax for ax in axes if ax.get_lines()]
    if drawn:
        drawn[0].legend(fontsize=7)
    fig.suptitle(f"{title}; mean over seeds, 95% t band (moving avg {window} where every step is logged)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return str(path)


def tables(table: dict, cell, diff_cell) -> list[str]:
    """Two markdown tables (per-bin rise / fall shares; gradient share and entropy) from a
    grid table whose rows carry ``mechanism`` {key: {"mean", "vs_grpo"}}."""
    rows = [r for r in table["rows"].values() if r.get("mechanism")]
    if not rows:
        return []
    out = []
    for cols in (MECH_COLS[:8], MECH_COLS[8:]):
        cols = [c for c in cols if any(c[0] in r["mechanism"] for r in rows)]
        if not cols:
            continue
        out += ["| method | " + " | ".join(t for _, t, _ in cols) + " |", "|---|" + "---|" * len(cols)]
        for r in rows:
            cells = []
            for key, _, dg in cols:
                c = r["mechanism"].get(key)
                txt = cell(c["mean"], dg) if c else "–"
                if c and c.get("vs_grpo"):
                    txt += f"<br>Δ {diff_cell(c['vs_grpo'], dg)}"
                cells.append(txt)
            out.append(f"| {r['label']} | " + " | ".join(cells) + " |")
        out.append("")
    return out
