import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The models here are tiny: one intra-op thread is as fast, and on a busy 2-core machine
    two threads measured several times slower. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
