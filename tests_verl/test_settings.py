"""The divrl section of a verl config and the verl version check."""

from __future__ import annotations

import logging

import pytest

from divrl.integrations.verl import UnsupportedVerlError, check_verl_version
from divrl.integrations.verl.settings import DivRLVerlSettings, VerlSettingsError


def test_the_installed_verl_is_the_tested_one():
    assert check_verl_version() == "0.9.1"


def test_another_verl_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv("DIVRL_ALLOW_UNTESTED_VERL", raising=False)
    with pytest.raises(UnsupportedVerlError, match="DIVRL_ALLOW_UNTESTED_VERL=1"):
        check_verl_version("0.10.0")
    monkeypatch.setenv("DIVRL_ALLOW_UNTESTED_VERL", "1")
    assert check_verl_version("0.10.0") == "0.10.0"


def test_the_plugin_warns_and_registers_nothing_on_another_verl(monkeypatch, caplog):
    import divrl.integrations.verl.plugin as plugin

    monkeypatch.delenv("DIVRL_ALLOW_UNTESTED_VERL", raising=False)
    monkeypatch.setattr(plugin, "check_verl_version", lambda: check_verl_version("0.10.0"))
    with caplog.at_level(logging.WARNING):
        assert plugin.register() is False
    assert "not registered" in caplog.text and "0.10.0" in caplog.text


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"divergnce": "js"}, r"unknown key\(s\) divrl\.divergnce; valid: policy_loss"),
        (
            {"policy_loss": "grpo"},
            r"divrl\.policy_loss='grpo' is not a registered policy loss; valid: .*lp_reg.*vanilla",
        ),
        (
            {"divergence": "alpha", "divergence_coef": 0.1},
            r"divergence_alpha=None: the alpha divergence needs 0 < alpha < 1",
        ),
        ({"divergence": "js", "divergence_coef": 0.2}, r"set divrl\.reference_store"),
        (
            {"policy_loss": "lp_reg", "loss_options": {"kappa": 2.0}},
            r"divrl\.loss_options: .*kappa=2.0",
        ),
        (
            {"policy_loss": "lp_reg", "loss_options": {"clip_high": 9.0}},
            r"loss_options\.clip_high: set verl's actor_rollout_ref\.actor\.clip_ratio_high",
        ),
        (
            {"policy_loss": "lp_reg", "loss_options": {"full_vocab": True}},
            r"divrl\.policy_loss=lp_reg: the loss \(with these options\) needs the "
            r"full-vocabulary logits of every position",
        ),
        (
            {"policy_loss": "high_entropy"},
            r"policy_loss=high_entropy: .* needs the input 'entropy'",
        ),
        ({"loss_options": {"rho": 0.1}}, r"loss_options \['rho'\] set without divrl\.policy_loss"),
        (
            {"policy_loss": "vanilla", "loss_options": {"rho": 0.1}},
            r"'vanilla' has no option 'rho'",
        ),
        ({"divergence_weighting": "mean"}, r"valid: authors, paper, concat"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(section, message):
    with pytest.raises(VerlSettingsError, match=message):
        DivRLVerlSettings.from_mapping(section)


def test_defaults_are_plain_grpo():
    settings = DivRLVerlSettings.from_mapping(None)
    assert settings.policy_loss is None and not settings.dph and not settings.replaces_loss
    assert settings.authors_layout(rollouts=16, mini_batches=1) is None


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"divergence_coef": float("nan")}, r"divrl\.divergence_coef=nan must be a finite number"),
        ({"divergence_coef": float("inf")}, r"divrl\.divergence_coef=inf must be a finite number"),
        ({"divergence_coef": "0.2"}, r"divrl\.divergence_coef='0\.2' must be a finite number"),
        ({"reference_per_step": float("nan")}, r"reference_per_step=nan must be a whole number"),
        ({"reference_per_step": 2.5}, r"divrl\.reference_per_step=2\.5 must be a whole number"),
        ({"allow_store_mismatch": "no"}, r"allow_store_mismatch='no' must be true or false"),
        (
            {"policy_loss": "lp_reg", "loss_options": {"rho": float("nan")}},
            r"divrl\.loss_options\.rho=nan must be a finite number",
        ),
        (
            {"divergence_coef": 0.2},
            r"divergence_coef=0\.2 has no effect without divrl\.divergence: set divrl\.divergence",
        ),
    ],
)
def test_values_of_the_wrong_kind_are_refused_naming_the_key(section, message):
    """NaN turned DPH off without a word, '0.2' and 2.5 crashed later, 'no' counted as true,
    a coefficient without a divergence trained plain GRPO."""
    with pytest.raises(VerlSettingsError, match=message):
        DivRLVerlSettings.from_mapping(section)


def test_an_empty_loss_options_section_means_no_options():
    settings = DivRLVerlSettings.from_mapping({"policy_loss": "lp_reg", "loss_options": None})
    assert settings.loss_options == {} and settings.policy_options().rho > 0


def test_a_registered_divergence_is_a_valid_setting():
    """The settings read the divergence registry: a divergence registered anywhere is
    accepted by name, without a list of names in the plugin."""
    from divrl.algorithms import DIVERGENCES, register_divergence

    @register_divergence("probe_hellinger", "a divergence registered by this test")
    def probe(**_options):
        return lambda log_u: (log_u.exp().sqrt() - 1) ** 2

    try:
        raw = {"divergence": "probe_hellinger", "divergence_coef": 0.1}
        raw |= {"reference_store": "store", "reference_per_step": 2}
        assert DivRLVerlSettings.from_mapping(raw).divergence == "probe_hellinger"
    finally:
        DIVERGENCES.pop("probe_hellinger")
    with pytest.raises(VerlSettingsError, match="valid: alpha, forward_kl, js, reverse_kl"):
        DivRLVerlSettings.from_mapping({"divergence": "probe_hellinger"})


def _verl_config(*overrides: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


DPH = dict(divergence="js", divergence_coef=0.2, reference_store="s", reference_per_step=2)


@pytest.mark.parametrize(
    ("overrides", "settings", "key"),
    [
        (["actor_rollout_ref.actor.policy_loss.loss_mode=sapo"], DPH, "loss_mode=sapo"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"], DPH, "loss_mode=geo_mean"),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
            {"policy_loss": "lp_reg"},
            "loss_mode=gspo",
        ),
        (["actor_rollout_ref.model.use_fused_kernels=True"], {"policy_loss": "lp_reg"}, "fused"),
        (
            ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
            {"policy_loss": "lp_reg"},
            "ulysses_sequence_parallel_size=2",
        ),
        (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"], DPH, "loss_agg_mode"),
        (["actor_rollout_ref.actor.shuffle=True"], DPH, "shuffle=True"),
        (
            ["+trainer.v1.sync.parameter_sync_step=2"],
            {"policy_loss": "lp_reg"},
            r"parameter_sync_step=2: .* the min-p proxy of divrl\.policy_loss=lp_reg",
        ),
        (
            ["algorithm.rollout_correction.rollout_is=token"],
            {"policy_loss": "gspo"},
            r"rollout_is=token: divrl\.policy_loss=gspo takes no per-token weights",
        ),
        (
            ["actor_rollout_ref.actor.clip_ratio_low=1.5"],
            {"policy_loss": "vanilla"},
            r"clip_low=1\.5 must be in \[0, 1\]",
        ),
        (["distillation.enabled=True"], DPH, "distillation.enabled"),
        (
            ["actor_rollout_ref.actor.clip_ratio_c=5.0"],
            {"policy_loss": "lp_reg"},
            r"clip_ratio_c=5: divrl\.policy_loss=lp_reg takes no dual_clip .* ignored",
        ),
        (
            ["actor_rollout_ref.actor.clip_ratio_high=0.28"],
            {"policy_loss": "kl_cov"},
            r"clip_ratio_high=0\.28: divrl\.policy_loss=kl_cov takes no clip_high",
        ),
    ],
)
def test_what_cannot_stand_beside_divrls_loss_is_refused_naming_the_key(overrides, settings, key):
    from divrl.integrations.verl.settings import check_composition

    with pytest.raises(VerlSettingsError, match=key):
        check_composition(_verl_config(*overrides), DivRLVerlSettings(**settings))


def test_what_composes_is_accepted_and_verls_own_loss_refuses_nothing():
    from divrl.integrations.verl.settings import composition_errors

    composed = _verl_config(
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "algorithm.rollout_correction.rollout_is=token",
    )
    assert composition_errors(composed, DivRLVerlSettings(**DPH)) == []
    weighted = _verl_config("algorithm.rollout_correction.rollout_is=token")
    assert composition_errors(weighted, DivRLVerlSettings(policy_loss="lp_reg")) == []
    # verl's default clip_ratio_c beside a loss without a dual clip is no user's setting
    default_dual = _verl_config("actor_rollout_ref.actor.clip_ratio_c=3.0")
    assert composition_errors(default_dual, DivRLVerlSettings(policy_loss="lp_reg")) == []
    refused_elsewhere = _verl_config("actor_rollout_ref.actor.policy_loss.loss_mode=sapo")
    assert composition_errors(refused_elsewhere, DivRLVerlSettings()) == []
