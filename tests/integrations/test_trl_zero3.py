"""Lp-Reg and DPH-RL through TRL under DeepSpeed ZeRO, 2 processes on CPU (gloo): under
ZeRO-3 the head the Lp-Reg hook projects through is gathered from its partitions; under
ZeRO-1, 2 and 3 training with both logs what DDP logs. DeepSpeed is not among the test dependencies, so these run where it is
importable: `make test-deepspeed` installs it apart from the venv and runs this file."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is not installed (not a test dependency): `make test-deepspeed`",
    ),
]

WORKER = Path(__file__).with_name("zero3_worker.py")


def launch(mode: str, out: Path, run_in_session, store: Path | None = None) -> list[dict]:
    """``zero3_worker.py mode out`` on 2 processes (``store``: the DPH reference store of
    the training modes); each rank's result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    if store is not None:
        env["DIVRL_TEST_STORE"] = str(store)
    env["CUDA_VISIBLE_DEVICES"] = ""  # DeepSpeed's CPU accelerator and accelerate agree
    env["PYTHONPATH"] = os.pathsep.join([str(WORKER.parent), env.get("PYTHONPATH", "")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(port), str(WORKER), mode, str(out)]
    proc = run_in_session(cmd, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
def test_lp_reg_proxy_under_zero3_equals_the_unsharded_one(tmp_path, run_in_session, tied):
    """The proxy on a ZeRO-3 model (every parameter partitioned) equals the one on an
    unsharded copy of the same weights, on the first forward and on later ones that follow
    ZeRO-3's recorded trace: in the hook, where ZeRO-3 holds the head whole, and from the
    same hidden states after the forward, where the head is a placeholder and is gathered."""
    for result in launch("proxy-tied" if tied else "proxy", tmp_path / "proxy", run_in_session):
        assert result["partitioned"] and result["placeholder_after"] and result["tied"] == tied
        assert len(result["rounds"]) == 3
        for round_ in result["rounds"]:
            assert round_["statuses"] == [
                "ZeroParamStatus.AVAILABLE",
                "ZeroParamStatus.NOT_AVAILABLE",
            ]
            before = torch.tensor(round_["before"])
            for case in ("after", "outside"):
                torch.testing.assert_close(torch.tensor(round_[case]), before, rtol=0, atol=1e-6)
            assert torch.isfinite(before).any()


_DDP_RUN: list[list[dict]] = []


@pytest.fixture
def ddp_run(tmp_path_factory, run_in_session, store) -> list[dict]:
    """The DDP run every ZeRO stage is compared with, launched once per session."""
    if not _DDP_RUN:
        _DDP_RUN.append(launch("ddp", tmp_path_factory.mktemp("ddp"), run_in_session, store))
    return _DDP_RUN[0]


@pytest.mark.parametrize("stage", [1, 2, 3], ids=["zero1", "zero2", "zero3"])
def test_training_under_zero_logs_what_ddp_logs(tmp_path, run_in_session, store, ddp_run, stage):
    """Two train() steps with Lp-Reg and DPH-JS under ZeRO ``stage`` log what the same run
    under DDP logs (the same seeds and weights, so the same rollouts and reference draws):
    losses, Lp-Reg selections, the divergence (0 at step 1: the store holds the initial
    model's log-probs); the proxy's plain log-probs through the head equal TRL's own,
    forward by forward. ZeRO-1/2 partition the optimizer state (each rank holds half of
    it), ZeRO-3 every parameter too."""
    zero = launch(f"zero{stage}", tmp_path / f"zero{stage}", run_in_session, store)
    assert all(r["distributed_type"] == "DEEPSPEED" for r in zero)
    assert all(r["distributed_type"] == "MULTI_CPU" for r in ddp_run)
    assert all(r["world"] == 2 and r["zero_stage"] == stage for r in zero)
    if stage == 3:
        assert all(r["partitioned"] for r in zero)
    else:
        assert all(r["optimizer"] == "DeepSpeedZeroOptimizer" for r in zero)
        assert all(not r["partitioned"] for r in zero)
        assert all(r["optimizer_share"] == pytest.approx(0.5, abs=1e-3) for r in zero)
    for result in zero:
        assert result["gaps"] and max(result["gaps"]) < 1e-5
    steps = [(z, d) for z, d in zip(zero[0]["steps"], ddp_run[0]["steps"], strict=True)]
    assert len(steps) == 2
    for z, d in steps:
        assert z["divrl/lp_reg/num_selected"] == d["divrl/lp_reg/num_selected"]
        assert z["loss"] == pytest.approx(d["loss"], abs=1e-5)
        assert z["divrl/dph/divergence"] == pytest.approx(d["divrl/dph/divergence"], abs=1e-5)
    assert sum(z["divrl/lp_reg/num_selected"] for z, _ in steps) > 0
    assert steps[0][0]["divrl/dph/u_mean"] == pytest.approx(1.0, abs=1e-5)
    assert steps[-1][0]["divrl/dph/divergence"] > 1e-3
    assert zero[0]["param_sum"] == pytest.approx(ddp_run[0]["param_sum"], rel=1e-5)
