"""The ``authors`` weighting on the authors' 8 GPUs and on 16 (two nodes), fixed and dynamic
batch sizes, per optimiser step: against a layout of their rows enumerated here, row by row
(not the library's arithmetic), against the fractions written out by hand, and against the
replica's schedule (the per-step weights it applies)."""

from __future__ import annotations

import random

import pytest

from divrl.algorithms import AuthorsLayout, authors_effective_eta, authors_step_etas
from divrl.training.authors_assembly import schedule

ROLLOUTS, REFERENCES, MINI_BATCHES = 2048, 256, 2


def _their_steps(gpus: int, dynamic: bool) -> list[tuple[int, int]]:
    """(rollout rows, reference rows given the divergence) per optimiser step, from the rows
    themselves: rollouts then reference rows, DataProto.chunk over the GPUs, each GPU's rows
    split in order into mini-batches of 2048 / (2 x GPUs), micro-batches of 2 typed by their
    first row (fixed) or, under dynamic batch sizes, rollout-typed whenever their mini-batch
    holds a rollout."""
    rows = ["r"] * ROLLOUTS + ["f"] * REFERENCES
    per_gpu = len(rows) // gpus
    mini = ROLLOUTS // (MINI_BATCHES * gpus)
    steps: dict[int, list[int]] = {}
    for g in range(gpus):
        mine = rows[g * per_gpu : (g + 1) * per_gpu]
        for k in range(0, len(mine), mini):
            batch = mine[k : k + mini]
            count = steps.setdefault(k // mini, [0, 0])
            count[0] += batch.count("r")
            if dynamic:
                count[1] += 0 if "r" in batch else len(batch)
            else:
                count[1] += sum(len(batch[i : i + 2]) for i in range(0, len(batch), 2)
                                if batch[i] == "f")  # fmt: skip
    return [tuple(steps[k]) for k in sorted(steps)]


# (gpus, dynamic) -> (rollout rows, divergence rows) of each of the three steps, by hand:
# 8 GPUs: 288 rows each, mini-batches of 128; GPU 7 holds 32 rollouts + 96 reference rows,
# then 128, then 32 reference rows. 16 GPUs: 144 rows each, mini-batches of 64; GPU 14 holds
# 32 rollouts + 32 reference rows, then 64, then 16; GPU 15: 64, 64, 16 reference rows.
BY_HAND = {
    (8, False): [(7 * 128 + 32, 96), (7 * 128, 128), (7 * 32, 32)],
    (8, True): [(7 * 128 + 32, 0), (7 * 128, 128), (7 * 32, 32)],
    (16, False): [(14 * 64 + 32, 32 + 64), (14 * 64, 64 + 64), (14 * 16, 16 + 16)],
    (16, True): [(14 * 64 + 32, 64), (14 * 64, 64 + 64), (14 * 16, 16 + 16)],
}
# the whole batch: divergence rows / 2048 rollouts
BATCH = {(8, False): 256, (8, True): 160, (16, False): 256, (16, True): 224}


@pytest.mark.parametrize(("gpus", "dynamic"), sorted(BY_HAND))
def test_per_step_weights_on_8_and_16_gpus(gpus, dynamic):
    eta = 0.2
    steps = _their_steps(gpus, dynamic)
    assert steps == BY_HAND[(gpus, dynamic)]
    layout = AuthorsLayout(ROLLOUTS, REFERENCES, MINI_BATCHES, gpus=gpus, dynamic=dynamic)
    want = [eta * d / r for r, d in steps]
    assert authors_step_etas(eta, layout) == pytest.approx(want, abs=1e-12)
    assert authors_effective_eta(eta, layout) == pytest.approx(
        eta * BATCH[(gpus, dynamic)] / ROLLOUTS
    )
    # the numbers the docs give: 0.103 / 0.143 / 0.143 and 0 / 0.143 / 0.143 on 8 GPUs,
    # the first step 0.069 under dynamic batch sizes on 16; the batch 0.078 vs 0.109
    assert [round(w / eta, 3) for w in want][1:] == [0.143, 0.143]
    first = {(8, False): 0.103, (8, True): 0.0, (16, False): 0.103, (16, True): 0.069}
    assert round(want[0] / eta, 3) == first[(gpus, dynamic)]


@pytest.mark.parametrize(("gpus", "dynamic"), sorted(BY_HAND))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_replica_applies_the_per_step_weights(gpus, dynamic, seed):
    """The replica's schedule on BIRD-like lengths gives each step the counts above (its
    divergence rows are reference-typed micro-batches; each row weighs the same)."""
    rng = random.Random(seed)
    kinds = ["rollout"] * ROLLOUTS + ["reference"] * REFERENCES
    lengths = [rng.randint(1500, 4000) for _ in range(ROLLOUTS)]
    lengths += [rng.randint(1200, 3000) for _ in range(REFERENCES)]
    layout = AuthorsLayout(ROLLOUTS, REFERENCES, MINI_BATCHES, gpus=gpus, dynamic=dynamic)
    plan = schedule(kinds, lengths, layout, 32384 if dynamic else None)
    got = []
    for step in plan:
        mbs = [mb for gpu in step for mb in gpu]
        rollouts = sum(kinds[r] == "rollout" for mb in mbs for r in mb.rows)
        divergence = sum(len(mb.rows) for mb in mbs if mb.reference)
        got.append((rollouts, divergence))
    assert got == BY_HAND[(gpus, dynamic)]


def test_the_start_line_names_the_gpus_and_the_weights():
    from pathlib import Path

    from divrl.training.authors_config import authors_weight_line
    from divrl.training.config import load_config

    js = Path(__file__).resolve().parents[2] / "configs" / "dph_js.yaml"
    line = authors_weight_line(load_config(js))
    assert "authors_gpus=8" in line and "effective eta 0.01562" in line
    assert "their optimiser steps weigh the divergence 0, 0.02857, 0.02857" in line
    assert "divrl's assembly applies 0.01562 to each of its 2 optimiser steps" in line
    two_nodes = authors_weight_line(load_config(js, ["algorithm.authors_gpus=16"]))
    assert "authors_gpus=16" in two_nodes and "effective eta 0.02188" in two_nodes
    assert "0.01379, 0.02857, 0.02857" in two_nodes
    replica = authors_weight_line(load_config(js, ["train.batch_assembly=authors"]))
    assert "the replica applies them step by step" in replica
