"""Like for like in ``experiments.reproduce``'s report: which per-run summaries may share
one table.

The report puts every summary of ``<results>/summaries/`` side by side. Before it does,
each summary is read as a model of ``divrl report`` (:func:`as_model`) and
:func:`divrl.evaluation.report_checks.check_like_for_like` compares them, so the two
commands refuse the same differences:

- **evaluation settings**, per eval split: samples per prompt (``n``), the response length
  (``max_new_tokens``) and the prompts evaluated (``eval_prompts``, divrl's ``limit``;
  ``all`` when unset); the eval seed is left out (each seed is evaluated with its own, by
  design);
- **evaluation data**: the fingerprint of the prompts each split evaluated (the
  evaluation's provenance);
- **training data handling**: ``data.train_path``, ``template``, ``limit``,
  ``max_prompt_length``, ``truncation`` and ``skip_invalid`` of the run's config, and the
  fingerprint of the prompts it trained on (the run's provenance);

and, beside them, the settings only an experiment has (:data:`WORLD_SETTINGS`): the
world (its name, its folder name, which names its build seed and content hash, its size)
and the number of training steps.

``experiments.reproduce`` also compares the methods' presets' data handling before it
trains anything (:func:`refuse_unlike_presets`). A difference is refused in one line
naming the two runs and the setting (a
:class:`~experiments.records.ResultError`: ``experiments.reproduce`` exits 2), unless
``--allow-mismatch`` is given: then every table row of a method with a differing run is
marked ``⚠`` (:func:`mark_rows`, also the claims that use it) and the report lists the
differences under "Not like for like" (:func:`footnote`).

Summaries written before the runs recorded provenance and data handling (those committed
in ``docs/results/`` up to 2026-12-05) are compared on what they record: their
``settings`` (world, size, steps, ``n``, ``eval_prompts``, ``max_new_tokens``) and the
samples per prompt of each split. A setting one of two summaries does not record is not
compared (it is neither a match nor a refusal); a report of such summaries is the same,
byte for byte, as before these checks.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from divrl.evaluation.report_checks import DATA_HANDLING, check_like_for_like
from divrl.evaluation.report_doc import ModelEval
from divrl.toy.worlds import DEFAULT_WORLD
from experiments.records import ResultError

__all__ = [
    "MARK",
    "WORLD_SETTINGS",
    "add_compare_arguments",
    "as_model",
    "data_handling",
    "footnote",
    "like_for_like",
    "mark_rows",
    "refuse_unlike_presets",
    "run_name",
]

MARK = "⚠"
#: ``settings`` keys compared here (divrl's checks compare the evaluation's)
WORLD_SETTINGS = ("world_name", "world", "toy_size", "steps")
#: ``settings`` key -> the evaluation setting divrl's check compares
_EVAL_SETTINGS = {"max_new_tokens": "max_new_tokens", "eval_prompts": "limit"}


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="put summaries whose world, steps, training data handling or evaluation "
        "settings or data differ side by side in the report, their rows marked ⚠ and the "
        "differences listed (default: refuse, naming the two runs and the setting)",
    )


def data_handling(cfg: Any) -> dict[str, Any]:
    """The run config's ``data.*`` settings that decide which prompts it trains on, and how
    (:data:`divrl.evaluation.report_checks.DATA_HANDLING`), for its summary."""
    data = asdict(cfg.data)
    return {k: data[k] for k in DATA_HANDLING}


def refuse_unlike_presets(cfgs: Mapping[str, Any], *, allow: bool) -> None:
    """Before any run: raise :class:`ResultError` (one line) when the methods' resolved
    presets handle their training data differently (``--allow-mismatch``: go on; the
    report then marks the rows), with ``divrl report``'s check of the runs' configs."""
    models = [
        ModelEval(name=f"the {m} preset", eval_dir=Path(m), run_config={"data": data_handling(c)})
        for m, c in cfgs.items()
    ]
    lines = check_like_for_like(models, None)
    if lines and not allow:
        raise ResultError(
            f"{lines[0]}: give every method the same data handling (the world's presets "
            "share it), or pass --allow-mismatch to run them and mark their rows"
        )


def run_name(summary: Mapping[str, Any]) -> str:
    return f"{summary['method']} seed {summary['seed']}"


def as_model(summary: Mapping[str, Any]) -> ModelEval:
    """A per-run summary as ``divrl report``'s model: what its checks read, from what the
    summary records (module docstring); no file is read."""
    settings = summary.get("settings") or {}
    prov = summary.get("provenance") or {}
    config = {
        key: ("all" if settings[name] is None else settings[name])
        for name, key in _EVAL_SETTINGS.items()
        if name in settings
    }
    evals = prov.get("eval") or {}
    data = (summary.get("config") or {}).get("data")
    return ModelEval(
        name=run_name(summary),
        eval_dir=Path(run_name(summary)),  # not read: the checks use the records below
        summaries={
            split: {"n_samples_per_prompt": ev.get("n_samples"), "provenance": evals.get(split)}
            for split, ev in summary.get("eval", {}).items()
        },
        eval_configs={split: {"config": config} for split in summary.get("eval", {})},
        run_config={"data": data} if data else None,
        run_provenance=list(prov.get("training") or []),
        group=summary["method"],
    )


def _world(summary: Mapping[str, Any]) -> dict[str, Any]:
    settings = summary.get("settings") or {}
    found = {k: settings[k] for k in WORLD_SETTINGS if k in settings}
    if "world" in found:  # the default world's summaries leave its name out
        found.setdefault("world_name", DEFAULT_WORLD)
    return found


def _world_differences(summaries: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    ref = summaries[0]
    theirs = _world(ref)
    for s in summaries[1:]:
        mine = _world(s)
        diff = [
            f"{k} {mine[k]!r} vs {theirs[k]!r}"
            for k in WORLD_SETTINGS
            if k in mine and k in theirs and mine[k] != theirs[k]
        ]
        if diff:
            out.setdefault(s["method"], []).append(
                f"{run_name(s)}: made in another world or for other steps than "
                f"{run_name(ref)}: " + ", ".join(diff)
            )
    return out


def like_for_like(
    summaries: Sequence[Mapping[str, Any]], *, allow: bool, where: Path | str
) -> dict[str, list[str]]:
    """``{method: [sentence, ...]}`` of the methods whose runs are not like for like with
    the first summary's (in the report's order, base first); empty when all are alike.

    Raises :class:`ResultError` (one line: ``where``, the first difference, the flag) on
    any difference unless ``allow``."""
    if not summaries:
        return {}
    from experiments.reproduce_report import by_method

    ordered = [s for runs in by_method(summaries).values() for s in runs]
    marks = _world_differences(ordered)
    models = [as_model(s) for s in ordered]
    check_like_for_like(models, None)
    for m in models:
        marks.setdefault(m.method, []).extend(f"{m.name}: {x}" for x in m.mismatches)
    marks = {k: v for k, v in marks.items() if v}
    lines = [x for v in marks.values() for x in v]
    if lines and not allow:
        more = f" ({len(lines) - 1} more difference{'s' if len(lines) > 2 else ''})"
        raise ResultError(
            f"{where}: {lines[0]}{more if len(lines) > 1 else ''}: these runs are not like "
            "for like; give each method the same world, data handling and evaluation "
            "settings, or pass --allow-mismatch to build the tables with their rows marked"
        )
    return marks


def footnote(marks: Mapping[str, Sequence[str]]) -> list[str]:
    """The report's lines naming each difference (preamble lines; none when alike)."""
    if not marks:
        return []
    return [
        f"**{MARK} Not like for like** (built with `--allow-mismatch`): the rows marked "
        f"{MARK} are of methods whose runs differ from the first run's in:",
        "",
        *[f"- {line}" for lines in marks.values() for line in lines],
        "",
    ]


def mark_rows(markdown: str, marks: Mapping[str, Sequence[str]]) -> str:
    """``markdown`` with :data:`MARK` after the label of every table row of a marked
    method, and after the claim of every claim that reads one."""
    if not marks:
        return markdown
    from experiments.reproduce_report import CLAIMS, METHODS

    starts = {f"| {METHODS.get(m, m)} |": f"| {METHODS.get(m, m)} {MARK} |" for m in marks}
    for c in CLAIMS:
        if c.a[0] in marks or c.b[0] in marks:
            row = f"| {c.paper} | {c.text} |"
            starts[row] = f"| {c.paper} | {c.text} {MARK} |"
    out = []
    for line in markdown.split("\n"):
        for start, marked in starts.items():
            if line.startswith(start):
                line = marked + line[len(start) :]
                break
        out.append(line)
    return "\n".join(out)
