"""Per-probability-bin diagnostics: the paper's Figure 1 and Figure 3 at small scale.

Measures the paper's claim (Yang et al. 2025, §3-4, Prop. 4.2, Fig. 1: low-probability
tokens carry large gradients, ||d log pi(o_t) / d z|| = ||e_y - pi|| between ~(1 - pi) and
sqrt(2) (1 - pi), and dominate the update) on one batch of grouped rollouts. What is
measured, and the exact definitions: docs/DIAGNOSTICS.md.

Design choices:

1. The paper's fixed bins of pi_old(o_t) at the rollout temperature, [0,.25) [.25,.5)
   [.5,.75) [.75,1]: token shares (Fig. 1a), gradient norms (Fig. 1b), delta p after one
   update (Fig. 1c,e,f), and the share of A > 0 tokens that rose per method (Fig. 3).
2. Composed from the project's own pieces (sampling, reward, grpo, reweight, lopti), so
   what is measured is exactly what the trainer does; tests/test_diagnostics.py checks each
   number by hand on a bare softmax head.
3. Per-token parameter gradients by one exact per-token backward (torch.autograd.grad) on
   a seeded stratified subsample of `tokens_per_bin` tokens per bin, not torch.func: exact,
   simple and bounded in memory; the subsample is the only approximation.
4. The update of Fig. 1 is the GRPO objective of the paper's runs (verl's
   `compute_policy_loss`, `kl_penalty`, `agg_loss`) restricted to a bin as a Lopti stage
   (token_mask, denominator "all"), one plain SGD step, lr 1e-3, parameters restored.
5. Fig. 3: one update per method from the same parameters on the same batch, plain SGD
   by default (AdamW optional, `fig3_optimizers`), with the reference's K&K settings:
   AR alpha 0.2, Lopti eta 0.4, AR+Lopti alpha 0.3 and eta 0.5.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from .. import trainer
from ..batch import Rollout
from ..config import PAPER_METHODS, TrainConfig
from ..grpo import batch_logprobs, group_advantages, grpo_update, token_advantages, token_logprobs
# The paper's fixed bins of pi_old (Fig. 1, Fig. 3), shared with the trainer's per-step metrics.
from ..mechanism import BIN_LABELS, N_BINS, bin_index, bin_masks
from ..models import is_instruct, kk_prompt, load_model_and_tokenizer
from ..precision import build_optimizer
from ..sampling import sample_groups
from ..task import dataset
from ..task.reward import score_response

# The paper's Figure 1 numbers (Qwen2.5-7B-Instruct-1M, GRPO on K&K).
PAPER_FIG1 = {"token_share": [0.19, 0.10, 0.10, 0.61],
              "grad_norm": [0.71, 0.36, 0.24, 0.15], "grad_norm_all": 0.82}
# The paper's Figure 3: share of A > 0 tokens whose probability rose (GRPO, lowest to
# highest bin, roughly; AR / Lopti lift the high bins to about 0.53).
PAPER_FIG3 = {"grpo": [0.53, None, None, 0.50], "ar_or_lopti_high_bins": 0.53}


# --------------------------------------------------------------------------- config


@dataclass
class DiagConfig:
    prompts: int = 4                 # K&K prompts in the batch
    group_size: int = 8              # G responses per prompt (paper: 8)
    max_new_tokens: int = 256
    temperature: float = 0.7         # rollout temperature (paper: 0.7); also in every log-prob
    people: int = 3                  # puzzle size of the generated prompts
    seed: int = 0
    prompt_style: str = "auto"       # models.kk_prompt: chat template for instruct models
    tokens_per_bin: int = 8          # per-token parameter gradients: tokens sampled per bin
    lr: float = 1e-3                 # Fig. 1: plain SGD step size (paper: 1e-3)
    micro_batch_size: int = 4        # rows per forward/backward (memory only)
    fig3_optimizers: tuple = ("sgd",)   # add "adamw" to also measure with the trainer's AdamW
    adamw_lr: float = 1e-6           # AdamW lr for Fig. 3 (paper: 1e-6)
    kl_coef: float = 0.001           # k3 KL to the diagnosed model (its gradient is 0 at step 1)
    fig1_updates: tuple = ("all", "bin0", "bin1", "bin2", "bin3")   # which SGD steps to measure
    reward: str = "logic_rl"         # or "random": see collect_batch


def update_config(cfg: DiagConfig, batch_rows: int, grad_clip: float = math.inf,
                  lr: float | None = None) -> TrainConfig:
    """The settings of one diagnostic update (the trainer's, TrainConfig's method section,
    with these changes): the whole batch is one mini-batch (one optimizer step), no
    gradient clipping for plain SGD."""
    return TrainConfig(group_size=cfg.group_size, temperature=cfg.temperature,
                       lr=cfg.lr if lr is None else lr, grad_clip=grad_clip,
                       kl_coef=cfg.kl_coef, mini_batch_size=batch_rows,
                       micro_batch_size=cfg.micro_batch_size)


# --------------------------------------------------------------------------- bins


def per_bin_mean(values: torch.Tensor, masks: list[torch.Tensor]) -> list[float | None]:
    """Mean of `values` over each mask's tokens (None for an empty bin)."""
    out = []
    for m in masks:
        n = float(m.sum())
        out.append(float((values * m).sum()) / n if n else None)
    return out


def token_shares(masks: list[torch.Tensor]) -> list[float]:
    """Share of the valid tokens in each bin (Fig. 1a)."""
    counts = [float(m.sum()) for m in masks]
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def rise_share(delta_p: torch.Tensor, adv: torch.Tensor, masks: list[torch.Tensor]):
    """Fig. 3: per bin, the share of tokens with A > 0 whose probability rose (delta > 0).
    Returns (shares, counts of A > 0 tokens); a share is None where the count is 0."""
    pos = (adv > 0).float()
    rose = (delta_p > 0).float()
    shares, counts = [], []
    for m in masks:
        n = float((m * pos).sum())
        counts.append(int(n))
        shares.append(float((m * pos * rose).sum()) / n if n else None)
    return shares, counts


def rise_share_resolved(delta_p: torch.Tensor, adv: torch.Tensor, masks: list[torch.Tensor]):
    """As rise_share, but among the A > 0 tokens whose probability changed at all: a token
    at pi = 1 in float32 (log pi == 0 exactly) cannot show a change, and such saturated
    tokens can fill most of the top bin of a small, sharp model."""
    pos = (adv > 0).float()
    moved = (delta_p != 0).float()
    return per_bin_mean((delta_p > 0).float(), [m * pos * moved for m in masks])


# ---------------------------------------------------------------------- the batch


def encode_prompt(record: dict, tokenizer, style: str = "auto") -> list[int]:
    """Token ids of the K&K prompt. A chat-template prompt already holds its special
    tokens; the tiny tokenizer adds its BOS (the convention of models.encode_prompts)."""
    text = kk_prompt(record, tokenizer, style)
    return tokenizer(text, add_special_tokens=not is_instruct(tokenizer))["input_ids"]


def collect_batch(model, tokenizer, records: list[dict], cfg: DiagConfig):
    """One batch of grouped rollouts with rewards and GRPO advantages.

    cfg.reward = "logic_rl": the Logic-RL reward of the decoded responses (reward.py,
    as in the reference runs).
    cfg.reward = "random": a seeded fair coin, 0 or 1, per response -- for a model that
    never gets the format right (SmolLM2-135M scores -3 on every response, so every group
    is constant and every advantage 0, and no update moves anything). The gradient
    mechanics the figures measure do not depend on which responses are rewarded; the
    docs say so wherever this is used.

    Returns (rollout, rewards [B], token advantages [B, R], texts)."""
    prompt_ids = [encode_prompt(r, tokenizer, cfg.prompt_style) for r in records]
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)
    ro = sample_groups(model, prompt_ids, cfg.group_size, cfg.max_new_tokens,
                       temperature=cfg.temperature, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, generator=gen)
    lengths = ro.response_mask.sum(1).long().tolist()
    texts = [tokenizer.decode(r[:n], skip_special_tokens=True)
             for r, n in zip(ro.response_ids.tolist(), lengths)]
    if cfg.reward == "logic_rl":
        rewards = torch.tensor([score_response(t, records[i // cfg.group_size]).total
                                for i, t in enumerate(texts)])
    elif cfg.reward == "random":
        coin = torch.Generator().manual_seed(cfg.seed + 1)
        rewards = torch.randint(0, 2, (len(texts),), generator=coin).float()
    else:
        raise ValueError(f"unknown reward {cfg.reward!r}")
    rewards = rewards.to(ro.response_mask.device)        # a GPU run keeps everything there
    adv = token_advantages(group_advantages(rewards, cfg.group_size), ro.response_mask)
    return ro, rewards, adv, texts


# ------------------------------------------------------------------ gradient norms


def _final_hidden_hook(model, store: dict):
    """Capture the input of the LM head (the final hidden state h, after the last norm)."""
    def grab(_module, args):
        store["h"] = args[0]
    return model.get_output_embeddings().register_forward_pre_hook(grab)


def _param_norm(grads) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))


def sample_tokens(masks: list[torch.Tensor], k: int, seed: int = 0) -> list[tuple[int, int]]:
    """Up to k (row, position) pairs per bin, drawn uniformly without replacement."""
    gen = torch.Generator().manual_seed(seed)
    chosen = []
    for m in masks:
        idx = m.nonzero()
        pick = torch.randperm(len(idx), generator=gen)[:k]
        chosen.extend(tuple(idx[i].tolist()) for i in pick)
    return chosen


def gradient_norms(model, batch: Rollout, temperature: float, chosen: list[tuple[int, int]]):
    """Per-token gradient norms of log pi_T(o_t) (|w| = 1).

    Returns (hidden [B, R]: ||d log pi(o_t) / d h_t|| for every token, 0 on padding;
             params {(b, t): ||d log pi(o_t) / d theta||} for the `chosen` tokens).
    One forward per row keeps memory at one sequence; see the module docstring for why
    this is exact."""
    model.eval()                    # no dropout; gradients still flow
    params = [p for p in model.parameters() if p.requires_grad]
    P = batch.prompt_len
    B, R = batch.response_mask.shape
    hidden = torch.zeros(B, R, device=batch.response_mask.device)
    param_norms = {}
    by_row: dict[int, list[int]] = {}
    for b, t in chosen:
        by_row.setdefault(b, []).append(t)
    for b in range(B):
        n = int(batch.response_mask[b].sum())
        if n == 0:
            continue
        store: dict = {}
        handle = _final_hidden_hook(model, store)
        try:
            # The row cut after its last real token: causal, so nothing before changes.
            logp = token_logprobs(model, batch.input_ids[b:b + 1, :P + n],
                                  batch.attention_mask[b:b + 1, :P + n], P, temperature)[0]
        finally:
            handle.remove()
        h = store["h"]
        (gh,) = torch.autograd.grad(logp.sum(), h, retain_graph=bool(by_row.get(b)))
        # h holds the last n+1 positions (logits_to_keep); position i predicts token i.
        hidden[b, :n] = gh[0, -(n + 1):-1, :].float().norm(dim=-1).detach()
        rows = by_row.get(b, [])
        for j, t in enumerate(rows):
            grads = torch.autograd.grad(logp[t], params, retain_graph=j + 1 < len(rows),
                                        allow_unused=True)
            param_norms[(b, t)] = _param_norm(grads)
    return hidden, param_norms


def _mean_se(xs: list[float]):
    if not xs:
        return None, None, 0
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None, 1
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs)), len(xs)


# -------------------------------------------------------------- one-step updates


def snapshot(model) -> dict:
    """A copy of every parameter, to restore after a diagnostic update."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@torch.no_grad()
def restore(model, snap: dict) -> None:
    for n, p in model.named_parameters():
        p.copy_(snap[n])


def make_sgd(model, lr: float) -> torch.optim.SGD:
    """Plain SGD: theta <- theta - lr * grad (no momentum, no weight decay)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0, weight_decay=0.0)


def probability_change(model, batch: Rollout, logp0: torch.Tensor, update, ucfg: TrainConfig,
                       snap: dict):
    """Run `update()` (which changes the model), measure pi_new - pi_old of every response
    token, then restore the parameters. Returns (delta_p [B, R], update's return).

    delta_p = pi_old * expm1(log pi_new - log pi_old): the same number as
    exp(new) - exp(old), but without the float32 rounding of probabilities near 1
    (where exp() resolves only ~6e-8, less than a typical change), so that its sign --
    what Fig. 3 counts -- is that of the log-prob change."""
    out = update()
    logp1 = batch_logprobs(model, batch, ucfg)
    restore(model, snap)
    delta = logp0.exp() * torch.expm1(logp1 - logp0)
    return delta * batch.response_mask, out


def sgd_bin_update(model, batch: Rollout, token_mask, ucfg: TrainConfig, lr: float):
    """One plain SGD step on the GRPO loss of the masked tokens (denominator: all valid
    tokens, as a Lopti stage). Returns grpo_update's metrics; metrics["grad_norm"] is the
    norm of the (unclipped) loss gradient over all parameters."""
    return grpo_update(model, make_sgd(model, lr), batch, ucfg, token_mask=token_mask, denominator="all")


def method_update(name: str, model, batch: Rollout, ucfg: TrainConfig, optimizer):
    """One update of one of the paper's methods (config.PAPER_METHODS, at its K&K settings)
    from the current parameters (Fig. 3): the trainer's AR and update, on this batch."""
    cfg = dataclasses.replace(ucfg, method=name, alpha=None, eta=None)     # the paper's alpha, eta
    return trainer.update(model, optimizer, trainer.reweight(batch, cfg), cfg, step=0)


# ------------------------------------------------------------------- the whole run


def analyse(model, rollout: Rollout, adv_tok: torch.Tensor, cfg: DiagConfig, log=print) -> dict:
    """All the numbers for one batch (see the module docstring). `adv_tok` [B, R] are the
    token advantages. The model is left exactly as it was."""
    t0 = time.time()
    was_training = model.training
    ucfg = update_config(cfg, rollout.input_ids.shape[0])
    # pi_old recomputed teacher-forced: the baseline of every delta p, and the reference
    # log-probs of the k3 KL (the diagnosed model is its own reference, as at RL step 1).
    old = batch_logprobs(model, rollout, ucfg)
    batch = dataclasses.replace(rollout, advantages=adv_tok, old_logprobs=old, ref_logprobs=old)
    valid, adv = batch.response_mask, batch.advantages
    p0 = batch.old_logprobs.exp() * valid
    masks = bin_masks(p0, valid)
    res = _bin_summary(cfg, masks, adv, p0)
    res.update(_gradient_section(model, batch, cfg, masks, adv, p0))
    log(f"  gradient norms done ({time.time() - t0:.0f}s)")
    snap = snapshot(model)
    res["sgd"] = _sgd_section(model, batch, cfg, ucfg, masks, adv, snap)
    log(f"  SGD probability changes done ({time.time() - t0:.0f}s)")
    res["fig3"] = _fig3_section(model, batch, cfg, ucfg, masks, adv, snap)
    log(f"  method updates done ({time.time() - t0:.0f}s)")
    model.train(was_training)
    res["seconds"] = round(time.time() - t0, 1)
    return res


def _bin_summary(cfg, masks, adv, p0) -> dict:
    """Token share, advantages and mean probability per bin (Fig. 1a)."""
    return {"config": _jsonable(asdict(cfg)), "bins": list(BIN_LABELS),
            "n_tokens": int(sum(m.sum() for m in masks)), "n_rows": int(adv.shape[0]),
            "bin_counts": [int(m.sum()) for m in masks],
            "token_share": token_shares(masks),
            "mean_adv": per_bin_mean(adv, masks),
            "mean_abs_adv": per_bin_mean(adv.abs(), masks),
            "share_pos_adv": per_bin_mean((adv > 0).float(), masks),
            "share_neg_adv": per_bin_mean((adv < 0).float(), masks),
            "mean_prob": per_bin_mean(p0, masks)}


def _gradient_section(model, batch, cfg, masks, adv, p0) -> dict:
    """Per-token gradient norms per bin (Fig. 1b): hidden state for every token, all
    parameters for the sampled tokens (mean, standard error, sample size)."""
    chosen = sample_tokens(masks, cfg.tokens_per_bin, cfg.seed)
    hidden, pnorms = gradient_norms(model, batch, cfg.temperature, chosen)
    out = {"grad_hidden": per_bin_mean(hidden, masks),
           "grad_hidden_adv_weighted": per_bin_mean(hidden * adv.abs(), masks),
           "grad_params": [], "grad_params_se": [], "grad_params_n": [],
           "grad_params_adv_weighted": []}
    bins_of = bin_index(p0)
    for k in range(N_BINS):
        keys = [bt for bt in pnorms if int(bins_of[bt]) == k]
        m, se, n = _mean_se([pnorms[bt] for bt in keys])
        mw, _, _ = _mean_se([pnorms[bt] * abs(float(adv[bt])) for bt in keys])
        out["grad_params"].append(m)
        out["grad_params_se"].append(se)
        out["grad_params_n"].append(n)
        out["grad_params_adv_weighted"].append(mw)
    return out


def _change_stats(delta, adv, masks) -> dict:
    """What one update did to the probabilities, per bin."""
    shares, counts = rise_share(delta, adv, masks)
    return {"pos_adv": per_bin_mean(delta, [m * (adv > 0) for m in masks]),
            "neg_adv": per_bin_mean(delta, [m * (adv < 0) for m in masks]),
            "abs_all": per_bin_mean(delta.abs(), masks),
            "mean_delta": per_bin_mean(delta, masks),
            "rise_share": shares, "n_pos": counts,
            "rise_share_resolved": rise_share_resolved(delta, adv, masks),
            "share_unchanged": per_bin_mean((delta == 0).float(), masks)}


def _sgd_section(model, batch, cfg, ucfg, masks, adv, snap) -> dict:
    """One plain SGD step on all tokens / on one bin's tokens (Fig. 1 c, e, f)."""
    out = {}
    updates = [("all", None)] + [(f"bin{k}", masks[k]) for k in range(N_BINS)]
    for name, mask in [u for u in updates if u[0] in cfg.fig1_updates]:
        delta, met = probability_change(
            model, batch, batch.old_logprobs,
            lambda m=mask: sgd_bin_update(model, batch, m, ucfg, cfg.lr), ucfg, snap)
        out[name] = _change_stats(delta, adv, masks)
        out[name]["loss_grad_norm"] = met["grad_norm"] if met["n_steps"] else 0.0
    return out


def _fig3_section(model, batch, cfg, ucfg, masks, adv, snap) -> dict:
    """One update per method and optimizer from the same parameters (Fig. 3)."""
    out = {}
    B = batch.input_ids.shape[0]
    for opt_name in cfg.fig3_optimizers:
        out[opt_name] = {}
        for meth in PAPER_METHODS:
            if opt_name == "sgd":
                u, opt = ucfg, make_sgd(model, cfg.lr)
            else:        # the trainer's AdamW, with its clip at 1.0
                u = update_config(cfg, B, grad_clip=1.0, lr=cfg.adamw_lr)
                opt = build_optimizer(model, u)
            delta, _ = probability_change(
                model, batch, batch.old_logprobs,
                lambda: method_update(meth, model, batch, u, opt), u, snap)
            out[opt_name][meth] = _change_stats(delta, adv, masks)
            out[opt_name][meth]["mean_delta_pos"] = out[opt_name][meth]["pos_adv"]
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def run(model, tokenizer, cfg: DiagConfig, log=print) -> dict:
    """Sample one batch of K&K rollouts and analyse it."""
    records = dataset.generate_records(cfg.people, cfg.prompts, seed=cfg.seed)
    t0 = time.time()
    ro, rewards, adv, texts = collect_batch(model, tokenizer, records, cfg)
    log(f"  sampled {ro.response_ids.shape[0]} responses, {int(ro.response_mask.sum())} tokens "
        f"({time.time() - t0:.0f}s); rewards {rewards.tolist()}")
    if not adv.any():
        log("  WARNING: every advantage is 0 (all groups constant): no update will move "
            "anything; try more tokens, more prompts, or --reward random")
    res = analyse(model, ro, adv, cfg, log=log)
    res["rewards"] = rewards.cpu().tolist()
    res["logic_rl_rewards"] = [score_response(t, records[i // cfg.group_size]).total
                               for i, t in enumerate(texts)]
    res["sampling_seconds"] = round(time.time() - t0 - res["seconds"], 1)
    res["example_response"] = texts[0][:400]
    res["paper"] = {"fig1": PAPER_FIG1, "fig3": PAPER_FIG3}
    return res


# ------------------------------------------------------------------------------ CLI


def _parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m lopti_minimal.experiments.diagnostics",
        description="Per-probability-bin gradient norms and probability changes "
                    "(paper Fig. 1 and Fig. 3) on one batch of K&K rollouts.")
    ap.add_argument("--model", required=True, help="HF folder, .gguf file or hub id")
    ap.add_argument("--out", required=True, help="output folder (diagnostics.json, PNGs)")
    d = DiagConfig()
    ap.add_argument("--prompts", type=int, default=d.prompts)
    ap.add_argument("--group-size", type=int, default=d.group_size)
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    ap.add_argument("--temperature", type=float, default=d.temperature)
    ap.add_argument("--people", type=int, default=d.people)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--prompt-style", default=d.prompt_style, choices=("auto", "qwen", "compact"))
    ap.add_argument("--tokens-per-bin", type=int, default=d.tokens_per_bin)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size)
    ap.add_argument("--reward", default=d.reward, choices=("logic_rl", "random"),
                    help="random: a fair coin per response (for models that always score -3)")
    ap.add_argument("--fig1-updates", default=",".join(d.fig1_updates),
                    help="comma list of the SGD steps of Fig. 1 to measure (all,bin0..bin3)")
    ap.add_argument("--adamw", action="store_true",
                    help="also measure Fig. 3 with the trainer's AdamW (lr --adamw-lr)")
    ap.add_argument("--adamw-lr", type=float, default=d.adamw_lr)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--title", default=None, help="figure title (default: the model path)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = _parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = DiagConfig(prompts=a.prompts, group_size=a.group_size, max_new_tokens=a.max_new_tokens,
                     temperature=a.temperature, people=a.people, seed=a.seed,
                     prompt_style=a.prompt_style, tokens_per_bin=a.tokens_per_bin, lr=a.lr,
                     micro_batch_size=a.micro_batch_size, adamw_lr=a.adamw_lr,
                     fig1_updates=tuple(a.fig1_updates.split(",")), reward=a.reward,
                     fig3_optimizers=("sgd", "adamw") if a.adamw else ("sgd",))
    model, tok = load_model_and_tokenizer(a.model, dtype=torch.float32)
    res = run(model, tok, cfg)
    res["model"] = a.model
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "diagnostics.json"), "w") as f:
        json.dump(res, f, indent=1)
    from .diagnostic_plots import plot_all
    paths = plot_all(res, a.out, title=a.title or a.model)
    print(format_summary(res))
    print("wrote", os.path.join(a.out, "diagnostics.json"), *paths)
    return 0


def bin_loss_grad_norms(res: dict) -> list:
    """Norm of the bin-restricted loss gradient per bin (None where not measured)."""
    return [res["sgd"].get(f"bin{k}", {}).get("loss_grad_norm") for k in range(N_BINS)]


def _fmt(xs, nd=3):
    return "[" + ", ".join("   -  " if x is None else f"{x:.{nd}g}" for x in xs) + "]"


def format_summary(res: dict) -> str:
    """A few lines for the terminal."""
    lines = [f"bins {list(BIN_LABELS)}  tokens {res['n_tokens']}  counts {res['bin_counts']}",
             f"token share      {_fmt(res['token_share'])}   (paper {PAPER_FIG1['token_share']})",
             f"mean advantage   {_fmt(res['mean_adv'])}",
             f"|grad_h log p|   {_fmt(res['grad_hidden'])}",
             f"|grad_th log p|  {_fmt(res['grad_params'])}  (n {res['grad_params_n']})",
             "loss-grad norm   all %.3g | bins %s" % (
                 res["sgd"]["all"]["loss_grad_norm"], _fmt(bin_loss_grad_norms(res)))]
    for name, e in res["sgd"].items():
        lines.append(f"dp after SGD[{name}]: A>0 {_fmt(e['pos_adv'])}  A<0 {_fmt(e['neg_adv'])}"
                     f"  rise(A>0) {_fmt(e['rise_share'])}  ties {_fmt(e['share_unchanged'])}")
    for opt, per in res["fig3"].items():
        for meth, e in per.items():
            lines.append(f"rise share {opt:5s} {meth:8s} {_fmt(e['rise_share'])}  n {e['n_pos']}"
                         f"  | among changed {_fmt(e['rise_share_resolved'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
