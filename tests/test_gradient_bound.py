"""The softmax gradient bound behind the paper's Proposition 4.2.

For logits z and token y, d log softmax(z)_y / dz = e_y - pi, whose norm lies in
[(1 - pi_y) sqrt(N / (N - 1)), sqrt(2) (1 - pi_y)] (paper §4, the last-layer case of Prop. 4.2).
"""
import math

import torch


def test_softmax_logprob_gradient_norm_bounds():
    g = torch.Generator().manual_seed(0)
    checked = 0
    for N in (2, 3, 10, 100, 5000):
        for scale in (0.1, 1.0, 5.0, 20.0):          # from flat to very peaked softmax
            z = (torch.randn(64, N, generator=g, dtype=torch.float64) * scale).requires_grad_()
            y = torch.randint(0, N, (64,), generator=g)
            logp = torch.log_softmax(z, -1).gather(-1, y[:, None]).squeeze(-1)
            (grad,) = torch.autograd.grad(logp.sum(), z)     # rows are independent
            norm = grad.norm(dim=-1)
            one_minus_p = 1 - logp.detach().exp()
            lower = one_minus_p * math.sqrt(N / (N - 1))
            upper = one_minus_p * math.sqrt(2)
            assert (norm >= lower * (1 - 1e-9) - 1e-12).all(), (N, scale)
            assert (norm <= upper * (1 + 1e-9) + 1e-12).all(), (N, scale)
            # the autograd gradient is e_y - pi, as the derivation says
            pi = torch.softmax(z.detach(), -1)
            assert torch.allclose(grad, torch.nn.functional.one_hot(y, N).double() - pi)
            checked += 64
    assert checked == 5 * 4 * 64


def test_bound_is_tight_and_norm_falls_with_probability():
    # N = 2: both bounds coincide, so the norm is exactly sqrt(2) (1 - p).
    z = torch.tensor([[0.3, -1.2]], dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(z, -1)[0, 0]
    (grad,) = torch.autograd.grad(lp, z)
    assert torch.isclose(grad.norm(), math.sqrt(2) * (1 - lp.exp()))
    # Raising the token's own logit raises p_y and lowers the gradient norm (monotone).
    norms = []
    for boost in torch.linspace(-5, 5, 21, dtype=torch.float64):
        z = torch.zeros(1, 50, dtype=torch.float64)
        z[0, 7] = boost
        z.requires_grad_()
        (grad,) = torch.autograd.grad(torch.log_softmax(z, -1)[0, 7], z)
        norms.append(float(grad.norm()))
    assert all(a > b for a, b in zip(norms, norms[1:]))
