"""`extends:` lists, and the run folder and reference store a config file gets by default."""

from pathlib import Path

import pytest
import yaml

from divrl.training.config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_extends_list_merges_left_to_right_and_the_file_overrides_all(tmp_path):
    _write(tmp_path / "a.yaml", {"train": {"total_steps": 3, "seed": 7}, "optim": {"lr": 0.5}})
    _write(tmp_path / "b.yaml", {"train": {"total_steps": 5}, "data": {"limit": 4}})
    top = _write(tmp_path / "top.yaml", {"extends": ["a.yaml", "b.yaml"], "optim": {"lr": 0.25}})
    cfg = load_config(top)
    # b over a (total_steps), a kept where b is silent (seed), the file over both (lr)
    assert (cfg.train.total_steps, cfg.train.seed, cfg.data.limit) == (5, 7, 4)
    assert cfg.optim.lr == 0.25
    reverse = _write(tmp_path / "rev.yaml", {"extends": ["b.yaml", "a.yaml"]})
    assert load_config(reverse).train.total_steps == 3


@pytest.mark.parametrize("bad", [[], [1], {"a": "b.yaml"}, [""]])
def test_an_extends_that_names_no_files_is_one_line(tmp_path, bad):
    top = _write(tmp_path / "top.yaml", {"extends": bad})
    with pytest.raises(ConfigError, match="must be the path of another config file or a list"):
        load_config(top)


def test_a_users_config_gets_its_own_run_folder_and_store(tmp_path):
    mine = _write(tmp_path / "mine.yaml", {"model": {"path": "my/model"}})
    dph = _write(
        tmp_path / "mine_dph.yaml", {"extends": [str(CONFIGS / "dph_js.yaml"), "mine.yaml"]}
    )
    preset = load_config(CONFIGS / "dph_js.yaml")
    assert preset.logging.output_dir == "runs/dph_js"  # the preset keeps its folders
    assert preset.reference_store == Path("runs/dph_reference")
    cfg = load_config(dph)
    assert cfg.model.path == "my/model" and cfg.algorithm.divergence == "js"
    assert cfg.logging.output_dir == "runs/mine_dph"
    assert cfg.reference_store == Path("runs/mine_dph/reference")
    assert load_config(mine).logging.output_dir == "runs/mine"
    # what the file or an override sets wins
    over = load_config(dph, ["logging.output_dir=elsewhere"])
    assert over.logging.output_dir == "elsewhere"
    assert over.reference_store == Path("elsewhere/reference")
    kept = load_config(dph, ["reference.store=shared"])
    assert (kept.logging.output_dir, kept.reference_store) == ("runs/mine_dph", Path("shared"))
    own = _write(tmp_path / "own.yaml", {"extends": "mine_dph.yaml", "reference": {"store": "s"}})
    assert (load_config(own).logging.output_dir, load_config(own).reference_store) == (
        "runs/own",
        Path("s"),
    )
    assert load_config(None).logging.output_dir == "runs/run"  # no file: the default


def test_every_shipped_preset_keeps_the_folder_it_names():
    for path in sorted(CONFIGS.rglob("*.yaml")):
        own = yaml.safe_load(path.read_text())
        assert load_config(path).logging.output_dir == own["logging"]["output_dir"], path
