"""Fixtures of the training tests (helpers live in train_helpers.py)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import build_tiny_lm, parity_reward, tiny_overrides, write_prompts


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_world")
    return {
        "model": str(build_tiny_lm(root / "model")),
        "data": str(write_prompts(root / "train.jsonl")),
    }


@pytest.fixture(scope="session")
def reference_store(tiny_world, tmp_path_factory):
    """A DPH reference store of the tiny model (near-perfect = the even prompts)."""
    from divrl.training.config import load_config
    from divrl.training.presample import presample

    root = tmp_path_factory.mktemp("reference")
    # the hf engine: test_golden's recorded DPH runs read a store that it sampled
    overrides = tiny_overrides(
        tiny_world,
        root,
        **{"reference.store": root / "store", "reference.k": 4, "rollout.engine": "hf"},
    )
    torch.set_num_threads(1)
    presample(load_config(None, overrides), reward_fn=parity_reward, progress=False)
    return root / "store"
