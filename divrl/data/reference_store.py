"""The DPH-RL reference store: presampled responses of the initial policy, on disk.

Layout of a store directory (written once by ``divrl presample``):

- ``samples.parquet``: one row per kept reference response: ``prompt_id``,
  ``prompt_ids`` / ``response_ids`` (token ids), ``ref_log_probs`` (per-token log-probs
  of the response under the initial policy at ``manifest["log_prob_temperature"]``),
  ``text``.
- ``prompts.parquet``: one row per training prompt: ``prompt_id``, ``n_correct`` (of k),
  ``split`` (``near_perfect`` or ``exploration``), ``has_reference``.
- ``manifest.json``: model, sampling settings, threshold and split statistics, and the
  ``fingerprint`` of the model directory and of the prompts (``divrl.data.fingerprint``)
  that :meth:`ReferenceStore.open` compares with a training run (:class:`StoreExpectation`).
"""

from __future__ import annotations

import functools
import glob
import logging
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from divrl.data.store_checks import (
    GENERATION,
    GENERATION_METADATA,
    PROMPT_COLUMNS,
    PROMPT_KEY,
    SAMPLE_COLUMNS,
    empty_store_message,
    file_problems,
    missing_prompts,
    mixed_generations,
    open_parquet,
    read_file,
    read_manifest,
    read_table,
    sample_problems,
)
from divrl.data.store_files import (
    MANIFEST,
    PROMPTS,
    SAMPLES,
    ReferenceStoreError,
    StoreTargetError,
    check_store_target,
    manifest_text,
    new_temp_dir,
    recover_store,
    replace_store_dir,
    store_lock,
    sweep_leftovers,
)
from divrl.data.store_rows import write_samples

__all__ = [
    "ReferenceSample",
    "ReferenceStore",
    "ReferenceStoreError",
    "StoreExpectation",
    "StoreMismatchError",
    "StoreTargetError",
    "write_reference_store",
]

logger = logging.getLogger(__name__)


@dataclass
class ReferenceSample:
    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    ref_log_probs: list[float]
    text: str = ""


def write_reference_store(
    path: str | Path,
    samples: list[ReferenceSample],
    prompts: list[dict[str, Any]],
    manifest: dict[str, Any],
    *,
    overwrite: bool = False,
) -> Path:
    """Write a store whole (a uniquely named temp folder, swapped in under a lock; see
    :mod:`divrl.data.store_files`). An existing store at ``path`` is replaced; anything
    else there is refused with :class:`StoreTargetError` unless ``overwrite``."""
    path = Path(path)
    with store_lock(path):
        sweep_leftovers(path)
        check_store_target(path, overwrite)
        tmp = new_temp_dir(path)
        generation = uuid.uuid4().hex  # in all three files: a reader checks they agree
        try:
            _write_tables(tmp, samples, prompts, {GENERATION_METADATA: generation.encode()})
            text = manifest_text({**manifest, GENERATION: generation})
            (tmp / MANIFEST).write_text(text, encoding="utf-8")
            replace_store_dir(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return path


def _write_tables(
    tmp: Path, samples: list[ReferenceSample], prompts: list[dict], metadata: dict[bytes, bytes]
) -> None:
    sample_table = pa.table(
        {
            "prompt_id": pa.array([s.prompt_id for s in samples], pa.string()),
            "prompt_ids": pa.array([s.prompt_ids for s in samples], pa.list_(pa.int32())),
            "response_ids": pa.array([s.response_ids for s in samples], pa.list_(pa.int32())),
            "ref_log_probs": pa.array([s.ref_log_probs for s in samples], pa.list_(pa.float32())),
            "text": pa.array([s.text for s in samples], pa.string()),
        }
    )
    # small row groups: a trainer reads the rows it draws, not the store (store_rows)
    write_samples(sample_table.replace_schema_metadata(metadata), tmp / SAMPLES)
    prompt_table = pa.table(
        {
            "prompt_id": pa.array([str(p["prompt_id"]) for p in prompts], pa.string()),
            "n_correct": pa.array([int(p["n_correct"]) for p in prompts], pa.int32()),
            "split": pa.array([p["split"] for p in prompts], pa.string()),
            "has_reference": pa.array([bool(p["has_reference"]) for p in prompts], pa.bool_()),
        }
    )
    if prompts and all(p.get("prompt_key") for p in prompts):  # trl_data finds rows by it
        keys = pa.array([p["prompt_key"] for p in prompts], pa.string())
        prompt_table = prompt_table.append_column(PROMPT_KEY, keys)
    pq.write_table(prompt_table.replace_schema_metadata(metadata), tmp / PROMPTS)


#: manifest["sampling"] key -> the config setting it comes from (for messages)
SAMPLING_SETTINGS = {
    "k": "reference.k",
    "temperature": "reference.temperature",
    "top_p": "reference.top_p",
    "response_top_p": "reference.response_top_p",
    "max_new_tokens": "rollout.max_new_tokens",
    "stop": "rollout.stop",
}


class StoreMismatchError(ReferenceStoreError):
    """The reference store was presampled for another model, data or settings."""


@dataclass
class StoreExpectation:
    """What a training run needs a reference store to have been presampled with.

    Every field left ``None`` is not checked.

    Args:
        model: :func:`~divrl.data.fingerprint.model_fingerprint` of the model trained.
        model_name: its path or hub id (for messages).
        prompts: ``(prompt id, prompt token ids)`` of every training prompt.
        sampling: the presample settings, keyed as ``manifest["sampling"]``
            (see :data:`SAMPLING_SETTINGS`).
        threshold: the near-perfect threshold (the split rule), correct of k.
        failed_to_exploration: the other half of the split rule (None: not checked).
        keep_presampled: whether the store also keeps the near-perfect prompts' correct
            presampled responses (``reference.keep_presampled``; None: not checked).
    """

    model: str | None = None
    model_name: str | None = None
    prompts: Sequence[tuple[str, Sequence[int]]] | None = None
    sampling: dict[str, Any] | None = None
    threshold: int | None = None
    failed_to_exploration: bool | None = None
    keep_presampled: bool | None = None

    def fingerprint(self) -> dict[str, Any]:
        """The ``manifest["fingerprint"]`` presample writes for these model and prompts."""
        from divrl.data.fingerprint import prompts_fingerprint

        out: dict[str, Any] = {"model": self.model}
        if self.prompts is not None:
            out["prompts"] = prompts_fingerprint(self.prompts)
            out["prompt_count"] = len(self.prompts)
        return out

    def mismatches(self, store: ReferenceStore) -> list[str]:
        """One line per difference between this run and ``store``'s manifest."""
        manifest, found = store.manifest, []
        stored = manifest.get("fingerprint") or {}
        if self.model is not None and stored.get("model") not in (None, self.model):
            same = str(manifest.get("model")) == str(self.model_name)
            found.append(
                f"model: the files of {self.model_name} changed since presampling"
                if same
                else f"model: presampled from {manifest.get('model')}, "
                f"this run trains {self.model_name}"
            )
        if self.prompts is not None and stored.get("prompts") is not None:
            found += _prompt_mismatches(store, self.prompts, self.fingerprint()["prompts"])
        sampled = manifest.get("sampling") or {}
        for key, value in (self.sampling or {}).items():
            before = sampled.get(key)
            if key == "response_top_p" and before is None:
                before = sampled.get("top_p")  # stores that drew every response at top_p
            if before is not None and _normal(before) != _normal(value):
                name = SAMPLING_SETTINGS.get(key, key)
                found.append(f"{name}: presampled with {before!r}, this run has {value!r}")
        if self.threshold is not None and manifest.get("threshold") not in (None, self.threshold):
            found.append(
                f"reference.threshold (the split rule): presampled with {manifest['threshold']} "
                f"correct of k, this run has {self.threshold}"
            )
        before = manifest.get("failed_to_exploration")
        if self.failed_to_exploration is not None and before not in (
            None,
            self.failed_to_exploration,
        ):
            found.append(
                f"reference.failed_to_exploration (the split rule): presampled with {before}, "
                f"this run has {self.failed_to_exploration}"
            )
        # a store from before the setting existed kept only the extra responses (False)
        kept = manifest.get("keep_presampled", False)
        if self.keep_presampled is not None and kept != self.keep_presampled:
            found.append(
                f"reference.keep_presampled (which responses the store holds): presampled "
                f"with {kept}, this run has {self.keep_presampled}"
            )
        return found


def _normal(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


def _prompt_mismatches(store: ReferenceStore, prompts, digest: str) -> list[str]:
    if store.manifest["fingerprint"]["prompts"] == digest:
        return []
    stored_ids = set(store.prompts["prompt_id"])
    train_ids = [str(pid) for pid, _ in prompts]
    new = [pid for pid in train_ids if pid not in stored_ids]
    gone = stored_ids - set(train_ids)
    if not new and not gone:
        return [
            "data: the same prompt ids, but their prompt tokens differ (the text, the "
            "template, the tokenizer or data.max_prompt_length changed since presampling)"
        ]
    line = (
        f"data: the store was presampled on {len(stored_ids)} prompts, this run trains on "
        f"{len(train_ids)}"
    )
    if new:
        line += f"; {len(new)} training prompts are not in the store (e.g. {', '.join(new[:3])})"
    if gone:
        line += f"; {len(gone)} store prompts are not in the training data"
    line += " (was it presampled with another data.limit or data.train_path?)"
    return [line]


def _no_store_message(path: Path) -> str:
    old = sorted(path.parent.glob(f".{glob.escape(path.name)}.old*/{glob.escape(path.name)}"))
    if old:
        return (
            f"no DPH reference store at {path}: a writer was stopped while replacing it and "
            f"the previous store is in {old[0]}; move it back (mv {old[0]} {path}) or run "
            "`divrl presample <config>` again"
        )
    return (
        f"no DPH reference store at {path}: run `divrl presample <config>` first "
        "(or set reference.store)"
    )


_READ_TRIES = 3  # reads of a store whose files are of different writers before giving up


class ReferenceStore:
    """Read side of a reference store: loaded in memory, or (``load_samples=False``) its
    manifest and prompts loaded and its samples file kept open for reading rows.

    Open one for training with :meth:`open`, which also checks that it can be trained on.
    """

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        temperature: float | None = None,
        expect: StoreExpectation | None = None,
        allow_mismatch: bool = False,
        allow_hint: str = "--allow-store-mismatch (reference.allow_store_mismatch=true)",
        vocab_size: int | None = None,
        load_samples: bool = True,
    ) -> ReferenceStore:
        """The store at ``path``, checked for training: its files read, it holds samples,
        (when ``temperature`` is given) its log-probs were computed at that sampling
        temperature, (when ``expect`` is given) it was presampled from the same model,
        prompts, sampling settings and split rule, and its samples can be trained on
        (:meth:`check_samples`; their prompts are in ``expect.prompts``, their tokens
        below ``vocab_size``).

        Args:
            allow_mismatch: log a differing ``expect`` as a warning instead of raising.
            allow_hint: how the user sets ``allow_mismatch`` (named in the error).
            load_samples: False: the samples are not read into memory; the checks read
                them a few rows at a time and :attr:`samples_file` keeps the file open
                for reading the rows a trainer draws.

        Raises:
            FileNotFoundError: no store at ``path``.
            StoreMismatchError: the store differs from ``expect``.
            ReferenceStoreError: a damaged file, an empty store, log-probs at another
                temperature, or samples that cannot be trained on.
        """
        store = cls(path, load_samples=load_samples)
        if len(store) == 0:
            raise ReferenceStoreError(empty_store_message(store.path, store.manifest))
        stored_t = store.manifest.get("log_prob_temperature")
        mismatch = stored_t is not None and abs(float(stored_t) - (temperature or 0.0)) > 1e-9
        if temperature is not None and mismatch:
            raise ReferenceStoreError(
                f"the reference store's log-probs are at temperature {stored_t} but "
                f"training samples at temperature={temperature}: presample again at "
                f"{temperature} or train at {stored_t}"
            )
        if expect is not None:
            store._check(expect, allow_mismatch, allow_hint)
        prompts = None if expect is None or expect.prompts is None else expect.prompts
        store.check_samples(
            None if prompts is None else [str(pid) for pid, _ in prompts],
            vocab_size,
            allow_other_prompts=allow_mismatch,
        )
        return store

    def _check(self, expect: StoreExpectation, allow_mismatch: bool, allow_hint: str) -> None:
        if "fingerprint" not in self.manifest:
            logger.warning(
                "the reference store %s was written by an older divrl without fingerprints: "
                "its model and data are not checked (presample again to check them)",
                self.path,
            )
        differences = expect.mismatches(self)
        if not differences:
            return
        message = (
            f"the reference store {self.path} does not match this run:\n  - "
            + "\n  - ".join(differences)
            + f"\nPresample again with this run's config and overrides (`divrl presample "
            f"CONFIG [KEY=VALUE ...]` writes {self.path}), point reference.store at a "
            f"matching store, or pass {allow_hint} to train on this store anyway."
        )
        if not allow_mismatch:
            raise StoreMismatchError(message)
        logger.warning("%s (allowed)", message)

    def __init__(self, path: str | Path, *, load_samples: bool = True) -> None:
        self.path = Path(path)
        #: the open samples file, when not loaded (``load_samples=False``)
        self.samples_file: pq.ParquetFile | None = None
        if not (self.path / MANIFEST).is_file():
            recover_store(self.path, lock=True)  # a writer killed in the fallback swap
        for attempt in range(_READ_TRIES):
            # shared with writers' exclusive lock: the three files are of one store; the
            # generation check catches a writer on a filesystem without locks
            with store_lock(self.path, shared=True):
                if not (self.path / MANIFEST).is_file():
                    raise FileNotFoundError(_no_store_message(self.path))
                self.manifest: dict[str, Any] = read_manifest(self.path / MANIFEST)
                self._read_samples(load_samples)
                prompts = read_table(self.path / PROMPTS, PROMPT_COLUMNS, optional=(PROMPT_KEY,))
            schema = self._table if self.samples_file is None else self._schema_table()
            tables = {self.path / SAMPLES: schema, self.path / PROMPTS: prompts}
            mixed = mixed_generations(self.manifest, tables)
            if not mixed:
                break
            if attempt + 1 == _READ_TRIES:
                raise ReferenceStoreError(
                    f"{mixed[0]} is not of the store that {self.path / MANIFEST} describes "
                    f"(another writer replaced the store while it was read, {_READ_TRIES} "
                    "times): wait for the presample that writes it, or presample again"
                )
            time.sleep(0.5 * (attempt + 1))
        self.prompts = prompts.to_pydict()

    def _read_samples(self, load: bool) -> None:
        """Read ``samples.parquet`` whole (checked vectorised), or (not ``load``) open it
        and read its footer only: it stays open, so later reads are of this version of the
        store even after a writer replaces it."""
        if load:
            self.samples_file, self._table = None, read_table(self.path / SAMPLES, SAMPLE_COLUMNS)
        else:
            self.samples_file = open_parquet(self.path / SAMPLES, SAMPLE_COLUMNS)
            self._table = None

    def _schema_table(self) -> pa.Table:
        assert self.samples_file is not None
        return self.samples_file.schema_arrow.empty_table()  # its metadata: the generation

    @property
    def table(self) -> pa.Table:
        """The samples as the Arrow table read from ``samples.parquet`` (columns
        ``prompt_id``, ``prompt_ids``, ``response_ids``, ``ref_log_probs``, ``text``; read
        from :attr:`samples_file` on first use when the store was opened without them)."""
        if self._table is None:
            assert self.samples_file is not None
            self._table = read_file(self.path / SAMPLES, self.samples_file, SAMPLE_COLUMNS)
        return self._table

    @functools.cached_property
    def samples(self) -> list[ReferenceSample]:
        """The samples as Python objects, built on first use (several bytes per token more
        than the Arrow table: a reader that only draws rows can keep :attr:`table`)."""
        columns = self.table.to_pydict()
        return [
            ReferenceSample(*row) for row in zip(*(columns[c] for c in SAMPLE_COLUMNS), strict=True)
        ]

    def check_samples(
        self,
        prompt_ids: Sequence[str] | None = None,
        vocab_size: int | None = None,
        allow_other_prompts: bool = False,
    ) -> None:
        """Raise :class:`ReferenceStoreError` naming every fault that makes the samples
        unusable for training: non-finite log-probs, log-probs not one per response token,
        token ids outside ``vocab_size``, and prompt ids not in ``prompt_ids`` (the
        training data; only a warning with ``allow_other_prompts``)."""
        if self.samples_file is not None and self._table is None:  # a few rows at a time
            found = file_problems(self.path / SAMPLES, self.samples_file, vocab_size)
        else:
            found = sample_problems(self._table, vocab_size)
        other = None if prompt_ids is None else missing_prompts(self._prompt_ids(), prompt_ids)
        if other is not None and allow_other_prompts:
            logger.warning("the reference store %s: %s (allowed)", self.path, other)
        elif other is not None:
            found.append(other)
        if found:
            raise ReferenceStoreError(
                f"{self.path / SAMPLES}: cannot be trained on: {'; '.join(found)}. Presample "
                "again with this run's model and data: `divrl presample CONFIG --overwrite`"
            )

    def _prompt_ids(self) -> list[str]:
        if self._table is None:
            assert self.samples_file is not None
            column = read_file(self.path / SAMPLES, self.samples_file, ["prompt_id"])
        else:
            column = self._table.select(["prompt_id"])
        return column.column("prompt_id").to_pylist()

    def __len__(self) -> int:
        if self._table is None:
            assert self.samples_file is not None
            return self.samples_file.metadata.num_rows
        return self._table.num_rows

    @functools.cached_property
    def exploration_ids(self) -> set[str]:
        """Prompt ids that training rolls out (D_exp), computed once."""
        return {
            pid
            for pid, split in zip(self.prompts["prompt_id"], self.prompts["split"], strict=True)
            if split == "exploration"
        }
