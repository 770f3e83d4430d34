"""Resume through train(resume_from_checkpoint=...): the same rehearsal draws and DPH
metrics as an unbroken run, where an epoch ends mid-accumulation (5 micro-batches per
epoch, 2 per optimizer step: the third step of each epoch has one)."""

from __future__ import annotations

import pytest
import torch
from trl_helpers import PROMPTS, make_args, tiny_model, tiny_tokenizer, varied_reward

pytest.importorskip("trl")

from divrl.integrations.trl import DRAWS_STATE_KEY, DivRLGRPOTrainer

torch.set_num_threads(1)


def train(out, store, resume=None):
    """5 optimizer steps (2 epochs of 5 one-prompt micro-batches, GA 2), checkpoints at
    steps 2 and 4; returns the trainer and its draws as (step, input ids)."""
    from datasets import Dataset

    draws = []

    class Recording(DivRLGRPOTrainer):
        def _draw_reference(self):
            batch = super()._draw_reference()
            draws.append((self.state.global_step, batch.input_ids.tolist()))
            return batch

    args = make_args(
        out,
        divergence="js",
        divergence_coef=0.5,
        reference_store=str(store),
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        steps_per_generation=1,
        max_steps=5,
        save_strategy="steps",
        save_steps=2,
        output_dir=str(out),
    )
    trainer = Recording(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS[:5]}),
        processing_class=tiny_tokenizer(),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, draws


def dph_by_step(trainer) -> dict[int, float]:
    return {
        h["step"]: h["divrl/dph/divergence"]
        for h in trainer.state.log_history
        if "divrl/dph/divergence" in h
    }


@pytest.mark.slow
def test_resume_draws_and_metrics_equal_an_unbroken_run(tmp_path, store):
    unbroken, draws = train(tmp_path / "a", store)
    per_step = [step for step, _ in draws]
    assert per_step == [0, 0, 1, 1, 2, 3, 3, 4, 4]  # step 2 (0-based) ends epoch 1 with one
    checkpoint = tmp_path / "a" / "checkpoint-4"
    assert (checkpoint / "trainer_state.json").is_file()
    import json

    saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]
    assert saved[DRAWS_STATE_KEY] == {"drawn": 7}  # not 4 steps x 2 micro-batches = 8

    resumed, again = train(tmp_path / "b", store, resume=str(checkpoint))
    assert resumed.state.global_step == 5
    assert again == [d for d in draws if d[0] >= 4]  # the same samples, in the same order
    assert dph_by_step(resumed)[5] == pytest.approx(dph_by_step(unbroken)[5], rel=1e-5)
