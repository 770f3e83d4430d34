"""The rehearsal controller inside `divrl train`: the config's checks, eta moved each step
and used by the update, the logged quantities, and an exact resume from a checkpoint."""

import itertools
import json

import pytest
from train_helpers import sevens_reward, tiny_overrides

from divrl.training.config import load_config
from divrl.training.config_io import ConfigError
from divrl.training.run_session import RunDirError
from divrl.training.trainer import TIME_KEYS, Trainer


class Killed(Exception):
    pass


def _rows(path):
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def _config(world, out, store, **extra):
    return load_config(
        None,
        tiny_overrides(
            world,
            out,
            **{
                "train.total_steps": 6,
                "train.mini_batch_size": 2,
                "algorithm.divergence": "js",
                "algorithm.divergence_coef": 0.2,
                # a target no run holds: eta must climb from the second step on
                "algorithm.rehearsal_control.target": 1e-9,
                "algorithm.rehearsal_control.warmup_steps": 1,
                "algorithm.rehearsal_control.rate": 0.5,
                "reference.store": store,
                "reference.k": 4,
                "reference.per_step": 2,
                "checkpoint.save_every": 2,
                "checkpoint.keep_last": 1,
                **extra,
            },
        ),
    )


def test_config_resolves_every_option_and_refuses_misuse(tiny_world, tmp_path):
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_world,
            tmp_path,
            **{
                "algorithm.divergence": "js",
                "algorithm.divergence_coef": 0.2,
                "reference.per_step": 2,
                "algorithm.rehearsal_control.target": 0.03,
            },
        ),
    )
    assert cfg.algorithm.rehearsal_control["target"] == 0.03
    assert cfg.algorithm.rehearsal_control["measure"] == "likelihood"  # resolved defaults
    assert cfg.algorithm.control.target == 0.03
    assert load_config(None, tiny_overrides(tiny_world, tmp_path)).algorithm.control is None
    with pytest.raises(ConfigError, match=r"set algorithm.divergence and"):
        load_config(
            None, tiny_overrides(tiny_world, tmp_path, **{"algorithm.rehearsal_control.target": 1})
        )
    with pytest.raises(ConfigError, match=r"algorithm\.rehearsal_control\.rate=-1\.0 must be > 0"):
        load_config(
            None,
            tiny_overrides(
                tiny_world,
                tmp_path,
                **{
                    "algorithm.divergence": "js",
                    "algorithm.divergence_coef": 0.2,
                    "reference.per_step": 2,
                    "algorithm.rehearsal_control.rate": -1,
                },
            ),
        )


def test_eta_moves_is_used_logged_and_resumes_exactly(tiny_world, reference_store, tmp_path):
    full = Trainer(_config(tiny_world, tmp_path / "full", reference_store), reward_fn=sevens_reward)
    full.train()
    rows = _rows(tmp_path / "full" / "metrics.jsonl")
    etas = [r["dph/eta"] for r in rows]
    assert etas[:2] == [0.2, 0.2]  # the configured eta, then one warm-up step
    assert all(b > a for a, b in itertools.pairwise(etas[1:]))  # missed: rises
    assert all(r["dph/control_target"] == 1e-9 for r in rows)
    assert all(r["dph/control_likelihood"] == pytest.approx(-r["dph/log_u_mean"]) for r in rows)
    assert [r["dph/eta_next"] for r in rows[:-1]] == etas[1:]
    # the update trains with it: the authors weighting scales the eta it is given
    ratios = [r["dph/effective_eta"] / r["dph/eta"] for r in rows]
    assert ratios == pytest.approx([ratios[0]] * len(rows), rel=1e-9)

    def kill_after_step_5(step, record):
        if step == 5:
            raise Killed

    run = tmp_path / "killed"
    with pytest.raises(Killed):
        Trainer(_config(tiny_world, run, reference_store), reward_fn=sevens_reward).train(
            on_step=kill_after_step_5
        )
    resumed = Trainer(
        _config(tiny_world, run, reference_store), reward_fn=sevens_reward, resume=True
    )
    assert resumed.step == 4
    assert resumed.rehearsal.eta == etas[4]
    resumed.train()
    assert _rows(run / "metrics.jsonl") == rows

    # switching the controller off (a section that flattens to {}) is a fixed setting
    with pytest.raises(RunDirError, match=r"algorithm.rehearsal_control: \{'measure'.*-> \{\}"):
        off = _config(tiny_world, run, reference_store, **{"algorithm.rehearsal_control": {}})
        Trainer(off, reward_fn=sevens_reward, resume=True)
    # new bounds that exclude the saved eta: one line naming the scale to set
    narrow = {"algorithm.rehearsal_control.max_scale": 1.0, "train.total_steps": 7}
    with pytest.raises(RunDirError, match=r"set algorithm.rehearsal_control.max_scale >= "):
        Trainer(
            _config(tiny_world, run, reference_store, **narrow),
            reward_fn=sevens_reward,
            resume=True,
            resume_with_changes=("algorithm.rehearsal_control",),
        )
