"""`divrl toy new NAME`: a new world's module on the scaffold, its presets and its
registration, usable as written (divrl/toy/world_template.py)."""

import sys
import types

import pytest

from divrl.cli import main
from divrl.toy.world_template import METHODS, PRESET_SCALE, entry_point_module
from divrl.toy.worlds import ENTRY_POINT_GROUP, WORLDS, get_world, world_names
from divrl.training.config import load_config


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A scratch folder as the working directory; the world and its module forgotten after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    WORLDS.pop("parity", None)
    sys.modules.pop("parity_world", None)


def test_a_new_world_builds_and_writes_its_presets_as_written(fresh, monkeypatch, capsys):
    assert main(["toy", "new", "parity", "--presets-out", "presets"]) == 0
    out = capsys.readouterr().out
    module = fresh / "parity_world.py"
    assert module.is_file() and f'parity = "{entry_point_module(module)}"' in out
    assert entry_point_module(module) == "parity_world" and ENTRY_POINT_GROUP in out
    for method in METHODS:  # its presets, at the scale its module declares
        cfg = load_config(fresh / "presets" / f"{method}.yaml")
        assert cfg.model.toy_world == "parity"
        assert cfg.rollout.max_new_tokens == PRESET_SCALE.max_new_tokens

    # the package's entry point, as the printed pyproject.toml lines declare it
    point = types.SimpleNamespace(name="parity", value="parity_world")
    monkeypatch.setattr(
        "importlib.metadata.entry_points",
        lambda group: [point] if group == ENTRY_POINT_GROUP else [],
    )
    assert "parity" in world_names() and "parity" not in WORLDS
    cache = str(fresh / "cache")
    argv = ["toy", "build", "--world", "parity", "--size", "tiny", "--quiet", "--cache-dir", cache]
    assert main(argv) == 0
    world = get_world("parity", cache, size="tiny", progress=False)
    assert list(world.splits) == ["train", "test", "ood_long"]
    rows = world.splits["ood_long"].read_text().splitlines()
    assert len(rows) == 4 and '"ground_truth": "' in rows[0]
    assert (world.model_dir / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["toy", "presets", "--world", "parity", "--out", "presets"]) == 0
    assert sorted(capsys.readouterr().out.split()[::2]) == ["unchanged"] * len(METHODS)


def test_new_refuses_bad_names_and_existing_files_in_one_line(fresh, capsys):
    for bad in ("Parity", "1world", "class", "sql"):
        assert main(["toy", "new", bad, "--presets-out", "p"]) == 2, bad
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and bad in err
    assert not any(fresh.iterdir())  # nothing written
    module = fresh / "parity_world.py"
    module.write_text("# mine\n")
    assert main(["toy", "new", "parity", "--presets-out", "p"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert module.read_text() == "# mine\n" and not (fresh / "p").exists()
    assert main(["toy", "new", "parity", "--presets-out", "p", "--overwrite"]) == 0
    assert "class ParityWorld(WorldScaffold)" in module.read_text()


def test_inside_divrl_the_module_leaves_its_registration_to_the_worlds_line():
    from divrl.toy.world_template import registration_line, render_world_module
    from divrl.toy.worlds import WorldKind

    text = render_world_module("parity", self_registering=False)
    compile(text, "parity_world.py", "exec")
    assert "register_world" not in text and "WORLD = ParityWorld()" in text
    entry = eval("{" + registration_line("parity") + "}", {"WorldKind": WorldKind})
    kind = entry["parity"]
    assert kind.scaffold == "divrl.toy.parity_world:WORLD" and kind.presets == "toy/parity"
    assert kind.methods == METHODS
    assert "register_world(" in render_world_module("parity", self_registering=True)
