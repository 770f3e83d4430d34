"""The TRL adapter's reference stream reads a memory-mapped Arrow copy of the store, not
Python objects per token."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

pytest.importorskip("trl")

from divrl.data.reference_store import ReferenceStore
from divrl.integrations.trl_dph import ReferenceStream, mapped_samples


def test_the_stream_draws_the_stores_rows_from_a_mapped_copy(tmp_path, monkeypatch, store):
    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    expected = ReferenceStore(store).samples  # the Python objects, for the comparison only

    def no_lists(self):
        raise AssertionError("the stream built the store's Python objects")

    monkeypatch.setattr(ReferenceStore, "samples", property(no_lists))
    stream = ReferenceStream(str(store), 1.0, seed=3, pad_token_id=0)
    assert len(list((tmp_path / "cache" / "store_arrow").glob("*.arrow"))) == 1
    assert isinstance(stream.samples, pa.Table) and stream.samples.num_rows == len(expected)

    order = EpochOrder(len(expected), seed=3)
    batch = stream.next_batch(2, 0, 1, torch.device("cpu"))
    for row, i in enumerate(order.first(2)):
        sample = expected[i]
        seq = sample.prompt_ids + sample.response_ids
        assert batch.input_ids[row, : len(seq)].tolist() == seq
        n = len(sample.response_ids)
        torch.testing.assert_close(batch.ref_log_probs[row, :n], torch.tensor(sample.ref_log_probs))
    # the same store version reuses the copy; a replaced store gets its own
    monkeypatch.undo()
    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    opened = ReferenceStore(store)
    assert mapped_samples(opened).equals(stream.samples)
    assert len(list((tmp_path / "cache" / "store_arrow").glob("*.arrow"))) == 1
    opened.manifest["model"] = "another"
    mapped_samples(opened)
    assert len(list((tmp_path / "cache" / "store_arrow").glob("*.arrow"))) == 2


class EpochOrder:
    """The stream's draw order (divrl.data.sampling.EpochSampler with shuffle)."""

    def __init__(self, n: int, seed: int) -> None:
        from divrl.data.sampling import EpochSampler

        self.sampler = EpochSampler(n, seed, shuffle=True)

    def first(self, k: int) -> list[int]:
        return list(self.sampler.take(k))
