"""divrl's advantage estimators through verl's own registry: the same advantages as verl's
estimators where both have one (grpo, rloo, grpo_passk in verl's form)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

from divrl.algorithms import ADVANTAGE_ESTIMATORS
from divrl.integrations.verl import advantages

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.2])
INDEX = np.array(["a", "a", "a", "a", "b", "b", "b", "b"], dtype=object)


def _token_rewards():
    # the outcome reward on each response's last token, as verl's reward manager writes it
    mask = torch.tensor([[1, 1, 1, 0]] * 4 + [[1, 1, 0, 0]] * 4, dtype=torch.float32)
    rewards = torch.zeros(8, 4)
    rewards[torch.arange(8), mask.sum(-1).long() - 1] = REWARDS
    return rewards, mask


def _call(name, **extra):
    rewards, mask = _token_rewards()
    fn = core_algos.get_adv_estimator_fn(name)
    return fn(token_level_rewards=rewards, response_mask=mask, index=INDEX, **extra)[0], mask


def test_every_divrl_estimator_is_in_verls_registry():
    names = {f"divrl_{n}" for n in ADVANTAGE_ESTIMATORS}
    assert names <= set(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert advantages.register_divrl_advantages() == ()  # a second import registers nothing


@pytest.mark.parametrize(
    ("divrl_name", "verl_name", "options"),
    [
        ("grpo", "grpo", {}),
        ("rloo", "rloo", {}),
        ("grpo_passk", "grpo_passk", {"form": "best_of_group"}),
    ],
)
def test_equal_to_verls_own_estimator(divrl_name, verl_name, options):
    config = AlgoConfig()
    ours, mask = _call(
        f"divrl_{divrl_name}", config={advantages.OPTIONS_KEY: options, **config.__dict__}
    )
    theirs, _ = _call(verl_name, config=config)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours, theirs)
    assert (ours[mask == 0] == 0).all()
