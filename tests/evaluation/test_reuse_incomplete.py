"""``divrl eval --reuse`` on a samples.jsonl cut short: refused with what is missing, never
scored as if the remaining prompts were the whole set (docs/reliability.md, "Evaluation")."""

from __future__ import annotations

import json

import pytest

from divrl.cli import main
from divrl.evaluation.reuse import IncompleteSamplesError
from divrl.evaluation.runner import EvalConfig, evaluate


@pytest.fixture
def evaluated(tmp_path, tiny_lm):
    """An evaluation of the tiny model on 4 prompts, n=2 (as `divrl eval` writes it)."""
    model, tokenizer = tiny_lm
    data = tmp_path / "data.jsonl"
    rows = [{"id": f"p{i}", "question": f"Q:{i}+1=", "answer": str(i + 1)} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    cfg = EvalConfig(n=2, max_new_tokens=4, batch_size=4)
    evaluate(None, str(data), out, cfg, model=model, tokenizer=tokenizer, progress=False)
    assert json.loads((out / "eval_config.json").read_text())["prompts"] == 4
    return out


def _reuse(out):
    return evaluate(None, None, out, EvalConfig(n=2), reuse=True, progress=False)


def test_complete_samples_are_reused(evaluated):
    from divrl.evaluation.runner import read_jsonl
    from divrl.evaluation.summary import eval_data_fingerprint

    summary = _reuse(evaluated)
    assert summary["n_prompts"] == 4
    # sampling and rescoring record the same prompts' fingerprint in their provenance
    expected = eval_data_fingerprint(read_jsonl(evaluated / "samples.jsonl"))
    meta = json.loads((evaluated / "eval_config.json").read_text())
    assert meta["provenance"]["data"] == summary["provenance"]["data"] == expected
    assert meta["provenance"]["prompts"] == 4 and meta["provenance"]["engine"] == "auto"


def test_samples_cut_at_a_line_boundary_are_refused(evaluated, capsys):
    path = evaluated / "samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]))
    with pytest.raises(IncompleteSamplesError, match=r"is incomplete: 3 of the 4 prompts"):
        _reuse(evaluated)
    code = main(["eval", "--reuse", "--out", str(evaluated.parent), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "3 of the 4 prompts" in err and "without --reuse" in err
    assert "Traceback" not in err


def test_a_torn_last_line_is_refused_not_a_traceback(evaluated):
    path = evaluated / "samples.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(IncompleteSamplesError, match=r"line 4 is cut short"):
        _reuse(evaluated)


def test_a_prompt_with_fewer_samples_is_refused(evaluated):
    path = evaluated / "samples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[1]["samples"] = records[1]["samples"][:1]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(
        IncompleteSamplesError,
        match=rf"1 prompts have fewer than n=2 samples \({records[1]['id']}\)",
    ):
        _reuse(evaluated)


def test_a_bad_line_before_the_last_names_the_line(evaluated):
    path = evaluated / "samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = "{not json\n"
    path.write_text("".join(lines))
    with pytest.raises(IncompleteSamplesError, match=r"samples\.jsonl: line 2: not a JSON record"):
        _reuse(evaluated)
