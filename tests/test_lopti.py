"""Lopti, paper Algorithm 1. The tests run on every device of conftest.DEVICES but for the
order and AR ones, which only compose what the others check."""
import copy
from dataclasses import replace

import pytest
import torch

from lopti_minimal.config import TrainConfig, TrainError, validate
from lopti_minimal.grpo import group_advantages, grpo_update
from lopti_minimal.lopti import (StageOptimizers, lopti_update, split_at_random, split_by_probability,
                                 split_generator)
from lopti_minimal.runs import config_from_json, config_to_json
from lopti_minimal.precision import build_optimizer
from lopti_minimal.reweight import reweight_advantages
from lopti_minimal.sampling import sample_groups

from conftest import (BOS, CUDA_F32_GRAD_RTOL, CUDA_F32_LOGPROB_TOL, DEVICES, EOS, PAD, generator,
                      tiny_llama, update_batch, with_ref)
PROMPTS = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]
G = 4
REWARDS = torch.tensor([3.0, -0.5, -1.0, 3.0, -3.0, 3.0, -1.0, -0.5, 3.0, -1.0, -0.5, -0.5])
ETA = 0.5




class Recorder(torch.optim.SGD):
    """SGD that records, at each step, the gradient and the parameters it starts from."""

    def __init__(self, params, lr=0.0):
        super().__init__(params, lr=lr)
        self.grads, self.params = [], []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads.append(torch.cat([p.grad.flatten() for p in ps]).clone())
        self.params.append(torch.cat([p.detach().flatten() for p in ps]).clone())
        return super().step(closure)


def close(a, b, tol=1e-5):
    """Equal up to float32 rounding, relative to the vector's scale (on CUDA, where sums
    run in other orders, conftest.CUDA_F32_GRAD_RTOL)."""
    if a.device.type == "cuda" and tol < CUDA_F32_GRAD_RTOL:
        tol = CUDA_F32_GRAD_RTOL
    return float((a - b).abs().max()) <= tol * float(b.abs().max())


def setup(device="cpu"):
    model = tiny_llama(device=device)
    r = sample_groups(model, PROMPTS, group_size=G, max_new_tokens=12, temperature=1.0,
                      eos_token_id=EOS, pad_token_id=PAD, generator=generator(device, 0))
    ref = tiny_llama(seed=1, device=device)   # differs from the policy: the KL term has gradient
    cfg = TrainConfig(temperature=1.0, kl_coef=0.05, mini_batch_size=12, micro_batch_size=6,
                      grad_clip=1e9)
    b = update_batch(r, group_advantages(REWARDS, G).to(device), ref, cfg)   # pi_ref's log-probs, once
    return model, r, b, ref, cfg


def run(model, b, cfg, lr=0.0, **kw):
    model = copy.deepcopy(model)
    opt = Recorder(model.parameters(), lr=lr)
    metrics = lopti_update(model, opt, b, cfg, **kw)
    return opt, metrics, model


@pytest.mark.parametrize("device", DEVICES)
def test_split_partitions_valid_tokens(device):
    _, r, b, _, _ = setup(device)
    low, high = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    assert torch.equal(low + high, r.response_mask)
    assert (low * high).sum() == 0
    p = r.old_logprobs.exp()
    assert (p[low > 0] < ETA).all() and (p[high > 0] >= ETA).all()
    assert low.sum() >= 5 and high.sum() >= 5          # both stages have work here


@pytest.mark.parametrize("device", DEVICES)
def test_stage_gradients_depend_only_on_their_own_tokens(device):
    model, r, b, ref, cfg = setup(device)
    low, high = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    base, _, _ = run(model, b, cfg)            # lr = 0: both stages at the same params
    g1, g2 = base.grads
    bump = torch.randn(b.advantages.shape, generator=torch.Generator().manual_seed(3)).to(device)
    hi_changed, _, _ = run(model, replace(b, advantages=b.advantages + bump * high), cfg)
    lo_changed, _, _ = run(model, replace(b, advantages=b.advantages + bump * low), cfg)
    assert torch.equal(hi_changed.grads[0], g1)                 # stage 1 blind to high tokens
    assert not close(hi_changed.grads[1], g2, 1e-3)          # ... stage 2 is not
    assert torch.equal(lo_changed.grads[1], g2)                 # stage 2 blind to low tokens
    assert not close(lo_changed.grads[0], g1, 1e-3)
    # Faithful token-mean: each stage keeps the full token count in its denominator, so
    # at equal parameters the two stage gradients add up to the one GRPO gradient.
    whole = copy.deepcopy(model)
    opt = Recorder(whole.parameters())
    grpo_update(whole, opt, b, cfg)
    assert close(g1 + g2, opt.grads[0])
    # The alternative denominator rescales each stage by (all tokens / its tokens).
    masked, _, _ = run(model, b, cfg, denominator="masked")
    n, n_low = r.response_mask.sum(), low.sum()
    assert close(masked.grads[0] * n_low / n, g1)


@pytest.mark.parametrize("device", DEVICES)
def test_stage_two_starts_from_stage_one_parameters(device):
    model, r, b, ref, cfg = setup(device)
    lr = 0.5
    opt, m, trained = run(model, b, cfg, lr=lr)
    g1, g2 = opt.grads
    p0, p1 = opt.params
    assert close(p1, p0 - lr * g1)                # stage 2 sees stage 1's result
    # Its gradient is the high-token GRPO gradient at those parameters, with the ORIGINAL
    # old log-probs (not recomputed: faithful to the reference).
    after1 = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(p1, after1.parameters())
    low, high = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    check = Recorder(after1.parameters())
    grpo_update(after1, check, b, cfg, token_mask=high)
    assert close(check.grads[0], g2)
    # Old log-probs not recomputed: stage-2 ratios have moved away from 1 ...
    # (pi_old: the sampler's; equal to the update's up to float32 rounding, on CUDA by
    # other kernels: conftest.CUDA_F32_LOGPROB_TOL)
    tol = 1e-5 if device == "cpu" else CUDA_F32_LOGPROB_TOL
    assert max(abs(m["stage2"]["ratio_max"] - 1), abs(m["stage2"]["ratio_min"] - 1)) > 1e-3
    assert abs(m["stage1"]["ratio_max"] - 1) < tol
    # ... unless asked to recompute them.
    _, m_re, _ = run(model, b, cfg, lr=lr, recompute_old=True)
    assert abs(m_re["stage2"]["ratio_max"] - 1) < tol and abs(m_re["stage2"]["ratio_min"] - 1) < tol


def test_high_first_order_swaps_the_stages():
    model, r, b, ref, cfg = setup()
    low_first, _, _ = run(model, b, cfg)
    high_first, _, _ = run(model, b, cfg, order="high_first")
    assert torch.equal(high_first.grads[0], low_first.grads[1])
    assert torch.equal(high_first.grads[1], low_first.grads[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["below_min", "above_one"])
def test_degenerate_eta_is_one_grpo_update(which, device):
    model, r, b, ref, cfg = setup(device)
    cfg = TrainConfig(temperature=1.0, lr=1e-3, kl_coef=0.05, mini_batch_size=6,
                      micro_batch_size=3)
    b = with_ref(b, ref, cfg)
    p = r.old_logprobs.exp()[r.response_mask > 0]
    eta = float(p.min()) if which == "below_min" else 1.01   # all high / all low
    m_lopti, m_grpo = copy.deepcopy(model), copy.deepcopy(model)
    out = lopti_update(m_lopti, build_optimizer(m_lopti, cfg), b, cfg, eta=eta)
    grpo_update(m_grpo, build_optimizer(m_grpo, cfg), b, cfg)
    assert out["stage1"]["n_steps"] + out["stage2"]["n_steps"] == 2   # one stage only
    for a, c in zip(m_lopti.parameters(), m_grpo.parameters()):
        assert torch.allclose(a, c, rtol=0, atol=1e-7)
    assert any(not torch.equal(a, c) for a, c in zip(m_lopti.parameters(), model.parameters()))


def test_composes_with_ar():
    model, r, b, ref, cfg = setup()
    Ah = reweight_advantages(b.advantages, r.old_logprobs, alpha=0.3)
    ar = replace(b, advantages=Ah)
    opt, _, _ = run(model, ar, cfg)
    low, _ = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    twin = copy.deepcopy(model)
    check = Recorder(twin.parameters())
    grpo_update(twin, check, ar, cfg, token_mask=low)
    assert torch.equal(opt.grads[0], check.grads[0])      # stage 1 = low tokens, AR advantages
    plain, _, _ = run(model, b, cfg)
    assert not close(plain.grads[0], opt.grads[0], 1e-3)


# ----------------------------------------------------------------------------- the random split

def test_random_split_has_the_low_stage_s_size_and_partitions_the_valid_tokens():
    """The criterion's control: as many tokens as pi_old < eta selects, drawn from the valid
    tokens only, the two stages disjoint and covering every valid token; not the low stage
    itself, and the same draw for the same (seed, step)."""
    _, r, _, _, _ = setup()
    low, _ = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    draws = []
    for seed, step in ((0, 0), (0, 1), (1, 0), (0, 0)):
        first, second = split_at_random(low, r.response_mask, split_generator(seed, step))
        assert first.sum() == low.sum() and first.sum() > 0
        assert torch.equal(first + second, r.response_mask)            # covers every valid token
        assert (first * second).sum() == 0 and ((first == 0) | (first == 1)).all()
        assert (first[r.response_mask == 0] == 0).all()                  # never padding
        draws.append(first)
    assert torch.equal(draws[0], draws[3])                               # same (seed, step), same draw
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert not all(torch.equal(d, low) for d in draws)                   # not the criterion's split
    # Uniform over the valid tokens: in 400 draws each lands in the first stage about
    # |low| / |valid| = 81 / 106 of the time (binomial sd 0.021; 0.1 is ~5 sd), wherever it sits.
    hits = sum(split_at_random(low, r.response_mask, split_generator(s, 0))[0] for s in range(400)) / 400
    share = float(low.sum() / r.response_mask.sum())
    assert (hits[r.response_mask > 0] - share).abs().max() < 0.1


def test_random_split_update_trains_the_drawn_stages_and_leaves_other_randomness_alone():
    """lopti_update(split="random"): stage 1 is the GRPO update on the drawn tokens, stage 2
    on the rest; the draw uses only its own generator (the global RNG and a sampler's
    generator are untouched), and low_fraction is the probability split's."""
    model, r, b, ref, cfg = setup()
    low, _ = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    first, second = split_at_random(low, r.response_mask, split_generator(3, 7))
    sampler = torch.Generator().manual_seed(11)
    global_state, sampler_state = torch.get_rng_state(), sampler.get_state()
    opt, m, _ = run(model, b, cfg, eta=ETA, split="random", generator=split_generator(3, 7))
    assert torch.equal(torch.get_rng_state(), global_state) and torch.equal(sampler.get_state(), sampler_state)
    assert m["low_fraction"] == pytest.approx(float(low.sum() / r.response_mask.sum()))
    for k, mask in enumerate((first, second)):                    # lr = 0: both at the same params
        twin = copy.deepcopy(model)
        check = Recorder(twin.parameters())
        grpo_update(twin, check, b, cfg, token_mask=mask)
        assert torch.equal(opt.grads[k], check.grads[0])
    by_probability, _, _ = run(model, b, cfg, eta=ETA)
    assert not close(opt.grads[0], by_probability.grads[0], 1e-3)
    high_first, _, _ = run(model, b, cfg, eta=ETA, split="random", order="high_first",
                           generator=split_generator(3, 7))
    assert torch.equal(high_first.grads[0], opt.grads[1])            # the order swaps the drawn stages
    with pytest.raises(ValueError, match="generator"):
        run(model, b, cfg, split="random")
    with pytest.raises(ValueError, match="unknown split"):
        run(model, b, cfg, split="entropy", generator=split_generator(0, 0))


# ----------------------------------------------------------------------------- the optimizer state

def flat_state(opt, key="exp_avg"):
    """An optimizer's per-parameter state ``key``, flattened in parameter order."""
    return torch.cat([opt.state[p][key].flatten() for g in opt.param_groups for p in g["params"]])


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def stage_grad(model, b, cfg, mask):
    """The GRPO gradient of ``mask``'s tokens at ``model``'s weights (a Recorder, lr 0)."""
    twin = copy.deepcopy(model)
    rec = Recorder(twin.parameters())
    grpo_update(twin, rec, b, cfg, token_mask=mask)
    return rec.grads[0]


def test_per_stage_optimizers_carry_nothing_of_stage_one_into_stage_two():
    """lopti.py, choice 8, on a fresh AdamW state. Per stage: stage 2's update is exactly that
    of a fresh AdamW stepping on stage 2's gradient alone from stage 1's weights, and its
    first moment holds g_high only. Shared (the reference, the default): stage 2's first
    moment is 0.09 g_low + 0.1 g_high (0.47 g_low + 0.53 g_high once bias-corrected), and
    the weights differ."""
    model, r, b, ref, cfg = setup()
    cfg = replace(cfg, lr=1e-2)
    per_cfg = replace(cfg, lopti_optimizer="per_stage")
    low, high = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    # Isolation by definition: stage 1 by a fresh AdamW, then stage 2 by another fresh one.
    isolated = copy.deepcopy(model)
    grpo_update(isolated, build_optimizer(isolated, cfg), b, cfg, token_mask=low)
    g_low, g_high = stage_grad(model, b, cfg, low), stage_grad(isolated, b, cfg, high)
    grpo_update(isolated, build_optimizer(isolated, cfg), b, cfg, token_mask=high)

    per = copy.deepcopy(model)
    opt = build_optimizer(per, per_cfg)
    assert isinstance(opt, StageOptimizers) and opt.low is not opt.high
    lopti_update(per, opt, b, per_cfg, eta=ETA)
    assert torch.equal(flat_params(per), flat_params(isolated))            # bit for bit
    assert close(flat_state(opt.low), 0.1 * g_low) and close(flat_state(opt.high), 0.1 * g_high)

    shared = copy.deepcopy(model)
    one = build_optimizer(shared, cfg)
    lopti_update(shared, one, b, cfg, eta=ETA)
    assert close(flat_state(one), 0.09 * g_low + 0.1 * g_high)
    assert not close(flat_params(shared) - flat_params(model), flat_params(isolated) - flat_params(model), 0.05)
    assert round(0.09 / 0.19, 2) == 0.47                                  # the docstring's share
    # The state belongs to a token set: reversed, the "high" state steps first, at the start.
    rev = copy.deepcopy(model)
    opt_rev = build_optimizer(rev, per_cfg)
    lopti_update(rev, opt_rev, b, per_cfg, eta=ETA, order="high_first")
    assert close(flat_state(opt_rev.high), 0.1 * stage_grad(model, b, cfg, high))


def test_the_default_shares_one_optimizer_bit_for_bit_as_before():
    """lopti_optimizer defaults to "shared" (also for a run.json saved before it existed):
    one plain AdamW, and lopti_update is the two grpo_update calls on it, bit for bit. A
    method without Lopti gets one optimizer whatever the option says."""
    model, r, b, ref, cfg = setup()
    cfg = replace(cfg, lr=1e-2)
    saved = config_to_json(cfg)
    del saved["lopti_optimizer"]
    assert cfg.lopti_optimizer == "shared" and config_from_json(saved).lopti_optimizer == "shared"
    low, high = split_by_probability(r.old_logprobs, r.response_mask, ETA)
    new = copy.deepcopy(model)
    opt = build_optimizer(new, cfg)
    assert type(opt) is torch.optim.AdamW
    lopti_update(new, opt, b, cfg, eta=ETA)
    old = copy.deepcopy(model)
    adamw = torch.optim.AdamW(old.parameters(), lr=cfg.optimizer_lr, betas=cfg.adam_betas,
                              weight_decay=cfg.weight_decay)
    grpo_update(old, adamw, b, cfg, token_mask=low)
    grpo_update(old, adamw, b, cfg, token_mask=high)
    assert torch.equal(flat_params(new), flat_params(old))
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(flat_state(opt, key), flat_state(adamw, key))
    grpo_cfg = replace(cfg, method="grpo", lopti_optimizer="per_stage")
    assert type(build_optimizer(copy.deepcopy(model), grpo_cfg)) is torch.optim.AdamW
    with pytest.raises(TrainError, match="lopti optimizer must be shared or per_stage"):
        validate(replace(cfg, lopti_optimizer="separate"))


@pytest.mark.parametrize("kind", ["adamw", "adafactor", "adamw8bit"])
def test_per_stage_optimizers_of_every_kind_step_and_round_trip_their_states(kind, tmp_path):
    """Every optimizer kind builds per stage; both states go through a checkpoint's
    weights-only file (runs.read_state's loader) into fresh optimizers, which then make the
    same next update bit for bit; a shared state is refused by a per-stage run in one line."""
    if kind == "adamw8bit":
        pytest.importorskip("torchao")
    model, r, b, ref, cfg = setup()
    cfg = replace(cfg, lr=1e-2, optimizer=kind, lopti_optimizer="per_stage")
    trained = copy.deepcopy(model)
    opt = build_optimizer(trained, cfg)
    lopti_update(trained, opt, b, cfg, eta=ETA)
    assert len(opt.low.state) == len(opt.high.state) == len(list(model.parameters()))
    torch.save({"optimizer": opt.state_dict()}, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)["optimizer"]
    resumed = copy.deepcopy(trained)
    fresh = build_optimizer(resumed, cfg)
    fresh.load_state_dict(state)
    lopti_update(trained, opt, b, cfg, eta=ETA)
    lopti_update(resumed, fresh, b, cfg, eta=ETA)
    assert torch.equal(flat_params(trained), flat_params(resumed))
    unrestored = copy.deepcopy(resumed)              # not vacuous: fresh states step otherwise
    lopti_update(unrestored, build_optimizer(unrestored, cfg), b, cfg, eta=ETA)
    lopti_update(resumed, fresh, b, cfg, eta=ETA)
    assert not torch.equal(flat_params(unrestored), flat_params(resumed))
    with pytest.raises(ValueError, match="one shared by both Lopti stages"):
        fresh.load_state_dict(opt.low.state_dict())


def test_per_stage_run_resumes_exactly(nano_dir, tmp_path):
    """Both stage optimizers' states are in every checkpoint (trainer_state.pt), so a
    per-stage run interrupted during step 4 and resumed from its step-2 checkpoint repeats
    the uninterrupted run bit for bit (as test_trainer's resume test for the default)."""
    from test_trainer import interrupting_reward, length_reward, small_cfg, strip
    from lopti_minimal import plumbing, runs, trainer

    def cfg(where):
        return small_cfg(nano_dir, where, method="lopti", eta=0.003, lopti_optimizer="per_stage")

    a = trainer.train(cfg(tmp_path / "a"), reward_fn=length_reward, log=lambda s: None)
    cfg_b = cfg(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):            # during step 4: 3 steps x 2 prompts x G=4
        trainer.train(cfg_b, reward_fn=interrupting_reward(3), log=lambda s: None)
    [(step, ckpt)] = runs.checkpoints(cfg_b.run_dir)
    state = runs.read_state(ckpt / "trainer_state.pt", "")["optimizer"]["per_stage"]
    assert step == 2 and all(s["state"] for s in state.values())      # both stages stepped
    assert not torch.equal(state["low"]["state"][0]["exp_avg"], state["high"]["state"][0]["exp_avg"])
    b = trainer.train(plumbing.resume_config(cfg_b.run_dir, progress=False), resume=True,
                      reward_fn=length_reward, log=lambda s: None)
    assert strip(a["metrics"]) == strip(b["metrics"]) and all(m["grad_norm"] > 0 for m in a["metrics"])
    assert 0 < a["metrics"][0]["low_fraction"] < 1                   # both stages had tokens
    from transformers import AutoModelForCausalLM
    wa = AutoModelForCausalLM.from_pretrained(a["paths"]["final_model"]).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b["paths"]["final_model"]).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
