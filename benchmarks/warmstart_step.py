"""Warm-start step time: what padding and the attention mask cost: printed figures.

    python benchmarks/warmstart_step.py                 # tiny preset, 2 threads, sizes 3 4 5
    python benchmarks/warmstart_step.py --threads 1 --sizes 3 --batches 6 --json out.json

The warm start is bounded by wall-clock time (95 minutes in the first run of the recipe), so
every second saved per step is more steps in the same budget.  For each puzzle size this
draws ``--batches`` batches of generated puzzles exactly as `experiments.warmstart` does
(the batch size from the mean length of 32 puzzles and ``tokens_per_batch``, the compact
prompt and target, rows right-padded to a multiple of 64) and times one training step
(bf16-autocast forward, response-only loss, backward, AdamW) three ways, on the same
puzzles:

random+mask     batches in drawing order, the padding mask passed to the model (the
                warm start before length bucketing);
random          the same batches, no attention mask (the loss is unchanged: right padding
                and causal attention, see warmstart.response_loss);
bucketed        the puzzles sorted by length and cut into batches of neighbours
                (warmstart_data.bucketed_batches), no attention mask (the warm start now).

It prints mean seconds per step (the first step of each way is a warm-up and is not
counted; the CPU's kernels are built per shape), the share of padding positions, and the
speedup over random+mask.  The model is freshly initialised: the cost of a step does not
depend on the weights.  Nothing else should run on the machine while it measures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lopti_minimal.experiments import warmstart as W  # noqa: E402
from lopti_minimal.experiments import warmstart_data as D  # noqa: E402
from lopti_minimal.models import make_tiny_model  # noqa: E402
from lopti_minimal.tokenizer import build_kk_tokenizer  # noqa: E402


def time_step(model, opt, ids, attn, mask) -> float:
    """Seconds for one training step of the warm start (warmstart.response_loss, backward,
    AdamW); attn=None: no attention mask, as the warm start runs it."""
    t = time.perf_counter()
    loss = W.response_loss(model, ids, mask, attention_mask=attn)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t


def measure(model, opt, tok, batches, use_mask: bool) -> dict:
    seconds, padding = [], []
    for batch in batches:
        ids, attn, mask = D.collate(batch, tok.pad_token_id)
        padding.append(1 - attn.float().mean().item())
        seconds.append(time_step(model, opt, ids, attn if use_mask else None, mask))
    timed = seconds[1:] or seconds        # the first step of each way warms up the kernels
    return {"s_per_step": sum(timed) / len(timed), "padding": sum(padding) / len(padding)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 4, 5])
    ap.add_argument("--batches", type=int, default=W.WarmStartConfig.bucket_batches,
                    help="batches per size and way (the warm start buckets this many at once)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    if a.batches < 2:
        ap.error("--batches must be at least 2 (the first step of each way is a warm-up)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tok = build_kk_tokenizer(vocab_size=W.WarmStartConfig.vocab_size)
    model = make_tiny_model(a.preset, len(tok), tokenizer=tok, seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    stream = D.PuzzleStream(seed=0, exclude=set())

    def encode(r):
        return D.encode_example(tok, D.default_prompt(r), D.default_response(r))

    rows = []
    print(f"preset {a.preset}, {a.threads} threads, {a.batches} batches per size and way")
    print(f"{'size':>4} {'batch':>5} {'way':<12} {'s/step':>7} {'padding':>8} {'speedup':>8}")
    for n in a.sizes:
        B = D.batch_size_for(stream, n, tok, D.default_response, W.WarmStartConfig.tokens_per_batch)
        pool = [encode(stream.next(n)) for _ in range(B * a.batches)]
        drawn = [pool[i:i + B] for i in range(0, len(pool), B)]
        ways = {"random+mask": (drawn, True), "random": (drawn, False),
                "bucketed": (D.bucketed_batches(pool, B, random.Random(0)), False)}
        base = None
        for name, (batches, use_mask) in ways.items():
            m = measure(model, opt, tok, batches, use_mask)
            base = base or m["s_per_step"]
            m.update(size=n, batch=B, way=name, speedup=base / m["s_per_step"])
            rows.append(m)
            print(f"{n:>4} {B:>5} {name:<12} {m['s_per_step']:>7.3f} {m['padding']:>8.2f} "
                  f"{m['speedup']:>7.2f}x", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.preset, "threads": a.threads, "batches": a.batches, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
