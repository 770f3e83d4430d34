"""Two CPU processes (torchrun, gloo) train like one: identical weights on both ranks, and
the single-process run's metrics and weights within float tolerance."""

import json
from pathlib import Path

import pytest
import torch
from train_helpers import run_torchrun, sevens_reward, tiny_overrides

from divrl.training.config import load_config
from divrl.training.trainer import TIME_KEYS, Trainer

WORKER = Path(__file__).parent / "dist_worker.py"


@pytest.mark.slow
def test_two_processes_match_one(tiny_world, tmp_path):
    extra = {
        "train.total_steps": 3,
        "train.micro_batch_size": 4,
        "train.mini_batch_size": 2,
        "rollout.seeded": True,  # samples independent of the number of processes
    }
    dist_dir = tmp_path / "dist"
    dist_dir.mkdir()
    overrides = tiny_overrides(tiny_world, dist_dir / "run", **extra)
    proc = run_torchrun(WORKER, str(dist_dir), *overrides, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((dist_dir / "world.json").read_text()) == {"world": 2}
    # nothing outlives the trainer that would keep its DDP wrapper (and the exit hang of
    # release_process_group's docstring) alive
    for rank in range(2):
        ends = json.loads((dist_dir / f"end{rank}.json").read_text())
        assert ends == {"ddp_wrappers_in_training": 1, "ddp_wrappers_left": 0}
    rank0 = torch.load(dist_dir / "rank0.pt")
    rank1 = torch.load(dist_dir / "rank1.pt")
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)

    single = Trainer(
        load_config(None, tiny_overrides(tiny_world, tmp_path / "single", **extra)),
        reward_fn=sevens_reward,
    )
    expected = single.train()
    got = json.loads((dist_dir / "history.json").read_text())
    assert len(got) == len(expected) == 3
    for a, b in zip(got, expected, strict=True):
        # the same samples (seeded per prompt) and the same rewards
        assert a["reward/score"] == b["reward/score"]
        assert a["response/length"] == b["response/length"]
        for key in ("loss/total", "actor/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert set(a) - set(TIME_KEYS) == set(b) - set(TIME_KEYS)
    ref = single.accelerator.unwrap_model(single.model).state_dict()
    for k, v in ref.items():
        torch.testing.assert_close(rank0[k], v, rtol=1e-4, atol=1e-5)
