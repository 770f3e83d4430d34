"""``divrl report`` on synthetic run directories: Markdown, HTML and readable PNGs."""

import json
import random

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
    html = (out / "report.html").read_text()
    assert "<table>" in html and '<img src="training_curves.png"' in html


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
