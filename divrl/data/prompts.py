"""Training prompts: a verl-schema file rendered with a template and tokenised, the
prompts over the length limit dropped, left-truncated or refused.

The one prompt loader of ``divrl train``, ``divrl presample`` and the TRL adapter, so that
the same ``data.*`` settings give the same prompts and ids everywhere (a reference store
written by presampling is matched to the training prompts by these ids).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from divrl.data.fingerprint import prompt_key
from divrl.data.loading import load_examples
from divrl.data.templates import render_prompt

__all__ = [
    "TRUNCATIONS",
    "NoUsablePromptsError",
    "PromptItem",
    "PromptLengthError",
    "PromptSettings",
    "load_prompts",
]

logger = logging.getLogger(__name__)


class NoUsablePromptsError(ValueError):
    """Every training row was dropped (the message says how many and by which setting)."""


class PromptLengthError(ValueError):
    """Prompts over ``data.max_prompt_length`` with ``data.truncation=error``."""


@dataclass
class PromptItem:
    """A tokenised training prompt with what its verifier needs."""

    id: str
    prompt_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] | None = None
    #: the prompt's :func:`divrl.data.fingerprint.prompt_key` (the store records it)
    key: str | None = None


TRUNCATIONS = ("error", "drop", "left")


@dataclass
class PromptSettings:
    """The ``data.*`` settings the loader reads, with ``divrl train``'s defaults (its
    ``DataConfig`` has the same fields and is passed as it is)."""

    template: str = "plain"
    limit: int | None = None
    skip_invalid: bool = False
    max_prompt_length: int = 1024
    truncation: str = "error"

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"truncation={self.truncation!r}: choose one of {list(TRUNCATIONS)}")
        if self.max_prompt_length < 1 or (self.limit is not None and self.limit < 1):
            raise ValueError(
                f"max_prompt_length={self.max_prompt_length} and limit={self.limit} must be "
                "positive (limit=None: every row)"
            )


def load_prompts(
    path: str,
    tokenizer: Any,
    data: PromptSettings,
    *,
    db_dir: str | None = None,
    max_new_tokens: int | None = None,
    context: int | None = None,
) -> tuple[list[PromptItem], int]:
    """Tokenised prompts of ``path`` and the number longer than ``data.max_prompt_length``
    (dropped or left-truncated per ``data.truncation``; ``error`` raises when any is).
    ``max_new_tokens`` (``rollout.max_new_tokens``) only completes the error message.
    ``context``: the model's context in tokens; a prompt that fills it (no room for one
    response token) is refused here, when the prompts are loaded, not at the first rollout.

    Raises:
        PromptLengthError: ``data.truncation=error`` and some prompts are too long (the
            message gives their count, the longest and the settings that change it), or a
            kept prompt leaves no room in ``context``.
        NoUsablePromptsError: no prompt is left; the message says how many rows were read
            and which setting dropped them.
    """
    examples = load_examples(path, db_dir=db_dir, limit=data.limit, skip_invalid=data.skip_invalid)
    items, too_long = [], []
    for ex in examples:
        text = render_prompt(ex, template=data.template, tokenizer=tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise PromptLengthError(
                f"{path}: the prompt of row id {ex.id!r} has no tokens (rendered with the "
                f"{data.template!r} template): give it a prompt, or leave the row out"
            )
        if len(ids) > data.max_prompt_length:
            too_long.append(len(ids))
            if data.truncation == "drop":
                continue
            ids = ids[-data.max_prompt_length :]  # 'left' (verl's truncation='left')
        items.append(
            PromptItem(
                str(ex.id),
                ids,
                ex.data_source,
                ex.ground_truth,
                ex.extra_info,
                prompt_key(ex.prompt),
            )
        )
    if too_long and data.truncation == "error":
        raise PromptLengthError(
            f"{len(too_long)} of {len(examples)} prompts in {path} are longer than "
            f"data.max_prompt_length={data.max_prompt_length} tokens (the longest has "
            f"{max(too_long)}): raise data.max_prompt_length, or set data.truncation=drop "
            "(leave them out) or data.truncation=left (keep their last max_prompt_length tokens)"
        )
    if not items:
        message = _no_prompts_message(data, path, len(examples), too_long, max_new_tokens)
        raise NoUsablePromptsError(message)
    _check_context(items, context, data, path)
    action = {"error": "refused", "drop": "dropped", "left": "left-truncated"}[data.truncation]
    # always reported, also when 0: a silent drop once hid most of a dataset
    (logger.warning if too_long else logger.info)(
        "%d of %d prompts longer than data.max_prompt_length=%d tokens (%s, data.truncation=%s)",
        len(too_long),
        len(examples),
        data.max_prompt_length,
        action,
        data.truncation,
    )
    return items, len(too_long)


def _check_context(
    items: list[PromptItem], context: int | None, data: PromptSettings, path: str
) -> None:
    """Refuse prompts that fill the model's ``context`` (None: not known, nothing checked)."""
    if context is None:
        return
    full = [len(item.prompt_ids) for item in items if len(item.prompt_ids) >= context]
    if full:
        raise PromptLengthError(
            f"{len(full)} of the prompts in {path} have {context} tokens or more (the longest "
            f"{max(full)}) and leave no room for a response in the model's context of "
            f"{context} tokens (config.max_position_embeddings), with data.max_prompt_length="
            f"{data.max_prompt_length}: set data.max_prompt_length below {context} (with "
            "data.truncation=drop or left), or use a model with a longer context"
        )


def _no_prompts_message(
    data: PromptSettings, path: str, rows: int, too_long: list[int], max_new_tokens: int | None
) -> str:
    where = f"no usable training prompts in {path}"
    if rows == 0:
        limit = f" with data.limit={data.limit}" if data.limit is not None else ""
        return f"{where}: it has no rows{limit}"
    context = "the model's context must hold it"
    if max_new_tokens is not None:
        context += f" plus rollout.max_new_tokens={max_new_tokens}"
    return (
        f"{where}: all {rows} rows were dropped by data.max_prompt_length="
        f"{data.max_prompt_length} with data.truncation=drop (their prompts, rendered "
        f"with the {data.template!r} template, have {min(too_long)} to "
        f"{max(too_long)} tokens): set data.max_prompt_length={max(too_long)} or more ("
        f"{context}), data.truncation=left, or shorten the prompts"
    )
