"""The report's diversity tables, style histogram and spark-word section."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from divrl.evaluation import plots
from divrl.evaluation.diversity import checkpoint_models, spark_word_curve
from divrl.evaluation.report_doc import Doc, ModelEval, fmt, slug
from divrl.evaluation.report_reading import spark_reading

__all__ = ["diversity_section", "spark_section"]


def diversity_section(
    doc: Doc, out: Path, present: Sequence[ModelEval], split: str, colors: dict[str, str]
) -> None:
    """The diversity table (styles, answers, NLL, length) and the style histogram."""
    doc.h(3, "Diversity")
    rows = [
        [
            "model",
            "styles / prompt",
            "1 style",
            ">= 3 styles",
            "correct styles / solved prompt",
            "distinct correct answers",
            "NLL / token",
            "length (tokens)",
        ]
    ]
    for m in present:
        d, t = m.summaries[split]["diversity"], m.summaries[split]["tokens"]
        rows.append(
            [
                m.name,
                fmt(d.get("mean_distinct_styles"), 2),
                fmt(d.get("share_one_style"), 2),
                fmt(d.get("share_3plus_styles"), 2),
                fmt(d.get("mean_distinct_correct_styles"), 2),
                fmt(d.get("mean_distinct_correct_answers"), 2),
                fmt(t.get("mean_nll_per_token"), 3),
                fmt(t.get("mean_response_tokens"), 1),
            ]
        )
    doc.table(rows)
    _text_diversity_table(doc, present, split)
    doc.p(
        "Styles: the solution style of each sample (SQL: the query's syntactic shape from its "
        "sqlglot AST; toy math: the solution method; see docs/evaluation.md), counted per "
        "prompt over its n samples; `1 style` / `>= 3 styles`: share of prompts. NLL / token: "
        "mean negative log-probability of the sampled tokens under the model (an estimate of "
        "its per-token entropy at temperature 1 without top-p/top-k)."
    )
    at_context = {
        m.name: m.summaries[split]["tokens"].get("at_context_share") or 0.0 for m in present
    }
    if any(at_context.values()):
        shares = ", ".join(f"{name} {share:.1%}" for name, share in at_context.items())
        doc.p(
            "Responses cut where prompt + response reached the model's context (before "
            f"max_new_tokens; counted as truncated): {shares}."
        )
    counts = {
        m.name: m.summaries[split]["diversity"]["style_counts"]
        for m in present
        if m.summaries[split]["diversity"]["style_counts"]
    }
    if counts:
        path = plots.plot_style_histogram(
            counts,
            out / f"styles_{slug(split)}.png",
            colors=colors,
            title=f"Solution styles on {split} (all samples)",
        )
        doc.image(path, out, f"styles on {split}")


def _text_diversity_table(doc: Doc, present: Sequence[ModelEval], split: str) -> None:
    """The measures every data source has (no style classifier needed)."""
    divs = [m.summaries[split]["diversity"] for m in present]
    if not any("self_bleu" in d for d in divs):
        return  # evaluated before these measures existed
    with_math = any(d.get("mean_math_trace_styles") is not None for d in divs)
    rows = [
        [
            "model",
            "distinct-2",
            "self-BLEU",
            "answers / prompt",
            "answer entropy (bits)",
            "trace clusters / prompt",
            "1 trace cluster",
            *(["math trace styles / prompt"] if with_math else []),
        ]
    ]
    for m, d in zip(present, divs, strict=True):
        rows.append(
            [
                m.name,
                fmt(d.get("distinct_2")),
                fmt(d.get("self_bleu")),
                fmt(d.get("mean_answer_clusters"), 2),
                fmt(d.get("mean_answer_entropy_bits"), 2),
                fmt(d.get("mean_trace_clusters"), 2),
                fmt(d.get("share_one_trace_cluster"), 2),
                *([fmt(d.get("mean_math_trace_styles"), 2)] if with_math else []),
            ]
        )
    doc.table(rows)
    doc.p(
        "Without a style classifier (docs/evaluation.md): distinct-2, distinct word bigrams "
        "among all bigrams of a prompt's samples (higher = more diverse); self-BLEU, BLEU-4 of "
        "each sample against the prompt's other samples (lower = more diverse); answers / "
        "prompt and their entropy, distinct final answers (equivalence clusters) among the "
        "samples with one; trace clusters, samples grouped by the similarity of their text "
        "(numbers masked)"
        + ("; math trace styles, the kinds of work a solution shows" if with_math else "")
        + "."
    )


def spark_section(
    doc: Doc,
    out: Path,
    runs: Sequence[ModelEval],
    base: ModelEval,
    words: Sequence[str],
    split: str,
    max_texts: int,
    colors: dict[str, str],
) -> None:
    results = base.results(split) or []
    texts = [(r["prompt"], r["greedy"]["text"]) for r in results if r.get("greedy")][:max_texts]
    base_model = base.model_path
    if not texts or base_model is None:
        doc.p("Spark words: skipped (the base evaluation has no greedy responses or model path).")
        return
    prompts, responses = [t[0] for t in texts], [t[1] for t in texts]
    base_point = spark_word_curve([(0, base_model)], prompts, responses, words)
    curves: dict[str, list[dict[str, Any]]] = {}
    for m in runs:
        ckpts = checkpoint_models(m.run_dir) if m.run_dir else []
        if ckpts:
            curves[m.name] = base_point + spark_word_curve(ckpts, prompts, responses, words)
    doc.h(2, "Spark words")
    if not curves:
        doc.p("Spark words: skipped (no run has checkpoints).")
        return
    path = plots.plot_spark_words(
        curves,
        words,
        out / "spark_words.png",
        colors=colors,
        title="Probability of starting a word",
    )
    doc.image(path, out, "spark words")
    last = [["run", *[f"{w!r}" for w in words]]]
    for name, points in curves.items():
        last.append(
            [f"{name} (step {points[-1]['step']})", *[f"{points[-1][w]:.2e}" for w in words]]
        )
    last.append([f"{base.name} (step 0)", *[f"{base_point[0][w]:.2e}" for w in words]])
    doc.table(last)
    doc.p(
        f"Mean probability that the word's token sequence starts at a response position, over "
        f"every position of the base model's greedy responses to {len(texts)} `{split}` "
        "prompts, for every saved checkpoint (step 0 = the base model)."
    )
    doc.p(
        "How to read it: the texts are fixed, so a curve moves only because the model "
        "changes. A word whose probability falls with training is one the policy stops "
        "proposing: the Lp-Reg paper's account of lost exploration is GRPO pushing such "
        "low-probability 'spark' words down, and Lp-Reg keeping them near the base. Compare "
        "each run's last point with step 0 and with GRPO's last point; the values are small "
        "absolute probabilities, so read them as ratios (the log-scale plot and the sentence "
        "below do). A word the base model almost never starts says little either way. "
        + spark_reading(curves, words)
    )
