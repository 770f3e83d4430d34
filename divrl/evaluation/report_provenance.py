"""Provenance in ``divrl report``: where each model's training and evaluation came from.

The report's "Provenance" table shows, per model, the last session of its training run
(``provenance.json`` in the run directory) and its evaluations (``eval_config.json``,
else ``summary.json``): commit (``*``: the tree was dirty), divrl, torch and transformers
versions (and trl / verl / vllm when installed), engine, torch threads, device and CPU,
and the data fingerprints. A run resumed by other code says so. The report directory's
``provenance.json`` holds the report's own record (:func:`divrl.provenance.provenance`)
and every model's records in full.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from divrl.evaluation.report_doc import Doc, ModelEval
from divrl.evaluation.runner import CONFIG_FILE, SUMMARY_FILE
from divrl.fileio import atomic_write_text
from divrl.provenance import provenance
from divrl.runs import RunDir

__all__ = ["describe", "experiment_provenance", "provenance_section", "write_report_record"]

_EXTRA_PACKAGES = ("trl", "verl", "vllm")


def describe(record: dict[str, Any] | None) -> str:
    """One cell: ``<commit>[*], divrl V, torch V, transformers V, engine E, T threads,
    device (CPU)``; ``not recorded`` for None."""
    if not record:
        return "not recorded"
    git = record.get("git")
    code = f"{git['commit'][:10]}{'*' if git.get('dirty') else ''}" if git else "no checkout"
    v = record.get("versions") or {}
    parts = [code, f"divrl {v.get('divrl', '?')}", f"torch {v.get('torch', '?')}"]
    parts.append(f"transformers {v.get('transformers', '?')}")
    parts += [f"{p} {v[p]}" for p in _EXTRA_PACKAGES if p in v]
    if record.get("engine"):
        parts.append(f"engine {record['engine']}")
    threads = (record.get("threads") or {}).get("torch")
    if threads is not None:
        parts.append(f"{threads} threads")
    parts.append(f"{record.get('device') or '?'} ({record.get('cpu') or '?'})")
    return ", ".join(parts)


def _data(record: dict[str, Any] | None) -> str:
    data = (record or {}).get("data")
    return data.removeprefix("sha256:")[:12] if data else "-"


def _eval_record(model: ModelEval, split: str) -> dict[str, Any] | None:
    return (model.eval_configs.get(split) or {}).get("provenance") or model.summaries[split].get(
        "provenance"
    )


def _training_cell(model: ModelEval) -> str:
    if model.run_dir is None:
        return "-"
    sessions = model.run_provenance
    if not sessions:
        return "not recorded"
    cell = describe(sessions[-1])
    codes = {json.dumps([s.get("git"), s.get("versions")], sort_keys=True) for s in sessions}
    if len(codes) > 1:
        cell += f" (⚠ its {len(sessions)} sessions ran different code or packages)"
    return cell


def provenance_section(doc: Doc, models: Sequence[ModelEval]) -> None:
    """The "Provenance" table (module docstring)."""
    rows = [["model", "trained with", "evaluated with", "train data", "eval data"]]
    for m in models:
        evals = {s: _eval_record(m, s) for s in m.summaries}
        described = {describe(r) for r in evals.values()}
        evaluated = (
            described.pop()
            if len(described) == 1
            else "; ".join(f"`{s}`: {describe(r)}" for s, r in evals.items())
        )
        rows.append(
            [
                m.label,
                _training_cell(m),
                evaluated or "-",
                _data(m.run_provenance[-1] if m.run_provenance else None),
                ", ".join(f"{s} {_data(r)}" for s, r in evals.items()) or "-",
            ]
        )
    doc.h(2, "Provenance")
    doc.table(rows, align_left=len(rows[0]))
    doc.p(
        "Commit of the divrl checkout (`*`: with uncommitted changes), package versions, "
        "engine, torch threads, device and CPU of the last training session and of the "
        "evaluations; data: the first hex digits of the fingerprints of the prompts trained "
        "on and evaluated (equal digits, same prompts). The full records are in this "
        "report's `provenance.json`."
    )


def write_report_record(out: Path, models: Sequence[ModelEval], command: str) -> Path:
    """``provenance.json`` in the report folder: the report's own record, its command and
    every model's training and evaluation records."""
    record = {
        "report": provenance(command=command),
        "models": {
            m.name: {
                "method": m.method,
                "run_dir": None if m.run_dir is None else str(m.run_dir),
                "eval_dir": str(m.eval_dir),
                "steps": m.steps,
                "training": m.run_provenance,
                "eval": {s: _eval_record(m, s) for s in m.summaries},
                "mismatches": m.mismatches,
            }
            for m in models
        },
    }
    path = out / "provenance.json"
    atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")
    return path


def experiment_provenance(
    train_dir: Path | None, eval_dir: Path, splits: Sequence[str]
) -> dict[str, Any]:
    """An experiment summary's ``provenance``: the summarising process's record, the
    training run's sessions (``train_dir``; None for the base model) and each eval set's
    record (its ``eval_config.json``, else its ``summary.json``)."""
    evals = {}
    for split in splits:
        for name in (CONFIG_FILE, SUMMARY_FILE):
            try:
                found = json.loads((eval_dir / split / name).read_text()).get("provenance")
            except (OSError, ValueError, AttributeError):
                found = None
            if found:
                break
        evals[split] = found
    return {
        "summary": provenance(),
        "training": RunDir(train_dir).provenance() if train_dir is not None else [],
        "eval": evals,
    }
