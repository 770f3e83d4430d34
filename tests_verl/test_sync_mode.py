"""``divrl_sync`` is verl's ``sync`` trainer to verl's own checks (the replay buffer, the
user's gen_batch_size, the trainer.v1.sync section), built here without Ray from verl's
composed config; the one workaround (pinned batch keys) and the rehearsal draw order in
verl's checkpoint folder."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from divrl.integrations.verl.rehearsal import RehearsalSource
from divrl.integrations.verl.settings import VerlSettingsError
from divrl.integrations.verl.trainer import (
    SAMPLER_STATE,
    DivRLPPOTrainer,
    PinnedInfo,
    _pinned_call,
)
from tests_verl import e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sync_mode")
    model = e2e.build_model(root / "model")
    data = e2e.write_data(root / "train.parquet", n=4)
    return root, model, data


def _config(model, data, *extra: str):
    overrides = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=4",
        "data.gen_batch_size=2",
        "data.dataloader_num_workers=0",
        f"data.max_prompt_length={e2e.PROMPT_LENGTH}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "+trainer.v1.sync.parameter_sync_step=2",
        *extra,
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _built(cls, config):
    trainer = cls(config)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    return trainer


def test_divrl_sync_is_verls_sync_to_every_check_verl_makes(world):
    _, model, data = world
    verl = _built(PPOTrainerSync, _config(model, data, "trainer.v1.trainer_mode=sync"))
    ours = _built(
        DivRLPPOTrainer,
        _config(
            model,
            data,
            "trainer.v1.trainer_mode=divrl_sync",
            "+divrl.divergence=js",
            "+divrl.divergence_coef=0",
        ),
    )
    assert ours.trainer_mode == verl.trainer_mode == "sync"
    assert type(ours.replay_buffer) is type(verl.replay_buffer) is ReplayBuffer
    for trainer in (ours, verl):  # the user's gen_batch_size, not forced to 1
        assert trainer.replay_buffer.gen_batch_size == 2
        assert trainer.config.data.gen_batch_size == 2
        assert trainer.train_dataloader.batch_size == 2
        assert trainer.parameter_sync_step == 2  # the trainer.v1.sync section is read
    assert ours.divrl_source is None and not ours.divrl.replaces_loss


def test_what_cannot_compose_is_refused_before_any_worker_starts(world):
    _, model, data = world
    config = _config(
        model,
        data,
        "trainer.v1.trainer_mode=divrl_sync",
        "+divrl.policy_loss=lp_reg",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    )
    with pytest.raises(VerlSettingsError, match=r"policy_loss\.loss_mode=gspo"):
        DivRLPPOTrainer(config)
    config = _config(
        model,
        data,
        "trainer.v1.trainer_mode=divrl_sync",
        "+divrl.policy_loss=lp_reg",
        "distillation.enabled=True",
    )
    with pytest.raises(VerlSettingsError, match=r"^distillation\.enabled=True"):
        DivRLPPOTrainer(config)


def test_pinned_keys_survive_verls_update_and_the_trip_to_the_workers():
    info = PinnedInfo({"a": 1, "compute_loss": True}, {"compute_loss": True})
    info.update({"compute_loss": False, "b": 2})
    assert info == {"a": 1, "compute_loss": True, "b": 2}
    for copied in (copy.deepcopy(info), pickle.loads(pickle.dumps(info))):
        copied.update(compute_loss=False)
        assert copied["compute_loss"] is True
    batch = KVBatchMeta(keys=["k"], tags=[{}], partition_id="train", extra_info={"x": 1})

    def verls_body():  # what verl's trainer does just before its worker call
        batch.extra_info.update({"mini_batch_size": 8, "compute_loss": False})
        return dict(batch.extra_info)

    seen = _pinned_call(batch, {"mini_batch_size": 12}, verls_body)
    assert seen == {"x": 1, "mini_batch_size": 12, "compute_loss": False}
    assert type(batch.extra_info) is dict  # a plain dict again afterwards
    batch.extra_info.update(mini_batch_size=3)
    assert batch.extra_info["mini_batch_size"] == 3


def _trainer_with_store(tmp_path, store, global_steps: int) -> DivRLPPOTrainer:
    trainer = object.__new__(DivRLPPOTrainer)
    trainer.config = OmegaConf.create(
        {"trainer": {"default_local_dir": str(tmp_path / "ckpt"), "resume_mode": "auto"}}
    )
    trainer.global_steps = global_steps
    trainer.divrl_source = RehearsalSource(str(store), temperature=1.0, seed=3)
    trainer.divrl_control = None
    return trainer


def test_the_rehearsal_draw_order_is_saved_with_verls_checkpoint_and_continues(
    world, tmp_path, monkeypatch
):
    _, model, data = world
    store = e2e.write_store(tmp_path / "store", model, data, n=3)
    saved = []
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: saved.append(1))
    unbroken = _trainer_with_store(tmp_path, store, 2)
    first = [s.prompt_id for s in unbroken.divrl_source.draw(4)]
    unbroken._save_checkpoint()  # at step 2, after its draws
    assert saved == [1]
    state = tmp_path / "ckpt" / "global_step_2" / SAMPLER_STATE
    assert json.loads(state.read_text())["position"] == 1  # 4 draws of 3: epoch 1
    expected = [s.prompt_id for s in unbroken.divrl_source.draw(5)]
    resumed = _trainer_with_store(tmp_path, store, 2)
    resumed._load_sampler_state()
    assert [s.prompt_id for s in resumed.divrl_source.draw(5)] == expected
    assert len(first) == 4
    state.unlink()
    with pytest.raises(FileNotFoundError, match=SAMPLER_STATE):
        _trainer_with_store(tmp_path, store, 2)._load_sampler_state()
