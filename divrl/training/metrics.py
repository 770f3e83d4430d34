"""Metrics of a training step: meters, the reduction across processes, the writers.

Every metric declares how it combines across processes when it is recorded
(:class:`StepMetrics`): ``mean`` (the mean over the processes that report it: rates,
losses), ``sum`` (counts: kept/dropped groups, reward failure reasons) or ``global``
(already reduced on every process, e.g. the summed objective).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from divrl.distributed import Collective
from divrl.fileio import append_record, atomic_write_text, fsync_path
from divrl.runs import RunDir
from divrl.training.config import Config

__all__ = [
    "COUNT_UPDATE_KEYS",
    "REDUCTIONS",
    "TIME_KEYS",
    "MetricMeter",
    "MetricWriters",
    "StepMetrics",
    "progress_postfix",
    "read_metrics",
    "reduce_step_metrics",
    "strict_json_record",
    "truncate_metrics",
]

logger = logging.getLogger(__name__)

TIME_KEYS = ("time/step", "time/rollout", "time/update")
REDUCTIONS = ("mean", "sum", "global")


#: update metrics that count tokens: summed over a step's micro-batches, optimiser steps and
#: processes, so that they say how many tokens the step selected or regularised (a weighted
#: mean would report the count of an average micro-batch)
COUNT_UPDATE_KEYS = (
    "lp_reg/num_negative",
    "lp_reg/num_selected",
    "lp_reg/num_regularized",
    "lp_reg/num_net_up",
)


class MetricMeter:
    """Weighted means of per-micro-batch metrics; :data:`COUNT_UPDATE_KEYS` summed."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: Mapping[str, float], weight: float = 1.0) -> None:
        for key, value in metrics.items():
            counted = key in COUNT_UPDATE_KEYS
            self.sums[key] += float(value) * (1.0 if counted else weight)
            self.weights[key] += weight

    def means(self) -> dict[str, float]:
        return {
            k: self.sums[k] if k in COUNT_UPDATE_KEYS else self.sums[k] / self.weights[k]
            for k in self.sums
            if self.weights[k] > 0
        }


class StepMetrics:
    """One process's metrics of a step, each with its declared reduction."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.reductions: dict[str, str] = {}

    def put(self, key: str, value: float, reduce: str = "mean") -> None:
        if reduce not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduce!r}; one of {REDUCTIONS}")
        self.values[key] = float(value)
        self.reductions[key] = reduce

    def update(self, metrics: Mapping[str, float], reduce: str = "mean") -> None:
        for key, value in metrics.items():
            self.put(key, value, reduce)

    def reduced(self, collective: Collective) -> dict[str, float]:
        """Every process's metrics combined (keys sorted); a metric may be reported by some
        processes only (e.g. a statistic of a group one process dropped)."""
        declared: dict[str, str] = {}
        for part in collective.all_gather_object(sorted(self.reductions.items())):
            declared.update(part)
        keys = sorted(declared)
        sums = collective.all_reduce([self.values.get(k, 0.0) for k in keys])
        counts = collective.all_reduce([float(k in self.values) for k in keys])
        out = {}
        for key, total, count in zip(keys, sums, counts, strict=True):
            how = declared[key]
            if how == "global":  # the same on every process that reports it
                out[key] = self.values.get(key, total / max(count, 1.0))
            else:
                out[key] = total / count if how == "mean" else total
        return out


#: update metrics that are already the same on every process (not averaged again)
GLOBAL_UPDATE_KEYS = ("loss/total", "dph/effective_eta")


def reduce_step_metrics(
    means: Mapping[str, float],
    counts: Mapping[str, float],
    update: Mapping[str, float],
    collective: Collective,
) -> dict[str, float]:
    """A step's metrics over all processes: the experience's ``means`` (averaged) and
    ``counts`` (summed), and the update's means (averaged, but for
    :data:`GLOBAL_UPDATE_KEYS`, and :data:`COUNT_UPDATE_KEYS` summed; ``actor/skipped_steps``
    is the caller's)."""
    update = {k: v for k, v in update.items() if k != "actor/skipped_steps"}
    local = StepMetrics()
    local.update(means)
    local.update(counts, reduce="sum")
    local.update(update)
    for key in COUNT_UPDATE_KEYS:
        if key in update:
            local.put(key, update[key], reduce="sum")
    for key in GLOBAL_UPDATE_KEYS:
        if key in update:
            local.put(key, update[key], reduce="global")
    return local.reduced(collective)


def progress_postfix(m: Mapping[str, float]) -> dict[str, str]:
    """The progress bar's short summary of a step's metrics."""
    out = {
        "reward": f"{m.get('reward/shaped', float('nan')):.3f}",
        "pass@1": f"{m.get('reward/pass@1', float('nan')):.3f}",
        "ent": f"{m.get('actor/entropy', float('nan')):.3f}",
    }
    kl = m.get("actor/ref_kl", m.get("pg/approx_kl"))
    if kl is not None:
        out["kl"] = f"{kl:.2e}"
    if "dph/divergence" in m:
        out["div"] = f"{m['dph/divergence']:.2e}"
    if "lp_reg/num_selected" in m:  # regularised / selected tokens, and the penalty
        out["lp_reg"] = f"{m.get('lp_reg/num_regularized', 0):.0f}/{m['lp_reg/num_selected']:.0f}"
        out["lp_pen"] = f"{m.get('lp_reg/penalty', float('nan')):.2e}"
    out["s/step"] = f"{m['time/step']:.1f}"
    return out


class MetricWriters:
    """``metrics.jsonl`` (always) and TensorBoard / W&B (when configured), main process."""

    def __init__(self, config: Config, run: RunDir) -> None:
        self.config, self.run = config, run
        self._writers: list[tuple[str, Any]] = []

    def open(self) -> None:
        """Open the optional writers (the run directory and config.yaml exist already:
        :class:`~divrl.training.run_session.RunSession` writes them)."""
        self.run.root.mkdir(parents=True, exist_ok=True)
        if self.config.logging.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                logger.info("tensorboard is not installed; metrics go to metrics.jsonl only")
            else:
                self._writers.append(("tb", SummaryWriter(str(self.run.tensorboard_dir))))
        if self.config.logging.wandb:
            import wandb

            wb = wandb.init(
                project=self.config.logging.wandb_project,
                config=self.config.to_dict(),
                dir=str(self.run.root),
                resume="allow",
            )
            self._writers.append(("wandb", wb))

    def write(self, record: Mapping[str, float]) -> None:
        """Append one step's record (it holds ``step``) as one whole line of strict JSON."""
        append_record(self.run.metrics_path, strict_json_record(record))
        for kind, writer in self._writers:
            if kind == "tb":
                for k, v in record.items():
                    if k != "step":
                        writer.add_scalar(k, v, record["step"])
            else:
                writer.log(dict(record), step=record["step"])

    def sync(self) -> None:
        """Flush metrics.jsonl to disk (before a checkpoint: a checkpoint of step k implies
        the records up to k survive a power loss)."""
        fsync_path(self.run.metrics_path)

    def close(self) -> None:
        for kind, writer in self._writers:
            writer.close() if kind == "tb" else writer.finish()
        self._writers = []


def strict_json_record(record: Mapping[str, Any]) -> str:
    """``record`` as strict JSON (RFC 8259 has no NaN/Infinity): a non-finite value is
    written as null and the record gains ``nonfinite_count``, the number of them."""
    clean: dict[str, Any] = {}
    bad = 0
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            clean[key], bad = None, bad + 1
        else:
            clean[key] = value
    if bad:
        clean["nonfinite_count"] = bad
    return json.dumps(clean, allow_nan=False)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A torn last line (a write cut by a crash or a full
    disk) is reported with the file name and dropped; a bad line before it is an error
    naming the file and the line."""
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw))
        except ValueError as exc:  # JSONDecodeError and invalid UTF-8
            if any(x.strip() for x in lines[number:]):
                raise ValueError(f"{path}: line {number} is not a JSON record: {exc}") from None
            logger.warning("%s: dropping a torn last line %d (%s)", path, number, exc)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the records after ``step`` (steps logged after a checkpoint are redone) and
    any torn last line; the file is replaced atomically (temp file + rename)."""
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path) if r["step"] <= step]
    atomic_write_text(path, "".join(strict_json_record(r) + "\n" for r in kept))
