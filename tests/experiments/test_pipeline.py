"""The shared pipeline's readers of other modules' layouts (run directory, reference store)."""

from __future__ import annotations

from divrl.data.reference_store import ReferenceSample, write_reference_store
from divrl.pipeline import final_checkpoint, reference_samples, reference_store_stats
from divrl.runs import RunDir


def test_final_checkpoint_is_the_last_steps_model_only(tmp_path):
    run = RunDir(tmp_path)
    assert final_checkpoint(tmp_path, 4) is None
    run.checkpoint(4).model_dir.mkdir(parents=True)
    assert final_checkpoint(tmp_path, 4) is None  # no config.json: not a complete model
    (run.checkpoint(4).model_dir / "config.json").write_text("{}")
    (run.checkpoint(2).model_dir).mkdir(parents=True)
    assert final_checkpoint(tmp_path, 4) == run.checkpoint(4).model_dir
    assert final_checkpoint(tmp_path, 5) is None  # an earlier step is not the final one


def test_reference_store_stats_read_what_presample_wrote(tmp_path):
    assert reference_store_stats(tmp_path / "none") is None
    assert reference_samples(tmp_path / "none") is None
    sample = ReferenceSample("p0", [1, 2], [3], [-0.5])
    rows = [{"prompt_id": "p0", "n_correct": 4, "split": "near_perfect", "has_reference": True}]
    stats = {"prompts": 1, "near_perfect": 1, "reference_samples": 1}
    store = write_reference_store(tmp_path / "store", [sample], rows, {"stats": stats})
    assert reference_store_stats(store) == stats
    assert reference_samples(store) == 1
