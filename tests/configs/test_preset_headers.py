"""Each preset's header (its leading comment block) against its settings: wherever a header
states a value in one of the phrasings below, the loaded preset has that value."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from divrl.algorithms import authors_effective_eta
from divrl.training.authors_config import authors_layout
from divrl.training.config import Config, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(CONFIGS.glob("*.yaml")) + sorted(CONFIGS.glob("toy/**/*.yaml"))


def _gpus(c: Config, m: re.Match) -> bool:
    return c.algorithm.authors_gpus == int(m[1])


def _lr(c: Config, m: re.Match) -> bool:
    return c.optim.lr == float(m[1])


def _recipe_batch(c: Config, m: re.Match) -> bool:
    t = c.train
    return (t.prompts_per_step, t.mini_batch_size, t.num_mini_batches) == tuple(
        map(int, m.groups())
    )


def _recipe_rounds(c: Config, m: re.Match) -> bool:
    a = c.algorithm
    factor, prompts, rounds = map(int, m.groups())
    return (
        a.dynamic_sampling
        and (a.gen_batch_factor, a.max_refill_rounds + 1, a.refill_exhausted)
        == (factor, rounds, "raise")
        and prompts == 256  # the recipe's batch, as the full preset states it
    )


def _paper_strength(c: Config, m: re.Match) -> bool:
    eta_a = authors_effective_eta(1.0, authors_layout(c))
    return (
        c.algorithm.divergence_weighting == "paper"
        and round(eta_a, 3) == float(m[1])
        and round(1 / eta_a, 1) == float(m[2])
    )


#: (phrase with the stated value(s), what must hold of the loaded preset)
RULES: list[tuple[str, Callable[[Config, re.Match], bool]]] = [
    (r"over (\d+) virtual GPUs", _gpus),
    (r"(\d(?:\.\d+)?e-\d+) is what the toy-world prototype trained with", _lr),
    (r"(\d(?:\.\d+)?e-\d+) on this world", _lr),
    (r"default coefficient (0\.\d+)", lambda c, m: c.algorithm.kl_coef == float(m[1])),
    (r"coef from the Lp-Reg paper \((0\.\d+)", lambda c, m: c.algorithm.entropy_coef == float(m[1])),
    (r"the (\d+)% highest-entropy", lambda c, m: c.algorithm.loss_options["top_fraction"] == int(m[1]) / 100),
    (r"(\d+) prompts in mini-batches of (\d+) \((\d+) optimiser steps per batch\)", _recipe_batch),
    (r"dynamic sampling with (\d+) x (\d+) prompts per round and up to (\d+) rounds, then an error", _recipe_rounds),
    (r"1 / (0\.\d+) = (\d+\.\d)x the authors' balance", _paper_strength),
]  # fmt: skip


def _header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(" ".join(lines).split())


def _matches(path: Path):
    text = _header(path)
    return [(pattern, check, m) for pattern, check in RULES for m in re.finditer(pattern, text)]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_header_values_match_the_settings(path):
    config = load_config(path)
    for _pattern, check, match in _matches(path):
        assert check(config, match), f"{path.name}: the header says {match[0]!r}"


def test_the_rules_read_the_headers():
    """Every rule reads at least one header (a reworded header must update its rule)."""
    used = {pattern for path in PRESETS for pattern, _, _ in _matches(path)}
    assert used == {pattern for pattern, _ in RULES}
    assert sum(len(_matches(p)) for p in PRESETS) >= 30
