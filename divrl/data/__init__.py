"""Datasets: load/validate verl-schema examples, prompt templates, shipped fixtures.

See docs/data.md. The toy world's generators live with the rest of the toy world
(``divrl.toy.toy_sql``, ``divrl.toy.toy_math``).
"""

from __future__ import annotations

from pathlib import Path

from divrl.data.loading import (
    DataValidationError,
    Example,
    LoadedExamples,
    example_to_row,
    load_examples,
    write_examples,
)
from divrl.data.templates import (
    R1_TEMPLATE,
    prompt_messages,
    prompt_text,
    register_template,
    render_prompt,
    template_names,
)

FIXTURES_DIR = Path(__file__).parent / "fixtures"


def fixture_path(name: str = "") -> Path:
    """Path of a file shipped in ``divrl/data/fixtures`` (e.g. ``"math.jsonl"``).

    Files: ``math.jsonl`` and ``sql.jsonl`` (verl schema), ``math_flat.jsonl`` (flat form),
    ``math_completions.jsonl`` and ``sql_completions.jsonl`` (sample completions for
    ``divrl score``), ``databases/*.sqlite``. Regenerate with ``scripts/make_fixtures.py``.
    """
    path = FIXTURES_DIR / name
    if not path.exists():
        available = sorted(p.relative_to(FIXTURES_DIR).as_posix() for p in FIXTURES_DIR.rglob("*"))
        raise FileNotFoundError(f"no fixture {name!r}; available: {available}")
    return path


__all__ = [
    "FIXTURES_DIR",
    "R1_TEMPLATE",
    "DataValidationError",
    "Example",
    "LoadedExamples",
    "example_to_row",
    "fixture_path",
    "load_examples",
    "prompt_messages",
    "prompt_text",
    "register_template",
    "render_prompt",
    "template_names",
    "write_examples",
]
