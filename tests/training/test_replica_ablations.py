"""``train.authors_replica_omit``: each ablation of the authors' batch assembly changes the
schedule of the scripts' step in the one way it names, and nothing else."""

from __future__ import annotations

import random

import pytest

from divrl.algorithms.dph_weighting import AuthorsLayout
from divrl.training.authors_assembly import schedule
from divrl.training.config import ConfigError, load_config


def _step(dynamic: bool, omit=(), seed: int = 0):
    rng = random.Random(seed)
    kinds = ["rollout"] * 2048 + ["reference"] * 256
    lengths = [rng.randint(1500, 4000) for _ in range(2048)]
    lengths += [rng.randint(1200, 3000) for _ in range(256)]
    tokens = [n - 1000 for n in lengths]  # response tokens: what the token-means count
    layout = AuthorsLayout(2048, 256, 2, gpus=8, micro_batch_size=2, dynamic=dynamic)
    plan = schedule(kinds, lengths, layout, 32384 if dynamic else None, omit=omit, tokens=tokens)
    return kinds, tokens, plan


def _rows(plan):
    return [[sum(len(mb.rows) for mb in gpu) for gpu in step] for step in plan]


def _references_under_policy(kinds, plan) -> int:
    return sum(
        kinds[r] == "reference"
        for step in plan
        for gpu in step
        for mb in gpu
        if not mb.reference
        for r in mb.rows
    )


@pytest.mark.parametrize("dynamic", [False, True])
def test_without_the_third_step_the_short_mini_batches_join_the_second(dynamic):
    _, _, full = _step(dynamic)
    _, _, plan = _step(dynamic, omit=["third_step"])
    assert _rows(full) == [[128] * 8, [128] * 8, [32] * 8]
    assert _rows(plan) == [[128] * 8, [160] * 8]
    # every row keeps its weight (sample share), only the optimiser steps change
    weight = {r: mb.scale / len(mb.rows) for s in full for g in s for mb in g for r in mb.rows}
    if not dynamic:  # fixed micro-batches: 1 / accumulation each, as before
        assert {mb.scale for s in plan for g in s for mb in g} == {1 / 64}
    else:
        assert {
            r: mb.scale / len(mb.rows) for s in plan for g in s for mb in g for r in mb.rows
        } == pytest.approx(weight)


def test_without_cloned_references_no_reference_row_gets_the_policy_loss():
    kinds, _, full = _step(dynamic=True)
    _, _, plan = _step(dynamic=True, omit=["cloned_references"])
    assert _references_under_policy(kinds, full) == 96
    assert _references_under_policy(kinds, plan) == 0
    # GPU 7's first mini-batch keeps its 32 rollouts, at their own weight; the 160 reference
    # rows of the later mini-batches still get the divergence
    assert sum(len(mb.rows) for mb in plan[0][7]) == 32
    assert sum(mb.scale for mb in plan[0][7]) == pytest.approx(32 / 128)
    divergence = sum(len(mb.rows) for s in plan for g in s for mb in g if mb.reference)
    assert divergence == 160
    assert _rows(plan)[1:] == _rows(full)[1:]


def test_without_micro_batch_scaling_each_micro_batch_weighs_its_tokens():
    _, tokens, full = _step(dynamic=True)
    _, _, plan = _step(dynamic=True, omit=["micro_batch_scaling"])
    per_row = sum(tokens) / len(tokens)
    for s_full, s_plan in zip(full, plan, strict=True):
        for g_full, g_plan in zip(s_full, s_plan, strict=True):
            assert [mb.rows for mb in g_plan] == [mb.rows for mb in g_full]
            for mb in g_plan:
                assert mb.scale == pytest.approx(sum(tokens[r] for r in mb.rows) / (per_row * 128))
    # the scales differ from the row shares (the lengths differ)
    assert any(
        abs(a.scale - b.scale) > 1e-3
        for sa, sb in zip(full, plan, strict=True)
        for ga, gb in zip(sa, sb, strict=True)
        for a, b in zip(ga, gb, strict=True)
    )


def test_replica_omit_errors():
    with pytest.raises(ValueError, match="unknown replica parts"):
        _step(dynamic=False, omit=["everything"])
    with pytest.raises(ConfigError, match=r"needs train\.batch_assembly=authors"):
        load_config(None, ["train.authors_replica_omit=[third_step]"])
    with pytest.raises(ConfigError, match="unknown part 'x'"):
        load_config(None, ["train.authors_replica_omit=[x]"])
