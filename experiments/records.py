"""The experiment scripts' JSON files: written atomically, read whole or refused in one line.

A result file is written through :func:`divrl.fileio.atomic_write_text` (a temporary file,
fsynced, renamed), so a kill leaves the previous file or none, never half of one. A file
that does not parse (torn by an older writer, or edited by hand) is refused with
:class:`ResultError`, one line naming it; each script's ``main`` prints that line and
exits 2. :func:`refuse_other_settings` compares the settings a result was made with, as a
whole, with the settings of the command that would reuse it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from divrl.fileio import atomic_write_text

__all__ = ["ResultError", "read_result", "refuse_other_settings", "write_result"]


class ResultError(ValueError):
    """A result file that cannot be used as asked; the message names it and what to do."""


def read_result(path: str | Path, default: Any = None) -> Any:
    """The JSON value in ``path`` (``default`` when there is no such file)."""
    path = Path(path)
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultError(
            f"{path} is not a whole JSON file ({exc}): a kill while an older version wrote "
            "it, or an edit? Move it away to make it again"
        ) from None


def write_result(path: str | Path, data: Any, *, indent: int = 1) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (its folder made first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(data, indent=indent) + "\n")


def refuse_other_settings(path: Path, saved: Any, settings: dict[str, Any], fix: str) -> None:
    """Raise :class:`ResultError` unless ``saved`` (the settings recorded with the result
    in ``path``) equals ``settings``, naming every setting that differs and ``fix``."""
    if saved == settings:
        return
    if not isinstance(saved, dict):
        raise ResultError(f"{path} records no settings (an older version made it): {fix}")
    differ = [
        f"{k}: {saved.get(k)!r} there, {settings.get(k)!r} now"
        for k in sorted(set(saved) | set(settings))
        if saved.get(k) != settings.get(k)
    ]
    raise ResultError(f"{path} was made with other settings ({'; '.join(differ)}): {fix}")
