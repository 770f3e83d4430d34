"""``divrl eval`` end to end on the tiny toy world, and ``--reuse`` without resampling."""

import json
from pathlib import Path

import pytest

from divrl.cli import main
from divrl.evaluation.runner import (
    EvalConfig,
    evaluate,
    read_jsonl,
    resolve_model_path,
    score_samples,
)
from divrl.evaluation.summary import summarise


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from divrl.toy import ensure_toy_world

    return ensure_toy_world(tmp_path_factory.mktemp("toy"), size="tiny", progress=False)


@pytest.mark.slow
def test_eval_command_on_tiny_world(world, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(world.model_dir), "--out", str(out), "--n", "4"]
    argv += ["--data", f"test={world.splits['test']}", "--data", f"math={world.splits['ood_math']}"]
    argv += ["--limit", "2", "--max-new-tokens", "24", "--no-progress", "--group-by", "hard"]
    assert main(argv) == 0
    assert "summaries in" in capsys.readouterr().out
    combined = json.loads((out / "summary.json").read_text())
    assert set(combined) == {"test", "math"}
    s = combined["test"]
    assert s["n_prompts"] == 2 and s["n_samples_per_prompt"] == 4 and s["ks"] == [1, 2, 4]
    assert set(s["pass@k"]) == set(s["maj@k"]) == {"1", "2", "4"}
    assert 0.0 <= s["pass@k"]["1"] <= s["pass@k"]["4"] <= 1.0
    assert s["pass@k"]["1"] == pytest.approx(s["mean_accuracy"])
    assert "greedy_accuracy" in s and len(s["pass@k_ci"]["4"]) == 2
    assert sum(s["reasons"].values()) == 2 * 4
    assert set(s["groups"]) <= {"hard=True", "hard=False"} and s["groups"]
    results = read_jsonl(out / "test" / "results.jsonl")
    assert len(results) == 2
    for r in results:
        assert len(r["texts"]) == len(r["correct"]) == len(r["styles"]) == len(r["clusters"]) == 4
        assert r["greedy"] is not None and "correct" in r["greedy"]
        assert r["extra_info"]["db_path"]
    samples = read_jsonl(out / "test" / "samples.jsonl")
    assert all(len(rec["samples"]) == 4 for rec in samples)
    assert all(smp["nll"] >= 0 for rec in samples for smp in rec["samples"])
    # re-scoring keeps the samples and the settings they were drawn with
    assert (
        main(["eval", "--reuse", "--out", str(out), "--temperature", "0.5", "--no-progress"]) == 0
    )
    again = json.loads((out / "summary.json").read_text())["test"]
    assert again["sampling"]["temperature"] == 1.0
    assert again["pass@k"] == s["pass@k"] and again["maj@k"] == s["maj@k"]
    assert read_jsonl(out / "test" / "samples.jsonl") == samples


class _ExplodingEngine:
    def generate(self, *args, **kwargs):
        raise AssertionError("--reuse must not sample")


def test_reuse_rescoring_does_not_sample(tmp_path, monkeypatch, write_hand_samples):
    # samples written by hand: --reuse must score exactly these texts
    out = tmp_path / "run"
    write_hand_samples(out, pattern="rwwr", nll=1.5)
    import divrl.evaluation.runner as runner

    def no_model(*a, **k):
        raise AssertionError("--reuse must not load a model")

    monkeypatch.setattr(runner, "load_model", no_model)
    monkeypatch.setattr(runner, "generate_samples", no_model)
    summary = evaluate(None, None, out, EvalConfig(n=4), reuse=True, engine=_ExplodingEngine())
    assert summary["mean_accuracy"] == 0.5
    assert summary["greedy_accuracy"] == 1.0
    assert summary["pass@k"]["4"] == 1.0
    assert summary["pass@k"]["1"] == 0.5
    # 2 votes each for the right and the wrong answer: a tie counts half
    assert summary["maj@k"]["4"] == 0.5
    assert (out / "results.jsonl").is_file()
    # the CLI path: --reuse with no --data finds the sets under --out
    assert main(["eval", "--reuse", "--out", str(tmp_path), "--n", "4", "--no-progress"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["run"]["mean_accuracy"] == 0.5


def test_reuse_without_samples_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", "--reuse", "--out", str(tmp_path)]) == 2
    assert "no */samples.jsonl" in capsys.readouterr().err


def test_summary_styles_and_distinct_answers():
    # SQL-free, hand-made results: styles per sample and correctness
    cfg = EvalConfig(n=4, n_boot=50)
    records = [
        {
            "id": str(i),
            "data_source": "math",
            "prompt": "p",
            "ground_truth": "2",
            "extra_info": {"hard": i % 2 == 0},
            "samples": [
                {"text": t, "n_tokens": 2, "nll": 1.0, "truncated": False}
                for t in ("\\boxed{2}", "\\boxed{2.0}", "\\boxed{4/2}", "\\boxed{3}")
            ],
            "greedy": None,
        }
        for i in range(2)
    ]
    results = score_samples(records, cfg, progress=False)
    assert results[0]["correct"] == [True, True, True, False]
    # 2, 2.0 and 4/2 are one cluster, 3 another
    assert len(set(results[0]["clusters"])) == 2
    assert results[0]["distinct_correct_answers"] == 3
    summary = summarise(results, EvalConfig(n=4, n_boot=50, group_by=("hard",)))
    assert summary["maj@k"]["4"] == 1.0
    assert summary["diversity"]["mean_distinct_correct_answers"] == 3.0
    # plain math has no style classifier: the styles are trace clusters (2 and 2.0 and 4/2
    # and 3 all mask to one route), labelled as such
    assert summary["diversity"]["styles_measure"] == "trace clusters"
    assert summary["diversity"]["mean_distinct_styles"] == 1.0
    assert summary["diversity"]["mean_answer_clusters"] == 2.0
    assert summary["tokens"]["mean_nll_per_token"] == pytest.approx(0.5)
    assert set(summary["groups"]) == {"hard=True", "hard=False"}


def test_resolve_model_path(tmp_path):
    model = tmp_path / "run" / "checkpoints" / "step_000010" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    older = tmp_path / "run" / "checkpoints" / "step_000005" / "model"
    older.mkdir(parents=True)
    (older / "config.json").write_text("{}")
    from divrl.evaluation.pinning import origin_of

    pinned = resolve_model_path(tmp_path / "run")  # a run's checkpoint is loaded from a pin
    assert origin_of(pinned) == str(model) and (Path(pinned) / "config.json").is_file()
    assert resolve_model_path(model.parent) == str(model)
    assert resolve_model_path(model) == str(model)
    with pytest.raises(FileNotFoundError):
        resolve_model_path(tmp_path)


def test_config_validation():
    with pytest.raises(ValueError, match="temperature"):
        EvalConfig(temperature=0)
    with pytest.raises(ValueError, match="n=0"):
        EvalConfig(n=0)


def test_demo_rejects_unknown_methods(capsys):
    assert main(["demo", "--methods", "grpo,ppo"]) == 2
    assert "unknown ['ppo']" in capsys.readouterr().err
    assert main(["demo", "--world", "nope"]) == 2
    assert "unknown 'nope'" in capsys.readouterr().err


def test_demo_headline_shows_pass_at_the_largest_k_and_styles_per_prompt(capsys):
    from types import SimpleNamespace

    from divrl.commands.demo import _print_table

    def split(p1, pn, styles):
        return {
            "ks": [1, 2, 4, 8],
            "greedy_accuracy": 0.5,
            "pass@k": {"1": p1, "2": 0.0, "4": 0.0, "8": pn},
            "diversity": {"mean_distinct_styles": styles},
        }

    models = [
        SimpleNamespace(name="base", summaries={"test": split(0.14, 0.86, 3.22)}),
        SimpleNamespace(name="GRPO", summaries={"test": split(0.61, 0.71, 1.04)}),
    ]
    _print_table(models, ["test"])
    out = capsys.readouterr().out
    assert "P@8 /" in out and "styles per prompt" in out
    assert "0.50 / 0.14 / 0.86 / 3.2" in out and "0.50 / 0.61 / 0.71 / 1.0" in out


def test_demo_parallel_runner_reports_a_failed_run(tmp_path):
    from divrl.pipeline import run_parallel

    task = ("train bad", ["train", str(tmp_path / "missing.yaml")], tmp_path / "m.jsonl", 3)
    with pytest.raises(RuntimeError, match=r"train bad \(exit 2, log .*train_bad.log\)"):
        run_parallel([task], jobs=2, logs=tmp_path / "logs")
    assert "config file not found" in (tmp_path / "logs" / "train_bad.log").read_text()


@pytest.mark.slow
def test_greedy_responses_come_from_the_rollout_engine_and_match_hf_greedy(world):
    """The eval runner's greedy decoding (the rollout engine at temperature 0) gives the
    tokens of HF ``generate(do_sample=False)`` on the same left-padded batch."""
    import torch

    from divrl.evaluation.runner import greedy_generate, load_model, read_jsonl

    model, tok = load_model(world.model_dir)
    prompts = [r["prompt"] for r in read_jsonl(world.splits["test"])[:5]]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    ours = greedy_generate(model, tok, ids, max_new_tokens=16, batch_size=5)
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        ref = model.generate(
            **enc, do_sample=False, max_new_tokens=16, pad_token_id=tok.pad_token_id
        )
    for got, row in zip(ours, ref[:, enc["input_ids"].shape[1] :].tolist(), strict=True):
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        assert got["n_tokens"] == end and got["truncated"] == (tok.eos_token_id not in row)
        assert got["text"] == tok.decode(row[:end], skip_special_tokens=True)


@pytest.mark.slow
def test_the_demos_eval_subprocess_gives_the_numbers_of_the_in_process_eval(
    world, tmp_path, monkeypatch
):
    """``divrl demo --jobs 2`` evaluates in ``divrl eval`` subprocesses
    (:func:`divrl.pipeline.eval_command`): the same samples and summary as the in-process
    :func:`divrl.pipeline.evaluate_splits` with the same ``EvalConfig``."""
    from divrl.pipeline import eval_command, evaluate_splits

    cfg = EvalConfig(
        n=3, max_new_tokens=20, batch_size=32, limit=3, group_by=("hard",), seed=5, n_boot=50
    )
    splits = ["test", "ood_math"]
    here = evaluate_splits(world.model_dir, world, tmp_path / "here", cfg, splits, lambda _: None)
    argv = eval_command(world.model_dir, world, splits, tmp_path / "sub", cfg)
    # the demo starts it with OMP_NUM_THREADS=1 (pipeline.start_logged), as this process
    # runs; on 2 threads another summation order could draw other samples
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(argv) == 0
    for split in splits:
        sub = json.loads((tmp_path / "sub" / split / "summary.json").read_text())
        for key in ("pass@k", "maj@k", "greedy_accuracy", "n_prompts", "diversity", "sampling"):
            assert sub[key] == here[split][key], (split, key)
        samples = [read_jsonl(tmp_path / d / split / "samples.jsonl") for d in ("here", "sub")]
        assert samples[0] == samples[1]
