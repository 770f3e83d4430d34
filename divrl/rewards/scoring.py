"""``compute_score`` (verl's ``default_compute_score`` convention) and the batch API."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from divrl.rewards.pool import default_workers, get_pool, pickled_verifier
from divrl.rewards.registry import Verifier, get_verifier
from divrl.rewards.types import BatchScores, ScoreRequest, ScoreResult


def check_timeout(timeout: float | None) -> float | None:
    """``timeout`` as a float; ``ValueError`` unless it is ``None`` or finite and > 0.

    NaN would disable the time limit (every comparison with it is false) and inf cannot be
    waited for, so both are refused with a message that says what to pass instead.
    """
    if timeout is None:
        return None
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"timeout must be a finite number of seconds > 0 (e.g. 5), got {timeout!r}; "
            "pass None for the verifier's default"
        )
    return value


def _safe_quick(
    verifier: Verifier, solution_str: str, ground_truth: str, extra_info: dict
) -> ScoreResult | None:
    try:
        return verifier.quick(solution_str, ground_truth, extra_info)
    except Exception as e:  # a verifier bug must not crash a training step
        return ScoreResult(0.0, None, "error", f"{type(e).__name__}: {e}"[:500])


def _prepare(req: ScoreRequest) -> tuple[Verifier, str, str, dict]:
    _, verifier = get_verifier(req.data_source)
    extra = dict(req.extra_info or {})
    solution = req.solution_str if isinstance(req.solution_str, str) else str(req.solution_str)
    gold = req.ground_truth if isinstance(req.ground_truth, str) else str(req.ground_truth)
    verifier.check_inputs(gold, extra)
    return verifier, solution, gold, extra


def compute_score_detailed(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    *,
    timeout: float | None = None,
) -> ScoreResult:
    """Score one completion and say why; see :func:`compute_score`."""
    return score_batch(
        [ScoreRequest(data_source, solution_str, ground_truth, extra_info)],
        max_workers=1,
        timeout=timeout,
    ).results[0]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    *,
    timeout: float | None = None,
) -> float:
    """Reward in [0, 1] for ``solution_str`` against ``ground_truth``.

    Same signature as verl's ``default_compute_score``. ``data_source`` picks the
    verifier (``math``, ``sql`` and their aliases, see
    :func:`divrl.rewards.registered_sources`); ``extra_info`` carries per-example settings
    (``db_path`` for SQL, optionally ``answer_pattern`` for math). ``timeout`` is the hard
    wall-clock limit in seconds (default: the verifier's ``default_timeout``: 5 s for
    math, 2 s for countdown, 16 s for the ``sql`` profile and 91 s for ``bird`` and
    ``spider``, see docs/rewards.md); an answer that overruns it scores 0. Raises ``ValueError`` for an unknown data source or a missing database.
    """
    return compute_score_detailed(
        data_source, solution_str, ground_truth, extra_info, timeout=timeout
    ).score


def _as_request(item: ScoreRequest | Mapping[str, Any], i: int) -> ScoreRequest:
    if isinstance(item, ScoreRequest):
        return item
    if isinstance(item, Mapping):
        try:
            return ScoreRequest(
                data_source=item["data_source"],
                solution_str=item["solution_str"],
                ground_truth=item["ground_truth"],
                extra_info=item.get("extra_info"),
            )
        except KeyError as e:
            raise ValueError(
                f"score_batch item {i} lacks {e.args[0]!r}; items need data_source, "
                "solution_str, ground_truth and optionally extra_info"
            ) from None
    raise TypeError(f"score_batch item {i} is a {type(item).__name__}, not ScoreRequest or dict")


def score_batch(
    items: Sequence[ScoreRequest] | Sequence[Mapping[str, Any]],
    max_workers: int | None = None,
    timeout: float | None = None,
    progress: bool = False,
) -> BatchScores:
    """Score many completions in parallel; results keep the input order.

    Cheap decisions (no answer, integer answers, identical strings) are made in this
    process; the rest runs in a long-lived pool of worker processes (at most
    ``max_workers``, default ``min(8, cpu count)``), each item under a hard wall-clock
    limit of ``timeout`` seconds (default: the verifier's) after which its worker is
    killed and replaced. Configuration errors (unknown data source, missing database)
    raise ``ValueError`` before any work starts.
    """
    start = time.monotonic()
    timeout = check_timeout(timeout)
    requests = [_as_request(item, i) for i, item in enumerate(items)]
    results: list[ScoreResult | None] = [None] * len(requests)
    tasks, timeouts, where, verifiers = [], [], [], []
    for i, req in enumerate(requests):
        try:
            verifier, solution, gold, extra = _prepare(req)
        except ValueError as e:
            raise ValueError(f"score_batch item {i}: {e}") from None
        quick = _safe_quick(verifier, solution, gold, extra)
        if quick is not None:
            results[i] = quick
            continue
        tasks.append((pickled_verifier(verifier), solution, gold, extra))
        verifiers.append((verifier, solution, extra))
        timeouts.append(float(timeout if timeout is not None else verifier.default_timeout))
        where.append(i)
    if tasks:
        bar = _progress_bar(len(tasks)) if progress else None

        def on_done(j: int, result: ScoreResult) -> None:
            if result.extracted is None and result.reason in ("timeout", "worker_crashed"):
                # the worker died with the item: say which answer it was working on
                verifier, solution, extra = verifiers[j]
                with contextlib.suppress(Exception):
                    result.extracted = verifier.extract(solution, extra)
            results[where[j]] = result
            if bar is not None:
                bar.update(1)

        try:
            get_pool().run(tasks, timeouts, max_workers or default_workers(), on_done)
        finally:
            if bar is not None:
                bar.close()
    return BatchScores(
        results=[r for r in results if r is not None],
        elapsed=time.monotonic() - start,
        n_isolated=len(tasks),
    )


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="scoring", unit="item")
