"""Lp-Reg through TRL under DeepSpeed ZeRO-3, 2 processes on CPU (gloo): the head the hook
projects through is gathered from its partitions. DeepSpeed is not among the test
dependencies, so these run where it is importable: `make test-deepspeed` installs it apart
from the venv and runs this file."""

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


def launch(mode: str, out: Path, run_in_session) -> list[dict]:
    """``zero3_worker.py mode out`` on 2 processes; each rank's result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
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


def test_lp_reg_trains_under_zero3_as_under_ddp(tmp_path, run_in_session):
    """Two train() steps with Lp-Reg under ZeRO-3 log what the same run under DDP logs (the
    same seeds and weights, so the same rollouts): losses and Lp-Reg selections; the proxy's
    plain log-probs through the head equal TRL's own, forward by forward."""
    zero3 = launch("zero3", tmp_path / "zero3", run_in_session)
    ddp = launch("ddp", tmp_path / "ddp", run_in_session)
    assert all(r["distributed_type"] == "DEEPSPEED" for r in zero3)
    assert all(r["distributed_type"] == "MULTI_CPU" for r in ddp)
    assert all(r["world"] == 2 and r["partitioned"] for r in zero3)
    for result in zero3:
        assert result["gaps"] and max(result["gaps"]) < 1e-5
    steps = [(z, d) for z, d in zip(zero3[0]["steps"], ddp[0]["steps"], strict=True)]
    assert len(steps) == 2
    for z, d in steps:
        assert z["divrl/lp_reg/num_selected"] == d["divrl/lp_reg/num_selected"]
        assert z["loss"] == pytest.approx(d["loss"], abs=1e-5)
    assert sum(z["divrl/lp_reg/num_selected"] for z, _ in steps) > 0
    assert zero3[0]["param_sum"] == pytest.approx(ddp[0]["param_sum"], rel=1e-5)
