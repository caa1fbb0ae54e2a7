"""The batch of one RL step, `Rollout`, and its layout: B = prompts x G rows, group-major
(rows g*G .. g*G+G-1 are prompt g's group), input_ids = [left-padded prompt | right-padded
response].

The sampler (sampling.py) makes one; the trainer adds pi_old, the advantages and pi_ref to
it, one quantity at a time, with `dataclasses.replace` (a new batch, never a changed one);
the update (grpo.py, lopti.py) reads it. docs/ARCHITECTURE.md draws the layout.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Rollout:
    """One RL step's batch, from the sampler to the update: B = prompts x G rows.

    input_ids       [B, P + R]  left-padded prompt, then the response (right-padded)
    attention_mask  [B, P + R]  1 on real prompt tokens and on response tokens up to and
                                including the sampled EOS; 0 on padding
    response_ids    [B, R]      the sampled tokens (pad_token_id after a row has stopped)
    response_mask   [B, R]      1 for every sampled token including the sampled EOS,
                                0 for padding (float32, ready to multiply losses with)
    prompt_len      P
    old_logprobs    [B, R]      log pi_old(o_t) of the sampled token with logits / T over the
                                full vocabulary, 0 on padding: recorded by the sampler
                                (``logprobs=True``), or by a teacher-forced forward
                                (grpo.batch_logprobs); None until one of them has
    advantages      [B, R]      the token advantages the update trains on (A_t, or after AR
                                A_hat_t, paper Eq. 4), 0 on padding
    ref_logprobs    [B, R]      log pi_ref(o_t) of the frozen reference policy (the KL term
                                of Eq. 1); None when there is no KL term

    The group size is not a field: it is the run's (TrainConfig.group_size), and once the
    rows are reordered (grpo.sort_by_length) no field could say where a group is.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_len: int
    old_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

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
                   old_logprobs=cat("old_logprobs", False, 0.0) if logprobs else None, prompt_len=P)


def decode_responses(tokenizer, ro: Rollout) -> list[str]:
    """Response texts: the sampled tokens up to and including EOS, special tokens dropped
    (the text the reward sees). Lengths come from the mask, never from the pad id."""
    lengths = ro.response_mask.sum(1).long().tolist()
    rows = ro.response_ids.tolist()
    return [tokenizer.decode(r[:n], skip_special_tokens=True) for r, n in zip(rows, lengths)]
