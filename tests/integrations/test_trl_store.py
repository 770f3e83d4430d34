"""The TRL adapter's reference stream reads the rows it draws from the store's parquet
file, holding neither the store's table nor Python objects per token; a store written
before presample wrote small row groups is read from a re-grouped copy."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from divrl.data import reference_store as rs
from divrl.data.reference_store import ReferenceSample, ReferenceStore, write_reference_store
from divrl.data.store_files import ReferenceStoreError
from divrl.data.store_rows import ROWS_PER_GROUP
from divrl.integrations.trl_dph import ReferenceStream, regrouped_copy

CPU = torch.device("cpu")


def big_store(path, n: int = 3 * ROWS_PER_GROUP + 5):
    """A store of ``n`` random samples (more than one row group), written by presample's
    writer."""
    rng = np.random.default_rng(0)
    samples = [
        ReferenceSample(
            f"p{i}",
            rng.integers(0, 151_936, int(rng.integers(1, 9))).tolist(),
            rng.integers(0, 151_936, int(rng.integers(1, 40))).tolist(),
            [],
        )
        for i in range(n)
    ]
    for s in samples:
        s.ref_log_probs = (-rng.exponential(1.0, len(s.response_ids))).astype(np.float32).tolist()
    prompts = [
        {"prompt_id": s.prompt_id, "n_correct": 8, "split": "near_perfect", "has_reference": True}
        for s in samples
    ]
    write_reference_store(path, samples, prompts, {"log_prob_temperature": 1.0})
    return samples


def check_draws(stream: ReferenceStream, samples, seed: int, count: int) -> None:
    """``count`` draws of one process equal the samples of the seeded epoch order."""
    from divrl.data.sampling import EpochSampler

    order = EpochSampler(len(samples), seed, shuffle=True).take(count)
    batch = stream.next_batch(count, 0, 1, CPU)
    for row, i in enumerate(order):
        sample = samples[i]
        seq = sample.prompt_ids + sample.response_ids
        assert batch.input_ids[row, : len(seq)].tolist() == seq
        assert batch.attention_mask[row].sum() == len(seq)
        n = len(sample.response_ids)
        torch.testing.assert_close(batch.ref_log_probs[row, :n], torch.tensor(sample.ref_log_probs))
        assert batch.mask[row].sum() == n


def test_the_stream_reads_drawn_rows_from_the_store(tmp_path, monkeypatch, store):
    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    expected = ReferenceStore(store).samples  # the Python objects, for the comparison only

    def no_lists(self):
        raise AssertionError("the stream built the store's Python objects")

    monkeypatch.setattr(ReferenceStore, "samples", property(no_lists))
    stream = ReferenceStream(str(store), 1.0, seed=3, pad_token_id=0)
    assert stream.rows.num_rows == len(expected)
    assert not (tmp_path / "cache").exists()  # no copy: the store's own file is read
    check_draws(stream, expected, seed=3, count=2)


def test_presample_writes_small_row_groups_and_draws_match(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    samples = big_store(tmp_path / "store")
    meta = pq.ParquetFile(tmp_path / "store" / "samples.parquet").metadata
    assert meta.num_row_groups == 4
    assert max(meta.row_group(g).num_rows for g in range(4)) == ROWS_PER_GROUP
    stream = ReferenceStream(str(tmp_path / "store"), 1.0, seed=1, pad_token_id=0)
    assert not (tmp_path / "cache").exists()
    check_draws(stream, samples, seed=1, count=len(samples))  # a whole epoch, every group


def test_an_older_store_is_read_from_one_regrouped_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    samples = big_store(tmp_path / "store")
    parquet = tmp_path / "store" / "samples.parquet"
    pq.write_table(pq.read_table(parquet), parquet)  # as before: one row group, dictionaries
    assert pq.ParquetFile(parquet).metadata.num_row_groups == 1
    stream = ReferenceStream(str(tmp_path / "store"), 1.0, seed=2, pad_token_id=0)
    copies = list((tmp_path / "cache" / "store_rows").glob("*.parquet"))
    assert len(copies) == 1 and stream.rows.largest_group == ROWS_PER_GROUP
    check_draws(stream, samples, seed=2, count=len(samples))
    # the same store version reuses the copy; a replaced store gets its own
    ReferenceStream(str(tmp_path / "store"), 1.0, seed=2, pad_token_id=0)
    assert len(list((tmp_path / "cache" / "store_rows").glob("*.parquet"))) == 1
    opened = ReferenceStore(tmp_path / "store")
    opened.manifest["model"] = "another"
    regrouped_copy(opened)
    assert len(list((tmp_path / "cache" / "store_rows").glob("*.parquet"))) == 2


def test_a_store_replaced_after_opening_is_still_read_as_checked(tmp_path, monkeypatch):
    """The stream keeps the checked file open: a presample that replaces the store
    meanwhile does not change what it draws (nor leaves it reading a half-written file)."""
    samples = big_store(tmp_path / "store", n=40)
    stream = ReferenceStream(str(tmp_path / "store"), 1.0, seed=0, pad_token_id=0)
    big_store(tmp_path / "store", n=50)  # another store, written over the first one
    assert len(ReferenceStore(tmp_path / "store")) == 50
    check_draws(stream, samples, seed=0, count=40)


def test_the_checks_read_a_few_rows_at_a_time(tmp_path, monkeypatch):
    """Opened for the stream, the store's samples are never read whole, and the checks
    name the same rows as on the whole table."""
    from divrl.data import store_checks

    monkeypatch.setattr(store_checks, "CHECK_ROWS", 7)
    samples = big_store(tmp_path / "store", n=40)
    for i in (3, 8, 30):
        samples[i].response_ids[0] = 200_000
    samples[20].ref_log_probs[-1] = float("nan")
    write_reference_store(tmp_path / "store", samples, [], {"log_prob_temperature": 1.0})
    monkeypatch.setattr(rs, "read_table", reading_prompts_only(rs.read_table))
    with pytest.raises(ReferenceStoreError) as lazy:
        ReferenceStore.open(tmp_path / "store", vocab_size=151_936, load_samples=False)
    monkeypatch.undo()
    with pytest.raises(ReferenceStoreError) as whole:
        ReferenceStore.open(tmp_path / "store", vocab_size=151_936)
    assert str(lazy.value) == str(whole.value)
    assert "3 samples hold token ids outside" in str(whole.value)
    assert "e.g. 200000; rows 3, 8, 30" in str(whole.value) and "(rows 20)" in str(whole.value)


def reading_prompts_only(read_table):
    def read(path, columns, optional=()):
        assert path.name != "samples.parquet", "the samples were read whole"
        return read_table(path, columns, optional)

    return read
