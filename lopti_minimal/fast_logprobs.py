"""The token log-probs of the update, fast: the same bits as the plain expression, fewer bytes.

A fast path; a learner can skip this file. What it computes is grpo.logprobs_from_logits,
the plain expression

    log pi(y_t) = log_softmax(z_t)[y_t] = z_t,y - logsumexp(z_t),   z = logits.float() / T,

and grpo.token_logprobs calls it for that. It computes the same bits as the plain expression,
values and gradients of the logits (tests/test_grpo.py, the two `..._bit_for_bit` tests); it
exists only because the plain expression costs memory and time on a real vocabulary.

Design choices:

1. Row chunks (`TargetLogProb`). Under autograd the plain expression keeps a float32
   [B, R, V] copy of the logits, and builds its gradient whole: 557 MB per micro-batch of
   SmolLM2's 49,152-entry vocabulary. The custom Function takes ROWS rows at a time, in the
   forward and again in the backward, so neither ever exists whole and each chunk's passes
   stay in a core's cache. It runs autograd's own formulas for gather, logsumexp, the
   division and the cast, in autograd's order, row by row: the same bits as the
   whole-tensor expression.
2. The whole logits (`response_logprobs`). The model returns [B, R + 1, V] logits (the last
   position predicts past the end of the response). The plain expression reads the [B, R, V]
   slice of the positions that predict a response token; that slice is not contiguous, and
   flattening it copied the logits (236 MB for 8 rows of 300 tokens of SmolLM2) in the
   forward pass and again in the backward, and its gradient was built apart and then copied
   into a zero [B, R + 1, V] tensor. Here the whole logits are read in place, the extra
   position with a stand-in target and its value dropped: its gradient is 0, as the slice's
   was, so the LM head's backward multiplies the same numbers. The same bits, fewer bytes
   and less time (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import torch


class TargetLogProb(torch.autograd.Function):
    """log_softmax(logits / T)[target] over the last dim, ROWS rows of [N, V] at a time
    (design choice 1). Forward per chunk: z = logits.float() / T, lse = logsumexp(z),
    z_y - lse; backward per chunk, d/dz = g * (onehot(y) - exp(z - lse)), then / T, in the
    logits' dtype: autograd's own formulas for gather, logsumexp, the division and the cast,
    in its order, so the bits are those of the whole-tensor expression."""

    ROWS = 8       # 8 x 49,152 float32 = 1.5 MB: one chunk's passes stay in a core's cache

    @staticmethod
    def forward(ctx, logits, targets, temperature):
        x, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1)
        lse = x.new_empty(x.shape[0], dtype=torch.float32)
        logp = torch.empty_like(lse)
        for s in _row_chunks(x.shape[0]):
            z = x[s].float() / temperature
            lse[s] = torch.logsumexp(z, dim=-1)
            logp[s] = z.gather(-1, t[s]).squeeze(-1) - lse[s]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return logp.view(logits.shape[:-1])

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        x, t, g = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1), grad.reshape(-1)
        gx = torch.empty_like(x)
        for s in _row_chunks(x.shape[0]):
            z = x[s].float() / ctx.temperature
            gz = (-g[s]).unsqueeze(-1) * (z - lse[s].unsqueeze(-1)).exp()    # logsumexp's
            gz.scatter_add_(-1, t[s], g[s].unsqueeze(-1))                    # gather's
            gx[s] = (gz / ctx.temperature).to(x.dtype)
        return gx.view(logits.shape), None, None


def _row_chunks(n: int) -> list[slice]:
    """TargetLogProb.ROWS rows at a time; never a last chunk of one row (torch reduces a
    single row's 49,152 entries in two parallel halves, other bits than row by row) unless
    the tensor has one row."""
    starts = list(range(0, n, TargetLogProb.ROWS))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [n])]


def response_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """grpo.logprobs_from_logits(logits[:, :-1], targets, temperature), to the bit: [B, R].

    logits: the model's [B, R + 1, V] (positions P-1 .. P+R-1), read whole (design choice 2);
    targets: the response tokens [B, R]. The last position gets a stand-in target (0) and
    its value is dropped."""
    padded = torch.nn.functional.pad(targets, (0, 1))
    return TargetLogProb.apply(logits, padded, temperature)[:, :-1]
