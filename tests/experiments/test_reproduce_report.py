"""The reproduction report's aggregation (experiments/reproduce_report.py) on synthetic runs."""

from __future__ import annotations

import json
import math

import pytest

from divrl.pipeline import training_curve
from experiments import reproduce, reproduce_plots, reproduce_publish
from experiments import reproduce_report as _rr


@pytest.fixture(scope="module")
def rr():
    return _rr


def run(method, seed, p1, p16, *, one=0.5, three=0.2, ret=None, ent=None, ood=None):
    """A synthetic per-run summary with the given in-domain numbers."""
    ev = {
        "n_prompts": 10,
        "n_samples": 16,
        "greedy": p1,
        "pass@k": {"1": p1, "2": (p1 + p16) / 2, "16": p16},
        "share_one_style": one,
        "share_3plus_styles": three,
        "mean_distinct_styles": 2.0,
        "retention": None if ret is None else {"retention": ret},
    }
    evals = {"test": ev}
    if ood is not None:
        evals["ood_math"] = {**ev, "pass@k": {"1": ood, "2": ood, "16": ood}}
    s = {
        "schema": 1,
        "method": method,
        "seed": seed,
        "settings": {"steps": 10},
        "eval": evals,
        "wall_clock": {"train_seconds": 20.0, "eval_seconds": 5.0, "mean_step_seconds": 1.5},
    }
    if ent is not None:
        s["training"] = {"step": list(range(1, len(ent) + 1)), "entropy": ent}
    return s


def test_stat_mean_and_sample_sd(rr):
    s = rr.stat([1.0, 2.0, None, 3.0, math.nan])
    assert s.n == 3 and s.mean == 2.0 and s.sd == pytest.approx(1.0)
    assert s.fmt(2) == "2.00 ± 1.00"
    assert rr.stat([0.5]).fmt(1) == "0.5" and rr.stat([]).fmt() == "-"


def test_metric_names(rr):
    s = run("grpo", 0, 0.6, 0.8, ret=0.75, ent=[2.0] * 19 + [0.0] * 1)
    assert rr.metric(s, "test.pass@kmax", kmax=16) == 0.8
    assert rr.metric(s, "test.pass@1") == 0.6
    assert rr.metric(s, "test.retention") == 0.75
    assert rr.metric(s, "train.entropy_start") == 2.0  # first 5% of 20 steps = 1 step
    assert rr.metric(s, "train.entropy_end") == 0.0
    assert rr.metric(s, "ood_math.pass@1") is None  # split not evaluated
    assert rr.metric(run("base", 0, 0.5, 0.9), "train.entropy_end") is None


def test_largest_common_k(rr):
    a, b = run("base", 0, 0.5, 0.9), run("grpo", 0, 0.6, 0.8)
    b["eval"]["test"]["pass@k"].pop("16")
    assert rr.largest_k([a]) == 16 and rr.largest_k([a, b]) == 2


def _groups(rr, runs):
    return rr.by_method(runs)


def test_claim_verdicts(rr):
    claim_up = rr.Claim("X", "up", ("grpo", "test.pass@1"), ("base", "test.pass@1"), "higher")
    claim_keep = rr.Claim("X", "keep", ("grpo", "test.pass@kmax"), ("base", "test.pass@kmax"),
                          "not_lower")  # fmt: skip
    base = [run("base", s, 0.40 + 0.01 * s, 0.90) for s in range(3)]
    clear = [run("grpo", s, 0.60 + 0.01 * s, 0.70 + 0.01 * s) for s in range(3)]
    v = rr.judge(claim_up, _groups(rr, base + clear), 16)
    assert v.outcome == "yes" and v.diff == pytest.approx(0.2)
    assert rr.judge(claim_keep, _groups(rr, base + clear), 16).outcome == "no: lower"
    noisy = [run("grpo", s, p, 0.9) for s, p in enumerate([0.2, 0.7, 0.45])]
    assert rr.judge(claim_up, _groups(rr, base + noisy), 16).outcome == "no: within noise"
    assert rr.judge(claim_keep, _groups(rr, base + noisy), 16).outcome == "yes"
    worse = [run("grpo", s, 0.1 + 0.01 * s, 0.9) for s in range(3)]
    assert rr.judge(claim_up, _groups(rr, base + worse), 16).outcome == "no: opposite"
    one_seed = rr.judge(claim_up, _groups(rr, base[:1] + clear[:1]), 16)
    assert one_seed.outcome.startswith("inconclusive")
    assert rr.judge(claim_up, _groups(rr, base), 16).outcome == "not run"


def test_entropy_control_baselines_are_judged_against_grpo_and_lp_reg(rr):
    # the Lp-Reg paper's table: entropy bonus < GRPO ~ 80/20 < Lp-Reg (Pass@1)
    pass1 = {"grpo": 0.50, "entropy_bonus": 0.30, "high_entropy_8020": 0.50, "lp_reg": 0.60}
    runs = [run(m, s, p + 0.01 * s, 0.9) for m, p in pass1.items() for s in range(3)]
    verdicts = dict(rr.verdict_table(runs))
    assert verdicts["an entropy bonus lowers in-domain Pass@1 below GRPO's"] == "yes"
    assert verdicts["80/20 keeps GRPO's in-domain Pass@1"] == "yes"
    assert verdicts["Lp-Reg has a higher in-domain Pass@1 than 80/20"] == "yes"
    without = [r for r in runs if r["method"] != "high_entropy_8020"]
    verdicts = dict(rr.verdict_table(without))
    assert verdicts["Lp-Reg has a higher in-domain Pass@1 than 80/20"] == "not run"


def test_same_method_claim_is_paired(rr):
    # entropy falls by exactly 1.0 in every seed although the levels differ a lot between
    # seeds: paired, the fall is certain; unpaired it would be within noise
    runs = [run("grpo", s, 0.5, 0.9, ent=[3.0 * s + 2.0] * 19 + [3.0 * s + 1.0]) for s in range(3)]
    claim = rr.Claim("L", "collapse", ("grpo", "train.entropy_end"),
                     ("grpo", "train.entropy_start"), "lower")  # fmt: skip
    v = rr.judge(claim, _groups(rr, runs), 16)
    assert v.outcome == "yes" and v.se == 0.0 and v.diff == pytest.approx(-1.0)


def test_markdown_tables_and_claims(rr, tmp_path):
    runs = [run("base", s, 0.40, 0.90 + 0.01 * s, one=0.3, three=0.5, ood=0.5) for s in range(3)]
    runs += [
        run("grpo", s, 0.70 + 0.01 * s, 0.75, one=0.9, three=0.0, ret=0.8, ood=0.3,
            ent=[2.0] * 10 + [0.5] * 10)
        for s in range(3)
    ]  # fmt: skip
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    for s in runs:
        (runs_dir / f"{s['method']}_seed{s['seed']}.json").write_text(json.dumps(s))
    loaded = rr.load_summaries(runs_dir)
    assert len(loaded) == 6
    md = rr.build_markdown(loaded, title="T", presample_seconds={"0": 30.0})
    assert "| GRPO | 3 | 0.710 ± 0.010 | 0.710 ± 0.010 | 0.730 ± 0.005 | 0.750 ± 0.000 |" in md
    assert "| base | 3 | 0.400 ± 0.000 | 0.400 ± 0.000 |" in md
    assert (
        "| GRPO | 0.90 ± 0.00 | 0.00 ± 0.00 | 2.00 ± 0.00 |" in md
    )  # style shares, in-domain columns
    assert "| GRPO | 0.800 ± 0.000 |" in md  # retention
    verdicts = dict(rr.verdict_table(loaded))
    assert verdicts["GRPO raises in-domain Pass@1"] == "yes"
    assert verdicts["GRPO lowers in-domain Pass@k (largest k)"] == "yes"
    assert verdicts["GRPO's entropy collapses (end below start)"] == "yes"
    assert verdicts["DPH-JS raises in-domain Pass@1"] == "not run"
    assert "| GRPO | 3 | 20 ± 0 | 1.50 ± 0.00 | 5 ± 0 | 1.2 min |" in md
    assert "Total measured wall-clock: **3.0 min**" in md  # 6 x 25 s + 30 s presample
    bad = dict(loaded[0], schema=99)
    (runs_dir / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="schema"):
        rr.load_summaries(runs_dir)


def test_plots_written(rr, tmp_path):
    runs = [run("grpo", s, 0.6, 0.8, ent=[2.0, 1.5, 1.0]) for s in range(2)]
    runs.append(run("base", 0, 0.5, 0.9))
    groups = rr.by_method(runs)
    assert reproduce_plots.plot_entropy(groups, tmp_path / "e.png").stat().st_size > 0
    assert reproduce_plots.plot_pass_at_k(groups, tmp_path / "p.png").stat().st_size > 0
    assert reproduce_plots.plot_entropy(rr.by_method([runs[-1]]), tmp_path / "none.png") is None


def test_a_run_that_logged_no_entropy_is_left_out_of_the_entropy_plot(rr, tmp_path):
    runs = [
        run("grpo", 0, 0.6, 0.8, ent=[None, None, None]),
        run("grpo", 1, 0.6, 0.8, ent=[2.0, 1.5, 1.0]),
    ]
    groups = rr.by_method(runs)
    assert reproduce_plots.plot_entropy(groups, tmp_path / "e.png").stat().st_size > 0
    alone = rr.by_method(runs[:1])
    assert alone
    assert reproduce_plots.plot_entropy(alone, tmp_path / "none.png") is None


def test_arguments():
    args = reproduce.parse_args(["--methods", "dph_js", "grpo", "dph_js", "--seeds", "2"])
    assert args.methods == ["grpo", "dph_js"]  # report order, no repeats
    assert args.seeds == 2 and args.steps is None and args.n == 16 and args.jobs == 1
    assert args.seed_list == [0, 1]
    assert reproduce.parse_args(["--seeds", "2", "--first-seed", "1"]).seed_list == [1, 2]
    bad_args = (["--seeds", "0"], ["--steps", "0"], ["--methods", "base"], ["--n", "0"])
    for bad in (*bad_args, ["--first-seed", "-1"]):
        with pytest.raises(SystemExit):
            reproduce.parse_args(bad)


def test_training_curve_downsampled_keeps_last_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "actor/entropy": 1.0 / i, "reward/pass@1": 0.5, "time/step": 2.0}
            for i in range(1, 1001)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = training_curve(path, reproduce.CURVE_POINTS)
    assert len(curve["step"]) == reproduce.CURVE_POINTS
    assert curve["step"][0] == 1 and curve["step"][-1] == 1000
    assert curve["entropy"][-1] == pytest.approx(1e-3)


def test_report_only_without_runs(tmp_path):
    (tmp_path / reproduce_publish.SUMMARIES).mkdir()
    report = reproduce_publish.write_report(tmp_path, tmp_path / "r.md", None)
    assert "No finished runs yet." in report.read_text()


def test_lp_reg_section_counts_selected_and_regularised_tokens(rr):
    runs = [run("grpo", 0, 0.7, 0.8, ent=[1.0, 0.5])]
    for seed, regularised in enumerate(([0.0, 0.0, 4.0, 2.0], [0.0, 0.0, 0.0, 0.0])):
        s = run("lp_reg_toy", seed, 0.7, 0.8, ent=[1.0, 0.9, 0.8, 0.7])
        s["training"]["lp_reg_selected"] = [10.0, 12.0, 14.0, 16.0]
        s["training"]["lp_reg_regularized"] = regularised
        runs.append(s)
    md = rr.build_markdown(runs, title="T")
    label = rr.METHODS["lp_reg_toy"]
    # selected 13 per step in both seeds; regularised 1.5 and 0 (mean 0.75, sd 1.06);
    # steps with any: 2/4 and 0/4 (mean 0.25, sd 0.35)
    assert f"| {label} | 13.00 ± 0.00 | 0.75 ± 1.06 | 0.25 ± 0.35 |" in md
    assert "| GRPO | " not in md.split("## What Lp-Reg did")[1].split("##")[0]


def test_world_is_chosen_by_name():
    args = reproduce.parse_args([])
    assert args.world == "sql" and args.world_dir is None
    assert reproduce.parse_args(["--world-dir", "/w"]).world_dir == "/w"
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--world", "nope"])


def test_report_keeps_a_new_worlds_splits(rr):
    """A world with other eval splits than sql's gets them in the report, after the known."""
    a = run("grpo", 0, 0.6, 0.8)
    a["eval"]["ood_sql"] = a["eval"]["test"]
    groups = rr.by_method([a])
    assert rr.report_splits(groups) == ["test", "ood_sql"]
    assert "### ood_sql" in rr.build_markdown([a], title="T")


def test_report_only_with_a_torn_summary_is_one_line_naming_it(tmp_path, capsys):
    summaries = tmp_path / reproduce_publish.SUMMARIES
    summaries.mkdir()
    (summaries / "grpo_seed0.json").write_text(json.dumps(run("grpo", 0, 0.5, 0.9)))
    torn = summaries / "grpo_seed1.json"
    torn.write_text(json.dumps(run("grpo", 1, 0.5, 0.9))[:40])
    argv = ["--report-only", "--results", str(tmp_path), "--report", str(tmp_path / "r.md")]
    assert reproduce.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{torn} is not a whole JSON file" in err
    assert not (tmp_path / "r.md").exists()
