"""The report's building blocks: one model's evaluation, number formats, Markdown built
block by block."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.evaluation.report_files import read_records
from divrl.evaluation.runner import CONFIG_FILE, RESULTS_FILE

__all__ = ["Doc", "ModelEval", "fmt", "fmt_ci", "slug"]


@dataclass
class ModelEval:
    """One model's evaluation: per eval set its summary and (lazily) its per-prompt results."""

    name: str
    eval_dir: Path
    run_dir: Path | None = None
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: list[dict[str, float]] = field(default_factory=list)
    #: per eval set, its ``eval_config.json`` ({} when absent or unreadable)
    eval_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the run's ``config.yaml`` (None: an eval directory, or no readable config)
    run_config: dict[str, Any] | None = None
    #: the run's provenance records, one per start / resume, oldest first
    run_provenance: list[dict[str, Any]] = field(default_factory=list)
    #: the step of the run's newest checkpoint with a model (None: none, or no run)
    checkpoint_step: int | None = None
    #: the method (row group) this run is a seed of; None: a group of its own
    group: str | None = None
    #: set by the like-for-like checks: what this row's inputs do not share with the others
    mismatches: list[str] = field(default_factory=list)
    _results: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def results(self, split: str) -> list[dict[str, Any]] | None:
        if split not in self._results:
            path = self.eval_dir / split / RESULTS_FILE
            fix = f"rewrite it with `divrl eval --reuse --out {self.eval_dir}`"
            self._results[split] = read_records(path, fix) if path.is_file() else None
        return self._results[split]

    @property
    def label(self) -> str:
        """The name as the tables show it: marked when its inputs are not like for like."""
        return f"{self.name} ⚠" if self.mismatches else self.name

    @property
    def method(self) -> str:
        """The row group: the method this run is a seed of (its own name by default)."""
        return self.group or self.name

    @property
    def steps(self) -> int | None:
        """The steps the run has trained: its last metrics step or its newest checkpoint's,
        whichever is later (None without a run)."""
        steps = [r.get("step") for r in self.metrics if isinstance(r.get("step"), int)]
        steps += [len(self.metrics)] if self.metrics else []
        steps += [self.checkpoint_step] if self.checkpoint_step is not None else []
        return max(steps) if steps else None

    @property
    def model_path(self) -> str | None:
        for split in self.summaries:
            cfg = self.eval_dir / split / CONFIG_FILE
            if cfg.is_file():
                try:
                    return json.loads(cfg.read_text()).get("resolved_model")
                except (UnicodeDecodeError, ValueError, AttributeError):
                    return None  # a damaged eval_config.json: the model is shown by name
        return None


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def fmt_ci(value: float | None, ci: Sequence[float] | None) -> str:
    if value is None:
        return "-"
    if not ci or any(c is None or math.isnan(c) for c in ci):
        return fmt(value)
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def slug(name: str) -> str:
    """A file-name part for ``name`` (eval-set names may come from any folder name)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "set"


class Doc:
    """Markdown built block by block (HTML is rendered from it)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def h(self, level: int, text: str) -> None:
        self.parts.append(f"{'#' * level} {text}\n")

    def p(self, text: str) -> None:
        self.parts.append(text.strip() + "\n")

    def table(self, rows: Sequence[Sequence[str]], align_left: int = 1) -> None:
        header = rows[0]
        esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
        lines = ["| " + " | ".join(esc[0]) + " |"]
        lines.append(
            "|" + "|".join(":--" if i < align_left else "--:" for i in range(len(header))) + "|"
        )
        lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        self.parts.append("\n".join(lines) + "\n")

    def image(self, path: Path, root: Path, alt: str) -> None:
        self.images([path], root, [alt])

    def images(self, paths: Sequence[Path], root: Path, alts: Sequence[str]) -> None:
        """Images in one paragraph: side by side in the HTML when they fit."""
        links = [
            f"![{a}]({p.relative_to(root).as_posix()})" for p, a in zip(paths, alts, strict=True)
        ]
        self.parts.append(" ".join(links) + "\n")

    def markdown(self) -> str:
        return "\n".join(self.parts)
