"""End to end on a CPU: verl's own trainer (``python -m verl.trainer.main_ppo``: Ray, FSDP2
engine workers, TransferQueue, the v1 synchronous trainer) runs through divrl's trainer
mode ``divrl_sync`` on a tiny model built here: 2 steps of DPH-JS and of Lp-Reg, and the
identity check against verl's own ``sync`` trainer.

The CPU pieces verl lacks are test-only (:mod:`tests_verl.cpu_verl`); each run is a
subprocess under a hard ``timeout`` (about a minute each on a 2-core machine).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from divrl.integrations.verl.data import write_exploration_split
from tests_verl import e2e

#: each run's hard limit (seconds); a machine much slower than CI's sets it higher
TIMEOUT_S = int(os.environ.get("DIVRL_VERL_E2E_TIMEOUT", "480"))
#: a reward that varies between a prompt's samples (``tests_verl/e2e_reward.py``)
VARIED_REWARD = Path(__file__).with_name("e2e_reward.py")

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("main_ppo")
    model = e2e.build_model(root / "model")
    data = e2e.write_data(root / "train.parquet")
    return root, model, data


def _run(root, model, data, *extra, mode="divrl_sync", out=None, reward=None) -> str:
    cmd = e2e.command(
        model,
        data,
        out or root / "checkpoints",
        f"trainer.v1.trainer_mode={mode}",
        *extra,
        reward=reward,
    )
    proc = subprocess.run(
        ["timeout", "-k", "10", str(TIMEOUT_S), *cmd],
        env=e2e.env(),
        cwd=root,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def _steps(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.search(r"\bstep:\d+ - ", line)]


def test_lp_reg_trains_two_steps_in_verls_trainer(world):
    root, model, data = world
    out = _run(
        root,
        model,
        data,
        "+divrl.policy_loss=lp_reg",
        "actor_rollout_ref.actor.clip_ratio_low=1.0",
        "actor_rollout_ref.actor.clip_ratio_high=9.0",
    )
    steps = _steps(out)
    assert [re.search(r"step:(\d+)", s).group(1) for s in steps] == ["1", "2"]
    assert all("actor/lp_reg/mean_z:" in s for s in steps)


def test_dph_js_trains_two_steps_with_rehearsal_rows(world):
    root, model, data = world
    store = e2e.write_store(root / "store", model, data)
    exploration = root / "exploration.parquet"
    assert write_exploration_split(data, store, exploration) == 2
    out = _run(
        root,
        model,
        exploration,
        "+divrl.divergence=js",
        "+divrl.divergence_coef=0.2",
        "+divrl.divergence_weighting=paper",
        f"+divrl.reference_store={store}",
        "+divrl.reference_per_step=2",
    )
    steps = _steps(out)
    assert [re.search(r"step:(\d+)", s).group(1) for s in steps] == ["1", "2"]
    for step in steps:
        divergence = float(re.search(r"actor/dph/divergence:([-0-9.e]+)", step).group(1))
        assert divergence == divergence  # the rehearsal rows reached the loss (not NaN)
    # the store's log-probs are the initial model's: pi/pi_ref is 1 on them at step 1
    u_mean = float(re.search(r"actor/dph/u_mean:([-0-9.e]+)", steps[0]).group(1))
    assert abs(u_mean - 1.0) < 0.05


#: the per-step metrics the identity run compares (loss, gradient norm, entropy, reward)
IDENTITY_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean")


def test_divrl_sync_with_dph_and_lp_reg_off_is_verls_sync_run(world):
    """divrl's trainer mode with eta = 0 and Lp-Reg off against verl's own sync trainer:
    same seed, 2 steps, fp32; the same per-step metrics to 1e-6 (relative) and the same
    checkpoint files (gen_batch_size and the replay buffer: test_sync_mode.py)."""
    root, model, data = world
    fp32 = [
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "trainer.save_freq=2",
    ]
    runs = {}
    for mode, extra in (
        ("sync", []),
        ("divrl_sync", ["+divrl.divergence=js", "+divrl.divergence_coef=0"]),
    ):
        out_dir = root / f"identity_{mode}"
        out = _run(root, model, data, *fp32, *extra, mode=mode, out=out_dir, reward=VARIED_REWARD)
        runs[mode] = (e2e.step_metrics(out), e2e.checkpoint_files(out_dir / "global_step_2"))
    (verl_steps, verl_files), (ours, our_files) = runs["sync"], runs["divrl_sync"]
    assert [s["step"] for s in verl_steps] == [s["step"] for s in ours] == [1.0, 2.0]
    for theirs, mine in zip(verl_steps, ours, strict=True):
        for name in IDENTITY_METRICS:
            assert mine[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-12), name
    assert our_files == verl_files and "data.pt" in verl_files
    # the comparison has something to compare: the advantages were not all zero
    assert any(s["actor/grad_norm"] > 0 for s in verl_steps)
    assert any(s["actor/pg_loss"] != 0 for s in verl_steps)

