"""scripts/mirror_update.py: the start moved by a policy's update with its sign flipped, as far
from the start as the policy; tensors the update did not touch left bit for bit."""
from __future__ import annotations

import pytest
import torch

from conftest import load_script

mirror_update = load_script("scripts/mirror_update.py")


def test_the_mirror_is_the_update_reversed():
    start = {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[0.5, -0.25]])}
    policy = {"a": torch.tensor([1.5, 2.0, 2.0]), "b": start["b"].clone()}
    out, rel, changed = mirror_update.mirror_state(start, policy)
    assert torch.equal(out["a"], torch.tensor([0.5, 2.0, 4.0]))
    assert torch.equal(out["b"], start["b"]) and changed == 1
    # as far from the start as the policy: ||(0.5, 0, 1)|| / ||(1, 2, 3, 0.5, -0.25)||
    assert rel == pytest.approx((0.25 + 1.0) ** 0.5 / (14.3125 ** 0.5))
    assert sum(float((out[k] - start[k]).norm() ** 2) for k in start) == pytest.approx(
        sum(float((policy[k] - start[k]).norm() ** 2) for k in start))


def test_different_models_are_refused():
    with pytest.raises(SystemExit, match="different parameters"):
        mirror_update.mirror_state({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
