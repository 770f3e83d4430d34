"""Seeds as an axis of ``divrl report``: several runs of one method, summarised across seeds.

``divrl report grpo=RUN_A,RUN_B,RUN_C`` (or ``grpo=RUN_A grpo=RUN_B ...``) makes the three
runs seeds of the method ``grpo``: each keeps its row (its numbers with their 95%
bootstrap intervals over prompts), and the method gets one more row, ``grpo: mean ± s.e.``,
with each number's mean over the seeds and its standard error::

    mean = (1/S) sum_s v_s,    s.e. = sqrt( sum_s (v_s - mean)^2 / (S - 1) ) / sqrt(S)

for the ``S`` seeds' values ``v_s`` (S >= 2). The per-prompt interval says how much a
number would move with other prompts; the standard error across seeds, how much with
another training run. The caption under the table says, per row, how many seeds and steps
it stands for ("3 seeds, 40 steps").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from divrl.evaluation.report_doc import ModelEval

__all__ = ["mean_se", "seed_caption", "seed_mean_row"]


def mean_se(values: Sequence[float]) -> tuple[float, float] | None:
    """(mean, standard error of the mean) of ``values`` (module docstring); None for
    fewer than two finite values."""
    kept = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(kept) < 2:
        return None
    mean = sum(kept) / len(kept)
    var = sum((v - mean) ** 2 for v in kept) / (len(kept) - 1)
    return mean, math.sqrt(var / len(kept))


def _fmt(values: Sequence[float | None], digits: int) -> str:
    got = mean_se([v for v in values if v is not None])
    return "-" if got is None else f"{got[0]:.{digits}f} ± {got[1]:.{digits}f}"


def seed_mean_row(members: Sequence[ModelEval], split: str) -> list[str]:
    """The headline row ``[set, "<method>: mean ± s.e.", greedy, P@1, P@n, styles, 1 style]``
    of one method's seeds on ``split`` (the set column left empty)."""
    present = [m.summaries[split] for m in members if split in m.summaries]
    n = min(int(s["ks"][-1]) for s in present)
    div = [s.get("diversity", {}) for s in present]
    return [
        "",
        f"{members[0].method}: mean ± s.e. ({len(present)} seeds)",
        _fmt([s.get("greedy_accuracy") for s in present], 3),
        _fmt([s["pass@k"].get("1") for s in present], 3),
        _fmt([s["pass@k"].get(str(n)) for s in present], 3) + f" (n = {n})",
        _fmt([d.get("mean_distinct_styles") for d in div], 2),
        _fmt([d.get("share_one_style") for d in div], 2),
    ]


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def seed_caption(models: Sequence[ModelEval]) -> str:
    """One clause per method: how many seeds (runs) and steps its rows stand for."""
    groups: dict[str, list[ModelEval]] = {}
    for m in models:
        groups.setdefault(m.method, []).append(m)
    parts = []
    for method, members in groups.items():
        steps = sorted({m.steps for m in members if m.steps is not None})
        if not steps:
            parts.append(f"{method}: evaluation only (no training run)")
            continue
        shown = "/".join(str(s) for s in steps)
        parts.append(
            f"{method}: {_count(len(members), 'seed')}, {shown} step{'' if shown == '1' else 's'}"
        )
    return "Seeds and steps per method: " + "; ".join(parts) + "."
