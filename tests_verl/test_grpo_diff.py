"""docs/verl.md's "From a verl GRPO script": verl's GRPO command and the diffs that turn it
into DPH-JS and into Lp-Reg, read from the page, applied, counted, composed with verl's
Hydra config and run through ``main_ppo``'s ``main`` (verl's ``validate_config`` and
divrl's start-up gate) up to ``run_ppo``, which is replaced here."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## From a verl GRPO script"
#: (``-`` lines, ``+`` lines) of each diff, as the page counts them
COUNTS = {"**To DPH-JS**": (2, 10), "**To Lp-Reg**": (1, 8)}


def _block(text: str, after: str, fence: str) -> str:
    return text[text.index(after) :].split(f"```{fence}\n", 1)[1].split("```", 1)[0]


def _words(line: str, home: Path) -> list[str]:
    line = line.strip().removesuffix("\\").replace("$HOME", str(home))
    return shlex.split(line.replace("$STORE", "/nonexistent/store"))


def _diff(text: str, after: str, home: Path) -> tuple[list[str], list[str]]:
    removed, added = [], []
    for line in _block(text, after, "diff").splitlines():
        if line.startswith("-"):
            removed += _words(line[1:], home)
        elif line.startswith("+"):
            added += _words(line[1:], home)
        else:
            assert not line.strip(), f"{after}: a diff line without - or +: {line!r}"
    return removed, added


@pytest.mark.parametrize("method", list(COUNTS))
def test_the_documented_diffs_from_verls_grpo_script_pass_the_gate(
    main_ppo, capsys, tmp_path, method
):
    from divrl.integrations.verl.startup import startup_errors

    page = (ROOT / "docs" / "verl.md").read_text()
    text = page[page.index(SECTION) :]
    script = _block(text, SECTION, "bash").replace("\\\n", " ").replace("$HOME", str(tmp_path))
    words = shlex.split(script)
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    grpo = words[3:]
    removed, added = _diff(text, method, tmp_path)
    assert (len(removed), len(added)) == COUNTS[method]
    for line in removed:  # the diff applies to the script's command
        assert line in grpo, f"{method}: {line} is not a line of the GRPO command"
    overrides = [w for w in grpo if w not in removed] + added
    keys = [w.split("=", 1)[0].lstrip("+") for w in overrides]
    assert len(keys) == len(set(keys)), "a key set twice"
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert startup_errors(config) == []
    main_ppo.main(config)  # verl's validate_config, wrapped by divrl's gate
    assert main_ppo.started == ["run_ppo"]
    assert "divrl:" not in capsys.readouterr().err
    assert config.trainer.v1.trainer_mode == "divrl_sync"
    assert config.divrl.get("policy_loss", "vanilla") == (
        "lp_reg" if method == "**To Lp-Reg**" else "vanilla"
    )
