"""The DPH reference store under faults: presample never deletes what is not a store,
concurrent writers never leave a half store, and a damaged or unusable store is one error
naming the file (docs/reliability.md, "Reference store")."""

from __future__ import annotations

import json
import math
import threading

import pytest

from divrl.cli import main
from divrl.data.reference_store import (
    ReferenceSample,
    ReferenceStore,
    ReferenceStoreError,
    StoreExpectation,
    StoreTargetError,
    write_reference_store,
)
from divrl.data.store_files import MANIFEST, PROMPTS, SAMPLES


def _rows(ids):
    return [
        {"prompt_id": pid, "n_correct": 4, "split": "near_perfect", "has_reference": True}
        for pid in ids
    ]


def _store(path, samples=None, **write):
    samples = samples or [ReferenceSample("p0", [1, 2], [3, 4], [-0.5, -0.25], "x")]
    ids = sorted({s.prompt_id for s in samples})
    return write_reference_store(path, samples, _rows(ids), {"log_prob_temperature": 1.0}, **write)


def _a_run_folder(path):
    (path / "checkpoints" / "step_2").mkdir(parents=True)
    (path / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"weights")
    (path / "notes.txt").write_text("my notes")
    return path


# ------------------------------------------------------------------ what may be replaced


def test_a_folder_that_is_not_a_store_is_refused_and_kept(tmp_path):
    run = _a_run_folder(tmp_path / "run")
    with pytest.raises(StoreTargetError, match=r"notes.txt.*--overwrite"):
        _store(run)
    assert (run / "notes.txt").read_text() == "my notes"
    assert (run / "checkpoints" / "step_2" / "model.safetensors").is_file()
    a_file = tmp_path / "file"
    a_file.write_text("keep")
    with pytest.raises(StoreTargetError, match="is a file"):
        _store(a_file)
    assert a_file.read_text() == "keep"
    link = tmp_path / "link"
    link.symlink_to(run)
    with pytest.raises(StoreTargetError, match=rf"is a symbolic link \(to {run}\)"):
        _store(link)
    assert (run / "notes.txt").read_text() == "my notes"
    # a folder holding only a manifest.json that divrl did not write is not a store either
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / MANIFEST).write_text("[1, 2]")
    with pytest.raises(StoreTargetError, match=r"no readable divrl manifest\.json"):
        _store(foreign)


def test_a_store_and_an_empty_folder_are_replaced_and_overwrite_replaces_anything(tmp_path):
    store = _store(tmp_path / "s")
    sample = ReferenceSample("p1", [1], [5], [-1.0], "y")
    _store(store, [sample])
    assert [s.prompt_id for s in ReferenceStore(store).samples] == ["p1"]
    (tmp_path / "empty").mkdir()
    _store(tmp_path / "empty")
    run = _a_run_folder(tmp_path / "run")
    _store(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == sorted([SAMPLES, PROMPTS, MANIFEST])
    leftovers = [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".") and "lock" not in p.name
    ]
    assert leftovers == []


def test_divrl_presample_refuses_a_run_folder_before_loading_anything(tmp_path, capsys):
    run = _a_run_folder(tmp_path / "run")
    code = main(
        [
            "presample",
            f"model.path={tmp_path / 'no-model'}",
            f"data.train_path={tmp_path / 'no-data.jsonl'}",
            f"reference.store={run}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--overwrite" in err and str(run) in err
    assert "Traceback" not in err
    assert (run / "notes.txt").read_text() == "my notes"


# ------------------------------------------------------------------ concurrent writers


def test_concurrent_writers_of_one_path_leave_a_complete_store(tmp_path):
    """Four writers into one path, several rounds: each round ends with one writer's whole
    store (before: a fixed temp name that each writer removed first; in 3 of 8 tries one
    returned normally and the store had no samples.parquet)."""
    path = tmp_path / "store"
    big = [
        ReferenceSample(f"p{i}", [1] * 50, [2] * 400, [-0.1] * 400, "t" * 200) for i in range(300)
    ]
    errors: list[BaseException] = []

    def writer(tag: int, barrier: threading.Barrier) -> None:
        samples = [ReferenceSample(f"w{tag}", [1], [2], [-1.0], str(tag)), *big]
        barrier.wait()
        try:
            _store(path, samples)
        except BaseException as exc:
            errors.append(exc)

    for _ in range(4):
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=writer, args=(t, barrier)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sorted(p.name for p in path.iterdir()) == sorted([SAMPLES, PROMPTS, MANIFEST])
        store = ReferenceStore(path)
        assert len(store) == 301 and store.samples[0].prompt_id.startswith("w")
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name or ".old" in p.name] == []


# ------------------------------------------------------------------ damaged files


#: ReferenceStore.open's load_samples: the samples read whole (divrl train), or checked a
#: few rows at a time from the open file (the TRL adapter's stream)
LOADS = pytest.mark.parametrize("load", [True, False], ids=["whole", "by_rows"])


@LOADS
@pytest.mark.parametrize("name", [SAMPLES, PROMPTS, MANIFEST])
def test_a_truncated_store_file_is_one_error_naming_it(tmp_path, name, load):
    store = _store(tmp_path / "s")
    data = (store / name).read_bytes()
    (store / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ReferenceStoreError, match=rf"{store / name}: damaged or truncated"):
        ReferenceStore.open(store, load_samples=load)


@LOADS
def test_a_missing_samples_file_is_named(tmp_path, load):
    store = _store(tmp_path / "s")
    (store / SAMPLES).unlink()
    with pytest.raises(ReferenceStoreError, match=rf"{store / SAMPLES}: missing"):
        ReferenceStore.open(store, load_samples=load)


# ------------------------------------------------------------------ unusable samples


def _opened(tmp_path, samples, **open_kw):
    store = _store(tmp_path / "s", samples)
    return ReferenceStore.open(store, **open_kw)


@LOADS
def test_non_finite_log_probs_are_refused(tmp_path, load):
    good = ReferenceSample("p0", [1], [3, 4], [-0.5, -0.5])
    for bad in (math.nan, math.inf):
        sample = ReferenceSample("p1", [1], [3, 4], [-0.5, bad])
        with pytest.raises(
            ReferenceStoreError,
            match=r"samples.parquet: .*1 samples have non-finite ref_log_probs \(rows 1\)",
        ):
            _opened(tmp_path, [good, sample], load_samples=load)


@LOADS
def test_log_probs_shorter_than_the_response_are_refused(tmp_path, load):
    sample = ReferenceSample("p0", [1], [3, 4, 5], [-0.5, -0.5])
    with pytest.raises(ReferenceStoreError, match="one ref_log_prob per response token"):
        _opened(tmp_path, [sample], load_samples=load)


@LOADS
def test_token_ids_outside_the_vocabulary_are_refused(tmp_path, load):
    sample = ReferenceSample("p0", [1], [3, 999], [-0.5, -0.5])
    assert len(_opened(tmp_path, [sample], load_samples=load, vocab_size=1000)) == 1
    with pytest.raises(
        ReferenceStoreError, match=r"outside the model's vocabulary of 20 \(e.g. 999"
    ):
        _opened(tmp_path, [sample], load_samples=load, vocab_size=20)


@LOADS
def test_prompt_ids_not_in_the_data_are_refused_unless_mismatches_are_allowed(
    tmp_path, load, caplog
):
    samples = [ReferenceSample("p0", [1], [3], [-0.5]), ReferenceSample("gone", [1], [3], [-0.5])]
    expect = StoreExpectation(prompts=[("p0", [1])])
    with pytest.raises(
        ReferenceStoreError,
        match=r"1 prompt ids of the samples are not in the training data \(gone\)",
    ):
        _opened(tmp_path, samples, load_samples=load, expect=expect)
    assert (
        len(_opened(tmp_path, samples, load_samples=load, expect=expect, allow_mismatch=True)) == 2
    )
    assert "not in the training data (gone)" in caplog.text


def test_an_empty_store_says_what_to_change(tmp_path):
    manifest = {"log_prob_temperature": 1.0, "threshold": 8, "sampling": {"k": 8}}
    manifest["stats"] = {"near_perfect": 0, "prompts": 16, "presample_accuracy": 0.0}
    store = write_reference_store(tmp_path / "e", [], [], manifest)
    with pytest.raises(ReferenceStoreError) as err:
        ReferenceStore.open(store)
    message = str(err.value)
    assert "holds no samples" in message and "now 8 of 8" in message
    assert "reference.keep_presampled=true" in message and "--overwrite" in message
    assert json.loads((store / MANIFEST).read_text())["format"] == "divrl reference store"


def test_the_demo_reading_a_damaged_manifest_names_it(tmp_path):
    from divrl.pipeline import reference_samples

    store = _store(tmp_path / "s")
    assert reference_samples(store) == 0  # this manifest has no stats
    (store / MANIFEST).write_text('{"stats": {"reference_')
    with pytest.raises(ReferenceStoreError, match=rf"{store / MANIFEST}: damaged or truncated"):
        reference_samples(store)
