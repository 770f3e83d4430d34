"""`divrl export RUN_DIR` past a damaged newest sharded checkpoint: it says so and exports
the previous one (as `--resume` falls back); a damaged checkpoint named on its own is one
error (docs/reliability.md, "Files")."""

from __future__ import annotations

import pytest
from train_helpers import sevens_reward, tiny_overrides

from divrl.cli import main
from divrl.runs import RunDir
from divrl.training.config import load_config
from divrl.training.trainer import Trainer


@pytest.fixture
def sharded_run(tiny_world, tmp_path):
    run = tmp_path / "run"
    extra = {
        "train.total_steps": 2,
        "checkpoint.save_every": 1,
        "checkpoint.keep_last": 2,
        "train.strategy": "fsdp",
    }
    config = load_config(None, tiny_overrides(tiny_world, run, **extra))
    Trainer(config, reward_fn=sevens_reward).train()
    shard = sorted((RunDir(run).checkpoint(2).path / "state").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    return run


def test_export_of_a_run_skips_a_damaged_newest_checkpoint(sharded_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert main(["export", str(sharded_run), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "step_000002 does not load" in captured.err
    assert "exporting the previous checkpoint step_000001" in captured.err
    assert "exported" in captured.out and "step_000001" in captured.out
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_export_of_the_damaged_checkpoint_itself_is_one_error(sharded_run, tmp_path, capsys):
    step = RunDir(sharded_run).checkpoint(2).path
    assert main(["export", str(step), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"divrl export: {step}: the sharded checkpoint does not load" in err
    assert "Traceback" not in err
