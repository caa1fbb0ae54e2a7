"""Lopti, paper Algorithm 1. The tests run on every device of conftest.DEVICES but for the
order and AR ones, which only compose what the others check."""
import copy
from dataclasses import replace

import pytest
import torch

from lopti_minimal.config import TrainConfig
from lopti_minimal.grpo import group_advantages, grpo_update
from lopti_minimal.lopti import lopti_update, split_at_random, split_by_probability, split_generator
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
