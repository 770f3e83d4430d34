"""docs/your_data.md's commands, in the page's order, on a fresh directory: the YAML files the
page writes, then every ``bash`` command, end in a report of DPH-JS, GRPO and Lp-Reg against
the base model.

The page is read as tests/test_readme.py reads the README (its ``readme_commands`` and small
settings); the "user's" data are a few rows of the tiny toy world in the flat form the page
shows, with its SQLite files as the user's databases, and the "user's" model is the toy
world's base model (a local folder), given as an override with the few settings it needs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your_data.md"

_spec = importlib.util.spec_from_file_location("_readme_test", ROOT / "tests" / "test_readme.py")
readme = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme)


def page_files(text: str) -> dict[str, str]:
    """The YAML blocks of the page that start with ``# PATH: ...``, by path."""
    files = {}
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        first = block.splitlines()[0]
        match = re.match(r"# (\S+\.yaml):", first)
        if match:
            files[match.group(1)] = block
    return files


def test_the_page_writes_one_config_per_method_over_the_users_file():
    files = page_files(PAGE.read_text())
    assert sorted(files) == [
        "my/mine.yaml",
        "my/mine_dph.yaml",
        "my/mine_grpo.yaml",
        "my/mine_lp_reg.yaml",
    ]
    commands = readme.readme_commands(PAGE.read_text())
    assert [shlex.split(c)[1] for c in commands] == ["data"] + ["presample"] + ["train"] * 3 + [
        "eval"
    ] * 4 + ["report"]


def _user_data(world, folder: Path) -> None:
    """``my/data/{train,test}.jsonl`` in the page's flat form and ``my/data/db``."""
    folder.mkdir(parents=True)
    (folder / "db").symlink_to(world.db_dir)
    for split, name, n in (("train", "train", 16), ("test", "test", 4)):
        rows = []
        for line in Path(world.splits[split]).read_text().splitlines()[:n]:
            row = json.loads(line)
            rows.append(
                {
                    "question": row["prompt"],
                    "answer": row["reward_model"]["ground_truth"],
                    "data_source": row["data_source"],
                    "db_id": row["extra_info"]["db_id"],
                }
            )
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _groups(config: str) -> list[str]:
    """Lp-Reg's virtual GPUs of the authors' selection, shrunk to the small batch (as
    tests/test_readme.py does for the presets)."""
    from divrl.training.config import load_config

    if load_config(config).algorithm.lp_reg_scope == "authors":
        return ["algorithm.lp_reg_group_size=4"]
    return []


@pytest.mark.slow
def test_the_pages_commands_take_your_data_to_a_report(tmp_path, monkeypatch):
    from divrl.cli import main
    from divrl.toy import ensure_toy_world

    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    world = ensure_toy_world(tmp_path / "toy", progress=False)  # the shipped base model
    work = tmp_path / "clone"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(work)
    text = PAGE.read_text()
    for path, body in page_files(text).items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(body)
    _user_data(world, work / "my" / "data")
    # the toy model in place of the page's hub id: no chat template, a 128-token context
    model = [
        f"model.path={world.model_dir}",
        "model.dtype=float32",
        "data.template=plain",
        "data.max_prompt_length=48",
    ]
    for command in readme.readme_commands(text):
        argv = shlex.split(command)[1:]
        if argv[0] in ("train", "presample"):
            argv = [*argv, *model, *_groups(argv[1]), *readme.TRAIN_SCALE]
        elif argv[0] == "eval":
            argv = [*argv, *model, *readme.EVAL_SCALE, "--no-progress"]
        elif argv[0] == "data":
            argv = [*argv, *model]
        assert main(argv) == 0, command
    report = (work / "reports/mine/report.md").read_text()
    headline = report.split("## Headline")[1].split("##")[0]
    for name in ("base", "DPH-JS", "GRPO", "Lp-Reg"):
        assert headline.count(f"| {name} |") == 1, report  # one eval set: test
    for run in ("mine_dph", "mine_grpo", "mine_lp_reg"):
        assert (work / "runs" / run / "eval" / "test" / "summary.json").is_file()
    assert (work / "runs/mine_dph/reference").is_dir()  # its own store, not the presets'
    assert not (work / "runs/dph_reference").exists()
