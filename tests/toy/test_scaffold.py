"""The world scaffold: a world with its own splits, sizes and targets, written in this file
alone, builds, caches, loads, measures and registers with one line; the SQL and countdown
worlds keep the cache keys their shipped models were built with."""

import dataclasses
import hashlib
import json
import random
from pathlib import Path
from typing import ClassVar

import pytest

from divrl.data import Example
from divrl.toy import worlds
from divrl.toy.model import ToyModelConfig
from divrl.toy.scaffold import MeasureTarget, WorldScaffold
from divrl.toy.sft import SFTConfig
from divrl.toy.tokenizer import ANSWER_MARKER


@dataclasses.dataclass(frozen=True)
class EchoConfig:
    n_train: int = 6
    n_hard: int = 3
    model: ToyModelConfig = dataclasses.field(
        default_factory=lambda: ToyModelConfig(
            hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_length=32
        )
    )
    sft: SFTConfig = dataclasses.field(
        default_factory=lambda: SFTConfig(steps=2, batch_size=4, warmup_steps=0, threads=1)
    )

    def to_dict(self):
        return dataclasses.asdict(self)


def _row(split: str, i: int, n: int) -> Example:
    return Example(
        id=f"{split}-{i}",
        prompt=f"{n}+0{ANSWER_MARKER}",
        data_source="toy_math",
        ground_truth=str(n),
        extra_info={"index": i, "split": split},
    )


class EchoWorld(WorldScaffold):
    name = "echo"
    sizes: ClassVar = {"full": EchoConfig(), "mini": EchoConfig(n_train=2, n_hard=1)}
    splits = ("train", "hard")
    targets = (MeasureTarget("hard", "pass@1", 0.5), MeasureTarget("hard", "pass@2", 0.1, 0.9))
    trained = 0

    def generate(self, out, final, seed, cfg):
        rng = random.Random(seed)
        rows = {
            "train": [_row("train", i, rng.randrange(10)) for i in range(cfg.n_train)],
            "hard": [_row("hard", i, rng.randrange(10, 99)) for i in range(cfg.n_hard)],
        }
        return rows, [r.ground_truth for r in rows["train"]]

    def train_model(self, model_dir, seed, cfg, generated, progress):
        EchoWorld.trained += 1
        corpus = [(f"{n}+0{ANSWER_MARKER}", n) for n in generated] * cfg.sft.batch_size
        return self.train_on(model_dir, corpus, cfg, seed, progress)


#: the instance the registration line names ("<module>:ECHO")
ECHO = EchoWorld()


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    cache = tmp_path_factory.mktemp("scaffold")
    return EchoWorld(), cache, EchoWorld().ensure(cache, size="mini", progress=False)


def test_a_scaffolded_world_builds_its_own_splits_and_caches(echo):
    scaffold, cache, world = echo
    assert list(world.splits) == ["train", "hard"]  # read back from world.json, in order
    assert world.root.name == f"echo-mini-seed0-{scaffold.key(0, 'mini', scaffold.sizes['mini'])}"
    manifest = world.manifest
    assert (manifest["world"], manifest["splits"]) == ("echo", {"train": 2, "hard": 1})
    assert [json.loads(line)["id"] for line in world.splits["hard"].read_text().splitlines()] == [
        "hard-0"
    ]
    assert (world.model_dir / "model.safetensors").is_file()
    trained = EchoWorld.trained
    assert scaffold.ensure(cache, size="mini", progress=False).root == world.root
    assert EchoWorld.trained == trained  # from the cache, not built again
    assert scaffold.load(world.root).splits == world.splits
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


def test_the_scaffold_names_what_is_wrong(echo, tmp_path):
    scaffold, cache, _ = echo
    with pytest.raises(ValueError, match=r"unknown echo world size 'huge'; choose one of \['full'"):
        scaffold.ensure(cache, size="huge")

    class Mislabelled(EchoWorld):
        splits = ("train", "test")

    with pytest.raises(ValueError, match=r"returned the splits \['train', 'hard'\].*'test'"):
        Mislabelled().ensure(tmp_path, size="mini", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing half-built left behind
    with pytest.raises(ValueError, match="ships no model"):
        scaffold.ship(echo[2])


def test_one_line_registers_a_scaffolded_world(echo, monkeypatch):
    _, cache, world = echo
    kind = worlds.WorldKind.scaffolded(f"{__name__}:ECHO", "digits", presets="toy/echo")
    monkeypatch.setitem(worlds.WORLDS, "echo", kind)
    assert worlds.get_world("echo", cache, size="mini", progress=False).root == world.root
    assert worlds.load_world(world.root).splits == world.splits  # kind from world.json
    assert worlds.eval_splits(world) == ["hard"]
    assert worlds.world_presets("echo") == "toy/echo"
    measured = {"splits": {"hard": {"pass@1": 0.25, "pass@2": 0.5}}}
    assert [check[3] for check in (t.check(measured) for t in EchoWorld.targets)] == [False, True]


def test_format_checks_the_worlds_targets_only():
    from divrl.toy.measure import format_measurements

    stats = {
        "prompts": 1,
        "samples_per_prompt": 2,
        "pass@1": 0.25,
        "pass@2": 0.5,
        "all_correct_share": 0.0,
        "distinct_styles": 1.0,
        "distinct_correct_styles": 1.0,
    }
    measured = {"splits": {"hard": stats}}
    assert "want" not in format_measurements(measured)  # no targets: the table only
    text = EchoWorld().format(measured)
    assert "MISS hard pass@1" in text and "OK   hard pass@2" in text


def measure_echo(world, *, n_samples, max_prompts, progress, reuse):
    return {"world": world, "n": n_samples}


def format_echo(measured):
    return f"echo measured with n={measured['n']}"


def test_a_world_with_measures_of_its_own_names_them():
    class Measured(EchoWorld):
        measure_with = f"{__name__}:measure_echo"
        format_with = f"{__name__}:format_echo"

    measured = Measured().measure("w", n_samples=3, max_prompts=1, progress=False, reuse=True)
    assert measured == {"world": "w", "n": 3}
    assert Measured().format(measured) == "echo measured with n=3"  # no targets table


def test_sql_and_countdown_keep_their_cache_keys():
    from divrl.toy import countdown_world, sql_world

    cfg = sql_world.SIZES["full"]
    blob = {"version": sql_world.BUILD_VERSION, "seed": 0, "size": "full", "config": cfg.to_dict()}
    legacy = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    assert sql_world.world_key(0, "full", cfg) == legacy
    assert sql_world.WORLD.folder(0, "full", legacy) == f"full-seed0-{legacy}"
    cfg = countdown_world.SIZES["tiny"]
    blob = {
        "world": "countdown",
        "version": "1",
        "seed": 3,
        "size": "tiny",
        "config": cfg.to_dict(),
    }
    legacy = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    assert countdown_world.world_key(3, "tiny", cfg) == legacy
    assert isinstance(Path(countdown_world.WORLD.pretrained_dir), Path)


def test_train_imports_the_world_module_that_registers_its_verifier(tmp_path, monkeypatch):
    """A world's module may register the profile of its rows' data source; ``divrl train``
    imports it for ``model.toy_world`` even when the demo gives the paths, so the training
    subprocess scores those rows."""
    from divrl.commands.train import with_toy_defaults
    from divrl.profiles import get_profile
    from divrl.rewards import registry
    from divrl.rewards.profiles import _PROFILES, _REGISTERED
    from divrl.training.config import load_config

    (tmp_path / "echo_world_module.py").write_text(
        "from divrl.profiles import BenchmarkProfile, register_profile\n"
        "register_profile(BenchmarkProfile('echo_rows', verifier=lambda s, g, e: 1.0))\n"
        "WORLD = None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    kind = worlds.WorldKind.scaffolded("echo_world_module:WORLD", "echo", presets="toy/echo")
    monkeypatch.setitem(worlds.WORLDS, "echo_mod", kind)
    cfg = load_config(None, ["model.toy_world=echo_mod", "model.path=m", "data.train_path=t"])
    assert get_profile("echo_rows") is None
    try:
        assert with_toy_defaults(cfg).model.path == "m"  # paths kept, module imported
        assert get_profile("echo_rows") is not None
    finally:
        _PROFILES.pop("echo_rows", None)
        _REGISTERED.discard("echo_rows")
        registry._REGISTRY.pop("echo_rows", None)
