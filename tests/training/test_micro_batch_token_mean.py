"""``loss_agg: micro-batch-token-mean`` through the update stage: each micro-batch's
token-mean weighted by its share of the mini-batch's sequences (verl's actor), against the
formula written out here; and not the global token-mean when micro-batches differ in
tokens."""

from __future__ import annotations

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.algorithms import policy_loss, token_log_probs
from divrl.training.config import load_config
from divrl.training.forward import response_logits
from divrl.training.metrics import MetricMeter
from divrl.training.trainer import Trainer


def _trainer(world, out, agg: str) -> Trainer:
    overrides = {
        "optim.max_grad_norm": 0.0,
        "optim.weight_decay": 0.0,
        "rollout.max_new_tokens": 8,
        "train.prompts_per_step": 4,
        "rollout.n": 4,
        "train.micro_batch_size": 3,  # 16 rows: micro-batches of 3, 3, 3, 3, 3 and 1
        "algorithm.loss_agg": agg,
    }
    torch.manual_seed(0)
    return Trainer(
        load_config(None, tiny_overrides(world, out, **overrides)), reward_fn=sevens_reward
    )


def _step_gradient(trainer: Trainer, exp) -> list[torch.Tensor]:
    params, grads = list(trainer.model.parameters()), []
    trainer.update.optimizer.step = lambda *a, **k: grads.append([p.grad.clone() for p in params])
    trainer.model.train()
    assert trainer.update.step(exp, list(range(len(exp))), [], MetricMeter(), step=1)
    return grads[0]


def _formula(trainer: Trainer, exp, by_rows: bool) -> list[torch.Tensor]:
    """sum_i share_i * token-mean_i, share = rows_i / rows or tokens_i / tokens."""
    model, temp = trainer.model, trainer.config.rollout.temperature
    model.zero_grad(set_to_none=True)
    pieces = trainer.update.micro_batches(exp, range(len(exp)))
    sizes = [len(i) if by_rows else float(exp.response_mask[i].sum()) for i in pieces]
    total = 0.0
    for idx, size in zip(pieces, sizes, strict=True):
        data = exp.model_inputs(idx)
        lp = token_log_probs(response_logits(model, data), data["responses"], temp)
        loss, _ = policy_loss(lp, lp.detach(), exp.advantages[idx], data["response_mask"])
        total = total + loss * size / sum(sizes)
    total.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("agg", ["micro-batch-token-mean", "token-mean"])
def test_micro_batches_weigh_by_their_share(agg, tiny_world, tmp_path):
    trainer = _trainer(tiny_world, tmp_path, agg)
    exp, _, _ = trainer.experience.make(0)
    pieces = trainer.update.micro_batches(exp, range(len(exp)))
    tokens = [float(exp.response_mask[i].sum()) for i in pieces]
    rows = [len(i) for i in pieces]
    # the shares differ on this step, so the two weightings are told apart
    assert [t / sum(tokens) for t in tokens] != pytest.approx([r / sum(rows) for r in rows])
    got = _step_gradient(trainer, exp)
    want = _formula(trainer, exp, by_rows=agg == "micro-batch-token-mean")
    other = _formula(trainer, exp, by_rows=agg != "micro-batch-token-mean")
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=0.0)
    assert any(not torch.allclose(g, o, atol=1e-6) for g, o in zip(got, other, strict=True))
