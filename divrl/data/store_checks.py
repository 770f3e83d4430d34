"""Reading a reference store's files and checking that its samples can be trained on.

A damaged file (a truncated parquet, a manifest that is not JSON) and samples that would
make training skip or crash (non-finite log-probs, log-probs not one per response token,
token ids outside the model's vocabulary, prompts that are not in the training data) are
one :class:`~divrl.data.store_files.ReferenceStoreError` naming the file and the fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from divrl.data.store_files import ReferenceStoreError

__all__ = [
    "PROMPT_COLUMNS",
    "SAMPLE_COLUMNS",
    "empty_store_message",
    "missing_prompts",
    "read_manifest",
    "read_table",
    "sample_problems",
]

SAMPLE_COLUMNS = ("prompt_id", "prompt_ids", "response_ids", "ref_log_probs", "text")
PROMPT_COLUMNS = ("prompt_id", "n_correct", "split", "has_reference")
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


def read_table(path: Path, columns: Sequence[str]) -> pa.Table:
    """The parquet file's ``columns``; a missing, damaged or truncated file, or a missing
    column, is a :class:`ReferenceStoreError` naming the file."""
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise ReferenceStoreError(f"{path}: missing from the reference store; {AGAIN}") from None
    except (pa.ArrowException, OSError) as exc:
        raise ReferenceStoreError(
            f"{path}: damaged or truncated ({' '.join(str(exc).split())}); {AGAIN}"
        ) from None
    absent = [c for c in columns if c not in table.column_names]
    if absent:
        raise ReferenceStoreError(f"{path}: no column {', '.join(absent)}; {AGAIN}")
    return table.select(list(columns))


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


def sample_problems(table: pa.Table, vocab_size: int | None = None) -> list[str]:
    """One phrase per kind of fault in a ``samples.parquet`` table, with the 0-based rows
    of the first few (vectorised with ``pyarrow.compute``: no Python loop over tokens)."""
    lps, resp = table.column("ref_log_probs"), table.column("response_ids")
    differ = pc.not_equal(pc.list_value_length(lps), pc.list_value_length(resp))
    lengths = pc.indices_nonzero(pc.fill_null(differ, True)).to_pylist()
    nonfinite = _rows_of(lps, lambda v: pc.invert(pc.is_finite(v)))
    tokens, worst = [], None
    if vocab_size is not None:
        outside = lambda v: pc.or_(pc.less(v, 0), pc.greater_equal(v, vocab_size))  # noqa: E731
        tokens = sorted(
            set(_rows_of(resp, outside)) | set(_rows_of(table.column("prompt_ids"), outside))
        )
        flat = pa.concat_arrays(
            [pc.list_flatten(c).combine_chunks() for c in (resp, table.column("prompt_ids"))]
        )
        worst = pc.max(pc.filter(flat, pc.fill_null(outside(flat), False))).as_py()
    found = []
    if nonfinite:
        found.append(f"{len(nonfinite)} samples have non-finite ref_log_probs ({_rows(nonfinite)})")
    if lengths:
        found.append(
            f"{len(lengths)} samples do not have one ref_log_prob per response token "
            f"({_rows(lengths)})"
        )
    if tokens:
        found.append(
            f"{len(tokens)} samples hold token ids outside the model's vocabulary of "
            f"{vocab_size} (e.g. {worst}; {_rows(tokens)}): presampled with another tokenizer?"
        )
    return found


def missing_prompts(samples: Sequence[Any], prompt_ids: Iterable[str]) -> str | None:
    """A phrase naming the samples' prompt ids that are not in ``prompt_ids``, or None."""
    known = set(prompt_ids)
    absent = sorted({s.prompt_id for s in samples if s.prompt_id not in known})
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
