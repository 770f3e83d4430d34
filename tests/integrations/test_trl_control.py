"""The rehearsal controller in the TRL adapter: the same options and rule as `divrl train`,
steps closed at optimiser-step boundaries, state in TRL's checkpoints, exact resume."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from trl_helpers import make_args, prompt_dataset, tiny_model, varied_reward

pytest.importorskip("trl")

from divrl.algorithms import RehearsalController, RehearsalControlOptions
from divrl.integrations.trl import DivRLGRPOTrainer
from divrl.integrations.trl_control import STATE_KEY, TrlRehearsalControl

torch.set_num_threads(1)
OPTIONS = RehearsalControlOptions(target=0.05, warmup_steps=1)


def _feed(control, state, script):
    """script: one list of micro-batch measurements (likelihood loss) per optimiser step."""
    etas = []
    for measurements in script:
        for m in measurements:
            control.begin(state)
            etas.append(control.eta)
            control.record({"dph/log_u_mean": -m}, state)
        state.global_step += 1
    return etas


def test_a_step_is_closed_with_the_mean_of_its_micro_batches_and_resumes_exactly():
    script = [[0.01, 0.03], [0.2, 0.1], [0.0, 0.02], [0.5, 0.3], [-0.1, 0.0]]
    state = SimpleNamespace(global_step=0, stateful_callbacks={})
    etas = _feed(TrlRehearsalControl(OPTIONS, 0.2), state, script)
    plain = RehearsalController(OPTIONS, 0.2)  # divrl train's rule on the per-step means
    expected = []
    for measurements in script:
        expected += [plain.eta] * len(measurements)
        plain.update(sum(measurements) / len(measurements))
    assert etas == expected
    assert etas[2] == etas[0] and etas[4] > etas[2]  # warm-up, then missed: rises
    # resume after step 3: the state saved in trainer_state.json carries step 3's measurements
    part = SimpleNamespace(global_step=0, stateful_callbacks={})
    first = _feed(TrlRehearsalControl(OPTIONS, 0.2), part, script[:3])
    saved = json.loads(json.dumps(part.stateful_callbacks))
    assert saved[STATE_KEY]["pending"] == [0.0, 0.02]
    resumed_state = SimpleNamespace(global_step=3, stateful_callbacks=saved)
    rest = _feed(TrlRehearsalControl(OPTIONS, 0.2), resumed_state, script[3:])
    assert first + rest == etas


def test_config_resolves_and_refuses(tmp_path, store):
    args = make_args(
        tmp_path,
        divergence="js",
        divergence_coef=0.2,
        reference_store=str(store),
        rehearsal_control={"target": 0.03},
    )
    assert args.control_options.target == 0.03 and args.rehearsal_control["rate"] == 0.1
    assert make_args(tmp_path).control_options is None
    with pytest.raises(ValueError, match="set divergence and divergence_coef > 0"):
        make_args(tmp_path, rehearsal_control={"target": 0.03})
    with pytest.raises(ValueError, match=r"rehearsal_control\.target=-1\.0 must be > 0"):
        make_args(
            tmp_path,
            divergence="js",
            divergence_coef=0.2,
            reference_store=str(store),
            rehearsal_control={"target": -1.0},
        )


def _trainer(args, tokenizer):
    return DivRLGRPOTrainer(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
    )


def test_train_moves_eta_logs_it_and_a_resumed_run_continues_with_it(
    tmp_path, tokenizer, foreign_store
):
    common = dict(
        divergence="js",
        divergence_coef=0.2,
        reference_store=str(foreign_store),  # u != 1 from the start: eta moves at once
        reference_batch_size=2,
        gradient_accumulation_steps=2,
        rehearsal_control={"target": 1e-6, "warmup_steps": 0, "rate": 0.5},
        save_strategy="steps",
        save_steps=2,
    )
    full = _trainer(make_args(tmp_path / "a", max_steps=3, **common), tokenizer)
    full.train()
    logged = [h for h in full.state.log_history if "divrl/dph/eta" in h]
    etas = [h["divrl/dph/eta"] for h in logged]
    assert len(etas) == 3 and etas[0] == pytest.approx(0.2)
    for step in range(2):  # each step's eta from the last: exp(+-rate) by the sign of the miss
        missed = -logged[step]["divrl/dph/log_u_mean"] > 1e-6
        factor = math.exp(0.5 if missed else -0.5)
        assert etas[step + 1] == pytest.approx(etas[step] * factor, rel=1e-6)
    assert all(h["divrl/dph/control_target"] == pytest.approx(1e-6) for h in logged)
    saved = json.loads((tmp_path / "a" / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert len(saved["stateful_callbacks"][STATE_KEY]["pending"]) == 2  # step 2's micro-batches

    resumed = _trainer(make_args(tmp_path / "a", max_steps=3, **common), tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "out" / "checkpoint-2"))
    again = [h["divrl/dph/eta"] for h in resumed.state.log_history if "divrl/dph/eta" in h]
    assert again[-1] == etas[2]  # step 3's eta, from the state saved after step 2
