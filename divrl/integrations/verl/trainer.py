"""divrl's trainer mode for verl's v1 trainer: ``trainer.v1.trainer_mode=divrl_sync``.

verl picks its v1 trainer class by name from a registry (``register_trainer``); the
plugin registers ``divrl_sync``, verl's synchronous trainer with three additions:

- after verl's ``init``, the actor workers get :class:`~divrl.integrations.verl.losses.
  DivRLLoss` through verl's ``set_loss_fn`` (verl's own ``ppo_loss`` otherwise);
- the actor update (``_update_actor``): with DPH-RL, ``divrl.reference_per_step`` rehearsal
  rows are drawn from the reference store and joined to the step's rows in TransferQueue
  (:func:`join_in_queue`), the worker is told the joined mini-batch size, and the rows are
  cleared after the update;
- Lp-Reg: the old-log-prob pass runs with the engine's logits-processor hook on
  (``distillation_use_topk``), so the loss computes pi_old's min-p proxy from the logits of
  that very forward, and the update reads it (with verl's bypass mode, which skips that
  pass, the update's own forward gives the proxy instead);
- validation metrics: divrl's unbiased ``pass@k`` beside verl's ``best@k``.

Everything else (rollouts, rewards, advantages, old log-probs, checkpoints, logging) is
verl's, unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.metric import reduce_metrics
from verl.utils.py_functional import rename_dict
from verl.workers.utils.padding import response_from_nested

# the modules, not their names: `from divrl.integrations.verl.losses import DivRLLoss` in a
# process that has not imported verl yet starts verl, whose plugin loading imports this
# module while losses.py is still half-executed (its names not defined yet)
from divrl.integrations.verl import losses as verl_losses
from divrl.integrations.verl import rehearsal as verl_rehearsal
from divrl.integrations.verl.keys import (
    IS_REFERENCE,
    LOG_NORMALIZER,
    PROXY_LOG_PROB,
    REF_LOG_PROB,
    STREAM,
)
from divrl.integrations.verl.metrics import pass_at_k_metrics
from divrl.integrations.verl.settings import DivRLVerlSettings

logger = logging.getLogger(__name__)

TRAINER_MODE = "divrl_sync"


def join_in_queue(
    queue: Any,
    batch: KVBatchMeta,
    samples: list,
    *,
    dp_size: int,
    mini_batches: int,
    micro_batch_size: int | None,
    step: int,
) -> tuple[KVBatchMeta, list[str]]:
    """Join ``samples`` to ``batch``'s rows in TransferQueue (``queue``: its ``kv_batch_get``
    / ``kv_batch_put`` API) and return the joined batch's meta and the rehearsal keys (clear
    them after the update)."""
    present = queue.kv_batch_get(keys=batch.keys[:1], partition_id=batch.partition_id).keys()
    fields = list(verl_rehearsal.UPDATE_KEYS) + [
        k for k in verl_rehearsal.OPTIONAL_KEYS if k in present
    ]
    data = queue.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
    )
    joined, layout = verl_rehearsal.join_rehearsal(
        data,
        samples,
        dp_size=dp_size,
        mini_batches=mini_batches,
        micro_batch_size=micro_batch_size,
    )
    ref_keys = [f"divrl_rehearsal_{step}_{j}" for j in range(len(samples))]
    keys = [batch.keys[i] if i >= 0 else ref_keys[-i - 1] for i in layout.order]
    tags = [batch.tags[i] if i >= 0 else _rehearsal_tag(samples[-i - 1]) for i in layout.order]
    queue.kv_batch_put(keys=keys, partition_id=batch.partition_id, fields=joined, tags=tags)
    meta = KVBatchMeta(
        keys=keys,
        tags=tags,
        partition_id=batch.partition_id,
        fields=[*fields, IS_REFERENCE, REF_LOG_PROB, STREAM],
        extra_info=dict(batch.extra_info or {}),
    )
    return meta, ref_keys


def proxy_to_responses(queue: Any, batch: KVBatchMeta) -> None:
    """Cut the old-log-prob pass's per-position proxy outputs down to each row's response
    tokens in place (as verl cuts ``log_probs`` into ``old_log_probs``), so the update reads
    pi_old's proxy aligned with its log-probs."""
    fields = [PROXY_LOG_PROB, LOG_NORMALIZER, "response_mask"]
    data = queue.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
    )
    mask = data["response_mask"]
    cut = {k: response_from_nested(data[k], mask) for k in (PROXY_LOG_PROB, LOG_NORMALIZER)}
    queue.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict(cut, batch_size=[len(batch.keys)]),
    )


def _rehearsal_tag(sample) -> dict:
    """The tags verl's agent loop gives a row (lengths), marked as a rehearsal row."""
    prompt, response = len(sample.prompt_ids), len(sample.response_ids)
    return {
        "status": "success",
        "prompt_len": prompt,
        "response_len": response,
        "seq_len": prompt + response,
        "divrl_rehearsal": True,
    }


@register_trainer(TRAINER_MODE)
class DivRLPPOTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with divrl's loss, rehearsal join and Pass@k."""

    def init(self):
        super().init()
        self.divrl = DivRLVerlSettings.from_mapping(self.config.get("divrl"))
        actor = self.config.actor_rollout_ref.actor
        rollouts = self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n
        mini_batches = self.config.data.train_batch_size // actor.ppo_mini_batch_size
        layout = self.divrl.authors_layout(rollouts, mini_batches)
        loss = verl_losses.DivRLLoss(omega_conf_to_dataclass(actor), self.divrl, layout)
        self.actor_rollout_wg.set_loss_fn(loss)
        self.divrl_source = None
        if self.divrl.dph:
            self.divrl_source = verl_rehearsal.RehearsalSource(
                self.divrl.reference_store,
                temperature=self.config.actor_rollout_ref.rollout.temperature,
                seed=self.divrl.reference_seed,
                allow_mismatch=self.divrl.allow_store_mismatch,
            )
        logger.info("divrl: %s", self.divrl)

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's old-log-prob pass; for Lp-Reg with the engine's logits hook on, so the
        proxy is pi_old's (the authors' source, on- and off-policy), cut to the responses."""
        correction = self.config.algorithm.get("rollout_correction", None)
        bypass = bool(correction and correction.get("bypass_mode", False))
        self.divrl_old_proxy = self.divrl.policy_loss == "lp_reg" and not bypass
        if not self.divrl_old_proxy:
            return super()._compute_old_log_prob(batch, metrics)
        wg = self.actor_rollout_wg
        compute = wg.compute_log_prob

        def with_logits(data, *args, **kwargs):
            # the loss function is the engine's logits processor: it must be passed
            data.extra_info.update(
                {"compute_loss": True, "distillation_use_topk": True, "distillation_only": False}
            )
            return compute(data, *args, **kwargs)

        wg.compute_log_prob = with_logits
        try:
            batch = super()._compute_old_log_prob(batch, metrics)
        finally:
            wg.compute_log_prob = compute
        batch.extra_info.update({"compute_loss": False, "distillation_use_topk": False})
        proxy_to_responses(tq, batch)
        return batch

    def _actor_dp_size(self) -> int:
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        actor = self.config.actor_rollout_ref.actor
        rollout_n = self.config.actor_rollout_ref.rollout.n
        rows_per_mini_batch = actor.ppo_mini_batch_size * rollout_n
        update, ref_keys = batch, []
        if self.divrl_source is not None:
            update, ref_keys = join_in_queue(
                tq,
                batch,
                self.divrl_source.draw(self.divrl.reference_per_step),
                dp_size=self._actor_dp_size(),
                mini_batches=len(batch.keys) // rows_per_mini_batch,
                micro_batch_size=None
                if actor.use_dynamic_bsz
                else actor.ppo_micro_batch_size_per_gpu,
                step=self.global_steps,
            )
            rows_per_mini_batch = len(update.keys) // (len(batch.keys) // rows_per_mini_batch)
        update.extra_info.update(
            {
                "calculate_entropy": actor.calculate_entropy or actor.entropy_coeff != 0.0,
                # the engine's logits-processor hook: DivRLLoss computes Lp-Reg's proxy there
                "distillation_use_topk": self.divrl.policy_loss == "lp_reg"
                and not getattr(self, "divrl_old_proxy", False),
                "distillation_only": False,
                "global_batch_size": rows_per_mini_batch,
                "mini_batch_size": rows_per_mini_batch,
                "epochs": actor.ppo_epochs,
                "seed": actor.data_loader_seed,
                "dataloader_kwargs": {"shuffle": actor.shuffle},
                "temperature": self.config.actor_rollout_ref.rollout.temperature,
            }
        )
        try:
            output = self.actor_rollout_wg.update_actor(update)
        finally:
            if ref_keys:
                tq.kv_clear(keys=ref_keys, partition_id=batch.partition_id)
        output = rename_dict(output["metrics"], "actor/")
        output["perf/mfu/actor"] = output.pop("actor/mfu")
        metrics.update(reduce_metrics(output))
        return batch

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, *args, **kw):
        out = super()._val_metrics_update(
            data_sources, sample_uids, reward_extra_infos_dict, *args, **kw
        )
        if "acc" not in reward_extra_infos_dict and "score" not in reward_extra_infos_dict:
            return out
        for source, variables in pass_at_k_metrics(
            data_sources, sample_uids, reward_extra_infos_dict
        ).items():
            values = variables["acc"]
            top = max(int(name.split("@")[1]) for name in values)
            for name, value in values.items():
                section = "val-core" if name == f"pass@{top}" else "val-aux"
                out[f"{section}/{source}/acc/{name}"] = value
        return out
