"""Figures of the diagnostics (diagnostics.py): fig1.png and fig3.png.

    fig1.png  -- paper Fig. 1: (a) token share per probability bin, (b) mean per-token
                 gradient norm per bin (final hidden state and all parameters) and the norm
                 of the bin-restricted GRPO-loss gradient next to the all-token one,
                 (c) probability change per bin after one SGD step on all tokens,
                 (e) ... on the lowest bin only, (f) ... on the highest bin only; bars split
                 by the sign of the advantage.
    fig3.png  -- paper Fig. 3: share of A > 0 tokens whose probability rose after one update,
                 per bin, one line per method (GRPO, AR, Lopti, AR+Lopti); one panel per
                 optimizer measured.

Design choices:

1. In the style of the paper's panels: Fig. 1 (a, b, c, e, f) and Fig. 3.
2. Only reads the JSON-ready dict that diagnostics.run returns.
"""
from __future__ import annotations

import os

# Figures are built without pyplot, so importing this module changes no global
# matplotlib state (a notebook keeps its inline backend; a server needs no display).
from matplotlib.figure import Figure

LABELS = ("[0,.25)", "[.25,.5)", "[.5,.75)", "[.75,1]")
X = range(4)
METHOD_NAMES = {"grpo": "GRPO", "ar": "GRPO+AR", "lopti": "GRPO+Lopti", "ar_lopti": "GRPO+AR+Lopti"}


def _nz(xs):
    """None (an empty bin) plots as nothing."""
    return [float("nan") if x is None else x for x in xs]


def _bar_pair(ax, a, b, la, lb, colors=("tab:red", "tab:blue")):
    w = 0.38
    ax.bar([x - w / 2 for x in X], _nz(a), w, label=la, color=colors[0])
    ax.bar([x + w / 2 for x in X], _nz(b), w, label=lb, color=colors[1])
    ax.set_xticks(list(X), LABELS, fontsize=8)


def plot_fig1(res: dict, path: str, title: str = "") -> str:
    fig = Figure(figsize=(19, 3.6))
    axes = fig.subplots(1, 5)
    # (a) token share
    ax = axes[0]
    ax.bar(X, res["token_share"], color="tab:gray")
    ax.set_xticks(list(X), LABELS, fontsize=8)
    ax.set_title("(a) token share per bin")
    ax.set_xlabel("pi_old(o_t)")
    # (b) gradient norms: per-token (|w| = 1) and bin-restricted loss gradient
    ax = axes[1]
    _bar_pair(ax, res["grad_hidden"], res["grad_params"],
              "per token, d/dh (final hidden)", "per token, d/dtheta (sampled)",
              ("tab:orange", "tab:green"))
    ax.set_title("(b) mean ||grad log pi(o_t)|| (log scale)")
    ax.set_yscale("log")
    ax.legend(fontsize=6, loc="lower left")
    ax2 = ax.twinx()
    loss = _nz([res["sgd"].get(f"bin{k}", {}).get("loss_grad_norm") for k in range(4)])
    ax2.plot(list(X), loss, "k^-", label="loss grad, bin only")
    ax2.axhline(res["sgd"]["all"]["loss_grad_norm"], color="k", ls="--", lw=1,
                label="loss grad, all tokens")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=7, loc="center right")
    # (c, e, f) probability change after one SGD step
    for ax, key, name in zip(axes[2:], ("all", "bin0", "bin3"),
                             ("(c) update all tokens", "(e) update lowest bin only",
                              "(f) update highest bin only")):
        e = res["sgd"].get(key)
        if e is None:
            ax.set_visible(False)
            continue
        _bar_pair(ax, e["pos_adv"], e["neg_adv"], "A > 0", "A < 0")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(name)
        ax.set_xlabel("pi_old(o_t)")
        ax.legend(fontsize=7)
    axes[2].set_ylabel("mean pi_new - pi_old (SGD, lr %g)" % res["config"]["lr"])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def plot_fig3(res: dict, path: str, title: str = "") -> str:
    per_opt = res["fig3"]
    fig = Figure(figsize=(5.2 * len(per_opt), 3.6))
    axes = fig.subplots(1, len(per_opt), squeeze=False)
    for ax, (opt, per) in zip(axes[0], per_opt.items()):
        for i, (meth, e) in enumerate(per.items()):
            c = f"C{i}"
            ax.plot(list(X), _nz(e["rise_share"]), "o-", color=c, label=METHOD_NAMES.get(meth, meth))
            if "rise_share_resolved" in e:    # dashed: only tokens whose pi changed at all
                ax.plot(list(X), _nz(e["rise_share_resolved"]), "x--", color=c, lw=0.8)
        ax.axhline(0.5, color="k", ls=":", lw=0.8)
        ax.set_xticks(list(X), LABELS, fontsize=8)
        ax.set_xlabel("pi_old(o_t)")
        ax.set_ylabel("share of A>0 tokens with pi up")
        ax.set_title(f"Fig. 3 style, one {opt.upper()} update\n(dashed: among tokens whose pi changed)",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def plot_all(res: dict, out_dir: str, title: str = "") -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    return [plot_fig1(res, os.path.join(out_dir, "fig1.png"), title),
            plot_fig3(res, os.path.join(out_dir, "fig3.png"), title)]
