"""Metrics of a training step: meters, the reduction across processes, the writers.

Every metric declares how it combines across processes when it is recorded
(:class:`StepMetrics`): ``mean`` (the mean over the processes that report it: rates,
losses), ``sum`` (counts: kept/dropped groups, reward failure reasons) or ``global``
(already reduced on every process, e.g. the summed objective).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from divrl.runs import RunDir
from divrl.training.collective import Collective
from divrl.training.config import Config, dump_config

__all__ = [
    "REDUCTIONS",
    "TIME_KEYS",
    "MetricMeter",
    "MetricWriters",
    "StepMetrics",
    "progress_postfix",
    "truncate_metrics",
]

logger = logging.getLogger(__name__)

TIME_KEYS = ("time/step", "time/rollout", "time/update")
REDUCTIONS = ("mean", "sum", "global")


class MetricMeter:
    """Weighted means of per-micro-batch metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: Mapping[str, float], weight: float = 1.0) -> None:
        for key, value in metrics.items():
            self.sums[key] += float(value) * weight
            self.weights[key] += weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}


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
    out["s/step"] = f"{m['time/step']:.1f}"
    return out


class MetricWriters:
    """``metrics.jsonl`` (always) and TensorBoard / W&B (when configured), main process."""

    def __init__(self, config: Config, run: RunDir) -> None:
        self.config, self.run = config, run
        self._writers: list[tuple[str, Any]] = []

    def open(self) -> None:
        """Create the run directory, write config.yaml and open the optional writers."""
        self.run.root.mkdir(parents=True, exist_ok=True)
        self.run.config_path.write_text(dump_config(self.config))
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
        """Append one step's record (it holds ``step``)."""
        with self.run.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for kind, writer in self._writers:
            if kind == "tb":
                for k, v in record.items():
                    if k != "step":
                        writer.add_scalar(k, v, record["step"])
            else:
                writer.log(dict(record), step=record["step"])

    def close(self) -> None:
        for kind, writer in self._writers:
            writer.close() if kind == "tb" else writer.finish()
        self._writers = []


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the records after ``step`` (steps logged after a checkpoint are redone)."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= step]
    path.write_text("".join(ln + "\n" for ln in kept))
