"""divrl's trainer mode for verl's v1 trainer: ``trainer.v1.trainer_mode=divrl_sync``.

verl picks its v1 trainer class by name from a registry (``register_trainer``); the
plugin registers ``divrl_sync``: verl's synchronous trainer (``PPOTrainerSync``) with
divrl's additions, and nothing else changed. The class sets the config's trainer mode back
to verl's ``sync`` before verl's constructor reads it, so every check verl makes against
the literal ``"sync"`` (the replay buffer, the user's ``data.gen_batch_size``, what a
checkpoint holds, the ``trainer.v1.sync`` section) sees the synchronous trainer. With DPH
off and no divrl policy loss (``divrl.divergence_coef=0``, ``divrl.policy_loss`` unset) the
run is verl's sync run: verl's own ``ppo_loss`` and verl's own method bodies.

The additions, each through verl's own body:

- after verl's ``init``, the actor workers get :class:`~divrl.integrations.verl.losses.
  DivRLLoss` through verl's ``set_loss_fn`` (DPH or a divrl policy loss only);
- the actor update: with DPH-RL, ``divrl.reference_per_step`` rehearsal rows are drawn
  from the reference store and joined to the step's rows in TransferQueue
  (:func:`join_in_queue`), then verl's ``_update_actor`` runs on the joined batch with the
  joined mini-batch size, and the rows are cleared after the update; the draw order is
  saved in verl's checkpoint folder and restored on resume;
- a loss that declares it needs the min-p proxy (``NEEDS_PROXY``: Lp-Reg): verl's
  old-log-prob pass runs with the engine's logits-processor hook on, so the
  loss computes pi_old's min-p proxy from the logits of that very forward, and the update
  reads it (with verl's bypass mode, which skips that pass, the update's own forward
  gives the proxy instead);
- validation metrics: divrl's unbiased ``pass@k`` beside verl's ``best@k``;
- every training step logs ``reward/unscorable``: how many of its responses got no verdict
  (:func:`~divrl.integrations.verl.metrics.unscorable_count`), as ``divrl train`` does.

verl's trainer overwrites the batch keys that switch the logits hook and size the
mini-batches just before it dispatches to the workers; :class:`PinnedInfo` (the one
workaround, docs/verl.md) keeps divrl's values of exactly those keys through that call.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import response_from_nested

from divrl.algorithms.rehearsal_control import RehearsalController
from divrl.fileio import atomic_write_text
from divrl.integrations.verl import keys

# the modules, not their names: `from divrl.integrations.verl.losses import DivRLLoss` in a
# process that has not imported verl yet starts verl, whose plugin loading imports this
# module while losses.py is still half-executed (its names not defined yet)
from divrl.integrations.verl import losses as verl_losses
from divrl.integrations.verl import rehearsal as verl_rehearsal
from divrl.integrations.verl.metrics import UNSCORABLE_METRIC, pass_at_k_metrics, unscorable_count
from divrl.integrations.verl.settings import DivRLVerlSettings
from divrl.integrations.verl.startup import check_startup

logger = logging.getLogger(__name__)

TRAINER_MODE = "divrl_sync"
#: the verl trainer mode divrl_sync is, as verl's own checks read it
VERL_MODE = "sync"


def join_in_queue(
    queue: Any,
    batch: KVBatchMeta,
    samples: list,
    *,
    dp_size: int,
    mini_batches: int,
    micro_batch_size: int | None,
    step: int,
    eta: float | None = None,
) -> tuple[KVBatchMeta, list[str]]:
    """Join ``samples`` to ``batch``'s rows in TransferQueue (``queue``: its ``kv_batch_get``
    / ``kv_batch_put`` API); the joined batch's meta and the rehearsal rows' keys (clear
    them after the update).

    verl's rows stay as they are (divrl's three keys are added to them); the rehearsal
    rows get every field of verl's rows (:func:`~divrl.integrations.verl.rehearsal.
    rehearsal_row`), laid out for this step's mini-batch count and balanced over the ranks
    by length (:func:`~divrl.integrations.verl.rehearsal.plan_layout`). ``eta``: the
    rehearsal controller's, written on every row.
    """
    part = batch.partition_id
    counts = queue.kv_batch_get(
        keys=batch.keys, partition_id=part, select_fields=["response_mask", "loss_mask"]
    )
    if all("seq_len" in tag for tag in batch.tags):
        lengths = [int(tag["seq_len"]) for tag in batch.tags]
    else:
        ids = queue.kv_batch_get(keys=batch.keys, partition_id=part, select_fields=["input_ids"])
        lengths = ids["input_ids"].offsets().diff().tolist()
    layout = verl_rehearsal.plan_layout(
        lengths,
        [len(s.prompt_ids) + len(s.response_ids) for s in samples],
        dp_size,
        mini_batches,
        micro_batch_size,
    )
    first = queue.kv_batch_get(keys=batch.keys[:1], partition_id=part)[0]
    template = {key: first[key] for key in first.keys()}  # noqa: SIM118 (TensorDict keys)
    verl_rehearsal.check_update_keys(template)
    rows, kinds, row_keys, tags = [], [], [], []
    new_rows, new_keys, new_tags = [], [], []
    for n, i in enumerate(layout.order):
        if i is not None and i >= 0:
            rows.append({k: counts[i][k] for k in ("response_mask", "loss_mask")})
            row_keys.append(batch.keys[i])
            tags.append(batch.tags[i])
        else:
            sample = verl_rehearsal.padding_sample() if i is None else samples[-i - 1]
            row = verl_rehearsal.rehearsal_row(sample, template, padding=i is None)
            rows.append(row)
            new_rows.append(row)
            new_keys.append(f"divrl_rehearsal_{step}_{n}")
            new_tags.append(_rehearsal_tag(sample, padding=i is None))
            row_keys.append(new_keys[-1])
            tags.append(new_tags[-1])
        kinds.append(i is None or i < 0)
    extras = verl_rehearsal.divrl_fields(rows, kinds, layout, eta)
    for row, extra, is_ref in zip(rows, extras, kinds, strict=True):
        if is_ref:
            row.update(extra)
    roll = [(k, e) for k, e, f in zip(row_keys, extras, kinds, strict=True) if not f]
    queue.kv_batch_put(
        keys=[k for k, _ in roll],
        partition_id=part,
        fields=tu.list_of_dict_to_tensordict([e for _, e in roll]),
    )
    queue.kv_batch_put(
        keys=new_keys,
        partition_id=part,
        fields=tu.list_of_dict_to_tensordict(new_rows),
        tags=new_tags,
    )
    ours = [
        keys.IS_REFERENCE,
        keys.REF_LOG_PROB,
        keys.STREAM,
        *([keys.ETA] if eta is not None else []),
    ]
    fields = None if batch.fields is None else [*batch.fields, *ours]
    meta = KVBatchMeta(
        keys=row_keys,
        tags=tags,
        partition_id=part,
        fields=fields,
        extra_info=dict(batch.extra_info or {}),
    )
    return meta, new_keys


def proxy_to_responses(queue: Any, batch: KVBatchMeta) -> None:
    """Cut the old-log-prob pass's per-position proxy outputs down to each row's response
    tokens in place (as verl cuts ``log_probs`` into ``old_log_probs``), so the update reads
    pi_old's proxy aligned with its log-probs."""
    fields = [keys.PROXY_LOG_PROB, keys.LOG_NORMALIZER, "response_mask"]
    data = queue.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
    )
    mask = data["response_mask"]
    cut = {
        k: response_from_nested(data[k], mask) for k in (keys.PROXY_LOG_PROB, keys.LOG_NORMALIZER)
    }
    queue.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict(cut, batch_size=[len(batch.keys)]),
    )


def _rehearsal_tag(sample, padding: bool = False) -> dict:
    """The tags verl's agent loop gives a row (lengths), marked as a rehearsal row (and as
    verl marks its own padding rows, when it is one)."""
    prompt, response = len(sample.prompt_ids), len(sample.response_ids)
    tag = {
        "status": "success",
        "prompt_len": prompt,
        "response_len": response,
        "seq_len": prompt + response,
        "divrl_rehearsal": True,
    }
    if padding:
        tag["is_padding"] = True
    return tag


class PinnedInfo(dict):
    """A batch's ``extra_info`` whose ``pinned`` keys keep their values through ``update``.

    verl's ``_compute_old_log_prob`` and ``_update_actor`` set the batch keys they dispatch
    with (``compute_loss``, ``distillation_use_topk``, ``mini_batch_size``, ...) right
    before the worker call, with no hook in between; divrl needs other values of a few of
    them (the logits hook for Lp-Reg's proxy, the joined batch's mini-batch size). Pinning
    them lets verl's own method body run unchanged. Upstream, a trainer hook that returns
    the extra batch keys of each pass would replace this (docs/verl.md).
    """

    def __init__(self, base=(), pinned=None):
        super().__init__(base)
        self.pinned = dict(pinned or {})
        super().update(self.pinned)

    def update(self, *args, **kwargs) -> None:
        super().update(*args, **kwargs)
        super().update(self.pinned)


def _pinned_call(batch: KVBatchMeta, pinned: dict, call):
    """``call()`` with ``batch.extra_info`` pinned; a plain dict again afterwards."""
    batch.extra_info = PinnedInfo(batch.extra_info or {}, pinned)
    try:
        return call()
    finally:
        batch.extra_info = dict(batch.extra_info)


def actor_dp_size(wg: Any) -> int:
    """The actor's data-parallel size, read as verl's own ``_balance_batch`` reads it.

    verl 0.9.1 has no public accessor: this uses the worker group's dispatch table
    (``_dispatch_info``, filled by ``_query_dispatch_info``), exactly as verl's trainer does.
    """
    if "actor" not in wg._dispatch_info:
        wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
    return max(wg._dispatch_info["actor"]) + 1


#: the file in verl's checkpoint folder (``global_step_N/``) with the rehearsal draw order
SAMPLER_STATE = "divrl_rehearsal.json"
#: ... and the one with the rehearsal controller's state (eta, its measurements)
CONTROL_STATE = "divrl_rehearsal_control.json"


@register_trainer(TRAINER_MODE)
class DivRLPPOTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with divrl's loss, rehearsal join and Pass@k."""

    def __init__(self, config):
        # divrl's settings, their composition with verl's and the store: checked before
        # verl starts any worker (main_ppo's validate_config ran the same checks already;
        # this covers a trainer built by other code)
        check_startup(config)
        self.divrl = DivRLVerlSettings.from_mapping(config.get("divrl"))
        self.divrl_source = None
        if self.divrl.dph:
            self.divrl_source = verl_rehearsal.RehearsalSource(
                self.divrl.reference_store,
                temperature=config.actor_rollout_ref.rollout.temperature,
                seed=self.divrl.reference_seed,
                allow_mismatch=self.divrl.allow_store_mismatch,
            )
        control = self.divrl.control  # DPH-RL's eta from a target, on the driver
        self.divrl_control = (
            RehearsalController(control, self.divrl.divergence_coef) if control else None
        )
        # verl compares the mode with the literal "sync" (replay buffer, gen_batch_size,
        # checkpoint contents, the trainer.v1.sync section): this trainer is that mode
        with open_dict(config):
            config.trainer.v1.trainer_mode = VERL_MODE
        super().__init__(config)

    def init(self):
        super().init()
        actor = self.config.actor_rollout_ref.actor
        if self.divrl.replaces_loss:
            rollouts = self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n
            mini_batches = self.config.data.train_batch_size // actor.ppo_mini_batch_size
            layout = self.divrl.authors_layout(rollouts, mini_batches)
            loss = verl_losses.DivRLLoss(omega_conf_to_dataclass(actor), self.divrl, layout)
            self.actor_rollout_wg.set_loss_fn(loss)
        if self.divrl_source is not None:
            self._load_sampler_state()
        if self.divrl_control is not None:
            self._load_control_state()
        logger.info("divrl: %s", self.divrl)

    def _init_tokenizer(self):
        super()._init_tokenizer()
        if self.divrl_source is not None:  # before any worker starts
            self._check_store_prompts()

    def _check_store_prompts(self) -> None:
        """The stored samples against verl's prompt/response limits and chat template."""
        data, actor = self.config.data, self.config.actor_rollout_ref.actor
        verl_rehearsal.check_store_prompts(
            self.divrl_source.samples,
            max_prompt_length=data.max_prompt_length,
            max_response_length=data.max_response_length,
            max_token_len=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None,
            suffix=verl_rehearsal.generation_suffix(self.tokenizer),
        )

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_folder(self) -> str:
        folder = self.config.trainer.default_local_dir
        return os.path.join(folder, f"global_step_{self.global_steps}")

    def _save_checkpoint(self):
        if self.divrl_source is not None:  # before verl's tracker file names the folder
            folder = self._checkpoint_folder()
            os.makedirs(folder, exist_ok=True)
            state = json.dumps(self.divrl_source.state_dict())
            atomic_write_text(os.path.join(folder, SAMPLER_STATE), state)
            if self.divrl_control is not None:
                state = json.dumps(self.divrl_control.state_dict())
                atomic_write_text(os.path.join(folder, CONTROL_STATE), state)
        return super()._save_checkpoint()

    def _resumed_folder(self) -> str:
        """The checkpoint folder verl resumed from."""
        if self.config.trainer.resume_mode == "resume_path":
            return self.config.trainer.resume_from_path
        return self._checkpoint_folder()

    def _resumed_state(self, name: str, without: str) -> dict | None:
        """divrl's state file ``name`` in the checkpoint verl resumed from (None on a fresh
        start); a missing file is an error saying to resume ``without`` the setting."""
        if self.global_steps <= 0:
            return None
        path = os.path.join(self._resumed_folder(), name)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing: the checkpoint was not written {without} start a new run"
            )
        with open(path) as f:
            return json.load(f)

    def _load_control_state(self) -> None:
        """Continue the rehearsal controller (eta, warm-up count) of the resumed checkpoint."""
        state = self._resumed_state(
            CONTROL_STATE, "with divrl.rehearsal_control; resume without it or"
        )
        if state is not None:
            self.divrl_control.load_state_dict(state)

    def _observe_control(self, metrics: dict) -> None:
        """The rehearsal controller reads the update's metrics (verl's ``actor/`` keys,
        reduced over ranks) and sets the next step's eta; its values are logged."""
        actor = {k.removeprefix("actor/"): v for k, v in metrics.items() if k.startswith("actor/")}
        metrics.update({f"divrl/{k}": v for k, v in self.divrl_control.observe(actor).items()})

    def _load_sampler_state(self) -> None:
        """Continue the rehearsal draw order of the checkpoint verl resumed from."""
        state = self._resumed_state(
            SAMPLER_STATE,
            "by a divrl_sync run with DPH-RL; resume it without divrl.divergence or",
        )
        if state is not None:
            self.divrl_source.load_state_dict(state)
            logger.info("divrl: rehearsal draw order restored from %s", self._resumed_folder())

    # ------------------------------------------------------------------ the passes

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's old-log-prob pass; for Lp-Reg with the engine's logits hook on, so the
        proxy is pi_old's (the authors' source, on- and off-policy), cut to the responses."""
        correction = self.config.algorithm.get("rollout_correction", None)
        bypass = bool(correction and correction.get("bypass_mode", False))
        self.divrl_old_proxy = self.divrl.needs_proxy and not bypass
        if not self.divrl_old_proxy:
            return super()._compute_old_log_prob(batch, metrics)
        # the loss function is the engine's logits processor: the pass must be given it
        pinned = {"compute_loss": True, "distillation_use_topk": True, "distillation_only": False}
        batch = _pinned_call(
            batch,
            pinned,
            lambda: super(DivRLPPOTrainer, self)._compute_old_log_prob(batch, metrics),
        )
        batch.extra_info.update({"compute_loss": False, "distillation_use_topk": False})
        proxy_to_responses(tq, batch)
        return batch

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update, on the batch joined with this step's rehearsal rows."""
        pinned: dict[str, Any] = {}
        if self.divrl.needs_proxy and not getattr(self, "divrl_old_proxy", False):
            # bypass mode: the update's own forward gives the proxy through the logits hook
            pinned.update({"distillation_use_topk": True, "distillation_only": False})
        if self.divrl_source is None:
            if not pinned:
                return super()._update_actor(batch, metrics)
            _pinned_call(
                batch, pinned, lambda: super(DivRLPPOTrainer, self)._update_actor(batch, metrics)
            )
            return batch
        actor = self.config.actor_rollout_ref.actor
        rows_per_mini_batch = actor.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n
        samples = self.divrl_source.draw(self.divrl.reference_per_step)
        update, ref_keys = join_in_queue(
            tq,
            batch,
            samples,
            dp_size=actor_dp_size(self.actor_rollout_wg),
            mini_batches=len(batch.keys) // rows_per_mini_batch,
            micro_batch_size=None if actor.use_dynamic_bsz else actor.ppo_micro_batch_size_per_gpu,
            step=self.global_steps,
            eta=None if self.divrl_control is None else self.divrl_control.eta,
        )
        rows = len(update.keys) // (len(batch.keys) // rows_per_mini_batch)
        metrics.update(
            {
                "divrl/rehearsal_rows": len(samples),
                "divrl/rehearsal_padding_rows": len(ref_keys) - len(samples),
                # where the draw order stands after this step's draw (a resumed run goes on)
                "divrl/rehearsal_drawn": self.divrl_source.drawn,
            }
        )
        pinned.update({"global_batch_size": rows, "mini_batch_size": rows})
        try:
            _pinned_call(
                update, pinned, lambda: super(DivRLPPOTrainer, self)._update_actor(update, metrics)
            )
            if self.divrl_control is not None:
                self._observe_control(metrics)
        finally:
            tq.kv_clear(keys=ref_keys, partition_id=batch.partition_id)
        return batch

    def _compute_metrics(self, batch: KVBatchMeta, metrics: dict, *args, **kwargs):
        """verl's step metrics, and ``reward/unscorable``: the step's responses without a
        verdict (0 in a step without any), counted over all of its rows once per step."""
        out = super()._compute_metrics(batch, metrics, *args, **kwargs)
        metrics[UNSCORABLE_METRIC] = float(unscorable_count(tq, batch))
        return out

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
