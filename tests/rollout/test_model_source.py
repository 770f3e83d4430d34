"""check_model_source: a missing model is one sentence in well under a second."""

import os
import socket
import time

import pytest

from divrl.rollout import model_source
from divrl.rollout.model_source import ModelSourceError, check_model_source


@pytest.fixture
def closed_port_endpoint(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def test_existing_folder_is_returned(tmp_path):
    assert check_model_source(tmp_path) == str(tmp_path)


def test_missing_path_is_not_mistaken_for_a_hub_id(tmp_path):
    with pytest.raises(ModelSourceError, match=r"no local folder .* not a hub id"):
        check_model_source(tmp_path / "model")
    with pytest.raises(ModelSourceError, match="not a hub id"):
        check_model_source("../model")


def test_uncached_hub_id_without_network_fails_fast(closed_port_endpoint, monkeypatch):
    monkeypatch.setattr(model_source, "_in_hub_cache", lambda repo_id: False)
    start = time.perf_counter()
    with pytest.raises(ModelSourceError, match="no local folder org/model and no network"):
        check_model_source("org/model", timeout=2)
    assert time.perf_counter() - start < 2.5


def test_uncached_hub_id_with_offline_flag(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(model_source, "_in_hub_cache", lambda repo_id: False)
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE is set"):
        check_model_source("org/model")


def test_cached_hub_id_without_network_switches_the_hub_offline(closed_port_endpoint, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(model_source, "_in_hub_cache", lambda repo_id: True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert check_model_source("org/model", timeout=2) == "org/model"
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True
    monkeypatch.delenv("HF_HUB_OFFLINE")
