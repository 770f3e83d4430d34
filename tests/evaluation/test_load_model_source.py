"""The eval loader checks the model source first: a missing folder is one sentence, fast."""

import time

import pytest

from divrl.evaluation.runner import load_model
from divrl.rollout.model_source import ModelSourceError


def test_load_model_of_a_missing_folder_fails_fast(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ModelSourceError, match=f"no local folder {tmp_path / 'nothing'}"):
        load_model(tmp_path / "nothing")
    assert time.perf_counter() - start < 2.0


def test_eval_progress_bars_name_the_set(tiny_lm, capsys):
    from divrl.data import fixture_path, load_examples
    from divrl.evaluation.runner import EvalConfig, generate_samples

    model, tokenizer = tiny_lm
    examples = load_examples(fixture_path("math.jsonl"), limit=2)
    cfg = EvalConfig(n=2, max_new_tokens=3, batch_size=2)
    generate_samples(model, tokenizer, examples, cfg, progress=True, label="ood_math")
    err = capsys.readouterr().err
    assert "ood_math: sampling n=2" in err and "ood_math: greedy" in err
