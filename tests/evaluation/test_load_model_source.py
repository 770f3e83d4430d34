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
