"""Lp-Reg under TRL's vLLM importance-sampling correction: the weights TRL puts on its
per-token loss go on the Lp-Reg replacement too (hand-checked), and train() runs with them
on- and off-policy (a fake vLLM: TRL's own generation plus fixed sampling log-probs)."""

from __future__ import annotations

import math

import pytest
import torch
from trl_helpers import make_args, prompt_dataset, tiny_model, tiny_tokenizer, varied_reward

pytest.importorskip("trl")

from divrl.integrations.trl import DivRLGRPOTrainer
from divrl.integrations.trl_lp_reg import HiddenCapture

torch.set_num_threads(1)


def build(args, cls=DivRLGRPOTrainer):
    return cls(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
    )


def test_is_weights_scale_the_loss_replacement_per_token(tmp_path):
    """One row, 4 tokens, all A = -1, on-policy (r = 1): rho = 0.25 selects the least
    likely token (p = 0.05), its proxy p is 0.2, so D = log 4 and the replacement there
    is beta * k3(D) = 4 - log 4 - 1; bnpo divides by the 4 tokens; TRL's IS weight on that
    token is 0.5. The gradient on its log-prob is w * beta * (1 - e^D) / 4."""
    args = make_args(
        tmp_path, lp_reg=True, loss_type="bnpo", loss_options={"rho": 0.25, "min_k": 1}
    )
    trainer = build(args)
    trainer.current_gradient_accumulation_steps = 1
    probs = torch.tensor([[0.5, 0.1, 0.3, 0.05]])
    inputs = {
        "completion_mask": torch.ones(1, 4, dtype=torch.long),
        "advantages": torch.tensor([-1.0]),
        "num_items_in_batch": torch.tensor(4.0),
        "importance_sampling_ratio": torch.tensor([[1.0, 2.0, 0.7, 0.5]]),
    }

    def replacement(weighted: bool) -> tuple[float, torch.Tensor]:
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = weighted
        cap = HiddenCapture(want_proxy=True)
        cap.log_probs = probs.log().requires_grad_(True)
        cap.proxy = torch.tensor([[0.6, 0.2, 0.4, 0.2]]).log()
        cap.log_z = torch.zeros(1, 4)
        out, _ = trainer._loss_replacement(inputs, cap)
        out.backward()
        return float(out), cap.log_probs.grad

    k3 = 4 - math.log(4) - 1
    value, grad = replacement(weighted=True)
    assert value == pytest.approx(0.5 * k3 / 4, rel=1e-5)
    assert grad[0, 3] == pytest.approx(0.5 * (1 - 4) / 4, rel=1e-5)
    assert torch.count_nonzero(grad[0, :3]) == 0  # the other tokens' terms cancel
    value, grad = replacement(weighted=False)  # without the correction: weight 1
    assert value == pytest.approx(k3 / 4, rel=1e-5)
    assert grad[0, 3] == pytest.approx((1 - 4) / 4, rel=1e-5)


class FakeVLLMTrainer(DivRLGRPOTrainer):
    """``use_vllm`` with a stand-in engine: TRL's transformers generation, then per-token
    sampling log-probs of -1.0 - 0.2 * (t % 3), which TRL turns into its importance
    weights against the trainer's own log-probs (about -2.8 here: vocabulary 16)."""

    seen: list[torch.Tensor]

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        self.use_vllm = False  # TRL's own generation path
        try:
            completion_ids, _ = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        finally:
            self.use_vllm = True
        logprobs = [[-1.0 - 0.2 * (t % 3) for t in range(len(c))] for c in completion_ids]
        return completion_ids, logprobs

    def _loss_replacement(self, inputs, cap):
        self.seen.append(inputs["importance_sampling_ratio"].clone())
        return super()._loss_replacement(inputs, cap)


@pytest.mark.parametrize("num_iterations", [1, 2], ids=["on_policy", "off_policy"])
def test_lp_reg_trains_under_trl_is_correction(tmp_path, num_iterations):
    args = make_args(
        tmp_path,
        lp_reg=True,
        loss_options={"rho": 0.5},
        num_iterations=num_iterations,
        max_steps=2,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=3.0,
    )
    assert args.vllm_importance_sampling_correction  # TRL's default, no longer refused
    trainer = build(args, FakeVLLMTrainer)
    trainer.seen = []
    trainer.use_vllm = True  # after construction: no vLLM engine is started
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.seen
    weights = torch.cat([w.flatten() for w in trainer.seen])
    assert weights.min() < 0.5 and weights.max() <= 3.0  # TRL's truncated weights, not ones
    steps = [h for h in trainer.state.log_history if "loss" in h]
    # TRL logs its weights on the steps that generate (num_iterations=2: every other one)
    assert any("sampling/importance_sampling_ratio/mean" in h for h in steps)
    assert all("divrl/lp_reg/num_selected" in h for h in steps)
    assert sum(h["divrl/lp_reg/num_regularized"] for h in steps) > 0
