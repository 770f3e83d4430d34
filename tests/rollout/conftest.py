import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "_divrl_training_conftest", Path(__file__).parents[1] / "training" / "conftest.py"
)
_training = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_training)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _training.build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


_one_torch_thread = _training._one_torch_thread
