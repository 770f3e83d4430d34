"""Result and request types shared by every verifier."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Reasons that mean "the verifier ran and decided"; every other reason is a failure.
DECIDED_REASONS = frozenset({"correct", "wrong"})

# Reasons that mean "no verdict on the response": the verifier ran out of time, its worker
# died or ran out of memory, the verifier raised, or the gold answer itself could not be
# read. The response may be right or wrong, so it is *unscorable*: training keeps it out of
# its group's baseline and gives it no advantage, evaluation counts it apart from the
# failures (docs/rewards.md, "Unscorable responses"). Every other failure (no answer, an
# unparsable one, an SQL error) is the response's own and scores 0.
UNSCORABLE_REASONS = frozenset({"timeout", "worker_crashed", "worker_error", "error", "gold_error"})


class UnscorableShareError(RuntimeError):
    """More of a step's responses were unscorable than the run allows."""


def unscorable_share_message(
    where: str, n_unscorable: int, n_total: int, limit: float, setting: str
) -> str:
    """The one-line stop message: the count, the share, the limit and what to do."""
    share = n_unscorable / max(1, n_total)
    return (
        f"{where}: {n_unscorable} of {n_total} responses ({share:.0%}) could not be scored "
        "(a verifier timeout, a crashed worker, a verifier error or an unreadable gold "
        f"answer), more than {setting}="
        f"{limit:g}; the verifier or its workers are failing (see the reward/<reason> "
        f"counts and docs/rewards.md), or raise {setting} to train on the rest"
    )


def is_correct(score: float) -> bool:
    """Full credit counts as correct (Pass@k, the trainer's Pass@1, the DPH-RL split)."""
    return score >= 1.0 - 1e-6


@dataclass
class ScoreResult:
    """The outcome of scoring one completion.

    ``score`` is in [0, 1]. ``extracted`` is the answer the verifier pulled out of the
    completion (``None`` when there was none). ``reason`` is a short machine-readable tag:
    ``correct``, ``wrong``, ``no_answer``, ``unparsable``, ``timeout``, ``sql_error``,
    ``forbidden`` (a write/ATTACH/PRAGMA refused), ``too_many_rows``, ``too_long``,
    ``gold_error``, ``worker_crashed`` (the worker died twice on this item),
    ``worker_error`` (it ran out of memory twice) or ``error``.
    ``detail`` carries a human-readable message for failures (e.g. the SQLite error).
    """

    score: float
    extracted: str | None
    reason: str
    detail: str = ""

    def __post_init__(self) -> None:
        self.score = float(min(1.0, max(0.0, self.score)))

    @property
    def unscorable(self) -> bool:
        """No verdict (see :data:`UNSCORABLE_REASONS`): neither right nor wrong."""
        return self.reason in UNSCORABLE_REASONS


@dataclass
class ScoreRequest:
    """One item for :func:`divrl.rewards.score_batch` (same arguments as ``compute_score``)."""

    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict[str, Any] | None = None


@dataclass
class BatchScores:
    """Results of :func:`divrl.rewards.score_batch`, in input order."""

    results: list[ScoreResult]
    elapsed: float = field(default=0.0, metadata={"help": "wall-clock seconds for the batch"})
    n_isolated: int = field(
        default=0, metadata={"help": "items that needed a worker process (no cheap path)"}
    )

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.results]

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.results) if self.results else 0.0

    @property
    def reasons(self) -> Counter[str]:
        return Counter(r.reason for r in self.results)

    @property
    def failures(self) -> dict[str, int]:
        """Counts of every reason other than ``correct``/``wrong``."""
        return {k: v for k, v in sorted(self.reasons.items()) if k not in DECIDED_REASONS}

    @property
    def n_failures(self) -> int:
        return sum(self.failures.values())

    @property
    def unscorable(self) -> list[bool]:
        """Per item, whether it got no verdict (:data:`UNSCORABLE_REASONS`)."""
        return [r.unscorable for r in self.results]

    @property
    def n_unscorable(self) -> int:
        return sum(self.unscorable)

    def summary(self) -> str:
        n = len(self.results)
        fails = ", ".join(f"{k}={v}" for k, v in self.failures.items()) or "none"
        rate = n / self.elapsed if self.elapsed > 0 else float("inf")
        return (
            f"{n} completions, mean score {self.mean:.4f}, failures: {fails} "
            f"({self.n_unscorable} unscorable), "
            f"{self.elapsed:.2f}s ({rate:.0f}/s)"
        )


@dataclass(frozen=True)
class BenchmarkProfile:
    """One benchmark's hooks (see the module's docstring); ``name`` is its data source."""

    name: str
    aliases: tuple[str, ...] = ()
    verifier: Any = None
    converter: Any = None
    equivalence: Any = None
    style: Any = None
    needs_database: bool = False
    # the samples are worked math solutions: summaries add the solution-style measure read
    # from the trace (divrl.evaluation.text_diversity.math_trace_style)
    math_traces: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k.lower() for k in (self.name, *self.aliases))
