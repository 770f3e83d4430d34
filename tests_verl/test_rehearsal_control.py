"""The rehearsal controller in the verl plugin: the settings, the eta the join writes on
every row and the loss reads, the driver's update from verl's actor metrics, and its state
in verl's checkpoint folder."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf
from verl.workers.utils.padding import no_padding_2_padding  # noqa: F401 (verl importable)

from divrl.algorithms import RehearsalController, RehearsalControlOptions
from divrl.integrations.verl import trainer as verl_trainer
from divrl.integrations.verl.keys import ETA
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.rehearsal import join_rehearsal
from divrl.integrations.verl.settings import DivRLVerlSettings, VerlSettingsError
from tests_verl.builders import micro_batches, reference_samples, rollout_rows, sequence_log_probs
from tests_verl.test_losses import actor_config

DPH = dict(divergence="js", reference_store="unused", reference_per_step=4)


def test_settings_take_the_options_of_divrl_train():
    s = DivRLVerlSettings.from_mapping(
        {**DPH, "divergence_coef": 0.2, "rehearsal_control": {"target": 0.03}}
    )
    assert s.control == RehearsalControlOptions(target=0.03)
    assert DivRLVerlSettings.from_mapping({**DPH, "divergence_coef": 0.2}).control is None
    with pytest.raises(VerlSettingsError, match=r"set divrl\.divergence and"):
        DivRLVerlSettings.from_mapping({"rehearsal_control": {"target": 0.03}})
    with pytest.raises(VerlSettingsError, match=r"divrl\.rehearsal_control\.rate=0\.0 must be > 0"):
        DivRLVerlSettings.from_mapping(
            {**DPH, "divergence_coef": 0.2, "rehearsal_control": {"rate": 0.0}}
        )


def _losses(settings, eta):
    joined, _ = join_rehearsal(rollout_rows(8), reference_samples(4), micro_batch_size=2, eta=eta)
    loss_fn = DivRLLoss(actor_config(), settings, None)
    out = []
    for seed, micro in enumerate(micro_batches(joined, 3)):
        _, nested = sequence_log_probs(micro, seed)
        out.append(loss_fn(model_output={"log_probs": nested}, data=micro, dp_group=None))
    return joined, out


def test_the_loss_trains_with_the_eta_the_join_wrote():
    paper = dict(DPH, divergence_weighting="paper")
    joined, controlled = _losses(DivRLVerlSettings(divergence_coef=0.2, **paper), eta=0.5)
    assert torch.equal(joined[ETA], torch.full((12,), 0.5, dtype=torch.float64))
    _, fixed = _losses(DivRLVerlSettings(divergence_coef=0.5, **paper), eta=None)
    _, other = _losses(DivRLVerlSettings(divergence_coef=0.2, **paper), eta=None)
    for (a, ma), (b, _) in zip(controlled, fixed, strict=True):
        assert torch.equal(a, b)  # eta 0.5 from the join = divergence_coef 0.5
        assert ma["dph/effective_eta"].aggregate() == pytest.approx(0.5)
    assert any(not torch.equal(a, c) for (a, _), (c, _) in zip(controlled, other, strict=True))


def _driver(tmp_path, step):
    t = object.__new__(verl_trainer.DivRLPPOTrainer)
    t.divrl_control = RehearsalController(RehearsalControlOptions(target=0.05, warmup_steps=0), 0.2)
    t.divrl_source = None
    t.global_steps = step
    t.config = OmegaConf.create(
        {"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}}
    )
    return t


def test_the_driver_moves_eta_from_the_actor_metrics_and_resumes_from_the_checkpoint(
    tmp_path, monkeypatch
):
    t = _driver(tmp_path, 1)
    metrics = {"actor/dph/log_u_mean": -0.2, "actor/pg_loss": 1.0}
    t._observe_control(metrics)
    assert metrics["divrl/dph/eta"] == 0.2  # the eta the step trained with
    assert metrics["divrl/dph/control_likelihood"] == pytest.approx(0.2)
    assert t.divrl_control.eta == pytest.approx(0.2 * math.exp(0.1))  # missed: rises
    # saved beside the rehearsal draw order in verl's checkpoint folder
    monkeypatch.setattr(verl_trainer.PPOTrainerSync, "_save_checkpoint", lambda self: None)

    class Source:
        def state_dict(self):
            return {"cursor": 3}

    t.divrl_source = Source()
    t._save_checkpoint()
    saved = json.loads((tmp_path / "global_step_1" / verl_trainer.CONTROL_STATE).read_text())
    resumed = _driver(tmp_path, 1)
    resumed._load_control_state()
    assert resumed.divrl_control.state_dict() == saved == t.divrl_control.state_dict()
    with pytest.raises(FileNotFoundError, match=r"divrl\.rehearsal_control"):
        _driver(tmp_path, 2)._load_control_state()
