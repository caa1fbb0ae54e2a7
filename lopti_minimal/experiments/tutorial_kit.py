"""What tutorial.ipynb needs besides the method: its set-up, its figures, the study's archive
read for it, and the summary its tests check. None of the method is here; the notebook's
cells call the package for that, and this module keeps bookkeeping and drawing code out of
the reader's way.

- `setup`: torch threads from LOPTI_THREADS, quiet progress bars and warnings, the seed.
- `show`: print a function's source without its docstring (the docstring explains the
  code in the package; the notebook's text does that here).
- `draw_*`: the figures, each from values the cells computed.
- `read_study`, `print_findings`, `draw_forest`, `draw_study_curves`: the study's archive,
  through the report's own tables (experiments/aggregate.py), so no number can go stale.
- `summary_line`: the key numbers, read from the notebook's variables by name, printed by
  its last cell; tests/test_tutorial.py compares them with a fresh execution.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import shutil
import time
import warnings

from tqdm import TqdmWarning

warnings.simplefilter("ignore", TqdmWarning)   # before the package imports tqdm.auto: no notebook-widget warning

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .. import mechanism  # noqa: E402
from . import aggregate, findings  # noqa: E402
from .diagnostics import per_bin_mean  # noqa: E402
from .grid import short  # noqa: E402

T_START = time.time()
TUTORIAL_RUNS = os.path.join("runs", "tutorial")      # section 6's run folder (or $LOPTI_TUTORIAL_RUNS)


def setup() -> None:
    """Threads from LOPTI_THREADS (e.g. ``LOPTI_THREADS=2 jupyter lab``), no notebook-widget
    warning from tqdm, no "Loading weights" bars, torch's seed 0; prints the versions."""
    global T_START
    import transformers
    assert os.path.isdir("lopti_minimal"), "start Jupyter in the repository root (the folder holding lopti_minimal/)"
    if "LOPTI_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["LOPTI_THREADS"]))
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    T_START = time.time()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; torch threads: {torch.get_num_threads()}")


def show(fn) -> None:
    """Print ``fn``'s source with its docstring replaced by "(docstring)"."""
    src = inspect.getsource(fn)
    if fn.__doc__ is None:
        print(src)
        return
    quote = '"' * 3
    head, _, rest = src.partition(quote)
    print(head + "(docstring)" + rest.partition(quote)[2])


def run_root() -> str:
    """Section 6's run folder: $LOPTI_TUTORIAL_RUNS, else runs/tutorial, emptied first (the
    tutorial's own folder: each execution replaces its run)."""
    root = os.environ.get("LOPTI_TUTORIAL_RUNS") or TUTORIAL_RUNS
    if root == TUTORIAL_RUNS and os.path.isdir(root):
        shutil.rmtree(root)
    return root


# ------------------------------------------------------------------------ figures: sections 3-5


def draw_surrogate_and_kl(policy_loss, kl_k3, cfg) -> None:
    """The per-token clipped surrogate against the ratio for A = +-1, and k3 against the log-ratio."""
    rho = torch.logspace(-1.3, 1.3, 400)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
    for A in (1.0, -1.0):
        loss, _ = policy_loss(rho.log(), torch.zeros_like(rho), torch.full_like(rho, A), cfg.eps_low, cfg.eps_high, cfg.clip_c)
        ax[0].plot(rho, loss, label=f"A = {A:+.0f}")
    ax[0].plot(rho, -rho, "k:", lw=0.8, label="unclipped, A = +1")
    ax[0].set(xscale="log", xlabel="ratio rho", ylabel="per-token loss",
              title=f"grpo.policy_loss (clip {cfg.eps_low:.2f}/{cfg.eps_high:.2f}, dual clip {cfg.clip_c:g})")
    ax[0].legend(fontsize=8)
    d = torch.linspace(-3, 3, 200)                     # log pi_ref - log pi
    ax[1].plot(d, kl_k3(torch.zeros_like(d), d))
    ax[1].set(xlabel="log pi_ref - log pi", ylabel="k3", title="grpo.kl_k3")
    fig.tight_layout()
    plt.show()


def _draw_tokens(ax, tok, response_ids, low_row, shown: int) -> None:
    """One response, token by token, red where ``low_row`` (stage 1), blue elsewhere."""
    ax.axis("off")
    x, y = 0.0, 1.0
    for t in range(shown):
        piece = tok.decode([int(response_ids[t])])
        label = piece.strip() or piece.replace("\n", "\\n").replace(" ", "\u2423")
        width = 0.0062 * len(label) + 0.006
        if x + width > 1.0:
            x, y = 0.0, y - 0.085
        ax.text(x, y, label, family="monospace", fontsize=9, va="top",
                bbox=dict(boxstyle="square,pad=0.15", lw=0, alpha=0.35, fc="tab:red" if low_row[t] > 0 else "tab:blue"))
        x += width
        if "\n" in piece:
            x, y = 0.0, y - 0.085


def draw_lopti_stages(tok, batch, row: int, reward_of_row: float, low, bins, changes: dict, eta: float) -> None:
    """(a) one response coloured by stage; (b) each stage's mean |change of log pi| per bin;
    (c) every token with an advantage: its change toward its advantage, per stage."""
    mask, valid = batch.response_mask, batch.response_mask > 0
    p_old = batch.old_logprobs.exp() * mask
    fig = plt.figure(figsize=(14, 7.4))
    grid = fig.add_gridspec(2, 2, height_ratios=[1.15, 1])
    n_tok = int(mask[row].sum())
    shown = min(n_tok, 120)
    ax = fig.add_subplot(grid[0, :])
    _draw_tokens(ax, tok, batch.response_ids[row], low[row], shown)
    ax.set_title(f"(a) response {row} (reward {reward_of_row:+.0f}), its first {shown} of {n_tok} tokens: "
                 f"red = stage 1 (pi_old < {eta}), blue = stage 2", loc="left", fontsize=10)
    ax = fig.add_subplot(grid[1, 0])
    colors = ("tab:red", "tab:blue")
    for k, (s, d) in enumerate(changes.items()):
        ax.bar([i + 0.4 * k - 0.2 for i in range(4)], per_bin_mean(d.abs(), bins), width=0.4, label=s, color=colors[k])
    ax.set_xticks(range(4), [f"{label}\n{int(b.sum())} tokens" for label, b in zip(mechanism.BIN_LABELS, bins)])
    ax.set(yscale="log", xlabel="pi_old(o_t)", ylabel="mean |change of log pi|", title="(b) what each stage changed, per bin of pi_old")
    ax.legend(fontsize=8)
    ax = fig.add_subplot(grid[1, 1])
    toward = (batch.advantages != 0) & valid              # tokens with an advantage: did they move its way?
    for k, (s, d) in enumerate(changes.items()):
        ax.scatter(p_old[toward], (d * batch.advantages.sign())[toward], s=4, alpha=0.5, color=colors[k], label=s)
    ax.axvline(eta, color="k", ls=":", lw=0.8)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_yscale("symlog", linthresh=1e-3)               # linear within +-1e-3, logarithmic beyond
    ax.set(xlabel="pi_old(o_t)", ylabel="change of log pi, toward its advantage",
           title="(c) every token with A != 0: its change in each stage")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def draw_gradient_norms(one_minus_p, norm, vocab: int, p_old, grad_h, valid, share, grad_h_bin, grad_theta_bin) -> None:
    """(a) the softmax bound check; (b) the tiny model's |d/dh| per token; (c) per bin: token
    share against the mean gradient norms (the paper's Fig. 1 a, b)."""
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    ax[0].scatter(one_minus_p, norm, s=2, alpha=0.4, label="autograd")
    xs = torch.linspace(0, 1, 50)
    ax[0].plot(xs, xs * math.sqrt(vocab / (vocab - 1)), "k--", lw=1, label="(1-p) sqrt(N/(N-1))")
    ax[0].plot(xs, xs * math.sqrt(2), "k:", lw=1, label="sqrt(2) (1-p)")
    ax[0].set(title="(a) softmax: ||d log p_y / dz||", xlabel="1 - p_y")
    ax[0].legend(fontsize=7)
    ax[1].scatter((1 - p_old[valid]), grad_h[valid], s=2, alpha=0.3, color="tab:orange")
    ax[1].set(title="(b) tiny model: ||d log pi(o_t) / dh_t||, every token", xlabel="1 - pi_old(o_t)")
    ax[2].bar(range(4), share, color="tab:gray", label="token share")
    ax[2].set_xticks(range(4), mechanism.BIN_LABELS)
    ax[2].set(title="(c) per bin: token share vs gradient norm", xlabel="pi_old(o_t)", ylabel="share of tokens")
    tw = ax[2].twinx()
    tw.plot(range(4), grad_h_bin, "o-", color="tab:orange", label="mean |d/dh|")
    tw.plot(range(4), grad_theta_bin, "s-", color="tab:green", label="mean |d/dtheta|")
    tw.set(yscale="log", ylabel="mean gradient norm (log scale)")
    tw.legend(fontsize=7, loc="center left")
    fig.tight_layout()
    plt.show()


def draw_step_shares(p_old, w_ar, low, valid, shares: dict, share, eta: float, alpha: float) -> None:
    """Every token's AR weight and Lopti stage; each bin's share of each step's squared gradient."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 3.6))
    p, w, lo = p_old[valid], w_ar[valid], low[valid] > 0
    ax[0].scatter(p[lo], w[lo], s=3, color="tab:red", label=f"Lopti stage 1 (pi_old < {eta})")
    ax[0].scatter(p[~lo], w[~lo], s=3, color="tab:blue", label="Lopti stage 2")
    ax[0].axhline(1.0, color="k", ls=":", lw=1, label="GRPO: weight 1")
    ax[0].set(xlabel="pi_old(o_t)", ylabel="A_hat / A", ylim=(0.6, 1.05),
              title=f"every token's weight: AR (Eq. 4, alpha {alpha}), Lopti stage")
    ax[0].legend(fontsize=7, loc="lower right")
    bottom = [0.0] * len(shares)
    for k, label in enumerate(mechanism.BIN_LABELS):
        vals = [shares[s][k] for s in shares]
        ax[1].bar(list(shares), vals, bottom=bottom, label=f"bin {label}: {share[k]:.0%} of tokens")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax[1].set(ylabel="share of the step's squared gradient norm", title="which tokens drive each optimizer step")
    ax[1].tick_params(axis="x", labelsize=8)
    ax[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    plt.show()


def draw_run(metrics: list[dict], label: str) -> None:
    """One training run's reward, share of derivations and KL, per step."""
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.3))
    steps = [m["step"] for m in metrics]
    for a, key, title in zip(ax, ("reward", "derive_share", "kl"),
                             ("mean reward", "share of samples that derive", "k3 KL to the initial policy")):
        a.plot(steps, [m[key] for m in metrics], "o-", color="tab:red", label=label)
        a.set(xlabel="RL step", title=title)
    ax[0].legend()
    fig.tight_layout()
    plt.show()


# ------------------------------------------------------------------------ the study's archive

STUDY_GRIDS = ("main", "control", "criterion", "isolation", "reinforce_pp", "token_fixes")   # every arm once
FOREST = (("steps_to_80", "steps to 80% derivations,\nminus GRPO's (< 0: sooner)", 1),
          ("heldout", "held-out accuracy at the last step,\nminus GRPO's", 3))


def read_study(archive: str) -> dict:
    """The report's tables of the archive's tiny-model preset (aggregate.aggregate)."""
    return {"archive": archive, **aggregate.aggregate(archive)["presets"]["cpu-tiny"]}


def print_findings(study: dict) -> None:
    """The declared test's sentences, as docs/RESULTS.md opens with them."""
    lines = findings.declared_section(study["declared"], None)
    print("\n".join(line.replace("**", "") for line in lines if line.startswith(("## ", "- **"))))


def forest_rows(study: dict) -> list[dict]:
    """Every arm of the study's grids once (the first grid that has it), with its paired
    differences from GRPO on the seeds of that grid's table."""
    rows, seen = [], set()
    for g in STUDY_GRIDS:
        table = study["grids"].get(g)
        for name, row in (table or {}).get("rows", {}).items():
            if name == "grpo" or name in seen:
                continue
            seen.add(name)
            rows.append({"arm": name, "label": short(row["label"]), "grid": g,
                         **{key: row["selection"][key]["vs_grpo"] for key, _, _ in FOREST}})
    return rows


def draw_forest(study: dict) -> list[dict]:
    """Each arm's mean difference from GRPO with its paired 95% interval (none with n <= 3:
    the points then are the seeds' own differences), for the two measures of FOREST."""
    rows = forest_rows(study)
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.36 * len(rows) + 1.6), sharey=True)
    y = list(range(len(rows)))[::-1]
    for ax, (key, title, digits) in zip(axes, FOREST):
        for yi, r in zip(y, rows):
            d = r[key]
            if d["n"] > 3 and d["lo"] is not None:
                ax.errorbar(d["mean"], yi, xerr=[[d["mean"] - d["lo"]], [d["hi"] - d["mean"]]], fmt="o",
                            color="tab:red" if d["excludes_zero"] else "tab:blue", capsize=3)
            else:
                ax.plot(d["diffs"], [yi] * len(d["diffs"]), "x", color="tab:gray")
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, [f"{r['label']} (n={r['steps_to_80']['n']})" for r in rows], fontsize=8)
    fig.suptitle(f"{study['archive']}: each arm minus GRPO, paired by seed, 95% t interval "
                 "(red: excludes 0; grey crosses: n <= 3, the seeds' own differences)", fontsize=10)
    fig.tight_layout()
    plt.show()
    for r in rows:
        print(f"{r['label']:<52} n={r['steps_to_80']['n']:<3}" + "   ".join(
            f"{key} {_interval(r[key], digits)}" for key, _, digits in FOREST))
    return rows


def _interval(d: dict, digits: int) -> str:
    if d["n"] <= 3 or d["lo"] is None:
        return f"{d['mean']:+.{digits}f} (seeds: " + ", ".join(f"{x:+.{digits}f}" for x in d["diffs"]) + ")"
    return f"{d['mean']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]"


def draw_study_curves(study: dict, arms: dict, grid: str = "criterion") -> None:
    """Mean over seeds with a 95% band, for the arms of one grid table (``arms``: label ->
    run name): the share of derivations, the reward, the held-out accuracy by step."""
    table = study["grids"][grid]
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    for label, name in arms.items():
        row = table["rows"][name]
        for a, key in zip(ax, ("derive_share", "reward")):
            c = row["curves"][key]
            line, = a.plot(c["step"], c["mean"], lw=2, label=label)
            a.fill_between(c["step"], c["lo"], c["hi"], color=line.get_color(), alpha=0.18, lw=0)
        held = row["heldout_along"]
        warm = (study.get("warm_start") or {}).get("heldout")       # step 0: the warm start, evaluated once
        steps = [0] * (warm is not None) + [int(s) for s in held if s != "final"] + [study["budget"]["steps"]]
        means = [warm] * (warm is not None) + [held[s]["mean"]["mean"] for s in held]
        halves = [0.0] * (warm is not None) + [held[s]["mean"]["half"] or 0.0 for s in held]
        ax[2].errorbar(steps, means, yerr=halves, marker="o", capsize=3, color=line.get_color(), label=label)
    ax[0].axhline(0.8, color="k", lw=0.6, ls=":")
    ax[0].set(xlabel="RL step", title=f"share of samples that derive (moving avg {study.get('window', 5)})")
    ax[1].set(xlabel="RL step", title="mean reward (moving average)")
    ax[2].set(xlabel="RL step", title="held-out accuracy (400 puzzles, greedy)")
    fig.legend(*ax[0].get_legend_handles_labels(), loc="lower center", ncol=len(arms), fontsize=8)
    fig.suptitle(f"{study['archive']}: mean over seeds {', '.join(map(str, table['seeds']))}, 95% t band", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    plt.show()


# ------------------------------------------------------------------------ the summary


def sig(x, digits: int = 6):
    """A number for the summary, to 6 significant digits (None stays None)."""
    return None if x is None else float(f"{x:.{digits}g}")


def _sigs(values) -> list:
    return [sig(v) for v in values]


def _sections_1_to_3(ns: dict) -> dict:
    valid, adv, w = ns["valid"], ns["adv"], ns["w_ar"]
    return {
        "scores": {kind: r.total for kind, r in ns["scores"].items()},
        "batch": {"responses": len(ns["texts"]), "tokens": int(ns["mask"].sum()),
                  "token_id_sum": int((ns["ro"].response_ids * ns["mask"].long()).sum()),
                  "rewards": ns["rewards"].tolist()},
        "nonzero_advantages": int((adv != 0).sum()),
        "ratio_first_update_max_dev": ns["first_ratio_dev"],
        "ar": {"alpha": ns["ALPHA"], "factor_min": sig(float(w[valid].min())), "factor_max": sig(float(w[valid].max())),
               "factor_per_bin": _sigs(ns["ar_per_bin"])},
        "lopti": {"eta": ns["ETA"], "stage_sizes": [int(ns["low"].sum()), int(ns["high"].sum())],
                  "two_calls_equal_lopti_update": ns["same"],
                  "stage1_ratio": [ns["m1"]["ratio_min"], ns["m1"]["ratio_max"]],
                  "stage2_ratio": _sigs([ns["m2"]["ratio_min"], ns["m2"]["ratio_max"]]),
                  "grad_norm": _sigs([ns["m1"]["grad_norm"], ns["m2"]["grad_norm"]]),
                  "mean_abs_change_per_bin": {s: _sigs(v) for s, v in ns["moved"].items()}},
    }


def _sections_4_to_6(ns: dict) -> dict:
    study = ns["study"]
    return {
        "bound_ok": ns["BOUND_OK"],
        "token_share": _sigs(ns["share"]),
        "grad_hidden_per_bin": _sigs(ns["grad_h_bin"]),
        "grad_theta_per_bin": _sigs(ns["grad_theta_bin"]),
        "grad_share_low_bins": {s: sig(ns["low_share"](ns["norms"][s])) for s in ("GRPO", "AR", "Lopti 2")},
        "study": {"archive": study["archive"], "seeds": study["grids"]["criterion"]["seeds"],
                  "forest": {r["arm"]: [r["steps_to_80"]["n"], sig(r["steps_to_80"]["mean"]), sig(r["heldout"]["mean"])]
                             for r in ns["forest"]}},
        "train": {"steps": len(ns["ms"]), "reward": [round(m["reward"], 3) for m in ns["ms"]],
                  "derive_share": [round(m["derive_share"], 3) for m in ns["ms"]]},
        "eval_accuracy": ns["acc"],
    }


def _exercises_and_later(ns: dict) -> dict:
    e = ns["entropy"]
    return {
        "exercises": ns["solved"],
        "explore_orders": {k: (_sigs(v) if isinstance(v, list) and k.endswith("ratio") else v)
                           for k, v in ns["explore_orders"].items()},
        "explore_temperature": {k: sig(v) for k, v in ns["explore_temperature"].items()},
        "explore_alpha": {str(a): sig(v) for a, v in ns["explore_alpha"].items()},
        "entropy_top": {"tau": sig(e["tau"]), "decision_kept": e["decision_kept"], "decision_max_H": sig(e["decision_max_H"]),
                        "kept_share_low_bins": sig(e["kept_share_low_bins"])},
        "seconds": round(time.time() - T_START, 1),
    }


def summary_line(ns: dict) -> str:
    """The line the last cell prints: "TUTORIAL_SUMMARY {json}", from the notebook's globals."""
    out = {**_sections_1_to_3(ns), **_sections_4_to_6(ns), **_exercises_and_later(ns)}
    return "TUTORIAL_SUMMARY " + json.dumps(out)
