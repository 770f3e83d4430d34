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
A phrase's answer loses bold markers and connective words ("the answer is therefore **7**"),
ends with its sentence, and a later phrase that only judges it ("so the answer is correct")
is skipped. After extraction the verifier scores a hedged answer 0 (:func:`hedge`), reads
alternatives as a set (:func:`alternatives_as_set`) and a number with its unit as the number
(:func:`number_before_unit`).
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
# words between the phrase and its answer: "the answer is therefore 7", "is indeed **7**"
_FILLER = re.compile(
    r"(?i)(?:therefore|thus|hence|so|then|indeed|clearly|simply|just|now|finally|exactly"
    r"|actually|equal\s+to|given\s+by|=|:|,)(?![\w])"
)
# "The answer is 7. Let me check: ...": the answer ends with its sentence
_SENTENCE_END = re.compile(r"(?<=[^\s.])\.\s+(?=[A-Z])")
_BOLD_END = re.compile(r"[*_]{1,3}(?=\.?\s*$)")  # "**7**." -> "7."
# "**42** cookies", "42** cookies" (the phrase took the opening "**"): 42 cookies
_BOLD_PAIR = re.compile(r"\*\*([^*\n]{1,200})\*\*|__([^_\n]{1,200})__")
_BOLD_AFTER_FIRST = re.compile(r"^([^\s*_]{1,100})(?:\*\*|__)(?=\s)")
# a phrase that judges an earlier answer ("... so the answer is correct."): not an answer
_SELF_CHECK = re.compile(
    r"(?i)(?:indeed\s+)?(?:correct|right|verified|confirmed|consistent|valid|checked|"
    r"reasonable|as\s+expected)\s*[.!]?"
)
_GSM8K_END = re.compile(r"####[ \t]{0,10}([^\n]{1,200})\s*\Z")
_BARE_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:[, ]\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
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


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}`` (or ``\\boxed x``, ``\\fbox{...}``),
    looking past an unclosed one. Used for gold answers (the converters take the last box
    of a MATH solution); scoring reads :func:`final_answer`."""
    return _last_box(text, closed=True)[0]


def _last_box(text: str, closed: bool = False) -> tuple[str | None, bool, int]:
    """(content, found, position) of the last box command (the last closed one when
    ``closed``); the one box scanner of the math verifiers and the converters.

    ``\\fbox`` is read only when the text has no ``\\boxed``, as the MATH grader's
    ``last_boxed_only_string`` does."""
    positions = []
    commands = _BOX_COMMANDS if "\\boxed" not in text else _BOX_COMMANDS[:1]
    for cmd in commands:
        end = len(text)
        for _ in range(_MAX_BOX_TRIES):
            pos = text.rfind(cmd, 0, end)
            if pos < 0:
                break
            positions.append((pos, cmd))
            end = pos
    for pos, cmd in sorted(positions, reverse=True)[:_MAX_BOX_TRIES]:
        content, is_box = _box_at(text, pos, cmd)
        if is_box and (content is not None or not closed):
            return content, True, pos
    return None, False, -1


def _phrase_answer(text: str) -> str | None:
    # the last phrase that states an answer: "so the answer is correct" after the answer
    # is a self-check, not a new answer
    for last in reversed(list(_PHRASE.finditer(text))):
        found = last.group(1)
        if not found.strip():  # "Final answer:" with the answer on the next line
            following = text[last.end() : last.end() + 500].lstrip("\n").split("\n", 1)[0]
            found = following
        # Minerva's "Final Answer: The final answer is $14$.": the innermost phrase
        inner = list(_PHRASE.finditer(found))
        while inner and inner[-1].group(1).strip():
            if _SELF_CHECK.fullmatch(_without_filler(inner[-1].group(1))):
                found = found[: inner[-1].start()]  # "7. Check: ..., so the answer is right."
                break
            found = inner[-1].group(1)
            inner = list(_PHRASE.finditer(found))
        found = _SENTENCE_END.split(_HOPE.sub("", found), maxsplit=1)[0]
        found = _without_filler(found)
        if not _SELF_CHECK.fullmatch(found):
            return found
    return None


def _without_filler(found: str) -> str:
    """The phrase's answer without bold markers and the connective words before it."""
    found = _BOLD_PAIR.sub(lambda m: m.group(1) or m.group(2), found)
    found = found.strip().strip("*_").strip()
    found = _BOLD_AFTER_FIRST.sub(lambda m: m.group(1), found)
    found = _BOLD_END.sub("", found)
    while True:
        m = _FILLER.match(found)
        if m is None or not found[m.end() :].strip():
            return found
        found = found[m.end() :].lstrip().lstrip("*_").lstrip()


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


# a trailing percent: "50\\%", "50%", "50 percent", "28 pct", "50 \\text{ percent}"
_TRAILING_PERCENT = re.compile(
    r"(?:\\%|%|\\(?:text|mbox|mathrm)\s{0,10}\{\s{0,10}(?:percent|pct)\s{0,10}\}"
    r"|\b(?:percent|pct))\Z"
)


def without_percent(answer: str) -> str | None:
    """``answer`` without its trailing percent (``\\%``, ``%``, ``percent``, ``pct``), or
    None when it has none. The MATH grader drops the sign: ``50\\%`` is compared as 50."""
    stripped = answer.rstrip()
    m = _TRAILING_PERCENT.search(stripped)
    return stripped[: m.start()].rstrip() if m else None


# Words and relations that make an answer a guess rather than a claim. An answer holding one
# scores 0 unless the gold holds it too ("about" in a gold written as text).
_HEDGE_WORDS = re.compile(
    r"(?i)\b(?:maybe|perhaps|possibly|probably|likely|approximately|approx|roughly|about"
    r"|around|nearly|almost|guess|unsure|not\s+sure)\b"
)
_HEDGE_RELATIONS = re.compile(
    r"\\(?:approx|approxeq|thickapprox|simeq|sim|thicksim)(?![A-Za-z])|\u2248"
)
# several rows (cases, array, aligned): a list of candidates unless the gold is one too
_ROWS = re.compile(r"\\begin\{(?:cases|array|aligned|align\*?|gathered|matrix)\}")
# "7 (or 8)", "7 \lor 8", "7 \vee 8": alternatives, read as the set {7, 8} like "7 or 8"
_PAREN_OR = re.compile(r"\(\s*or\s+([^()]{1,200})\)")
_LOGICAL_OR = re.compile(r"\\lor\b|\\vee\b|\u2228")
# text commands whose body math-verify drops as a unit ("7\text{ cm}" is 7), so a body
# naming an alternative ("7\text{ (or 3)}") must be read before math-verify sees it
_TEXT_COMMAND = re.compile(
    r"\\(?:text|textrm|textnormal|textit|textbf|textsf|texttt|mbox|hbox|mathrm|mathit"
    r"|mathbf|mathsf|operatorname)\s*(?=\{)"
)
_ALTERNATIVE = r"(?:or(?:\s+else)?|alternatively|alternately|otherwise)"
_ALTERNATIVE_WORD = re.compile(rf"(?i)\b{_ALTERNATIVE}\b")
_PAREN_ALTERNATIVE = re.compile(rf"(?i)\(\s*,?\s*{_ALTERNATIVE}\b[\s,:]*([^()]{{1,200}}?)\s*\)")
_WORD_ALTERNATIVE = re.compile(rf"(?i)\s*,?\s*\b{_ALTERNATIVE}\b[\s,:]*")
_MAX_TEXT_COMMANDS = 20


def hedge(answer: str, ground_truth: str) -> str | None:
    """Why ``answer`` is hedged (a guess or a list of candidates), or None.

    An uncertainty word (``maybe``, ``approximately``, ...), an approximate relation
    (``\\approx``, ``\\sim``) or a several-row environment (``cases``, ``array``, ...) that
    the gold does not hold itself makes the answer a hedge: it scores 0 whatever it names.
    """
    for pattern, what in (
        (_HEDGE_WORDS, "an uncertainty word"),
        (_HEDGE_RELATIONS, "an approximate relation"),
        (_ROWS, "a several-row environment"),
    ):
        m = pattern.search(answer)
        if m is not None and pattern.search(ground_truth) is None:
            return f"a hedged answer: {what} ({m.group(0)!r})"
    return None


def alternatives_as_set(answer: str) -> str:
    """``7 (or 8)``, ``7 \\lor 8`` -> ``7 \\text{ or } 8``: alternatives are a set, never one.

    Alternatives written in text commands are read too: ``7\\text{ (or 3)}``,
    ``7 \\text{ or 3}``, ``7 \\text{ (alternatively, 3)}`` -> ``7 \\text{ or } 3``.
    """
    answer = _text_alternatives(answer)
    answer = _PAREN_OR.sub(lambda m: f" \\text{{ or }} {m.group(1)}", answer)
    return _LOGICAL_OR.sub(lambda m: " \\text{ or } ", answer)


def _text_alternatives(answer: str) -> str:
    """Every text command's body spelled out when one of them names an alternative
    (``or``, ``alternatively``, ``otherwise``), each alternative word then written as
    ``\\text{ or }``; ``answer`` unchanged otherwise (``7\\text{ cm}``, ``\\text{(A)}``)."""
    bodies = []
    for m in list(_TEXT_COMMAND.finditer(answer))[:_MAX_TEXT_COMMANDS]:
        body = balanced_from(answer, m.end())
        if body is None:
            return answer
        bodies.append((m.start(), m.end() + len(body) + 2, body))
    if not any(_ALTERNATIVE_WORD.search(body) for _, _, body in bodies):
        return answer
    flat, last = [], 0
    for start, end, body in bodies:
        if start < last:  # a command nested in an earlier body: spelled out with it
            continue
        flat += [answer[last:start], " ", _text_alternatives(body), " "]
        last = end
    flat.append(answer[last:])
    text = re.sub(r"\s+", " ", "".join(flat))  # one space: the patterns below stay linear
    text = _PAREN_ALTERNATIVE.sub(lambda m: f" or {m.group(1)}", text)  # "(or 3)": " or 3"
    text = _WORD_ALTERNATIVE.sub(lambda m: " \\text{ or } ", text)
    return re.sub(r" +", " ", text).strip()


_NUMBER_WITH_UNIT = re.compile(
    r"\s*\$?\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s+[A-Za-z]{2,}(?:\s+[A-Za-z]{2,}){0,3}"
    r"\s*\.?\s*"
)


# words after a number that are mathematics, not a unit: "2 pi", "3 sqrt 2", "5 times 4"
_NOT_UNITS = re.compile(
    r"(?i)\b(?:pi|sqrt|root|roots|times|plus|minus|over|squared|cubed|percent|degrees?"
    r"|i|e|or|and|to)\b"
)


# a currency or unit symbol next to a number: "€12", "1,000.99€", "12m²", "12 cm³"
_NUMBER_WITH_SYMBOL = re.compile(
    r"\s*([€£¥₹]?)\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"
    r"\s*([€£¥₹]|(?:[kcmd]?m|in|ft|yd|mi)[²³])?\s*\.?\s*"
)


_DOLLARS = re.compile(r"\\?\$")


def number_before_unit(answer: str) -> str | None:
    """The number of ``7 dollars`` / ``$12 per hour`` / ``€12`` / ``12m²`` (word problems
    carry units), or None.

    None when a word after the number is mathematics (``2 pi``, ``5 times 4``) or a
    connective (``3 or 4``): those are compared as expressions.
    """
    answer = _DOLLARS.sub(" ", answer)  # "$42$ dollars", "\\$42.50": the number is the same
    symbol = _NUMBER_WITH_SYMBOL.fullmatch(answer)
    if symbol is not None and (symbol.group(1) or symbol.group(3)):
        return symbol.group(2).replace(",", "")
    m = _NUMBER_WITH_UNIT.fullmatch(answer)
    if m is None or _NOT_UNITS.search(answer[m.end(1) :]):
        return None
    return m.group(1).replace(",", "")
