"""``summary.json``: benchmark numbers from the per-prompt results of :mod:`runner`.

Every mean is over prompts (each prompt weighs the same); every interval is a percentile
bootstrap over prompts (:func:`divrl.evaluation.stats.bootstrap_ci`, seeded). Keys:

- ``greedy_accuracy`` and ``mean_accuracy`` (the sampled Pass@1), ``pass@k`` (unbiased,
  k = 1, 2, 4, ..., n), ``maj@k`` (majority vote over equivalence clusters), each with a
  ``*_ci`` entry ``[low, high]``;
- ``diversity``: mean distinct correct answers per prompt, mean distinct solution styles
  among all samples and among the correct ones, the share of prompts whose samples use one
  style / three or more, and the style histograms (sample counts); ``styles_measure`` says
  what counted as a style: ``"solution styles"`` (the data source's style classifier,
  :mod:`divrl.evaluation.styles`) or, for a data source without one, ``"trace clusters"``
  (:func:`divrl.evaluation.text_diversity.trace_clusters`); and the classifier-free
  measures of every data source (:mod:`divrl.evaluation.text_diversity`): ``distinct_1``,
  ``distinct_2``, ``self_bleu``, ``mean_answer_clusters``, ``mean_answer_entropy_bits``,
  ``mean_trace_clusters``, ``share_one_trace_cluster`` and, for math data sources,
  ``mean_math_trace_styles`` with ``math_trace_style_counts``;
- ``tokens``: mean response length, mean negative log-prob per token (under the sampling
  policy: an estimate of the per-token entropy when sampling at T = 1 without top-p/top-k
  truncation), share of truncated responses and of those cut at the model's context;
- ``reasons``: verifier outcomes (``correct``, ``wrong``, ``no_answer``, ``sql_error`` ...);
- ``unscorable`` (also per group): the samples that got no verdict (a verifier timeout, a
  crashed worker, a verifier error, an unreadable gold answer:
  :data:`divrl.rewards.types.UNSCORABLE_REASONS`), ``unscorable_share`` of all samples, and
  ``mean_accuracy_scorable``, the sampled Pass@1 over each prompt's scorable samples only
  (prompts with none left out). Pass@k, maj@k and ``mean_accuracy`` count an unscorable
  sample as not correct, as BIRD's and Spider's official evaluators count a timeout (a
  lower bound); ``mean_accuracy_scorable`` is the estimate for unscorable samples that are
  right as often as the others (docs/evaluation.md);
- ``groups``: the headline numbers per value of each ``group_by`` key of ``extra_info``;
- ``provenance``: :func:`eval_provenance` of the process that scored and summarised (the
  same record as ``eval_config.json``'s, written by the process that sampled).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from divrl.evaluation.pass_at_k import pass_at_k_array
from divrl.evaluation.stats import bootstrap_ci, default_ks, maj_at_k_array
from divrl.evaluation.text_diversity import (
    answer_entropy,
    distinct_n,
    math_trace_style,
    self_bleu,
    trace_clusters,
)
from divrl.profiles import get_profile
from divrl.rewards.types import UNSCORABLE_REASONS

__all__ = ["eval_data_fingerprint", "eval_provenance", "per_prompt_arrays", "summarise"]


def per_prompt_arrays(results: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """``[P]`` arrays: ``n`` samples, ``c`` correct, ``u`` unscorable, ``greedy`` (nan without
    one), the number of distinct styles (all / correct samples) and of distinct correct
    answers."""
    return {
        "n": np.array([len(r["correct"]) for r in results], dtype=np.int64),
        "c": np.array([sum(r["correct"]) for r in results], dtype=np.int64),
        "u": np.array(
            # results written before reasons were recorded count none
            [sum(x in UNSCORABLE_REASONS for x in r.get("reasons", ())) for r in results],
            dtype=np.int64,
        ),
        "greedy": np.array(
            [float(r["greedy"]["correct"]) if r.get("greedy") else math.nan for r in results]
        ),
        "styles": np.array([len({s for s in r["styles"] if s}) for r in results]),
        "correct_styles": np.array(
            [
                len({s for s, c in zip(r["styles"], r["correct"], strict=True) if s and c})
                for r in results
            ]
        ),
        "distinct_correct": np.array([r.get("distinct_correct_answers", 0) for r in results]),
    }


def eval_data_fingerprint(records: Sequence[dict[str, Any]]) -> str:
    """The fingerprint of an evaluation's prompts (:func:`divrl.provenance.records_fingerprint`
    of each prompt's id, data source, rendered prompt text and ground truth, in order):
    equal exactly when two evaluations asked the same questions the same way."""
    from divrl.provenance import records_fingerprint

    return records_fingerprint(
        [r.get("id"), r.get("data_source"), r.get("prompt"), r.get("ground_truth")] for r in records
    )


def eval_provenance(records: Sequence[dict[str, Any]], cfg, **extra: Any) -> dict[str, Any]:
    """:func:`divrl.provenance.provenance` of an evaluation of ``records`` (samples or
    results, one per prompt) with ``cfg`` (an ``EvalConfig``); ``extra`` keys are added
    (``checkpoint``: the verl checkpoint step evaluated)."""
    from dataclasses import asdict

    from divrl.provenance import provenance

    return provenance(
        config=asdict(cfg),
        data=eval_data_fingerprint(records),
        engine=cfg.engine,
        prompts=len(records),
        **extra,
    )


def _ci(values: np.ndarray, cfg) -> list[float]:
    return list(bootstrap_ci(values, n_boot=cfg.n_boot, confidence=cfg.confidence, seed=cfg.seed))


def _headline(results: Sequence[dict[str, Any]], cfg, ks: list[int]) -> dict[str, Any]:
    a = per_prompt_arrays(results)
    out: dict[str, Any] = {"n_prompts": len(results)}
    greedy = a["greedy"][~np.isnan(a["greedy"])]
    if greedy.size:
        out["greedy_accuracy"] = float(greedy.mean())
        out["greedy_accuracy_ci"] = _ci(greedy, cfg)
    acc = a["c"] / a["n"]
    out["mean_accuracy"] = float(acc.mean())
    out["mean_accuracy_ci"] = _ci(acc, cfg)
    out["unscorable"] = int(a["u"].sum())
    out["unscorable_share"] = float(a["u"].sum() / a["n"].sum())
    scorable = a["n"] - a["u"]
    kept = scorable > 0
    out["mean_accuracy_scorable"] = (
        float((a["c"][kept] / scorable[kept]).mean()) if kept.any() else None
    )
    out["pass@k"], out["pass@k_ci"] = {}, {}
    out["maj@k"], out["maj@k_ci"] = {}, {}
    clusters = [r["clusters"] for r in results]
    cluster_ok = [r["cluster_correct"] for r in results]
    for k in ks:
        values = pass_at_k_array(a["n"], a["c"], k)
        out["pass@k"][str(k)] = float(values.mean())
        out["pass@k_ci"][str(k)] = _ci(values, cfg)
        maj = maj_at_k_array(clusters, cluster_ok, k, seed=cfg.seed)
        out["maj@k"][str(k)] = float(maj.mean())
        out["maj@k_ci"][str(k)] = _ci(maj, cfg)
    return out


def summarise(results: Sequence[dict[str, Any]], cfg) -> dict[str, Any]:
    """The summary of per-prompt ``results`` (see the module docstring); ``cfg`` is an
    :class:`~divrl.evaluation.runner.EvalConfig`."""
    if not results:
        raise ValueError("no results to summarise")
    n = min(len(r["correct"]) for r in results)
    ks = default_ks(n)
    summary = {
        "n_samples_per_prompt": n,
        "ks": ks,
        "sampling": {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "max_new_tokens": cfg.max_new_tokens,
            "seed": cfg.seed,
        },
        "confidence": cfg.confidence,
        **_headline(results, cfg, ks),
    }
    summary["diversity"] = _diversity(results)
    lengths = np.array([t for r in results for t in r["n_tokens"]], dtype=np.float64)
    nll = np.array([x for r in results for x in r["nll"] if x is not None], dtype=np.float64)
    summary["tokens"] = {
        "mean_response_tokens": float(lengths.mean()),
        "mean_nll_per_token": float(nll.sum() / max(lengths.sum(), 1.0)) if nll.size else None,
        "truncated_share": float(np.mean([t for r in results for t in r["truncated"]])),
        # cut where prompt + response reached the model's context (results of older
        # versions lack the flag)
        "at_context_share": float(
            np.mean(
                [t for r in results for t in r.get("at_context", [False] * len(r["truncated"]))]
            )
        ),
    }
    summary["reasons"] = dict(Counter(x for r in results for x in r["reasons"]).most_common())
    groups: dict[str, Any] = {}
    for key in cfg.group_by:
        values = sorted({str((r["extra_info"] or {}).get(key)) for r in results})
        for value in values:
            subset = [r for r in results if str((r["extra_info"] or {}).get(key)) == value]
            groups[f"{key}={value}"] = _headline(subset, cfg, ks)
    summary["groups"] = groups
    summary["provenance"] = eval_provenance(results, cfg)
    return summary


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _is_math(data_source: str) -> bool:
    profile = get_profile(data_source)
    return bool(profile and profile.math_traces)


def text_diversity(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The classifier-free measures (:mod:`divrl.evaluation.text_diversity`), averaged over
    prompts; ``trace_clusters`` is the ``[P]`` array of clusters per prompt."""
    traces = np.array([len(set(trace_clusters(r["texts"]))) for r in results])
    answers = [answer_entropy(r["clusters"]) for r in results]
    out: dict[str, Any] = {
        "distinct_1": _mean([distinct_n(r["texts"], 1) for r in results]),
        "distinct_2": _mean([distinct_n(r["texts"], 2) for r in results]),
        "self_bleu": _mean([self_bleu(r["texts"]) for r in results]),
        "mean_answer_clusters": float(np.mean([a[0] for a in answers])),
        "mean_answer_entropy_bits": _mean([a[1] for a in answers]),
        "mean_trace_clusters": float(traces.mean()),
        "share_one_trace_cluster": float((traces == 1).mean()),
        "trace_clusters": traces,
    }
    math_results = [r for r in results if _is_math(r["data_source"])]
    if math_results:
        labels = [[math_trace_style(t) for t in r["texts"]] for r in math_results]
        out["mean_math_trace_styles"] = float(np.mean([len(set(x)) for x in labels]))
        out["math_trace_style_counts"] = dict(Counter(s for x in labels for s in x).most_common())
    return out


def _diversity(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``diversity`` block: styles from the classifier where the data source has one,
    else trace clusters in their place (``styles_measure`` says which)."""
    a = per_prompt_arrays(results)
    text = text_diversity(results)
    styled = a["styles"] > 0
    solved = a["c"] > 0
    if styled.any():
        measure, counts = "solution styles", a["styles"][styled]
    else:
        measure, counts = "trace clusters", text.pop("trace_clusters")
    text.pop("trace_clusters", None)
    style_counts = Counter(s for r in results for s in r["styles"] if s)
    correct_style_counts = Counter(
        s for r in results for s, c in zip(r["styles"], r["correct"], strict=True) if s and c
    )
    return {
        "mean_distinct_correct_answers": float(a["distinct_correct"].mean()),
        "styles_measure": measure,
        "mean_distinct_styles": float(counts.mean()),
        "mean_distinct_correct_styles": (
            float(a["correct_styles"][solved & styled].mean()) if (solved & styled).any() else None
        ),
        "share_one_style": float((counts == 1).mean()),
        "share_3plus_styles": float((counts >= 3).mean()),
        "style_counts": dict(style_counts.most_common()),
        "correct_style_counts": dict(correct_style_counts.most_common()),
        **text,
    }
