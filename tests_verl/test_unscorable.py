"""An unscorable response in verl: divrl's reward scores it NaN and flags it, and the
``divrl_grpo`` estimator keeps it out of its group's baseline with advantage 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn

import divrl.integrations.verl.advantages  # noqa: F401  (registers divrl_grpo)
from divrl.integrations.verl.reward import compute_score, compute_score_batch
from divrl.rewards.types import UnscorableShareError
from tests_verl import stall_verifier  # noqa: F401  (registers stall_test_verl)

SOURCE = "stall_test_verl"
ANSWERS = ["1", "stall", "0", "0"]  # each group: right, killed at the 0.2 s limit, wrong, wrong


def test_the_reward_flags_an_unscorable_response():
    killed = compute_score(SOURCE, "stall", "1")
    assert math.isnan(killed["score"]) and (killed["acc"], killed["unscorable"]) == (0.0, 1.0)
    assert compute_score(SOURCE, "1", "1") == {"score": 1.0, "acc": 1.0, "unscorable": 0.0}
    as_wrong = compute_score(SOURCE, "stall", "1", unscorable_score=0.0)
    assert as_wrong == {"score": 0.0, "acc": 0.0, "unscorable": 1.0}
    with pytest.raises(ValueError, match="unscorable_score=2"):
        compute_score(SOURCE, "1", "1", unscorable_score=2)


def _token_rewards(scores: list[float], length: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: each response's score on its last token (responses of length 2)."""
    rewards = torch.zeros(len(scores), length)
    rewards[:, 1] = torch.tensor(scores)
    mask = torch.tensor([[1.0, 1.0, 0.0]] * len(scores))
    return rewards, mask


def test_divrl_grpo_leaves_unscorable_responses_out_of_the_baseline():
    results = compute_score_batch([SOURCE] * 8, ANSWERS * 2, ["1"] * 8)
    scores = [r["score"] for r in results]
    assert sum(r["unscorable"] for r in results) == 2
    rewards, mask = _token_rewards(scores)
    index = ["a"] * 4 + ["b"] * 4
    estimator = get_adv_estimator_fn("divrl_grpo")
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "divrl_max_unscorable": 0.25})
    adv, returns = estimator(
        token_level_rewards=rewards, response_mask=mask, index=index, config=config
    )
    # baseline over 1, 0, 0 (mean 1/3, std sqrt(1/3)); scored 0 the stalled one would get -0.5
    s = math.sqrt(1 / 3) + 1e-6
    expected = [(2 / 3) / s, 0.0, -(1 / 3) / s, -(1 / 3) / s] * 2
    assert adv[:, 0].tolist() == pytest.approx(expected) and (adv[:, 2] == 0).all()
    assert torch.equal(adv, returns)
    # without unscorable responses it is verl's own GRPO
    clean, _ = _token_rewards([1.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0, 0.25])
    verl_adv, _ = compute_grpo_outcome_advantage(clean, mask, np.array(index, dtype=object))
    ours, _ = estimator(token_level_rewards=clean, response_mask=mask, index=index, config=config)
    assert torch.allclose(ours, verl_adv, atol=1e-6)
    config.divrl_max_unscorable = 0.2
    with pytest.raises(UnscorableShareError, match=r"2 of 8 responses \(25%\)"):
        estimator(token_level_rewards=rewards, response_mask=mask, index=index, config=config)
    config.divrl_max_unscorable = 1.5
    with pytest.raises(ValueError, match=r"divrl_max_unscorable=1\.5 must be a share"):
        estimator(token_level_rewards=rewards, response_mask=mask, index=index, config=config)


def test_every_divrl_estimator_leaves_unscorable_responses_out_and_honours_norm_off():
    nan = float("nan")
    rewards, mask = _token_rewards([1.0, nan, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    index = ["a"] * 4 + ["b"] * 4
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": False, "divrl_max_unscorable": 0.5})
    dr, _ = get_adv_estimator_fn("divrl_grpo")(
        token_level_rewards=rewards, response_mask=mask, index=index, config=config
    )
    # Dr. GRPO's centring only, over the scorable 1, 0, 0 of group a
    assert dr[:, 0].tolist() == pytest.approx([2 / 3, 0.0, -1 / 3, -1 / 3, 0.5, 0.5, -0.5, -0.5])
    rloo, _ = get_adv_estimator_fn("divrl_rloo")(
        token_level_rewards=rewards, response_mask=mask, index=index, config=config
    )
    # leave-one-out over the scorable responses: 1 - 0, the stalled one 0, 0 - 1/2
    assert rloo[:, 0].tolist() == pytest.approx(
        [1.0, 0.0, -0.5, -0.5, 2 / 3, 2 / 3, -2 / 3, -2 / 3]
    )


def test_divrl_sync_logs_the_steps_unscorable_responses(monkeypatch):
    """A step whose verifier timed out on some responses logs ``reward/unscorable`` = their
    count (as ``divrl train`` does), with NaN scores or scored 0, and verl's padding row
    (a copy of a real row) not counted twice."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    import divrl.integrations.verl.trainer as trainer_module
    from tests_verl.test_trainer import MemoryQueue

    answers = ["stall", "1", "0", "stall", "1", "0"]  # the verifier times out on two
    for unscorable_score in (math.nan, 0.0):
        results = compute_score_batch(
            [SOURCE] * 6, answers, ["1"] * 6, unscorable_score=unscorable_score
        )
        queue, keys = MemoryQueue(), [f"uid{i}_0_0" for i in range(6)] + ["pad_0_0"]
        rows = []
        for r in [*results, results[0]]:  # verl's padding row copies the first row
            info = {k: v for k, v in r.items() if k != "score"}
            scores = torch.zeros(3)
            scores[-1] = r["score"]  # verl's layout: the score on the last token
            rows.append({"rm_scores": scores, "extra_fields": {"reward_extra_info": info}})
        for key, row in zip(keys, rows, strict=True):
            queue.rows[key] = row
        tags = [{}] * 6 + [{"is_padding": True}]
        meta = KVBatchMeta(keys=keys, tags=tags, partition_id="train", extra_info={})
        assert trainer_module.unscorable_count(queue, meta) == 2
        monkeypatch.setattr(trainer_module, "tq", queue)
        monkeypatch.setattr(PPOTrainerSync, "_compute_metrics", lambda self, *a, **k: None)
        trainer = object.__new__(trainer_module.DivRLPPOTrainer)
        metrics: dict = {}
        trainer._compute_metrics(meta, metrics, {}, global_steps=1, epoch=0)
        assert metrics["reward/unscorable"] == 2.0
    clean = KVBatchMeta(keys=keys[1:3], tags=[{}, {}], partition_id="train", extra_info={})
    assert trainer_module.unscorable_count(queue, clean) == 0
