"""A toy world's own verifier, living only in the world's module (here: this test module),
is found through the world's registration by every ``divrl`` process that reads or scores
its rows: the rewards' lookup of an unknown data source asks the source finder of
:mod:`divrl.toy.worlds`, which imports the module of the world that declares it.

Two routes: a world registered by one line (``WORLDS`` or :func:`register_world`) whose
kind declares ``data_sources`` and names its module as a string (imported on demand), and a
world of another package, found by a fresh process through the ``divrl.toy_worlds`` entry
point (the demo's and the reproduction's subprocesses).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import divrl.rewards.profiles as profile_registry
import divrl.rewards.registry as verifier_registry
import divrl.toy.worlds as worlds
from divrl.profiles import BenchmarkProfile, get_profile, register_profile
from divrl.rewards import FunctionVerifier, get_verifier
from divrl.toy.worlds import ENTRY_POINT_GROUP, WorldKind, register_world

SOURCE = "ext_echo"  # rows whose response must repeat the ground truth
WORLD = "echo_world"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def echo_verifier(solution_str: str, ground_truth: str, extra_info: dict) -> float:
    return float(solution_str.strip() == ground_truth.strip())


def _no_build(*args, **kwargs):
    raise AssertionError("the echo world is never built: its rows are given as paths")


def register_profile_of(source: str) -> None:
    """The world's profile: the verifier scores in the caller's process (a function of a
    test module cannot go to a verifier worker)."""
    verifier = FunctionVerifier(echo_verifier, isolate=False)
    register_profile(BenchmarkProfile(source, verifier=verifier))


def register(source: str = SOURCE, world: str = WORLD) -> None:
    """What the module of a world of another package does when it is imported."""
    register_world(world, WorldKind(_no_build, _no_build, "echo", data_sources=(source,)))
    register_profile_of(source)


@pytest.fixture
def registries(monkeypatch):
    """The registries as they were, after the test (other tests go over every entry)."""
    for module, name in (
        (verifier_registry, "_REGISTRY"),
        (verifier_registry, "_CANONICAL"),
        (verifier_registry, "_SOUGHT"),
        (profile_registry, "_PROFILES"),
        (profile_registry, "_REGISTERED"),
    ):
        monkeypatch.setattr(module, name, type(getattr(module, name))(getattr(module, name)))
    monkeypatch.setattr(worlds, "WORLDS", dict(worlds.WORLDS))


def _plugin(folder: Path, module: str, call: str) -> None:
    """A module that runs ``call`` of this test module when imported, as a world's module
    registers what it defines."""
    (folder / f"{module}.py").write_text(
        f"import test_world_verifier\ntest_world_verifier.{call}\n"
    )


def test_a_declared_data_source_imports_its_world_module(tmp_path, monkeypatch, registries):
    _plugin(tmp_path, "lazy_echo_world", "register_profile_of('lazy_echo')")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delitem(sys.modules, "lazy_echo_world", raising=False)
    # the one registration line of a built-in world: the module named, not imported
    kind = WorldKind("lazy_echo_world:build", "lazy_echo_world:load", data_sources=("lazy_echo",))
    register_world("lazy_world", kind)
    assert "lazy_echo_world" not in sys.modules
    name, verifier = get_verifier("Lazy_Echo")  # the lookup imports the world's module
    assert name == "lazy_echo" and "lazy_echo_world" in sys.modules
    assert verifier.quick(" 42 ", "42", {}).score == 1.0
    assert get_profile("lazy_echo").verifier is not None
    # a source no world declares is still an error naming the registered ones
    with pytest.raises(ValueError, match="unknown data_source 'no_such_source'"):
        get_verifier("no_such_source")


def test_a_world_of_an_entry_point_is_found_by_name_and_by_source(
    tmp_path, monkeypatch, registries
):
    _plugin(tmp_path, "echo_world_plugin", "register()")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delitem(sys.modules, "echo_world_plugin", raising=False)
    point = types.SimpleNamespace(name=WORLD, value="echo_world_plugin")
    monkeypatch.setattr(
        "importlib.metadata.entry_points",
        lambda group: [point] if group == ENTRY_POINT_GROUP else [],
    )
    assert WORLD in worlds.world_names() and WORLD not in worlds.WORLDS
    assert get_verifier(SOURCE)[0] == SOURCE  # the entry point's module registered both
    assert worlds.WORLDS[WORLD].data_sources == (SOURCE,)


def _entry_point_dist(folder: Path) -> None:
    """An installed distribution (its metadata only) declaring the echo world's module."""
    _plugin(folder, "echo_world_plugin", "register()")
    info = folder / "echo_world-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-world\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{WORLD} = echo_world_plugin\n")


def _divrl(*argv: str, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "import sys; from divrl.cli import main; sys.exit(main())", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_divrl_subprocesses_score_the_rows_with_the_world_verifier(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_helpers", ROOT / "tests/training/train_helpers.py"
    )
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    tiny_lm_path = helpers.build_tiny_lm(tmp_path / "model")
    _entry_point_dist(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(HERE), str(ROOT)])
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {"data_source": SOURCE, "prompt": [{"role": "user", "content": f"say {i}"}],
                 "reward_model": {"ground_truth": str(i)}, "extra_info": {"index": f"e{i}"}}
            ) + "\n"
            for i in range(8)
        )
    )  # fmt: skip

    # divrl eval --reuse: samples written as divrl eval writes them, scored in a new process
    records = [
        {"id": f"e{i}", "data_source": SOURCE, "prompt": "p", "ground_truth": str(i),
         "extra_info": {}, "greedy": {"text": str(i), "n_tokens": 1, "truncated": False},
         "samples": [{"text": t, "n_tokens": 1, "nll": 1.0, "truncated": False}
                     for t in (str(i), "x")]}
        for i in range(2)
    ]  # fmt: skip
    (tmp_path / "eval" / "echo").mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "eval" / "echo" / "samples.jsonl").write_text(lines)
    done = _divrl("eval", "--reuse", "--out", str(tmp_path / "eval"), "--n", "2", env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())["echo"]
    assert summary["mean_accuracy"] == 0.5 and summary["greedy_accuracy"] == 1.0

    # divrl train with model.toy_world naming the entry point's world, its rows as paths
    overrides = {
        "model.toy_world": WORLD,
        "model.path": tiny_lm_path,
        "data.train_path": rows,
        "logging.output_dir": tmp_path / "run",
        "logging.progress": False,
        "logging.tensorboard": False,
        "train.total_steps": 1,
        "train.prompts_per_step": 2,
        "train.micro_batch_size": 4,
        "rollout.n": 2,
        "rollout.max_new_tokens": 2,
        "checkpoint.save_every": 0,
        "checkpoint.save_final": False,
    }
    done = _divrl("train", *(f"{k}={v}" for k, v in overrides.items()), env=env)
    assert done.returncode == 0, done.stderr
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1 and "reward/score" in json.loads(metrics[0])
