"""`divrl report` on half-written inputs: a torn last line of metrics.jsonl or results.jsonl
is dropped with a warning, a torn summary.json leaves its eval set out with a warning, a bad
metrics.jsonl line before the last ends the training curves there (with a warning naming the
file and line) and a bad results.jsonl line before the last is one error naming the file and
line (docs/reliability.md, "Evaluation")."""

from __future__ import annotations

from test_report import dirs  # noqa: F401 (the fixture)

from divrl.cli import main
from divrl.evaluation.report import load_model_eval
from divrl.evaluation.report_seeds import seed_caption


def _cut(path, n_bytes=25):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - n_bytes])


def _report(tmp, base, grpo, dph):
    return main(
        ["report", str(grpo), f"DPH-JS={dph}", "--base", str(base), "--out", str(tmp / "r")]
    )


def test_torn_last_lines_are_dropped_with_a_warning(dirs, capsys, caplog):  # noqa: F811
    tmp, base, grpo, dph = dirs
    _cut(grpo / "metrics.jsonl")
    _cut(dph / "eval" / "test" / "results.jsonl")
    assert _report(tmp, base, grpo, dph) == 0
    assert (tmp / "r" / "report.md").is_file()
    assert f"{grpo / 'metrics.jsonl'}: dropping a torn last line 40" in caplog.text
    assert f"{dph / 'eval' / 'test' / 'results.jsonl'}: dropping a torn last line 20" in caplog.text
    assert "divrl eval --reuse" in caplog.text


def test_a_torn_summary_leaves_its_set_out_with_a_warning(dirs, capsys, caplog):  # noqa: F811
    tmp, base, grpo, dph = dirs
    _cut(grpo / "eval" / "ood_math" / "summary.json", 200)
    assert _report(tmp, base, grpo, dph) == 0
    summary = grpo / "eval" / "ood_math" / "summary.json"
    assert f"{summary}: damaged or cut short" in caplog.text
    assert f"divrl eval --reuse --out {grpo / 'eval'}" in caplog.text
    assert "model grpo has no evaluation of ood_math" in capsys.readouterr().err


def test_a_bad_metrics_line_ends_the_curves_with_a_warning(dirs, caplog):  # noqa: F811
    _, _, grpo, _ = dirs
    path = grpo / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "{torn\n"
    path.write_text("".join(lines))
    run = load_model_eval(grpo)  # what `divrl report` reads (the rest is drawn as usual)
    assert [r["step"] for r in run.metrics] == [1, 2, 3] and run.steps == 3
    assert f"{path}: line 4 is not a JSON record" in caplog.text
    assert "shows the 3 records before it and leaves out the 37 lines" in caplog.text
    assert seed_caption([run]) == "Seeds and steps per method: grpo: 1 seed, 3 steps."


def test_a_bad_results_line_before_the_last_is_one_error(dirs, capsys):  # noqa: F811
    tmp, base, grpo, dph = dirs
    path = grpo / "eval" / "test" / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "{torn\n"
    path.write_text("".join(lines))
    assert _report(tmp, base, grpo, dph) == 2
    err = capsys.readouterr().err
    assert f"divrl report: {path}: line 4 is not a JSON record" in err
    assert "Traceback" not in err
