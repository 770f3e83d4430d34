"""Reading the files a report is built from, when one of them is half written.

A crash or a full disk can leave the last line of ``metrics.jsonl`` or ``results.jsonl``
cut short, or ``summary.json`` torn (files from before divrl wrote them atomically, or
copied while being written). The report goes on without the torn part and says so:

* a torn last JSONL line is dropped with a warning naming the file and the line (as
  ``--resume`` does for ``metrics.jsonl``); a bad line before the last is an error;
* a ``summary.json`` that does not parse leaves its eval set out, with a warning naming
  the file and how to rewrite it (``divrl eval --reuse``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["ReportInputError", "read_records", "read_summary"]

logger = logging.getLogger(__name__)


class ReportInputError(ValueError):
    """A file of a run or an evaluation is damaged beyond its last line."""


def read_records(path: str | Path, fix: str) -> list[dict[str, Any]]:
    """The JSON records of a JSONL file; a torn last line is dropped with a warning that
    ends with ``fix``."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    numbered = [(i, raw) for i, raw in enumerate(lines, 1) if raw.strip()]
    records = []
    for i, raw in numbered:
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as exc:
            if i != numbered[-1][0]:
                raise ReportInputError(
                    f"{path}: line {i} is not a JSON record ({exc}); {fix}"
                ) from None
            logger.warning("%s: dropping a torn last line %d (%s); %s", path, i, exc, fix)
    return records


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """A ``summary.json``, or None (with a warning) when it is torn or not an object."""
    path = Path(path)
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        summary, why = None, f"damaged or cut short ({exc})"
    else:
        why = "not a JSON object"
    if isinstance(summary, dict):
        return summary
    logger.warning(
        "%s: %s; its eval set is left out of the report. Rewrite it with `divrl eval --reuse "
        "--out %s` (rescores the saved samples)",
        path,
        why,
        path.parent.parent,
    )
    return None
