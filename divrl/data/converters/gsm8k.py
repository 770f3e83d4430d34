"""GSM8K to verl-schema rows (data_source ``gsm8k``, the ``gsm8k`` reward profile).

Layout: ``<src>/<split>.jsonl`` (or ``<src>/data/<split>.jsonl``, as in openai's
grade-school-math repository) with ``question`` and ``answer``; the answer's text after
its last ``####`` is the gold number (thousands separators removed).

Template fields: ``{question}``.
"""

from __future__ import annotations

import re
from pathlib import Path

from divrl.data.converters import LayoutError, format_prompt, jsonl_rows, require_str, sample_rows
from divrl.data.loading import Example

DEFAULT_TEMPLATE = (
    '{question}\n\nLet\'s think step by step and output the final answer after "####".'
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def convert(
    src: Path, split: str, *, template: str | None = None, limit: int | None = None, seed: int = 0
) -> list[Example]:
    """Examples of ``split`` under ``src``; see the module docstring for the layout."""
    src = Path(src)
    candidates = [src / f"{split}.jsonl", src / "data" / f"{split}.jsonl"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise LayoutError(
            src, f"no GSM8K split {split!r}: expected {' or '.join(map(str, candidates))}"
        )
    rows = jsonl_rows(path)
    template = template or DEFAULT_TEMPLATE
    out = []
    for where, line_no, row in sample_rows(rows, limit, seed):
        question = require_str(row, "question", where)
        answer = require_str(row, "answer", where)
        gold = answer.rsplit("####", 1)[-1].strip().replace(",", "") if "####" in answer else ""
        if not _NUMBER.fullmatch(gold):
            raise LayoutError(where, "no '#### <number>' at the end of the answer", "answer")
        out.append(
            Example(
                id=f"gsm8k-{split}-{line_no}",
                prompt=[
                    {"role": "user", "content": format_prompt(template, where, question=question)}
                ],
                data_source="gsm8k",
                ground_truth=gold,
                extra_info={"index": f"gsm8k-{split}-{line_no}", "split": split},
            )
        )
    return out
