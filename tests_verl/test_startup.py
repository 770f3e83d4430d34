"""Every divrl setting acts, or verl's ``main_ppo`` stops before any worker starts.

Each row runs ``verl.trainer.main_ppo.main`` (Hydra's task function, given the composed
config as Hydra would) with one bad setting and checks the exit status 2, the one line on
stderr, and that neither ``run_ppo`` (which starts Ray, the TaskRunner and the workers) nor
``ray.init`` was reached. One more row runs ``python -m verl.trainer.main_ppo`` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_module

from divrl.integrations.verl.settings import DivRLVerlSettings, VerlSettingsError
from divrl.integrations.verl.startup import install_startup_gate, startup_errors

ROOT = Path(__file__).resolve().parents[1]
LP_REG = ("trainer.v1.trainer_mode=divrl_sync", "+divrl.policy_loss=lp_reg")
DPH = (
    "trainer.v1.trainer_mode=divrl_sync",
    "+divrl.divergence=js",
    "+divrl.divergence_coef=0.2",
    "+divrl.reference_store=/nonexistent/store",
    "+divrl.reference_per_step=2",
)
PRESAMPLE = (
    "trainer.v1.trainer_mode=divrl_presample",
    "trainer.total_epochs=1",
    "actor_rollout_ref.rollout.n=3",
    "+divrl.reference_store=/nonexistent/new_store",
)
A = "actor_rollout_ref.actor"
MEGATRON = "ppo_megatron_trainer"

#: (config name, overrides, the line expected on stderr, after "divrl: ")
ROWS = [
    (
        None,
        ("+divrl.policy_loss=lp_reg",),
        "divrl.policy_loss set, but trainer.v1.trainer_mode=sync does not read the divrl "
        "section (it would train plain GRPO without them); add trainer.v1.trainer_mode=divrl_sync",
    ),
    (
        None,
        ("trainer.v1.trainer_mode=colocate_async", "+divrl.divergence=js"),
        "divrl.divergence set, but trainer.v1.trainer_mode=colocate_async does not read",
    ),
    (
        None,
        ("trainer.use_v1=False", "+divrl.policy_loss=lp_reg"),
        "trainer.use_v1=False (verl's legacy trainer) does not read the divrl section (it "
        "would train plain GRPO without them); add trainer.v1.trainer_mode=divrl_sync and "
        "trainer.use_v1=True",
    ),
    (
        None,
        (*LP_REG, "trainer.use_v1=False"),
        "trainer.use_v1=False: verl's legacy trainer ignores trainer.v1.trainer_mode=divrl_sync",
    ),
    (
        None,
        (*PRESAMPLE, "+divrl.divergence=js"),
        "divrl.divergence set, but trainer.v1.trainer_mode=divrl_presample reads only "
        "divrl.reference_store",
    ),
    (None, (*PRESAMPLE, "actor_rollout_ref.rollout.n=1"), "actor_rollout_ref.rollout.n=1: "),
    (
        None,
        (*PRESAMPLE, "actor_rollout_ref.rollout.multi_turn.enable=True"),
        "actor_rollout_ref.rollout.multi_turn.enable / agent.default_agent_loop",
    ),
    (
        None,
        (*PRESAMPLE, "trainer.total_training_steps=2"),
        "trainer.total_epochs=1, trainer.total_training_steps=2: the presample runs one epoch",
    ),
    (
        None,
        (
            "trainer.v1.trainer_mode=divrl_presample",
            "trainer.total_epochs=1",
            "actor_rollout_ref.rollout.n=3",
        ),
        "trainer.v1.trainer_mode=divrl_presample writes the store at divrl.reference_store",
    ),
    (None, ("+divrl.divergnce=js", "trainer.v1.trainer_mode=divrl_sync"), "unknown key(s)"),
    (None, (*LP_REG, f"{A}.loss_agg_mode=token-sum"), f"{A}.loss_agg_mode=token-sum: divrl's"),
    (
        None,
        (f"{A}.policy_loss.loss_mode=divrl_vanilla", f"{A}.loss_agg_mode=token-sum"),
        f"{A}.loss_agg_mode=token-sum: loss_mode=divrl_vanilla aggregates with",
    ),
    (
        None,
        (
            f"{A}.policy_loss.loss_mode=divrl_vanilla",
            "algorithm.rollout_correction.rollout_is=token",
        ),
        "algorithm.rollout_correction.rollout_is=token: loss_mode=divrl_vanilla",
    ),
    (
        None,
        (*LP_REG, f"{A}.ulysses_sequence_parallel_size=2"),
        f"{A}.ulysses_sequence_parallel_size=2: the min-p proxy of divrl.policy_loss=lp_reg",
    ),
    (
        None,
        (*LP_REG, f"{A}.fsdp_config.ulysses_sequence_parallel_size=2"),
        f"{A}.fsdp_config.ulysses_sequence_parallel_size=2: the min-p proxy of divrl.policy_loss=lp_reg",
    ),
    (None, (*LP_REG, f"{A}.pad_to_length=True"), f"{A}.pad_to_length=True: verl's engine"),
    (None, (*LP_REG, "actor_rollout_ref.model.use_fused_kernels=True"), "use_fused_kernels=True"),
    (None, (*LP_REG, f"{A}.policy_loss.loss_mode=gspo"), f"{A}.policy_loss.loss_mode=gspo"),
    (None, (*LP_REG, "distillation.enabled=True"), "distillation.enabled=True"),
    (
        MEGATRON,
        (*LP_REG, f"{A}.megatron.tensor_model_parallel_size=4"),
        "the min-p proxy of divrl.policy_loss=lp_reg under Megatron needs "
        f"{A}.megatron.tensor_model_parallel_size=1 and "
        "context_parallel_size=1",
    ),
    (
        MEGATRON,
        (*LP_REG, f"{A}.megatron.context_parallel_size=2"),
        "got TP=1, CP=2",
    ),
    (
        MEGATRON,
        (*LP_REG, f"+{A}.megatron.override_transformer_config.fp8=e4m3"),
        f"{A}.megatron.override_transformer_config.fp8=e4m3: verl pads",
    ),
    (
        None,
        (*LP_REG, "+trainer.v1.sync.parameter_sync_step=2"),
        "trainer.v1.sync.parameter_sync_step=2: verl would run 2 actor updates per "
        "rollout-weight sync, each after the first recomputing pi_old and the min-p proxy of "
        "divrl.policy_loss=lp_reg from updated weights",
    ),
    (
        None,
        ("trainer.v1.trainer_mode=divrl_sync", "+divrl.policy_loss=high_entropy"),
        "divrl.policy_loss=high_entropy: the loss (with these options) needs the input "
        "'entropy' (declared in HighEntropyOptions.INPUTS), which the verl plugin does not "
        "provide",
    ),
    (None, (*DPH, f"{A}.loss_agg_mode=seq-mean-token-sum"), f"{A}.loss_agg_mode=seq-mean"),
    (None, (*DPH, f"{A}.shuffle=True"), f"{A}.shuffle=True"),
    (None, (*DPH, f"{A}.policy_loss.loss_mode=sapo"), f"{A}.policy_loss.loss_mode=sapo"),
    (
        MEGATRON,
        (*DPH, f"{A}.megatron.router_replay.mode=R3"),
        f"{A}.megatron.router_replay.mode=R3",
    ),
    (
        None,
        (*LP_REG, "actor_rollout_ref.actor.clip_ratio_c=5.0"),
        "actor_rollout_ref.actor.clip_ratio_c=5: divrl.policy_loss=lp_reg takes no dual_clip",
    ),
    (
        None,
        (*DPH, "+trainer.v1.sync.parameter_sync_step=2"),
        "trainer.v1.sync.parameter_sync_step=2: each of a step's sub-updates",
    ),
    (
        None,
        (*DPH, "+divrl.authors_gpus=0"),
        "divrl.divergence_weighting=authors: gpus must be >= 1, got 0",
    ),
]


def _config(name, overrides, model="/nonexistent/model"):
    base = (
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model}",  # sizes verl's own validate_config accepts on one device
        "data.train_batch_size=4",
        f"{A}.ppo_mini_batch_size=2",
        f"{A}.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "trainer.n_gpus_per_node=1",
    )
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name=name or "ppo_trainer", overrides=[*base, *overrides])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tests_verl import e2e

    return e2e.build_model(tmp_path_factory.mktemp("startup") / "model")


def test_the_gate_is_what_main_ppo_calls_before_run_ppo():
    """The contract the gate relies on: main_ppo holds verl's validate_config by name and
    calls it before run_ppo; the plugin (loaded with verl) has wrapped it."""
    import inspect

    from verl.trainer import main_ppo

    assert getattr(main_ppo.validate_config, "divrl_gate", False)
    body = inspect.getsource(main_ppo.main.__wrapped__)
    assert body.index("validate_config(") < body.index("run_ppo(")
    assert install_startup_gate()  # idempotent: wrapped once
    assert not getattr(main_ppo.validate_config.__wrapped__, "divrl_gate", False)


@pytest.mark.parametrize(("name", "overrides", "line"), ROWS, ids=[r[2][:48] for r in ROWS])
def test_a_setting_divrl_would_not_honour_stops_main_ppo_before_any_worker(
    main_ppo, capsys, name, overrides, line
):
    config = _config(name, overrides)
    with pytest.raises(SystemExit) as stop:
        main_ppo.main(config)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("divrl: ") and line in err[0], err
    assert main_ppo.started == [] and not ray.is_initialized()


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("trainer.use_v1=False",),
        (f"{A}.policy_loss.loss_mode=divrl_vanilla",),
        LP_REG,
        (*LP_REG, f"{A}.loss_agg_mode=seq-mean-token-sum-norm"),
        DPH,
        ("trainer.v1.trainer_mode=divrl_sync", "+divrl.divergence=js", "+divrl.divergence_coef=0"),
        PRESAMPLE,
    ],
)
def test_what_acts_passes_the_gate_into_run_ppo(main_ppo, capsys, model, overrides):
    main_ppo.main(_config(None, overrides, model))
    assert main_ppo.started == ["run_ppo"]
    assert "divrl:" not in capsys.readouterr().err


def test_the_trainer_modes_refuse_the_same_settings_when_built_by_other_code():
    from divrl.integrations.verl.trainer import DivRLPPOTrainer

    config = _config(None, (*LP_REG, f"{A}.fsdp_config.ulysses_sequence_parallel_size=2"))
    with pytest.raises(VerlSettingsError, match=r"fsdp_config\.ulysses_sequence_parallel_size=2"):
        DivRLPPOTrainer(config)
    assert startup_errors(_config(None, LP_REG)) == []
    assert DivRLVerlSettings.from_mapping(_config(None, LP_REG).divrl).policy_loss == "lp_reg"


def test_python_m_main_ppo_exits_2_with_one_line_before_ray(tmp_path):
    """A verl user's first mistake, as they would make it: divrl keys without the mode."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "+divrl.policy_loss=lp_reg"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # Hydra's outputs/ folder
        timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("divrl: ")]
    assert lines == [
        "divrl: divrl.policy_loss set, but trainer.v1.trainer_mode=sync does not read the "
        "divrl section (it would train plain GRPO without them); add "
        "trainer.v1.trainer_mode=divrl_sync"
    ]
    assert "Traceback" not in run.stderr
    assert "ray init kwargs" not in run.stdout  # run_ppo prints it just before ray.init


def _doc_overrides(after: str) -> list[str]:
    """The verl overrides of the first ```bash block after ``after`` in docs/verl.md."""
    text = (ROOT / "docs" / "verl.md").read_text()
    block = text[text.index(after) :].split("```bash\n", 1)[1].split("```", 1)[0]
    words = block.replace("\\\n", " ").split()
    return [w for w in words if "=" in w and not w.startswith(("<", "$("))]


def test_the_documented_commands_pass_the_gate_and_find_the_reward(model):
    """docs/verl.md's first command, with its DPH-JS and its Lp-Reg lines: they compose with
    verl's config, pass the start-up gate, and verl's own loader finds divrl's reward by
    the module name the command gives."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from divrl.integrations.verl.reward import compute_score

    first = _doc_overrides("## The config changes")
    assert "trainer.use_v1=True" in first and "trainer.v1.trainer_mode=divrl_sync" in first
    dph = [w.replace("$STORE", "/nonexistent/store") for w in _doc_overrides("**DPH-JS**")]
    lp_reg = _doc_overrides("**Lp-Reg**")
    assert len(dph) == 4 and len(lp_reg) == 3
    for extra in ([], dph, lp_reg):
        config = _config(None, (*first, *extra), model)
        assert startup_errors(config) == []
    fn = get_custom_reward_fn(config)
    assert fn.args[0] is compute_score  # verl's partial over the function it loaded


def test_divrl_reward_beside_verls_own_estimator_is_a_warning():
    from divrl.integrations.verl.startup import startup_warnings

    def config(estimator, **kwargs):
        reward = {"path": "pkg://divrl.integrations.verl.reward", "name": "compute_score"}
        if kwargs:
            reward["reward_kwargs"] = kwargs
        return {
            "algorithm": {"adv_estimator": estimator},
            "reward": {"custom_reward_function": reward},
        }

    (line,) = startup_warnings(config("grpo"))
    assert line.startswith("algorithm.adv_estimator=grpo: divrl's reward scores")
    assert "algorithm.adv_estimator=divrl_grpo" in line and "unscorable_score=0.0" in line
    assert startup_warnings(config("divrl_grpo")) == []
    assert startup_warnings(config("grpo", unscorable_score=0.0)) == []
    other = config("grpo")
    other["reward"]["custom_reward_function"]["path"] = "/home/me/my_reward.py"
    assert startup_warnings(other) == []
