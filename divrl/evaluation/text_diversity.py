"""Diversity of a prompt's samples that needs no style classifier: any data source.

Each measure is computed per prompt over its n sampled responses and averaged over prompts
by :func:`divrl.evaluation.summary.summarise`:

- **distinct-n** (Li et al., 2016): distinct word n-grams among all n-grams of the prompt's
  samples (1 = no n-gram repeats across or within samples; lower = more repetition);
- **self-BLEU** (Zhu et al., 2018, Texygen): BLEU-4 of each sample against the prompt's
  other samples as references, averaged (1 = identical samples; lower = more diverse);
  add-one smoothing of the 2- to 4-gram precisions (Lin and Och, 2004) keeps short
  responses from scoring 0;
- **answer clusters** and **answer entropy**: the number of distinct final answers (the
  equivalence clusters maj@k votes with: math-verify for math, result sets for SQL) among
  the samples with an answer, and the Shannon entropy in bits of their distribution
  (0 = every answer the same); samples without an answer the verifier could judge do not
  count;
- **trace clusters**: samples grouped by the similarity of their whole text (the reasoning
  trace and the answer): two samples are linked when the Jaccard similarity of their word
  bigram sets is at least :data:`TRACE_THRESHOLD`, and a cluster is a connected group of
  links. Numbers are masked first, so two traces that follow one route with other numbers
  are one cluster. This is the headline's "styles per prompt" when the data source has no
  style classifier.

Words are runs of letters, digits and ``_``, each other non-space character is a word of
its own, case is folded, and every number reads as ``0``.

**Math trace style** (:func:`math_trace_style`): for math data sources, the kinds of work a
solution shows, read from its text: ``code`` (a fenced code block or ``print(``),
``algebra`` (an equation or ``let``/``set`` naming a one-letter unknown), ``cases``
(``case 1``, ``case 2``, ...), ``arithmetic`` (an equation of numbers only), joined with
``+`` in that order; ``direct`` when the answer comes without any of them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "TRACE_THRESHOLD",
    "answer_entropy",
    "distinct_n",
    "math_trace_style",
    "self_bleu",
    "trace_clusters",
    "trace_words",
]

# Jaccard similarity of word-bigram sets at which two samples share a trace cluster; on
# the toy worlds it gave trace clusters closest to the style classifiers' counts
# (docs/evaluation.md).
TRACE_THRESHOLD = 0.7

_WORD = re.compile(r"\d+(?:\.\d+)?|\w+|[^\w\s]")
_NUMBER = re.compile(r"\d")


def trace_words(text: str) -> list[str]:
    """The words of ``text`` as every measure here reads them (module docstring)."""
    return ["0" if _NUMBER.match(w) else w.lower() for w in _WORD.findall(text)]


def _ngrams(words: Sequence[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Distinct n-grams / all n-grams over ``texts``; None when they hold no n-gram."""
    total: Counter = Counter()
    for text in texts:
        total.update(_ngrams(trace_words(text), n))
    count = sum(total.values())
    return len(total) / count if count else None


def _max_over_others(counters: Sequence[Counter]) -> dict[tuple, tuple[int, int, int]]:
    """n-gram -> (largest count, its sample, second largest count) over the samples, so
    that the largest count among the *other* samples is read in O(1)."""
    best: dict[tuple, tuple[int, int, int]] = {}
    for i, counts in enumerate(counters):
        for gram, c in counts.items():
            b = best.get(gram)
            if b is None:
                best[gram] = (c, i, 0)
            elif c > b[0]:
                best[gram] = (c, i, b[0])
            elif c > b[2]:
                best[gram] = (b[0], b[1], c)
    return best


def self_bleu(texts: Sequence[str], max_n: int = 4) -> float | None:
    """Mean BLEU-``max_n`` of each text against the others (module docstring); None for
    fewer than two texts or when every text is empty."""
    words = [trace_words(t) for t in texts]
    if len(words) < 2:
        return None
    orders = [[_ngrams(w, n) for w in words] for n in range(1, max_n + 1)]
    best = [_max_over_others(counters) for counters in orders]
    lengths = [len(w) for w in words]
    scores = []
    for i, hyp_len in enumerate(lengths):
        if hyp_len == 0:
            continue
        log_p = 0.0
        for n in range(max_n):
            counts = orders[n][i]
            matched = 0
            for gram, c in counts.items():
                top, owner, second = best[n][gram]
                matched += min(c, second if owner == i else top)
            total = sum(counts.values())
            smooth = 0 if n == 0 else 1
            if matched + smooth == 0:
                log_p = -math.inf
                break
            log_p += math.log((matched + smooth) / (total + smooth))
        others = [length for j, length in enumerate(lengths) if j != i]
        ref_len = min(others, key=lambda r: (abs(r - hyp_len), r))
        brevity = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
        scores.append(brevity * math.exp(log_p / max_n))
    return sum(scores) / len(scores) if scores else None


def trace_clusters(texts: Sequence[str], threshold: float = TRACE_THRESHOLD) -> list[int]:
    """Cluster id of each text (0, 1, ... in order of first member): connected groups of
    texts whose word-bigram sets have Jaccard similarity >= ``threshold``."""
    shingles = []
    for text in texts:
        words = ["<s>", *trace_words(text), "</s>"]
        shingles.append(set(itertools.pairwise(words)))
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if root(i) == root(j):
                continue
            a, b = shingles[i], shingles[j]
            if len(a & b) >= threshold * len(a | b):
                parent[root(j)] = root(i)
    ids: dict[int, int] = {}
    return [ids.setdefault(root(i), len(ids)) for i in range(len(texts))]


def answer_entropy(cluster_ids: Sequence[int]) -> tuple[int, float | None]:
    """(distinct answers, entropy in bits of their distribution) over the samples with an
    answer (cluster id >= 0); (0, None) when no sample has one."""
    counts = Counter(c for c in cluster_ids if c >= 0)
    total = sum(counts.values())
    if not total:
        return 0, None
    entropy = -sum(k / total * math.log2(k / total) for k in counts.values())
    return len(counts), max(entropy, 0.0)


_CODE = re.compile(r"```|\bprint\(")
_ALGEBRA = re.compile(
    r"(?<![\w\\])[a-zA-Z]\s*(?:=(?!=)|\^)|\b(?:let|set)\s+\$?[a-zA-Z]\b", re.IGNORECASE
)
_CASES = re.compile(r"\bcase\s*(?:\d|[ivx]+\b|\(?[a-d]\))", re.IGNORECASE)
_ARITHMETIC = re.compile(r"\d\s*[-+*/×÷^]\s*\(?\s*\d[^=\n]*=\s*-?\d")


def math_trace_style(text: str, extracted: str | None = None) -> str:
    """The kinds of work a math solution shows (module docstring)."""
    features = [
        name
        for name, pattern in (
            ("code", _CODE),
            ("algebra", _ALGEBRA),
            ("cases", _CASES),
            ("arithmetic", _ARITHMETIC),
        )
        if pattern.search(text)
    ]
    return "+".join(features) if features else "direct"
