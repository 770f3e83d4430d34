"""Session fixtures of the TRL integration tests (helpers live in trl_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trl_helpers import tiny_model, tiny_tokenizer, write_store


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def store(tmp_path_factory, tokenizer) -> Path:
    """Reference samples with the initial policy's (``tiny_model(0)``) log-probs."""
    return write_store(tmp_path_factory.mktemp("store") / "store", tiny_model(0), tokenizer)


@pytest.fixture(scope="session")
def foreign_store(tmp_path_factory, tokenizer) -> Path:
    """Same responses, log-probs of another random model: u != 1 at initialisation."""
    return write_store(tmp_path_factory.mktemp("store") / "foreign", tiny_model(7), tokenizer)


@pytest.fixture(autouse=True)
def arrow_cache(monkeypatch, tmp_path_factory):
    """The reference stream's re-grouped store copies go to a temporary folder, not the
    user's ~/.cache/divrl (subprocesses inherit the variable)."""
    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path_factory.mktemp("divrl_cache")))
