"""Grouped sampling: G responses per prompt, and the log-probs of the sampled tokens at the
sampling temperature, in one loop.

Design choices:

1. For every sampled token o_t its log pi_old(o_t) *at the rollout temperature*, what the
   update computes as log pi_theta(o_t), so the first ratio on fresh samples is 1 (a known
   pitfall: old and new log-probs at different temperatures). ``logprobs=False`` skips them:
   the trainer recomputes pi_old by a teacher-forced forward by default, the reference's way
   (under bf16 autocast the incremental logits differ in the last bits).
2. Our own loop rather than `model.generate`: the log-probs of the full (unfiltered)
   tempered distribution, an explicit torch.Generator for determinism, a loop cheap on a CPU.
3. One loop (`_decode`), one batched forward per token over all rows: prefill the prompts;
   per token, draw it (`next_token`), record it and its log-prob, feed it to the decode step
   (decode.py, a fast path: read it as the model's forward over one more token); every
   CHECK_EVERY tokens stop if every row is done, else drop those that are (a few long
   responses' tail is not paid for by every row); at the end cut rows after EOS (`_trim`).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .batch import Rollout, group_rows, position_ids_from_mask
from .decode import make_decoder

# How often (in tokens) the host looks whether every row is done: each look is a device sync
# on a GPU; a later look costs at most CHECK_EVERY - 1 steps of rows that are all done.
CHECK_EVERY = 4


@torch.no_grad()
def sample_groups(model, prompt_ids: Sequence[Sequence[int]], group_size: int, max_new_tokens: int, *,
                  temperature: float | None = None, top_p: float = 1.0, top_k: int = 0,
                  eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                  generator: torch.Generator | None = None, greedy: bool = False,
                  logprobs: bool = True, decoder: str = "auto") -> Rollout:
    """Sample `group_size` responses for each prompt (token ids): a `Rollout`, group-major.

    temperature: divides the logits for sampling *and* for the recorded log-probs; None: 1.0.
    top_p, top_k: filter the sampling distribution only (`filter_logits`).
    eos_token_id: a row stops after it samples EOS (kept, masked in) or at max_new_tokens;
        R is the longest response. pad_token_id fills stopped rows (may equal EOS: the mask
        comes from the first EOS). generator: on the model's device, the same draws whichever
        rows are dropped and whichever decoder.
    logprobs: record log pi_old(o_t) (Rollout.old_logprobs); False: None, the same tokens.
    decoder: decode.py's step: "hf" transformers' forward, "lean" (its samples part from hf's
        where a logit's last bit decides), "auto" lean on a CPU.
    """
    temperature = 1.0 if temperature is None else temperature
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (use greedy=True for argmax decoding)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos, pad = _special_ids(model, eos_token_id, pad_token_id)
    device = next(model.parameters()).device
    eos = torch.as_tensor(eos, dtype=torch.long, device=device)
    ids, mask = group_rows(prompt_ids, group_size, pad, device)
    B, P = ids.shape
    # made outside inference mode (less bookkeeping than no_grad), so the update can use them
    tokens = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=device)
    logps = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device) if logprobs else None
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        dec = make_decoder(decoder, model, B, P + max_new_tokens)
        steps = _decode(dec, ids, mask, group_size, tokens, logps, eos=eos, temperature=temperature,
                        top_p=top_p, top_k=top_k, greedy=greedy, generator=generator)
    model.train(was_training)
    return _trim(ids, mask, tokens, logps, steps, eos, pad)


def _decode(dec, ids, mask, group_size, tokens, logps, *, eos, temperature, top_p, top_k, greedy,
            generator) -> int:
    """The loop (design choice 3), writing each row's token t (and log-prob) into tokens (logps)
    [B, R]; a stopped row samples on until it is dropped. Returns the steps taken."""
    R = tokens.shape[1]
    positions = position_ids_from_mask(mask)
    logits = dec.prefill(ids, mask, positions, group_size)       # at each prompt's last position
    pos = positions[:, -1] + 1
    # `rows`: the original row of each row still in the batch (all until a compaction);
    # `done` and the step's inputs are indexed like the current batch
    rows = torch.arange(len(ids), device=ids.device)
    done = torch.zeros(len(ids), dtype=torch.bool, device=ids.device)
    for t in range(R):
        logits = logits.float() / temperature
        tok = next_token(logits, top_k, top_p, greedy, generator)
        tokens[rows, t] = tok
        if logps is not None:
            # log softmax(z / T)_tok = z_tok / T - logsumexp(z / T), over the full vocabulary
            logps[rows, t] = logits.gather(-1, tok.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        done = done | torch.isin(tok, eos)
        if t + 1 == R:
            break
        if (t + 1) % CHECK_EVERY == 0:
            n_done = int(done.sum())
            if n_done == len(done):
                return t + 1
            if n_done * 4 >= len(done):     # compaction: worth a copy once a quarter has stopped
                keep = (~done).nonzero().squeeze(-1)
                dec.keep(keep)
                rows, done, tok, pos = rows[keep], done[keep], tok[keep], pos[keep]
        logits = dec.step(tok, pos)
        pos = pos + 1
    return R


def next_token(logits: torch.Tensor, top_k: int, top_p: float, greedy: bool, generator) -> torch.Tensor:
    """The next token of each row from tempered logits [b, V]: the argmax, or a draw from the
    filtered softmax: argmax(probs / q), q ~ Exp(1), the very draw of torch.multinomial(probs,
    1) without its input checks (a host sync each)."""
    if greedy:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits, top_k, top_p), dim=-1)
    return (probs / torch.empty_like(probs).exponential_(1, generator=generator)).argmax(-1)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of [B, V] logits, removed entries -inf: the
    sampling distribution only (the recorded log-probs are the full softmax's, design choice 2)."""
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token if those strictly more likely cover top_p (the likeliest always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _trim(ids, mask, tokens, logps, steps: int, eos, pad: int) -> Rollout:
    """The Rollout of the loop's output: a response ends at its first EOS (kept) or after
    ``steps`` tokens, padding after it; the width R is the longest response."""
    is_eos = torch.isin(tokens[:, :steps], eos)
    length = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, steps)
    width = int(length.max())
    response_mask = (torch.arange(width, device=ids.device) < length[:, None]).float()
    response_ids = torch.where(response_mask > 0, tokens[:, :width], pad)
    if logps is not None:
        logps = torch.where(response_mask > 0, logps[:, :width], 0.0)
    return Rollout(input_ids=torch.cat([ids, response_ids], dim=1),
                   attention_mask=torch.cat([mask, response_mask.long()], dim=1),
                   response_ids=response_ids, response_mask=response_mask, old_logprobs=logps,
                   prompt_len=ids.shape[1])


def _special_ids(model, eos_token_id, pad_token_id) -> tuple[list[int], int]:
    """(the ids that stop a row, the padding id), from the arguments or the model's config."""
    eos = getattr(model.config, "eos_token_id", None) if eos_token_id is None else eos_token_id
    pad = getattr(model.config, "pad_token_id", None) if pad_token_id is None else pad_token_id
    pad = (eos if isinstance(eos, int) else 0) if pad is None else pad
    return ([] if eos is None else [eos] if isinstance(eos, int) else list(eos)), pad
