"""Where the sampled tokens' probabilities lie (paper Fig. 1a), per behaviour.

    python scripts/token_bins.py --model checkpoints/tiny-warm            # the warm start
    python scripts/token_bins.py --model runs/<run>/final                  # after RL

Samples G responses (T 0.7, as the RL rollouts) to each of --prompts generated puzzles,
recomputes pi_old(o_t) teacher-forced at the same temperature (what AR and Lopti use,
grpo.batch_logprobs), and prints the token shares of the paper's four bins [0,.25)
[.25,.5) [.5,.75) [.75,1] -- for all tokens, for the derivations and for the guesses
(behaviours.py) -- next to the paper's Fig. 1a (Qwen2.5-7B), the share of tokens below
0.5 (those Lopti's first stage trains on, eta 0.5) and the share of derivations.  Writes
the numbers as JSON with --out.

The puzzles come from a seed no training run uses (default 424242 + 1), so the
measurement is on puzzles the policy has not seen.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(model, tokenizer, prompts: int = 32, group_size: int = 8, people: int = 3,
            temperature: float = 0.7, max_new_tokens: int = 640, seed: int = 424243,
            keep_texts: bool = False) -> dict:
    import torch
    from lopti_minimal.task import dataset, kk
    from lopti_minimal.task.behaviours import DERIVE, behaviour_of
    from lopti_minimal.experiments.diagnostics import (PAPER_FIG1, DiagConfig, bin_masks, collect_batch,
                                                       token_shares, update_config)
    from lopti_minimal.grpo import batch_logprobs

    cfg = DiagConfig(prompts=prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                     temperature=temperature, people=people, seed=seed, micro_batch_size=16)
    records = dataset.generate_records(people, prompts, seed=seed, exclude=kk.official_keys())
    with torch.no_grad():
        ro, rewards, adv, texts = collect_batch(model, tokenizer, records, cfg)
        logp = batch_logprobs(model, ro, update_config(cfg, ro.input_ids.shape[0]))
    valid = ro.response_mask
    p = logp.exp() * valid
    derive = torch.tensor([behaviour_of(t) == DERIVE for t in texts]).unsqueeze(1).to(valid)

    def part(rows):
        v = valid * rows
        n = float(v.sum())
        return {"tokens": int(n), "token_share": token_shares(bin_masks(p, v)),
                "below_0.5": float(((p < 0.5).float() * v).sum()) / n if n else None}

    return {**({"texts": texts} if keep_texts else {}), "responses": len(texts), "derive_share": float(derive.mean()),
            "accuracy": float((rewards == 3.0).float().mean()),
            "all": part(torch.ones_like(derive)), "derive": part(derive), "guess": part(1 - derive),
            "paper_fig1a": PAPER_FIG1["token_share"],
            "settings": {"prompts": prompts, "group_size": group_size, "people": people,
                         "temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}}


def load_policy(path: str, threads: int | None = None):
    """A model folder or a run directory (its final policy), float32 on the CPU."""
    import torch
    from lopti_minimal.models import load_model_and_tokenizer
    from lopti_minimal.runs import resolve_model_source
    if threads:
        torch.set_num_threads(threads)
    source, _ = resolve_model_source(path)
    return load_model_and_tokenizer(source, dtype=torch.float32, device="cpu")


def format_report(res: dict) -> str:
    fmt = lambda xs: " ".join(f"{x:5.3f}" for x in xs)  # noqa: E731
    lines = [f"{res['responses']} responses, derivations {res['derive_share']:.3f}, "
             f"accuracy {res['accuracy']:.3f}",
             "                 [0,.25) [.25,.5) [.5,.75) [.75,1]   < 0.5   tokens"]
    for key in ("all", "derive", "guess"):
        r = res[key]
        if r["tokens"]:
            lines.append(f"  {key:<12}  {fmt(r['token_share'])}    {r['below_0.5']:.3f}  {r['tokens']}")
    lines.append(f"  paper Fig.1a  {fmt(res['paper_fig1a'])}    "
                 f"{sum(res['paper_fig1a'][:2]):.3f}  (Qwen2.5-7B)")
    return "\n".join(lines)


def add_sampling_args(ap: argparse.ArgumentParser, prompts: int = 32, seed: int = 424243,
                      model_help: str = "HF folder, or a run directory (its final policy)") -> None:
    """The options of a measurement on a model's own sampled batches (this script's and
    token_selection.py's): the policy, the puzzles, the sampling, the output."""
    ap.add_argument("--model", default="checkpoints/tiny-warm", help=model_help)
    ap.add_argument("--prompts", type=int, default=prompts, help="puzzles per batch (cpu-tiny's step: 8)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--people", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.7, help="as the RL rollouts")
    ap.add_argument("--max-new-tokens", type=int, default=640)
    ap.add_argument("--seed", type=int, default=seed, help="of the puzzles (one no training run uses)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", help="write the numbers here (JSON)")


def write_json(path: str, obj) -> None:
    """--out of the measurement scripts: the numbers as JSON, the folder made if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sampling_args(ap)
    a = ap.parse_args(argv)
    model, tok = load_policy(a.model, a.threads)
    res = measure(model, tok, a.prompts, a.group_size, a.people, a.temperature, a.max_new_tokens, a.seed)
    res["model"] = a.model
    print(format_report(res))
    if a.out:
        write_json(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
