"""Messages about the training prompts: all of them dropped (how many, by which setting),
and a batch larger than the prompt set (a warning)."""

from __future__ import annotations

import logging

import pytest
from train_helpers import tiny_overrides

from divrl.training.config import load_config
from divrl.training.trainer import Trainer


def test_too_long_prompts_are_an_error_naming_count_longest_and_settings(tiny_world, tmp_path):
    from divrl.data.prompts import PromptLengthError

    config = load_config(
        None, tiny_overrides(tiny_world, tmp_path, **{"data.max_prompt_length": 7})
    )
    with pytest.raises(PromptLengthError) as err:
        Trainer(config)
    message = str(err.value)
    assert "6 of 16 prompts in" in message and "data.max_prompt_length=7" in message
    assert "(the longest has 8)" in message and "data.truncation=drop" in message


def test_all_prompts_dropped_names_the_count_and_the_setting(tiny_world, tmp_path):
    # the tiny prompts "Q:0+1=" .. "Q:15+16=" are 6 to 8 characters (= tokens)
    too_short = {"data.max_prompt_length": 5, "data.truncation": "drop"}
    config = load_config(None, tiny_overrides(tiny_world, tmp_path, **too_short))
    with pytest.raises(ValueError) as err:
        Trainer(config)
    message = str(err.value)
    assert "all 16 rows were dropped by data.max_prompt_length=5" in message
    assert "have 6 to 8 tokens" in message
    assert "set data.max_prompt_length=8 or more" in message


def test_some_prompts_too_long_is_a_warning_with_the_count(tiny_world, tmp_path, caplog):
    some = {"data.max_prompt_length": 7, "data.truncation": "drop"}
    config = load_config(None, tiny_overrides(tiny_world, tmp_path, **some))
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(config)
    assert len(trainer.prompts) == 10  # "Q:0+1=" .. "Q:9+10=" (6 and 7 tokens)
    assert "6 of 16 prompts longer than data.max_prompt_length=7 tokens (dropped" in caplog.text


def test_an_empty_data_file_says_so(tiny_world, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    config = load_config(None, tiny_overrides(tiny_world, tmp_path, **{"data.train_path": empty}))
    with pytest.raises(ValueError, match=r"no usable training prompts in .*: it has no rows"):
        Trainer(config)


def test_prompts_per_step_larger_than_the_data_warns(tiny_world, tmp_path, caplog):
    config = load_config(
        None, tiny_overrides(tiny_world, tmp_path, **{"train.prompts_per_step": 32})
    )
    with caplog.at_level(logging.WARNING):
        Trainer(config)
    assert "train.prompts_per_step=32 is larger than the 16 training prompts" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Trainer(load_config(None, tiny_overrides(tiny_world, tmp_path / "b")))
    assert "prompts_per_step" not in caplog.text


def test_a_missing_model_folder_fails_fast_in_the_loading_stage(tiny_world, tmp_path):
    import time

    from divrl.rollout.model_source import ModelSourceError

    missing = tmp_path / "no_such_model"
    config = load_config(None, tiny_overrides(tiny_world, tmp_path, **{"model.path": missing}))
    start = time.perf_counter()
    with pytest.raises(ModelSourceError, match=f"no local folder {missing}"):
        Trainer(config)
    assert time.perf_counter() - start < 2.0
