"""A run killed after a checkpoint and resumed with --resume logs exactly the same metrics."""

import json

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.training.config import load_config
from divrl.training.trainer import TIME_KEYS, Trainer


class Killed(Exception):
    pass


def _metrics(path):
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def _config(world, out, store):
    return load_config(
        None,
        tiny_overrides(
            world,
            out,
            **{
                "train.total_steps": 6,
                "train.mini_batch_size": 2,  # off-policy: 2 optimiser steps per batch
                "algorithm.policy_loss": "lp_reg",
                "algorithm.loss_options.rho": 0.5,
                "algorithm.divergence": "js",
                "algorithm.divergence_coef": 0.2,
                "reference.store": store,
                "reference.k": 4,  # as the store was presampled
                "reference.per_step": 2,  # a reference cursor that wraps around
                "optim.schedule": "cosine",
                "optim.warmup_steps": 2,
                "checkpoint.save_every": 2,
                "checkpoint.keep_last": 1,
            },
        ),
    )


def test_kill_and_resume_matches_an_uninterrupted_run(tiny_world, reference_store, tmp_path):
    full = Trainer(_config(tiny_world, tmp_path / "full", reference_store), reward_fn=sevens_reward)
    full.train()
    expected = _metrics(tmp_path / "full" / "metrics.jsonl")
    assert len(expected) == 6

    def kill_after_step_5(step, record):
        if step == 5:  # after the step-4 checkpoint and one more logged step
            raise Killed

    run = tmp_path / "killed"
    with pytest.raises(Killed):
        Trainer(_config(tiny_world, run, reference_store), reward_fn=sevens_reward).train(
            on_step=kill_after_step_5
        )
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_000004"]  # keep_last=1; no temp dirs left behind
    resumed = Trainer(
        _config(tiny_world, run, reference_store), reward_fn=sevens_reward, resume=True
    )
    assert resumed.step == 4
    resumed.train()
    assert _metrics(run / "metrics.jsonl") == expected
    a = full.accelerator.unwrap_model(full.model).state_dict()
    b = resumed.accelerator.unwrap_model(resumed.model).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_checkpoint_fails_clearly(tiny_world, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(cfg, reward_fn=sevens_reward, resume=True)


def test_checkpoint_holds_a_loadable_model(tiny_world, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = load_config(
        None,
        tiny_overrides(
            tiny_world, tmp_path, **{"train.total_steps": 1, "checkpoint.save_final": True}
        ),
    )
    tr = Trainer(cfg, reward_fn=sevens_reward)
    tr.train()
    model_dir = tmp_path / "checkpoints" / "step_000001" / "model"
    loaded = AutoModelForCausalLM.from_pretrained(model_dir)
    live = tr.accelerator.unwrap_model(tr.model).state_dict()
    assert all(torch.equal(v, live[k]) for k, v in loaded.state_dict().items())
    state = json.loads(
        (tmp_path / "checkpoints" / "step_000001" / "trainer_state.json").read_text()
    )
    assert state["step"] == 1 and state["sampler"]["position"] == 4


def test_crash_while_checkpointing_leaves_the_previous_checkpoint(tiny_world, tmp_path):
    def config():
        return load_config(
            None,
            tiny_overrides(
                tiny_world,
                tmp_path,
                **{"train.total_steps": 3, "checkpoint.save_every": 1, "checkpoint.keep_last": 3},
            ),
        )

    tr = Trainer(config(), reward_fn=sevens_reward)
    real = tr.accelerator.save_state

    def crash_on_step_2(path, *args, **kwargs):
        if tr.step == 2:
            real(path, *args, **kwargs)  # a half-written checkpoint: state but no metadata
            raise Killed
        return real(path, *args, **kwargs)

    tr.accelerator.save_state = crash_on_step_2
    with pytest.raises(Killed):
        tr.train()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [".tmp_step_000002", "step_000001"]
    resumed = Trainer(config(), reward_fn=sevens_reward, resume=True)
    assert resumed.step == 1
    resumed.train()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000001", "step_000002", "step_000003"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
