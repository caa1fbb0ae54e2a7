"""Model FLOPs of the RL step's passes, and the machine's own matmul limit at their shapes.

    python benchmarks/flops.py --preset smollm2-cpu     # the limit at the preset's shapes
    python benchmarks/rl_step.py --preset smollm2-cpu --parts step limit   # beside the phases

Used by benchmarks/rl_step.py (part "limit") to say how far each phase of a step is from
what the CPU could do: achieved = model FLOPs / seconds, limit = the rate of the same matrix
products measured on this machine, in this run, at this thread count.

Design choices:

1. **Model FLOPs, recomputation not counted** (the usual "model FLOPs utilisation"): the
   matrix products a forward of the real tokens needs, x 3 for a forward and backward
   (the backward's two products per forward product). Padding, gradient checkpointing's
   second forward and the backward of the frozen embedding are work the implementation
   chooses, not the model, so they count against the achieved rate. Element-wise work
   (norms, activations, softmax) is not counted: at these widths it is small next to the
   products in FLOPs, and the time it takes is exactly what the ratio should expose.
2. **What a forward multiplies** (a Llama/Qwen2 decoder, per real position): every
   projection of every layer, 2 x in x out each; attention, 2 x 2 x heads x head_dim x
   (keys it attends to: its own position + 1, causal, real keys only); the LM head, 2 x
   hidden x vocab, at response positions only (`logits_to_keep`: the prompt's logits are
   never computed).
3. **The limit is measured, not quoted**: torch.matmul at each product's shape (the shapes
   a micro-batch runs: rows x positions by in by out, and the backward's two transposed
   products), in bf16 and in float32, on this machine at this thread count. The limit of a
   pass is FLOP-weighted: sum of its FLOPs / sum of (FLOPs / rate) over its products, the
   rate it would run at if every product ran at its own measured speed and nothing else
   took time; the faster of bf16 and float32 is the limit quoted.
4. Attention's products are timed as the batched matmuls [rows x heads, positions, head_dim]
   x [.., head_dim, positions] (the scores) and back (the weighted values), their
   full-square FLOPs scaled to the causal half the model needs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402


class Shapes(NamedTuple):
    """A decoder's widths (from a transformers config)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config) -> "Shapes":
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(config.num_hidden_layers, config.hidden_size, heads,
                   getattr(config, "num_key_value_heads", heads), head_dim,
                   config.intermediate_size, config.vocab_size)

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of one layer's projections: q, k, v, o, gate, up, down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h),
                ("gate", h, i), ("up", h, i), ("down", i, h)]


def causal_pairs(lengths) -> int:
    """Sum over rows of n (n + 1) / 2: the (query, key) pairs causal attention computes over
    each row's n real positions."""
    return sum(n * (n + 1) // 2 for n in lengths)


def forward_flops(s: Shapes, positions: int, pairs: int, head_positions: int) -> dict:
    """Model FLOPs of one forward, by kind: `positions` real positions, `pairs` causal
    (query, key) pairs (causal_pairs), the LM head at `head_positions` positions."""
    linear = 2 * positions * s.layers * sum(i * o for _, i, o in s.projections())
    attention = 2 * 2 * pairs * s.layers * s.heads * s.head_dim
    head = 2 * head_positions * s.hidden * s.vocab
    return {"linear": linear, "attention": attention, "head": head}


def batch_flops(s: Shapes, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                backward: bool) -> dict:
    """Model FLOPs of one teacher-forced pass over a batch (x3 with its backward)."""
    lengths = attention_mask.sum(1).tolist()
    f = forward_flops(s, int(sum(lengths)), causal_pairs(lengths), int(response_mask.sum()))
    f = {k: v * (3 if backward else 1) for k, v in f.items()}
    f["total"] = sum(f.values())
    return f


def rollout_flops(s: Shapes, rollout, group_size: int) -> dict:
    """Model FLOPs of sampling a rollout: each group's prompt once (the prefill), then every
    sampled token a one-position forward attending to all positions before it."""
    P = rollout.prompt_len
    prompt = rollout.attention_mask[:, :P].sum(1).tolist()
    resp = rollout.response_mask.sum(1).long().tolist()
    groups = prompt[::group_size]
    pairs = causal_pairs(groups) + sum(causal_pairs([p + r]) - causal_pairs([p]) for p, r in zip(prompt, resp))
    f = forward_flops(s, sum(groups) + sum(resp), pairs, sum(resp))
    f["total"] = sum(f.values())
    return f


# ----------------------------------------------------------------------- the limit


def product_shapes(s: Shapes, rows: int, positions: int, response: int, backward: bool):
    """The matrix products of one micro-batch of `rows` rows x `positions` positions (the
    LM head over `response` positions), each as (kind, batch, M, K, N, model FLOPs)."""
    M = rows * positions
    out = []
    for name, i, o in s.projections():
        out.append(("linear", 1, M, i, o))
        if backward:
            out += [("linear", 1, M, o, i), ("linear", 1, o, M, i)]   # grad input, grad weight
    Mh = rows * response
    out.append(("head", 1, Mh, s.hidden, s.vocab))
    if backward:
        out += [("head", 1, Mh, s.vocab, s.hidden), ("head", 1, s.vocab, Mh, s.hidden)]
    bh = rows * s.heads
    att = [("attention", bh, positions, s.head_dim, positions),       # q k^T
           ("attention", bh, positions, positions, s.head_dim)]       # weights x v
    out += att * (3 if backward else 1)     # the backward: two products per forward one
    res = []
    for kind, b, m, k, n in out:
        flops = 2 * b * m * k * n * (1 if kind != "linear" else s.layers)
        if kind == "attention":
            flops = flops * s.layers // 2        # the causal half
        res.append((kind, b, m, k, n, flops))
    return res


def decode_products(s: Shapes, rows: int, context: int):
    """The products of one decode step of `rows` rows attending to `context` positions."""
    out = [("linear", 1, rows, i, o, 2 * rows * i * o * s.layers) for _, i, o in s.projections()]
    out.append(("head", 1, rows, s.hidden, s.vocab, 2 * rows * s.hidden * s.vocab))
    bh = rows * s.heads
    flops = 2 * bh * context * s.head_dim * s.layers
    out += [("attention", bh, 1, s.head_dim, context, flops), ("attention", bh, 1, context, s.head_dim, flops)]
    return out


def matmul_rate(b: int, m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 0.3) -> float:
    """FLOP/s of torch.matmul [b, m, k] x [b, k, n] (b = 1: a plain 2-D product) in `dtype`,
    the median of repeats over about `seconds` after a warm-up."""
    shape_a, shape_b = ((m, k), (k, n)) if b == 1 else ((b, m, k), (b, k, n))
    a, w = torch.randn(shape_a, dtype=dtype), torch.randn(shape_b, dtype=dtype)
    # into one output buffer: a fresh output per call would time the allocator too (under a
    # run's 4 MiB mmap threshold, a new mapping faulted in and zeroed every time)
    c = torch.matmul(a, w)
    times, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 3:
        t = time.perf_counter()
        torch.matmul(a, w, out=c)
        times.append(time.perf_counter() - t)
    times.sort()
    return 2 * b * m * k * n / times[len(times) // 2]


def limit(products, dtype: torch.dtype, cache: dict | None = None) -> float:
    """FLOP-weighted rate of `products` (product_shapes), each at its measured rate."""
    cache = {} if cache is None else cache
    total = seconds = 0.0
    for kind, b, m, k, n, flops in products:
        key = (b, m, k, n, dtype)
        if key not in cache:
            cache[key] = matmul_rate(b, m, k, n, dtype)
        total += flops
        seconds += flops / cache[key]
    return total / seconds


def micro_batches(batch, micro_batch_size: int):
    """(rows, positions, response positions) of each micro-batch of a Rollout as the update
    runs it: every row up to the micro-batch's longest response (grpo.token_logprobs)."""
    out = []
    B, P = batch.input_ids.shape[0], batch.prompt_len
    for s in range(0, B, micro_batch_size):
        am = batch.attention_mask[s:s + micro_batch_size, P:]
        filled = am.any(0).nonzero()
        R = int(filled.max()) + 1 if len(filled) else 0
        out.append((am.shape[0], P + R, R))
    return out


def limits(products, cache: dict) -> dict:
    """The bf16 and float32 limits of these products, and the faster of the two."""
    out = {name: limit(products, dt, cache) for name, dt in (("bf16", torch.bfloat16), ("float32", torch.float32))}
    out["best"] = max(out.values())
    return out


def pass_limits(s: Shapes, batch, micro_batch_size: int, backward: bool, cache: dict) -> dict:
    """The limits of a teacher-forced pass over `batch` at its micro-batches' shapes."""
    return limits([p for mb in micro_batches(batch, micro_batch_size)
                   for p in product_shapes(s, *mb, backward=backward)], cache)


def decode_limits(s: Shapes, rollout, cache: dict) -> dict:
    """The limits of sampling `rollout`: a decode step of all its rows at the middle of the
    longest response (the rows shrink as they stop; this is the step the loop starts with)."""
    context = rollout.prompt_len + rollout.response_ids.shape[1] // 2
    return limits(decode_products(s, rollout.input_ids.shape[0], context), cache)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-cpu")
    ap.add_argument("--model", help="model folder (default: the preset's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8, help="rows per micro-batch")
    ap.add_argument("--positions", type=int, default=600, help="prompt + response positions")
    ap.add_argument("--response", type=int, default=350, help="response positions (LM head)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig
    from lopti_minimal.config import make_config
    cfg = make_config(args.preset, model=args.model)
    s = Shapes.of(AutoConfig.from_pretrained(cfg.model))
    print(f"{cfg.model}: {s}, {args.threads} thread(s)")
    cache: dict = {}
    for backward in (False, True):
        rates = limits(product_shapes(s, args.rows, args.positions, args.response, backward), cache)
        print(f"{'forward+backward' if backward else 'forward':17} {args.rows} x {args.positions} "
              f"positions: limit bf16 {rates['bf16'] / 1e12:.2f} TFLOP/s, float32 "
              f"{rates['float32'] / 1e12:.2f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
