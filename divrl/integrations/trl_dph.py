"""DPH-RL inside TRL: the stream of reference samples from a divrl reference store."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from divrl.data.fingerprint import model_fingerprint
from divrl.data.reference_store import ReferenceStore, StoreExpectation
from divrl.data.sampling import EpochSampler
from divrl.data.store_checks import read_manifest
from divrl.data.store_files import MANIFEST, SAMPLES
from divrl.data.store_rows import ROWS_PER_GROUP, StoreRows, write_samples

logger = logging.getLogger(__name__)


#: the columns of a reference store the stream reads
STREAM_COLUMNS = ("prompt_id", "prompt_ids", "response_ids", "ref_log_probs")


def store_cache_dir() -> Path:
    """Where the re-grouped copies of older reference stores go: ``$DIVRL_CACHE_DIR/store_rows``
    or ``~/.cache/divrl/store_rows``."""
    root = os.environ.get("DIVRL_CACHE_DIR") or Path.home() / ".cache" / "divrl"
    return Path(root) / "store_rows"


def regrouped_copy(store: ReferenceStore, cache_dir: Path | None = None) -> Path:
    """A copy of ``store``'s stream columns in small row groups (``store_rows.write_samples``),
    for a store written before presample wrote them so: written once per store version,
    atomically, under ``cache_dir``, from the table the store's checks read. Named by the
    store's path, manifest and parquet file's size and time, so a presample that replaces
    the store gets a new one."""
    parquet = store.path / SAMPLES
    stat = parquet.stat()
    key = json.dumps(
        [str(store.path.resolve()), store.manifest, stat.st_size, stat.st_mtime_ns],
        sort_keys=True,
        default=str,
    )
    cache = cache_dir or store_cache_dir()
    path = cache / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.parquet"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            write_samples(store.table.select(list(STREAM_COLUMNS)), tmp)
            os.replace(tmp, path)  # whole, even with several processes writing it at once
        finally:
            tmp.unlink(missing_ok=True)
    return path


def stream_rows(store: ReferenceStore, cache_dir: Path | None = None) -> StoreRows:
    """The rows of the checked ``store`` (opened with ``load_samples=False``), read on
    demand from its open parquet file (the version the checks read) or, for an older store
    in one large row group, from :func:`regrouped_copy`."""
    assert store.samples_file is not None
    rows = StoreRows(store.samples_file, STREAM_COLUMNS)
    if rows.largest_group > ROWS_PER_GROUP:
        logger.info(
            "the reference store %s was written in row groups of up to %d rows; its rows are "
            "read from a copy in groups of %d (presample again to read the store itself)",
            store.path,
            rows.largest_group,
            ROWS_PER_GROUP,
        )
        rows = StoreRows.open(regrouped_copy(store, cache_dir), STREAM_COLUMNS)
    return rows


def hub_snapshot(name: str) -> Path | None:
    """The local snapshot folder of hub model ``name`` in the Hugging Face cache (what
    ``from_pretrained(name)`` loaded), or None when it is not there."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not a repo id, not cached, no huggingface_hub
        return None


def model_expectation(model_path: str, manifest: dict[str, Any]) -> StoreExpectation | None:
    """What the store's model fingerprint must be for the model loaded from ``model_path``.

    A local folder: its fingerprint. A hub id: the name when the store was presampled by
    name (``name:<id>``), else the fingerprint of its cached snapshot (config, tokenizer
    files, weights' ends: the same as the folder's), so a store presampled from a local
    copy is checked too. None (with a warning) when the model cannot be fingerprinted.
    """
    if not model_path:
        return None
    if Path(model_path).is_dir():
        return StoreExpectation(model=model_fingerprint(model_path), model_name=model_path)
    stored = str((manifest.get("fingerprint") or {}).get("model") or "")
    if stored.startswith("name:"):
        return StoreExpectation(model=f"name:{model_path}", model_name=model_path)
    snapshot = hub_snapshot(model_path)
    if snapshot is None:
        logger.warning(
            "the model %s is neither a local folder nor in the Hugging Face cache: the "
            "reference store is not checked against it",
            model_path,
        )
        return None
    return StoreExpectation(model=model_fingerprint(snapshot), model_name=model_path)


@dataclass
class _ReferenceBatch:
    input_ids: torch.Tensor  # [B, T] prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, T]
    logits_to_keep: int  # the last K positions hold every response token
    columns: torch.Tensor  # [B, R] column of each response token in the [B, K] log-probs
    ref_log_probs: torch.Tensor  # [B, R]
    mask: torch.Tensor  # [B, R]


class ReferenceStream:
    """Seeded, cycling draws from a divrl reference store, identical on every process.

    Draw ``n`` (counted over the run, all processes together) is a pure function of the seed
    and ``n``, so a resumed run continues the same order (the count restarts from the resumed
    optimizer step).
    """

    def __init__(
        self,
        path: str,
        temperature: float,
        seed: int,
        pad_token_id: int,
        *,
        model_path: str = "",
        allow_mismatch: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        # The model is checked by its fingerprint (model_expectation); the prompts are the
        # user's dataset (see exploration_dataset).
        manifest = Path(path) / MANIFEST
        expect = model_expectation(
            model_path, read_manifest(manifest) if manifest.is_file() else {}
        )
        store = ReferenceStore.open(
            path,
            temperature=temperature,
            expect=expect,
            allow_mismatch=allow_mismatch,
            allow_hint="allow_store_mismatch=True",
            vocab_size=vocab_size,  # every stored token id must be below it
            load_samples=False,  # checked a few rows at a time, never held whole
        )
        # read on demand (stream_rows): neither the store's Python objects nor its table
        self.rows = stream_rows(store)
        del store
        pa.default_memory_pool().release_unused()  # what the checks' reads kept
        self.sampler = EpochSampler(self.rows.num_rows, seed, shuffle=True)
        self.pad_token_id = pad_token_id
        self.drawn = 0  # samples drawn so far, all processes

    def seek(self, drawn: int) -> None:
        n = self.rows.num_rows
        self.sampler.load_state_dict({"epoch": drawn // n, "position": drawn % n, "size": n})
        self.drawn = drawn

    def next_batch(
        self, per_device: int, rank: int, world: int, device: torch.device
    ) -> _ReferenceBatch:
        indices = self.sampler.take(per_device * world)[rank * per_device : (rank + 1) * per_device]
        self.drawn += per_device * world
        # the drawn rows only, decoded from their row groups (numpy arrays, no Python
        # object per token)
        rows = self.rows.read(indices)
        prompt_lens = [len(r["prompt_ids"]) for r in rows]
        resp_lens = [len(r["response_ids"]) for r in rows]
        if min(resp_lens) == 0:
            raise ValueError("the reference store holds an empty response; presample again")
        total = max(p + r for p, r in zip(prompt_lens, resp_lens, strict=True))
        # Right padding keeps every row's positions at 0..len-1, as when the reference
        # log-probs were computed, so u = pi_theta / pi_ref is exactly 1 at initialisation.
        input_ids = torch.full((len(rows), total), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), total), dtype=torch.long)
        width = max(resp_lens)
        ref = torch.zeros((len(rows), width), dtype=torch.float32)
        mask = torch.zeros((len(rows), width), dtype=torch.float32)
        keep = total - min(prompt_lens)
        columns = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            seq = np.concatenate([row["prompt_ids"], row["response_ids"]]).astype(np.int64)
            input_ids[i, : len(seq)] = torch.from_numpy(seq)
            attention[i, : len(seq)] = 1
            if len(row["ref_log_probs"]) != resp_lens[i]:
                raise ValueError(
                    f"reference sample of prompt {row['prompt_id']!r} has {resp_lens[i]} "
                    f"response tokens but {len(row['ref_log_probs'])} log-probs"
                )
            lps = np.asarray(row["ref_log_probs"], dtype=np.float32)
            ref[i, : resp_lens[i]] = torch.tensor(lps)
            mask[i, : resp_lens[i]] = 1.0
            first = prompt_lens[i] - (total - keep)
            columns[i] = torch.clamp(torch.arange(first, first + width), max=keep - 1)
        return _ReferenceBatch(
            input_ids.to(device),
            attention.to(device),
            keep,
            columns.to(device),
            ref.to(device),
            mask.to(device),
        )
