"""Aggregation of ``experiments/reproduce.py``'s per-run summaries into the Markdown report.

Pure functions on the per-run summary dicts (one JSON file per (method, seed), written by
``reproduce.py``), so the report can be rebuilt from committed summaries alone
(``reproduce.py --report-only``) and tested on synthetic ones. The plots are in
``experiments/reproduce_plots.py``, the files (summaries in, report out) in
``experiments/reproduce_publish.py``.

A per-run summary (``schema`` 1) holds::

    method, label, seed, settings{...}
    eval: {split: {n_prompts, n_samples, greedy, pass@k{"1": .., "16": ..}, share_one_style,
                   share_3plus_styles, mean_distinct_styles, mean_nll_per_token,
                   retention (None for the base model)}}
    training: {step: [..], entropy: [..], pass1: [..], eta, log_u_mean, ...} (downsampled;
              absent for the base; divrl.pipeline.training_curve)
    fingerprint: {steps, metrics: [every metric of the first steps]} (experiments.reproduce
                 --check compares a rerun with it)
    wall_clock: {train_seconds, eval_seconds, presample_seconds, ...}

Numbers over seeds are reported as ``mean ± sd`` (sample standard deviation over seeds).
A claim is judged from the seeds' values of two quantities: the difference of their means
and its standard error (paired per seed when both come from the same runs, Welch-style
otherwise). "yes" needs the difference on the paper's side by more than
``SE_MULTIPLE`` standard errors (for "not lower": not below by more than that); this is a
rough screen with a handful of seeds, not a test at a fixed level.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.records import ResultError, read_result

#: method key -> label, in the report's order; ``base`` is the untrained toy model
METHODS: dict[str, str] = {
    "base": "base",
    "grpo": "GRPO",
    "grpo_math": "Lp-Reg without its regulariser (on-policy GRPO)",
    "dapo": "DAPO",
    "grpo_rkl": "GRPO + reverse KL",
    "dph_f": "DPH-F",
    "dph_js": "DPH-JS",
    "dph_js_paper": "DPH-JS (paper weighting)",
    "dph_js_control": "DPH-JS (rehearsal control)",
    "dph_js_replica": "DPH-JS (the authors' batch assembly)",
    "dph_js_replica_no_clones": "DPH-JS replica without the cloned reference rows",
    "dph_js_replica_no_third_step": "DPH-JS replica without the third step",
    "dph_js_replica_token_scaling": "DPH-JS replica with token-share micro-batch scaling",
    "dph_alpha": "DPH-alpha (0.5)",
    "lp_reg": "Lp-Reg (on-policy)",
    "lp_reg_toy": "Lp-Reg (toy variant: whole-batch selection, kappa 0.002)",
    "entropy_bonus": "GRPO + entropy bonus",
    "high_entropy_8020": "80/20",
    "kl_cov": "KL-Cov",
    "clip_cov": "Clip-Cov",
    "dph_js_lp_reg": "DPH-JS + Lp-Reg",
    "grpo_passk": "GRPO with the Pass@4 advantage",
}
#: eval split -> heading, in the report's order; a world's other splits follow, by name
SPLITS: dict[str, str] = {
    "test": "in domain (test)",
    "cross_domain": "cross domain",
    "ood_math": "out of domain (math)",
}
SE_MULTIPLE = 2.0
#: share of the logged training steps averaged for the entropy at the start / the end
EDGE_SHARE = 0.05
SCHEMA = 1


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation of one quantity over seeds."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / self.n if self.n else math.nan

    @property
    def sd(self) -> float | None:
        if self.n < 2:
            return None
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))

    def fmt(self, digits: int = 3) -> str:
        if not self.n:
            return "-"
        sd = self.sd
        return f"{self.mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def stat(values: Iterable[float | None]) -> Stat:
    """A :class:`Stat` of the values that are numbers (None and nan are left out)."""
    return Stat(tuple(float(v) for v in values if v is not None and not math.isnan(float(v))))


def largest_k(summaries: Sequence[dict[str, Any]], split: str = "test") -> int | None:
    """The largest k whose Pass@k every summary of ``split`` has (n samples bound k)."""
    common: set[int] | None = None
    for s in summaries:
        ev = s.get("eval", {}).get(split)
        if ev is None:
            continue
        ks = {int(k) for k in ev["pass@k"]}
        common = ks if common is None else common & ks
    return max(common) if common else None


# --------------------------------------------------------------------------- metrics


def _edge_mean(values: Sequence[float], start: bool) -> float | None:
    if not values:
        return None
    m = max(1, round(EDGE_SHARE * len(values)))
    part = values[:m] if start else values[-m:]
    return sum(part) / len(part)


def metric(summary: dict[str, Any], name: str, kmax: int | None = None) -> float | None:
    """One number of a run summary, by name.

    ``SPLIT.greedy``, ``SPLIT.pass@K`` (``K`` a number or ``kmax``), ``SPLIT.share_one_style``,
    ``SPLIT.share_3plus_styles``, ``SPLIT.mean_distinct_styles``, ``SPLIT.retention``,
    ``train.entropy_start`` / ``train.entropy_end`` (mean over the first / last
    ``EDGE_SHARE`` of the logged steps), ``train.entropy_min`` / ``train.entropy_max``.
    None when the run does not have it.
    """
    area, _, key = name.partition(".")
    if area == "train":
        ent = [v for v in summary.get("training", {}).get("entropy", []) if v is not None]
        if not ent:
            return None
        return {
            "entropy_start": lambda: _edge_mean(ent, True),
            "entropy_end": lambda: _edge_mean(ent, False),
            "entropy_min": lambda: min(ent),
            "entropy_max": lambda: max(ent),
        }[key]()
    ev = summary.get("eval", {}).get(area)
    if ev is None:
        return None
    if key.startswith("pass@"):
        k = key.removeprefix("pass@")
        k = str(kmax) if k == "kmax" else k
        return ev["pass@k"].get(k)
    if key == "retention":
        r = ev.get("retention")
        return None if r is None else r.get("retention")
    return ev.get(key)


def report_splits(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The eval splits found in the summaries: :data:`SPLITS`' order, then others by name."""
    found = {sp for rs in groups.values() for r in rs for sp in r["eval"]}
    return [sp for sp in SPLITS if sp in found] + sorted(found - set(SPLITS))


def by_method(summaries: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Summaries grouped by method, in :data:`METHODS` order, each sorted by seed."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        groups.setdefault(s["method"], []).append(s)
    order = {m: i for i, m in enumerate(METHODS)}
    return {
        m: sorted(groups[m], key=lambda s: s["seed"])
        for m in sorted(groups, key=lambda m: (order.get(m, len(order)), m))
    }


# --------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Claim:
    """One direction a paper reports, as a comparison of two measured quantities.

    ``a`` and ``b`` are ``(method, metric name)``; ``direction`` says what the paper
    reports for ``a`` relative to ``b``: ``higher``, ``lower`` or ``not_lower``.
    """

    paper: str
    text: str
    a: tuple[str, str]
    b: tuple[str, str]
    direction: str


CLAIMS: tuple[Claim, ...] = (
    Claim("DPH", "GRPO raises in-domain Pass@1", ("grpo", "test.pass@1"), ("base", "test.pass@1"), "higher"),
    Claim("DPH", "GRPO lowers in-domain Pass@k (largest k)", ("grpo", "test.pass@kmax"), ("base", "test.pass@kmax"), "lower"),
    Claim("DPH", "DAPO raises in-domain Pass@1", ("dapo", "test.pass@1"), ("base", "test.pass@1"), "higher"),
    Claim("DPH", "DAPO lowers in-domain Pass@k (largest k)", ("dapo", "test.pass@kmax"), ("base", "test.pass@kmax"), "lower"),
    Claim("DPH", "DPH-F raises in-domain Pass@1", ("dph_f", "test.pass@1"), ("base", "test.pass@1"), "higher"),
    Claim("DPH", "DPH-F keeps in-domain Pass@k at or above the base", ("dph_f", "test.pass@kmax"), ("base", "test.pass@kmax"), "not_lower"),
    Claim("DPH", "DPH-JS raises in-domain Pass@1", ("dph_js", "test.pass@1"), ("base", "test.pass@1"), "higher"),
    Claim("DPH", "DPH-JS keeps in-domain Pass@k at or above the base", ("dph_js", "test.pass@kmax"), ("base", "test.pass@kmax"), "not_lower"),
    Claim("DPH", "DPH-JS has a higher in-domain Pass@k than GRPO", ("dph_js", "test.pass@kmax"), ("grpo", "test.pass@kmax"), "higher"),
    Claim("DPH", "DPH-JS keeps cross-domain Pass@k at or above the base", ("dph_js", "cross_domain.pass@kmax"), ("base", "cross_domain.pass@kmax"), "not_lower"),
    Claim("DPH", "reverse KL loses out-of-domain accuracy (Pass@1)", ("grpo_rkl", "ood_math.pass@1"), ("base", "ood_math.pass@1"), "lower"),
    Claim("DPH", "DPH-JS keeps out-of-domain Pass@1 at or above the base", ("dph_js", "ood_math.pass@1"), ("base", "ood_math.pass@1"), "not_lower"),
    Claim("DPH", "reverse KL leaves more prompts with a single style than forward KL (paper: ~94%)", ("grpo_rkl", "test.share_one_style"), ("dph_f", "test.share_one_style"), "higher"),
    Claim("DPH", "forward KL keeps >= 3 styles on more prompts than reverse KL (paper: ~60%)", ("dph_f", "test.share_3plus_styles"), ("grpo_rkl", "test.share_3plus_styles"), "higher"),
    Claim("DPH", "DPH-JS retains more base-solved prompts than GRPO", ("dph_js", "test.retention"), ("grpo", "test.retention"), "higher"),
    Claim("Lp-Reg", "GRPO's entropy collapses (end below start)", ("grpo", "train.entropy_end"), ("grpo", "train.entropy_start"), "lower"),
    Claim("Lp-Reg", "an entropy bonus makes entropy rise (end above start)", ("entropy_bonus", "train.entropy_end"), ("entropy_bonus", "train.entropy_start"), "higher"),
    Claim("Lp-Reg", "Lp-Reg ends with more entropy than GRPO", ("lp_reg", "train.entropy_end"), ("grpo", "train.entropy_end"), "higher"),
    Claim("Lp-Reg", "Lp-Reg ends with less entropy than the entropy bonus (a moderate band)", ("lp_reg", "train.entropy_end"), ("entropy_bonus", "train.entropy_end"), "lower"),
    Claim("Lp-Reg", "Lp-Reg (toy variant) ends with more entropy than GRPO", ("lp_reg_toy", "train.entropy_end"), ("grpo", "train.entropy_end"), "higher"),
    Claim("Lp-Reg", "KL-Cov ends with more entropy than GRPO", ("kl_cov", "train.entropy_end"), ("grpo", "train.entropy_end"), "higher"),
    Claim("Lp-Reg", "Clip-Cov ends with more entropy than GRPO", ("clip_cov", "train.entropy_end"), ("grpo", "train.entropy_end"), "higher"),
    Claim("Lp-Reg", "Lp-Reg has a higher in-domain Pass@1 than GRPO", ("lp_reg", "test.pass@1"), ("grpo", "test.pass@1"), "higher"),
    Claim("Lp-Reg", "Lp-Reg (toy variant) has a higher in-domain Pass@1 than GRPO", ("lp_reg_toy", "test.pass@1"), ("grpo", "test.pass@1"), "higher"),
    # the ablation: the same preset on-policy with the regulariser off (grpo_math); on-policy the
    # ratio is 1, so Lp-Reg's wide clip range is inert and any difference is the regulariser's
    Claim("Lp-Reg", "Lp-Reg's regulariser raises in-domain Pass@1 (vs the preset without it)", ("lp_reg", "test.pass@1"), ("grpo_math", "test.pass@1"), "higher"),
    Claim("Lp-Reg", "Lp-Reg's regulariser keeps entropy higher (vs the preset without it)", ("lp_reg", "train.entropy_end"), ("grpo_math", "train.entropy_end"), "higher"),
    # the Lp-Reg paper's on-policy table (Qwen3-14B): GRPO 57.43, + entropy loss 50.40, 80/20 57.51, Lp-Reg 60.17
    Claim("Lp-Reg", "an entropy bonus lowers in-domain Pass@1 below GRPO's", ("entropy_bonus", "test.pass@1"), ("grpo", "test.pass@1"), "lower"),
    Claim("Lp-Reg", "80/20 keeps GRPO's in-domain Pass@1", ("high_entropy_8020", "test.pass@1"), ("grpo", "test.pass@1"), "not_lower"),
    Claim("Lp-Reg", "Lp-Reg has a higher in-domain Pass@1 than 80/20", ("lp_reg", "test.pass@1"), ("high_entropy_8020", "test.pass@1"), "higher"),
)  # fmt: skip

_DIRECTION_WORDS = {"higher": ">", "lower": "<", "not_lower": ">="}


@dataclass(frozen=True)
class Verdict:
    """A claim measured: the two sides' values, the difference and the outcome."""

    claim: Claim
    a: Stat
    b: Stat
    diff: float | None
    se: float | None
    outcome: str  # yes / no: opposite / no: within noise / inconclusive: ... / not run


def _values(
    groups: dict[str, list[dict[str, Any]]], side: tuple[str, str], kmax: int | None
) -> dict[int, float]:
    method, name = side
    out = {}
    for s in groups.get(method, []):
        v = metric(s, name, kmax)
        if v is not None and not math.isnan(v):
            out[int(s["seed"])] = float(v)
    return out


def judge(claim: Claim, groups: dict[str, list[dict[str, Any]]], kmax: int | None) -> Verdict:
    """Measure one claim on the grouped run summaries (see the module docstring)."""
    va, vb = _values(groups, claim.a, kmax), _values(groups, claim.b, kmax)
    sa, sb = stat(va.values()), stat(vb.values())
    if claim.a[0] not in groups or claim.b[0] not in groups:
        return Verdict(claim, sa, sb, None, None, "not run")
    if not va or not vb:
        return Verdict(claim, sa, sb, None, None, "inconclusive: not measured")
    diff = sa.mean - sb.mean
    if claim.a[0] == claim.b[0]:  # the same runs: paired per seed
        seeds = sorted(set(va) & set(vb))
        d = stat(va[s] - vb[s] for s in seeds)
        se = None if d.sd is None else d.sd / math.sqrt(d.n)
    else:
        se = (
            None if sa.sd is None or sb.sd is None else math.sqrt(sa.sd**2 / sa.n + sb.sd**2 / sb.n)
        )
    if se is None:
        return Verdict(claim, sa, sb, diff, None, "inconclusive: needs >= 2 seeds per side")
    margin = SE_MULTIPLE * se
    if claim.direction == "not_lower":
        outcome = "yes" if diff >= -margin else "no: lower"
    else:
        sign = 1.0 if claim.direction == "higher" else -1.0
        if sign * diff > margin:
            outcome = "yes"
        elif sign * diff < -margin:
            outcome = "no: opposite"
        else:
            outcome = "no: within noise"
    return Verdict(claim, sa, sb, diff, se, outcome)


# --------------------------------------------------------------------------- Markdown


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return [*lines, ""]


def _label(method: str) -> str:
    return METHODS.get(method, method)


def _fmt_seconds(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def _logged_train_seconds(run: dict[str, Any]) -> float | None:
    """The sum of a run's logged step times (``mean_step_seconds`` x steps; no start-up)."""
    mean, steps = run["wall_clock"].get("mean_step_seconds"), run["settings"].get("steps")
    return None if mean is None or not steps else mean * steps


def _undercounted(run: dict[str, Any]) -> bool:
    """A recorded training time below the run's own logged step times: it counts only the
    attempts whose timing survived (e.g. the time after a resume)."""
    recorded, logged = run["wall_clock"].get("train_seconds"), _logged_train_seconds(run)
    return recorded is not None and logged is not None and recorded < 0.95 * logged


def _cost_section(groups, presample: dict[str, float]) -> list[str]:
    rows, total, notes = [], sum(presample.values()), []
    for method, runs in groups.items():
        short = [r for r in runs if _undercounted(r)]
        train = stat(r["wall_clock"].get("train_seconds") for r in runs if r not in short)
        ev = stat(r["wall_clock"].get("eval_seconds") for r in runs)
        spent = sum(train.values) + sum(ev.values) + sum(_logged_train_seconds(r) for r in short)
        notes += [
            f"{_label(method)} seed {r['seed']}: its recorded training time "
            f"({r['wall_clock']['train_seconds']:.0f} s) is below the sum of its logged step "
            f"times ({_logged_train_seconds(r):.0f} s), so it counts only part of the "
            "training (the time after a resume): left out of train s / run, counted at its "
            "logged step times in the totals."
            for r in short
        ]
        total += spent
        per_step = stat(r["wall_clock"].get("mean_step_seconds") for r in runs)
        rows.append([
            _label(method), str(len(runs)),
            "-" if not train.n else train.fmt(0), "-" if not per_step.n else per_step.fmt(2),
            ev.fmt(0), _fmt_seconds(spent),
        ])  # fmt: skip
    lines = ["## Wall-clock cost", ""]
    lines += _table(
        ["method", "runs", "train s / run", "s / step (logged)", "eval s / run", "total"], rows
    )
    lines += [*notes, ""] if notes else []
    if presample:
        lines.append(
            "Presampling (DPH reference store, once per seed): "
            + ", ".join(f"seed {k}: {_fmt_seconds(v)}" for k, v in sorted(presample.items()))
            + "."
        )
        lines.append("")
    lines += [f"Total measured wall-clock: **{_fmt_seconds(total)}** (sum over runs; runs "
              "executed in parallel overlap in real time).", ""]  # fmt: skip
    return lines


def _accuracy_section(groups, split: str, kmax: int | None) -> list[str]:
    runs_any = [r for rs in groups.values() for r in rs if split in r["eval"]]
    if not runs_any:
        return []
    ks = sorted(set.intersection(*({int(k) for k in r["eval"][split]["pass@k"]} for r in runs_any)))
    header = ["method", "seeds", "greedy Pass@1", "sampled Pass@1", *[f"Pass@{k}" for k in ks[1:]]]
    rows = []
    for method, runs in groups.items():
        evs = [r["eval"][split] for r in runs if split in r["eval"]]
        if not evs:
            continue
        rows.append(
            [_label(method), str(len(evs)), stat(e.get("greedy") for e in evs).fmt()]
            + [stat(e["pass@k"].get(str(k)) for e in evs).fmt() for k in ks]
        )
    n_prompts = runs_any[0]["eval"][split]["n_prompts"]
    n = runs_any[0]["eval"][split]["n_samples"]
    return [
        f"### {SPLITS.get(split, split)}",
        "",
        f"{n_prompts} prompts, {n} samples per prompt at T = 1 (unbiased Pass@k) plus one "
        "greedy response; mean ± sd over seeds.",
        "",
        *_table(header, rows),
    ]


def _style_section(groups) -> list[str]:
    splits = report_splits(groups)
    header = ["method"]
    for sp in splits:
        header += [f"{sp}: 1 style", f"{sp}: >= 3 styles", f"{sp}: mean styles"]
    rows = []
    for method, runs in groups.items():
        row = [_label(method)]
        for sp in splits:
            evs = [r["eval"][sp] for r in runs if sp in r["eval"]]
            row += [
                stat(e.get("share_one_style") for e in evs).fmt(2),
                stat(e.get("share_3plus_styles") for e in evs).fmt(2),
                stat(e.get("mean_distinct_styles") for e in evs).fmt(2),
            ]
        rows.append(row)
    return [
        "## Style diversity",
        "",
        "Share of prompts whose samples use exactly one solution style, three or more, and "
        "the mean number of distinct styles per prompt (divrl's classification: SQL shape "
        "from the query's AST, toy-math method; docs/evaluation.md). DPH paper: reverse KL "
        "~94% single style, forward KL >= 3 styles on ~60%.",
        "",
        *_table(header, rows),
    ]


def _entropy_section(groups, plot: str | None) -> list[str]:
    rows = []
    for method, runs in groups.items():
        if method == "base":
            continue
        rows.append(
            [_label(method)]
            + [
                stat(metric(r, f"train.{k}") for r in runs).fmt(3)
                for k in ("entropy_start", "entropy_end", "entropy_min", "entropy_max")
            ]
        )
    lines = [
        "## Entropy over training",
        "",
        f"Policy entropy on the rollouts (`actor/entropy` of metrics.jsonl, nats per token); "
        f"start / end = mean over the first / last {EDGE_SHARE:.0%} of the steps.",
        "",
        *_table(["method", "start", "end", "min", "max"], rows),
    ]
    if plot:
        lines += [f"![entropy over training]({plot})", ""]
    return lines


def _lp_reg_section(groups) -> list[str]:
    """How many tokens the Lp-Reg runs selected and regularised per step (it can be none)."""
    rows = []
    for method, runs in groups.items():
        curves = [r.get("training", {}) for r in runs]
        selected = [[v for v in c.get("lp_reg_selected", []) if v is not None] for c in curves]
        if not any(selected):
            continue
        regularised = [
            [v for v in c.get("lp_reg_regularized", []) if v is not None] for c in curves
        ]

        def per_step(rows_: list[list[float]]) -> Stat:
            return stat(sum(x) / len(x) if x else None for x in rows_)

        def share(sel: list[float], reg: list[float]) -> float | None:
            return sum(1 for v in reg if v > 0) / len(reg) if reg else None

        rows.append(
            [
                _label(method),
                per_step(selected).fmt(2),
                per_step(regularised).fmt(2),
                stat(share(a, b) for a, b in zip(selected, regularised, strict=True)).fmt(2),
            ]
        )
    if not rows:
        return []
    return [
        "## What Lp-Reg did",
        "",
        "Tokens Lp-Reg selected (the lowest-probability rho share of the negative-advantage "
        "tokens of a micro-batch) and regularised (selected and kept by the min-p proxy) per "
        "step, as logged in metrics.jsonl (the step's sums over its micro-batches; runs "
        "made before 2026-12-01 03:13 UTC (commit of the change), such as the SQL toy reproduction, logged the "
        "token-weighted mean over a step's micro-batches instead; the curve kept in the "
        "summaries, mean over seeds), and the share of "
        "steps with at least one regularised token. A run that regularised nothing trained "
        "as on-policy GRPO with the lower clip off.",
        "",
        *_table(
            ["method", "selected / step", "regularised / step", "steps with any regularised"],
            rows,
        ),
    ]


def _retention_section(groups) -> list[str]:
    splits = report_splits(groups)
    rows = []
    for method, runs in groups.items():
        if method == "base":
            continue
        rows.append(
            [_label(method)] + [stat(metric(r, f"{sp}.retention") for r in runs).fmt() for sp in splits]
        )  # fmt: skip
    return [
        "## Retention",
        "",
        "Share of the prompts the base model solves (>= 1 correct sample, same eval seed) that "
        "the trained model still solves.",
        "",
        *_table(["method", *splits], rows),
    ]


def _claims_section(verdicts: Sequence[Verdict], kmax: int | None) -> list[str]:
    rows = []
    for v in verdicts:
        c = v.claim
        paper = (
            f"{_label(c.a[0])} {c.a[1]} {_DIRECTION_WORDS[c.direction]} {_label(c.b[0])} {c.b[1]}"
        )
        if v.diff is None:
            ours = "-" if v.outcome == "not run" else f"{v.a.fmt()} vs {v.b.fmt()}"
        else:
            se = "" if v.se is None else f", SE {v.se:.3f}"
            ours = f"{v.a.fmt()} vs {v.b.fmt()} (diff {v.diff:+.3f}{se})"
        rows.append([c.paper, c.text, paper.replace("kmax", str(kmax)), ours, v.outcome])
    return [
        "## Claims side by side",
        "",
        f"'yes': the mean difference lies on the paper's side by more than {SE_MULTIPLE:g} "
        "standard errors (for '>=': it is not below by more than that); 'no: within noise': "
        "a difference smaller than that; 'no: opposite': on the other side. A rough screen "
        "over a few seeds, not a test at a fixed level. What was tried: each method's toy "
        "preset as committed (`configs/toy/<method>.yaml`; `configs/toy/countdown/` for the countdown world), overriding only the seed, the "
        "output directory, the toy world's paths and the settings listed at the top; nothing "
        "was tuned per claim.",
        "",
        *_table(["paper", "claim", "paper's direction", "ours (mean ± sd)", "reproduced"], rows),
    ]


def build_markdown(
    summaries: Sequence[dict[str, Any]],
    *,
    title: str,
    preamble: Sequence[str] = (),
    presample_seconds: dict[str, float] | None = None,
    plots: dict[str, str] | None = None,
) -> str:
    """The report's Markdown from the per-run summaries (all sections, claims last).

    ``plots`` maps ``entropy`` / ``pass_at_k`` to image paths relative to the report.
    """
    groups = by_method(summaries)
    kmax = largest_k(summaries)
    plots = plots or {}
    lines = [f"# {title}", "", *preamble]
    if not groups:
        return "\n".join([*lines, "No finished runs yet.", ""])
    lines += _cost_section(groups, presample_seconds or {})
    lines += ["## Accuracy: Pass@1 and Pass@k", ""]
    for split in report_splits(groups):
        lines += _accuracy_section(groups, split, kmax)
    if plots.get("pass_at_k"):
        lines += [f"![Pass@k per split]({plots['pass_at_k']})", ""]
    lines += _style_section(groups)
    lines += _entropy_section(groups, plots.get("entropy"))
    lines += _lp_reg_section(groups)
    lines += _retention_section(groups)
    lines += _claims_section([judge(c, groups, kmax) for c in CLAIMS], kmax)
    return "\n".join(lines).rstrip() + "\n"


def load_summaries(runs_dir: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` per-run summary under ``runs_dir`` (schema checked)."""
    out = []
    for path in sorted(runs_dir.glob("*.json")):
        s = read_result(path)
        if not isinstance(s, dict) or s.get("schema") != SCHEMA:
            schema = s.get("schema") if isinstance(s, dict) else None
            raise ResultError(
                f"{path}: schema {schema!r}, expected {SCHEMA}: move it away, or rebuild it "
                "with this version's experiments.reproduce"
            )
        out.append(s)
    return out


def verdict_table(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(claim text, outcome)`` for every claim: the machine-readable part of the report."""
    groups = by_method(summaries)
    kmax = largest_k(summaries)
    return [(c.text, judge(c, groups, kmax).outcome) for c in CLAIMS]
