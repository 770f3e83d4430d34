"""The exploration split a verl DPH run trains on."""

from __future__ import annotations

from importlib import resources

import pytest

from divrl.data.loading import load_examples
from divrl.data.reference_store import ReferenceSample, write_reference_store
from divrl.integrations.verl.data import main, write_exploration_split


def test_the_exploration_prompts_of_the_store_are_written(tmp_path, capsys):
    train = resources.files("divrl.data").joinpath("fixtures", "math.jsonl")
    ids = [ex.id for ex in load_examples(train)]
    prompts = [
        {
            "prompt_id": pid,
            "n_correct": 8 * (i % 2),
            "has_reference": i % 2 == 1,
            "split": "near_perfect" if i % 2 else "exploration",
        }
        for i, pid in enumerate(ids)
    ]
    sample = ReferenceSample(ids[1], [1, 2], [3], [-0.5])
    write_reference_store(tmp_path / "store", [sample], prompts, {})
    out = tmp_path / "exp.parquet"
    main([str(train), str(tmp_path / "store"), str(out)])
    written = [ex.id for ex in load_examples(out)]
    assert written == ids[0::2] and "exploration prompts" in capsys.readouterr().out
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_exploration_split(train, tmp_path / "store", out)
    write_reference_store(
        tmp_path / "other",
        [sample],
        [{**p, "prompt_id": "x" + p["prompt_id"]} for p in prompts],
        {},
    )
    with pytest.raises(ValueError, match="presampled from this file"):
        write_exploration_split(train, tmp_path / "other", tmp_path / "b.jsonl")
