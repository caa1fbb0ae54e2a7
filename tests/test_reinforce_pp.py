"""REINFORCE++ (grpo.reinforce_pp_advantages), the reference code's second advantage
estimator: hand-computed values, the masks of padded rows, an all-equal batch, the
discount, and AR and Lopti on top of it changing exactly what they change on top of GRPO;
one CPU RL step of every method with it."""
import pytest
import torch

from lopti_minimal import models, plumbing, precision, trainer
from lopti_minimal.grpo import group_advantages, reinforce_pp_advantages, token_advantages
from lopti_minimal.lopti import split_by_probability
from lopti_minimal.reweight import reweight_advantages
from lopti_minimal.config import METHODS, TrainError, make_config


def reference_loop(rewards, mask, gamma):
    """The reference's formulation, line by line: the outcome reward on the last valid
    token, returns accumulated backwards and reset by the mask, then whitened over the
    valid tokens of the batch (unbiased variance, 1e-8 inside the square root)."""
    B, R = mask.shape
    level = torch.zeros(B, R)
    for i in range(B):
        level[i, int(mask[i].sum()) - 1] = rewards[i]
    returns, running = torch.zeros(B, R), torch.zeros(B)
    for t in reversed(range(R)):
        running = level[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = (((returns - mean) ** 2) * mask).sum() / n * (n / (n - 1))
    return (returns - mean) * torch.rsqrt(var + 1e-8) * mask


def test_hand_computed_with_a_padded_row():
    # Lengths 2 and 3: returns 3, 3 | -.5, -.5, -.5 over N = 5 tokens; mean .9;
    # unbiased var (2 * 2.1^2 + 3 * 1.4^2) / 4 = 3.675; A = 2.1 / 1.917029, -1.4 / 1.917029.
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    a = reinforce_pp_advantages(torch.tensor([3.0, -0.5]), mask)
    assert a[0, :2].tolist() == pytest.approx([1.095445, 1.095445], abs=1e-6)
    assert a[1].tolist() == pytest.approx([-0.730297] * 3, abs=1e-6)
    assert a[0, 2] == 0.0                                        # padding
    # No group baseline: the long response weighs more in the mean (token-weighted).
    assert (a * mask).sum().abs() < 1e-5 and a[0, 0] + a[1, 0] != 0


def test_matches_the_reference_loop_with_and_without_discount():
    lengths = torch.tensor([5, 1, 7, 3, 7, 2])
    mask = (torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.tensor([3.0, -0.5, -1.0, 3.0, -3.0, -0.5])
    for gamma in (1.0, 0.9):
        torch.testing.assert_close(reinforce_pp_advantages(rewards, mask, gamma=gamma),
                                   reference_loop(rewards, mask, gamma), rtol=1e-5, atol=1e-6)


def test_all_equal_rewards_give_zero_and_a_single_token_is_refused():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert torch.equal(reinforce_pp_advantages(torch.tensor([3.0, 3.0]), mask), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at least 2 valid tokens"):
        reinforce_pp_advantages(torch.tensor([3.0]), torch.tensor([[1.0, 0.0]]))


def test_ar_and_lopti_act_on_it_as_on_grpo():
    """AR's factor (alpha pi_old + 1 - alpha) and Lopti's token split depend on pi_old only:
    the same for either estimator's advantages."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([4, 6, 2, 6, 5, 3, 6, 1])
    mask = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.tensor([3.0, -0.5, -0.5, 3.0, -1.0, -0.5, 3.0, -3.0])
    old = torch.log(torch.rand(8, 6, generator=g).clamp_min(1e-3)) * mask
    base = {"grpo": token_advantages(group_advantages(rewards, 4), mask),
            "reinforce_pp": reinforce_pp_advantages(rewards, mask)}
    for name, adv in base.items():
        nz = adv != 0
        assert nz.any(), name
        factor = reweight_advantages(adv, old, 0.3)[nz] / adv[nz]
        torch.testing.assert_close(factor, (0.3 * old.exp() + 0.7)[nz])
    low, high = split_by_probability(old, mask, 0.5)
    assert torch.equal(low + high, mask)                  # the split never looks at advantages


@pytest.mark.parametrize("method", METHODS)
def test_one_cpu_step_of_every_method_with_reinforce_pp(method, nano_dir, tmp_path):
    cfg = make_config("ci", model=nano_dir, method=method, estimator="reinforce_pp", prompts_per_step=2,
                      group_size=4, max_new_tokens=24, rl_per_size=10, final_eval=False, plots=False,
                      progress=False, lr=3e-3, cache_dir=str(tmp_path / "cache"), run_dir=str(tmp_path / "run"))
    model, tok = plumbing.load_policy(cfg)
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    records, ids = models.encode_prompts(records[:2], tok, "auto", 256)
    # A reward that varies across the batch: the response length (so advantages are not 0).
    m = trainer.rl_step(model, precision.reference_copy(model), precision.build_optimizer(model, cfg),
                        tok, records, ids, cfg, 0, lambda text, rec: float(len(text) % 7))
    assert m["ratio_min"] == 1.0 == m["ratio_max"] and m["grad_norm"] > 0 and m["tokens"] > 0
    with pytest.raises(TrainError, match="unknown estimator"):
        make_config("ci", estimator="ppo")
