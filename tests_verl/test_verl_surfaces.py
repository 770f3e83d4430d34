"""Contract tests of the verl internals the plugin relies on where verl 0.9.1 has no public
API, one per surface (docs/verl.md, "Private surfaces"): each fails on the day a verl
release changes the surface, naming it, rather than the plugin breaking silently."""

from __future__ import annotations

import inspect

from verl.single_controller.base.worker_group import WorkerGroup
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.config.actor import ActorConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils import losses as verl_losses

from divrl.integrations.verl.presample import DivRLPresampleTrainer
from divrl.integrations.verl.trainer import DivRLPPOTrainer, PinnedInfo, actor_dp_size


def _source(obj) -> str:
    return inspect.getsource(obj)


def test_dispatch_info_is_where_verl_itself_reads_the_actor_dp_size():
    """``actor_dp_size``: the worker group's ``_dispatch_info`` / ``_query_dispatch_info``,
    read as verl's own ``_balance_batch`` reads them."""
    assert "self._dispatch_info = {}" in _source(WorkerGroup.__init__)
    balance = _source(PPOTrainer._get_dp_size) if hasattr(PPOTrainer, "_get_dp_size") else ""
    balance += _source(PPOTrainer._balance_batch)
    assert "_query_dispatch_info(role)" in balance or "_query_dispatch_info" in _source(PPOTrainer)

    class Group:
        def __init__(self):
            self._dispatch_info = {}

        def _query_dispatch_info(self, role):
            assert role == "actor"
            return [0, 1, 0, 1]

    assert actor_dp_size(Group()) == 2


#: the private trainer methods the trainer modes override, with verl 0.9.1's parameters
OVERRIDDEN = {
    "_compute_old_log_prob": ["self", "batch", "metrics"],
    "_update_actor": ["self", "batch", "metrics"],
    "_save_checkpoint": ["self"],
    "_init_tokenizer": ["self"],
    "_init_dataloader": ["self"],
    "_compute_metrics": ["self", "batch", "metrics", "timing_raw", "global_steps", "epoch"],
    "_val_metrics_update": [
        "self",
        "data_sources",
        "sample_uids",
        "reward_extra_infos_dict",
        "sample_turns",
        "expected_acc_counts",
    ],
}


def test_the_overridden_trainer_methods_exist_with_the_parameters_divrl_passes():
    for name, params in OVERRIDDEN.items():
        assert list(inspect.signature(getattr(PPOTrainerSync, name)).parameters) == params, name
        overridden = [c for c in (DivRLPPOTrainer, DivRLPresampleTrainer) if name in c.__dict__]
        assert overridden, f"{name} is listed but no divrl trainer overrides it"


def test_the_step_metrics_are_computed_before_the_steps_rows_are_cleared():
    """``reward/unscorable``: ``fit`` calls ``_compute_metrics`` with the step's batch and
    the metrics it then logs, before it clears the batch's rows from TransferQueue; the
    rows carry ``rm_scores`` and ``extra_fields`` (the reward's extra info)."""
    fit = _source(PPOTrainer.fit)
    assert fit.index("self._compute_metrics(batch, metrics") < fit.index(
        "tq.kv_clear(keys=batch.keys"
    )
    assert fit.index("tq.kv_clear(keys=batch.keys") < fit.index("self.logger.log(data=metrics")
    assert '"rm_scores"' in _source(PPOTrainer._compute_metrics)
    assert '"extra_fields"' in _source(PPOTrainer._validate)


def test_verl_sets_the_pinned_batch_keys_through_extra_info_update():
    """``PinnedInfo``: verl's passes set the keys they dispatch with by
    ``batch.extra_info.update({...})`` right before the worker call."""
    for method, names in (
        (PPOTrainer._compute_old_log_prob, ("compute_loss",)),
        (
            PPOTrainer._update_actor,
            ("distillation_use_topk", "mini_batch_size", "global_batch_size"),
        ),
    ):
        body = _source(method)
        assert "extra_info.update(" in body
        for name in names:
            assert f'"{name}"' in body, (method.__name__, name)
    info = PinnedInfo({}, {"mini_batch_size": 3})
    info.update({"mini_batch_size": 8})
    assert info["mini_batch_size"] == 3


def test_global_batch_info_is_verls_aggregation_input():
    """``verl_policy_term`` clears and restores ``config.global_batch_info``: verl's
    ``ppo_loss`` writes these keys there and ``agg_loss`` takes them as keywords."""
    assert "global_batch_info" in {f.name for f in ActorConfig.__dataclass_fields__.values()}
    body = _source(verl_losses.ppo_loss)
    for key in ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"):
        assert f'config.global_batch_info["{key}"]' in body, key
        assert key in inspect.signature(agg_loss).parameters, key


def test_the_logits_hook_is_behind_the_distillation_flag():
    """Lp-Reg's proxy: the FSDP engine calls the loss as its logits processor
    (``student_logits=``, ``data=``) only when the batch sets ``distillation_use_topk``."""
    body = _source(FSDPEngineWithLMHead.prepare_model_outputs)
    assert 'key="distillation_use_topk"' in body
    assert "logits_processor_func(student_logits=" in body
