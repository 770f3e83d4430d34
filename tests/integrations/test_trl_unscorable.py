"""divrl's verifier reward in TRL: an unscorable completion (here killed at the pool's time
limit) is None, out of its group's mean and std, advantage 0, logged and bounded."""

from __future__ import annotations

import json
import math

import pytest
import torch
from trl_helpers import make_args, tiny_model

pytest.importorskip("trl")

import stall_verifier  # noqa: F401  (registers the stall_test data source)
from datasets import Dataset

from divrl.integrations.trl import DivRLGRPOTrainer, verifier_reward
from divrl.rewards.types import UnscorableShareError

ANSWERS = ["1", "stall", "0", "0"]  # the verdicts of each group: 1, unscorable, 0, 0


def fixed_answers(completions, **columns):
    """verifier_reward on fixed answers in place of the model's random completions."""
    return verifier_reward(ANSWERS * (len(completions) // 4), **columns)


def test_a_timed_out_completion_has_no_advantage_and_stops_past_the_share(tmp_path, tokenizer):
    prompts = ["1+2=", "3+4="]
    data = Dataset.from_dict(
        {
            "prompt": prompts,
            "data_source": ["stall_test"] * 2,
            "ground_truth": [json.dumps("1")] * 2,
            "extra_info": [json.dumps({})] * 2,
        }
    )
    trainer = DivRLGRPOTrainer(
        model=tiny_model(0),
        reward_funcs=fixed_answers,
        args=make_args(tmp_path, max_unscorable=0.25),
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.model.train()
    rows = [dict(data[i]) for i in range(2) for _ in range(4)]
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions(rows)
    # TRL's baseline over 1, 0, 0 (mean 1/3, std sqrt(1/3), its eps 1e-4); scored 0, the
    # stalled one would get -0.5 and the 1 get 1.5
    s = math.sqrt(1 / 3) + 1e-4
    expected = [(2 / 3) / s, 0.0, -(1 / 3) / s, -(1 / 3) / s] * 2
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    assert trainer._metrics["train"]["reward/unscorable"] == [0.25]  # 2 of 8
    trainer.args.max_unscorable = 0.2
    with pytest.raises(UnscorableShareError, match=r"^step 1: 2 of 8 responses \(25%\)"):
        trainer._generate_and_score_completions(rows)
    with pytest.raises(ValueError, match="max_unscorable=-1 must be a share"):
        make_args(tmp_path, max_unscorable=-1)
