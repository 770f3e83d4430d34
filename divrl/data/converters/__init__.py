"""Converters from benchmarks' official file layouts to verl-schema examples.

Each converter is a module with ``convert(src, split, *, template, limit, seed) ->
list[Example]`` (``src``: the folder as the benchmark ships it; ``template``: the prompt
wording, a ``str.format`` string with the converter's fields, or ``None`` for its default;
``limit``: keep a random sample of that many rows, chosen with ``seed``, in source order).
``divrl data convert <name>`` runs one and writes the rows (see docs/data.md).

A converter is a benchmark profile's ``converter`` hook, found under the profile's name
(:mod:`divrl.profiles`): the built-in ``math``, ``gsm8k``, ``bird`` and ``spider`` are
registered in :mod:`divrl.rewards.builtin_profiles`, and
:func:`divrl.profiles.register_profile` adds one.
"""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path
from types import ModuleType
from typing import Any


class LayoutError(ValueError):
    """The source folder is not in the benchmark's layout; names the file and the field."""

    def __init__(self, path: Path | str, message: str, fieldname: str | None = None):
        where = f"{path}: field {fieldname!r}: " if fieldname else f"{path}: "
        super().__init__(where + message)
        self.path = str(path)
        self.field = fieldname


def converter_names() -> list[str]:
    """The names of the benchmark profiles that have a converter, sorted."""
    from divrl.profiles import get_profile, profile_names

    return [n for n in profile_names() if get_profile(n).converter is not None]


def get_converter(name: str) -> ModuleType:
    """The converter (a module, or anything with ``convert``) of benchmark profile ``name``;
    ``ValueError`` listing the known names."""
    from divrl.profiles import profile_hook

    hook = profile_hook(name, "converter")
    if hook is None:
        raise ValueError(f"unknown converter {name!r}; available: {', '.join(converter_names())}")
    return importlib.import_module(hook) if isinstance(hook, str) else hook


def sample_rows(rows: list[Any], limit: int | None, seed: int) -> list[Any]:
    """``limit`` rows drawn with ``seed`` (all rows when ``limit`` is None), in source order."""
    if limit is None or limit >= len(rows):
        return list(rows)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    keep = sorted(random.Random(seed).sample(range(len(rows)), limit))
    return [rows[i] for i in keep]


def jsonl_rows(path: Path) -> list[tuple[str, int, Any]]:
    """``(where, line number, parsed row)`` of each non-blank line of a JSONL file, where
    ``where`` names the file and line for errors.

    Raises:
        LayoutError: a line that is not UTF-8 (read as bytes, so that the line is named
            rather than the file failing to decode) or not JSON.
    """
    rows = []
    with Path(path).open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            where = f"{path}: line {line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise LayoutError(where, f"invalid UTF-8 at byte column {e.start + 1}") from None
            if not line.strip():
                continue
            try:
                rows.append((where, line_no, json.loads(line)))
            except json.JSONDecodeError as e:
                raise LayoutError(where, f"invalid JSON ({e.msg})") from None
    return rows


def format_prompt(template: str, path: Path | str, **fields: str) -> str:
    """``template.format(**fields)``; a template naming another field is a clear error."""
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"template {template!r:.80} cannot be filled from {path}: {e!r}; "
            f"available fields: {', '.join('{' + k + '}' for k in fields)}"
        ) from None


def require_str(row: Any, key: str, path: Path | str, what: str = "row") -> str:
    """``row[key]`` as a non-empty string, else a :class:`LayoutError` naming file and field."""
    if not isinstance(row, dict):
        raise LayoutError(path, f"expected a JSON object per {what}, got {type(row).__name__}")
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        found = ", ".join(sorted(map(str, row))) or "none"
        raise LayoutError(path, f"missing or not a string (fields found: {found})", key)
    return value
