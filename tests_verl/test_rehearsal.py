"""The rehearsal join: stored log-probs kept under divrl's key, rows laid out as verl's
update cuts them, the draw from a store ``divrl presample`` format."""

from __future__ import annotations

import pytest
import torch
from verl.utils import tensordict_utils as tu

from divrl.data.reference_store import write_reference_store
from divrl.integrations.verl.keys import IS_REFERENCE, REF_LOG_PROB, STREAM
from divrl.integrations.verl.rehearsal import RehearsalSource, join_rehearsal, plan_layout
from tests_verl.builders import reference_samples, rollout_rows


def test_the_join_keeps_the_stored_log_probs_and_the_rollouts():
    batch, samples = rollout_rows(8), reference_samples(4)
    joined, layout = join_rehearsal(batch, samples, dp_size=2, mini_batches=2)
    assert layout.rows == 12 and layout.mini_batch_rows == 6
    assert (layout.rollouts_per_cell, layout.references_per_cell) == (2, 1)
    is_ref = joined[IS_REFERENCE].tolist()
    # rank-major, then mini-batch: [r r f] per (rank, mini-batch) cell
    assert is_ref == [False, False, True] * 4
    refs = [i for i, f in enumerate(is_ref) if f]
    for j, i in enumerate(refs):
        row = joined[i]
        stored = torch.tensor(samples[j].ref_log_probs)
        assert torch.equal(row[REF_LOG_PROB], stored)
        assert row["responses"].tolist() == samples[j].response_ids
        assert row["input_ids"].tolist() == samples[j].prompt_ids + samples[j].response_ids
        assert row["position_ids"].tolist() == list(range(len(row["input_ids"])))
        assert float(row["advantages"].abs().sum()) == 0.0
    rolls = [i for i, f in enumerate(is_ref) if not f]
    for j, i in enumerate(rolls):
        for key in ("responses", "old_log_probs", "advantages", "input_ids"):
            assert torch.equal(joined[i][key], batch[j][key])
        assert float(joined[i][REF_LOG_PROB].abs().sum()) == 0.0


def test_the_stream_statistics_are_each_mini_batchs_tokens_over_all_ranks():
    batch, samples = rollout_rows(8), reference_samples(4)
    joined, _ = join_rehearsal(batch, samples, dp_size=2, mini_batches=2)
    tokens = [int(joined[i]["response_mask"].sum()) for i in range(len(joined))]
    is_ref = joined[IS_REFERENCE].tolist()
    cells = [(i // 3) % 2 for i in range(12)]  # mini-batch of each row (3 rows per cell)
    for k in (0, 1):
        roll = sum(n for n, f, c in zip(tokens, is_ref, cells, strict=True) if c == k and not f)
        ref = sum(n for n, f, c in zip(tokens, is_ref, cells, strict=True) if c == k and f)
        for i in (i for i in range(12) if cells[i] == k):
            assert joined[i][STREAM].tolist() == [roll, ref]


def test_layouts_that_do_not_divide_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="multiple of 4"):
        plan_layout(8, 3, dp_size=2, mini_batches=2, micro_batch_size=None)
    with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu=2"):
        plan_layout(8, 4, dp_size=4, mini_batches=1, micro_batch_size=2)
    with pytest.raises(ValueError, match="lacks"):
        join_rehearsal(rollout_rows(2).exclude("advantages"), reference_samples(1))


def test_the_source_draws_from_a_store_in_a_seeded_cycling_order(tmp_path):
    samples = reference_samples(5)
    prompts = [
        {"prompt_id": s.prompt_id, "n_correct": 8, "split": "near_perfect", "has_reference": True}
        for s in samples
    ]
    write_reference_store(tmp_path / "store", samples, prompts, {"log_prob_temperature": 1.0})
    a = RehearsalSource(str(tmp_path / "store"), temperature=1.0, seed=3)
    b = RehearsalSource(str(tmp_path / "store"), temperature=1.0, seed=3)
    first = [s.prompt_id for s in a.draw(5)]
    assert sorted(first) == sorted(s.prompt_id for s in samples)  # an epoch covers the store
    assert first == [s.prompt_id for s in b.draw(5)]
    assert len(a.draw(7)) == 7  # cycles past the end
    with pytest.raises(ValueError, match="temperature"):
        RehearsalSource(str(tmp_path / "store"), temperature=0.7)


def test_the_joined_batch_is_verls_nested_layout():
    joined, _ = join_rehearsal(rollout_rows(4), reference_samples(2), mini_batches=2)
    for key in ("input_ids", "responses", REF_LOG_PROB, "old_log_probs"):
        assert joined[key].is_nested
    padded = joined.select(REF_LOG_PROB, "response_mask").to_padded_tensor()
    assert padded[REF_LOG_PROB].shape == padded["response_mask"].shape
    assert tu.get(joined, IS_REFERENCE).dtype == torch.bool
