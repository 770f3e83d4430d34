"""Every toy preset of one world hands its methods the same prompts: one data handling
(template, prompt limit, truncation, row limit) and one response limit per world, so a
comparison of methods on a world is like for like."""

from pathlib import Path

import pytest

from divrl.toy.presets import PresetScale
from divrl.toy.worlds import WORLDS, world_presets
from divrl.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def data_handling(path: Path) -> dict:
    cfg = load_config(path)
    d = cfg.data
    return {
        "template": d.template,
        "max_prompt_length": d.max_prompt_length,
        "truncation": d.truncation,
        "limit": d.limit,
        "skip_invalid": d.skip_invalid,
        "max_new_tokens": cfg.rollout.max_new_tokens,
    }


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_every_preset_of_a_world_handles_its_data_alike(world):
    presets = sorted((ROOT / "configs" / world_presets(world)).glob("*.yaml"))
    assert len(presets) >= 2, f"{world}: fewer than two presets to compare"
    seen: dict[tuple, list[str]] = {}
    for path in presets:
        seen.setdefault(tuple(sorted(data_handling(path).items())), []).append(path.stem)
    assert len(seen) == 1, f"{world}: presets differ in data handling: {seen}"


def test_a_preset_scale_refuses_an_unknown_truncation():
    assert PresetScale(max_prompt_length=8, max_new_tokens=8).truncation == "drop"
    with pytest.raises(ValueError, match="truncation"):
        PresetScale(max_prompt_length=8, max_new_tokens=8, truncation="right")
