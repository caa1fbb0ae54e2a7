"""Which tokens the later methods single out, measured on a model's own batches.

    python scripts/token_selection.py                                   # the warm start
    python scripts/token_selection.py --model runs/<run>/ckpt-000010    # a run's checkpoint

The entropy_top method (token_fixes.py; Wang et al. 2025, "Beyond the 80/20 Rule", Eq. 5)
trains only the tokens whose next-token entropy H_t is at or above the batch's 80th
percentile tau. On the embedded default the one token that decides the reward most is the
first response token: "\\n" starts a guess (chance accuracy), "\\n " a derivation (right
about half the time; task/behaviours.py, choice 4). This script samples RL steps' batches
as the trainer does (--steps batches of --prompts puzzles x G at --temperature, 0.7 as the
rollouts, fresh puzzles each), computes log pi_old and H_t from one teacher-forced pass
(grpo.batch_logprobs with entropy=True, the values token_fixes.batch_entropies gives) and
tau per batch exactly as the method does (token_fixes.high_entropy_mask), and prints:

- tau (and the tau other values of rho would set), the decision token's entropy and the
  share of rows where it is kept;
- the share of each kind of token kept: the decision token, the rest of a guess (its
  random roles: ~ln 2 nats each), the rest of a derivation (its phrasing choices: ~ln 3);
- for entropy_top and, on the same batches, Clip-Cov (the detached tokens) and KL-Cov (the
  penalised ones; token_covariance and the masks of token_fixes.py at their defaults): the
  selected tokens by kind, by the paper's pi_old bins [0,.25) [.25,.5) [.5,.75) [.75,1]
  (Fig. 1a), and the share with a negative advantage. GRPO trains every token; CISPO
  selects none (it reweights every token from the second optimizer step on).

If the decision token's entropy is below tau the 80/20 rule never trains it: the policy
gradient then reaches the guess-or-derive choice only through the parameters it shares with
the kept tokens. Writes the numbers as JSON with --out. Puzzles from a seed no training
run uses.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KINDS = ("decision", "guess_rest", "derive_rest")
TOPS = (0.1, 0.2, 0.25, 0.3, 0.4)           # rho values whose threshold is also reported


def classify(response_mask, derive_rows):
    """[B, R] float masks of the three kinds of response token: the first one (the decision),
    the rest of a guess, the rest of a derivation."""
    import torch
    first = torch.zeros_like(response_mask)
    first[:, 0] = 1.0
    first = first * response_mask
    rest = response_mask - first
    d = derive_rows.unsqueeze(1).to(response_mask)
    return {"decision": first, "guess_rest": rest * (1 - d), "derive_rest": rest * d}


def summarise(entropy, kept, p_old, kinds: dict, adv=None) -> dict:
    """Per kind: tokens, mean entropy, share kept; the kept tokens' share per pi_old bin and
    each bin's share kept; with ``adv``, the share of kept tokens whose advantage is
    negative. All tensors [B, R]; kept and the kinds' masks 0/1 floats."""
    from lopti_minimal.experiments.diagnostics import bin_masks
    valid = sum(kinds.values())
    out = {"tokens": int(valid.sum()), "kept_share": float((kept * valid).sum() / valid.sum())}
    for name, m in kinds.items():
        n = float(m.sum())
        out[name] = {"tokens": int(n), "entropy": float((entropy * m).sum() / n) if n else None,
                     "kept": float((kept * m).sum() / n) if n else None}
    bins = bin_masks(p_old, valid)
    n_kept = float((kept * valid).sum())
    out["bins_of_kept"] = [float((kept * b).sum()) / n_kept if n_kept else None for b in bins]
    out["kept_per_bin"] = [float((kept * b).sum() / b.sum()) if float(b.sum()) else None for b in bins]
    if adv is not None:
        out["kept_negative_adv"] = float((kept * valid * (adv < 0)).sum()) / n_kept if n_kept else None
    return out


def measure(model, tokenizer, steps: int = 4, prompts: int = 8, group_size: int = 8, people: int = 3,
            temperature: float = 0.7, max_new_tokens: int = 640, top: float = 0.2, seed: int = 515151):
    """One summary per sampled batch (an RL step's worth), plus the decision-token entropies."""
    import torch
    from lopti_minimal.experiments.diagnostics import DiagConfig, collect_batch, update_config
    from lopti_minimal.grpo import batch_logprobs
    from lopti_minimal.task import dataset, kk
    from lopti_minimal.task.behaviours import DERIVE, behaviour_of
    from lopti_minimal.token_fixes import (clip_cov_mask, high_entropy_mask, kl_cov_mask,
                                           selection_generator, token_covariance)
    from lopti_minimal.config import TrainConfig
    knobs = TrainConfig()                      # Clip-Cov's and KL-Cov's defaults

    batches = []
    for s in range(steps):
        cfg = DiagConfig(prompts=prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                         temperature=temperature, people=people, seed=seed + s, micro_batch_size=16)
        records = dataset.generate_records(people, prompts, seed=seed + s, exclude=kk.official_keys())
        with torch.no_grad():
            ro, rewards, adv, texts = collect_batch(model, tokenizer, records, cfg)
            ucfg = update_config(cfg, ro.input_ids.shape[0])
            logp, entropy = batch_logprobs(model, ro, ucfg, entropy=True)   # one pass for both
        valid = ro.response_mask
        p_old = logp.exp() * valid
        kept = high_entropy_mask(entropy, valid, top)
        h = entropy[valid > 0].float()
        tau = float(torch.quantile(h, 1.0 - top))
        derive = torch.tensor([behaviour_of(t) == DERIVE for t in texts])
        kinds = classify(valid, derive)
        res = summarise(entropy, kept, p_old, kinds, adv)
        # the covariance methods' selections on the same batch (token_fixes.build's, at pi_old)
        cov = token_covariance(logp, adv, valid)
        masks = {"clip_cov": clip_cov_mask(cov, valid, knobs.clip_cov_ratio, knobs.clip_cov_low,
                                           knobs.clip_cov_high, selection_generator(seed, s)),
                 "kl_cov": kl_cov_mask(cov, valid, knobs.kl_cov_ratio)}
        res["by_method"] = {m: summarise(entropy, k, p_old, kinds, adv) for m, k in masks.items()}
        res.update(tau=tau, derive_share=float(derive.float().mean()),
                   accuracy=float((rewards == 3.0).float().mean()),
                   decision_entropies=[round(float(x), 4) for x in entropy[:, 0]],
                   # the threshold other choices of rho would set on this batch
                   tau_by_top={r: float(torch.quantile(h, 1.0 - r)) for r in TOPS})
        batches.append(res)
    return batches


def pool(sums: list[dict]) -> dict:
    """summarise()'s figures over several batches, each weighted by its tokens (its kept
    tokens for the shares among the kept)."""
    def wmean(pairs):
        pairs = [(v, w) for v, w in pairs if v is not None]
        return sum(v * w for v, w in pairs) / max(sum(w for _, w in pairs), 1)
    n_kept = [b["kept_share"] * b["tokens"] for b in sums]
    out = {"tokens": sum(b["tokens"] for b in sums),
           "kept_share": wmean([(b["kept_share"], b["tokens"]) for b in sums])}
    for k in KINDS:
        out[k] = {"tokens": sum(b[k]["tokens"] for b in sums),
                  "entropy": wmean([(b[k]["entropy"], b[k]["tokens"]) for b in sums]),
                  "kept": wmean([(b[k]["kept"], b[k]["tokens"]) for b in sums])}
    out["bins_of_kept"] = [wmean([(b["bins_of_kept"][i], w) for b, w in zip(sums, n_kept)]) for i in range(4)]
    if "kept_negative_adv" in sums[0]:
        out["kept_negative_adv"] = wmean([(b["kept_negative_adv"], w) for b, w in zip(sums, n_kept)])
    return out


def pooled(batches: list[dict]) -> dict:
    """The batches pooled (pool), with the entropy threshold's figures (plain means over
    batches) and each covariance method's selection pooled the same way."""
    out = pool(batches)
    out["tau"] = sum(b["tau"] for b in batches) / len(batches)
    out["derive_share"] = sum(b["derive_share"] for b in batches) / len(batches)
    out["tau_by_top"] = {r: sum(b["tau_by_top"][r] for b in batches) / len(batches) for r in TOPS}
    dec = [(e, b["tau"]) for b in batches for e in b["decision_entropies"]]
    out["decision_above_tau"] = sum(e >= t for e, t in dec) / len(dec)
    out["by_method"] = {m: pool([b["by_method"][m] for b in batches]) for m in batches[0]["by_method"]}
    return out


def format_report(pool: dict, batches: list[dict], top: float = 0.2) -> str:
    taus = ", ".join(f"{b['tau']:.3f}" for b in batches)
    lines = [f"{len(batches)} batches; tau ({1 - top:.0%} quantile of H) {pool['tau']:.3f} nats "
             f"(per batch {taus}); derivations "
             f"{pool['derive_share']:.3f}; tokens kept {pool['kept_share']:.3f}",
             "  kind          tokens  mean H (nats)  kept"]
    for k in KINDS:
        r = pool[k]
        lines.append(f"  {k:<12}  {r['tokens']:>6}  {r['entropy']:13.3f}  {r['kept']:.3f}")
    lines.append(f"  decision token at or above tau: {pool['decision_above_tau']:.3f} of rows")
    lines.append("  tau at other rho: " + ", ".join(f"{r}: {t:.3f}" for r, t in pool["tau_by_top"].items()))
    lines.append("\nThe tokens each method singles out (entropy_top: kept; clip_cov: detached; "
                 "kl_cov: penalised)")
    lines.append("  method       share   of decision/guess/derive   by pi_old bin [0,.25) [.25,.5) "
                 "[.5,.75) [.75,1]   A < 0")
    for m, r in {"entropy_top": pool, **pool["by_method"]}.items():
        kinds = "/".join(f"{r[k]['kept']:.3f}" for k in KINDS)
        bins = " ".join(f"{x:.3f}" for x in r["bins_of_kept"])
        lines.append(f"  {m:<11}  {r['kept_share']:.4f}  {kinds:<25}  {bins:<40}  "
                     f"{r['kept_negative_adv']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from scripts.token_bins import add_sampling_args, load_policy, write_json
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sampling_args(ap, prompts=8, seed=515151,
                      model_help="HF folder, a run's checkpoint folder, or a run directory (its final policy)")
    ap.add_argument("--steps", type=int, default=4, help="batches, each an RL step's worth")
    ap.add_argument("--top", type=float, default=0.2, help="share kept (the method's rho)")
    a = ap.parse_args(argv)
    model, tok = load_policy(a.model, a.threads)
    batches = measure(model, tok, a.steps, a.prompts, a.group_size, a.people,
                      a.temperature, a.max_new_tokens, top=a.top, seed=a.seed)
    pool = pooled(batches)
    print(f"{a.model}\n" + format_report(pool, batches, a.top))
    if a.out:
        write_json(a.out, {"model": a.model, "pooled": pool, "batches": batches, "settings": vars(a)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
