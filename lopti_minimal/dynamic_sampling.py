"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2): over-sample, and
train only on the groups whose rewards are not all equal. Not in the paper (Yang et al. train
on every group): off by default, TrainConfig.dynamic_sampling = 0.

A group whose G rewards are all equal has advantage 0 on every token (GRPO, paper section 2;
grpo.group_advantages zeroes it exactly), so it gives no policy gradient; only the KL term
and the token-mean's denominator see it. A policy that solves a prompt every time, or never,
makes such groups, and then a step's gradient comes from its few other groups. Dynamic
sampling fills the step with informative groups instead: sample the step's prompts, drop the
uniform groups, and sample further rounds of fresh prompts until prompts_per_step groups are
kept or dynamic_sampling further rounds are spent. The reference of DAPO is verl's recipe
(recipe/dapo: algorithm.filter_groups, max_num_gen_batches = 1 + our dynamic_sampling).

Design choices:

1. The filter: a group is kept iff its rewards are not all equal, the exact test with which
   group_advantages zeroes a group (verl keeps a group whose reward's std is > 0). The reward
   is the one the advantages come from (verl filters on a chosen metric, "acc" or "score").
2. Fresh prompts from the run's prompt set: round 0 is the step's own slice of the prompt
   stream (the paper's step: a run with the option pairs by seed with one without it), round
   r >= 1 a slice of a second, independent stream (plumbing.step_prompts), each round with
   its own generator (plumbing.step_generator), so every draw of a step is still a function
   of (seed, step) and a resumed run repeats it with no new state (plumbing.py, choice 1).
   Deviation: verl's recipe draws the next batches of its one dataloader, so the stream
   advances by what a step used; here the further rounds' prompts come from their own stream
   (one may, rarely, repeat a prompt of the step's round 0).
3. Rounds stop as soon as prompts_per_step groups are kept, and the first prompts_per_step
   in sampling order train (verl: `batch[:train_batch_size * n]`). Deviation: if the rounds
   are spent with fewer kept, they train (verl raises an error); with none kept the step
   makes no update and its metrics line says why (trainer.rl_step).
4. The kept rows keep the batch's layout (batch.py), trimmed to their own widest prompt and
   longest response: the batch they would make if sampled alone.
5. The same filter under REINFORCE++ (a uniform group's advantage is then not 0, as its
   baseline is the batch's): verl's recipe filters whatever the estimator.
6. The step's metrics are the kept groups' (verl's recipe logs its trained batch), but for
   `zero_adv_groups`, the share of all the groups the rounds sampled that were dropped;
   `gen_rounds` and `kept_groups` say what the option did (plumbing.step_metrics).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import torch

from .batch import Rollout, concat_rollouts


class Samples(NamedTuple):
    """One sampling round's groups, scored: rows group-major (rows g*G .. g*G+G-1 are
    prompt g's group)."""
    batch: Rollout
    rewards: torch.Tensor     # [B]
    texts: list[str]          # [B]
    seconds: float            # spent sampling (the rollout, not the reward)


class Kept(NamedTuple):
    """What `sample_informative` returns: the groups to train on, and the counts the step logs."""
    samples: Samples          # the kept groups; round 0's groups if none was kept
    gen_rounds: int           # sampling rounds run, 1 + the extra ones
    kept_groups: int          # groups kept (at most prompts_per_step)
    sampled_groups: int       # groups sampled over all rounds
    uniform_groups: int       # of those, the ones dropped: all G rewards equal


def informative(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[groups] bool: the groups whose rewards are not all equal (choice 1)."""
    r = rewards.view(-1, group_size)
    return ~(r == r[:, :1]).all(1)


def trim(batch: Rollout) -> Rollout:
    """The batch without the prompt and response columns that are padding in every row."""
    P = batch.prompt_len
    R = int(batch.response_mask.sum(1).max())
    cut = P - int(batch.attention_mask[:, :P].sum(1).max())       # left padding of every row
    return dataclasses.replace(
        batch, input_ids=batch.input_ids[:, cut:P + R], attention_mask=batch.attention_mask[:, cut:P + R],
        response_ids=batch.response_ids[:, :R], response_mask=batch.response_mask[:, :R], prompt_len=P - cut,
        old_logprobs=None if batch.old_logprobs is None else batch.old_logprobs[:, :R])


def keep_groups(s: Samples, groups: list[int], group_size: int) -> Samples:
    """Groups ``groups`` of a round, in that order, trimmed (choice 4)."""
    rows = [g * group_size + i for g in groups for i in range(group_size)]
    return Samples(trim(s.batch.rows(torch.tensor(rows))), s.rewards[rows], [s.texts[i] for i in rows], s.seconds)


def sample_informative(draw: Callable[[int], Samples], want: int, rounds: int, group_size: int,
                       pad_token_id: int) -> Kept:
    """Call ``draw(r)`` (round r's scored samples) for r = 0, 1, ... until ``want`` informative
    groups are kept or ``rounds`` rounds are run; the first ``want`` kept, joined (choice 3)."""
    parts, first, seconds = [], None, 0.0
    n_kept = n_sampled = n_uniform = 0
    for r in range(rounds):
        s = draw(r)
        first, seconds = s if r == 0 else first, seconds + s.seconds
        ok = informative(s.rewards, group_size)
        n_sampled, n_uniform = n_sampled + len(ok), n_uniform + int((~ok).sum())
        take = ok.nonzero().squeeze(1).tolist()[:want - n_kept]
        if take:
            parts.append(keep_groups(s, take, group_size))
            n_kept += len(take)
        if n_kept == want:
            break
    if not parts:                     # nothing to train on: round 0's groups, for the metrics line
        return Kept(first._replace(seconds=seconds), r + 1, 0, n_sampled, n_uniform)
    batch = concat_rollouts([p.batch for p in parts], pad_token_id)
    samples = Samples(batch, torch.cat([p.rewards for p in parts]), [t for p in parts for t in p.texts], seconds)
    return Kept(samples, r + 1, n_kept, n_sampled, n_uniform)
