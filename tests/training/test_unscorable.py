"""Unscorable responses in training: a verifier timeout is neither right nor wrong."""

from __future__ import annotations

import math

import pytest
from train_helpers import tiny_overrides

from divrl.rewards import ScoreRequest, score_batch
from divrl.rewards.types import BatchScores, ScoreResult, UnscorableShareError
from divrl.training.config import ConfigError, load_config
from divrl.training.experience import check_unscorable_share, informative_groups
from divrl.training.trainer import Trainer

# math-verify never finishes this one: the pool kills its worker at the time limit
ENDLESS = ScoreRequest("math", "\\boxed{9^{9^{9^{9}}}}", "1")


def timeout_second_of_four(requests):
    """Each group of 4: scores 1, (killed at the pool's time limit), 0, 0."""
    endless = [i for i in range(len(requests)) if i % 4 == 1]
    killed = score_batch([ENDLESS] * len(endless), timeout=0.2).results
    out = [ScoreResult(float(i % 4 == 0), None, "correct" if i % 4 == 0 else "wrong")
           for i in range(len(requests))]  # fmt: skip
    for i, result in zip(endless, killed, strict=True):
        out[i] = result
    return BatchScores(out)


def test_a_timed_out_response_has_no_advantage_and_is_out_of_the_baseline(tiny_world, tmp_path):
    overrides = tiny_overrides(tiny_world, tmp_path, **{"train.max_unscorable": 0.25})
    trainer = Trainer(load_config(None, overrides), reward_fn=timeout_second_of_four)
    exp, means, counts = trainer.experience.make(0)
    # 4 prompts x 4 responses; in each group 1, timeout, 0, 0: the baseline is over 1, 0, 0
    # (mean 1/3, std sqrt(1/3)); scored 0 the timeout would get -0.5 and the 1 get 1.5
    s = math.sqrt(1 / 3) + 1e-6
    assert exp.advantages.tolist() == pytest.approx(
        [(2 / 3) / s, 0, -(1 / 3) / s, -(1 / 3) / s] * 4
    )
    assert counts["reward/unscorable"] == 4 and counts["reward/timeout"] == 4
    assert means["reward/score"] == pytest.approx(1 / 3)  # over the scorable responses
    assert means["reward/pass@1"] == pytest.approx(1 / 3)
    # more than the allowed share stops the run, before the update, with one line
    trainer.config.train.max_unscorable = 0.2
    with pytest.raises(UnscorableShareError) as info:
        trainer.experience.make(1)
    message = str(info.value)
    assert message.startswith("step 2: 4 of 16 responses (25%) could not be scored")
    assert "train.max_unscorable=0.2" in message and "\n" not in message


def test_the_share_check_and_the_dapo_filter_by_hand():
    check_unscorable_share(0, 1, 10, 0.1)  # exactly the share: allowed
    with pytest.raises(UnscorableShareError, match="step 1: 2 of 10 responses"):
        check_unscorable_share(0, 2, 10, 0.1)
    with pytest.raises(UnscorableShareError, match="max_unscorable=0"):
        check_unscorable_share(4, 1, 10, 0.0)
    nan = float("nan")
    # a group whose scorable rewards are all equal carries no signal, NaN or not
    assert informative_groups([1, nan, 1, 1, 0, nan, 1, nan], 4) == [False, True]
    with pytest.raises(ConfigError, match=r"max_unscorable=1\.5 must be a share"):
        load_config(None, ["train.max_unscorable=1.5"])


def test_divrl_train_stops_with_one_line(monkeypatch, capsys, tiny_world, tmp_path):
    import argparse

    import divrl.training.trainer as trainer_module
    from divrl.commands.train import _train

    class Failing:
        def __init__(self, config, **kwargs):
            self.config, self.step = config, 0

        def train(self):
            raise UnscorableShareError("step 1: 4 of 16 responses (25%) could not be scored")

    monkeypatch.setattr(trainer_module, "Trainer", Failing)
    args = argparse.Namespace(resume_with_changes=[], resume=False, overwrite=False)
    config = load_config(None, tiny_overrides(tiny_world, tmp_path))
    assert _train(args, config) == 1
    err = capsys.readouterr().err
    assert err == "divrl train: step 1: 4 of 16 responses (25%) could not be scored\n"
