"""The DPH reference store is checked against the training run: model, data, sampling
settings and split rule; a mismatch is an error that says what differs and how to proceed."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from train_helpers import build_tiny_lm, parity_reward, tiny_overrides

from divrl.data.fingerprint import model_fingerprint, prompts_fingerprint
from divrl.data.reference_store import MANIFEST, StoreMismatchError
from divrl.training.config import load_config
from divrl.training.loading import run_provenance
from divrl.training.presample import presample
from divrl.training.trainer import Trainer

DPH = {
    "reference.k": 4,
    "reference.per_step": 2,
    "algorithm.divergence": "js",
    "algorithm.divergence_coef": 0.2,
}


def _config(tiny_world, out, store, **extra):
    return load_config(
        None, tiny_overrides(tiny_world, out, **{**DPH, "reference.store": store, **extra})
    )


def test_model_fingerprint_reads_content_not_location(tiny_world, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_world["model"], copy)
    assert model_fingerprint(copy) == model_fingerprint(tiny_world["model"])
    other = build_tiny_lm(tmp_path / "other", seed=1)  # same config, other weights
    assert model_fingerprint(other) != model_fingerprint(tiny_world["model"])
    (copy / "tokenizer_config.json").write_text("{}")
    assert model_fingerprint(copy) != model_fingerprint(tiny_world["model"])
    assert model_fingerprint("org/not-a-local-dir") == "name:org/not-a-local-dir"


def test_prompts_fingerprint_covers_ids_and_tokens_not_order():
    base = prompts_fingerprint([("a", [1, 2]), ("b", [3])])
    assert base == prompts_fingerprint([("b", [3]), ("a", [1, 2])])
    assert base != prompts_fingerprint([("a", [1, 2])])
    assert base != prompts_fingerprint([("a", [1]), ("b", [2, 3])])
    assert base != prompts_fingerprint([("a", [1, 2]), ("b", [4])])
    assert base != prompts_fingerprint([("a", [1, 2]), ("c", [3])])


def test_a_matching_store_trains_and_logs_the_exploration_prompts(
    tiny_world, reference_store, tmp_path, caplog
):
    manifest = json.loads((reference_store / MANIFEST).read_text())
    assert manifest["fingerprint"]["model"] == model_fingerprint(tiny_world["model"])
    assert manifest["fingerprint"]["prompt_count"] == 16
    with caplog.at_level(logging.INFO, logger="divrl.training.presample"):
        trainer = Trainer(_config(tiny_world, tmp_path, reference_store))
    assert len(trainer.prompts) == 8  # the odd prompts: parity_reward's exploration set
    assert "rolling out 8 exploration prompts of 16" in caplog.text
    # provenance: the store's and the run's name all 16 prompts, not the 8 rolled out
    assert manifest["provenance"]["data"] == manifest["fingerprint"]["prompts"]
    recorded = run_provenance(trainer.config, trainer.prompts, trainer.reference_store)
    assert (recorded["data"], recorded["prompts"]) == (manifest["fingerprint"]["prompts"], 16)


def test_store_presampled_on_a_data_limit_is_refused_for_the_full_data(tiny_world, tmp_path):
    store = tmp_path / "store"
    small = _config(tiny_world, tmp_path / "pre", store, **{"data.limit": 6})
    presample(small, reward_fn=parity_reward, progress=False)
    with pytest.raises(StoreMismatchError) as err:
        Trainer(_config(tiny_world, tmp_path / "run", store))
    message = str(err.value)
    assert "presampled on 6 prompts, this run trains on 16" in message
    assert "10 training prompts are not in the store (e.g. p6, p7, p8)" in message
    assert "data.limit" in message and "--allow-store-mismatch" in message
    assert "divrl presample" in message


def test_allow_store_mismatch_trains_with_a_warning(tiny_world, tmp_path, caplog):
    store = tmp_path / "store"
    presample(
        _config(tiny_world, tmp_path / "pre", store, **{"data.limit": 6}),
        reward_fn=parity_reward,
        progress=False,
    )
    config = _config(
        tiny_world, tmp_path / "run", store, **{"reference.allow_store_mismatch": True}
    )
    with caplog.at_level(logging.INFO):
        trainer = Trainer(config)
    assert "does not match this run" in caplog.text and "(allowed)" in caplog.text
    # only the store's exploration prompts are rolled out: p1, p3, p5 of the first six
    assert sorted(p.id for p in trainer.prompts) == ["p1", "p3", "p5"]
    assert "rolling out 3 exploration prompts of 16" in caplog.text


def test_another_model_is_refused(tiny_world, reference_store, tmp_path):
    other = build_tiny_lm(tmp_path / "other", seed=1)
    config = _config(tiny_world, tmp_path / "run", reference_store, **{"model.path": other})
    with pytest.raises(StoreMismatchError, match=r"model: presampled from .*, this run trains"):
        Trainer(config)


def test_a_retrained_model_at_the_same_path_is_refused(tiny_world, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_world["model"], model)
    world = {**tiny_world, "model": str(model)}
    store = tmp_path / "store"
    presample(_config(world, tmp_path / "pre", store), reward_fn=parity_reward, progress=False)
    build_tiny_lm(model, seed=3)  # overwritten in place
    with pytest.raises(StoreMismatchError, match=r"the files of .* changed since presampling"):
        Trainer(_config(world, tmp_path / "run", store))


def test_sampling_settings_and_split_rule_are_compared(tiny_world, reference_store, tmp_path):
    config = _config(
        tiny_world,
        tmp_path,
        reference_store,
        **{
            "reference.top_p": 0.9,
            "reference.threshold": 3,
            "reference.failed_to_exploration": True,
            "reference.keep_presampled": True,
        },
    )
    with pytest.raises(StoreMismatchError) as err:
        Trainer(config)
    message = str(err.value)
    assert "reference.top_p: presampled with 0.95, this run has 0.9" in message
    assert "reference.threshold (the split rule): presampled with 4" in message
    assert "reference.failed_to_exploration (the split rule): presampled with False" in message
    assert "reference.keep_presampled (which responses the store holds): presampled with False" in (
        message
    )


def test_a_store_without_fingerprints_is_trained_on_with_a_warning(
    tiny_world, reference_store, tmp_path, caplog
):
    old = tmp_path / "old_store"
    shutil.copytree(reference_store, old)
    manifest = json.loads((old / MANIFEST).read_text())
    del manifest["fingerprint"]
    (old / MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        Trainer(_config(tiny_world, tmp_path / "run", old))
    assert "without fingerprints" in caplog.text


def test_presample_never_replaces_another_configs_store_without_overwrite(
    tiny_world, reference_store, tmp_path
):
    """Two configs sharing a reference.store: the second presample (other data, or another
    model) is refused before any model loads, and the first store is kept byte for byte."""
    from train_helpers import write_prompts

    from divrl.data.store_files import StoreTargetError

    store = tmp_path / "shared_store"
    shutil.copytree(reference_store, store)
    before = {p.name: p.read_bytes() for p in store.iterdir()}
    other_data = write_prompts(tmp_path / "mine.jsonl", n=6)
    other_model = build_tiny_lm(tmp_path / "other_model")
    for extra in ({"data.train_path": other_data}, {"model.path": other_model}):
        mine = _config(tiny_world, tmp_path / "run", store, **extra)
        with pytest.raises(StoreTargetError, match="presampled from other inputs") as err:
            presample(mine, reward_fn=parity_reward, progress=False)
        assert "--overwrite" in str(err.value)
        assert {p.name: p.read_bytes() for p in store.iterdir()} == before
    # the same data and model again (a presample with other settings) replaces the store
    again = _config(tiny_world, tmp_path / "run", store, **{"reference.k": 2})
    presample(again, reward_fn=parity_reward, progress=False)
    assert json.loads((store / MANIFEST).read_text())["sampling"]["k"] == 2
    mine = _config(tiny_world, tmp_path / "run", store, **{"data.train_path": other_data})
    presample(mine, reward_fn=parity_reward, progress=False, overwrite=True)
    assert json.loads((store / MANIFEST).read_text())["train_data"] == str(other_data)
