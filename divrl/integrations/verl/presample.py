"""DPH-RL's presample through verl: ``trainer.v1.trainer_mode=divrl_presample``.

The reference store of ``divrl presample``, made by verl's own workers, for models and
prompt sets that need verl's rollout (vLLM / SGLang over many GPUs): one epoch over
``data.train_files`` in verl's synchronous trainer, where each step

1. generates ``actor_rollout_ref.rollout.n = k + 1`` responses per prompt with verl's
   rollout workers (verl's replay buffer and agent loop, unchanged);
2. scores them with the run's reward function (``reward.custom_reward_function``: divrl's
   verifiers through ``divrl/integrations/verl/reward.py``);
3. computes their log-probs with verl's actor forward (verl's old-log-prob pass, at the
   rollout temperature): the very computation that training's forward repeats, so
   ``u = pi / pi_ref`` starts at 1 to rounding;
4. and, instead of the actor update, keeps the rows.

After the epoch the split is made as ``divrl presample`` makes it: per prompt the first
``k`` responses (in TransferQueue key order) count towards ``n_correct``; a prompt with
all ``k`` correct is near-perfect and its ``(k + 1)``-th response, if correct, is its
reference sample (the authors' rule: a near-perfect prompt without one stays
near-perfect, with no sample); every other prompt is an exploration prompt. The store is
written at ``divrl.reference_store`` in :mod:`divrl.data.reference_store`'s format, with
the fingerprint of the model folder and of the prompts (their ids: ``extra_info.index``,
verl's ``index``; their tokens as verl's chat template made them).

Nothing of verl's is patched: the mode is verl's sync trainer with ``_update_actor``
replaced and ``fit`` followed by the write.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch.utils.data
import transfer_queue as tq
from omegaconf import open_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.utils import create_rl_sampler
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from divrl.data.fingerprint import model_fingerprint
from divrl.data.reference_store import (
    ReferenceSample,
    StoreExpectation,
    write_reference_store,
)
from divrl.integrations.verl.data import write_exploration_split
from divrl.integrations.verl.settings import DivRLVerlSettings
from divrl.integrations.verl.startup import check_startup, exploration_path
from divrl.provenance import provenance
from divrl.rewards import is_correct

logger = logging.getLogger(__name__)

TRAINER_MODE = "divrl_presample"
#: what verl's own checks must see (the replay buffer, batch sizes and checkpoints of sync)
VERL_MODE = "sync"
FIELDS = ("prompts", "responses", "old_log_probs", "rm_scores", "index")
#: the ``index`` of a copied prompt that completes the epoch's last batch
EPOCH_PADDING = "divrl_epoch_padding:"


class EpochPadded(torch.utils.data.Dataset):
    """``dataset`` followed by copies of its first ``extra`` rows, their ``index`` marked
    with :data:`EPOCH_PADDING`: verl's dataloader drops the last partial batch
    (``drop_last=True``), so the presample pads the epoch to whole batches, and drops the
    copies' responses."""

    def __init__(self, dataset: Any, extra: int) -> None:
        self.dataset, self.extra = dataset, extra

    def __len__(self) -> int:
        return len(self.dataset) + self.extra

    def __getitem__(self, item: int) -> dict:
        n = len(self.dataset)
        if item < n:
            return self.dataset[item]
        row = dict(self.dataset[item - n])
        row["index"] = f"{EPOCH_PADDING}{row['index']}"
        return row


def dataset_prompt_ids(dataset: Any) -> list[str]:
    """Each row's prompt id (``extra_info.index``) of verl's dataset, after its filters.

    Raises:
        ValueError: a row without an index, or two rows sharing one (naming them).
    """
    frame = getattr(dataset, "dataframe", None)
    if frame is None:
        extras = [r.get("extra_info") for r in dataset]
    else:  # verl's dataset reads a missing index as 0: the file's own column is checked
        columns = frame.column_names if hasattr(frame, "column_names") else list(frame)
        extras = frame["extra_info"] if "extra_info" in columns else [None] * len(frame)
    ids, seen = [], {}
    for row, extra in enumerate(extras):
        index = (extra or {}).get("index")
        if index is None:
            raise ValueError(
                f"row {row} of data.train_files has no extra_info.index: the presample needs "
                "one per row (the store's prompt id); `divrl data index FILE --out "
                "INDEXED.parquet` writes a copy with one on every row, for data.train_files"
            )
        if str(index) in seen:
            raise ValueError(
                f"rows {seen[str(index)]} and {row} of data.train_files share extra_info.index "
                f"{index!r}: every row needs its own (the store's prompt id)"
            )
        seen[str(index)] = row
        ids.append(str(index))
    return ids


def kept(tag: dict, index: Any) -> bool:
    """Whether a row of the update batch is a real response: not one of verl's padding
    rows (dynamic batch sizes; they copy the first row's ``index``), not a response to a
    prompt copied to complete the last batch (:class:`EpochPadded`)."""
    return not tag.get("is_padding", False) and not str(index).startswith(EPOCH_PADDING)


def check_coverage(table: list[dict[str, Any]], dataset_ids: list[str]) -> None:
    """The split's prompts (near-perfect and exploration) are exactly the dataset's.

    Raises:
        ValueError: naming how many, and which, prompts are missing or extra.
    """
    split, data = {row["prompt_id"] for row in table}, set(dataset_ids)
    missing, extra = sorted(data - split), sorted(split - data)
    if missing or extra:
        raise ValueError(
            f"the presample split {len(split)} prompts but data.train_files holds "
            f"{len(data)} after verl's filters: missing {missing[:5]}, extra {extra[:5]}; "
            "no store was written"
        )


@dataclass
class PresampleRow:
    """One generated response as the presample keeps it."""

    key: str  # its TransferQueue key (the order of a prompt's responses)
    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]  # verl's actor forward, at the rollout temperature
    score: float


def presample_k(config: Any) -> int:
    """``k`` of the split: the run's ``rollout.n`` minus the extra response."""
    n = int(config.actor_rollout_ref.rollout.n)
    if n < 2:
        raise ValueError(
            f"trainer.v1.trainer_mode={TRAINER_MODE} draws k responses for the split and one "
            f"reference response per prompt: set actor_rollout_ref.rollout.n=k+1 (>= 2), got {n}"
        )
    return n - 1


def split_rows(
    rows: list[PresampleRow], k: int
) -> tuple[list[dict[str, Any]], list[PresampleRow], list[PresampleRow]]:
    """(the prompts table, the reference rows, the rows of the split) of one epoch's rows.

    Raises:
        ValueError: a prompt id with another number of responses than ``k + 1`` (two rows
            of the data sharing an ``extra_info.index``).
    """
    by_prompt: dict[str, list[PresampleRow]] = defaultdict(list)
    for row in rows:
        by_prompt[row.prompt_id].append(row)
    table, references, presampled = [], [], []
    for pid, group in by_prompt.items():
        if len(group) != k + 1:
            raise ValueError(
                f"prompt id {pid!r} has {len(group)} responses, not rollout.n={k + 1}: every "
                "row of data.train_files needs its own extra_info.index (the store's prompt id)"
            )
        group.sort(key=lambda r: r.key)
        counted, extra = group[:k], group[k]
        presampled += counted
        n_correct = sum(is_correct(r.score) for r in counted)
        near = n_correct >= k
        kept = near and is_correct(extra.score)
        if kept:
            references.append(extra)
        table.append(
            {
                "prompt_id": pid,
                "n_correct": n_correct,
                "split": "near_perfect" if near else "exploration",
                "has_reference": kept,
            }
        )
    return table, references, presampled


@register_trainer(TRAINER_MODE)
class DivRLPresampleTrainer(PPOTrainerSync):
    """verl's synchronous trainer that keeps one epoch of rollouts as a reference store."""

    def __init__(self, config):
        check_startup(config)  # as main_ppo's validate_config did (rollout.n, the store path)
        self.divrl = DivRLVerlSettings.from_mapping(config.get("divrl"))
        self.divrl_k = presample_k(config)
        self.divrl_rows: list[PresampleRow] = []
        self.divrl_started = time.perf_counter()
        with open_dict(config):
            config.trainer.v1.trainer_mode = VERL_MODE
        super().__init__(config)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """No update: the step's rows (tokens, verl's log-probs, scores) are kept."""
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=list(FIELDS)
        )
        prompts, responses = data["prompts"].unbind(), data["responses"].unbind()
        log_probs, scores = data["old_log_probs"].unbind(), data["rm_scores"].unbind()
        index = list(data["index"])
        real = [i for i in range(len(batch.keys)) if kept(batch.tags[i], index[i])]
        for i in real:
            key = batch.keys[i]
            self.divrl_rows.append(
                PresampleRow(
                    str(key),
                    str(index[i]),
                    prompts[i].tolist(),
                    responses[i].tolist(),
                    log_probs[i].float().tolist(),
                    float(scores[i].float().sum()),
                )
            )
        correct = sum(is_correct(float(scores[i].float().sum())) for i in real)
        metrics["divrl_presample/accuracy"] = correct / max(1, len(real))
        metrics["divrl_presample/rows"] = float(len(self.divrl_rows))
        return batch

    def _init_dataloader(self):
        """verl's dataloaders, the training one over the epoch padded to whole batches (and
        the prompt ids checked) before any worker starts."""
        super()._init_dataloader()
        self.divrl_prompt_ids = dataset_prompt_ids(self.train_dataset)
        size = int(self.config.data.train_batch_size)
        extra = -len(self.train_dataset) % size
        if not extra:
            return
        loader = self.train_dataloader
        self.train_dataset = EpochPadded(self.train_dataset, extra)
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset,
            batch_size=loader.batch_size,
            num_workers=loader.num_workers,
            drop_last=True,
            collate_fn=loader.collate_fn,
            sampler=create_rl_sampler(self.config.data, self.train_dataset),
        )
        self.steps_per_epoch = len(self.train_dataset) // size
        if self.config.trainer.total_training_steps is None:
            self.total_training_steps = self.steps_per_epoch * self.config.trainer.total_epochs

    def fit(self, agent_loop_manager):
        super().fit(agent_loop_manager)
        self.write_store()

    def write_store(self) -> dict[str, Any]:
        """Split the kept rows and write the store; returns its manifest."""
        table, references, presampled = split_rows(self.divrl_rows, self.divrl_k)
        check_coverage(table, self.divrl_prompt_ids)
        samples = [
            ReferenceSample(
                r.prompt_id,
                r.prompt_ids,
                r.response_ids,
                r.log_probs,
                self.tokenizer.decode(r.response_ids, skip_special_tokens=True),
            )
            for r in references
        ]
        manifest = self._manifest(table, samples, presampled)
        manifest["provenance"] = provenance(
            data=manifest["fingerprint"].get("prompts"), engine="verl", prompts=len(table)
        )
        write_reference_store(self.divrl.reference_store, samples, table, manifest)
        near = sum(r["split"] == "near_perfect" for r in table)
        exploration = exploration_path(self.divrl.reference_store)
        files = self.config.data.train_files
        files = [str(f) for f in files] if not isinstance(files, str) else files
        written = 0
        if len(table) > near:  # no file when every prompt is near-perfect
            written = write_exploration_split(files, self.divrl.reference_store, exploration)
        if written != len(table) - near:
            raise ValueError(
                f"{exploration} holds {written} prompts but the store's exploration split "
                f"{len(table) - near}: data.train_files' ids (its id column, else "
                "extra_info.index) are not verl's extra_info.index"
            )
        # printed, as verl's trainer prints its final metrics (its logging shows warnings only)
        print(
            f"divrl presample: {len(samples)} reference samples, {near} near-perfect of "
            f"{len(table)} prompts, at {self.divrl.reference_store}; {written} exploration "
            f"prompts (data.train_files of the training run) at {exploration}"
        )
        return manifest

    def _manifest(self, table, samples, presampled) -> dict[str, Any]:
        config, k = self.config, self.divrl_k
        rollout = config.actor_rollout_ref.rollout
        model = str(config.actor_rollout_ref.model.path)
        prompt_ids = {r.prompt_id: r.prompt_ids for r in presampled}
        expect = StoreExpectation(
            model=model_fingerprint(model),
            model_name=model,
            prompts=[(row["prompt_id"], prompt_ids[row["prompt_id"]]) for row in table],
        )
        near = [row for row in table if row["split"] == "near_perfect"]
        top_p = float(rollout.top_p)
        return {
            "model": model,
            "train_data": str(config.data.train_files),
            "template": "verl (the tokenizer's chat template, as verl applies it)",
            "presampled_with": f"verl trainer.v1.trainer_mode={TRAINER_MODE}",
            "sampling": {
                "k": k,
                "temperature": float(rollout.temperature),
                "top_p": top_p,
                "response_top_p": top_p,
                "max_new_tokens": int(config.data.max_response_length),
                "stop": [],
                "seed": int(config.data.get("seed") or 0),
            },
            "threshold": k,
            "failed_to_exploration": False,
            "keep_presampled": False,
            "log_prob_temperature": float(rollout.temperature),
            "fingerprint": expect.fingerprint(),
            "stats": {
                "prompts": len(table),
                "near_perfect": len(near),
                "near_perfect_share": len(near) / max(1, len(table)),
                "exploration": len(table) - len(near),
                "reference_samples": len(samples),
                "presampled_kept": 0,
                "extra_response_failed": len(near) - len(samples),
                "presample_accuracy": sum(is_correct(r.score) for r in presampled)
                / max(1, len(presampled)),
                "n_correct_histogram": {
                    str(c): sum(row["n_correct"] == c for row in table) for c in range(k + 1)
                },
                "seconds": round(time.perf_counter() - self.divrl_started, 2),
            },
        }
