"""What a data file holds and what training would make of it, before any model runs
(``divrl data check``).

Each check adds one-line problems (the file cannot be trained on as it is: the command
exits 2 and prints them) or summary lines (what is there, what the settings would drop or
truncate). The rows are validated as :func:`divrl.data.loading.load_examples` validates
them for training, every bad row listed instead of the first one raised.
"""

from __future__ import annotations

import sqlite3
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.data.loading import Example, LoadedExamples, load_examples
from divrl.data.prompts import PromptSettings
from divrl.data.templates import render_prompt

__all__ = ["CheckResult", "check_answers", "check_databases", "check_lengths", "check_rows"]

SHOWN = 10  # problems of one kind listed one per line; the rest are counted


@dataclass
class CheckResult:
    """Problems (each one line; any of them makes the check fail) and summary lines."""

    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add_problems(self, what: str, found: list[str]) -> None:
        """``found`` one line each, the first :data:`SHOWN` of them, then a count."""
        self.problems += found[:SHOWN]
        if len(found) > SHOWN:
            self.problems.append(f"... and {len(found) - SHOWN} more {what}")


def check_rows(path: str | Path, db_dir: str | None, result: CheckResult) -> LoadedExamples:
    """Validate every row; the valid ones are returned, the others listed as problems,
    and so are ids used by several rows (training refuses them) and repeated prompts."""
    examples = load_examples(path, db_dir=db_dir, skip_invalid=True, refuse_duplicates=False)
    result.add_problems("invalid rows", list(examples.errors))
    if examples.n_skipped > len(examples.errors):
        result.problems.append(
            f"... {examples.n_skipped - len(examples.errors)} more invalid rows not listed"
        )
    sources: dict[str, int] = defaultdict(int)
    for ex in examples:
        sources[ex.data_source] += 1
    by_source = ", ".join(f"{s} {n}" for s, n in sorted(sources.items()))
    result.lines.append(
        f"rows: {examples.n_rows} read, {len(examples)} valid"
        + (f" ({by_source})" if by_source else "")
    )
    result.add_problems(
        "ids used by several rows",
        [
            f"{path}: id {i!r} is used by rows {', '.join(map(str, rows))}: give every row a "
            "unique top-level 'id' (or extra_info.index)"
            for i, rows in examples.duplicate_ids.items()
        ],
    )
    _note_repeated_prompts(examples, result)
    return examples


def _note_repeated_prompts(examples: list[Example], result: CheckResult) -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for ex in examples:
        seen[repr(ex.prompt)].append(ex.id)
    repeated = [ids for ids in seen.values() if len(ids) > 1]
    if not repeated:
        result.lines.append("repeated prompts: none")
        return
    shown = "; ".join(", ".join(map(repr, ids[:4])) for ids in repeated[:3])
    result.lines.append(
        f"repeated prompts: {len(repeated)} prompt(s) appear in several rows (ids {shown}"
        f"{'; ...' if len(repeated) > 3 else ''}): each is trained on as often as it appears"
    )


def check_databases(examples: list[Example], result: CheckResult) -> None:
    """Open every SQLite database the rows name, read-only, and list its tables."""
    paths = sorted({str(ex.extra_info["db_path"]) for ex in examples if "db_path" in ex.extra_info})
    if not paths:
        return
    bad, tables = [], 0
    for path in paths:
        try:
            tables += _table_count(path)
        except sqlite3.Error as e:
            bad.append(f"{path}: cannot be read as an SQLite database, read-only ({e})")
    result.add_problems("unreadable databases", bad)
    result.lines.append(
        f"databases: {len(paths)} found, {len(paths) - len(bad)} opened read-only "
        f"({tables} table(s))"
    )


def _table_count(path: str) -> int:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    connection = sqlite3.connect(uri, uri=True)
    try:
        query = "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
        return int(connection.execute(query).fetchone()[0])
    finally:
        connection.close()


def check_answers(examples: list[Example], result: CheckResult, unusable=None) -> None:
    """Each ground truth as its data source's verifier reads it (``check_inputs``), and,
    with ``unusable`` (examples -> a reason or None per example), what else makes a gold
    answer unusable (the command passes the answer equivalence's own test)."""
    from divrl.rewards import get_verifier

    bad = []
    for ex in examples:
        try:
            get_verifier(ex.data_source)[1].check_inputs(ex.ground_truth, ex.extra_info)
        except ValueError as e:
            bad.append(f"row id {ex.id!r}: ground truth {ex.ground_truth!r:.60}: {e}")
    if unusable is not None:
        for ex, reason in zip(examples, unusable(examples), strict=True):
            if reason is not None:
                bad.append(f"row id {ex.id!r}: ground truth {ex.ground_truth!r:.60}: {reason}")
    result.add_problems("unusable ground truths", bad)
    result.lines.append(f"answers: {len(examples) - len(bad)} of {len(examples)} usable")


def check_lengths(
    examples: list[Example],
    tokenizer: Any,
    data: PromptSettings,
    result: CheckResult,
    context: int | None = None,
) -> int:
    """Render and tokenise every prompt as training would; say what ``data.*`` does to the
    ones over ``data.max_prompt_length``. Returns how many prompts training would keep."""
    from divrl.data.templates import TemplateError

    lengths = []
    for ex in examples[: data.limit] if data.limit else examples:
        try:
            text = render_prompt(ex, template=data.template, tokenizer=tokenizer)
        except TemplateError as e:
            result.problems.append(str(e))
            return 0
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    if not lengths:
        return 0
    over = sum(n > data.max_prompt_length for n in lengths)
    kept = len(lengths) - over if data.truncation == "drop" else len(lengths)
    limit = f", data.limit={data.limit}" if data.limit else ""
    result.lines.append(
        f"prompt tokens ({data.template!r} template{limit}): {min(lengths)} to {max(lengths)}, "
        f"median {statistics.median(lengths):g}; data.max_prompt_length={data.max_prompt_length}"
    )
    action = {"error": "refused", "drop": "dropped", "left": "left-truncated"}[data.truncation]
    if over and data.truncation == "error":
        kept = 0
    result.lines.append(
        f"over the limit: {over} of {len(lengths)} ({action}, data.truncation="
        f"{data.truncation}); {kept} prompts would train"
    )
    if over and data.truncation == "error":
        result.problems.append(
            f"{over} prompts are longer than data.max_prompt_length={data.max_prompt_length} "
            f"tokens (the longest {max(lengths)}) and data.truncation=error refuses them: raise "
            "data.max_prompt_length, or set data.truncation=drop or data.truncation=left"
        )
    capped = [min(n, data.max_prompt_length) for n in lengths]
    if context is not None and max(capped) >= context:
        result.problems.append(
            f"prompts of {max(capped)} tokens leave no room for a response in the model's "
            f"context of {context} tokens: set data.max_prompt_length below {context}"
        )
    return kept
