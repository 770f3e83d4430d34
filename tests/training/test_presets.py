"""Every toy preset of every registered world (configs/<the world's presets folder>/, from
the world registry) runs a few steps on the tiny model, with its method active."""

import math
from pathlib import Path

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.toy.worlds import WORLDS, world_presets
from divrl.training.config import load_config
from divrl.training.trainer import Trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: "<presets folder>/<method>" -> its file, the default world's folder first
PRESETS = {
    f"{folder}/{p.stem}": p
    for folder in dict.fromkeys(world_presets(w) for w in WORLDS)
    for p in sorted((CONFIGS / folder).glob("*.yaml"))
}

# preset -> a metric only that method produces
SIGNATURE = {
    "grpo": "pg/clip_frac",
    "grpo_math": "pg/clip_frac",
    "dapo": "dapo/kept_groups",
    "grpo_rkl": "actor/ref_kl",
    "dph_f": "dph/divergence",
    "dph_js": "dph/divergence",
    "dph_js_paper": "dph/divergence",
    "dph_js_control": "dph/eta",
    "dph_js_replica": "dph/optimiser_steps",
    "dph_js_replica_no_clones": "dph/optimiser_steps",
    "dph_js_replica_no_third_step": "dph/optimiser_steps",
    "dph_js_replica_token_scaling": "dph/optimiser_steps",
    "dph_alpha": "dph/divergence",
    "lp_reg": "lp_reg/num_selected",
    "lp_reg_offpolicy": "lp_reg/num_selected",
    "lp_reg_toy": "lp_reg/num_selected",
    "entropy_bonus": "actor/entropy",
    "high_entropy_8020": "entropy/kept_tokens",
    "kl_cov": "kl_cov/num_penalized",
    "clip_cov": "clip_cov/num_cut",
    "dph_js_lp_reg": "lp_reg/num_selected",
    "grpo_passk": "adv/pass_at_k",
}


def test_every_toy_preset_is_covered():
    assert {"toy/grpo", "toy/countdown/grpo", "toy/sparks/lp_reg_toy"} <= set(PRESETS)
    assert {p.stem for p in PRESETS.values()} == set(SIGNATURE)


def _tiny_extra(base) -> dict:
    """The overrides that fit a preset to the tiny model, its prompts and its store."""
    extra = {"train.total_steps": 2}
    if base.train.mini_batch_size is not None:  # keep off-policy presets off-policy
        extra["train.mini_batch_size"] = 2
    if base.algorithm.lp_reg_scope == "authors":  # virtual GPUs that fit the tiny batch
        extra["algorithm.lp_reg_group_size"] = 4
    if base.algorithm.overlong_buffer:
        extra["algorithm.overlong_buffer"] = 2
    if base.uses_reference_samples:
        extra.update(
            {
                "reference.store": "<store>",  # the test's store replaces it
                "reference.per_step": 4,
                "reference.k": 4,  # as the store was presampled
                "reference.threshold": 4,
                "reference.response_top_p": None,  # as the store was presampled
                "reference.keep_presampled": False,  # as the store was presampled
            }
        )
    return extra


def _run_key(path: Path) -> str:
    """What a tiny run of the preset depends on: its config with the tiny overrides, less
    the settings that only name its world or its folders (toy_world, logging) or cannot
    act on the tiny prompts (`Q:15+16=`: no world's prompt limit cuts them) or a run that
    saves no checkpoint (checkpoint)."""
    world = {"model": "<model>", "data": "<data>"}
    cfg = load_config(path, tiny_overrides(world, "<out>", **_tiny_extra(load_config(path))))
    assert cfg.data.max_prompt_length >= len("Q:15+16="), path
    tree = cfg.to_dict()
    tree["model"].pop("toy_world")
    tree["data"].pop("max_prompt_length")
    for section in ("logging", "checkpoint"):
        tree.pop(section)
    return repr(tree)


def _first_with_the_same_run() -> dict[str, str]:
    """Preset -> the first preset (in PRESETS' order) whose tiny run is the same."""
    first: dict[str, str] = {}
    return {name: first.setdefault(_run_key(path), name) for name, path in PRESETS.items()}


SAME_RUN = _first_with_the_same_run()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_runs(name, tiny_world, reference_store, tmp_path):
    """A world's preset whose tiny run would repeat an earlier one's (its method settings
    those of the default world's preset of the method) is covered by that run: the key
    equality is what this checks of it; every other preset runs."""
    path = PRESETS[name]
    base = load_config(path)
    assert base.model.toy_world in (None, *WORLDS), name
    if SAME_RUN[name] != name:
        assert PRESETS[SAME_RUN[name]].stem == path.stem, (name, SAME_RUN[name])
        return
    extra = _tiny_extra(base)
    if base.uses_reference_samples:
        extra["reference.store"] = reference_store
    cfg = load_config(path, tiny_overrides(tiny_world, tmp_path, **extra))
    # the method's own settings survive the tiny overrides
    assert cfg.algorithm.policy_loss == base.algorithm.policy_loss
    assert cfg.algorithm.divergence == base.algorithm.divergence
    assert cfg.train.on_policy == base.train.on_policy
    trainer = Trainer(cfg, reward_fn=sevens_reward)
    assert (trainer.ref_model is not None) == (cfg.algorithm.kl_coef > 0)
    start = {
        k: v.clone()
        for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()
    }
    history = trainer.train()
    assert len(history) == 2
    for record in history:
        assert all(math.isfinite(v) for k, v in record.items() if not k.startswith("dapo/")), record
    assert SIGNATURE[path.stem] in history[-1]
    if cfg.algorithm.lp_reg_scope == "authors":
        assert history[-1]["lp_reg/authors_micro_batches"] >= 1
    if cfg.uses_reference_samples:
        assert "dph/divergence" in history[-1] and trainer.ref_model is None
    end = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    assert any(not torch.equal(start[k], end[k]) for k in start)
