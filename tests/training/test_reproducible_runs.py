"""The same command gives the same digits: two fresh processes training the same preset
with the same seed write the same ``metrics.jsonl``, bit for bit (wall-clock keys aside).

What changes the digits (thread count, CPU, engine, torch version) and what does not is
in docs/reliability.md, "Same command, same digits"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from train_helpers import tiny_overrides

from divrl.training.metrics import TIME_KEYS

ROOT = Path(__file__).resolve().parents[2]


def metric_lines(run: Path) -> list[dict]:
    """Each step's metrics without the wall-clock keys; floats kept as written."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def test_two_fresh_processes_write_the_same_metrics_bit_for_bit(
    tiny_world, reference_store, tmp_path
):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = {}
    for name in ("first", "second"):
        overrides = tiny_overrides(
            tiny_world,
            tmp_path / name,
            **{
                "reference.store": reference_store,
                "reference.k": 4,  # as the fixture store was presampled
                "reference.threshold": 4,
                "reference.response_top_p": None,
                "reference.per_step": 2,
                "train.mini_batch_size": None,
                "train.seed": 7,
            },
        )
        cmd = [sys.executable, "-m", "divrl.cli", "train", "configs/toy/dph_js.yaml", *overrides]
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )  # both at once: two processes, nothing shared but the inputs
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} run failed:\n{out[-3000:]}"
    first, second = metric_lines(tmp_path / "first"), metric_lines(tmp_path / "second")
    assert len(first) == 3 and first[0]["step"] == 1
    # a difference in any digit of any metric (entropy, losses, grad norm, rewards) fails
    for a, b in zip(first, second, strict=True):
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert all(isinstance(r["actor/entropy"], float) for r in first)  # digits to compare
