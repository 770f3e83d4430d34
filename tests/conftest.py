"""Fixtures of every test directory: one torch thread, and the tiny character-level Llama
of tests/training/train_helpers.py (loaded by path: the test directories are not packages)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "_divrl_train_helpers", Path(__file__).parent / "training" / "train_helpers.py"
)
train_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_helpers)


def _test_threads() -> int:
    """torch intra-op threads of each test: ``$DIVRL_TEST_THREADS``, else 1."""
    raw = os.environ.get("DIVRL_TEST_THREADS", "1").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"DIVRL_TEST_THREADS={raw!r} must be a whole number >= 1")
    return int(raw)


TEST_THREADS = _test_threads()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The models here are tiny: one intra-op thread is as fast, and on a busy 2-core machine
    two threads measured several times slower. ``DIVRL_TEST_THREADS=2 make test`` runs the
    suite on two: every tolerance must hold on both (the thread count changes the order of
    floating-point sums). Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def run_in_session():
    """``train_helpers.run_in_session``: a subprocess whose whole session a timeout kills."""
    return train_helpers.run_in_session


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """``(model, tokenizer)``: a random 2-layer Llama over single characters, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = train_helpers.build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(autouse=True)
def _restore_environment():
    """Each test ends with the environment and accelerate state it started with: a TRL
    GRPOConfig with bf16 leaves accelerate's process-wide ``AcceleratorState`` in bf16 (and
    may write ``ACCELERATE_*`` variables), and every later Accelerator in this process,
    divrl's trainer's included, would then train under bf16 autocast."""
    import sys

    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
