"""The divrl_sync trainer mode's pieces that run without Ray: the rehearsal join in
TransferQueue (an in-memory stand-in with its kv API), cut by verl's own dispatch and
mini-batch iterator and trained through DivRLLoss; the Pass@k validation metrics."""

from __future__ import annotations

import math

import torch
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls
from verl.utils import tensordict_utils as tu

from divrl.integrations.verl.keys import IS_REFERENCE, REF_LOG_PROB
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.settings import DivRLVerlSettings
from divrl.integrations.verl.trainer import DivRLPPOTrainer, join_in_queue
from tests_verl.builders import micro_batches, reference_samples, rollout_rows
from tests_verl.test_losses import actor_config


class MemoryQueue:
    """TransferQueue's kv API over a dict: rows by key, fields by name."""

    def __init__(self):
        self.rows: dict[str, dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            row = fields[i]
            self.rows.setdefault(key, {}).update({k: row[k] for k in row.keys()})  # noqa: SIM118 (a TensorDict iterates rows)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        out = []
        for key in keys:
            row = self.rows[key]
            names = select_fields if select_fields is not None else list(row)
            out.append({k: row[k] for k in names})
        return tu.list_of_dict_to_tensordict(out)

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.rows.pop(key)


def test_the_plugin_registers_the_trainer_mode():
    assert get_trainer_cls("divrl_sync") is DivRLPPOTrainer


def test_the_join_in_the_queue_trains_through_verls_dispatch_and_mini_batches():
    queue, batch = MemoryQueue(), rollout_rows(8)
    keys = [f"uid{i}_0_0" for i in range(8)]
    queue.kv_batch_put(keys, "train", fields=batch)
    for key in keys:  # fields the update does not read stay in the queue
        queue.rows[key]["rm_scores"] = torch.tensor(1.0)
    meta = KVBatchMeta(keys=keys, tags=[{}] * 8, partition_id="train", extra_info={})
    samples = reference_samples(4)
    joined, ref_keys = join_in_queue(
        queue, meta, samples, dp_size=2, mini_batches=2, micro_batch_size=3, step=7
    )
    assert len(ref_keys) == 4 and all(k.startswith("divrl_rehearsal_7_") for k in ref_keys)
    assert len(joined.keys) == 12 and set(keys) < set(joined.keys)
    assert joined.fields is None  # verl's own field selection (all of them) is kept
    for i, key in enumerate(keys):  # verl's rows are untouched, divrl's keys added
        assert torch.equal(queue.rows[key]["old_log_probs"], batch[i]["old_log_probs"])
        assert not bool(queue.rows[key][IS_REFERENCE])
    data = queue.kv_batch_get(joined.keys, "train", joined.fields)
    stored = {tuple(s.response_ids): torch.tensor(s.ref_log_probs) for s in samples}
    for i, key in enumerate(joined.keys):
        assert bool(data[i][IS_REFERENCE]) == (key in ref_keys)
        assert "rm_scores" in data[i].keys()  # noqa: SIM118 (every field, rehearsal rows too)
        if key in ref_keys:
            response = tuple(data[i]["responses"].tolist())
            assert torch.equal(data[i][REF_LOG_PROB], stored[response])
    settings = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=4,
    )
    loss_fn = DivRLLoss(actor_config(), settings)
    # verl's dispatch: contiguous rank chunks; each rank's mini-batches: verl's iterator
    ranks = tu.chunk_tensordict(data, 2)
    iterators = [
        list(
            tu.make_iterator(
                chunk, mini_batch_size=3, epochs=1, dataloader_kwargs={"shuffle": False}
            )
        )
        for chunk in ranks
    ]
    for k in range(2):
        minis = [it[k] for it in iterators]
        tokens = sum(int(m["loss_mask"].values().sum()) for m in minis)
        losses = []
        for mini in minis:
            for micro in micro_batches(mini, 3, dp_size=2):
                tu.assign_non_tensor(micro, batch_num_tokens=tokens)  # verl's all-reduced count
                nested = torch.nested.nested_tensor_from_jagged(
                    -torch.rand(micro["input_ids"].values().shape[0]), micro["input_ids"].offsets()
                )
                # raises when the rows verl groups are not the ones the join planned
                loss, _ = loss_fn(model_output={"log_probs": nested}, data=micro)
                losses.append(float(loss))
        assert all(map(math.isfinite, losses)) and any(losses)
    queue.kv_clear(ref_keys, "train")
    assert set(queue.rows) == set(keys)


def test_validation_adds_unbiased_pass_at_k():
    trainer = object.__new__(DivRLPPOTrainer)
    sources, uids = ["math"] * 4, ["a", "a", "b", "b"]
    infos = {"acc": [1.0, 0.0, 0.0, 0.0], "score": [1.0, 0.0, 0.0, 0.0]}
    out = trainer._val_metrics_update(sources, uids, infos, [])
    assert out["val-core/math/acc/pass@2"] == 0.5
    assert out["val-aux/math/acc/pass@1"] == 0.25
    assert "val-core/math/acc/mean@2" in out  # verl's own metrics are kept
