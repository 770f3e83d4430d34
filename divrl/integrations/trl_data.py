"""Datasets and rewards for TRL that match divrl's: the same prompts, ids and verifiers.

- :func:`trl_dataset`: a divrl data file (verl schema) as a ``datasets.Dataset`` for TRL's
  ``GRPOTrainer``, with divrl's ``prompt_id`` column: the prompts ``divrl train`` /
  ``divrl presample`` would use with the same ``data.*`` settings (rendered with the same
  template, the same too-long prompts dropped).
- :func:`exploration_dataset`: keep the rows a DPH-RL run rolls out (the store's
  exploration prompts): one set lookup per row, the store read once.
- :func:`verifier_reward`: a TRL reward function that scores with divrl's verifiers.
- :func:`rollout_arguments`: what ``DivRLGRPOTrainer`` does with its ``train_dataset``
  (the exploration filter, applied for the user under DPH-RL).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from divrl.data.fingerprint import prompt_key
from divrl.data.prompts import PromptSettings, load_prompts
from divrl.data.reference_store import ReferenceStore
from divrl.data.store_checks import PROMPT_KEY

__all__ = [
    "UNSCORABLE_METRIC",
    "exploration_dataset",
    "rollout_arguments",
    "trl_dataset",
    "verifier_reward",
]

logger = logging.getLogger(__name__)


def trl_dataset(
    train_path: str | Path,
    tokenizer: Any,
    *,
    template: str = "plain",
    db_dir: str | None = None,
    limit: int | None = None,
    max_prompt_length: int = 512,
    truncation: str = "error",
    context: int | None = None,
) -> Any:
    """A ``datasets.Dataset`` of the prompts divrl trains on, for TRL's ``GRPOTrainer``.

    Pass the ``data.*`` settings of the config you presampled with: the prompts are loaded
    and filtered by the same code as ``divrl train`` (``divrl.data.prompts``; a prompt
    over ``max_prompt_length`` is an error, dropped or left-truncated per ``truncation``, as
    ``data.truncation``), so their ids are the store's. ``context``: the model's context in
    tokens (``model.config.max_position_embeddings``); a prompt that fills it, leaving no
    room for a completion, is refused here, as ``divrl train`` refuses it, rather than at
    TRL's first generation (None: not checked).

    Columns: ``prompt`` (the rendered prompt text), ``prompt_id`` (divrl's id),
    ``data_source``, ``ground_truth`` and ``extra_info`` (JSON strings: Arrow needs one type
    per column), which TRL passes on to :func:`verifier_reward`.
    """
    from datasets import Dataset

    settings = PromptSettings(
        template=template,
        limit=limit,
        max_prompt_length=max_prompt_length,
        truncation=truncation,
    )
    prompts, too_long = load_prompts(
        str(train_path), tokenizer, settings, db_dir=db_dir, context=context
    )
    dropped = too_long if truncation == "drop" else 0
    logger.info(
        "trl_dataset: %d prompts from %s (%d longer than max_prompt_length=%d: %s%s)",
        len(prompts),
        train_path,
        too_long,
        max_prompt_length,
        f"{dropped} dropped" if truncation == "drop" else "left-truncated",
        f"; limit={limit}" if limit else "",
    )
    return Dataset.from_dict(
        {
            "prompt": [tokenizer.decode(p.prompt_ids) for p in prompts],
            "prompt_id": [p.id for p in prompts],
            "data_source": [p.data_source for p in prompts],
            "ground_truth": [json.dumps(p.ground_truth) for p in prompts],
            "extra_info": [json.dumps(p.extra_info) for p in prompts],
        }
    )


def exploration_dataset(
    dataset: Any, store: str | Path | ReferenceStore, *, id_column: str = "prompt_id"
) -> Any:
    """The rows of ``dataset`` whose ``id_column`` is an exploration prompt of ``store``.

    A dataset without ``id_column`` (a TRL dataset of its own, with a ``prompt`` column of
    text or chat messages) is matched by the prompt itself: each row's
    :func:`divrl.data.fingerprint.prompt_key` against the one the store records per prompt
    (presample the same file). The store is read once and each row is one dict or set
    lookup (batched ``filter``). Prints how many rows it keeps and why the others go.

    Raises:
        ValueError: no row of ``dataset`` is in the store (another data set, or ids that
            are not divrl's: build the dataset with :func:`trl_dataset`), or the dataset
            has neither ``id_column`` nor ``prompt``, or the store records no prompt keys.
    """
    if not isinstance(store, ReferenceStore):
        store = ReferenceStore(store)
    keep, known = store.exploration_ids, set(store.prompts["prompt_id"])
    ids, id_column = _row_ids(dataset, store, id_column)
    unknown = sum(pid not in known for pid in ids)
    if unknown == len(ids):
        raise ValueError(
            f"none of the dataset's {len(ids)} prompt ids is in the reference store "
            f"{store.path} (e.g. {ids[:3]}): presample this data set, or build the dataset "
            "with divrl.integrations.trl.trl_dataset and the data settings of the presample"
        )
    if unknown:
        logger.warning(
            "%d of the dataset's %d prompts are not in the reference store %s (presampled on "
            "other data?); they are dropped with the near-perfect ones",
            unknown,
            len(ids),
            store.path,
        )
    if id_column not in dataset.column_names:  # derived: add it, as trl_dataset writes it
        dataset = dataset.add_column(id_column, ids)
    kept = dataset.filter(
        lambda batch: [str(pid) in keep for pid in batch[id_column]], batched=True
    )
    line = (
        f"DPH-RL keeps {len(kept)} of the dataset's {len(ids)} rows (the store's exploration "
        f"prompts): {len(ids) - len(kept) - unknown} are near-perfect prompts of {store.path} "
        f"(rehearsed from the store, not rolled out), {unknown} not in it"
    )
    logger.info(line)
    print(f"divrl: {line}", file=sys.stderr)
    return kept


def _row_ids(dataset: Any, store: ReferenceStore, id_column: str) -> tuple[list[str], str]:
    """Every row's prompt id in the store and the column to hold them: ``id_column`` as
    the dataset has it, else ids derived from the ``prompt`` column by the store's
    per-prompt keys (a row whose prompt the store lacks gets its key, which no id equals),
    for the caller to add as ``id_column``."""
    if id_column in dataset.column_names:
        return [str(pid) for pid in dataset[id_column]], id_column
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"the dataset has neither a {id_column!r} column (divrl's prompt ids) nor a "
            "'prompt' column to find its rows in the reference store by: build it with "
            "divrl.integrations.trl.trl_dataset or pass id_column="
        )
    keys = store.prompts.get(PROMPT_KEY)
    if keys is None:
        raise ValueError(
            f"the reference store {store.path} records no per-prompt keys (written by an "
            f"older divrl), so a dataset without a {id_column!r} column cannot be matched to "
            "it: presample again (divrl presample ... --overwrite)"
        )
    by_key = dict(zip(keys, (str(p) for p in store.prompts["prompt_id"]), strict=True))
    ids = [by_key.get(key, key) for key in map(prompt_key, dataset["prompt"])]
    return ids, id_column


def rollout_arguments(args: tuple, kwargs: dict[str, Any], id_column: str = "prompt_id") -> tuple:
    """``GRPOTrainer``'s arguments with ``train_dataset`` cut to the store's exploration
    prompts (:func:`exploration_dataset`) when the config asks for it: DPH-RL
    (``divergence`` set) with ``rollout_prompts="exploration"``. Returns the positional
    arguments; ``kwargs`` is updated in place.

    Raises:
        ValueError: the dataset has no ``id_column`` (divrl's prompt ids), or none of its
            rows is an exploration prompt of the store.
    """
    import inspect

    from trl import GRPOTrainer

    bound = inspect.signature(GRPOTrainer.__init__).bind_partial(None, *args, **kwargs)
    config, data = bound.arguments.get("args"), bound.arguments.get("train_dataset")
    dph = getattr(config, "divergence", None) is not None
    if not dph or getattr(config, "rollout_prompts", "all") != "exploration" or data is None:
        return args
    columns = getattr(data, "column_names", None) or []
    if id_column not in columns and "prompt" not in columns:
        raise ValueError(
            "DPH-RL rolls out only the reference store's exploration prompts, found by the "
            f"dataset's {id_column!r} column (divrl's prompt ids) or its 'prompt' column, "
            "both of which train_dataset lacks: build it with "
            "divrl.integrations.trl.trl_dataset (or add the column), or set "
            "rollout_prompts='all' to roll out every row"
        )
    kept = exploration_dataset(data, config.reference_store, id_column=id_column)
    if len(kept) == 0:
        raise ValueError(
            f"none of the dataset's {len(data)} prompts is an exploration prompt of the "
            f"reference store {config.reference_store} (all near-perfect): presample with a "
            "higher reference.threshold, or set rollout_prompts='all'"
        )
    logger.info("DPH-RL rolls out %d of the dataset's %d prompts", len(kept), len(data))
    bound.arguments["train_dataset"] = kept
    kwargs.clear()
    kwargs.update(bound.kwargs)
    return bound.args[1:]


#: the metric verifier_reward logs through TRL's ``log_metric``: the batch's unscorable share
UNSCORABLE_METRIC = "reward/unscorable"


def verifier_reward(
    completions: list[Any],
    data_source: list[str],
    ground_truth: list[str],
    extra_info: list[str],
    **kwargs: Any,
) -> list[float | None]:
    """TRL reward function: divrl's verifiers (``divrl.rewards.score_batch``) on the
    columns :func:`trl_dataset` writes. Conversational completions are scored on the text
    of their last message.

    An unscorable completion (a verifier timeout, a crashed worker, a verifier error:
    :data:`~divrl.rewards.types.UNSCORABLE_REASONS`) gets ``None``: TRL then keeps it out of
    its group's mean and std and gives it advantage 0 (when every reward function returns
    None for it). The share of unscorable completions is logged as ``reward/unscorable``
    through TRL's ``log_metric``; :class:`~divrl.integrations.trl.DivRLGRPOTrainer` stops a
    run whose share exceeds ``max_unscorable``.
    """
    from divrl.rewards import ScoreRequest, score_batch

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    requests = [
        ScoreRequest(source, text, json.loads(truth), json.loads(info))
        for text, source, truth, info in zip(
            texts, data_source, ground_truth, extra_info, strict=True
        )
    ]
    results = score_batch(requests).results
    log_metric = kwargs.get("log_metric")
    if log_metric is not None:
        log_metric(UNSCORABLE_METRIC, sum(r.unscorable for r in results) / max(1, len(results)))
    return [None if r.unscorable else float(r.score) for r in results]
