r"""The final answer of a math completion, and the equivalences the training profiles add.

Extraction (the training profiles ``math`` and ``gsm8k``; first rule that finds something):

1. The LAST box: ``\boxed{...}``, ``\boxed {...}`` (spaces before the brace),
   ``\fbox{...}`` or ``\boxed 5`` (to the next space or ``$``), as the MATH grader's
   ``last_boxed_only_string`` reads it. A self-correction ("\boxed{2} ... so \boxed{3}")
   answers 3. A last box that is never closed is a cut-off answer: no answer. A non-empty
   ``<answer>`` tag opened after the last box wins over it (a draft box while thinking).
2. The last ``<answer>...</answer>`` tag (unclosed: to the end of the text, as a rollout
   stopped at a ``</answer>`` stop string ends); an answer phrase inside it is unwrapped.
3. The last answer phrase: "final answer is X", "the answer is X", "Answer: X" (X to the
   end of its line; "I hope it is correct", ``$`` and a full stop removed).
4. GSM8K's ``#### X`` ending.
5. The whole completion, when it is nothing but a number or one ``$...$``/``\(...\)``/
   ``\[...\]`` span.

Nothing else: there is no last-number fallback, so "either 7 or 8" is no answer.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MAX_BOX_TRIES = 5  # bounded look-back over malformed boxes keeps extraction linear
_TAG_OPEN, _TAG_CLOSE = "<answer>", "</answer>"
_PHRASE = re.compile(
    r"(?i)(?:\b(?:final|the)\s{1,10}answer[ \t*]{0,10}(?:is\b[ \t]{0,10}:?|:)"
    r"|\banswer[ \t*]{0,10}:)[ \t*]{0,10}([^\n]{0,500})"
)
_HOPE = re.compile(r"(?i)\.?\s*I hope it is correct\.?\s*$")
_GSM8K_END = re.compile(r"####[ \t]{0,10}([^\n]{1,200})\s*\Z")
_BARE_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# digit groups split by a thin space, a LaTeX space, a tie or a plain space: 1\,000 -> 1000
_SPACED_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\\,|\\ |~|\\;| )\d{3})+(?![\d])")
_THOUSANDS_SEP = re.compile(r"\\,|\\ |~|\\;| ")
_TRAILING_POINT = re.compile(r"(?<=\d)\.\s*$")


def balanced_from(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == '{'``, or None if unclosed."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def _box_at(text: str, pos: int, cmd: str) -> tuple[str | None, bool]:
    """(content, is_a_box) of the box command at ``pos``; content None when unclosed."""
    rest = pos + len(cmd)
    brace = rest
    while brace < len(text) and text[brace] in " \t":
        brace += 1
    if brace < len(text) and text[brace] == "{":
        return balanced_from(text, brace), True
    if brace > rest:  # "\boxed 5": the answer runs to the next whitespace or "$"
        m = re.match(r"[^\s$]+", text[brace : brace + 1000])
        if m:
            return m.group(0), True
    return None, False


def last_box(text: str) -> tuple[str | None, bool]:
    """(content of the last box, whether a box was found); content None when cut off."""
    content, is_box, _ = _last_box(text)
    return content, is_box


def _last_box(text: str) -> tuple[str | None, bool, int]:
    positions = []
    for cmd in _BOX_COMMANDS:
        end = len(text)
        for _ in range(_MAX_BOX_TRIES):
            pos = text.rfind(cmd, 0, end)
            if pos < 0:
                break
            positions.append((pos, cmd))
            end = pos
    for pos, cmd in sorted(positions, reverse=True)[:_MAX_BOX_TRIES]:
        content, is_box = _box_at(text, pos, cmd)
        if is_box:
            return content, True, pos
    return None, False, -1


def _phrase_answer(text: str) -> str | None:
    last = None
    for m in _PHRASE.finditer(text):
        last = m
    if last is None:
        return None
    found = last.group(1)
    if not found.strip():  # "Final answer:" with the answer on the next line
        following = text[last.end() : last.end() + 500].lstrip("\n").split("\n", 1)[0]
        found = following
    # Minerva's "Final Answer: The final answer is $14$.": the innermost phrase
    inner = list(_PHRASE.finditer(found))
    while inner and inner[-1].group(1).strip():
        found = inner[-1].group(1)
        inner = list(_PHRASE.finditer(found))
    return _HOPE.sub("", found)


def _last_tag(text: str) -> tuple[str, int] | None:
    """(content of the last ``<answer>`` tag, where it opens), or None."""
    lower = text.lower()
    opened = lower.rfind(_TAG_OPEN)
    if opened < 0:
        return None
    # an unclosed last tag runs to the end: engines drop a "</answer>" stop string
    close = lower.find(_TAG_CLOSE, opened)
    content = text[opened + len(_TAG_OPEN) : close if close >= 0 else len(text)]
    phrase = _phrase_answer(content)
    return (phrase if phrase is not None else content), opened


def _unwrap(text: str) -> str:
    text = text.strip()
    for left, right in _WRAPPERS:
        inner = text[len(left) : len(text) - len(right)]
        if (
            len(text) > len(left) + len(right)
            and text.startswith(left)
            and text.endswith(right)
            and left not in inner
        ):
            return inner.strip()
    return text


def _whole_answer(text: str) -> str | None:
    """The completion itself when it is only an answer (a number or one math span)."""
    stripped = text.strip().rstrip(".").strip()
    if _BARE_NUMBER.fullmatch(stripped):
        return stripped
    unwrapped = _unwrap(stripped)
    if unwrapped != stripped and "$" not in unwrapped:
        return unwrapped
    return None


def final_answer(text: str) -> tuple[str | None, str]:
    """(the final answer, how it was found) under the rules of the module docstring.

    ``how`` is ``box``, ``cut_off_box``, ``answer_tag``, ``phrase``, ``gsm8k``, ``whole``
    or ``none``; the answer is None for ``cut_off_box`` and ``none``.
    """
    content, is_box, box_pos = _last_box(text)
    tag = _last_tag(text)
    # a tag written after the last box (a draft box while thinking) holds the answer
    tag_later = tag is not None and tag[1] > box_pos and tag[0].strip()
    if is_box and not tag_later:
        return (content, "box") if content is not None else (None, "cut_off_box")
    if tag is not None and tag[0].strip():
        return tag[0], "answer_tag"
    phrase = _phrase_answer(text)
    if phrase is not None and phrase.strip():
        return phrase, "phrase"
    m = _GSM8K_END.search(text[-400:])
    if m:
        return m.group(1), "gsm8k"
    whole = _whole_answer(text)
    return (whole, "whole") if whole is not None else (None, "none")


def normalise_answer(answer: str) -> str:
    """Clean an extracted answer before math-verify parses it.

    Outer ``$``/``\\(``/``\\[`` and a final full stop go; digit groups separated by a thin
    space (``1\\,000``), a LaTeX space, a tie or a plain space are joined (math-verify
    reads ``1\\,000`` as a product). Commas are left to math-verify, which already reads
    ``1,000`` as 1000 and ``32, 349`` as two numbers.
    """
    answer = _unwrap(answer.strip().rstrip(".").strip())
    answer = _TRAILING_POINT.sub("", answer)
    return _SPACED_THOUSANDS.sub(lambda m: _THOUSANDS_SEP.sub("", m.group(0)), answer)


def without_percent(answer: str) -> str | None:
    """``answer`` with a trailing percent sign removed (the MATH grader drops it), or None."""
    stripped = answer.rstrip()
    for sign in ("\\%", "%"):
        if stripped.endswith(sign):
            return stripped[: -len(sign)].rstrip()
    return None
