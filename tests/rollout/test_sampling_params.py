"""SamplingParams.from_settings: the one way training, presampling and eval build them."""

from __future__ import annotations

import dataclasses

import pytest

from divrl.evaluation.runner import EvalConfig
from divrl.rollout import SamplingParams
from divrl.training.config import load_config


def test_every_field_comes_from_the_settings_and_changes_win():
    rollout = load_config(None, ["rollout.top_k=5", "rollout.stop=</a>"]).rollout
    params = SamplingParams.from_settings(rollout)
    assert (params.n, params.top_k, params.stop) == (rollout.n, 5, ("</a>",))
    assert params.max_new_tokens == rollout.max_new_tokens
    assert SamplingParams.from_settings(params, n=1, top_p=0.5) == dataclasses.replace(
        params, n=1, top_p=0.5
    )
    evaluation = SamplingParams.from_settings(EvalConfig(n=3, temperature=0.7))
    assert (evaluation.n, evaluation.temperature) == (3, 0.7)
    with pytest.raises(ValueError, match="top_p in"):
        SamplingParams.from_settings(rollout, top_p=0.0)
