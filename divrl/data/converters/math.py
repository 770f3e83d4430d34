"""MATH (Hendrycks et al.) and MATH-500 to verl-schema rows (data_source ``math``).

Layouts (``src`` is the folder as shipped):

- MATH: ``<src>/<split>/<subject>/<n>.json``, one problem per file with ``problem`` and
  ``solution``; the gold answer is the last ``\\boxed{}`` of the solution.
- MATH-500 (and other MATH-style JSONL): ``<src>/<split>.jsonl`` with ``problem`` and
  ``answer`` (used when present) or ``solution``. The id is ``unique_id``; a ``unique_id``
  that repeats keeps it on its first row, later rows get ``<unique_id>#<line>``.

Template fields: ``{problem}``.
"""

from __future__ import annotations

import json
from pathlib import Path

from divrl.data.converters import LayoutError, format_prompt, jsonl_rows, require_str, sample_rows
from divrl.data.loading import Example
from divrl.rewards.math_reward import last_boxed

DEFAULT_TEMPLATE = (
    "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
)


def convert(
    src: Path, split: str, *, template: str | None = None, limit: int | None = None, seed: int = 0
) -> list[Example]:
    """Examples of ``split`` under ``src``; see the module docstring for the layouts."""
    src = Path(src)
    rows = sample_rows(_read_rows(src, split), limit, seed)
    template = template or DEFAULT_TEMPLATE
    out = []
    for path, row_id, row in rows:
        problem = require_str(row, "problem", path)
        gold = _gold(row, path)
        extra = {"index": row_id, "split": split}
        for key in ("level", "type", "subject"):
            if isinstance(row.get(key), str | int):
                extra[key] = str(row[key])
        prompt = format_prompt(template, path, problem=problem)
        out.append(
            Example(
                id=row_id,
                prompt=[{"role": "user", "content": prompt}],
                data_source="math",
                ground_truth=gold,
                extra_info=extra,
            )
        )
    return out


def _gold(row: dict, path: Path | str) -> str:
    answer = row.get("answer")
    if isinstance(answer, str | int) and str(answer).strip():
        return str(answer).strip()
    solution = require_str(row, "solution", path)
    boxed = last_boxed(solution)
    if boxed is None or not boxed.strip():
        raise LayoutError(path, "no \\boxed{} answer in the solution (and no 'answer')", "solution")
    return boxed.strip()


def _read_rows(src: Path, split: str) -> list[tuple[Path | str, str, dict]]:
    """(where, id, row) for every problem of the split, in a stable order."""
    folder, jsonl = src / split, src / f"{split}.jsonl"
    if folder.is_dir():
        files = sorted(folder.glob("*/*.json"), key=_file_order)
        if not files:
            raise LayoutError(folder, "no <subject>/<n>.json files (MATH layout)")
        rows = []
        for f in files:
            try:
                row = json.loads(f.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise LayoutError(f, f"not a JSON file: {e}") from None
            rows.append((f, f"math-{split}-{f.parent.name}-{f.stem}", row))
        return rows
    if jsonl.is_file():
        return _unique_ids(_read_jsonl(jsonl, split))
    raise LayoutError(
        src,
        f"no MATH split {split!r}: expected {folder}/<subject>/<n>.json (MATH) or {jsonl} "
        "(MATH-500)",
    )


def _read_jsonl(jsonl: Path, split: str) -> list[tuple[str, str, dict]]:
    """``(where, id, row)``: a row's ``unique_id``, else ``math-<split>-<line>``."""
    rows = []
    for where, line_no, row in jsonl_rows(jsonl):
        uid = row.get("unique_id") if isinstance(row, dict) else None
        rows.append((where, str(uid or f"math-{split}-{line_no}"), row))
    return rows


def _unique_ids(rows: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
    """The rows with unique ids: a ``unique_id`` that repeats keeps its first row's id;
    a later row gets ``<unique_id>#<line>`` (its line in the file), so that a prompt id
    names one prompt (training splits and samples by id)."""
    taken = {row_id for _, row_id, _ in rows}
    seen: set[str] = set()
    out = []
    for where, row_id, row in rows:
        if row_id in seen:
            line = where.rsplit("line ", 1)[-1]
            new_id = f"{row_id}#{line}"
            while new_id in taken:
                new_id += "'"
            taken.add(new_id)
            row_id = new_id
        seen.add(row_id)
        out.append((where, row_id, row))
    return out


def _file_order(path: Path) -> tuple[str, int, str]:
    stem = path.stem
    return (path.parent.name, int(stem) if stem.isdigit() else -1, stem)
