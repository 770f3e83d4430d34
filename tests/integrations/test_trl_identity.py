"""Identity through train(): DivRLGRPOTrainer with the divergence coefficient 0 and Lp-Reg
off trains exactly as TRL's GRPOTrainer, for every loss_type, with and without vLLM's
importance-sampling correction (a stand-in engine), under gradient accumulation 2 and
num_iterations 2."""

from __future__ import annotations

import pytest
import torch
from trl_helpers import make_args, prompt_dataset, tiny_model, tiny_tokenizer, varied_reward

trl = pytest.importorskip("trl")

from divrl.integrations.trl import DivRLGRPOTrainer  # noqa: E402

torch.set_num_threads(1)

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


class StandInVLLM:
    """``use_vllm`` with a stand-in engine: TRL's transformers generation, then per-token
    sampling log-probs of -1.0 - 0.2 * (t % 3), from which TRL computes its weights."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        self.use_vllm = False
        try:
            completion_ids, _ = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        finally:
            self.use_vllm = True
        logprobs = [[-1.0 - 0.2 * (t % 3) for t in range(len(c))] for c in completion_ids]
        return completion_ids, logprobs


class PlainVLLM(StandInVLLM, trl.GRPOTrainer):
    pass


class AdapterVLLM(StandInVLLM, DivRLGRPOTrainer):
    pass


def run(cls, args, vllm: bool):
    trainer = cls(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
    )
    trainer.use_vllm = vllm  # set after construction: no engine is started
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses, [p.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("is_correction", [True, False], ids=["is_on", "is_off"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_zero_coefficient_trains_as_grpo_trainer(tmp_path, store, loss_type, is_correction):
    common = dict(
        loss_type=loss_type,
        gradient_accumulation_steps=2,
        num_iterations=2,
        max_steps=2,
        vllm_importance_sampling_mode="token_truncate",  # the mode every loss_type takes
    )
    plain_args = make_args(tmp_path / "plain", **common)
    dph = dict(divergence="js", divergence_coef=0.0, reference_store=str(store))
    adapter_args = make_args(tmp_path / "adapter", **common, **dph)
    plain_cls, adapter_cls = (
        (PlainVLLM, AdapterVLLM) if is_correction else (trl.GRPOTrainer, DivRLGRPOTrainer)
    )
    _, plain_losses, plain_params = run(plain_cls, plain_args, is_correction)
    adapter, losses, params = run(adapter_cls, adapter_args, is_correction)
    assert len(losses) == len(plain_losses) == 2
    assert losses == pytest.approx(plain_losses, abs=1e-7)
    for p, q in zip(params, plain_params, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    assert any(
        not torch.equal(p, q) for p, q in zip(params, tiny_model(0).parameters(), strict=True)
    )
    logged = [h for h in adapter.state.log_history if "divrl/dph/divergence" in h]
    assert logged  # the divergence was computed with weight 0
    if is_correction:
        assert any(
            "sampling/importance_sampling_ratio/mean" in h for h in adapter.state.log_history
        )
