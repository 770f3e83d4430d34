"""The recipes under recipes/verl/ use keys verl 0.9.1's Hydra config has, values its
dataclasses accept, and divrl settings that validate (composed, not run: they need GPUs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from verl.utils.config import omega_conf_to_dataclass

from divrl.integrations.verl.settings import DivRLVerlSettings
from divrl.integrations.verl.startup import startup_errors

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "verl"
OVERRIDE = re.compile(r"^\s+(\+?[A-Za-z_][\w.]*=\S*?)(\s+\\)?$")
FAKE = {
    "MODEL": "/models/m",
    "DATA": "/data",
    "STORE": "/store",
    "NGPUS": "8",
    "NNODES": "1",
    "EPOCHS": "5",
    "REWARD_FILE": "/reward.py",
}


def overrides(script: Path) -> list[str]:
    """The Hydra overrides a recipe passes: its common file's array, then its own."""
    common = "dph_bird_common.sh" if script.name.startswith("dph") else "lp_reg_qwen3_common.sh"
    out = []
    for path in (RECIPES / common, script):
        for line in path.read_text().splitlines():
            m = OVERRIDE.match(line)
            if m:
                value = re.sub(r"\$(\w+)", lambda v: FAKE[v.group(1)], m.group(1)).replace('"', "")
                out.append(value)
    return out


@pytest.mark.parametrize(
    "name",
    [
        "dph_f_bird.sh",
        "dph_js_bird.sh",
        "dph_alpha_bird.sh",
        "lp_reg_qwen3_onpolicy.sh",
        "lp_reg_qwen3_offpolicy.sh",
    ],
)
def test_a_recipe_composes_with_verls_config(name):
    args = overrides(RECIPES / name)
    assert len(args) > 30
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=args)
    assert cfg.trainer.v1.trainer_mode == "divrl_sync"
    assert startup_errors(cfg) == []  # main_ppo's start-up gate lets it through
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    settings = DivRLVerlSettings.from_mapping(cfg.divrl)
    if name.startswith("dph"):
        assert settings.dph and actor.clip_ratio_high == 0.28
        rollouts = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        mini_batches = cfg.data.train_batch_size // actor.ppo_mini_batch_size
        layout = settings.authors_layout(rollouts, mini_batches)
        assert (layout.rollouts, layout.references, layout.mini_batches) == (2048, 256, 2)
    else:
        assert settings.policy_loss == "lp_reg" and actor.clip_ratio_high == 9.0
        options = settings.policy_options(
            clip_low=actor.clip_ratio_low, clip_high=actor.clip_ratio_high
        )
        assert (options.rho, options.kappa, options.beta, options.min_k) == (0.01, 0.02, 1.0, 2)
