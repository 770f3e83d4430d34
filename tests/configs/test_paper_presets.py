"""The paper presets carry the values of the authors' run scripts (docs/fidelity.md).

Loaded through the real config loader (``extends`` chains, loss-option resolution), and
through ``divrl train CONFIG --print-config``: the resolved values are the authors'. Each
value's source is in the preset's comment and in docs/fidelity.md.
"""

from pathlib import Path

import pytest
import yaml

from divrl.cli import main
from divrl.training.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _lookup(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        assert part in value, f"{dotted} is not in the resolved config"
        value = value[part]
    return value


# DPH-RL scripts/llama/*.sh and the verl defaults they inherit
DPH_COMMON = {
    "rollout.n": 16,
    "rollout.temperature": 1.0,
    "rollout.top_p": 0.9,
    "rollout.max_new_tokens": 4096,
    "data.max_prompt_length": 16000,
    "data.truncation": "drop",
    "train.prompts_per_step": 128,
    "train.mini_batch_size": 64,
    "train.ppo_epochs": 1,
    "algorithm.clip_low": 0.2,
    "algorithm.dual_clip": 3.0,
    "algorithm.loss_options.dual_clip": 3.0,
    "algorithm.loss_agg": "micro-batch-token-mean",
    "optim.lr": 1.0e-6,
    "optim.weight_decay": 0.01,
    "optim.schedule": "constant",
    "optim.max_grad_norm": 1.0,
}
DPH_REFERENCE = {
    "reference.per_step": 256,
    "reference.k": 8,
    "reference.threshold": 8,
    "reference.top_p": 0.95,
    "reference.response_top_p": 0.9,
    "algorithm.kl_coef": 0.0,
    "algorithm.clip_high": 0.28,
    "algorithm.divergence_weighting": "authors",
}
# Lp-Reg-dev recipe/lp_reg/Qwen3_14b_lp_reg_*_64gpu.sh
MATH_COMMON = {
    "rollout.n": 8,
    "rollout.temperature": 1.0,
    "rollout.top_p": 1.0,
    "rollout.max_new_tokens": 8192,
    "data.max_prompt_length": 2048,
    "data.truncation": "left",
    "train.prompts_per_step": 256,
    "train.micro_batch_tokens": 30720,
    "algorithm.loss_agg": "micro-batch-token-mean",
    "algorithm.loss_options.agg": "micro-batch-token-mean",
    "algorithm.dual_clip": None,
    "optim.lr": 1.0e-6,
    "optim.weight_decay": 0.0,
    "optim.schedule": "constant",
}
LP_REG = {
    "algorithm.policy_loss": "lp_reg",
    "algorithm.clip_low": 1.0,
    "algorithm.clip_high": 9.0,
    "algorithm.loss_options.rho": 0.01,
    "algorithm.loss_options.beta": 1.0,
    "algorithm.loss_options.kappa": 0.02,
    "algorithm.loss_options.clip_low": 1.0,
    "algorithm.loss_options.clip_high": 9.0,
    "algorithm.loss_options.min_k": 2,
    "algorithm.lp_reg_scope": "authors",
    "algorithm.lp_reg_micro_batch_tokens": None,  # train.micro_batch_tokens' 30720
}

# the entropy recipe's dynamic sampling (7b_kl_cov.sh, 7b_clip_cov.sh)
ENTROPY_RECIPE = {
    "algorithm.dynamic_sampling": True,
    "algorithm.max_refill_rounds": 9,
    "algorithm.gen_batch_factor": 3,
    "algorithm.refill_exhausted": "raise",
    "checkpoint.save_every": 32,
}

EXPECTED = {
    "grpo.yaml": {
        **DPH_COMMON,
        "algorithm.clip_high": 0.2,
        "algorithm.kl_coef": 0.0,
        "train.micro_batch_tokens": 32384,
    },
    # divrl's own: GRPO's settings, the Pass@k advantage of the Pass@k Training paper
    "grpo_passk.yaml": {
        **DPH_COMMON,
        "algorithm.clip_high": 0.2,
        "algorithm.kl_coef": 0.0,
        "train.micro_batch_tokens": 32384,
        "algorithm.advantage": "grpo_passk",
        "algorithm.advantage_options.k": 4,
        "algorithm.advantage_options.threshold": 0.5,
        "algorithm.advantage_options.form": "analytic",
    },
    "dapo.yaml": {
        **DPH_COMMON,
        "algorithm.clip_high": 0.28,
        "algorithm.kl_coef": 0.01,
        "algorithm.kl_estimator": "k3",
        "algorithm.dynamic_sampling": False,
        "algorithm.overlong_buffer": 0,
    },
    "grpo_rkl.yaml": {
        **DPH_COMMON,
        "algorithm.clip_high": 0.28,
        "algorithm.kl_coef": 0.01,
        "algorithm.kl_estimator": "k3",
    },
    "dph_f.yaml": {
        **DPH_COMMON,
        **DPH_REFERENCE,
        "algorithm.divergence": "forward_kl",
        "algorithm.divergence_coef": 0.01,
        "algorithm.authors_gpus": 8,
        "algorithm.authors_dynamic_batch": False,
        "algorithm.authors_micro_batch_size": 2,
        "train.micro_batch_size": 2,
        "train.micro_batch_tokens": None,
    },
    "dph_js.yaml": {
        **DPH_COMMON,
        **DPH_REFERENCE,
        "algorithm.divergence": "js",
        "algorithm.divergence_coef": 0.2,
        "algorithm.authors_dynamic_batch": True,
        "train.micro_batch_tokens": 32384,
    },
    "dph_alpha.yaml": {
        **DPH_COMMON,
        **DPH_REFERENCE,
        "algorithm.divergence": "alpha",
        "algorithm.divergence_alpha": 0.2,
        "algorithm.divergence_coef": 0.01,
        "algorithm.authors_dynamic_batch": True,
        "train.micro_batch_tokens": 32384,
    },
    "grpo_math.yaml": {
        **MATH_COMMON,
        "algorithm.clip_low": 0.2,
        "algorithm.clip_high": 0.2,
        "train.mini_batch_size": None,
    },
    "lp_reg.yaml": {
        **MATH_COMMON,
        **LP_REG,
        "train.mini_batch_size": None,
        "algorithm.lp_reg_group_size": 32,  # 2,048 rows / 64 GPUs
    },
    "lp_reg_offpolicy.yaml": {
        **MATH_COMMON,
        **LP_REG,
        "train.mini_batch_size": 32,
        "algorithm.lp_reg_group_size": 4,  # a mini-batch's 256 rows / 64 GPUs
    },
    "kl_cov.yaml": {
        **MATH_COMMON,
        **ENTROPY_RECIPE,
        "algorithm.policy_loss": "kl_cov",
        "algorithm.loss_options": {
            "kl_cov_ratio": 0.002,
            "ppo_kl_coef": 1.0,
            "agg": "micro-batch-token-mean",
        },
        "algorithm.clip_low": None,
        "train.mini_batch_size": 32,
    },
    "clip_cov.yaml": {
        **MATH_COMMON,
        **ENTROPY_RECIPE,
        "algorithm.policy_loss": "clip_cov",
        "algorithm.clip_low": 1.0,
        "algorithm.clip_high": 1.0,
        "algorithm.loss_options.clip_ratio": 0.0002,
        "algorithm.loss_options.clip_cov_lb": 1.0,
        "algorithm.loss_options.clip_cov_ub": 5.0,
        "train.mini_batch_size": 32,
    },
    "entropy_bonus.yaml": {**MATH_COMMON, "algorithm.entropy_coef": 0.002},
    "high_entropy_8020.yaml": {
        **MATH_COMMON,
        "algorithm.policy_loss": "high_entropy",
        "algorithm.loss_options.top_fraction": 0.2,
    },
}


def test_every_paper_preset_is_pinned():
    # *_control.yaml: divrl's own rehearsal control on top of a paper preset, not the authors'
    own = {p.name for p in CONFIGS.glob("*_control.yaml")}
    assert {p.name for p in CONFIGS.glob("*.yaml")} - {"dph_js_lp_reg.yaml"} - own == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_values_come_from_the_authors_scripts(name):
    config = load_config(CONFIGS / name).to_dict()
    for dotted, value in EXPECTED[name].items():
        assert _lookup(config, dotted) == value, f"{name}: {dotted}"


@pytest.mark.parametrize("name", ["dph_js.yaml", "lp_reg_offpolicy.yaml", "kl_cov.yaml"])
def test_print_config_shows_the_authors_values(name, capsys):
    assert main(["train", str(CONFIGS / name), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    for dotted, value in EXPECTED[name].items():
        assert _lookup(printed, dotted) == value, f"{name}: {dotted}"


def test_the_dph_and_lp_reg_combination_loads():
    algo = load_config(CONFIGS / "dph_js_lp_reg.yaml").algorithm
    assert (algo.policy_loss, algo.divergence, algo.divergence_weighting) == (
        "lp_reg",
        "js",
        "authors",
    )
    assert (algo.dual_clip, algo.options.rho, algo.options.kappa) == (None, 0.01, 0.02)


def test_every_preset_value_cites_its_source():
    # every set value in a paper preset carries a comment (file:line, the paper or a doc)
    for path in CONFIGS.glob("*.yaml"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            is_value = (
                ":" in stripped and not stripped.startswith("#") and not stripped.endswith(":")
            )
            exempt = stripped.split(":")[0] in {"extends", "output_dir", "template", "store"}
            if is_value and not exempt and "path:" not in stripped:
                assert "#" in line, f"{path.name}: {stripped!r} has no source comment"
