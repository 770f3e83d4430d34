"""The regime map's world (experiments/lp_reg_regime.py): Lp-Reg's pull keeps the spark
where the predicted on-policy net push is upward, and only there."""

import torch

from experiments.lp_reg_regime import Cell, predict, train

STEPS = 12  # the spark's fate shows by then (the map runs 150)


def _spark(cell: Cell) -> float:
    torch.set_num_threads(1)
    return train(cell, seed=0, steps=STEPS)["spark"][-1]


def test_the_spark_departs_from_grpo_where_the_net_push_is_upward_and_not_elsewhere():
    up = Cell("on", "lp_oracle", 0.7, 0.5, 4.0)  # net push -0.87 + 4 (1/0.7 - 1) = +0.84
    down = Cell("on", "lp_oracle", 0.9, 0.5, 4.0)  # -0.87 + 4 (1/0.9 - 1) = -0.43
    assert predict(up.z, up.pass_rate, up.beta, up.method)["direction"] == "up"
    assert predict(down.z, down.pass_rate, down.beta, down.method)["direction"] == "down"
    grpo = _spark(Cell("on", "grpo", 0.7, 0.5, 0.0))
    assert grpo < 0.06 / 3  # GRPO extinguishes the spark (0.06 at the start)
    # up: the spark rises above its start, 10x above GRPO's (measured: ~0.5 vs ~0.017)
    assert _spark(up) > max(0.06, 10 * grpo)
    # down: it falls too, at most 2x GRPO's (measured: ~0.025 vs ~0.017)
    assert _spark(down) < min(0.06, 2 * _spark(Cell("on", "grpo", 0.9, 0.5, 0.0)))


def test_the_authors_selection_does_not_reach_the_spark_behind_the_noise_tail():
    # the tail's negative samples (each below the spark's probability, filtered by min-p)
    # fill the k = floor(0.01 N_neg) slots: nothing is regularised, the run is GRPO's
    authors = train(Cell("on", "lp_authors", 0.7, 0.5, 4.0), seed=0, steps=STEPS)
    grpo = train(Cell("on", "grpo", 0.7, 0.5, 0.0), seed=0, steps=STEPS)
    assert authors["acting_steps"] == 0
    assert authors["spark"] == grpo["spark"]
