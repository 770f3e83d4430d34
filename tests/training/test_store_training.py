"""A reference store that cannot be trained on stops `divrl train` with one line before the
first step, and a run whose every step skipped its update does not end as a success
(docs/reliability.md, "Reference store")."""

from __future__ import annotations

import logging

import pytest
from train_helpers import tiny_overrides

from divrl.cli import main
from divrl.data.reference_store import ReferenceStore, write_reference_store
from divrl.training.config import load_config
from divrl.training.presample import presample

DPH = {
    "reference.k": 4,
    "reference.per_step": 2,
    "algorithm.divergence": "js",
    "algorithm.divergence_coef": 0.2,
    "algorithm.divergence_weighting": "paper",
    "train.total_steps": 2,
}


def _overrides(tiny_world, out, store):
    return tiny_overrides(tiny_world, out, **{**DPH, "reference.store": store})


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("divrl train:")]
    return line


def _damaged_copy(store, path, edit):
    source = ReferenceStore(store)
    samples = source.samples
    edit(samples[0])
    rows = [
        dict(zip(source.prompts, r, strict=True))
        for r in zip(*source.prompts.values(), strict=True)
    ]
    return write_reference_store(path, samples, rows, dict(source.manifest))


def test_an_empty_store_is_a_warning_at_presample_and_one_line_at_train(
    tiny_world, tmp_path, caplog, capsys
):
    store = tmp_path / "store"
    overrides = _overrides(tiny_world, tmp_path / "run", store)
    with caplog.at_level(logging.WARNING):
        presample(
            load_config(None, overrides), reward_fn=lambda reqs: [0.0] * len(reqs), progress=False
        )
    warning = caplog.text
    assert "holds no reference samples (0 of 16 prompts near-perfect)" in warning
    assert "reference.threshold (now 4 of 4)" in warning
    assert "reference.keep_presampled=true" in warning and "--overwrite" in warning
    assert main(["train", *overrides]) == 2
    err = _one_line_error(capsys)
    assert f"the reference store {store} holds no samples" in err


@pytest.mark.parametrize(
    ("edit", "fault"),
    [
        (lambda s: s.ref_log_probs.__setitem__(0, float("nan")), "non-finite ref_log_probs"),
        (lambda s: s.ref_log_probs.pop(), "one ref_log_prob per response token"),
        (lambda s: s.response_ids.__setitem__(0, 500), "outside the model's vocabulary of 20"),
    ],
    ids=["nan", "short", "vocab"],
)
def test_a_store_that_cannot_be_trained_on_is_refused_with_one_line(
    tiny_world, reference_store, tmp_path, capsys, edit, fault
):
    bad = _damaged_copy(reference_store, tmp_path / "bad", edit)
    assert main(["train", *_overrides(tiny_world, tmp_path / "run", bad)]) == 2
    err = _one_line_error(capsys)
    assert f"{bad / 'samples.parquet'}: cannot be trained on" in err and fault in err
    assert "divrl presample CONFIG --overwrite" in err


def test_a_run_whose_every_step_was_skipped_exits_non_zero(
    tiny_world, reference_store, tmp_path, capsys, monkeypatch
):
    import divrl.training.update as update

    real = update.reference_divergence_loss

    def nan_loss(*args, **kwargs):  # what NaN reference log-probs did before the check
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(update, "reference_divergence_loss", nan_loss)
    code = main(["train", *_overrides(tiny_world, tmp_path / "run", reference_store)])
    err = capsys.readouterr().err
    assert code == 1
    assert "every one of the 2 steps skipped its optimiser update" in err


def test_a_store_smaller_than_a_step_is_a_warning(tiny_world, reference_store, tmp_path, caplog):
    from train_helpers import parity_reward

    from divrl.training.trainer import Trainer

    n = len(ReferenceStore(reference_store))
    settings = {**DPH, "reference.store": reference_store}
    caplog.set_level(logging.WARNING, logger="divrl.training.loading")
    for per_step, warned in ((n, False), (n + 1, True)):
        caplog.clear()
        config = load_config(
            None, tiny_overrides(tiny_world, tmp_path, **{**settings, "reference.per_step": per_step})
        )
        Trainer(config, reward_fn=parity_reward)
        said = " ".join(r.getMessage() for r in caplog.records)
        assert (f"reference.per_step={per_step} is larger than the {n} samples" in said) is warned
