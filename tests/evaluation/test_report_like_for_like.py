"""`divrl report` refuses what is not like for like, or marks it with --allow-mismatch: a
stale evaluation (of an earlier checkpoint than the run's last step), evaluations on other
prompts, training runs with other data handling; and it shows seeds as an axis (mean ±
standard error across the runs of one method), with the seeds and steps of every row."""

from __future__ import annotations

import json
import math
import shutil

import yaml
from test_report import dirs  # noqa: F401 (the fixture)

from divrl.cli import main
from divrl.commands.report import _seeds
from divrl.evaluation.report import headline_table, load_model_eval
from divrl.evaluation.report_checks import check_like_for_like
from divrl.evaluation.report_doc import ModelEval
from divrl.evaluation.report_reading import is_grpo
from divrl.evaluation.report_seeds import mean_se, seed_mean_row
from divrl.provenance import git_state, provenance
from divrl.runs import RunDir


def _report(tmp, base, *runs, flag=False):
    args = ["report", *map(str, runs), "--base", str(base), "--out", str(tmp / "r")]
    return main(args + (["--allow-mismatch"] if flag else []))


def _marked(base, *runs):
    """(the mismatch sentences, the headline rows marked ⚠) of a comparison, without
    drawing a report."""
    models = [load_model_eval(r) for r in runs]
    found = check_like_for_like(models, load_model_eval(base, "base"))
    rows = headline_table(models, ["test"])
    return found, [r[1] for r in rows if "⚠" in r[1]]


def _eval_config(eval_dir, model=None, data=None):
    for split in [p.name for p in eval_dir.iterdir() if p.is_dir()]:
        meta = {"model": model, "resolved_model": model, "config": {"n": 8}}
        if data:
            meta["provenance"] = {"data": data}
        (eval_dir / split / "eval_config.json").write_text(json.dumps(meta))


def _checkpoints(run, *steps):
    for step in steps:
        (run / "checkpoints" / f"step_{step:06d}" / "model").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step:06d}" / "model" / "config.json").write_text("{}")


def test_a_stale_evaluation_is_refused_or_marked(dirs, capsys):  # noqa: F811
    tmp, base, grpo, dph = dirs
    _checkpoints(grpo, 20, 40)  # evaluated at 20, then resumed to 40
    _eval_config(grpo / "eval", str(grpo / "checkpoints" / "step_000020" / "model"))
    assert _report(tmp, base, grpo, dph) == 2
    err = capsys.readouterr().err
    assert "grpo: `ood_math`, `test` evaluated step 20 (eval_config.json names step_000020)" in err
    assert "the run has trained 40 steps" in err and "--allow-mismatch" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp / "r" / "report.md").exists()

    assert _marked(base, grpo, dph)[1] == ["grpo ⚠"]  # --allow-mismatch: the row marked

    # evaluated at the last checkpoint: nothing to refuse or mark
    _eval_config(grpo / "eval", str(grpo / "checkpoints" / "step_000040" / "model"))
    assert _marked(base, grpo, dph) == ([], [])


def test_evaluations_on_other_prompts_are_refused_or_marked(dirs, capsys):  # noqa: F811
    tmp, base, grpo, dph = dirs
    _eval_config(base, data="sha256:" + "a" * 64)
    _eval_config(grpo / "eval", data="sha256:" + "a" * 64)
    _eval_config(dph / "eval", data="sha256:" + "b" * 64)
    assert _report(tmp, base, grpo, dph) == 2
    err = capsys.readouterr().err
    assert "dph_js: `test` was evaluated on other prompts than base's" in err
    assert "grpo:" not in err
    found, marked = _marked(base, grpo, dph)
    assert marked == ["dph_js ⚠"] and len(found) == 2  # both eval sets


def test_other_eval_settings_are_refused(dirs, capsys):  # noqa: F811
    tmp, base, grpo, dph = dirs
    summary = dph / "eval" / "test" / "summary.json"
    s = json.loads(summary.read_text())
    s["sampling"]["temperature"] = 0.6
    summary.write_text(json.dumps(s))
    assert _report(tmp, base, grpo, dph) == 2
    assert "other settings than base's: temperature 0.6 vs 1.0" in capsys.readouterr().err


def test_mixed_truncation_between_runs_is_refused_or_marked(dirs, capsys):  # noqa: F811
    tmp, base, grpo, dph = dirs
    data = {"train_path": "math.jsonl", "max_prompt_length": 64, "truncation": "drop"}
    (grpo / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    (dph / "config.yaml").write_text(yaml.safe_dump({"data": {**data, "truncation": "left"}}))
    assert _report(tmp, base, grpo, dph) == 2
    err = capsys.readouterr().err
    assert (
        "dph_js: trained with other data handling than grpo: data.truncation 'left' vs 'drop'"
        in (err)
    )
    assert _marked(base, grpo, dph)[1] == ["dph_js ⚠"]
    (dph / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    assert _marked(base, grpo, dph) == ([], [])


def test_mean_and_standard_error_across_seeds_by_hand():
    mean, se = mean_se([0.2, 0.4, 0.6])  # sd 0.2, se 0.2 / sqrt(3)
    assert math.isclose(mean, 0.4) and math.isclose(se, 0.2 / math.sqrt(3))
    assert mean_se([0.5]) is None
    assert is_grpo(ModelEval("grpo #2", eval_dir=None, group="grpo"))  # a seed of GRPO

    def seed(p1):
        summary = {"ks": [1, 8], "pass@k": {"1": p1, "8": 2 * p1}, "greedy_accuracy": p1}
        summary["diversity"] = {"mean_distinct_styles": 10 * p1, "share_one_style": p1}
        return ModelEval("m", eval_dir=None, summaries={"test": summary}, group="m")

    row = seed_mean_row([seed(0.2), seed(0.4), seed(0.6)], "test")
    assert row == [
        "",
        "m: mean ± s.e. (3 seeds)",
        "0.400 ± 0.115",
        "0.400 ± 0.115",
        "0.800 ± 0.231 (n = 8)",
        "4.00 ± 1.15",
        "0.40 ± 0.12",
    ]


def test_seed_lists_and_repeated_names_make_one_method(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b,c"
    b.mkdir()
    assert _seeds([f"m={a},{tmp_path / 'x'}", f"m={b}", str(a), f"k={a}"]) == [
        ("m #1", str(a), "m"),
        ("m #2", str(tmp_path / "x"), "m"),
        ("m #3", str(b), "m"),  # an existing path with a comma is one run
        (None, str(a), None),
        ("k", str(a), None),
    ]


def test_seeds_mean_row_caption_and_a_marked_stale_seed(dirs):  # noqa: F811
    tmp, base, grpo, dph = dirs
    for root in (base, grpo / "eval", dph / "eval"):
        shutil.rmtree(root / "ood_math")  # one eval set: half the plots to draw
    _checkpoints(grpo, 20, 40)
    _eval_config(grpo / "eval", str(grpo / "checkpoints" / "step_000020" / "model"))
    RunDir(dph).add_provenance({"event": "start", **provenance(data="sha256:" + "c" * 64)})
    assert _report(tmp, base, f"m={grpo},{dph}", flag=True) == 0
    md = (tmp / "r" / "report.md").read_text()
    assert "## Not like for like" in md and "- m #1: `test` evaluated step 20" in md
    assert "(40 steps, evaluated at step 20)" in md
    table = md.split("## Provenance")[1].split("##")[0]
    commit = git_state()["commit"][:10] if git_state() else "no checkout"
    assert f"| m #2 | {commit}" in table and "| cccccccccccc |" in table
    assert "| m #1 ⚠ | not recorded |" in table  # a run from before provenance was written
    assert json.loads((tmp / "r" / "provenance.json").read_text())["models"]["m #2"]["steps"] == 40
    headline = md.split("## Headline")[1].split("##")[0]
    p1 = [
        json.loads((r / "eval" / "test" / "summary.json").read_text())["pass@k"]["1"]
        for r in (grpo, dph)
    ]
    mean, se = sum(p1) / 2, abs(p1[0] - p1[1]) / 2  # two values: s.e. = half their distance
    assert "| m #1 ⚠ |" in headline and "| m #2 |" in headline
    assert "| m: mean ± s.e. (2 seeds) | " in headline
    assert f"{mean:.3f} ± {se:.3f}" in headline
    assert "base: evaluation only (no training run); m: 2 seeds, 40 steps." in headline
