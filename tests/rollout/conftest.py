import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "_divrl_train_helpers", Path(__file__).parents[1] / "training" / "train_helpers.py"
)
_training = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_training)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _training.build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models on a shared 2-core machine run fastest (by far) on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
