"""Which responses and tokens carry one step's gradient, bin by bin.

    python scripts/gradient_by_token.py results/study-fixed/cpu-tiny/clip_cov-x2-s1 --step 11

Every `grad_shares_every` steps a run logs each pi_old bin's share of the squared gradient
norm of its method's loss (`grad_sq_share`, mechanism.gradient_sq_shares: the paper's
Fig. 1b question). Now and then one measurement is far from a run's others. This script
asks why: it replays the run from its saved config (run.json) up to --step in a scratch
folder (a run repeats bit for bit on the same machine and code; the replayed shares are
printed next to the logged ones, and must agree), and at that step's measurement
splits each bin's squared norm into parts, each measured exactly as the bin is (one
`grpo_update` with that part as the token mask, the whole batch's token-mean denominator,
learning rate 0):

- blocks of --block rows in the update's order (rows are sorted by length, so a block is
  not a group), then the rows of the largest block;
- the tokens of the largest row, one by one, when it holds at most --max-tokens of the bin:
  their text, pi_old, pi_ref, advantage and squared norm.

The parts' squared norms need not add up to the bin's: gradients of different tokens can
cancel or reinforce (the "coherence" printed is |sum|^2 / sum of |part|^2). The paper's bound (Prop. 4.2)
ties a token's gradient norm to 1 - pi(o_t) times factors of its context (the singular
values of the layer Jacobians above the activation); this shows how
much that factor can vary. Costs one update's forward and backward per part.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BINS = ("[0,.25)", "[.25,.5)", "[.5,.75)", "[.75,1]")


def decompose(model, batch, cfg, fix=None, tokenizer=None, block: int = 8, max_tokens: int = 16) -> list[dict]:
    """Each bin's squared gradient norm, split by blocks, rows and tokens (module docstring)."""
    import torch
    from lopti_minimal.grpo import grpo_update
    from lopti_minimal.mechanism import bin_masks
    one = dataclasses.replace(cfg, ppo_epochs=1)
    still = torch.optim.SGD(model.parameters(), lr=0.0)

    def sq(mask):
        return grpo_update(model, still, batch, one, token_mask=mask, pg_loss=fix)["grad_norm"] ** 2

    def parts(mask, rows_of):
        out = []
        for key, rows in rows_of:
            m = torch.zeros_like(mask)
            m[rows] = mask[rows]
            if m.sum() > 0:
                out.append({"rows": key, "tokens": int(m.sum()), "sq": sq(m)})
        return sorted(out, key=lambda p: -p["sq"])

    B = batch.input_ids.shape[0]
    resp = batch.input_ids[:, batch.prompt_len:]
    p_old = batch.old_logprobs.exp()
    result = []
    for k, mask in enumerate(bin_masks(p_old, batch.response_mask)):
        res = {"bin": BINS[k], "tokens": int(mask.sum()), "sq": sq(mask) if mask.sum() > 0 else 0.0}
        if mask.sum() > 0:
            blocks = parts(mask, [(f"{s}-{min(s + block, B) - 1}", slice(s, s + block)) for s in range(0, B, block)])
            first = int(blocks[0]["rows"].split("-")[0])
            rows = parts(mask, [(r, slice(r, r + 1)) for r in range(first, min(first + block, B))])
            res.update(blocks=blocks, rows=rows)
            r = rows[0]["rows"]
            valid = batch.response_mask[r] > 0
            res["top_row"] = {"row": r, "advantage": float(batch.advantages[r][valid][0]),   # GRPO: one per row
                              "length": int(valid.sum())}
            positions = mask[r].nonzero().flatten().tolist()
            if len(positions) <= max_tokens:
                toks = []
                for t in positions:
                    m = torch.zeros_like(mask)
                    m[r, t] = 1.0
                    toks.append({"position": t, "p_old": float(p_old[r, t]),
                                 "p_ref": (float(batch.ref_logprobs[r, t].exp())
                                           if batch.ref_logprobs is not None else None),
                                 "context": tokenizer.decode(resp[r, max(0, t - 6):t + 1]) if tokenizer else None,
                                 "sq": sq(m)})
                res["top_row"]["tokens"] = sorted(toks, key=lambda x: -x["sq"])
        result.append(res)
    return result


@contextlib.contextmanager
def at_step(step: int, fn):
    """Call fn(model, batch, cfg, fix, logged_shares) where the trainer measures the mechanism
    of (1-based) step `step`, after its own measurement and before the update."""
    from lopti_minimal import mechanism
    orig = mechanism.Probe.before

    def before(self, model, batch, fix=None):
        orig(self, model, batch, fix)
        if self.step + 1 == step:               # the trainer counts steps from 0, logs from 1
            fn(model, batch, self.cfg, fix, self.metrics.get("grad_sq_share"))

    mechanism.Probe.before = before
    try:
        yield
    finally:
        mechanism.Probe.before = orig


def replay(run_dir: str, step: int, work: str, threads: int | None = None, reward_fn=None, **kw) -> dict:
    """Replay run_dir's config to `step` in `work`; the decomposition at that step, with the
    shares the replay measured and those the run logged."""
    import torch
    from lopti_minimal import trainer
    from lopti_minimal.runs import config_from_json
    from lopti_minimal.models import load_model_and_tokenizer
    cfg = config_from_json(json.load(open(os.path.join(run_dir, "run.json")))["config"])
    cfg = dataclasses.replace(cfg, run_dir=os.path.join(work, "replay"), steps=step, eval_every=0,
                              final_eval=False, plots=False, progress=False, tensorboard=False,
                              threads=threads or cfg.threads)
    logged = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    logged = next((m.get("grad_sq_share") for m in logged if m["step"] == step), None)
    if logged is None:
        raise SystemExit(f"{run_dir} logged no grad_sq_share at step {step}")
    _, tok = load_model_and_tokenizer(cfg.model, dtype=torch.float32, device="cpu")
    out = {}

    def measure(model, batch, c, fix, shares):
        out.update(replayed=shares, bins=decompose(model, batch, c, fix, tok, **kw))

    with at_step(step, measure):
        trainer.train(cfg, reward_fn=reward_fn, log=lambda s: None)
    return {"run": run_dir, "step": step, "logged": logged, **out}


def format_report(res: dict) -> str:
    lines = [f"{res['run']}, step {res['step']}: grad_sq_share logged {res['logged']}, replayed {res['replayed']}"]
    for b in res["bins"]:
        lines.append(f"\n{b['bin']}: {b['tokens']} tokens, |g|^2 {b['sq']:.3e}")
        if not b["tokens"]:
            continue
        total = sum(p["sq"] for p in b["blocks"])
        lines.append(f"  blocks of rows (coherence {b['sq'] / total:.3f}): " + ", ".join(
            f"{p['rows']} {p['sq'] / total:.3f}" for p in b["blocks"][:4]))
        lines.append("  rows of the largest block: " + ", ".join(
            f"{p['rows']} ({p['tokens']} tok) {p['sq']:.2e}" for p in b["rows"][:4]))
        top = b["top_row"]
        lines.append(f"  row {top['row']}: advantage {top['advantage']:+.3f}, {top['length']} tokens")
        for t in top.get("tokens", []):
            ref = f"{t['p_ref']:.4f}" if t["p_ref"] is not None else "-"
            lines.append(f"    t={t['position']:<4} pi_old {t['p_old']:.3f} pi_ref {ref}  |g|^2 {t['sq']:.2e}  "
                         f"{t['context']!r}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run directory (its run.json and metrics.jsonl; an archived run will do)")
    ap.add_argument("--step", type=int, required=True, help="a step whose grad_sq_share the run logged")
    ap.add_argument("--block", type=int, default=8, help="rows per block")
    ap.add_argument("--max-tokens", type=int, default=16, help="split the top row by token up to this many")
    ap.add_argument("--threads", type=int, default=None, help="default: the run's own")
    ap.add_argument("--out", help="write the numbers here (JSON)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        res = replay(a.run, a.step, work, a.threads, block=a.block, max_tokens=a.max_tokens)
    print(format_report(res))
    if a.out:
        from scripts.token_bins import write_json
        write_json(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
