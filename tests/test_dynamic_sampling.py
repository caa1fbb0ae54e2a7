"""DAPO's dynamic sampling (lopti_minimal/dynamic_sampling.py, TrainConfig.dynamic_sampling):
the groups whose rewards are all equal are dropped, further rounds of fresh prompts fill the
step, the step trains on the kept groups exactly as the paper's step would on them alone,
and resume stays exact. Off, or on where round 0 needs no help, it is the paper's step."""
import dataclasses
import json

import pytest
import torch

from lopti_minimal import models, plumbing, precision, runs, trainer
from lopti_minimal.batch import Rollout, concat_rollouts
from lopti_minimal.config import TrainConfig
from lopti_minimal.dynamic_sampling import Samples, informative, sample_informative, trim
from test_trainer import interrupting_reward, length_reward, small_cfg, strip

G = 2


def ro(prompt_lens, resp_lens, fill):
    """A round's batch in the sampler's layout: rows' prompts left-padded, responses
    right-padded (pad 0), every token ``fill`` + its row."""
    P, R = max(prompt_lens), max(resp_lens)
    ids = torch.zeros(len(prompt_lens), P + R, dtype=torch.long)
    am = torch.zeros_like(ids)
    rmask = torch.zeros(len(prompt_lens), R)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        ids[i, P - p:P + r] = fill + i
        am[i, P - p:P + r] = 1
        rmask[i, :r] = 1
    return Rollout(ids, am, ids[:, P:], rmask, P, old_logprobs=-rmask)


def rounds_of(*rewards):
    """Samples per round: round r's rows have prompts of 2 + row and responses of 1 + row
    tokens, texts "r.row"."""
    out = []
    for r, rw in enumerate(rewards):
        n = len(rw)
        out.append(Samples(ro([2 + i for i in range(n)], [1 + i for i in range(n)], 10 * (r + 1)),
                           torch.tensor(rw, dtype=torch.float), [f"{r}.{i}" for i in range(n)], 1.0))
    return out


def run(rounds, want, max_rounds):
    calls = []

    def draw(r):
        calls.append(r)
        return rounds[r]
    return sample_informative(draw, want, max_rounds, G, pad_token_id=0), calls


def test_uniform_groups_are_dropped_and_rounds_stop_when_the_step_is_full():
    rounds = rounds_of([1, 1, 0, 3], [2, 2, 5, 5], [0, 1, 1, 0], [4, 0, 0, 4])
    assert informative(rounds[0].rewards, G).tolist() == [False, True]
    k, calls = run(rounds, want=2, max_rounds=4)
    assert calls == [0, 1, 2]                                     # full after round 2: no round 3
    assert (k.gen_rounds, k.kept_groups, k.sampled_groups, k.uniform_groups) == (3, 2, 6, 3)
    s = k.samples                                                  # round 0's group 1, round 2's group 0
    assert s.texts == ["0.2", "0.3", "2.0", "2.1"] and s.rewards.tolist() == [0, 3, 0, 1] and s.seconds == 3.0
    # the rows' tokens, in the layout of these rows alone: prompts 4, 5, 2, 3 and responses
    # 3, 4, 1, 2 tokens long -> P = 5, R = 4
    b = s.batch
    assert b.prompt_len == 5 and b.response_ids.shape == (4, 4) and b.input_ids.shape == (4, 9)
    assert b.response_mask.sum(1).tolist() == [3, 4, 1, 2] and b.attention_mask.sum(1).tolist() == [7, 9, 3, 5]
    assert b.input_ids[0].tolist() == [0, 12, 12, 12, 12, 12, 12, 12, 0]
    assert b.input_ids[2].tolist() == [0, 0, 0, 30, 30, 30, 0, 0, 0]
    assert b.old_logprobs.sum().item() == -10.0
    # truncated to the step's size: the first informative groups in sampling order
    k, _ = run(rounds_of([0, 1, 2, 3, 4, 4]), want=1, max_rounds=2)
    assert k.kept_groups == 1 and k.samples.texts == ["0.0", "0.1"] and k.uniform_groups == 1


def test_spent_rounds_train_on_what_was_kept_and_none_kept_keeps_round_0_for_the_log():
    rounds = rounds_of([1, 1, 0, 3], [2, 2, 5, 5], [7, 7, 7, 7])
    k, calls = run(rounds, want=2, max_rounds=3)
    assert calls == [0, 1, 2] and (k.gen_rounds, k.kept_groups, k.uniform_groups) == (3, 1, 5)
    assert k.samples.texts == ["0.2", "0.3"]
    k, _ = run(rounds[1:], want=2, max_rounds=2)                   # nothing informative
    assert (k.gen_rounds, k.kept_groups, k.sampled_groups) == (2, 0, 4)
    assert k.samples.texts == ["1.0", "1.1", "1.2", "1.3"] and k.samples.seconds == 2.0   # its round 0


# ------------------------------------------------------------------ the step with a model

def half_uniform_reward(text, record):
    """Equal rewards for every response to the prompts of odd quiz length; the response's
    length otherwise (almost always a comparison, for the random nano model)."""
    return 0.0 if len(record["quiz"]) % 2 else length_reward(text, record)


def policy_and_prompts(nano_dir, tmp_path, **kw):
    cfg = small_cfg(nano_dir, tmp_path, method="grpo", **kw)
    model, tok = plumbing.load_policy(cfg)
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    records, ids = models.encode_prompts(records, tok, "auto", 256)
    return cfg, model, tok, records, ids


def test_the_step_trains_on_the_kept_groups_as_the_papers_step_on_them_alone(nano_dir, tmp_path, monkeypatch):
    cfg, model, tok, records, ids = policy_and_prompts(nano_dir, tmp_path, dynamic_sampling=5)
    ref = precision.reference_copy(model)
    step = 0
    more = lambda r: plumbing.step_prompts(records, ids, cfg, step, r)          # noqa: E731
    # by hand: each round sampled on its own, its groups tested one by one
    kept, n_rounds, n_uniform = [], 0, 0
    for r in range(1 + cfg.dynamic_sampling):
        s = trainer.sample_round(model, tok, *more(r), cfg, plumbing.step_generator(cfg.seed, step, "cpu", r),
                                 half_uniform_reward)
        n_rounds += 1
        for g in range(cfg.prompts_per_step):
            rows = list(range(g * cfg.group_size, (g + 1) * cfg.group_size))
            if len(set(s.rewards[rows].tolist())) == 1:
                n_uniform += 1
            elif len(kept) < cfg.prompts_per_step:
                kept.append((s, rows))
        if len(kept) == cfg.prompts_per_step:
            break
    assert n_rounds > 1 and n_uniform > 0 and len(kept) == 2        # the option had work to do
    sb = trainer.make_batch(model, ref, tok, *more(0), cfg, step, half_uniform_reward, more)
    d = sb.dynamic
    assert (d.gen_rounds, d.kept_groups, d.uniform_groups) == (n_rounds, 2, n_uniform)
    assert sb.texts == [s.texts[i] for s, rows in kept for i in rows]
    assert torch.equal(sb.rewards, torch.cat([s.rewards[rows] for s, rows in kept]))
    assert not (sb.rewards.view(-1, cfg.group_size) == sb.rewards.view(-1, cfg.group_size)[:, :1]).all(1).any()

    # the paper's step (option off) whose sampler returned these groups alone, in their own
    # layout: the same batch, so the same update
    alone = trim(concat_rollouts([s.batch.rows(torch.tensor(rows)) for s, rows in kept], tok.pad_token_id))
    monkeypatch.setattr(trainer, "sample_round", lambda *a: Samples(alone, sb.rewards, sb.texts, 0.0))
    paper = trainer.make_batch(model, ref, tok, *more(0), dataclasses.replace(cfg, dynamic_sampling=0), step,
                               half_uniform_reward)
    for f in ("input_ids", "attention_mask", "response_mask", "advantages", "old_logprobs", "ref_logprobs"):
        assert torch.equal(getattr(sb.batch, f), getattr(paper.batch, f)), f
    assert sb.batch.advantages.abs().sum() > 0


def test_on_without_work_is_the_papers_step_and_none_kept_makes_no_update(nano_dir, tmp_path):
    out = {}
    for n in (0, 2):                  # length_reward: every group of round 0 is a comparison
        cfg, model, tok, records, ids = policy_and_prompts(nano_dir, tmp_path, dynamic_sampling=n)
        more = lambda r: plumbing.step_prompts(records, ids, cfg, 0, r)        # noqa: E731
        m = trainer.rl_step(model, precision.reference_copy(model), precision.build_optimizer(model, cfg),
                            tok, *more(0), cfg, 0, length_reward, more)
        out[n] = strip([m])[0], {k: v.clone() for k, v in model.state_dict().items()}
    on, off = out[2][0], out[0][0]
    assert (on.pop("gen_rounds"), on.pop("kept_groups")) == (1, 2) and on == off and off["grad_norm"] > 0
    assert all(torch.equal(out[0][1][k], out[2][1][k]) for k in out[0][1])

    # every group uniform: the rounds are spent, no update, the line says why
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    m = trainer.rl_step(model, precision.reference_copy(model), precision.build_optimizer(model, cfg),
                        tok, *more(0), cfg, 0, lambda text, rec: 1.0, more)
    assert (m["gen_rounds"], m["kept_groups"], m["zero_adv_groups"], m["grad_norm"]) == (3, 0, 1.0, 0.0)
    assert m["no_update"] == "dynamic sampling: all 6 groups of 3 rounds had equal rewards"
    assert all(torch.equal(w0[k], v) for k, v in model.state_dict().items())


def test_resume_with_dynamic_sampling_equals_an_uninterrupted_run(nano_dir, tmp_path):
    """As test_trainer's resume test, the option on (ar_lopti, up to 2 further rounds): the
    rounds draw from (seed, step) only, so the resumed steps repeat the uninterrupted ones."""
    def cfg(where):
        return small_cfg(nano_dir, where, method="ar_lopti", dynamic_sampling=2)
    a = trainer.train(cfg(tmp_path / "a"), reward_fn=half_uniform_reward, log=lambda s: None)
    rounds = [m["gen_rounds"] for m in a["metrics"]]
    assert max(rounds) > 1 and any(m["zero_adv_groups"] > 0 for m in a["metrics"])     # not vacuous
    # Ctrl-C during step 4: after the responses of steps 1-3 (each round 2 prompts x G=4)
    stop = interrupting_reward(1, rows_per_step=sum(rounds[:3]) * 2 * 4)

    def reward_b(text, record):
        stop(text, record)
        return half_uniform_reward(text, record)
    cfg_b = cfg(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg_b, reward_fn=reward_b, log=lambda s: None)
    assert [s for s, _ in runs.checkpoints(cfg_b.run_dir)] == [2]
    b = trainer.train(plumbing.resume_config(cfg_b.run_dir, progress=False), resume=True,
                      reward_fn=half_uniform_reward, log=lambda s: None)
    # as JSON: a step that kept no group logs the ratio of no update, NaN (never == itself)
    assert json.dumps(strip(a["metrics"])) == json.dumps(strip(b["metrics"]))
    assert any(m["grad_norm"] > 0 for m in a["metrics"])
    from safetensors.torch import load_file
    wa, wb = (load_file(r["paths"]["final_model"] + "/model.safetensors") for r in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)



def test_round_0_draws_the_papers_prompts_and_further_rounds_a_stream_of_their_own():
    """Pairing by seed: with the option on, a step's round 0 samples the prompts the paper's
    step samples; rounds >= 1 draw other slices, fixed by (seed, step, round)."""
    records, ids = list(range(50)), [[i] for i in range(50)]
    on, off = TrainConfig(prompts_per_step=4, dynamic_sampling=3), TrainConfig(prompts_per_step=4)
    for step in (0, 7, 30):        # step 30 is in the prompt set's second epoch
        paper = plumbing.step_prompts(records, ids, off, step)
        assert plumbing.step_prompts(records, ids, on, step, 0) == paper
        rounds = [plumbing.step_prompts(records, ids, on, step, r)[0] for r in (1, 2, 3)]
        assert rounds == [plumbing.step_prompts(records, ids, on, step, r)[0] for r in (1, 2, 3)]
        assert len({tuple(r) for r in rounds + [paper[0]]}) == 4          # four different draws
