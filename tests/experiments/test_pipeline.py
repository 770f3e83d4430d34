"""The shared pipeline's readers of other modules' layouts (run directory, reference store)."""

from __future__ import annotations

from divrl.data.reference_store import ReferenceSample, write_reference_store
from divrl.pipeline import (
    authors_weight_summary,
    final_checkpoint,
    reference_samples,
    reference_store_stats,
    short_batches,
)
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


def test_summary_records_the_authors_weighting_and_short_batches(tmp_path):
    from pathlib import Path

    from divrl.training.config import load_config

    presets = Path(__file__).resolve().parents[2] / "configs"
    js = authors_weight_summary(load_config(presets / "dph_js.yaml"))
    assert js["authors_gpus"] == 8 and js["batch_assembly"] == "divrl"
    assert js["authors_effective_eta"] == 0.2 * 160 / 2048
    two_nodes = load_config(presets / "dph_js.yaml", ["algorithm.authors_gpus=16"])
    assert authors_weight_summary(two_nodes)["authors_effective_eta"] == 0.2 * 224 / 2048
    assert len(js["authors_step_etas"]) == 3 and js["authors_step_etas"][0] == 0.0
    assert authors_weight_summary(load_config(presets / "grpo.yaml")) == {}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"step": 1, "dapo/short_batch": 1.0}\n{"step": 2, "dapo/short_batch": 0.0}\n'
        '{"step": 3}\n{"step": 4, "dapo/short_batch": 1.0}\n'
    )
    assert short_batches(metrics) == 2
