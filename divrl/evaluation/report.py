"""``divrl report``: one comparison of training runs and the base model, Markdown + HTML.

Inputs are directories written by other commands:

- a **run** is a training run directory (``metrics.jsonl`` from ``divrl train``) whose
  evaluation (``divrl eval --out RUN_DIR/eval``) sits in ``RUN_DIR/eval/``, or directly an
  eval directory (sub-directories per eval set with ``summary.json`` and
  ``results.jsonl``);
- the **base** is the eval directory of the base model, on the same eval sets.

Output: ``report.md``, ``report.html`` and PNGs in the report directory: the Pass@k table
per eval set (with bootstrap intervals), Pass@k and relative Pass@k curves (the DPH
paper's Figure 1), retention of base-solved prompts, diversity (solution styles, distinct
answers, per-token negative log-prob), style histograms, training curves (reward,
entropy, KL, response length) and, when asked, spark-word probabilities over checkpoints.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from divrl.evaluation import plots
from divrl.evaluation.diversity import retention
from divrl.evaluation.report_checks import check_like_for_like, evaluated_step
from divrl.evaluation.report_doc import Doc, ModelEval, fmt, fmt_ci, slug
from divrl.evaluation.report_files import (
    read_json_object,
    read_records,
    read_summary,
    read_yaml_object,
)
from divrl.evaluation.report_html import render_html
from divrl.evaluation.report_provenance import (
    describe,
    provenance_section,
    write_report_record,
)
from divrl.evaluation.report_reading import reading
from divrl.evaluation.report_sections import diversity_section, spark_section
from divrl.evaluation.report_seeds import seed_caption, seed_mean_row
from divrl.evaluation.runner import CONFIG_FILE, SUMMARY_FILE
from divrl.evaluation.stats import paired_ratio_ci
from divrl.evaluation.summary import per_prompt_arrays
from divrl.fileio import atomic_write_text
from divrl.provenance import provenance
from divrl.runs import Checkpoint, RunDir

__all__ = [
    "ModelEval",
    "build_report",
    "headline_table",
    "load_model_eval",
    "missing_evals",
]

TRACES = "trace clusters"  # summary["diversity"]["styles_measure"] without a style classifier

TRAINING_PANELS = (
    ("Training reward", ("reward/pass@1", "reward/score"), "Pass@1 of the rollouts"),
    ("Token entropy", ("actor/entropy", "entropy/mean"), "entropy (nats per token)"),
    (
        "KL / divergence term",
        ("actor/ref_kl", "dph/divergence", "pg/approx_kl"),
        "estimate (nats per token)",
    ),
    ("Response length", ("response/length",), "mean length (tokens)"),
    (
        "Lp-Reg: regularised tokens pushed up",
        ("lp_reg/net_up_share",),
        "share (net push -|A| r + beta (exp(D) - 1) > 0)",
    ),
)


def load_model_eval(path: str | Path, name: str | None = None) -> ModelEval:
    """Read a run directory (with ``eval/``) or an eval directory."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"not a directory: {path}")
    eval_dir = path / "eval" if (path / "eval").is_dir() else path
    read = {p.parent.name: read_summary(p) for p in sorted(eval_dir.glob(f"*/{SUMMARY_FILE}"))}
    summaries = {split: summary for split, summary in read.items() if summary is not None}
    metrics_path = RunDir(path).metrics_path
    metrics = (
        read_records(metrics_path, "the report shows the steps before it", stop_at_bad=True)
        if metrics_path.is_file()
        else []
    )
    if not summaries and not metrics:
        raise FileNotFoundError(
            f"{path}: no evaluation (*/{SUMMARY_FILE} in {eval_dir}) and no metrics.jsonl; "
            f"run `divrl eval --out {path / 'eval'}` first"
        )
    run_dir = path if metrics else None
    return ModelEval(
        name=name or path.name,
        eval_dir=eval_dir,
        run_dir=run_dir,
        summaries=summaries,
        metrics=metrics,
        eval_configs={s: read_json_object(eval_dir / s / CONFIG_FILE) for s in summaries},
        run_config=read_yaml_object(RunDir(path).config_path) if run_dir else None,
        run_provenance=RunDir(path).provenance() if run_dir else [],
        checkpoint_step=_newest_model_step(RunDir(path)) if run_dir else None,
    )


def _newest_model_step(run: RunDir) -> int | None:
    model = run.final_model()
    return None if model is None else Checkpoint.at(model.parent).step


# --------------------------------------------------------------------------- numbers


def _paired(base: ModelEval, model: ModelEval, split: str) -> tuple[dict, dict] | None:
    """Per-prompt arrays of base and model on their common prompts, in one order."""
    b, m = base.results(split), model.results(split)
    if not b or not m:
        return None
    m_by_id = {str(r["id"]): r for r in m}
    pairs = [(r, m_by_id[str(r["id"])]) for r in b if str(r["id"]) in m_by_id]
    if not pairs:
        return None
    return per_prompt_arrays([p[0] for p in pairs]), per_prompt_arrays([p[1] for p in pairs])


def _relative(base: ModelEval, model: ModelEval, split: str, k: int, seed: int = 0):
    """(Pass@k ratio, paired bootstrap CI) on the common prompts, or None."""
    from divrl.evaluation.pass_at_k import pass_at_k_array

    paired = _paired(base, model, split)
    if paired is None:
        return None
    a_b, a_m = paired
    if k > min(a_b["n"].min(), a_m["n"].min()):
        return None
    vb, vm = pass_at_k_array(a_b["n"], a_b["c"], k), pass_at_k_array(a_m["n"], a_m["c"], k)
    ratio = vm.mean() / vb.mean() if vb.mean() > 0 else math.nan
    return float(ratio), paired_ratio_ci(vm, vb, seed=seed)


def headline_table(models: Sequence[ModelEval], splits: Sequence[str]) -> list[list[str]]:
    """Rows ``[eval set, model, greedy, P@1, P@n [CI], styles / prompt, 1 style]`` (header
    first), one per eval set and model: accuracy and diversity side by side."""
    n_max = max((m.summaries[s]["ks"][-1] for m in models for s in m.summaries), default=0)
    rows = [
        [
            "eval set",
            "model",
            "greedy",
            "P@1",
            f"P@n [CI] (n = {n_max})" if n_max else "P@n",
            "styles / prompt",
            "1 style",
        ]
    ]
    for split in splits:
        for i, m in enumerate(models):
            s = m.summaries.get(split)
            shown = split if i == 0 else ""  # the set named once per group of rows
            _seed_rows_before(rows, models, i, split)
            if s is None:
                rows.append([shown, m.label, *["-"] * 5])
                continue
            n = str(s["ks"][-1])
            label = fmt_ci(s["pass@k"].get(n), s["pass@k_ci"].get(n))
            d = s.get("diversity", {})
            # a set without a style classifier counts trace clusters in the styles' place
            mark = " (traces)" if d.get("styles_measure") == TRACES else ""
            rows.append(
                [
                    shown,
                    m.label,
                    fmt(s.get("greedy_accuracy")),
                    fmt(s["pass@k"]["1"]),
                    label if n == str(n_max) else f"{label} (n = {n})",
                    fmt(d.get("mean_distinct_styles"), 2) + mark,
                    fmt(d.get("share_one_style"), 2) + mark,
                ]
            )
        _seed_rows_before(rows, models, len(models), split)
    return rows


def _seed_rows_before(rows: list[list[str]], models: Sequence[ModelEval], i: int, split: str):
    """Before row ``i`` (or at the end), the mean ± s.e. row of the method whose seeds end
    there, when it has several seeds evaluated on ``split``."""
    if i == 0 or (i < len(models) and models[i].method == models[i - 1].method):
        return
    members = [m for m in models if m.method == models[i - 1].method]
    if sum(split in m.summaries for m in members) > 1:
        rows.append(seed_mean_row(members, split))


def missing_evals(models: Sequence[ModelEval]) -> list[str]:
    """One sentence per model that lacks an eval set some other model has."""
    splits = sorted({s for m in models for s in m.summaries}, key=_split_order)
    out = []
    for m in models:
        missing = [s for s in splits if s not in m.summaries]
        if missing:
            sets = ", ".join(missing)
            out.append(
                f"model {m.name} has no evaluation of {sets} (looked in {_show(m.eval_dir)}); "
                f"its cells show '-': run `divrl eval --out {_show(m.eval_dir)} ...` on "
                f"{'that set' if len(missing) == 1 else 'those sets'}"
            )
    return out


# --------------------------------------------------------------------------- document


def build_report(
    runs: Sequence[ModelEval],
    base: ModelEval | None,
    out_dir: str | Path,
    *,
    title: str = "divrl report",
    spark_words: Sequence[str] = (),
    spark_split: str | None = None,
    spark_max_texts: int = 32,
    command: str | None = None,
) -> Path:
    """Write ``report.md``, ``report.html`` and the PNGs into ``out_dir``; returns the .md.

    ``spark_words``: also plot each word's probability over every run's checkpoints (and the
    base model at step 0), measured on the base model's greedy responses to the first
    ``spark_max_texts`` prompts of ``spark_split`` (default: the first eval set).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    models = ([base] if base is not None else []) + list(runs)
    splits = sorted({s for m in models for s in m.summaries}, key=_split_order)
    colors = plots.model_colors([m.name for m in models])
    doc = Doc()
    doc.h(1, title)
    if command is None:
        command = "divrl report " + shlex.join(sys.argv[2:])
    doc.p(f"Produced by `{command}` with {describe(provenance())}.")
    mismatches = check_like_for_like(runs, base)
    _describe_inputs(doc, models, base)
    if mismatches:
        doc.h(2, "Not like for like")
        doc.p(
            "**Warning:** the rows marked ⚠ were not made like the others (shown because "
            "of `--allow-mismatch`):\n\n" + "\n".join(f"- {line}" for line in mismatches)
        )
    provenance_section(doc, models)
    missing = missing_evals(models)
    if missing:
        doc.h(2, "Missing evaluations")
        doc.p("**Warning:** " + " ".join(f"{m[0].upper()}{m[1:]}." for m in missing))

    if splits:
        doc.h(2, "Headline")
        doc.table(headline_table(models, splits), align_left=2)
        doc.p(seed_caption(models) + " " + _headline_note(models))
        _reading_section(doc, runs, base, splits)
    for split in splits:
        _split_section(doc, out, models, base, split, colors)

    if any(m.metrics for m in runs):
        doc.h(2, "Training curves")
        path = plots.plot_training_curves(
            {m.name: m.metrics for m in runs if m.metrics},
            TRAINING_PANELS,
            out / "training_curves.png",
            colors=colors,
            title="Training metrics per step",
        )
        doc.image(path, out, "training curves")
        doc.p(
            "From each run's `metrics.jsonl`. Reward: Pass@1 of the step's rollouts. Entropy: "
            "mean full-vocabulary entropy of the policy on its rollout tokens. KL panel: the "
            "reverse KL to the reference model (`actor/ref_kl`) when the run has one, else the "
            "DPH divergence on reference samples (`dph/divergence`), else the approximate KL "
            "between the rollout policy and the updated one (`pg/approx_kl`); the legend names "
            "the key when it is not the first."
        )

    if spark_words and base is not None and splits:
        split = spark_split or splits[0]
        spark_section(doc, out, runs, base, spark_words, split, spark_max_texts, colors)

    markdown = doc.markdown()
    md_path = out / "report.md"
    # each file whole: an interrupted report leaves the previous one
    atomic_write_text(md_path, markdown)
    atomic_write_text(out / "report.html", render_html(markdown, title, out))
    write_report_record(out, models, command)
    return md_path


def _headline_note(models: Sequence[ModelEval]) -> str:
    """What the headline's columns mean (and the trace-cluster mark when a set uses it)."""
    return (
        "Greedy: accuracy of the temperature-0 response. P@k: unbiased Pass@k from n "
        "samples per prompt, averaged over prompts, with its 95% bootstrap interval over "
        "prompts at the largest k. Styles / prompt: distinct solution styles among a "
        "prompt's n samples (higher = more diverse); 1 style: share of prompts whose "
        "samples all use one style (lower = more diverse)."
        + (
            " `(traces)`: the eval set's data source has no style classifier, so its "
            "samples are grouped by the similarity of their text instead (trace clusters, "
            "docs/evaluation.md), a coarser count that compares models on one eval set, "
            "not across sets."
            if any(
                s.get("diversity", {}).get("styles_measure") == TRACES
                for m in models
                for s in m.summaries.values()
            )
            else ""
        )
    )


def _reading_section(
    doc: Doc, runs: Sequence[ModelEval], base: ModelEval | None, splits: Sequence[str]
) -> None:
    """One sentence per eval set and the flags (:mod:`divrl.evaluation.report_reading`)."""
    readings = [reading(runs, base, split) for split in splits]
    sentences = [r[0] for r in readings if r[0]]
    flags = [f for r in readings for f in r[1]]
    if not sentences:
        return
    doc.h(2, "What the table shows")
    doc.p(
        "Each trained model against the base model on the same prompts: raises / keeps / "
        "lowers by whether the paired 95% bootstrap interval of the ratio lies above 1, "
        "contains it, or lies below it."
    )
    doc.p("\n".join(f"- {s}" for s in sentences))
    if flags:
        doc.p("\n".join(f"- **Flag:** {f}." for f in flags))
    else:
        doc.p(
            "No flag: no model falls below the base, and no method below GRPO, on Pass@n or "
            "diversity with an interval that excludes equality."
        )


def _split_order(split: str) -> tuple[int, str]:
    known = ("test", "in_domain", "cross_domain", "ood_math", "ood")
    return (known.index(split) if split in known else len(known), split)


def _show(path: Path) -> str:
    """A path relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _evaluated_at(m: ModelEval) -> str:
    """``, evaluated at step N`` (the checkpoints the eval sets name), or nothing."""
    steps = sorted({s for split in m.summaries if (s := evaluated_step(m, split)[0]) is not None})
    return f", evaluated at step {'/'.join(map(str, steps))}" if steps else ""


def _describe_inputs(doc: Doc, models: Sequence[ModelEval], base: ModelEval | None) -> None:
    rows = [["model", "evaluation", "training run", "eval sets"]]
    for m in models:
        role = " (base)" if m is base else ""
        rows.append(
            [
                m.label + role,
                f"`{_show(m.eval_dir)}`",
                f"`{_show(m.run_dir)}` ({m.steps} steps{_evaluated_at(m)})" if m.run_dir else "-",
                ", ".join(m.summaries) or "-",
            ]
        )
    doc.h(2, "Inputs")
    doc.table(rows, align_left=len(rows[0]))
    first = next((s for m in models for s in m.summaries.values()), None)
    if first:
        sp = first["sampling"]
        doc.p(
            f"Sampling: n = {first['n_samples_per_prompt']} per prompt, temperature "
            f"{sp['temperature']}, top-p {sp['top_p']}, top-k {sp['top_k']}, at most "
            f"{sp['max_new_tokens']} new tokens; intervals are {int(first['confidence'] * 100)}% "
            "percentile bootstrap intervals over prompts."
        )


def _split_section(
    doc: Doc,
    out: Path,
    models: Sequence[ModelEval],
    base: ModelEval | None,
    split: str,
    colors: dict[str, str],
) -> None:
    present = [m for m in models if split in m.summaries]
    s0 = present[0].summaries[split]
    ks = s0["ks"]
    n = ks[-1]
    doc.h(2, f"Eval set `{split}`")
    doc.p(f"{s0['n_prompts']} prompts, {s0['n_samples_per_prompt']} samples per prompt.")
    header = ["model", "greedy", "P@1 [CI]", *[f"P@{k}" for k in ks[1:-1]], f"P@{n} [CI]"]
    header += [f"maj@{n} [CI]"]
    if base is not None:
        header += ["P@1 / base [CI]", f"P@{n} / base [CI]", "retention"]
    rows = [header]
    for m in present:
        s = m.summaries[split]
        row = [
            m.label,
            fmt_ci(s.get("greedy_accuracy"), s.get("greedy_accuracy_ci")),
            fmt_ci(s["pass@k"]["1"], s["pass@k_ci"]["1"]),
            *[fmt(s["pass@k"].get(str(k))) for k in ks[1:-1]],
            fmt_ci(s["pass@k"].get(str(n)), s["pass@k_ci"].get(str(n))),
            fmt_ci(s["maj@k"].get(str(n)), s["maj@k_ci"].get(str(n))),
        ]
        if base is not None:
            for k in (1, n):
                rel = None if m is base else _relative(base, m, split, k)
                row.append("1" if m is base else ("-" if rel is None else fmt_ci(*rel)))
            b_res, m_res = base.results(split), m.results(split)
            if m is base or not b_res or not m_res:
                row.append("-")
            else:
                r = retention(b_res, m_res)
                row.append(f"{fmt(r['retention'], 2)} ({r['retained']}/{r['base_solved']})")
        rows.append(row)
    doc.table(rows)
    if base is not None:
        doc.p(
            "`/ base`: Pass@k of the model divided by the base model's on the same prompts, "
            "with a paired bootstrap interval. Retention: share of the prompts the base model "
            "solves (at least one correct sample) that the model still solves."
        )

    _pass_at_k_plots(doc, out, present, base, split, colors)
    diversity_section(doc, out, present, split, colors)


def _pass_at_k_plots(
    doc: Doc,
    out: Path,
    present: Sequence[ModelEval],
    base: ModelEval | None,
    split: str,
    colors: dict[str, str],
) -> None:
    """Pass@k with bootstrap bands; with a base, Pass@k / base's with paired bands."""
    curves = {
        split: {
            m.name: {int(k): v for k, v in m.summaries[split]["pass@k"].items()} for m in present
        }
    }
    bands = {
        split: {
            m.name: {int(k): tuple(v) for k, v in m.summaries[split]["pass@k_ci"].items()}
            for m in present
        }
    }
    path = plots.plot_pass_at_k(
        curves,
        out / f"pass_at_k_{slug(split)}.png",
        intervals=bands,
        colors=colors,
        title=f"Pass@k on {split}",
    )
    if base is None or len(present) < 2:
        doc.image(path, out, f"Pass@k on {split}")
        return
    ratios: dict[str, dict[int, float]] = {}
    ratio_bands: dict[str, dict[int, tuple[float, float]]] = {}
    for m in present:
        if m is base:
            continue
        for k in curves[split][m.name]:
            rel = _relative(base, m, split, k)
            if rel is not None and math.isfinite(rel[0]):
                ratios.setdefault(m.name, {})[k] = rel[0]
                ratio_bands.setdefault(m.name, {})[k] = tuple(rel[1])
    if not ratios:
        doc.image(path, out, f"Pass@k on {split}")
        return
    rel_path = plots.plot_pass_at_k(
        {split: ratios},
        out / f"relative_pass_at_k_{slug(split)}.png",
        relative_to=base.name,
        intervals={split: ratio_bands},
        colors=colors,
        title=f"Pass@k relative to {base.name} on {split}",
    )
    doc.images([path, rel_path], out, [f"Pass@k on {split}", f"relative Pass@k on {split}"])
