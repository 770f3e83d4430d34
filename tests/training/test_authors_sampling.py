"""Sampling settings of the authors' runs: the reference responses' own top_p (the DPH-RL
authors drew them at the rollout's 0.9, not at the presample's 0.95), and the entropy
recipe's dynamic sampling that generates a multiple of the step's prompts per round."""

from __future__ import annotations

import pytest
from train_helpers import parity_reward, sevens_reward, tiny_overrides

import divrl.training.presample as presample_module
from divrl.data.reference_store import StoreMismatchError
from divrl.training.config import ConfigError, load_config
from divrl.training.presample import presample
from divrl.training.trainer import Trainer

DPH = {
    "reference.k": 4,
    "reference.per_step": 2,
    "algorithm.divergence": "js",
    "algorithm.divergence_coef": 0.2,
    "algorithm.divergence_weighting": "paper",
}


def _dph_config(world, out, store, **extra):
    overrides = {**DPH, "reference.store": store, **extra}
    return load_config(None, tiny_overrides(world, out, **overrides))


def test_reference_responses_are_drawn_at_their_own_top_p(tiny_world, tmp_path, monkeypatch):
    calls = []
    real = presample_module._generate

    def spy(engine, prompts, params, *args, **kwargs):
        calls.append((params.n, params.top_p))
        return real(engine, prompts, params, *args, **kwargs)

    monkeypatch.setattr(presample_module, "_generate", spy)
    store = tmp_path / "store"
    cfg = _dph_config(tiny_world, tmp_path / "pre", store, **{"reference.response_top_p": 0.9})
    manifest = presample(cfg, reward_fn=parity_reward, progress=False)
    # the k presampled responses at top_p, the one extra (reference) response at 0.9
    assert calls == [(4, 0.95), (1, 0.9)]
    assert manifest["sampling"]["response_top_p"] == 0.9
    # a run that expects the reference responses at 0.95 is refused
    with pytest.raises(StoreMismatchError, match=r"reference.response_top_p: presampled with 0.9"):
        Trainer(_dph_config(tiny_world, tmp_path / "run", store))


def test_a_store_without_the_setting_drew_its_responses_at_top_p(
    tiny_world, reference_store, tmp_path
):
    # the session's store was presampled at 0.95 for every response
    with pytest.raises(StoreMismatchError, match=r"presampled with 0.95, this run has 0.9"):
        Trainer(
            _dph_config(tiny_world, tmp_path, reference_store, **{"reference.response_top_p": 0.9})
        )
    Trainer(_dph_config(tiny_world, tmp_path / "same", reference_store))


def test_response_top_p_is_checked():
    with pytest.raises(ConfigError, match=r"reference.response_top_p=1.5 must be in \(0, 1\]"):
        load_config(None, ["reference.response_top_p=1.5"])


def _dynamic(world, out, factor: int) -> Trainer:
    overrides = {
        "algorithm.dynamic_sampling": True,
        "algorithm.gen_batch_factor": factor,
        "algorithm.max_refill_rounds": 0,
        "train.prompts_per_step": 4,
        "rollout.n": 4,
        "rollout.max_new_tokens": 8,
    }
    return Trainer(
        load_config(None, tiny_overrides(world, out, **overrides)), reward_fn=sevens_reward
    )


@pytest.mark.parametrize("factor", [1, 3])
def test_a_round_generates_factor_times_the_prompts(factor, tiny_world, tmp_path):
    trainer = _dynamic(tiny_world, tmp_path, factor)
    sizes = []
    generate = trainer.experience.engine.generate

    def spy(prompt_ids, *args, **kwargs):
        sizes.append(len(prompt_ids))
        return generate(prompt_ids, *args, **kwargs)

    trainer.experience.engine.generate = spy
    exp, _, counts = trainer.experience.make(0)
    assert sizes == [4 * factor]  # one round (max_refill_rounds=0), factor x 4 prompts
    kept = counts["dapo/kept_groups"]
    assert kept <= 4  # groups beyond the step's prompts are not trained on
    assert exp is None or len(exp) == kept * 4


def test_gen_batch_factor_needs_dynamic_sampling():
    with pytest.raises(ConfigError, match=r"gen_batch_factor=3 needs algorithm\.dynamic_sampling"):
        load_config(None, ["algorithm.gen_batch_factor=3"])


def _never_informative(requests):
    return [0.0 for _ in requests]  # every group's rewards are equal: all dropped


@pytest.mark.parametrize("end", ["continue", "raise"])
def test_the_end_of_dynamic_sampling(end, tiny_world, tmp_path, caplog):
    overrides = {
        "algorithm.dynamic_sampling": True,
        "algorithm.max_refill_rounds": 1,
        "algorithm.refill_exhausted": end,
        "train.prompts_per_step": 4,
        "rollout.n": 4,
        "rollout.max_new_tokens": 8,
    }
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path, **overrides))
    trainer = Trainer(cfg, reward_fn=_never_informative)
    if end == "raise":  # as verl's recipe: an error after the last round
        with pytest.raises(RuntimeError, match=r"kept 0 of 4 .* after 2 generation rounds"):
            trainer.experience.make(0)
        return
    with caplog.at_level("WARNING", logger="divrl.training.experience"):
        exp, means, counts = trainer.experience.make(0)
    assert exp is None and counts["dapo/kept_groups"] == 0
    assert means["dapo/short_batch"] == 1.0
    assert "kept 0 of 4 informative groups" in caplog.text
