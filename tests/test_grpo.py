"""GRPO, and the known pitfalls of GRPO implementations (zero-variance groups, temperature,
masks, gradient accumulation, the k3 KL). The update's tests where the device matters run
on every device of conftest.DEVICES."""
import copy
import math
from dataclasses import replace

import pytest
import torch

from lopti_minimal.batch import position_ids_from_mask
from lopti_minimal.config import TrainConfig
from lopti_minimal.fast_logprobs import TargetLogProb
from lopti_minimal.grpo import (agg_loss, group_advantages, grpo_update, kl_k3, logprobs_from_logits,
                                policy_loss, sort_by_length, token_logprobs)
from lopti_minimal.precision import build_optimizer
from lopti_minimal.sampling import sample_groups

from conftest import (BOS, CUDA_F32_GRAD_RTOL, CUDA_F32_LOGPROB_TOL, DEVICES, EOS, PAD, generator,
                      tiny_llama, update_batch, with_ref)
PROMPTS = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]
G = 4




class GradRecorder(torch.optim.SGD):
    """SGD that keeps a copy of the gradient it is asked to apply at every step."""

    def __init__(self, params, lr=0.0):
        super().__init__(params, lr=lr)
        self.grads = []

    def step(self, closure=None):
        self.grads.append([p.grad.detach().clone() if p.grad is not None else None
                           for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def flat(grads):
    return torch.cat([g.flatten() for g in grads if g is not None])


def rollout_batch(model, seed=0, temperature=0.7):
    """A sampled batch on the model's device, with fixed rewards' group advantages."""
    r = sample_groups(model, PROMPTS, group_size=G, max_new_tokens=12, temperature=temperature,
                      eos_token_id=EOS, pad_token_id=PAD, generator=generator(model.device, seed))
    rewards = torch.tensor([3.0, -0.5, -1.0, 3.0,  -3.0, -3.0, -3.0, -3.0,  3.0, -1.0, -0.5, -0.5])
    return r, update_batch(r, group_advantages(rewards, G).to(model.device))


# ------------------------------------------------------------------ advantages

def test_group_advantages_values_and_zero_variance():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0,  0.1, 0.1, 0.1, 0.1,  3.0, 3.0, -3.0, -0.5])
    a = group_advantages(rewards, 4)
    g0 = torch.tensor([1.0, 0, 0, 0])
    expect0 = (g0 - g0.mean()) / (g0.std(unbiased=True) + 1e-6)
    assert torch.allclose(a[:4], expect0)
    assert torch.equal(a[4:8], torch.zeros(4))        # 0.1 * 4: exactly 0, not residue/eps
    assert torch.isfinite(a).all()
    assert abs(float(a[8:].sum())) < 1e-5
    # unbiased std: the sample std of [1,0,0,0] is 0.5, its population std 0.433
    assert torch.allclose(a[0], torch.tensor(0.75 / 0.5), atol=1e-5)
    with pytest.raises(ValueError):
        group_advantages(rewards, 1)


# ----------------------------------------------------------------------- losses

def test_policy_loss_asymmetric_and_dual_clip():
    A = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    ratio = torch.tensor([1.5, 0.5, 1.1, 0.5, 1.5, 20.0, 5.0])
    logp = ratio.log().requires_grad_()
    loss, st = policy_loss(logp, torch.zeros(7), A, 0.20, 0.24, 10.0)
    expect = torch.tensor([-1.24,   # A>0, rho above 1+0.24: clipped at 1.24
                           -0.5,    # A>0, rho low: unclipped (pessimistic min)
                           -1.1,    # inside the trust region
                           0.8,     # A<0, rho below 1-0.2: clipped at 0.8
                           1.5,     # A<0, rho high: unclipped
                           10.0,    # A<0, rho = 20: dual clip caps the loss at -A*c = 10
                           5.0])    # A<0, rho = 5 < c: not dual-clipped
    assert torch.allclose(loss, expect, atol=1e-6)
    assert st["clipped"].tolist() == [True, False, False, True, False, False, False]
    assert st["dual_clipped"].tolist() == [False, False, False, False, False, True, False]
    loss.sum().backward()
    g = logp.grad
    assert g[0] == 0 and g[3] == 0 and g[5] == 0          # clipped tokens get no gradient
    assert torch.allclose(g[[1, 2, 4, 6]], (-A * ratio)[[1, 2, 4, 6]])


def test_kl_k3_zero_nonneg_clamped_and_finite():
    x = torch.randn(1000)
    assert torch.equal(kl_k3(x, x), torch.zeros(1000))
    y = torch.randn(1000)
    k = kl_k3(x, y)
    assert (k >= 0).all()
    d = (y - x).clamp(-5, 5)
    assert torch.allclose(k, (d.exp() - d - 1).clamp(-10, 10))
    for clamp in (5.0, 20.0):
        logp = torch.tensor([-200.0, 0.0, -1.0], requires_grad=True)
        k = kl_k3(logp, torch.tensor([0.0, -200.0, -1.5]), clamp)
        assert k[0] == 10                                  # pi_theta far below pi_ref
        assert k[1] == (10 if clamp == 20 else math.exp(-5) + 4)   # far above
        k.sum().backward()
        assert torch.isfinite(logp.grad).all() and logp.grad[0] == 0 and logp.grad[1] == 0


@pytest.mark.parametrize("d", [-12.0, -9.0, -7.0, -6.0, -5.5, -5.0, -4.5, 2.0, 2.7, 5.0, 6.0, 12.0])
def test_kl_k3_log_ratio_clamp_value_and_gradient(d):
    """The reference fork's low_var_kl clamps d = log pi_ref - log pi_theta to [-5, 5]
    before the exp; current verl to [-20, 20]. Value and gradient (w.r.t. log pi_theta)
    against a hand computation: inside the clamps k3 = e^d - d - 1 with gradient
    -(e^d - 1) = 1 - e^d; a clamped d or a clamped k3 (> 10) has no gradient.

    Exactly on the boundary (|d| = clamp) the code keeps the reference's `torch.clamp`, whose
    backward there is a convention of the torch release (torch 2.13 passes the gradient,
    2.14 drops it): both one-sided derivatives are valid, so the test accepts either there
    and pins the value, which every release computes the same."""
    for clamp in (5.0, 20.0):
        logp = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
        k = kl_k3(logp, torch.tensor([d], dtype=torch.float64), clamp)
        k.backward()
        dc = max(-clamp, min(clamp, d))
        value = math.exp(dc) - dc - 1
        inside, outside = 1 - math.exp(d), 0.0
        grads = [inside] if abs(d) < clamp else [outside] if abs(d) > clamp else [inside, outside]
        if value > 10:
            value, grads = 10.0, [0.0]
        assert k.item() == pytest.approx(value, rel=1e-12), (d, clamp)
        assert any(float(logp.grad) == pytest.approx(g, rel=1e-12, abs=1e-15) for g in grads), (d, clamp)
    # The difference the clamp makes, as numbers: a token whose probability rose e^6 above
    # pi_ref's keeps a pulling gradient only under current verl's clamp.
    if d == -6.0:
        assert float(kl_k3(torch.tensor([0.0]), torch.tensor([d]))) == pytest.approx(4.0067, abs=1e-4)
        assert float(kl_k3(torch.tensor([0.0]), torch.tensor([d]), 20.0)) == pytest.approx(5.0025, abs=1e-4)


def test_kl_clamp_reaches_the_update():
    """TrainConfig.kl_log_ratio_clamp is the clamp grpo_update's KL term uses: with zero
    advantages and pi_ref's log-probs 8 below pi_theta's on every token (d = -8), the
    fork's clamp (5, the default) leaves the KL term without gradient, current verl's (20)
    pulls every token back, and a clamp of 9 pulls as 20 does."""
    assert TrainConfig().kl_log_ratio_clamp == 5.0
    model = tiny_llama()
    r, b = rollout_batch(model)
    b = replace(b, advantages=torch.zeros_like(b.advantages))
    ref_logp = (b.old_logprobs - 8.0) * b.response_mask
    grads = {c: _grad(model, b, TrainConfig(mini_batch_size=12, micro_batch_size=4,
                                            kl_log_ratio_clamp=c), ref_logp) for c in (5.0, 9.0, 20.0)}
    assert grads[5.0].abs().max() == 0
    assert grads[20.0].abs().max() > 1e-4
    assert torch.allclose(grads[9.0], grads[20.0])


def test_token_mean_vs_seq_mean_token_mean():
    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    assert agg_loss(loss, mask, "token-mean") == pytest.approx(8 / 5)
    assert agg_loss(loss, mask, "seq-mean-token-mean") == pytest.approx((1 + 4) / 2)


# ------------------------------------------------------------------ pitfalls

@pytest.mark.parametrize("device", DEVICES)
def test_token_logprobs_match_sampler_at_temperature(device):
    model = tiny_llama(device=device).eval()
    for T in (0.7, 1.0):
        r, b = rollout_batch(model, temperature=T)
        with torch.no_grad():
            lp = token_logprobs(model, r.input_ids, r.attention_mask, r.prompt_len, T)
        m = r.response_mask > 0
        assert (lp[m] - r.old_logprobs[m]).abs().max() < (1e-4 if device == "cpu" else CUDA_F32_LOGPROB_TOL)
    # the wrong temperature is visibly wrong: the test can fail
    with torch.no_grad():
        lp1 = token_logprobs(model, r.input_ids, r.attention_mask, r.prompt_len, 0.7)
    assert (lp1[m] - r.old_logprobs[m]).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 17, 24])
def test_row_chunked_log_prob_is_the_whole_tensor_expression_bit_for_bit(dtype, rows):
    """The fast path's row chunks (fast_logprobs.TargetLogProb, its design choice 1) against
    the plain expression on the whole tensor (grpo.logprobs_from_logits: z_y - logsumexp(z),
    z = logits.float() / T) under autograd: the same values and the same gradient of the
    logits, to the bit. SmolLM2's vocabulary, so that torch
    reduces a row in parallel where it would for a lone row; 17 rows leave a one-row tail
    (merged into the chunk before it); 2 rows are a 1 x 2 batch's."""
    V = 49152
    g = torch.Generator().manual_seed(rows)
    base = (3 * torch.randn(1, rows, V, generator=g)).to(dtype)
    targets = torch.randint(0, V, (1, rows), generator=g)
    weights = torch.randn(1, rows, generator=g)
    for T in (0.7, 1.0):
        a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
        want = logprobs_from_logits(a, targets, T)
        got = TargetLogProb.apply(b, targets, T)
        (want * weights).sum().backward()
        (got * weights).sum().backward()
        assert torch.equal(want, got) and torch.equal(a.grad, b.grad) and b.grad.dtype == dtype
        # the gradient is log_softmax's: onehot - softmax, / T (can fail: a wrong T, a sign)
        p = torch.softmax(base.double() / T, -1)
        onehot = torch.nn.functional.one_hot(targets, V).double()
        ref = weights.double().unsqueeze(-1) * (onehot - p) / T
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert (b.grad.double() - ref).abs().max() <= tol * ref.abs().max()


def test_log_probs_over_the_whole_logits_are_the_sliced_expression_bit_for_bit():
    """token_logprobs runs the fast path (fast_logprobs.py: row chunks over the model's whole
    [B, R + 1, V] logits); the plain expression, logprobs_from_logits, reads the slice of the
    R positions that predict a response token. Under bf16 autocast, with left and right
    padding and a weighted loss: the same log-probs and the same gradient of every
    parameter, to the bit."""
    model = tiny_llama(seed=3).train()
    r, _ = rollout_batch(model.eval())
    ids, mask, P = r.input_ids, r.attention_mask, r.prompt_len
    R = ids.shape[1] - P
    w = torch.linspace(-1, 1, R) * r.response_mask

    def grads(logp_fn):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp = logp_fn()
        (lp * w).sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    def sliced():          # the plain expression on the slice
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                    use_cache=False, logits_to_keep=R + 1)
        return logprobs_from_logits(out.logits[:, :-1, :], ids[:, P:], 0.7)

    lp_new, g_new = grads(lambda: token_logprobs(model, ids, mask, P, 0.7))
    lp_old, g_old = grads(sliced)
    assert torch.equal(lp_new, lp_old)
    assert all(torch.equal(a, b) for a, b in zip(g_new, g_old))
    assert any(g.abs().sum() > 0 for g in g_new)


@pytest.mark.parametrize("device", DEVICES)
def test_ratio_exactly_one_at_first_update(device):
    model = tiny_llama(device=device)
    r, b = rollout_batch(model)
    ref = copy.deepcopy(model)
    cfg = TrainConfig(lr=1e-3, mini_batch_size=len(b.input_ids), micro_batch_size=5)
    m = grpo_update(model, build_optimizer(model, cfg), with_ref(b, ref, cfg), cfg)
    # pi_old from the sampler, pi_theta from the update's forward: equal up to the kernels'
    # float32 rounding (on CUDA other kernels: conftest.CUDA_F32_LOGPROB_TOL)
    tol = 1e-5 if device == "cpu" else CUDA_F32_LOGPROB_TOL
    assert abs(m["ratio_min"] - 1) < tol and abs(m["ratio_max"] - 1) < tol
    assert m["clip_frac"] == 0 and m["n_steps"] == 1
    # KL against an identical frozen reference is zero
    assert m["kl"] < 1e-8
    # ... and the update really moved the policy: a second pass sees ratios != 1
    m2 = grpo_update(model, build_optimizer(model, cfg), with_ref(b, ref, cfg), cfg)
    assert max(abs(m2["ratio_min"] - 1), abs(m2["ratio_max"] - 1)) > 1e-3
    assert m2["kl"] > 0


def _grad(model, b, cfg, ref=None, **kw):
    opt = GradRecorder(model.parameters())
    grpo_update(model, opt, with_ref(b, ref, cfg), cfg, **kw)
    return flat(opt.grads[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_reproduce_whole_batch_gradient(mode, device):
    model = tiny_llama(device=device)
    r, b = rollout_batch(model)
    B = len(b.input_ids)
    lengths = r.response_mask.sum(1)
    assert lengths.min() < lengths.max()          # unequal lengths make the test bite
    # A perturbed reference so that the KL term has a gradient too.
    ref = tiny_llama(seed=1, device=device)
    whole = TrainConfig(kl_coef=0.1, mini_batch_size=B, micro_batch_size=B, loss_agg_mode=mode,
                        grad_clip=1e9)
    micro = TrainConfig(kl_coef=0.1, mini_batch_size=B, micro_batch_size=5, loss_agg_mode=mode,
                        grad_clip=1e9)
    g_whole = _grad(model, b, whole, ref)
    g_micro = _grad(model, b, micro, ref)
    rtol = 1e-5 if device == "cpu" else CUDA_F32_GRAD_RTOL
    assert (g_whole - g_micro).abs().max() <= rtol * g_whole.abs().max()
    if mode == "token-mean":
        # The reference's mean of per-micro-batch token-means differs when micro-batches
        # hold different numbers of tokens (the reason "global" is the default).
        verl = TrainConfig(kl_coef=0.1, mini_batch_size=B, micro_batch_size=5,
                           loss_agg_mode=mode, grad_clip=1e9, grad_accum="verl")
        g_verl = _grad(model, b, verl, ref)
        assert (g_whole - g_verl).abs().max() > 1e-2 * g_whole.abs().max()


def test_a_micro_batch_of_short_responses_skips_the_padding_columns():
    """token_logprobs runs a micro-batch only up to its own longest response and pads the
    result back: the values equal a full-width teacher-forced forward."""
    model = tiny_llama().eval()
    r, _ = rollout_batch(model)
    lengths = r.response_mask.sum(1)
    rows = lengths.argsort()[:4]
    R = r.response_ids.shape[1]
    assert lengths[rows].max() < R                 # there is a padding tail to skip
    ids, mask, P = r.input_ids[rows], r.attention_mask[rows], r.prompt_len
    seen = []
    hook = model.register_forward_pre_hook(lambda mod, a, kw: seen.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, P, 0.7)
        hook.remove()
        full = model(input_ids=ids, attention_mask=mask,
                     position_ids=position_ids_from_mask(mask)).logits
    assert seen == [P + int(lengths[rows].max())] and lp.shape == (4, R)
    ref = torch.log_softmax(full[:, P - 1:-1].float() / 0.7, -1)
    ref = ref.gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)
    m = r.response_mask[rows] > 0
    assert (lp[m] - ref[m]).abs().max() < 1e-5
    assert (lp[~m] == 0).all()


def test_sorting_rows_by_length_changes_only_the_order():
    """sort_by_length moves rows within their mini-batch only, and under the exact
    ("global") accumulation every optimizer step gets the same gradient; under "verl"
    (where micro-batch composition matters) it leaves the batch alone."""
    model = tiny_llama()
    r, b = rollout_batch(model)
    # longest first, so that sorting has something to do; each row's advantage names it
    b = b.rows(torch.arange(11, -1, -1))
    b = replace(b, advantages=(torch.arange(12.0)[:, None] + 1) * b.response_mask / 12)
    cfg = TrainConfig(kl_coef=0.1, mini_batch_size=6, micro_batch_size=3, grad_clip=1e9)
    sb = sort_by_length(b, cfg)
    order = (sb.advantages[:, 0] * 12 - 1).round().long()
    assert torch.equal(sb.input_ids, b.input_ids[order])
    assert sorted(order[:6].tolist()) == list(range(6))
    assert sorted(order[6:].tolist()) == list(range(6, 12))
    lens = sb.response_mask.sum(1)
    assert (lens[:6].diff() >= 0).all() and (lens[6:].diff() >= 0).all()
    assert not torch.equal(order, torch.arange(12))        # the test bites
    ref = tiny_llama(seed=1)
    grads = []
    for batch in (b, sb):
        opt = GradRecorder(model.parameters())
        grpo_update(model, opt, with_ref(batch, ref, cfg), cfg)
        grads.append([flat(g) for g in opt.grads])
    assert len(grads[0]) == 2
    for ga, gb in zip(*grads):
        assert (ga - gb).abs().max() <= 1e-5 * ga.abs().max()
    verl = TrainConfig(grad_accum="verl")
    assert sort_by_length(b, verl) is b


def test_mini_batches_make_separate_optimizer_steps():
    model = tiny_llama()
    r, b = rollout_batch(model)
    torch.manual_seed(0)
    b = replace(b, advantages=torch.randn(12, 1) * r.response_mask)
    cfg = TrainConfig(mini_batch_size=4, micro_batch_size=2)
    opt = GradRecorder(model.parameters(), lr=1.0)
    m = grpo_update(model, opt, with_ref(b, copy.deepcopy(model), cfg), cfg)
    assert m["n_steps"] == 3 and len(opt.grads) == 3
    assert m["ratio_max"] > 1 + 1e-4 or m["ratio_min"] < 1 - 1e-4   # later steps see moves


def test_two_ppo_epochs_are_two_steps_the_second_from_the_moved_policy():
    """The study's control arm (GRPO with as many optimizer steps per rollout as Lopti):
    ppo_epochs=2 makes a second full-batch step on the same samples, whose gradient is
    taken at the updated parameters against the unchanged pi_old (ratios no longer 1)."""
    model = tiny_llama()
    r, b = rollout_batch(model)
    torch.manual_seed(0)
    b = replace(b, advantages=torch.randn(12, 1) * r.response_mask)
    one, two = copy.deepcopy(model), copy.deepcopy(model)
    opt1 = GradRecorder(one.parameters(), lr=0.5)
    opt2 = GradRecorder(two.parameters(), lr=0.5)
    m1 = grpo_update(one, opt1, b, TrainConfig(kl_coef=0.0))
    m2 = grpo_update(two, opt2, b, TrainConfig(kl_coef=0.0, ppo_epochs=2))
    assert (m1["n_steps"], m2["n_steps"]) == (1, 2)
    assert torch.equal(flat(opt1.grads[0]), flat(opt2.grads[0]))         # same first step
    assert not torch.allclose(flat(opt2.grads[1]), flat(opt2.grads[0]))  # taken elsewhere
    assert m2["ratio_max"] > 1 + 1e-4 or m2["ratio_min"] < 1 - 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_padding_is_ignored_and_eos_is_trained(device):
    model = tiny_llama(device=device)
    r, b = rollout_batch(model)
    cfg = TrainConfig(kl_coef=0.1, mini_batch_size=12, micro_batch_size=12)
    ref = tiny_llama(seed=1, device=device)
    g = _grad(model, b, cfg, ref)
    pad = r.response_mask == 0
    assert pad.any()
    junk = replace(b, advantages=torch.where(pad, torch.full_like(b.advantages, 7.0), b.advantages),
                   old_logprobs=torch.where(pad, torch.full_like(b.old_logprobs, -3.0), b.old_logprobs))
    assert torch.equal(_grad(model, junk, cfg, ref), g)       # padding never counts
    eos = (r.response_ids == EOS) & (r.response_mask > 0)
    assert eos.any()
    moved = replace(b, advantages=torch.where(eos, b.advantages + 5.0, b.advantages))
    assert not torch.allclose(_grad(model, moved, cfg, ref), g)   # the sampled EOS does


def test_pad_equal_to_eos_end_to_end():
    # With pad == eos the EOS token must still carry gradient.
    model = tiny_llama()
    r = sample_groups(model, PROMPTS, group_size=G, max_new_tokens=12, temperature=0.7,
                      eos_token_id=EOS, pad_token_id=EOS,
                      generator=torch.Generator().manual_seed(0))
    eos = (r.response_ids == EOS) & (r.response_mask > 0)
    assert eos.any() and ((r.response_ids == EOS) & (r.response_mask == 0)).any()
    b = update_batch(r, eos.float())                  # only the EOS tokens have advantage
    cfg = TrainConfig(kl_coef=0.0, mini_batch_size=12, micro_batch_size=12)
    assert _grad(model, b, cfg).norm() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_zero_advantages_and_identical_ref_give_zero_gradient(device):
    model = tiny_llama(device=device)
    r, b = rollout_batch(model)
    b = replace(b, advantages=torch.zeros_like(b.advantages))
    cfg = TrainConfig(mini_batch_size=12, micro_batch_size=4)
    g = _grad(model, b, cfg, copy.deepcopy(model))
    assert g.abs().max() < 1e-6
