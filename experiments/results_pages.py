"""The hand-written results pages' tables, generated from the data committed beside them.

A results page written by hand (a reading of a generated report, the rehearsal-control
page) keeps each of its number-bearing tables in one of three ways:

- **generated here**: between ``<!-- generated table: NAME ... -->`` and
  ``<!-- end of generated table -->``, the table :data:`TABLES` ``[NAME]`` builds from the
  per-run summaries (or other result files) in ``docs/results/``;
- **recomputed by another check**: the pages ``experiments.reproduce`` writes, and the
  sparks page's tables made by :func:`experiments.sparks_dynamics.report`
  (tests/experiments/test_results_tables.py);
- **marked**: the paragraph above the table starts with ``*Not recomputed`` and says why
  (the numbers come from files that were not kept).

``python -m experiments.results_pages`` rewrites the generated tables of every page in
:data:`PAGES` from the stored data; ``--check`` changes nothing and exits 1 naming the
first row that differs. tests/experiments/test_results_tables.py runs the check, so a
table edited by hand, or a summary changed without its page, fails it.

Numbers are ``mean ± SE`` (standard error over seeds: sample sd / sqrt(seeds)) or
``mean ± sd`` as each table's caption on its page says.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import reproduce_report as rr

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
#: pages with generated tables (relative to docs/results)
PAGES = ("rehearsal_control.md", "countdown_reproduction_reading.md",
         "countdown_reproduction_20261201_reading.md", "lp_reg_regime.md", "sparks_world.md")  # fmt: skip
BLOCK = re.compile(
    r"(<!-- generated table: (?P<name>[\w.]+)[^>]*-->\n)(?P<body>.*?)(<!-- end of generated table -->)",
    re.S,
)
NOT_RECOMPUTED = "*Not recomputed"


# --------------------------------------------------------------------------- numbers


def _values(runs: Sequence[dict[str, Any]], name: str) -> list[float]:
    out = [rr.metric(r, name) for r in runs]
    return [float(v) for v in out if v is not None and not math.isnan(float(v))]


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error (sample sd / sqrt(n); None for one value)."""
    s = rr.stat(values)
    return s.mean, None if s.sd is None else s.sd / math.sqrt(s.n)


def fmt_se(values: Sequence[float], digits: int = 3) -> str:
    mean, se = mean_se(values)
    return f"{mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(cells: Sequence[str]) -> list[str]:
    return [_row(cells), "|" + "---|" * len(cells)]


def load(folder: str) -> dict[str, list[dict[str, Any]]]:
    """The per-run summaries of ``docs/results/<folder>/summaries``, by method."""
    return rr.by_method(rr.load_summaries(RESULTS / folder / "summaries"))


# --------------------------------------------------------------------------- table kinds


def arms_table(
    folder: str,
    arms: Sequence[tuple[str, str]],
    columns: Sequence[tuple[str, str]],
    digits: int = 3,
) -> list[str]:
    """One row per ``(method, label)``: the seeds, then ``mean ± SE`` of each
    ``(header, metric)`` column (:func:`experiments.reproduce_report.metric` names)."""
    groups = load(folder)
    lines = _head(["model", "seeds", *[h for h, _ in columns]])
    for method, label in arms:
        runs = groups[method]
        cells = [fmt_se(_values(runs, m), digits) for _, m in columns]
        lines.append(_row([label, str(len(runs)), *cells]))
    return lines


def seeds_table(
    folder: str, methods: Sequence[str], columns: Sequence[tuple[str, str]]
) -> list[str]:
    """One row per run of each method, by seed: each ``(header, metric)`` to 3 digits."""
    groups = load(folder)
    lines = _head(["model", "seed", *[h for h, _ in columns]])
    for method in methods:
        for run in groups[method]:
            cells = [f"{rr.metric(run, m):.3f}" for _, m in columns]
            lines.append(_row([method, str(run["seed"]), *cells]))
    return lines


@dataclass(frozen=True)
class Part:
    """One comparison of a goal: ``arm``'s metric at least ``ref``'s (``(method, metric)``)
    plus ``offset`` (a number, or ``"-se"``: minus one standard error of ``ref``)."""

    label: str
    arm: tuple[str, str]
    ref: tuple[str, str]
    offset: float | str = 0.0


def goals_table(
    folder: str, arm_label: str, goals: Sequence[tuple[str, Sequence[Part]]]
) -> list[str]:
    """One row per goal: its threshold, the arm's ``mean ± SE`` and whether the mean
    reaches the threshold, by how much (noting a margin within one standard error of
    the arm) and the seeds' values."""
    groups = load(folder)
    lines = _head(["goal", "threshold", arm_label, "met"])
    for text, parts in goals:
        thresholds, values, details, met = [], [], [], True
        for p in parts:
            ref_mean, ref_se = mean_se(_values(groups[p.ref[0]], p.ref[1]))
            seeds = _values(groups[p.arm[0]], p.arm[1])
            mean, se = mean_se(seeds)
            off = -ref_se if p.offset == "-se" else float(p.offset)
            thr = ref_mean + off
            label = f"{p.label} " if p.label else ""
            shown = f"{ref_mean:.3f}" + (
                "" if off == 0 else f" - {(-off):.3f} = {thr:.3f}" if p.offset == "-se"
                else f" - {-off:g} = {thr:.3f}"
            )  # fmt: skip
            thresholds.append(label + shown)
            values.append(fmt_se(seeds))
            near = ", within one standard error" if se is not None and abs(mean - thr) < se else ""
            details.append(
                f"{p.label + ': ' if p.label else ''}by {abs(mean - thr):.3f}{near}; seeds "
                + ", ".join(f"{v:.3f}" for v in seeds)
            )
            met = met and mean >= thr
        verdict = f"{'yes' if met else 'no'} ({'; '.join(details)})"
        lines.append(_row([text, ", ".join(thresholds), ", ".join(values), verdict]))
    return lines


def ablation_table(
    folder: str,
    arms: Sequence[tuple[str, str]],
    bold: Sequence[tuple[str, int]] = (),
) -> list[str]:
    """The countdown reading's replica table: ``mean ± sd`` of Pass@1, Pass@32 in and
    across domains and math Pass@32, mean styles per prompt (in / cross) and mean
    cross-domain retention; ``bold``: ``(method, column index)`` cells set in bold."""
    groups = load(folder)
    lines = _head(["arm", "in-domain Pass@1", "in-domain Pass@32", "cross-domain Pass@32",
                   "math Pass@32", "styles per prompt (in / cross)", "cross-domain retention"])  # fmt: skip
    for method, label in arms:
        runs = groups[method]
        cells = [
            rr.stat(_values(runs, m)).fmt()
            for m in ("test.pass@1", "test.pass@32", "cross_domain.pass@32", "ood_math.pass@32")
        ]
        styles = [
            rr.stat(_values(runs, f"{s}.mean_distinct_styles")).mean
            for s in ("test", "cross_domain")
        ]
        cells.append(f"{styles[0]:.2f} / {styles[1]:.2f}")
        cells.append(f"{rr.stat(_values(runs, 'cross_domain.retention')).mean:.3f}")
        cells = [f"**{c}**" if (method, i + 1) in bold else c for i, c in enumerate(cells)]
        lines.append(_row([label, *cells]))
    return lines


def versus_table(
    folder: str,
    subject: tuple[str, str, str],
    others: Sequence[tuple[str, str]],
    rows: Sequence[tuple[str, str, int]],
) -> list[str]:
    """One row per ``(label, metric, digits)``: ``mean ± sd`` of each method (the
    ``others`` and the ``subject``: method, label, short label of the difference columns),
    then the subject's difference from each other method with the standard error of that
    difference (``sqrt(sd_a^2/n_a + sd_b^2/n_b)``)."""
    groups = load(folder)
    *subject_method, short = subject
    order = [others[0], tuple(subject_method), *others[1:]]
    lines = _head(["", *[label for _, label in order],
                   *[f"{short} - {label} (SE)" for _, label in others]])  # fmt: skip
    for label, metric, digits in rows:
        stats = {m: rr.stat(_values(groups[m], metric)) for m, _ in order}
        cells = [stats[m].fmt(digits) for m, _ in order]
        a = stats[subject[0]]
        for m, _ in others:
            b = stats[m]
            se = math.sqrt(a.sd**2 / a.n + b.sd**2 / b.n)
            cells.append(f"{a.mean - b.mean:+.{digits}f} ({se:.{digits}f})")
        lines.append(_row([label, *cells]))
    return lines


def token_roles_table(folder: str, labels: Sequence[tuple[str, str]]) -> list[str]:
    """experiments.lp_reg_tokens' side-by-side table of ``<folder>/<key>_s*.json`` (the
    seeds of each ``(key, header)``), under the page's headers."""
    from experiments import lp_reg_tokens as lt
    from experiments.records import read_result

    groups = {
        key: [read_result(p) for p in sorted((RESULTS / folder).glob(f"{key}_s*.json"))]
        for key, _ in labels
    }
    rows = lt.comparison(groups)[2 : 2 + len(lt.ROLES)]
    head = ["role"]
    for _, header in labels:
        head += header.split(" | ")
    return [*_head(head), *rows]


def regime_z_star() -> list[str]:
    """The regime map's predicted ``Z*`` by pass rate and beta (lp_reg_regime.predict)."""
    from experiments import lp_reg_regime as lr

    lines = _head(["P \\ beta", *[f"{b:g}" for b in lr.BETAS]])
    for p in lr.PASS_RATES:
        z = [f"{lr.predict(0.5, p, b, 'lp_oracle')['z_star']:.2f}" for b in lr.BETAS]
        lines.append(_row([f"{p}", *z]))
    return lines


def regime_predictions() -> list[str]:
    from experiments import lp_reg_regime as lr

    return lr.predictions_table().splitlines()


def regime_long_responses() -> list[str]:
    """The authors' selection with ``LONG_FILLER`` tokens per response, predicted."""
    from experiments import lp_reg_regime as lr

    lines = _head(["Z", "P", "beta", "authors' reach: spark / competitor", "predicted drift",
                   "authors' (200)", "oracle"])  # fmt: skip
    for c in lr.filler_cells():
        if c.method != "lp_authors":
            continue
        a = lr.predict(c.z, c.pass_rate, c.beta, c.method, c.filler)
        o = lr.predict(c.z, c.pass_rate, c.beta, "lp_oracle")
        lines.append(_row([f"{c.z}", f"{c.pass_rate}", f"{c.beta}",
                           f"{a['reach']:.2f} / {a['reach_competitor']:.2f}", f"{a['drift']:+.2f}",
                           a["direction"], o["direction"]]))  # fmt: skip
    return lines


def _regime_rows() -> dict[tuple, dict[str, Any]]:
    from experiments.records import read_result

    rows = read_result(RESULTS / "lp_reg_regime" / "summary.json")
    key = ("mode", "method", "z", "pass_rate", "beta", "filler")
    return {tuple(r["cell"][k] for k in key): r for r in rows}


def regime_oracle_map() -> list[str]:
    """The oracle's trend ``log(p_60 / 0.06)``, on-policy / off-policy, by cell; bold where
    its on-policy prediction is up."""
    from experiments import lp_reg_regime as lr

    rows = _regime_rows()
    lines = _head(["P", "beta", *[f"Z={z}" for z in lr.ZS]])
    for p in lr.PASS_RATES:
        for b in lr.BETAS:
            cells = []
            for z in lr.ZS:
                on, off = (
                    rows[(m, "lp_oracle", z, p, b, lr.FILLER)]["trend"][0] for m in ("on", "off")
                )
                cell = f"{on:+.1f} / {off:+.1f}"
                up = rows[("on", "lp_oracle", z, p, b, lr.FILLER)]["predicted"] == "up"
                cells.append(f"**{cell}**" if up else cell)
            lines.append(_row([f"{p}", f"{b}", *cells]))
    return lines


def regime_authors() -> list[str]:
    """The authors' selection on-policy (21- and 201-token responses): predicted and
    measured direction, gap to GRPO (mean +- sd over seeds), the oracle's gap, spark tokens
    regularised per step and ``net_up_share``; the cells the page shows."""
    from experiments import lp_reg_regime as lr

    rows = _regime_rows()
    lines = _head(["responses", "Z", "P", "beta", "predicted", "measured", "gap vs GRPO",
                   "oracle's gap", "spark tokens regularised per step", "net_up_share"])  # fmt: skip
    short = [(z, p, b) for z in (0.9,) for p in lr.PASS_RATES for b in lr.BETAS]
    short += [(z, 0.5, b) for z in (0.7, 0.5) for b in (1.0, 4.0)]
    cells = [(lr.FILLER, c) for c in short]
    cells += [
        (c.filler, (c.z, c.pass_rate, c.beta)) for c in lr.filler_cells() if c.method != "grpo"
    ]
    for filler, (z, p, b) in cells:
        r = rows[("on", "lp_authors", z, p, b, filler)]
        oracle = rows[("on", "lp_oracle", z, p, b, lr.FILLER)]["gap_vs_grpo"][0]
        gap, sd = r["gap_vs_grpo"]
        lines.append(_row([
            f"{filler + 1} tokens", f"{z}", f"{p}", f"{b}", r["predicted"], r["measured"],
            f"{gap:+.2f} +- {sd:.2f}", f"{oracle:+.2f}", f"{r['spark_regularized_per_step']:.1f}",
            f"{r['diagnostics']['lp_reg/net_up_share']:.2f}",
        ]))  # fmt: skip
    return lines


_PRESETS = {"sparks": ("sparks", ""), "countdown": ("countdown", ""), "sql": ("SQL", ""),
            "sparks_toy": ("sparks toy variant", " (one selection over the step, rho 0.1)"),
            "countdown_offpolicy": ("countdown off-policy", "")}  # fmt: skip


def regime_presets() -> list[str]:
    """Where the toy Lp-Reg presets sit (``lp_reg_regime/presets.json``): the tokens each
    regularised in its first steps (total, fewest-most per step), their kept mass ``Z``,
    ``|A|``, net push and the share pushed up (bold when above 0), and ``Z*`` at the median
    ``|A|`` with beta 1."""
    from experiments.records import read_result

    presets = read_result(RESULTS / "lp_reg_regime" / "presets.json")
    steps = {p["steps"] for p in presets.values()}
    lines = _head(["preset", f"regularised tokens ({'/'.join(map(str, steps))} steps)",
                   "Z q10 / q50 / mean", "abs(A) q10 / q50 / q90", "net push q10 / q90",
                   "net_up_share", "Z* at the median abs(A), beta 1"])  # fmt: skip
    for key, (label, note) in _PRESETS.items():
        p = presets[key]
        per_step, a = p["regularized_per_step"], p["all"]
        z, adv, push = a["z"], a["abs_adv"], a["net_push"]
        q90 = f"{push['q90']:+.2f}"
        up = f"{a['net_up_share']:.2f}"
        lines.append(_row([
            f"{label} `{p['config']}`{note}",
            f"{sum(per_step):,} ({min(per_step)}-{max(per_step)} a step)",
            f"{z['q10']:.3f} / {z['q50']:.3f} / {z['mean']:.3f}",
            f"{adv['q10']:.2f} / {adv['q50']:.2f} / {adv['q90']:.2f}",
            f"{push['q10']:+.2f} / " + (f"**{q90}**" if push["q90"] > 0 else q90),
            f"**{up}**" if a["net_up_share"] > 0 else up,
            f"{1 / (1 + adv['q50']):.2f}",
        ]))  # fmt: skip
    return lines


def sparks_first_run() -> list[str]:
    """The sparks world's first run (GRPO, seed 1, before the read-back rule), by
    checkpoint: the spark's probability and frequency, entropy and test Pass@1."""
    from experiments.records import read_result

    record = read_result(RESULTS / "sparks_world" / "first_run_grpo_math_seed1.json")
    points = sorted(record["checkpoints"].items(), key=lambda kv: int(kv[0]))
    rows = [
        ("spark probability at the decision point, hard prompts", ("hard", "spark_prob")),
        ("spark probability, easy prompts", ("easy", "spark_prob")),
        ("share of samples that check, hard prompts", ("hard", "spark_freq")),
        ("entropy of the sampled responses (nats per token)", "entropy"),
        ("test Pass@1 (128 prompts x 8)", "pass@1"),
    ]
    lines = _head(["step", *[step for step, _ in points]])
    for label, key in rows:
        get = (lambda c, k=key: c["sparks"][k[0]][k[1]]) if isinstance(key, tuple) else (
            lambda c, k=key: c[k])  # fmt: skip
        lines.append(_row([label, *[f"{get(c):.3f}" for _, c in points]]))
    return lines


# --------------------------------------------------------------------------- the tables

_CD = "rehearsal_control"
_SQL = "rehearsal_control_sql"
_AUTHORS = "DPH-JS, fixed eta (`authors` weighting, effective 0.0156)"
_CONTROL = "DPH-JS, rehearsal control (target 0.02 nats/token)"
_CD_COLUMNS = (("in-domain Pass@1", "test.pass@1"), ("in-domain Pass@32", "test.pass@32"),
               ("cross-domain Pass@1", "cross_domain.pass@1"),
               ("cross-domain Pass@32", "cross_domain.pass@32"), ("math Pass@32", "ood_math.pass@32"),
               ("styles per prompt (in domain)", "test.mean_distinct_styles"))  # fmt: skip
_SQL_COLUMNS = (("in-domain Pass@1", "test.pass@1"), ("in-domain Pass@16", "test.pass@16"),
                ("cross-domain Pass@1", "cross_domain.pass@1"),
                ("cross-domain Pass@16", "cross_domain.pass@16"), ("math Pass@1", "ood_math.pass@1"),
                ("math Pass@16", "ood_math.pass@16"),
                ("styles per prompt (in domain)", "test.mean_distinct_styles"),
                ("styles per prompt (cross-domain)", "cross_domain.mean_distinct_styles"))  # fmt: skip
_C = "dph_js_control"

TABLES: dict[str, Callable[[], list[str]]] = {
    "rehearsal_control.arms": lambda: arms_table(_CD, [
        ("base", "base model"), ("dph_js", _AUTHORS),
        ("dph_js_paper", "DPH-JS, fixed eta (`paper` weighting, 0.2)"), (_C, _CONTROL),
    ], _CD_COLUMNS),
    "rehearsal_control.goals": lambda: goals_table(_CD, "rehearsal control", [
        ("in-domain Pass@32 at least the base's minus 0.01",
         [Part("", (_C, "test.pass@32"), ("base", "test.pass@32"), -0.01)]),
        ("in-domain Pass@1 at least the `authors` arm's minus one standard error",
         [Part("", (_C, "test.pass@1"), ("dph_js", "test.pass@1"), "-se")]),
        ("cross-domain Pass@32 at least the `paper` arm's",
         [Part("", (_C, "cross_domain.pass@32"), ("dph_js_paper", "cross_domain.pass@32"))]),
    ]),
    "rehearsal_control.seeds": lambda: seeds_table(
        _CD, ["base", "dph_js", "dph_js_paper", _C],
        [("test 1", "test.pass@1"), ("test 32", "test.pass@32"),
         ("cross_domain 1", "cross_domain.pass@1"), ("cross_domain 32", "cross_domain.pass@32"),
         ("ood_math 32", "ood_math.pass@32"), ("test styles", "test.mean_distinct_styles")]),
    "rehearsal_control.sql_arms": lambda: arms_table(_SQL, [
        ("base", "base model"), ("grpo", "GRPO"), ("dph_js", _AUTHORS), (_C, _CONTROL),
    ], _SQL_COLUMNS),
    "rehearsal_control.sql_goals": lambda: goals_table(_SQL, "rehearsal control", [
        ("styles per prompt at least fixed DPH-JS's", [
            Part("in domain", (_C, "test.mean_distinct_styles"), ("dph_js", "test.mean_distinct_styles")),
            Part("cross-domain", (_C, "cross_domain.mean_distinct_styles"),
                 ("dph_js", "cross_domain.mean_distinct_styles")),
        ]),
        ("Pass@1 at least GRPO's minus one standard error",
         [Part("", (_C, "test.pass@1"), ("grpo", "test.pass@1"), "-se")]),
    ]),
    "rehearsal_control.sql_seeds": lambda: seeds_table(
        _SQL, ["base", "grpo", "dph_js", _C],
        [("test 1", "test.pass@1"), ("test 16", "test.pass@16"),
         ("cross_domain 1", "cross_domain.pass@1"), ("cross_domain 16", "cross_domain.pass@16"),
         ("ood_math 1", "ood_math.pass@1"), ("ood_math 16", "ood_math.pass@16"),
         ("test styles", "test.mean_distinct_styles"),
         ("cross_domain styles", "cross_domain.mean_distinct_styles")]),
    "countdown_reproduction_reading.replica": lambda: ablation_table(
        "countdown_reproduction",
        [("dph_js_replica", "replica"),
         ("dph_js_replica_no_clones", "without the cloned reference rows"),
         ("dph_js_replica_no_third_step", "without the third step"),
         ("dph_js_replica_token_scaling", "token-share micro-batch scaling"),
         ("dph_js", "DPH-JS, default assembly"), ("grpo", "GRPO")],
        bold=[("dph_js_replica_no_clones", 3), ("dph_js_replica_no_clones", 5),
              ("dph_js_replica_no_clones", 6)]),
    "countdown_reproduction_reading.passk": lambda: versus_table(
        "countdown_reproduction",
        ("grpo_passk", "GRPO with the Pass@4 advantage", "Pass@4 adv."),
        [("grpo", "GRPO"), ("dph_js", "DPH-JS")],
        [("in-domain Pass@1 (sampled)", "test.pass@1", 3),
         ("in-domain Pass@4", "test.pass@4", 3), ("in-domain Pass@32", "test.pass@32", 3),
         ("cross-domain Pass@32", "cross_domain.pass@32", 3),
         ("math Pass@32", "ood_math.pass@32", 3),
         ("styles per prompt (in domain)", "test.mean_distinct_styles", 2)]),
    "countdown_reproduction_20261201_reading.token_roles": lambda: token_roles_table(
        "countdown_reproduction/lp_reg_tokens",
        [("base", "base: tokens | base: regularised"),
         ("lp_reg150", "Lp-Reg step 150: tokens | regularised"),
         ("grpo150", "GRPO step 150: tokens | (would regularise)")]),
    "lp_reg_regime.z_star": regime_z_star,
    "lp_reg_regime.predictions": regime_predictions,
    "lp_reg_regime.long_responses": regime_long_responses,
    "lp_reg_regime.oracle_map": regime_oracle_map,
    "lp_reg_regime.authors": regime_authors,
    "lp_reg_regime.presets": regime_presets,
    "sparks_world.first_run": sparks_first_run,
}  # fmt: skip


# --------------------------------------------------------------------------- pages


def render(text: str) -> str:
    """``text`` with every generated table rebuilt (an unknown name is a KeyError)."""

    def fill(m: re.Match) -> str:
        return m.group(1) + "\n".join(TABLES[m.group("name")]()) + "\n" + m.group(4)

    return BLOCK.sub(fill, text)


def first_difference(old: str, new: str) -> str | None:
    """The first line that differs, as ``committed`` / ``recomputed`` (None when equal)."""
    a, b = old.splitlines(), new.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"line {i + 1}:\n  committed:  {x}\n  recomputed: {y}"
    return None if len(a) == len(b) else f"{len(a)} lines committed, {len(b)} recomputed"


def _paragraph_above(lines: Sequence[str], i: int) -> str:
    """The first line of the paragraph above line ``i`` (blank lines between skipped)."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    while j > 0 and lines[j - 1].strip():
        j -= 1
    return lines[j] if j >= 0 else ""


def unmarked_tables(text: str, recomputed_elsewhere: Sequence[str] = ()) -> list[str]:
    """The first row of each table of ``text`` that is neither generated, nor made only
    of ``recomputed_elsewhere`` rows (another check recomputes them), nor marked ``*Not
    recomputed`` at the start of the paragraph above it, with its line number."""
    generated = {line for m in BLOCK.finditer(text) for line in m.group("body").splitlines()}
    elsewhere = set(recomputed_elsewhere)
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or (i and lines[i - 1].startswith("|")):
            continue  # not the first row of a table
        rows = [line]
        for x in lines[i + 1 :]:
            if not x.startswith("|"):
                break
            rows.append(x)
        if set(rows) <= generated or set(rows) <= elsewhere:
            continue
        if not _paragraph_above(lines, i).startswith(NOT_RECOMPUTED):
            out.append(f"line {i + 1}: {line}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.results_pages",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 on a difference")
    args = p.parse_args(argv)
    status = 0
    for name in PAGES:
        path = RESULTS / name
        old = path.read_text()
        new = render(old)
        if new == old:
            continue
        if args.check:
            print(f"{path}: {first_difference(old, new)}", file=sys.stderr)
            status = 1
        else:
            path.write_text(new)
            print(f"{path}: tables rewritten")
    return status


if __name__ == "__main__":
    sys.exit(main())
