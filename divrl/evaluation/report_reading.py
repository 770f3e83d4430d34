"""Sentences that say what the report's tables show, and flags where a method contradicts
its claim.

Per eval set, every trained model is compared with the base model on the prompts both were
evaluated on, for Pass@1, Pass@n and styles per prompt (the headline's diversity: solution
styles, or trace clusters where the data source has no style classifier). A change is read
from the paired bootstrap interval of the ratio model / base: "raises" when the whole
interval is above 1, "lowers" when it is below 1, "keeps" otherwise. A **flag** is raised
where a model falls below the base (Pass@n or styles, interval below 1), and where a
method other than GRPO falls below GRPO (the diversity methods claim to keep what GRPO
loses).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from divrl.evaluation.pass_at_k import pass_at_k_array
from divrl.evaluation.report_doc import ModelEval
from divrl.evaluation.stats import paired_ratio_ci
from divrl.evaluation.summary import per_prompt_arrays
from divrl.evaluation.text_diversity import trace_clusters

__all__ = ["is_grpo", "reading", "spark_reading"]

Metric = tuple[str, Callable[[list[dict[str, Any]]], np.ndarray]]


def is_grpo(model: ModelEval) -> bool:
    """Whether ``model`` is the plain GRPO baseline (by its name, its method's when it is
    one of several seeds, or its run folder's)."""
    names = {model.name, model.method, model.run_dir.name if model.run_dir else ""}
    return any(n.lower().replace("-", "_") == "grpo" for n in names)


def _styles(results: list[dict[str, Any]]) -> np.ndarray:
    a = per_prompt_arrays(results)["styles"]
    if (a > 0).any():
        return a.astype(np.float64)
    return np.array([len(set(trace_clusters(r["texts"]))) for r in results], dtype=np.float64)


def _metrics(n: int, styles_label: str) -> list[Metric]:
    def pass_k(k: int):
        return lambda res: pass_at_k_array(*(per_prompt_arrays(res)[x] for x in ("n", "c")), k)

    return [("P@1", pass_k(1)), (f"P@{n}", pass_k(n)), (styles_label, _styles)]


def _compare(model: ModelEval, other: ModelEval, split: str, metric: Metric):
    """(model's mean, ratio to other, paired interval) on the common prompts, or None."""
    a, b = model.results(split), other.results(split)
    if not a or not b:
        return None
    by_id = {str(r["id"]): r for r in b}
    pairs = [(r, by_id[str(r["id"])]) for r in a if str(r["id"]) in by_id]
    if not pairs:
        return None
    va, vb = (metric[1]([p[i] for p in pairs]) for i in (0, 1))
    if vb.mean() <= 0:
        return None
    return float(va.mean()), float(va.mean() / vb.mean()), paired_ratio_ci(va, vb)


def _verb(ci: Sequence[float]) -> str:
    return "raises" if ci[0] > 1 else "lowers" if ci[1] < 1 else "keeps"


def _ratio(ratio: float, ci: Sequence[float]) -> str:
    return f"x{ratio:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _clause(model: ModelEval, base: ModelEval, split: str, metrics: list[Metric]) -> str | None:
    parts = []
    for metric in metrics:
        cmp = _compare(model, base, split, metric)
        if cmp is None or not math.isfinite(cmp[1]):
            continue
        value, ratio, ci = cmp
        verb = _verb(ci)
        to = " to" if verb != "keeps" else " at"
        parts.append(f"{verb} {metric[0]}{to} {value:.2f} ({_ratio(ratio, ci)})")
    if not parts:
        return None
    return f"{model.name} " + (
        ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    )


def _flags(
    runs: Sequence[ModelEval], base: ModelEval | None, split: str, metrics: list[Metric]
) -> list[str]:
    grpo = next((m for m in runs if is_grpo(m)), None)
    refs = ([(base, "the base model")] if base is not None else []) + (
        [(grpo, "GRPO")] if grpo is not None else []
    )
    flags = []
    for m in runs:
        for ref, ref_name in refs:
            if ref is m or (ref is grpo and is_grpo(m)):
                continue
            for metric in metrics[1:]:  # Pass@n and styles: what the methods claim to keep
                cmp = _compare(m, ref, split, metric)
                if cmp is not None and math.isfinite(cmp[1]) and cmp[2][1] < 1:
                    flags.append(
                        f"{m.name} falls below {ref_name} on `{split}` {metric[0]} "
                        f"({_ratio(cmp[1], cmp[2])})"
                    )
    return flags


def reading(
    runs: Sequence[ModelEval], base: ModelEval | None, split: str
) -> tuple[str | None, list[str]]:
    """(one sentence on ``split``, flags) for the runs against the base (module docstring);
    no sentence without a base or without per-prompt results."""
    present = [m for m in runs if split in m.summaries]
    if base is None or split not in base.summaries or not present:
        return None, []
    s = base.summaries[split]
    n = min(int(m.summaries[split]["ks"][-1]) for m in [base, *present])
    measure = s.get("diversity", {}).get("styles_measure", "solution styles")
    label = "trace clusters / prompt" if measure == "trace clusters" else "styles / prompt"
    metrics = _metrics(n, label)
    base_results = base.results(split)
    if not base_results:
        return None, []
    base_values = ", ".join(f"{name} {f(base_results).mean():.2f}" for name, f in metrics)
    clauses = [c for m in present if (c := _clause(m, base, split, metrics))]
    if not clauses:
        return None, []
    sentence = (
        f"On `{split}`, against {base.name} ({base_values}): "
        + "; ".join(clauses)
        + " (x: ratio to the base on the same prompts, [paired 95% interval])."
    )
    return sentence, _flags(present, base, split, metrics)


def spark_reading(curves: dict[str, list[dict[str, Any]]], words: Sequence[str]) -> str:
    """One sentence per word: each run's last probability relative to the base (step 0)."""
    parts = []
    for w in words:
        ratios = []
        for name, points in curves.items():
            start, end = points[0][w], points[-1][w]
            if start > 0 and math.isfinite(end):
                ratios.append(f"{name} x{end / start:.2f}")
        if ratios:
            parts.append(f"{w!r}: " + ", ".join(ratios))
    return "At the last checkpoint, relative to the base model: " + "; ".join(parts) + "."
