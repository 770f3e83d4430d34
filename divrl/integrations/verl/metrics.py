"""divrl's unbiased Pass@k in verl's validation metrics.

verl's ``process_validation_metrics`` reports ``best@k`` as a bootstrap estimate (the mean
of the best of k samples redrawn with replacement), which is biased low against the
unbiased estimator of Chen et al. (2021) that the papers report. :func:`pass_at_k_metrics`
computes that one from the same inputs (per-sample ``acc``, or ``score`` at full credit,
grouped by data source and prompt uid) in verl's nested layout, so the two merge:
:func:`validation_metrics` is verl's function with ``pass@k`` added, which verl's trainer
then logs as ``val-core|val-aux/<data_source>/acc/pass@k``.

It also counts a training step's unscorable responses (:func:`unscorable_count`), which the
``divrl_sync`` trainer logs as ``reward/unscorable``, as ``divrl train`` does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from divrl.evaluation.pass_at_k import mean_pass_at_k
from divrl.rewards import is_correct

#: the metric ``divrl train`` logs for a step's responses without a verdict
UNSCORABLE_METRIC = "reward/unscorable"


def unscorable_count(queue: Any, batch: Any) -> int:
    """How many of a training step's responses got no verdict (a verifier timeout, a
    crashed worker, a verifier error): those whose reward extra info carries divrl's
    ``unscorable`` flag (its reward function writes it, whatever ``unscorable_score``
    says), or whose score is not finite (NaN, divrl's default score for them).

    ``queue``: TransferQueue's kv API (``kv_batch_get``); ``batch``: the step's
    ``KVBatchMeta``. verl's padding rows (``is_padding`` tags: copies of a real row) are
    left out. Reads the rows as verl's validation reads them (``rm_scores`` summed over
    tokens, ``extra_fields["reward_extra_info"]``).
    """
    keys = [k for k, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding")]
    if not keys:
        return 0
    data = queue.kv_batch_get(
        keys=keys, partition_id=batch.partition_id, select_fields=["rm_scores", "extra_fields"]
    )
    scores = data["rm_scores"].sum(dim=1).tolist()
    # a NonTensorStack or an array (verl's validation calls tolist()), or a LinkedList
    # (a list), by TransferQueue's backend
    extras = data["extra_fields"]
    extras = extras.tolist() if hasattr(extras, "tolist") else list(extras)
    count = 0
    for score, extra in zip(scores, extras, strict=True):
        info = extra.get("reward_extra_info", {}) if isinstance(extra, dict) else {}
        flagged = bool((info or {}).get("unscorable", 0.0))
        count += int(flagged or not np.isfinite(score))
    return count


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... below ``n``, and ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def _correct(infos: dict[str, Sequence[Any]], i: int) -> bool:
    if "acc" in infos:
        return float(infos["acc"][i]) >= 1.0
    if "score" in infos:
        return is_correct(float(infos["score"][i]))
    raise ValueError("pass@k needs a per-sample 'acc' or 'score' in the reward's extra infos")


def pass_at_k_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[str],
    infos_dict: dict[str, Sequence[Any]],
    ks: Sequence[int] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {"acc": {"pass@k": value}}}``: unbiased Pass@k averaged over prompts.

    ``ks`` defaults to 1, 2, 4, ... and the smallest number of samples of any prompt of
    the data source; a k above that number is left out for that data source.
    """
    if len(data_sources) != len(sample_uids):
        raise ValueError(f"{len(data_sources)} data sources but {len(sample_uids)} uids")
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        cell = counts[str(source)][str(uid)]
        cell[0] += 1
        cell[1] += int(_correct(infos_dict, i))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for source, prompts in counts.items():
        n = np.array([v[0] for v in prompts.values()])
        c = np.array([v[1] for v in prompts.values()])
        wanted = default_ks(int(n.min())) if ks is None else ks
        out[source] = {
            "acc": {f"pass@{k}": mean_pass_at_k(n, c, int(k)) for k in wanted if k <= n.min()}
        }
    return out


def validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[str],
    infos_dict: dict[str, Sequence[Any]],
    seed: int = 42,
    expected_acc_counts: dict | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """verl's ``process_validation_metrics`` (same arguments) with ``pass@k`` added."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    out = process_validation_metrics(
        list(data_sources),
        list(sample_uids),
        infos_dict,
        seed=seed,
        expected_acc_counts=expected_acc_counts,
    )
    for source, variables in pass_at_k_metrics(data_sources, sample_uids, infos_dict).items():
        out.setdefault(source, {}).setdefault("acc", {}).update(variables["acc"])
    return out
