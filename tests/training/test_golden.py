"""The refactor guard: fixed-seed CPU runs of the toy presets (GRPO, DPH-JS, Lp-Reg and the
off-policy / DAPO / reverse-KL paths) give exactly the metrics and bitwise the final
parameters recorded before the training step was split into stages.

The fixtures (fixtures/golden_runs*.json) were written by ``python
tests/training/test_golden.py --record NAME`` with one torch thread, one per CPU the project
has run on: a CPU's vector kernels round the last bits differently (two machines of this
project gave the same tokens and grad norms differing in the 7th digit). A run must match one
recording exactly, metrics and parameter bytes; on a CPU none was recorded on, it must match
the first recording up to rounding (floats to rel 1e-4 / abs 1e-6, the parameters unchecked):
record that CPU too (on the commit before a refactor) to get the bitwise guard back.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.training.config import load_config
from divrl.training.trainer import TIME_KEYS, Trainer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_DIR = Path(__file__).parent / "fixtures"
# golden_runs.json first: on an unrecorded CPU the run is compared with it up to rounding
FIXTURES = sorted(FIXTURE_DIR.glob("golden_runs*.json"), key=lambda p: (p.stem != "golden_runs", p))

# The presets' values when the runs were recorded: the presets have since moved to the
# authors' scripts (issue 14: top_p 0.9, dual clip 3, weight decay 0.01, 2 optimiser steps
# per batch, DPH weighting `authors`); the recorded runs are pinned to the old values here
# instead of re-recorded, so they keep guarding the step's numerics bitwise.
RECORDED_DPH_SIDE = {
    "algorithm.loss_agg": "token-mean",  # the presets now use micro-batch-token-mean
    "rollout.top_p": 1.0,
    "algorithm.dual_clip": None,
    "optim.weight_decay": 0.0,
}
# the Lp-Reg selection population the recording ran with: divrl's own micro-batches
RECORDED_SCOPE = {
    "algorithm.lp_reg_scope": "micro_batch",
    "algorithm.lp_reg_group_size": None,
    "algorithm.lp_reg_micro_batch_tokens": None,
    "algorithm.lp_reg_balance_batch": False,
}
# preset file -> overrides on top of the tiny world (5 steps, tiny batches)
CASES: dict[str, tuple[str, dict]] = {
    "grpo": ("configs/toy/grpo.yaml", {**RECORDED_DPH_SIDE, "train.mini_batch_size": None}),
    "dph_js": (
        "configs/toy/dph_js.yaml",
        {
            **RECORDED_DPH_SIDE,
            "train.mini_batch_size": None,
            "algorithm.divergence_weighting": "paper",
            "reference.per_step": 2,
            "reference.k": 4,  # as the fixture store was presampled
            "reference.threshold": 4,
            "reference.response_top_p": None,
        },
    ),
    "lp_reg": ("configs/toy/lp_reg.yaml", {"algorithm.loss_agg": "token-mean", **RECORDED_SCOPE}),
    "lp_reg_offpolicy": (
        "configs/toy/lp_reg.yaml",
        {"algorithm.loss_agg": "token-mean", "train.mini_batch_size": 2, **RECORDED_SCOPE},
    ),
    "dapo": (
        "configs/toy/dapo.yaml",
        {
            **RECORDED_DPH_SIDE,
            "train.mini_batch_size": None,
            "algorithm.kl_coef": 0.0,
            "algorithm.overlong_buffer": 3,
        },
    ),
    "grpo_rkl": ("configs/toy/grpo_rkl.yaml", {**RECORDED_DPH_SIDE, "train.mini_batch_size": 2}),
}
# The Lp-Reg token counts (COUNT_UPDATE_KEYS) were re-recorded once when they became the
# step's sums instead of token-weighted means over micro-batches (every other value and the
# parameter digest unchanged).
# metrics added since the recording (checked to exist, not compared)
NEW_METRICS = {
    "dph/effective_eta",
    "dapo/short_batch",
    "reward/unscorable",
    "adv/mean",
    "adv/zero_frac",
    "lp_reg/net_up_share",
    "lp_reg/num_net_up",
}
NEW_METRICS |= {
    f"lp_reg/{name}_{stat}"
    for name in ("reg_z", "reg_abs_adv", "net_push")
    for stat in ("mean", "q10", "q50", "q90")
}


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name, dtype, shape and raw bytes (sorted by name)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def run_case(name: str, world: dict, out: Path, store: Path) -> dict:
    preset, extra = CASES[name]
    # recorded with the hf engine's samples (before the static engine became the CPU default)
    overrides = {"train.total_steps": 5, "train.seed": 3, "rollout.engine": "hf", **extra}
    if "reference.per_step" in extra:
        overrides["reference.store"] = store
    config = load_config(ROOT / preset, tiny_overrides(world, out, **overrides))
    torch.set_num_threads(1)
    trainer = Trainer(config, reward_fn=sevens_reward)
    trainer.train()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "metrics": [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows],
        "parameters_sha256": parameter_digest(trainer.accelerator.unwrap_model(trainer.model)),
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_matches_the_recorded_run(name, tiny_world, reference_store, tmp_path):
    recordings = [json.loads(path.read_text())[name] for path in FIXTURES]
    got = run_case(name, tiny_world, tmp_path / name, reference_store)
    assert len(got["metrics"]) == 5
    first = recordings[0]
    for row in got["metrics"]:
        added = set(row) - set(first["metrics"][0])
        assert added <= NEW_METRICS, added
        for key in added:
            del row[key]
    if any(_exactly(got, recorded) for recorded in recordings):
        return
    # a CPU none was recorded on: the same run up to the last bits of rounding
    assert [sorted(row) for row in got["metrics"]] == [sorted(r) for r in first["metrics"]]
    for row, recorded_row in zip(got["metrics"], first["metrics"], strict=True):
        assert row == pytest.approx(recorded_row, rel=1e-4, abs=1e-6), row["step"]


def _exactly(got: dict, recorded: dict) -> bool:
    metrics = [
        {k: v for k, v in row.items() if k not in NEW_METRICS} for row in recorded["metrics"]
    ]
    return got["metrics"] == metrics and got["parameters_sha256"] == recorded["parameters_sha256"]


def _record(label: str) -> None:  # pragma: no cover - run by hand before a refactor
    import tempfile

    from train_helpers import build_tiny_lm, parity_reward, write_prompts

    from divrl.training.presample import presample

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    world = {
        "model": str(build_tiny_lm(root / "world" / "model")),
        "data": str(write_prompts(root / "world" / "train.jsonl")),
    }
    # the same store as conftest's ``reference_store`` fixture
    ref_root = root / "reference"
    presample(
        load_config(
            None,
            tiny_overrides(
                world, ref_root, **{"reference.store": ref_root / "store", "reference.k": 4}
            ),
        ),
        reward_fn=parity_reward,
        progress=False,
    )
    result = {name: run_case(name, world, root / name, ref_root / "store") for name in CASES}
    path = FIXTURE_DIR / f"golden_runs_{label}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"recorded {path}")


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).parent))
    if len(sys.argv) == 3 and sys.argv[1] == "--record":
        _record(sys.argv[2])
    else:
        sys.exit("usage: python tests/training/test_golden.py --record NAME (a name for this CPU)")
