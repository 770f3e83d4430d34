"""Reading a reference store's files and checking that its samples can be trained on.

A damaged file (a truncated parquet, a manifest that is not JSON) and samples that would
make training skip or crash (non-finite log-probs, log-probs not one per response token,
token ids outside the model's vocabulary, prompts that are not in the training data) are
one :class:`~divrl.data.store_files.ReferenceStoreError` naming the file and the fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from divrl.data.store_files import ReferenceStoreError

__all__ = [
    "PROMPT_COLUMNS",
    "PROMPT_KEY",
    "SAMPLE_COLUMNS",
    "empty_store_message",
    "file_problems",
    "missing_prompts",
    "open_parquet",
    "read_file",
    "read_manifest",
    "read_table",
    "sample_problems",
]

SAMPLE_COLUMNS = ("prompt_id", "prompt_ids", "response_ids", "ref_log_probs", "text")
PROMPT_COLUMNS = ("prompt_id", "n_correct", "split", "has_reference")
#: the optional column of every prompt's fingerprint (divrl.data.fingerprint.prompt_key);
#: stores written before it lack it
PROMPT_KEY = "prompt_key"
AGAIN = "presample again: `divrl presample CONFIG --overwrite`"


#: the manifest key and the parquet metadata key of a store's generation: one id that its
#: writer puts in all three files (stores from before it have none and are not checked)
GENERATION, GENERATION_METADATA = "generation", b"divrl_store_generation"


def mixed_generations(manifest: dict[str, Any], tables: dict[Path, pa.Table]) -> list[Path]:
    """The files among ``tables`` written by another writer than ``manifest`` (empty when
    all are of one store, or the manifest has no generation)."""
    generation = manifest.get(GENERATION)
    if not isinstance(generation, str):
        return []
    return [
        path
        for path, table in tables.items()
        if (table.schema.metadata or {}).get(GENERATION_METADATA) != generation.encode()
    ]


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReferenceStoreError(
            f"{path}: damaged or truncated store manifest ({exc}); {AGAIN}"
        ) from None
    if not isinstance(manifest, dict):
        raise ReferenceStoreError(
            f"{path}: the store manifest is a JSON {type(manifest).__name__}, not an object; "
            f"{AGAIN}"
        )
    return manifest


def _damaged(path: Path, exc: Exception) -> ReferenceStoreError:
    return ReferenceStoreError(
        f"{path}: damaged or truncated ({' '.join(str(exc).split())}); {AGAIN}"
    )


def _absent(path: Path, names: Sequence[str], columns: Sequence[str]) -> None:
    absent = [c for c in columns if c not in names]
    if absent:
        raise ReferenceStoreError(f"{path}: no column {', '.join(absent)}; {AGAIN}")


def read_table(path: Path, columns: Sequence[str], optional: Sequence[str] = ()) -> pa.Table:
    """The parquet file's ``columns`` (and those of ``optional`` it has); a missing, damaged
    or truncated file, or a missing column, is a :class:`ReferenceStoreError` naming the
    file."""
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise ReferenceStoreError(f"{path}: missing from the reference store; {AGAIN}") from None
    except (pa.ArrowException, OSError) as exc:
        raise _damaged(path, exc) from None
    _absent(path, table.column_names, columns)
    return table.select([*columns, *(c for c in optional if c in table.column_names)])


def open_parquet(path: Path, columns: Sequence[str]) -> pq.ParquetFile:
    """The parquet file open (its footer read, its data not), with the errors of
    :func:`read_table`; the file stays open, so what is read later is this version of it."""
    try:
        # pre_buffer would keep every row group's bytes read so far while iterating
        file = pq.ParquetFile(pa.OSFile(str(path)), pre_buffer=False)
    except FileNotFoundError:
        raise ReferenceStoreError(f"{path}: missing from the reference store; {AGAIN}") from None
    except (pa.ArrowException, OSError) as exc:
        raise _damaged(path, exc) from None
    _absent(path, file.schema_arrow.names, columns)
    return file


def read_file(path: Path, file: pq.ParquetFile, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the open parquet ``file`` (at ``path``, for the error), whole."""
    try:
        return file.read(columns=list(columns))
    except (pa.ArrowException, OSError) as exc:
        raise _damaged(path, exc) from None


def _rows(rows: list[int]) -> str:
    shown = ", ".join(str(r) for r in rows[:5])
    return f"rows {shown}{', ...' if len(rows) > 5 else ''}"


def _rows_of(column: pa.ChunkedArray, bad) -> list[int]:
    """The rows of a list column with a value for which ``bad`` (on the flat values) is
    true; a null value counts as bad."""
    flat = pc.list_flatten(column)
    mask = pc.fill_null(bad(flat), True)
    rows = pc.filter(pc.list_parent_indices(column), mask)
    return sorted(set(rows.to_pylist()))


@dataclass
class _Faults:
    """The 0-based rows of each kind of fault (see :func:`sample_problems`)."""

    nonfinite: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    worst: int | None = None  # the largest token id outside the vocabulary

    def add(self, other: _Faults, offset: int) -> None:
        """``other``'s faults, found in rows that start at row ``offset`` of this table."""
        self.nonfinite += [r + offset for r in other.nonfinite]
        self.lengths += [r + offset for r in other.lengths]
        self.tokens += [r + offset for r in other.tokens]
        if other.worst is not None:
            self.worst = other.worst if self.worst is None else max(self.worst, other.worst)


def _faults(table: pa.Table, vocab_size: int | None) -> _Faults:
    lps, resp = table.column("ref_log_probs"), table.column("response_ids")
    differ = pc.not_equal(pc.list_value_length(lps), pc.list_value_length(resp))
    faults = _Faults(
        nonfinite=_rows_of(lps, lambda v: pc.invert(pc.is_finite(v))),
        lengths=pc.indices_nonzero(pc.fill_null(differ, True)).to_pylist(),
    )
    if vocab_size is not None:
        outside = lambda v: pc.or_(pc.less(v, 0), pc.greater_equal(v, vocab_size))  # noqa: E731
        faults.tokens = sorted(
            set(_rows_of(resp, outside)) | set(_rows_of(table.column("prompt_ids"), outside))
        )
        flat = pa.concat_arrays(
            [pc.list_flatten(c).combine_chunks() for c in (resp, table.column("prompt_ids"))]
        )
        faults.worst = pc.max(pc.filter(flat, pc.fill_null(outside(flat), False))).as_py()
    return faults


def _phrases(faults: _Faults, vocab_size: int | None) -> list[str]:
    found = []
    if faults.nonfinite:
        rows = faults.nonfinite
        found.append(f"{len(rows)} samples have non-finite ref_log_probs ({_rows(rows)})")
    if faults.lengths:
        found.append(
            f"{len(faults.lengths)} samples do not have one ref_log_prob per response token "
            f"({_rows(faults.lengths)})"
        )
    if faults.tokens:
        found.append(
            f"{len(faults.tokens)} samples hold token ids outside the model's vocabulary of "
            f"{vocab_size} (e.g. {faults.worst}; {_rows(faults.tokens)}): presampled with "
            "another tokenizer?"
        )
    return found


def sample_problems(table: pa.Table, vocab_size: int | None = None) -> list[str]:
    """One phrase per kind of fault in a ``samples.parquet`` table, with the 0-based rows
    of the first few (vectorised with ``pyarrow.compute``: no Python loop over tokens)."""
    return _phrases(_faults(table, vocab_size), vocab_size)


#: rows checked at a time by :func:`file_problems` (~12 MB decoded at 4,096 tokens a row)
CHECK_ROWS = 256


def file_problems(path: Path, file: pq.ParquetFile, vocab_size: int | None = None) -> list[str]:
    """:func:`sample_problems` of the open parquet ``file`` (at ``path``), read
    :data:`CHECK_ROWS` rows at a time: the whole table is never in memory."""
    total, offset = _Faults(), 0
    columns = ["prompt_ids", "response_ids", "ref_log_probs"]
    try:
        for batch in file.iter_batches(batch_size=CHECK_ROWS, columns=columns, use_threads=False):
            total.add(_faults(pa.Table.from_batches([batch]), vocab_size), offset)
            offset += batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise _damaged(path, exc) from None
    return _phrases(total, vocab_size)


def missing_prompts(sample_ids: Iterable[str], prompt_ids: Iterable[str]) -> str | None:
    """A phrase naming the samples' prompt ids (``sample_ids``) that are not in
    ``prompt_ids``, or None."""
    known = set(prompt_ids)
    absent = sorted({pid for pid in sample_ids if pid not in known})
    if not absent:
        return None
    shown = ", ".join(absent[:5]) + (", ..." if len(absent) > 5 else "")
    return (
        f"{len(absent)} prompt ids of the samples are not in the training data ({shown}): "
        "presampled on other data?"
    )


def empty_store_message(path: Path, manifest: dict[str, Any]) -> str:
    """Why a store holds no samples and what to change (the same words presample warns
    with)."""
    stats = manifest.get("stats") or {}
    near = stats.get("near_perfect")
    why = (
        f" (near-perfect prompts: {near} of {stats.get('prompts')}; presample accuracy "
        f"{stats.get('presample_accuracy', 0):.3f})"
        if near is not None
        else ""
    )
    return (
        f"the reference store {path} holds no samples{why}: {what_to_change(manifest)}, "
        f"then {AGAIN}"
    )


def what_to_change(manifest: dict[str, Any]) -> str:
    threshold = manifest.get("threshold")
    k = (manifest.get("sampling") or {}).get("k")
    lower = f" (now {threshold} of {k})" if threshold is not None and k is not None else ""
    return (
        f"lower reference.threshold{lower}, set reference.keep_presampled=true (keeps the "
        "presampled correct responses too), raise reference.k or data.limit for more "
        "samples, or start from a stronger model"
    )
