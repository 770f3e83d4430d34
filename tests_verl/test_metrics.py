"""Unbiased Pass@k in verl's validation metrics."""

from __future__ import annotations

import math

import pytest

from divrl.evaluation.pass_at_k import pass_at_k
from divrl.integrations.verl.metrics import default_ks, pass_at_k_metrics, validation_metrics


def samples():
    # prompt a: 2 of 4 correct; prompt b: 0 of 4; prompt c (other source): 4 of 4
    sources = ["math"] * 8 + ["sql"] * 4
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    acc = [1, 0, 1, 0] + [0] * 4 + [1] * 4
    return sources, uids, {"acc": [float(v) for v in acc], "score": [float(v) for v in acc]}


def test_pass_at_k_is_the_unbiased_estimator_averaged_over_prompts():
    sources, uids, infos = samples()
    out = pass_at_k_metrics(sources, uids, infos)
    assert set(out["math"]["acc"]) == {"pass@1", "pass@2", "pass@4"}
    for k in (1, 2, 4):
        want = (pass_at_k(4, 2, k) + pass_at_k(4, 0, k)) / 2
        assert math.isclose(out["math"]["acc"][f"pass@{k}"], want)
    assert out["sql"]["acc"]["pass@4"] == 1.0
    assert math.isclose(out["math"]["acc"]["pass@2"], (1 - 1 / 6) / 2)  # C(2,2)/C(4,2) = 1/6


def test_merged_into_verls_validation_metrics():
    sources, uids, infos = samples()
    out = validation_metrics(sources, uids, infos)
    assert "mean@4" in out["math"]["acc"] and "pass@4" in out["math"]["acc"]
    # verl's trainer parses the sample count after '@' in every metric name
    for name in out["math"]["acc"]:
        int(name.split("@")[-1].split("/")[0])


def test_the_score_stands_in_for_acc_and_a_missing_one_is_an_error():
    sources, uids, infos = samples()
    only_score = {"score": infos["score"]}
    assert pass_at_k_metrics(sources, uids, only_score) == pass_at_k_metrics(sources, uids, infos)
    with pytest.raises(ValueError, match="'acc' or 'score'"):
        pass_at_k_metrics(sources, uids, {"reward": infos["acc"]})
    assert default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6]
