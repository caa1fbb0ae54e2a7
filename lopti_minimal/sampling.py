"""Grouped sampling with a KV cache: G responses per prompt, and the log-probs of the
sampled tokens at the sampling temperature.

Layout (docs/ARCHITECTURE.md): B = prompts x G rows, group-major (rows g*G .. g*G+G-1
are prompt g's group); input_ids = [left-padded prompt | right-padded response].

Design choices:

1. A group of G sampled responses for every prompt (GRPO, the objective the paper builds
   on), and for every sampled token o_t its log-probability log pi_old(o_t) *at the
   rollout temperature* -- the same quantity the update computes as log pi_theta(o_t), so
   that the ratio pi_theta / pi_old is 1 at the first update on fresh samples (a known
   pitfall of GRPO implementations: old and new log-probs at different temperatures).
   ``logprobs=False`` skips them for a caller that computes pi_old otherwise: the trainer
   by default recomputes it by a teacher-forced forward (the reference's way; under bf16
   autocast the incremental logits differ in the last bits), so it is computed once.
2. Our own loop rather than `model.generate`: we need the per-token log-probs of the full
   (unfiltered) tempered distribution, an explicit torch.Generator for determinism, and a
   loop that is cheap on a CPU.
3. The loop is one batched forward per generated token over all B rows at once (no Python
   loop over rows), writes into preallocated buffers, and looks at the host only every
   `check_every` steps to see whether all rows are done. The KV cache is transformers'
   StaticCache with two patches that change no token (`kv_cache`, a section a reader of
   the method can skip). On a CPU the decode step is by default decode.py's lean loop
   (the `decoder` option: the same loop with fewer, larger ops per token, over twice the
   tokens/s on the tiny model; decoder="hf" keeps transformers' forward and its samples).
4. One batch type, `Rollout`, from the sampler to the update: the sampler fills the
   sampled tokens and masks, the trainer adds pi_old, the advantages and pi_ref.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache, StaticCache

from . import decode


@dataclass(frozen=True)
class Rollout:
    """One RL step's batch, from the sampler to the update: B = prompts x G rows.

    The sampler fills the first fields; the trainer (trainer.rl_step) adds the others, one
    quantity at a time, with `dataclasses.replace` (a new batch, never a changed one):

    input_ids       [B, P + R]  left-padded prompt, then the response (right-padded)
    attention_mask  [B, P + R]  1 on real prompt tokens and on response tokens up to and
                                including the sampled EOS; 0 on padding
    response_ids    [B, R]      the sampled tokens (pad_token_id after a row has stopped)
    response_mask   [B, R]      1 for every sampled token including the sampled EOS,
                                0 for padding (float32, ready to multiply losses with)
    prompt_len      P
    group_size      G           rows g*G .. g*G+G-1 are prompt g's group, until the rows are
                                reordered (grpo.sort_by_length)
    old_logprobs    [B, R]      log pi_old(o_t) of the sampled token with logits / T over the
                                full vocabulary, 0 on padding: recorded by the sampler
                                (``logprobs=True``), or by a teacher-forced forward
                                (grpo.batch_logprobs); None until one of them has
    advantages      [B, R]      the token advantages the update trains on (A_t, or after AR
                                A_hat_t, paper Eq. 4), 0 on padding
    ref_logprobs    [B, R]      log pi_ref(o_t) of the frozen reference policy (the KL term
                                of Eq. 1); None when there is no KL term
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_len: int
    group_size: int
    old_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

    @property
    def position_ids(self) -> torch.Tensor:
        return position_ids_from_mask(self.attention_mask)

    def rows(self, index) -> "Rollout":
        """The batch of rows ``index`` (a slice or an index tensor) of every per-row tensor."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name)[index]
                                            for f in dataclasses.fields(self)
                                            if torch.is_tensor(getattr(self, f.name))})


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens: a left-padded prompt starts at position 0.

    Padding positions get 0 (they are masked out of attention, so their value is moot).
    The same rule is used in sampling and in every teacher-forced forward, so the two see
    identical rotary positions -- otherwise the old and new log-probs would differ.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_token_id: int):
    """Stack token-id lists into [N, P] left-padded ids and mask."""
    P = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), P), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), P), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if len(p) == 0:
            raise ValueError("empty prompt")
        ids[i, P - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids, mask


def group_rows(prompt_ids: Sequence[Sequence[int]], group_size: int, pad_token_id: int, device):
    """The left-padded [N * G, P] ids and mask of G rows per prompt, group-major: prompt g
    occupies rows g*G .. g*G+G-1 (GRPO's groups)."""
    ids, mask = left_pad(prompt_ids, pad_token_id)
    return ids.repeat_interleave(group_size, 0).to(device), mask.repeat_interleave(group_size, 0).to(device)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of [B, V] logits; removed entries become -inf.

    Only the *sampling* distribution is filtered. The recorded log-probs are those of the
    full tempered softmax, because that is what the trainer recomputes (the reference
    implementation, too, recomputes old log-probs with a plain tempered softmax).
    """
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token if the tokens strictly more likely already cover top_p; this keeps
        # the most likely token always.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.no_grad()
def sample_groups(
    model,
    prompt_ids: Sequence[Sequence[int]],
    group_size: int,
    max_new_tokens: int,
    temperature: float | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    logprobs: bool = True,
    check_every: int = 4,
    static_cache: bool = True,
    compact: bool = True,
    filled_prefix: bool = True,
    decoder: str = "auto",
) -> Rollout:
    """Sample `group_size` responses for each prompt (token ids), batched over all rows.

    temperature: logits are divided by it for sampling *and* for the recorded log-probs.
        None means 1.0 (so greedy decoding records plain log-probs unless told otherwise).
    eos_token_id: a row stops after it samples EOS (the EOS is kept and masked in);
        rows also stop at max_new_tokens. The loop ends once every row has stopped, so R
        (the response width) is the longest response actually produced.
    pad_token_id: fills the stopped rows; it may equal eos_token_id -- the response mask
        is built from the stopping step, never from comparing ids with the pad id.
    generator: a torch.Generator on the model's device, for reproducible sampling.
    logprobs: record log pi_old(o_t) of every sampled token (Rollout.old_logprobs); False
        leaves it None (the tokens are the same), for callers that compute it otherwise or
        not at all.
    check_every: how often (in steps) to ask the host whether all rows are done; each
        check is a device sync, which matters on a GPU.
    compact: at those checks, drop the rows that have stopped from the batch (and from
        the KV cache, with the cache's own `reorder_cache`), so that the long tail of a
        few long responses is not paid for by every row. The outputs are identical for
        greedy decoding; sampled tokens differ from compact=False only in which random
        numbers each row draws (still deterministic for a generator seed).
    static_cache, filled_prefix: the KV cache (`kv_cache` below); False, False is
        transformers' own behaviour (kept for benchmarks).
    decoder: "lean": decode.py's decode loop (Llama and Qwen2 models; its logits equal
        transformers' to float tolerance, not bit for bit under bf16 autocast, so its
        samples part from hf's at the first token a last bit decides); "hf": transformers'
        forward with the KV cache below (the samples of the shipped runs); "auto" (default):
        lean on a CPU, hf elsewhere. A model the lean loop does not serve, static_cache=False
        or filled_prefix=False (options of the hf loop) run hf.
    """
    if temperature is None:
        temperature = 1.0
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (use greedy=True for argmax decoding)")
    eos_token_id, pad_token_id = _special_ids(model, eos_token_id, pad_token_id)
    device = next(model.parameters()).device
    # The lean decode loop (decode.py) where it serves this model; else the loop below.
    if decode.resolve(decoder, device) == "lean" and static_cache and filled_prefix:
        ro = decode.sample_groups(model, prompt_ids, group_size, max_new_tokens, temperature=temperature,
                                  top_p=top_p, top_k=top_k, eos_token_id=eos_token_id,
                                  pad_token_id=pad_token_id, generator=generator, greedy=greedy,
                                  logprobs=logprobs, check_every=check_every, compact=compact)
        if ro is not None:
            return ro
    eos = torch.as_tensor(eos_token_id, dtype=torch.long, device=device)

    ids, mask = group_rows(prompt_ids, group_size, pad_token_id, device)
    B, P = ids.shape
    R = max_new_tokens

    # Preallocated outputs; sliced to the real width at the end.
    response_ids = torch.full((B, R), pad_token_id, dtype=torch.long, device=device)
    response_mask = torch.zeros((B, R), dtype=torch.float32, device=device)
    old_logprobs = torch.zeros((B, R), dtype=torch.float32, device=device) if logprobs else None
    full_mask = torch.zeros((B, P + R), dtype=torch.long, device=device)
    full_mask[:, :P] = mask

    was_training = model.training
    model.eval()
    cache, whole_cache = kv_cache(model, P + R, device, static_cache, filled_prefix)
    ckw = _cache_kwarg(model)
    positions = position_ids_from_mask(mask)
    # Prefill: the whole prompt at once; we only need the logits of its last position.
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                use_cache=True, logits_to_keep=1, **{ckw: cache})
    next_pos = positions[:, -1:] + 1                      # [B, 1]
    # `rows`: the original row index of each row still in the batch (all of them until a
    # compaction); `done` and the step inputs below are indexed like the current batch.
    rows = torch.arange(B, device=device)
    step_mask = full_mask
    done = torch.zeros(B, dtype=torch.bool, device=device)
    steps = 0
    for t in range(R):
        logits = out.logits[:, -1, :].float() / temperature          # [b, V], b = rows alive
        if greedy:
            tok = logits.argmax(-1)
        else:
            sample_logits = filter_logits(logits, top_k, top_p)
            probs = torch.softmax(sample_logits, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        alive = ~done
        tok = torch.where(alive, tok, torch.full_like(tok, pad_token_id))
        response_ids[rows, t] = tok
        response_mask[rows, t] = alive.float()
        if logprobs:
            # log softmax(z / T)_tok = z_tok / T - logsumexp(z / T), over the full vocabulary
            logp_tok = logits.gather(-1, tok.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
            old_logprobs[rows, t] = torch.where(alive, logp_tok, 0.0)
        step_mask[:, P + t] = alive.long()
        done = done | (alive & torch.isin(tok, eos))
        steps = t + 1
        if steps == R:
            break
        # Cheap all-done test: only every `check_every` steps does the host look.
        if steps % check_every == 0:
            n_done = int(done.sum())
            if n_done == len(done):
                break
            # Compaction: worth a copy of the cache once a quarter of the batch has stopped.
            if compact and n_done * 4 >= len(done):
                keep = (~done).nonzero().squeeze(-1)
                cache.reorder_cache(keep)
                rows, done, tok = rows[keep], done[keep], tok[keep]
                step_mask, next_pos = step_mask[keep], next_pos[keep]
        m = step_mask if whole_cache else step_mask[:, :P + t + 1]
        out = model(input_ids=tok.unsqueeze(-1), attention_mask=m,
                    position_ids=next_pos, use_cache=True, **{ckw: cache})
        next_pos = next_pos + 1
    _unpatch(cache)
    # The attention mask of the full batch: prompt mask, then the response mask.
    full_mask[:, P:] = response_mask.long()
    if was_training:
        model.train()

    # Trim trailing columns where every row had already stopped (at most check_every-1).
    width = int(response_mask[:, :steps].sum(0).nonzero().max().item()) + 1 if steps else 0
    response_ids = response_ids[:, :width].contiguous()
    return Rollout(input_ids=torch.cat([ids, response_ids], dim=1),
                   attention_mask=full_mask[:, :P + width].contiguous(),
                   response_ids=response_ids, response_mask=response_mask[:, :width].contiguous(),
                   old_logprobs=old_logprobs[:, :width].contiguous() if logprobs else None,
                   prompt_len=P, group_size=group_size)


def _special_ids(model, eos_token_id, pad_token_id) -> tuple[list[int], int]:
    """(the ids that stop a row, the padding id), from the arguments or the model's config."""
    if eos_token_id is None:
        eos_token_id = getattr(model.config, "eos_token_id", None)
    if pad_token_id is None:
        pad_token_id = getattr(model.config, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = eos_token_id if isinstance(eos_token_id, int) else 0
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return eos, pad_token_id


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed `past_key_values` to `cache`; accept either API."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model   # peft (LoRA)
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# ---------------------------------------------------------------------------------------
# The KV cache: transformers' StaticCache, with two patches that make decoding cheaper and
# change no token. Plumbing: a reader of the method can skip this section.
# ---------------------------------------------------------------------------------------

def kv_cache(model, max_len: int, device, static: bool = True, filled_prefix: bool = True):
    """The KV cache of one sampling call, and whether attention sees all of it each step.

    A static cache preallocates the keys/values of all ``max_len`` positions once; the
    DynamicCache grows by concatenation, which re-copies the whole cache every step (a
    third of the sampling time of the tiny model on a CPU). Under autocast its layers store
    bf16 (`_store_kv_in`), and with ``filled_prefix`` attention sees only the positions
    written so far (`_attend_to_filled_prefix`). A model the static cache cannot serve gets
    a DynamicCache. Returns (cache, whole_cache): whole_cache = the decode mask must cover
    all ``max_len`` positions (an unpatched static cache)."""
    if static:
        try:
            cache = StaticCache(config=model.config, max_cache_len=max_len)
        except (TypeError, ValueError, NotImplementedError):   # a model it cannot serve
            return DynamicCache(), False
        kv_dtype = _autocast_dtype(device)
        if kv_dtype is not None:
            _store_kv_in(cache, kv_dtype)
        filled_prefix = filled_prefix and _attend_to_filled_prefix(cache)
        return cache, not filled_prefix
    return DynamicCache(), False


def _autocast_dtype(device: torch.device):
    """The autocast dtype active for this device type, or None outside autocast."""
    try:
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
    except TypeError:                     # torch < 2.4: no device-type argument
        if device.type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None


def _store_kv_in(cache, dtype: torch.dtype) -> None:
    """Make every layer of a StaticCache store its keys and values in `dtype`.

    Under CPU bf16 autocast the projections come out in bf16, but the rotary embedding
    multiplies the keys by float32 cos/sin, so the keys reach the cache in float32 and the
    cache allocates a float32 key tensor; attention (an autocast bf16 op) then casts that
    whole [B, heads, P + R, head_dim] tensor to bf16 in every layer at every decode step.
    Casting each new key once, when it is written, hands attention the very same bf16
    values: tokens and log-probs are bit-identical, and the per-step copy is gone.
    """
    for layer in cache.layers:
        update = layer.update
        layer.update = (lambda k, v, *a, _update=update, **kw:
                        _update(k.to(dtype), v.to(dtype), *a, **kw))


def _attend_to_filled_prefix(cache) -> bool:
    """Make every full-attention layer of a StaticCache hand attention only the positions
    written so far (P + t at decode step t), not all P + R preallocated ones.

    A static cache avoids the DynamicCache's re-copy by concatenation at every step, but
    out of the box it makes every decode step attend over the whole [P + R] buffer, the
    unwritten tail masked out: on the tiny model at R = 512 that masked tail is most of
    the attention work. Returning a view of the filled prefix (and telling the mask
    builder the same length) is the same computation without the masked tail: equal up
    to float rounding (tests/test_sampling.py), no copy, and no host sync on a GPU (the
    length is counted on the host from the shapes written). Sliding-window layers are
    left alone. Returns False when the cache does not have the layer API this needs.
    """
    layers = [l for l in getattr(cache, "layers", []) if not getattr(l, "is_sliding", False)]
    if not layers or not all(hasattr(l, "get_mask_sizes") for l in layers):
        return False
    for layer in layers:
        layer.n_filled = 0
        update = layer.update

        def filled_update(k, v, *a, _update=update, _layer=layer, **kw):
            keys, values = _update(k, v, *a, **kw)
            _layer.n_filled += k.shape[-2]
            return keys[:, :, :_layer.n_filled], values[:, :, :_layer.n_filled]

        def mask_sizes(query, *a, _layer=layer):
            # transformers >= 5 passes the query length; 4.x passes cache_position.
            q = query.shape[0] if torch.is_tensor(query) else int(query)
            return _layer.n_filled + q, 0

        layer.update, layer.get_mask_sizes = filled_update, mask_sizes
    return True


def _unpatch(cache) -> None:
    """Undo the two patches above once sampling is done. Each patched method closes over
    its own layer (layer -> method -> layer), a reference cycle: without this, the cache's
    keys and values outlive sample_groups until Python's cycle collector happens to run,
    often several RL steps (or evaluation batches) later, so that several KV caches are
    held at once (hundreds of MB each on the default run). Breaking the cycle frees the
    cache on return."""
    for layer in getattr(cache, "layers", []):
        for name in ("update", "get_mask_sizes"):
            vars(layer).pop(name, None)


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Join rollouts of prompt chunks (the trainer's rollout_chunk) into one, keeping the
    layout [left-padded prompt | right-padded response]: prompts are padded on the left to
    the widest prompt, responses on the right to the longest response."""
    if len(parts) == 1:
        return parts[0]
    P = max(r.prompt_len for r in parts)
    R = max(r.response_ids.shape[1] for r in parts)

    def cat(name, left, value):
        return torch.cat([torch.nn.functional.pad(
            getattr(r, name), (P - r.prompt_len if left else 0, R - r.response_ids.shape[1]), value=value)
            for r in parts])

    logprobs = all(r.old_logprobs is not None for r in parts)
    return Rollout(input_ids=cat("input_ids", True, pad_token_id), attention_mask=cat("attention_mask", True, 0),
                   response_ids=cat("response_ids", False, pad_token_id),
                   response_mask=cat("response_mask", False, 0.0),
                   old_logprobs=cat("old_logprobs", False, 0.0) if logprobs else None,
                   prompt_len=P, group_size=parts[0].group_size)


def decode_responses(tokenizer, ro: Rollout) -> list[str]:
    """Response texts: the sampled tokens up to and including EOS, special tokens dropped
    (the text the reward sees). Lengths come from the mask, never from the pad id."""
    lengths = ro.response_mask.sum(1).long().tolist()
    rows = ro.response_ids.tolist()
    return [tokenizer.decode(r[:n], skip_special_tokens=True) for r, n in zip(rows, lengths)]
