"""Named prompt templates: how an :class:`~divrl.data.Example` becomes the model's input text.

- ``plain`` (default): the prompt text as it is; chat messages are joined by blank lines
  (contents only, no role markers). For base models trained on raw text, such as the toy
  models.
- ``chat``: the tokenizer's own chat template with ``add_generation_prompt=True``; a
  string prompt becomes one user message. For instruction-tuned models.
- ``r1``: the DeepSeek-R1-Zero template: the model reasons inside ``<think> </think>`` and
  answers inside ``<answer> </answer>`` (the math verifier reads ``\\boxed{}`` or the
  answer tags). For "zero" RL from a base model.

Add one with :func:`register_template`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from divrl.data.loading import Example

TemplateFn = Callable[[Example, Any], str]
_TEMPLATES: dict[str, TemplateFn] = {}

R1_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question, and the "
    "Assistant solves it. The Assistant first thinks about the reasoning process in the "
    "mind and then provides the User with the answer. The reasoning process and answer are "
    "enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {prompt}\nAssistant:"
)


class TemplateError(ValueError):
    """A prompt cannot be rendered with the chosen template (unknown name, or a chat
    template the tokenizer does not have): an input error, reported in one line."""


def register_template(name: str, *, replace: bool = False) -> Callable[[TemplateFn], TemplateFn]:
    """Decorator registering ``fn(example, tokenizer) -> str`` as template ``name``.

    A name already taken is an error unless ``replace=True``: a second registration (a
    module imported twice under two names, or a typo that shadows ``plain``) would
    otherwise change every prompt rendered with that name without a word.
    """

    def decorator(fn: TemplateFn) -> TemplateFn:
        if name in _TEMPLATES and not replace and _TEMPLATES[name] is not fn:
            raise ValueError(
                f"prompt template {name!r} is already registered ({_TEMPLATES[name].__module__}"
                f".{_TEMPLATES[name].__qualname__}): pick another name, or pass replace=True"
            )
        _TEMPLATES[name] = fn
        return fn

    return decorator


def template_names() -> list[str]:
    return sorted(_TEMPLATES)


def prompt_text(example: Example) -> str:
    """The prompt as one string: chat message contents joined by blank lines."""
    if isinstance(example.prompt, str):
        return example.prompt
    return "\n\n".join(m["content"] for m in example.prompt)


def prompt_messages(example: Example) -> list[dict[str, Any]]:
    """The prompt as chat messages: a string prompt becomes one user message."""
    if isinstance(example.prompt, str):
        return [{"role": "user", "content": example.prompt}]
    return [dict(m) for m in example.prompt]


@register_template("plain")
def _plain(example: Example, tokenizer: Any = None) -> str:
    return prompt_text(example)


@register_template("chat")
def _chat(example: Example, tokenizer: Any = None) -> str:
    if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
        raise TemplateError("template 'chat' needs a tokenizer with apply_chat_template")
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            "data.template=chat: this model's tokenizer has no chat template; set "
            "data.template=plain or data.template=r1, or use a tokenizer that has one "
            "(tokenizer_config.json's chat_template)"
        )
    return tokenizer.apply_chat_template(
        prompt_messages(example), tokenize=False, add_generation_prompt=True
    )


@register_template("r1")
def _r1(example: Example, tokenizer: Any = None) -> str:
    return R1_TEMPLATE.format(prompt=prompt_text(example))


def render_prompt(example: Example, template: str = "plain", tokenizer: Any = None) -> str:
    """Render ``example`` with the named template (``plain``, ``chat``, ``r1``, ...)."""
    if template not in _TEMPLATES:
        raise TemplateError(
            f"unknown prompt template {template!r}; registered: {template_names()}"
        )
    return _TEMPLATES[template](example, tokenizer)
