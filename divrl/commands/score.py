"""``divrl score``: score a JSONL of completions against a dataset.

Completions file: one JSON object per line with an id (``id``; ``index`` also accepted)
matching an example of ``--data``, and ``completion`` (a string) or ``completions`` (a
string or a list of strings). Output (``--out``): one line per input line with ``id``,
``scores``, ``reasons``, ``extracted`` (lists, one entry per completion) and ``score``
(their mean).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from divrl.data import load_examples
from divrl.fileio import atomic_write_lines
from divrl.rewards import ScoreRequest, score_batch
from divrl.rewards.scoring import check_timeout
from divrl.rewards.types import DECIDED_REASONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="dataset: .jsonl, .parquet or datasets dir")
    parser.add_argument(
        "--completions", required=True, help="JSONL with id + completion(s) per line"
    )
    parser.add_argument("--out", help="write per-row scores to this JSONL file")
    parser.add_argument("--db-dir", help="database directory for SQL rows that give a db_id")
    parser.add_argument(
        "--skip-invalid", action="store_true", help="skip (and count) invalid dataset rows"
    )
    parser.add_argument(
        "--timeout",
        type=_timeout_arg,
        default=None,
        help="hard limit per completion, seconds, finite and > 0 (default: the verifier's, "
        "5 s for math, 2 s for countdown, 16 s for sql, 91 s for bird and spider)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="verifier worker processes (default: min(8, CPU count))",
    )


def _timeout_arg(text: str) -> float:
    try:
        return check_timeout(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _write_scores(out: Path, records: list[dict]) -> None:
    """Write all records to a temp file beside ``out``, then rename it over ``out``.

    The previous contents stay whole until the new file is complete. Completions may hold
    lone surrogates (invalid UTF-16 from a tokenizer): they are written as ``\\udcff``
    escapes (``backslashreplace``), which JSON readers decode back to the same string.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    atomic_write_lines(out, lines, errors="backslashreplace")


def _read_completions(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, id, completions) of every row; a malformed row is a ``UsageError`` naming the
    file and line (one paragraph from the CLI, exit 2)."""
    from divrl.cli import UsageError

    rows = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UsageError(
                    f"{path}: line {line_no}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte "
                    f"column {e.start + 1}); write the completions file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}: line {line_no}: invalid JSON ({e.msg})") from None
            rid = row.get("id", row.get("index")) if isinstance(row, dict) else None
            if rid is None:
                raise UsageError(f"{path}: line {line_no}: field 'id': missing")
            comps = row.get("completions", row.get("completion"))
            if isinstance(comps, str):
                comps = [comps]
            if not isinstance(comps, list) or not all(isinstance(c, str) for c in comps):
                raise UsageError(
                    f"{path}: line {line_no}: field 'completion(s)': need a string or a list "
                    "of strings"
                )
            rows.append((line_no, str(rid), comps))
    if not sum(len(comps) for _, _, comps in rows):
        what = "no rows" if not rows else "rows whose completion lists are all empty"
        raise UsageError(f"{path}: {what}: nothing to score (is it the right file?)")
    return rows


def run(args: argparse.Namespace) -> int:
    examples = load_examples(args.data, db_dir=args.db_dir, skip_invalid=args.skip_invalid)
    by_id = {ex.id: ex for ex in examples}
    comp_path = Path(args.completions)
    rows = _read_completions(comp_path)
    requests, spans = [], []
    for line_no, rid, comps in rows:
        ex = by_id.get(rid)
        if ex is None:
            from divrl.cli import UsageError

            raise UsageError(
                f"{comp_path}: line {line_no}: id {rid!r} is not in {args.data} "
                f"(ids look like {next(iter(by_id), '<none>')!r})"
            )
        spans.append((len(requests), len(comps)))
        requests += [ScoreRequest(ex.data_source, c, ex.ground_truth, ex.extra_info) for c in comps]
    batch = score_batch(requests, max_workers=args.workers, timeout=args.timeout, progress=True)

    if args.out:
        records = []
        for (_, rid, _), (start, n) in zip(rows, spans, strict=True):
            res = batch.results[start : start + n]
            records.append(
                {
                    "id": rid,
                    "score": sum(r.score for r in res) / n if n else 0.0,
                    "scores": [r.score for r in res],
                    "reasons": [r.reason for r in res],
                    "extracted": [r.extracted for r in res],
                }
            )
        _write_scores(Path(args.out), records)

    reasons = Counter(r.reason for r in batch.results)
    print(f"data: {args.data} ({len(examples)} examples", end="")
    n_skipped = getattr(examples, "n_skipped", 0)
    print(f", {n_skipped} invalid rows skipped)" if n_skipped else ")")
    print(f"rows: {len(rows)}, completions: {len(requests)}")
    print(f"mean score: {batch.mean:.4f}")
    print("reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))
    fails = {k: v for k, v in reasons.items() if k not in DECIDED_REASONS}
    print("failures: " + (", ".join(f"{k}={v}" for k, v in sorted(fails.items())) or "none"))
    print(f"time: {batch.elapsed:.2f}s ({batch.n_isolated} scored in worker processes)")
    if args.out:
        print(f"wrote {args.out}")
    return 0
