import re
from pathlib import Path

import pytest
import yaml

from divrl.training.config import Config, ConfigError, config_from_dict, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = [
    "grpo",
    "grpo_math",
    "dapo",
    "grpo_rkl",
    "dph_f",
    "dph_js",
    "dph_alpha",
    "lp_reg",
    "lp_reg_offpolicy",
    "entropy_bonus",
    "high_entropy_8020",
    "kl_cov",
    "clip_cov",
    "dph_js_lp_reg",
]
# what a toy preset may change relative to its full preset
SCALE_KEYS = {
    ("model", "path"),
    ("model", "toy_size"),
    ("data", "max_prompt_length"),
    ("data", "truncation"),  # one prompt handling for every preset of a world
    ("rollout", "n"),
    ("rollout", "max_new_tokens"),
    ("train", "prompts_per_step"),
    ("train", "mini_batch_size"),
    ("train", "micro_batch_size"),
    ("train", "micro_batch_tokens"),
    ("train", "total_steps"),
    ("optim", "lr"),
    ("reference", "store"),
    ("reference", "per_step"),
    ("logging", "output_dir"),
    ("algorithm", "overlong_buffer"),
    ("algorithm", "lp_reg_micro_batch_tokens"),
}
# deliberate toy variants, said in the toy preset's header
TOY_VARIANTS = {"dapo": {("algorithm", "dynamic_sampling")}}


def test_defaults_are_valid():
    cfg = load_config()
    assert cfg.algorithm.policy_loss == "vanilla"
    assert cfg.train.on_policy


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.clip_hihg=0.3", "did you mean 'algorithm.clip_high'"),
        ("algoritm.clip_high=0.3", "did you mean 'algorithm'"),
        ("algorithm.policy_loss=lpreg", "did you mean 'lp_reg'"),
        ("rollout.engine=vlm", "did you mean 'vllm'"),
        ("rollout.n=many", "rollout.n='many' must be an integer"),
        ("rollout.n=0", "rollout.n=0 must be > 0"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("algorithm.divergence=alpha", "divergence_alpha"),
        ("train.mini_batch_size=5", "must divide"),
        ("logging.progress=maybe", "must be true or false"),
        ("train.total_steps", "must look like section.key=value"),
        ("train.seed=-1", "train.seed=-1 must be a whole number from 0 to 2147483647"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])


def test_overrides_parse_types():
    cfg = load_config(
        None, ["optim.lr=3e-4", "rollout.stop=</a>", "algorithm.dual_clip=3", "data.limit=null"]
    )
    assert cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.rollout.stop == ["</a>"]
    assert cfg.algorithm.dual_clip == 3.0
    assert cfg.data.limit is None


def test_divergence_needs_reference_samples():
    with pytest.raises(ConfigError, match=re.escape("reference.per_step")):
        config_from_dict({"algorithm": {"divergence": "js", "divergence_coef": 0.2}})


def test_extends_merges_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("rollout:\n  n: 4\n  temperature: 0.7\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nrollout:\n  n: 2\n")
    cfg = load_config(tmp_path / "child.yaml", ["rollout.temperature=0.5"])
    assert (cfg.rollout.n, cfg.rollout.temperature) == (2, 0.5)


def test_unknown_key_in_file_fails(tmp_path):
    (tmp_path / "bad.yaml").write_text("train:\n  total_step: 3\n")
    with pytest.raises(ConfigError, match=re.escape("train.total_steps")):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_toy_presets_change_only_scale(name):
    full = load_config(CONFIGS / f"{name}.yaml")
    toy = load_config(CONFIGS / "toy" / f"{name}.yaml")
    assert isinstance(full, Config)
    changed = {
        (section, key)
        for section, values in toy.to_dict().items()
        for key, value in values.items()
        if full.to_dict()[section][key] != value
    }
    allowed = SCALE_KEYS | TOY_VARIANTS.get(name, set())
    assert changed <= allowed, changed - allowed
    # every value line of a preset carries a comment with its source or reason
    text = (CONFIGS / f"{name}.yaml").read_text()
    assert "Sources:" in text
    raw = yaml.safe_load(text)
    assert raw, name


def test_preset_methods():
    def cfg(name):
        return load_config(CONFIGS / f"{name}.yaml")

    # the DPH-RL authors' "DAPO" script: clip-higher and a KL term, no dynamic sampling
    assert cfg("dapo").algorithm.clip_high == 0.28 and not cfg("dapo").algorithm.dynamic_sampling
    assert load_config(CONFIGS / "toy" / "dapo.yaml").algorithm.dynamic_sampling
    assert cfg("grpo_rkl").algorithm.kl_coef == 0.01
    assert cfg("grpo_rkl").algorithm.kl_estimator == "k3"
    assert cfg("dph_js").algorithm.divergence == "js"
    assert cfg("dph_js").algorithm.divergence_coef == 0.2
    assert cfg("dph_js").algorithm.kl_coef == 0.0
    assert cfg("dph_alpha").algorithm.divergence_alpha == 0.2
    lp = cfg("lp_reg").algorithm
    assert (lp.policy_loss, lp.clip_low, lp.clip_high, lp.options.kappa) == (
        "lp_reg",
        1.0,
        9.0,
        0.02,
    )
    assert cfg("lp_reg").train.on_policy and not cfg("lp_reg_offpolicy").train.on_policy
    both = cfg("dph_js_lp_reg").algorithm
    assert (both.policy_loss, both.divergence) == ("lp_reg", "js")


def test_docs_list_every_config_key():
    import dataclasses
    import typing

    docs = (CONFIGS.parent / "docs" / "training.md").read_text()
    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        assert f"### `{section.name}`" in docs
        defaults = hints[section.name]()
        for f in dataclasses.fields(defaults):
            v = getattr(defaults, f.name)
            shown = (
                "null"
                if v is None
                else str(v).lower()
                if isinstance(v, bool)
                else repr(v)
                if isinstance(v, str)
                else str(v)
            )
            row = f"| `{f.name}` | `{shown}` |"
            assert row in docs, f"docs/training.md lacks {section.name}: {row}"


def test_gspo_runs_with_its_own_clip_range_and_aggregation():
    algo = load_config(None, ["algorithm.policy_loss=gspo"]).algorithm
    assert (algo.clip_low, algo.clip_high, algo.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert algo.options.loss_kwargs() == {
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "agg": "seq-mean-token-mean",
    }
    # unset means the loss's default; set means set
    algo = load_config(None, ["algorithm.policy_loss=gspo", "algorithm.clip_high=1e-3"]).algorithm
    assert (algo.clip_low, algo.clip_high) == (3e-4, 1e-3)
    assert load_config().algorithm.options.loss_kwargs()["clip_low"] == 0.2  # vanilla


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.policy_loss=gspo", "algorithm.dual_clip=3"],
            "'gspo' does not take 'dual_clip'",
        ),
        (["algorithm.policy_loss=kl_cov", "algorithm.clip_high=0.28"], "its options: kl_cov_ratio"),
        (
            ["algorithm.loss_options.rho=0.1"],
            "policy loss 'vanilla' has no option 'rho'; its options: clip_low, clip_high, dual_clip, agg",
        ),
        (
            ["algorithm.policy_loss=lp_reg", "algorithm.loss_options.kappa=1.5"],
            "kappa=1.5 must be in [0, 1]",
        ),
        (
            [
                "algorithm.policy_loss=lp_reg",
                "algorithm.clip_high=9",
                "algorithm.loss_options.clip_high=8",
            ],
            "set the same option differently",
        ),
        (
            ["algorithm.lp_reg_kappa=0.1", "algorithm.high_entropy_fraction=0.2"],
            "removed keys (CHANGELOG.md): algorithm.lp_reg_kappa -> algorithm.loss_options.kappa, "
            "algorithm.high_entropy_fraction -> algorithm.loss_options.top_fraction",
        ),
        (
            ["algorithm.policy_loss=lp_reg", "algorithm.loss_options.full_vocab=true"],
            "full_vocab=true (the paper's full-vocabulary KL(proxy || pi)) needs",
        ),
        (["algorithm.dual_clip=1.0"], "dual_clip=1.0 must be > 1"),
        (["algorithm.loss_agg=mean"], "agg='mean' is not an aggregation mode"),
        (["algorithm.lp_reg_scope=step"], "selects no share of tokens"),
        (["train.micro_batch_tokens=0"], "train.micro_batch_tokens=0 must be > 0"),
        (["data.truncation=right"], "data.truncation='right' is not valid"),
        (["algorithm.divergence_weighting=verl"], "choose one of ['authors', 'paper', 'concat']"),
    ],
)
def test_loss_options_fail_at_config_time_naming_the_loss(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_shared_flat_keys_and_loss_options_reach_the_same_option_built_once():
    old = load_config(None, ["algorithm.policy_loss=lp_reg", "algorithm.clip_high=5.0"])
    new = load_config(
        None, ["algorithm.policy_loss=lp_reg", "algorithm.loss_options={clip_high: 5.0}"]
    )
    assert old.algorithm.options == new.algorithm.options
    assert new.algorithm.options.clip_high == 5.0 and new.algorithm.clip_high == 5.0
    assert new.algorithm.options is new.algorithm.options  # built once
    # YAML 1.1 reads 3e-4 as a string; a float option takes it as a number
    gspo = load_config(None, ["algorithm.policy_loss=gspo", "algorithm.loss_options.clip_low=3e-3"])
    assert gspo.algorithm.options.clip_low == 3e-3
    # the printed config loads back to the same options
    again = config_from_dict(new.to_dict())
    assert again.algorithm.options == new.algorithm.options


def test_dph_weighting_defaults_to_the_authors():
    assert load_config().algorithm.divergence_weighting == "authors"


GRPO_PRESET = Path(__file__).resolve().parents[2] / "configs" / "grpo.yaml"


def test_switching_the_loss_by_override_refuses_the_presets_keys_for_the_old_loss():
    # the trap: GSPO would run with grpo.yaml's vanilla clip 0.2 / 0.2 and token-mean
    with pytest.raises(ConfigError) as err:
        load_config(GRPO_PRESET, ["algorithm.policy_loss=gspo", "algorithm.dual_clip=null"])
    message = str(err.value)
    assert "from 'vanilla'" in message
    for key in ("algorithm.clip_low=null", "algorithm.clip_high=null", "algorithm.loss_agg=null"):
        assert key in message
    assert "algorithm.dual_clip=null" not in message  # already answered on the command line
    # nulling them runs GSPO with its own range and aggregation
    nulls = [f"algorithm.{k}=null" for k in ("clip_low", "clip_high", "dual_clip", "loss_agg")]
    algo = load_config(GRPO_PRESET, ["algorithm.policy_loss=gspo", *nulls]).algorithm
    assert (algo.clip_low, algo.clip_high, algo.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    # a key set again on the command line is kept as given
    kept = ["algorithm.policy_loss=gspo", *nulls[2:], "algorithm.clip_low=1e-3"]
    kept.append("algorithm.clip_high=2e-3")
    algo = load_config(GRPO_PRESET, kept).algorithm
    assert (algo.clip_low, algo.clip_high) == (1e-3, 2e-3)


def test_switching_the_loss_reports_only_keys_that_differ_from_the_new_losss_defaults():
    # clip_cov's defaults are vanilla's 0.2 / 0.2: only the dual clip and the preset's
    # per-micro-batch token-mean differ
    with pytest.raises(ConfigError) as err:
        load_config(GRPO_PRESET, ["algorithm.policy_loss=clip_cov"])
    assert (
        "sets algorithm.dual_clip=3.0, algorithm.loss_agg=micro-batch-token-mean for 'vanilla'"
        in str(err.value)
    )
    assert "clip_low" not in str(err.value)
    keep = ["algorithm.dual_clip=3", "algorithm.loss_agg=micro-batch-token-mean"]
    algo = load_config(GRPO_PRESET, ["algorithm.policy_loss=clip_cov", *keep])
    assert algo.algorithm.dual_clip == 3.0
    # no switch: the preset's own keys stand; no preset: nothing to inherit
    assert load_config(GRPO_PRESET, ["algorithm.policy_loss=vanilla"]).algorithm.clip_low == 0.2
    assert load_config(None, ["algorithm.policy_loss=gspo"]).algorithm.clip_low == 3e-4


def test_an_override_value_is_never_cut_at_a_hash_and_text_fields_keep_their_text():
    cfg = load_config(None, ["logging.output_dir=runs/run #2", "data.template=r1"])
    assert cfg.logging.output_dir == "runs/run #2"  # YAML alone reads `runs/run`
    for text in ("0x10", "true", "1_000", "[a, b]", "a: b"):  # not text in YAML
        assert load_config(None, [f"logging.output_dir={text}"]).logging.output_dir == text
    assert load_config(None, ["logging.output_dir='q #1'"]).logging.output_dir == "q #1"
    assert load_config(None, ["train.total_steps=0x10"]).train.total_steps == 16
    with pytest.raises(ConfigError, match=re.escape("algorithm.clip_high='0.28 # up' must be")):
        load_config(None, ["algorithm.clip_high=0.28 # up"])
