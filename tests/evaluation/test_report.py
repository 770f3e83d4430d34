"""``divrl report`` on synthetic run directories: Markdown, HTML and readable PNGs."""

import json
import random
from pathlib import Path

import pytest

from divrl.cli import main
from divrl.evaluation.runner import EvalConfig, write_jsonl
from divrl.evaluation.summary import summarise

STYLES = ("count(*)", "count(col)", "join", "in-subquery")


def fake_results(n_prompts, n, p_correct, style_mix, seed):
    rng = random.Random(seed)
    results = []
    for i in range(n_prompts):
        correct = [rng.random() < p_correct[i % len(p_correct)] for _ in range(n)]
        styles = [rng.choices(STYLES, weights=style_mix)[0] for _ in range(n)]
        clusters = [0 if c else 1 + rng.randrange(2) for c in correct]
        results.append(
            {
                "id": f"q{i}",
                "data_source": "toy_sql",
                "prompt": f"SQL: question {i}\nA: ",
                "ground_truth": "SELECT 1",
                "extra_info": {"hard": i % 2 == 0},
                "texts": ["SELECT 1"] * n,
                "scores": [float(c) for c in correct],
                "correct": correct,
                "extracted": ["SELECT 1"] * n,
                "reasons": ["correct" if c else "wrong" for c in correct],
                "styles": styles,
                "clusters": clusters,
                "cluster_correct": [True, False, False],
                "n_tokens": [10] * n,
                "nll": [5.0] * n,
                "truncated": [False] * n,
                "greedy": {"text": "SELECT 1", "correct": rng.random() < 0.5},
                "distinct_correct_answers": 1 if any(correct) else 0,
            }
        )
    return results


def write_eval(root, splits):
    for split, results in splits.items():
        (root / split).mkdir(parents=True)
        write_jsonl(results, root / split / "results.jsonl")
        summary = summarise(results, EvalConfig(n=len(results[0]["correct"]), n_boot=100))
        (root / split / "summary.json").write_text(json.dumps(summary))


def write_metrics(run_dir, steps, entropy_decay, seed):
    rng = random.Random(seed)
    rows = [
        {
            "step": s,
            "reward/pass@1": min(1.0, 0.4 + s / steps * 0.5 + rng.gauss(0, 0.03)),
            "actor/entropy": 0.8 * (1 - entropy_decay * s / steps),
            "pg/approx_kl": abs(rng.gauss(0, 1e-3)),
            "response/length": 30 + rng.gauss(0, 1),
        }
        for s in range(1, steps + 1)
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(rows, run_dir / "metrics.jsonl")


@pytest.fixture
def dirs(tmp_path):
    base = tmp_path / "base_eval"
    write_eval(
        base,
        {
            "test": fake_results(20, 8, [0.5, 0.1], (5, 3, 2, 1), 0),
            "ood_math": fake_results(20, 8, [0.6], (1, 1, 1, 1), 1),
        },
    )
    grpo = tmp_path / "grpo"
    write_metrics(grpo, 40, 0.9, 2)
    write_eval(
        grpo / "eval",
        {
            "test": fake_results(20, 8, [0.9, 0.0], (1, 0.01, 0.01, 0.01), 3),
            "ood_math": fake_results(20, 8, [0.4], (1, 1, 1, 1), 4),
        },
    )
    dph = tmp_path / "dph_js"
    write_metrics(dph, 40, 0.2, 5)
    write_eval(
        dph / "eval",
        {
            "test": fake_results(20, 8, [0.8, 0.2], (4, 3, 2, 1), 6),
            "ood_math": fake_results(20, 8, [0.6], (1, 1, 1, 1), 7),
        },
    )
    return tmp_path, base, grpo, dph


def test_report_from_synthetic_runs(dirs, capsys):
    tmp, base, grpo, dph = dirs
    out = tmp / "report"
    assert main(["report", str(grpo), f"DPH-JS={dph}", "--base", str(base), "--out", str(out)]) == 0
    assert "report:" in capsys.readouterr().out
    md = (out / "report.md").read_text()
    for png in (
        "pass_at_k_test.png",
        "relative_pass_at_k_test.png",
        "pass_at_k_ood_math.png",
        "relative_pass_at_k_ood_math.png",
        "styles_test.png",
        "training_curves.png",
    ):
        assert (out / png).stat().st_size > 10_000, png
        assert f"({png})" in md
    # the tables name every model and report retention against the base
    assert "| grpo |" in md and "| DPH-JS |" in md and "| base (base) |" in md
    assert "retention" in md and "P@8 / base [CI]" in md
    # the headline puts diversity beside accuracy, per eval set and model
    headline = md.split("## Headline")[1].split("##")[0]
    assert (
        "styles / prompt" in headline and "1 style" in headline and "P@n [CI] (n = 8)" in headline
    )
    assert "| test | base |" in headline and "| ood_math | base |" in headline
    assert "|  | DPH-JS |" in headline  # the set is named once per group of rows
    assert "Missing evaluations" not in md
    html = (out / "report.html").read_text()
    assert "<table>" in html and 'src="training_curves.png"' not in html


def test_report_without_base_and_bad_input(dirs, tmp_path, capsys):
    tmp, _, grpo, _ = dirs
    out = tmp / "report2"
    assert main(["report", str(grpo), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "relative_pass_at_k" not in md and "retention" not in md
    assert main(["report", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["report", str(grpo), str(grpo), "--out", str(out)]) == 2
    assert "names must differ" in capsys.readouterr().err


@pytest.fixture
def drawn(monkeypatch):
    """What each saved figure drew: per PNG name, per axes the line colours by label, the
    number of shaded bands, the y limits, the x tick values and the y tick labels."""
    from divrl.evaluation import plots

    figures = {}
    save = plots._save

    def recording_save(fig, path):
        axes = []
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            lines = {ln.get_label(): ln.get_color() for ln in ax.get_lines()}
            axes.append(
                {
                    "lines": {k: v for k, v in lines.items() if not k.startswith("_")},
                    "bands": len(ax.collections),
                    "bars": {b.get_label(): b.patches[0].get_facecolor() for b in ax.containers},
                    "ylim": ax.get_ylim(),
                    "xticks": list(ax.get_xticks()),
                    "yticklabels": [t.get_text() for t in ax.get_yticklabels()],
                }
            )
        figures[path.name if hasattr(path, "name") else str(path)] = axes
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", recording_save)
    return figures


def test_report_plots_colours_zoom_bands_and_steps(dirs, drawn):
    import matplotlib.colors as mcolors

    tmp, base, grpo, dph = dirs
    out = tmp / "report_plots"
    assert main(["report", str(grpo), f"DPH-JS={dph}", "--base", str(base), "--out", str(out)]) == 0
    colour = {}  # model -> colour, must be the same in every plot
    for name, axes in drawn.items():
        for ax in axes:
            for label, c in ax["lines"].items():
                model = label.split(" (")[0]
                colour.setdefault(model, mcolors.to_hex(c))
                assert mcolors.to_hex(c) == colour[model], (name, label)
            for label, c in ax["bars"].items():
                colour.setdefault(label, mcolors.to_hex(c))
                assert mcolors.to_hex(c) == colour[label], (name, label)
    assert len({colour["base"], colour["grpo"], colour["DPH-JS"]}) == 3
    # relative Pass@k: the base is not a coloured line, grpo keeps its colour, bands drawn
    rel = drawn["relative_pass_at_k_test.png"][0]
    assert set(rel["lines"]) == {"grpo", "DPH-JS", "base (= 1)"}
    assert rel["bands"] == 2
    # absolute Pass@k: bands, and a y axis zoomed to the data rather than 0..1
    absolute = drawn["pass_at_k_ood_math.png"][0]
    assert absolute["bands"] == 3
    assert absolute["ylim"][0] > 0.05 or absolute["ylim"][1] < 0.95
    # training curves: integer step ticks
    for ax in drawn["training_curves.png"]:
        assert all(float(t).is_integer() for t in ax["xticks"])
    # style histogram: horizontal bars, style names on the y axis
    assert set(drawn["styles_test.png"][0]["yticklabels"]) == set(STYLES)


def test_report_html_is_self_contained(dirs):
    import re

    tmp, base, grpo, dph = dirs
    out = tmp / "report_html"
    assert main(["report", str(grpo), f"DPH-JS={dph}", "--base", str(base), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]*)"', html)
    assert len(sources) == 7  # Pass@k, relative, styles per set (2) + training curves
    assert all(src.startswith("data:image/png;base64,") for src in sources)
    assert "<link" not in html and "<script" not in html


def test_report_warns_about_missing_evals_and_strict_fails(dirs, capsys):
    import shutil

    tmp, base, grpo, dph = dirs
    shutil.rmtree(dph / "eval" / "ood_math")
    out = tmp / "report_missing"
    argv = ["report", str(grpo), f"DPH-JS={dph}", "--base", str(base), "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: model DPH-JS has no evaluation of ood_math" in err
    assert err.count("warning:") == 1  # base and grpo have every set
    md = (out / "report.md").read_text()
    assert "## Missing evaluations" in md and "DPH-JS has no evaluation of ood_math" in md
    strict_out = tmp / "report_strict"
    assert main([*argv[:-1], str(strict_out), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "--strict: model DPH-JS has no evaluation of ood_math" in err
    assert "Traceback" not in err and not strict_out.exists()


def test_report_escapes_untrusted_names(dirs):
    tmp, base, grpo, _ = dirs
    evil = "<img src=x onerror=alert(1)>"
    results = fake_results(6, 4, [0.5], (1, 1, 1, 1), 9)
    write_eval(base, {evil: results})
    write_eval(grpo / "eval", {evil: results})
    out = tmp / "report_evil"
    argv = ["report", f"<b>grpo</b>={grpo}", "--base", str(base), "--out", str(out)]
    assert main([*argv, "--title", f"<script>alert(2)</script> {evil}"]) == 0
    html = (out / "report.html").read_text()
    assert "<img src=x" not in html and "<script>" not in html and "<b>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<title>&lt;script&gt;alert(2)&lt;/script&gt;" in html
    # the set's plots are written inside the report folder under a file-safe name
    written = sorted(p.name for p in out.iterdir())
    assert "pass_at_k__img_src_x_onerror_alert_1__.png" in written
    assert all(p.parent == out for p in out.rglob("*"))


def test_report_names_responses_cut_at_the_context(dirs):
    tmp, base, grpo, _ = dirs
    results = fake_results(20, 8, [0.4], (1, 1, 1, 1), 4)
    for r in results[:5]:  # 40 of 160 samples ran into the model's context
        r["truncated"] = r["at_context"] = [True] * 8
    write_eval(tmp / "long" / "eval", {"test": results})
    out = tmp / "with_cut"
    assert main(["report", str(tmp / "long"), "--base", str(base), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "reached the model's context" in md and "long 25.0%" in md and "base 0.0%" in md
    out = tmp / "without"
    assert main(["report", str(grpo), "--base", str(base), "--out", str(out)]) == 0
    assert "reached the model's context" not in (out / "report.md").read_text()


def test_report_says_what_the_table_shows_and_flags_a_method_below_grpo(dirs):
    tmp, base, grpo, _ = dirs
    weak = tmp / "weak"  # P@n and styles below both the base and GRPO on ood_math
    write_eval(
        weak / "eval",
        {
            "test": fake_results(20, 8, [0.8, 0.2], (4, 3, 2, 1), 6),
            "ood_math": fake_results(20, 8, [0.05], (1, 0.01, 0.01, 0.01), 7),
        },
    )
    out = tmp / "report_reading"
    assert (
        main(["report", str(grpo), f"DPH-JS={weak}", "--base", str(base), "--out", str(out)]) == 0
    )
    md = (out / "report.md").read_text()
    reading = md.split("## What the table shows")[1].split("\n## ")[0]
    # one sentence per eval set, naming each model's change with its interval
    test_line = next(line for line in reading.splitlines() if "On `test`" in line)
    assert "grpo raises P@1" in test_line and "lowers styles / prompt to 1.20 (x0.36 [" in test_line
    assert "DPH-JS raises P@1" in test_line and "keeps styles / prompt" in test_line
    assert sum("- On `" in line for line in reading.splitlines()) == 2
    flags = [line for line in reading.splitlines() if line.startswith("- **Flag:**")]
    assert any("DPH-JS falls below GRPO on `ood_math` P@8" in f for f in flags)
    assert any(
        "DPH-JS falls below the base model on `ood_math` styles / prompt" in f for f in flags
    )
    assert not any("grpo falls below GRPO" in f for f in flags)  # GRPO is not its own reference
    assert "What the table shows" in (out / "report.html").read_text()


def test_reading_needs_a_base_and_labels_trace_clusters():
    from divrl.evaluation.report_doc import ModelEval
    from divrl.evaluation.report_reading import is_grpo, reading

    def model(name, texts):
        results = fake_results(6, 4, [0.5], (1, 1, 1, 1), 0)
        for r in results:
            r.update(data_source="math", styles=[None] * 4, texts=texts)
        summary = summarise(results, EvalConfig(n=4, n_boot=20))
        m = ModelEval(name=name, eval_dir=Path("/nonexistent"), summaries={"s": summary})
        m._results["s"] = results
        return m

    base = model("base", ["a b c", "x = 1 so 2", "d e f g", "h i j"])
    collapsed = model("GRPO", ["a b c"] * 4)
    assert is_grpo(collapsed) and not is_grpo(base)
    sentence, flags = reading([collapsed], base, "s")
    assert "trace clusters / prompt 4.00" in sentence
    assert "and lowers trace clusters / prompt to 1.00 (x0.25 [0.25, 0.25])" in sentence
    assert flags == [
        "GRPO falls below the base model on `s` trace clusters / prompt (x0.25 [0.25, 0.25])"
    ]
    assert reading([collapsed], None, "s") == (None, [])


def test_a_set_without_a_style_classifier_shows_trace_clusters_marked(dirs, tmp_path):
    _, base, grpo, _ = dirs
    md = None
    for name, styled in (("styled", True), ("plain", False)):
        root = tmp_path / name
        for path in (base, grpo / "eval"):
            res = fake_results(10, 4, [0.5], (1, 1, 1, 1), 0)
            if not styled:
                for r in res:
                    r.update(data_source="math", styles=[None] * 4, texts=["a b", "c d"] * 2)
            write_eval(root / path.parent.name / path.name, {"own": res})
        out = root / "report"
        args = [str(root / "grpo" / "eval"), "--base", str(root / base.parent.name / base.name)]
        assert main(["report", *args, "--out", str(out)]) == 0
        md = (out / "report.md").read_text()
        headline = md.split("## Headline")[1].split("\n## ")[0]
        assert ("2.00 (traces)" in headline) == (not styled)
        assert ("`(traces)`: the eval set's data source has no style classifier" in md) == (
            not styled
        )
    assert "| distinct-2 | self-BLEU |" in md  # the measures every data source has
