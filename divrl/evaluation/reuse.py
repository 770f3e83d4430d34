"""``divrl eval --reuse``: reading back the samples of an earlier evaluation, whole or not
at all.

``samples.jsonl`` holds one line per prompt with its ``n`` samples; ``eval_config.json``
records ``n`` and (since this check) the number of prompts. A file cut short (a torn last
line, lines missing at the end, a prompt with fewer than ``n`` samples) would be scored
as if the remaining prompts were the whole set, so it is refused with what is missing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["IncompleteSamplesError", "read_eval_meta", "read_samples_for_reuse"]

logger = logging.getLogger(__name__)


class IncompleteSamplesError(ValueError):
    """``samples.jsonl`` does not hold every prompt's samples (or is not readable)."""


def _again(path: Path) -> str:
    return (
        f"run `divrl eval` without --reuse to sample again (or delete {path.parent} and "
        "evaluate it afresh)"
    )


def _parse_lines(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The records, and a note on a torn last line (a write cut short) if there is one."""
    lines = path.read_bytes().split(b"\n")
    numbered = [(i, raw) for i, raw in enumerate(lines, 1) if raw.strip()]
    records, torn = [], None
    for i, raw in numbered:
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            if i == numbered[-1][0]:
                torn = f"line {i} is cut short"
                break
            raise IncompleteSamplesError(
                f"{path}: line {i}: not a JSON record ({exc}); {_again(path)}"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("samples"), list):
            raise IncompleteSamplesError(
                f"{path}: line {i}: field 'samples': not a prompt record of divrl eval; "
                f"{_again(path)}"
            )
        records.append(record)
    return records, torn


def read_samples_for_reuse(path: str | Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt records of ``path`` (``samples.jsonl``), each with the ``n`` samples
    and the prompt count recorded in ``meta`` (``eval_config.json``); anything less raises
    :class:`IncompleteSamplesError` naming what is missing."""
    path = Path(path)
    records, torn = _parse_lines(path)
    config = meta.get("config") or {}
    n = config.get("n") or max((len(r["samples"]) for r in records), default=0)
    problems = [torn] if torn else []
    expected = meta.get("prompts")
    if isinstance(expected, int) and len(records) < expected:
        problems.append(f"{len(records)} of the {expected} prompts sampled are there")
    short = [str(r.get("id", "?")) for r in records if len(r["samples"]) < n]
    if short:
        shown = ", ".join(short[:5]) + (", ..." if len(short) > 5 else "")
        problems.append(f"{len(short)} prompts have fewer than n={n} samples ({shown})")
    if not records and not problems:
        problems.append("it holds no prompt")
    if problems:
        raise IncompleteSamplesError(
            f"--reuse: {path} is incomplete: {'; '.join(problems)}; {_again(path)}"
        )
    if expected is None:
        logger.warning(
            "reusing %s: written by an older divrl that did not record its prompt count; "
            "prompts missing at the end of the file cannot be detected",
            path,
        )
    return records


def read_eval_meta(path: str | Path) -> dict[str, Any]:
    """``eval_config.json`` of an earlier evaluation ({} when there is none)."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise IncompleteSamplesError(f"{path}: damaged ({exc}); {_again(path)}") from None
    if not isinstance(meta, dict):
        raise IncompleteSamplesError(f"{path}: not a JSON object; {_again(path)}")
    return meta
