"""Reading the files a report is built from, when one of them is half written.

A crash or a full disk can leave the last line of ``metrics.jsonl`` or ``results.jsonl``
cut short, or ``summary.json`` torn (files from before divrl wrote them atomically, or
copied while being written). The report goes on without the torn part and says so:

* a torn last JSONL line is dropped with a warning naming the file and the line (as
  ``--resume`` does for ``metrics.jsonl``); a bad line before the last is an error in
  ``results.jsonl`` (the prompts after it would be missing from every paired comparison),
  and in ``metrics.jsonl`` the end of what is shown: the steps before it are kept, with a
  warning naming the file and the line (``stop_at_bad=True``);
* a ``summary.json`` that does not parse leaves its eval set out, with a warning naming
  the file and how to rewrite it (``divrl eval --reuse``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = [
    "ReportInputError",
    "read_json_object",
    "read_records",
    "read_summary",
    "read_yaml_object",
]

logger = logging.getLogger(__name__)


class ReportInputError(ValueError):
    """A file of a run or an evaluation is damaged beyond its last line."""


def read_records(path: str | Path, fix: str, stop_at_bad: bool = False) -> list[dict[str, Any]]:
    """The JSON records of a JSONL file; a torn last line is dropped with a warning that
    ends with ``fix``. A bad line before the last raises :class:`ReportInputError`, or,
    with ``stop_at_bad``, ends the records: those before it are returned, with a warning
    naming the file, the line and how many lines after it are left out."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    numbered = [(i, raw) for i, raw in enumerate(lines, 1) if raw.strip()]
    records = []
    for at, (i, raw) in enumerate(numbered):
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as exc:
            if i == numbered[-1][0]:
                logger.warning("%s: dropping a torn last line %d (%s); %s", path, i, exc, fix)
            elif stop_at_bad:
                logger.warning(
                    "%s: line %d is not a JSON record (%s); the report shows the %d records "
                    "before it and leaves out the %d lines from it on",
                    path,
                    i,
                    exc,
                    len(records),
                    len(numbered) - at,
                )
                break
            else:
                raise ReportInputError(
                    f"{path}: line {i} is not a JSON record ({exc}); {fix}"
                ) from None
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


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON object file (an ``eval_config.json``), {} when absent or unreadable (the
    checks that need it then say what they could not check)."""
    try:
        value = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_yaml_object(path: str | Path) -> dict[str, Any] | None:
    """A YAML mapping file (a run's ``config.yaml``), None when absent or unreadable."""
    import yaml

    try:
        value = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return value if isinstance(value, dict) else None
