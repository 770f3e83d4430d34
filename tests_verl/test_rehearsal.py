"""The rehearsal join: stored log-probs kept under divrl's key, rows laid out as verl's
update cuts them, the draw from a store ``divrl presample`` format."""

from __future__ import annotations

import pytest
import torch
from verl.utils import tensordict_utils as tu

from divrl.data.reference_store import ReferenceSample, write_reference_store
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
    refs = [(i, -layout.order[i] - 1) for i, f in enumerate(is_ref) if f]
    assert sorted(j for _, j in refs) == [0, 1, 2, 3]
    for i, j in refs:
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
            assert joined[i][STREAM].tolist() == [roll, ref, roll + ref]


def test_any_mini_batch_count_and_draw_size_get_equal_cells_with_padding_rows():
    # 3 samples over 2 ranks x 2 mini-batches: cells of 1 slot, one cell padded
    layout = plan_layout([5] * 8, [4, 9, 2], dp_size=2, mini_batches=2, micro_batch_size=None)
    assert (layout.rows, layout.mini_batch_rows, layout.references_per_cell) == (12, 6, 1)
    assert layout.padding == 1 and sorted(i for i in layout.order if i is not None and i < 0) == [
        -3,
        -2,
        -1,
    ]
    # fixed micro-batches: cells padded to a multiple of the micro-batch size
    layout = plan_layout([5] * 8, [4] * 4, dp_size=4, mini_batches=1, micro_batch_size=2)
    assert layout.references_per_cell == 2 and layout.padding == 4
    with pytest.raises(ValueError, match="does not split over 2 data-parallel ranks"):
        plan_layout([5] * 7, [4], dp_size=2, mini_batches=1, micro_batch_size=None)
    with pytest.raises(ValueError, match="lacks"):
        join_rehearsal(rollout_rows(2).exclude("advantages"), reference_samples(1))


def test_rehearsal_tokens_are_balanced_over_the_ranks_by_length():
    # rank 0's rollout rows are long, rank 1's short: the long samples go to rank 1
    rollout = [50, 50, 5, 5]
    layout = plan_layout(rollout, [40, 3, 30, 2], dp_size=2, mini_batches=1, micro_batch_size=None)
    rank0, rank1 = layout.order[:4], layout.order[4:]
    assert sorted(i for i in rank1 if i < 0) == [-3, -1]  # samples 0 (40) and 2 (30)
    assert sorted(i for i in rank0 if i < 0) == [-4, -2]
    load = [100 + 3 + 2, 10 + 40 + 30]
    assert max(load) - min(load) < 100  # without balancing: 100 + 70 vs 10 + 5


def test_a_padding_row_adds_no_tokens_and_a_field_the_join_cannot_fill_is_named():
    batch = rollout_rows(4)
    joined, layout = join_rehearsal(batch, reference_samples(1), dp_size=2, mini_batches=1)
    assert layout.padding == 1
    pad = layout.order.index(None)
    assert bool(joined[pad][IS_REFERENCE]) and int(joined[pad]["response_mask"].sum()) == 0
    assert joined[0][STREAM].tolist()[1] == len(reference_samples(1)[0].response_ids)
    routed = batch.clone()
    routed["routed_experts"] = torch.nested.nested_tensor_from_jagged(
        torch.zeros(int(batch["input_ids"].offsets()[-1]), 2, dtype=torch.int16),
        batch["input_ids"].offsets(),
    )
    with pytest.raises(ValueError, match=r"^the update batch carries 'routed_experts': .*router"):
        join_rehearsal(routed, reference_samples(2), mini_batches=2)
    odd = batch.clone()
    odd["my_token_field"] = batch["old_log_probs"]
    with pytest.raises(ValueError, match="per-token field 'my_token_field'"):
        join_rehearsal(odd, reference_samples(2), mini_batches=2)
    # a per-row tensor that is not per token (verl's dataset adds one) is the template's
    per_row = batch.clone()
    per_row["dummy_tensor"] = torch.zeros(4, 1, dtype=torch.uint8)
    joined, _ = join_rehearsal(per_row, reference_samples(2), mini_batches=2)
    assert joined["dummy_tensor"].shape == (6, 1)


def test_the_rehearsal_row_fills_every_field_verl_may_carry():
    batch = rollout_rows(2)
    r = batch["response_mask"]
    for key in ("rollout_is_weights", "rollout_log_probs", "rm_scores", "returns"):
        batch[key] = torch.nested.nested_tensor_from_jagged(
            torch.rand(int(r.offsets()[-1])), r.offsets()
        )
    ids = batch["input_ids"]  # the old-log-prob pass's whole-sequence output stays in verl's rows
    batch["log_probs"] = torch.nested.nested_tensor_from_jagged(
        torch.rand(int(ids.offsets()[-1])), ids.offsets()
    )
    sample = reference_samples(1)[0]
    joined, layout = join_rehearsal(batch, [sample])
    ref = layout.order.index(-1)
    row = joined[ref]
    stored = torch.tensor(sample.ref_log_probs)
    assert torch.equal(row["rollout_log_probs"], stored)
    assert torch.equal(row["rollout_is_weights"], torch.ones(len(stored)))
    assert float(row["rm_scores"].abs().sum()) == float(row["returns"].abs().sum()) == 0.0
    assert row["log_probs"].shape == row["input_ids"].shape
    assert set(joined.keys()) >= set(batch.keys())


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


def test_stored_prompts_are_checked_against_verls_limits_and_chat_template():
    from divrl.integrations.verl.rehearsal import check_store_prompts, generation_suffix
    from divrl.toy.tokenizer import build_tokenizer

    tok = build_tokenizer(model_max_length=64)
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %} answer:{% endif %}"
    )
    suffix = generation_suffix(tok)
    assert suffix == tok(" answer:", add_special_tokens=False)["input_ids"]
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "1+1="}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    good = ReferenceSample("p0", ids, [5, 6, 7], [-1.0, -1.0, -1.0])
    limits = dict(max_prompt_length=len(ids), max_response_length=3, suffix=suffix)
    check_store_prompts([good], **limits)
    raw = ReferenceSample("p1", ids[: -len(suffix)], [5], [-1.0])
    with pytest.raises(ValueError, match=r"^the reference store's prompt 'p1' .*chat template"):
        check_store_prompts([good, raw], **limits)
    long = ReferenceSample("p2", [1, *ids], [5], [-1.0])
    with pytest.raises(ValueError, match=r"'p2' has .* data\.max_prompt_length"):
        check_store_prompts([long], **limits)
    with pytest.raises(ValueError, match=r"'p0': its response .* data.max_response_length=2"):
        check_store_prompts([good], **{**limits, "max_response_length": 2})
    with pytest.raises(ValueError, match=r"'p0': .*ppo_max_token_len_per_gpu=4"):
        check_store_prompts([good], **limits, max_token_len=4)
