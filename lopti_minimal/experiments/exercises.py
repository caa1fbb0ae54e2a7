"""The tutorial's exercises: the learner writes four pieces of the method, and each checker
here compares the learner's function with the package's on a real batch.

1. `check_ar_factor`:   Eq. 4's factor alpha * pi_old + 1 - alpha      (reweight.reweight_weights)
2. `check_split`:       Algorithm 1's split by pi_old < eta             (lopti.split_by_probability)
3. `check_two_stages`:  Algorithm 1's two updates, low tokens first     (lopti.lopti_update)
4. `check_clipped_loss`: the clipped surrogate with clip-higher and the dual clip
                                                                        (grpo.policy_loss)

Each checker prints one line and returns True or False. "not yet" while the stub still raises
NotImplementedError, or when the function errs or disagrees (with the first lines of
`torch.testing.assert_close`'s message); "correct" when every case agrees. A checker never
raises, so the committed notebook runs from top to bottom with its stubs unfilled.
tests/test_exercises.py feeds each checker the tutorial's solutions (they pass) and wrong
functions (they fail).
"""
from __future__ import annotations

import traceback

import torch
from torch.testing import assert_close

from .. import grpo, lopti, precision, reweight
from .diagnostics import restore, snapshot


def _verdict(name: str, attempt) -> bool:
    """Run ``attempt`` (which raises AssertionError on a disagreement) and say how it went."""
    try:
        attempt()
    except NotImplementedError:
        print(f"{name}: not yet (the function still raises NotImplementedError)")
        return False
    except AssertionError as e:
        print(f"{name}: not yet: " + " ".join(str(e).split("\n")[:3]))
        return False
    except Exception as e:                               # a bug in the attempt: say where, go on
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"{name}: not yet: {type(e).__name__}: {e} (line {where.lineno})")
        return False
    print(f"{name}: correct")
    return True


def check_ar_factor(fn, old_logprobs: torch.Tensor, response_mask: torch.Tensor) -> bool:
    """fn(old_logprobs, alpha) -> the factor of Eq. 4 per token, [B, R]; compared on the
    valid tokens at alpha 0 (GRPO), 0.2 (AR alone), 0.3 (AR+Lopti) and 1."""
    valid = response_mask > 0

    def attempt():
        for alpha in (0.0, 0.2, 0.3, 1.0):
            got = torch.as_tensor(fn(old_logprobs, alpha))
            assert_close(got[valid], reweight.reweight_weights(old_logprobs, alpha)[valid],
                         msg=lambda m, a=alpha: f"at alpha {a}: {m}")
    return _verdict("Eq. 4's factor", attempt)


def check_split(fn, old_logprobs: torch.Tensor, response_mask: torch.Tensor) -> bool:
    """fn(old_logprobs, response_mask, eta) -> (low, high), float masks [B, R] (padding in
    neither); compared at eta 0.4 (Lopti alone) and 0.5 (AR+Lopti)."""
    def attempt():
        for eta in (0.4, 0.5):
            low, high = fn(old_logprobs, response_mask, eta)
            want_low, want_high = lopti.split_by_probability(old_logprobs, response_mask, eta)
            assert_close(torch.as_tensor(low).float(), want_low, msg=lambda m, e=eta: f"low, eta {e}: {m}")
            assert_close(torch.as_tensor(high).float(), want_high, msg=lambda m, e=eta: f"high, eta {e}: {m}")
    return _verdict("Lopti's split", attempt)


def _weights_after(update, model, cfg) -> dict:
    """The weights ``update(optimizer)`` leaves, from the current ones (restored after)."""
    start = snapshot(model)
    try:
        update(precision.build_optimizer(model, cfg))
        return snapshot(model)
    finally:
        restore(model, start)


def check_two_stages(fn, model, batch, cfg, eta: float = 0.5) -> bool:
    """fn(model, optimizer, batch, cfg, eta) makes Algorithm 1's two updates (one optimizer,
    shared by the stages, as the reference does); the weights it leaves are compared with
    those `lopti.lopti_update` leaves from the same start. The model is restored after."""
    def attempt():
        got = _weights_after(lambda opt: fn(model, opt, batch, cfg, eta), model, cfg)   # a stub stops here
        want = _weights_after(lambda opt: lopti.lopti_update(model, opt, batch, cfg, eta=eta), model, cfg)
        for name, w in want.items():
            assert_close(got[name], w, msg=lambda m, n=name: f"{n}: {m}")
    return _verdict("Lopti's two stages", attempt)


def _ratio_cases(old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor):
    """(logp, old_logp, advantages) cases: the batch with its log-probs moved so that the
    ratios span the clip range on both sides and reach the dual clip (rho > 10), with the
    advantages as they are and negated; and a sweep of rho from 0.02 to 50 at A = +-1."""
    valid = response_mask > 0
    shift = torch.linspace(-3.0, 3.0, valid.numel()).view_as(old_logprobs)      # rho from e^-3 to e^3
    cases = [(old_logprobs[valid] + shift[valid], old_logprobs[valid], sign * advantages[valid])
             for sign in (1.0, -1.0)]
    rho = torch.logspace(-1.7, 1.7, 401)
    for a in (1.0, -1.0):
        cases.append((rho.log(), torch.zeros_like(rho), torch.full_like(rho, a)))
    return cases


def check_clipped_loss(fn, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                       response_mask: torch.Tensor, eps_low: float = 0.20, eps_high: float = 0.24,
                       clip_c: float = 10.0) -> bool:
    """fn(logp, old_logp, advantages, eps_low, eps_high, clip_c) -> the per-token loss;
    compared with the loss of `grpo.policy_loss` on the cases of `_ratio_cases`."""
    def attempt():
        for i, (logp, old, adv) in enumerate(_ratio_cases(old_logprobs, advantages, response_mask)):
            want, _ = grpo.policy_loss(logp, old, adv, eps_low, eps_high, clip_c)
            assert_close(torch.as_tensor(fn(logp, old, adv, eps_low, eps_high, clip_c)), want,
                         msg=lambda m, i=i: f"case {i}: {m}")
    return _verdict("the clipped surrogate", attempt)
