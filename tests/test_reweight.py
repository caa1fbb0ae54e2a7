"""Advantage Reweighting, paper Eq. 4."""
import copy
from dataclasses import replace

import torch

from lopti_minimal.config import TrainConfig
from lopti_minimal.grpo import group_advantages, grpo_update, policy_loss, token_logprobs
from lopti_minimal.precision import build_optimizer
from lopti_minimal.reweight import reweight_advantages, reweight_weights
from lopti_minimal.sampling import sample_groups

from conftest import BOS, EOS, PAD, tiny_llama, update_batch
PROMPTS = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13], [BOS, 20, 21]]
G = 4
REWARDS = torch.tensor([3.0, -0.5, -1.0, 3.0, -3.0, 3.0, -1.0, -0.5,
                        3.0, -1.0, -0.5, -0.5, -1.0, 3.0, 3.0, -3.0])




def rollout(model):
    return sample_groups(model, PROMPTS, group_size=G, max_new_tokens=10, temperature=1.0,
                         eos_token_id=EOS, pad_token_id=PAD,
                         generator=torch.Generator().manual_seed(0))


def test_alpha_zero_is_grpo_bit_for_bit():
    model = tiny_llama()
    r = rollout(model)
    cfg = TrainConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=4)
    b = update_batch(r, group_advantages(REWARDS, G), copy.deepcopy(model), cfg)
    A0 = reweight_advantages(b.advantages, r.old_logprobs, alpha=0.0)
    assert torch.equal(A0, b.advantages)
    m1, m2 = model, copy.deepcopy(model)
    grpo_update(m1, build_optimizer(m1, cfg), b, cfg)
    grpo_update(m2, build_optimizer(m2, cfg), replace(b, advantages=A0), cfg)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)


def test_weights_in_range_both_signs():
    g = torch.Generator().manual_seed(0)
    old = torch.log(torch.rand(50, 30, generator=g).clamp_min(1e-6))
    A = torch.randn(50, 30, generator=g)
    for alpha in (0.1, 0.2, 0.3, 1.0):
        Ah = reweight_advantages(A, old, alpha)
        w = Ah / A
        assert (w >= 1 - alpha - 1e-6).all() and (w <= 1 + 1e-6).all()
        assert torch.allclose(w, alpha * old.exp() + 1 - alpha, atol=1e-5)
        assert (torch.sign(Ah) == torch.sign(A)).all()          # both signs, never flipped
        assert torch.allclose(reweight_weights(old, alpha), w, atol=1e-5)
    # w rises with pi_old: low-probability tokens are damped the most
    p = torch.linspace(0, 1, 11)
    assert (reweight_weights(p.log(), 0.3).diff() > 0).all()


def per_token_grad_norms(model, r, adv):
    """Norm over all parameters of the gradient of each valid token's surrogate loss."""
    params = [p for p in model.parameters()]
    logp = token_logprobs(model, r.input_ids, r.attention_mask, r.prompt_len, 1.0)
    loss, _ = policy_loss(logp, logp.detach(), adv)        # fresh samples: ratio = 1
    idx = (r.response_mask > 0).nonzero().tolist()
    norms = []
    for b, t in idx:
        grads = torch.autograd.grad(loss[b, t], params, retain_graph=True, allow_unused=True)
        norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    return torch.stack(norms), idx


def test_ar_cuts_low_bin_share_by_the_predicted_amount():
    alpha = 0.3
    model = tiny_llama()
    r = rollout(model)
    A = update_batch(r, group_advantages(REWARDS, G)).advantages
    # Unit-weight norms n_t = ||grad log p_t||, and the per-token norms under GRPO and AR.
    n, idx = per_token_grad_norms(model, r, torch.ones_like(A))
    Ah = reweight_advantages(A, r.old_logprobs, alpha)
    g_grpo, _ = per_token_grad_norms(model, r, A)
    g_ar, _ = per_token_grad_norms(model, r, Ah)
    rows, cols = zip(*idx)
    p = r.old_logprobs.exp()[rows, cols].double()
    a = A[rows, cols].double().abs()
    w = alpha * p + 1 - alpha
    low = p < 0.25
    assert low.sum() >= 5 and (~low).sum() >= 5, "need tokens in and out of the lowest bin"
    # GRPO: per-token norm = |A| n;  AR: w |A| n  (Eq. 4 is linear in A)
    assert torch.allclose(g_grpo, a * n, rtol=1e-4)
    share_grpo = g_grpo[low].sum() / g_grpo.sum()
    share_ar = g_ar[low].sum() / g_ar.sum()
    predicted_ar = (w * a * n)[low].sum() / (w * a * n).sum()
    predicted_drop = share_grpo - predicted_ar
    assert predicted_drop > 0.005                           # a real, non-trivial drop
    assert abs((share_grpo - share_ar) - predicted_drop) < 1e-4 * max(1.0, float(predicted_drop))
    assert share_ar < share_grpo
