"""The extension points of docs/architecture.md ("How to add ..."), used as a maintainer
would: a divergence, a benchmark profile (verifier + converter + equivalence + style) and a
toy world are defined in this file only, registered, and run through presample, train,
eval and report, with no library file touched.

The task: ``Q:a+b=`` prompts of the data source ``ext_parity`` whose verifier credits any
response to an even-numbered prompt (an exact split for DPH-RL's near-perfect set that
does not depend on the random tiny model), answers clustered by their length and labelled
with a "digits" / "other" style.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from train_helpers import build_tiny_lm, tiny_overrides

from divrl.algorithms import DIVERGENCES, register_divergence
from divrl.cli import main
from divrl.data import Example, write_examples
from divrl.evaluation.equivalence import AnswerEquivalence, get_equivalence
from divrl.evaluation.styles import get_style_fn
from divrl.profiles import BenchmarkProfile, get_profile, register_profile
from divrl.rewards import FunctionVerifier
from divrl.toy.worlds import WORLDS, WorldKind, register_world

SOURCE = "ext_parity"


# ------------------------------------------------------------------ a new divergence
# In a library module this factory carries the decorator
# ``@register_divergence("ext_hellinger", "squared Hellinger distance x 2")``; here the
# fixture below applies it, because a registration at import would be seen by every test
# collected in the same session (tests that go over all registered divergences).
def hellinger() -> object:
    def f(log_u: torch.Tensor) -> torch.Tensor:
        # (sqrt(u) - 1)^2: convex, f(1) = 0; E_ref = 2 H^2(pi_ref, pi_theta)
        return torch.expm1(0.5 * log_u.float().clamp(-20.0, 20.0)) ** 2

    return f


# ------------------------------------------------------------- a new benchmark profile
def parity_verifier(solution_str: str, ground_truth: str, extra_info: dict) -> float:
    return float(int(extra_info["index"][1:]) % 2 == 0)


# scored in this process (a function defined in a test module cannot go to a worker)
PARITY = FunctionVerifier(parity_verifier, isolate=False)


class LengthEquivalence(AnswerEquivalence):
    """Answers of the same length form one cluster."""

    def cluster(self, requests):
        out = []
        for req in requests:
            lengths = [None if a is None else len(a) for a in req.answers]
            order = {n: i for i, n in enumerate(dict.fromkeys(x for x in lengths if x is not None))}
            out.append([-1 if n is None else order[n] for n in lengths])
        return out


def digits_style(text: str, extracted: str | None) -> str:
    return "digits" if text.strip().isdigit() else "other"


def rows(n: int, split: str) -> list[Example]:
    return [
        Example(f"{split}-{i}", f"Q:{i}+{i + 1}=", SOURCE, str(2 * i + 1), {"index": f"p{i}"})
        for i in range(n)
    ]


class ParityConverter:
    """``divrl data convert ext_parity``: the official layout is one ``pairs.json``."""

    @staticmethod
    def convert(src, split, *, template=None, limit=None, seed=0) -> list[Example]:
        pairs = json.loads((Path(src) / "pairs.json").read_text())
        return rows(len(pairs), split)[: limit if limit is not None else None]


PROFILE = BenchmarkProfile(
    SOURCE,
    verifier=PARITY,
    converter=ParityConverter,
    equivalence=LengthEquivalence,
    style=digits_style,
)
if get_profile(SOURCE) is None:  # the module may be imported twice (pytest, a subprocess)
    register_profile(PROFILE)


# ------------------------------------------------------------------ a new toy world
@dataclass
class TinyWorld:
    root: Path
    model_dir: Path
    db_dir: Path | None
    splits: dict[str, Path] = field(default_factory=dict)
    seed: int = 0
    size: str = "tiny"

    @property
    def manifest(self) -> dict:
        counts = {s: len(p.read_text().splitlines()) for s, p in self.splits.items()}
        source = str(self.model_dir)
        return {"n_parameters": 0, "final_loss": 0.0, "build_seconds": 0.0, "splits": counts,
                "model_source": source}  # fmt: skip


def load_tiny_world(root) -> TinyWorld:
    root = Path(root)
    splits = {s: root / f"{s}.jsonl" for s in ("train", "test")}
    return TinyWorld(root, root / "model", None, splits)


def build_tiny_world(cache_dir, *, seed, size, progress, use_shipped) -> TinyWorld:
    if size != "tiny":
        raise ValueError(f"unknown ext world size {size!r}; choose one of ['tiny']")
    cache = Path(cache_dir) if cache_dir else Path(os.environ["DIVRL_CACHE_DIR"]) / "toy"
    root = cache / f"ext-{seed}"
    if not (root / "model").is_dir():
        build_tiny_lm(root / "model", seed)
        write_examples(rows(16, "train"), root / "train.jsonl")
        write_examples(rows(4, "test"), root / "test.jsonl")
    return load_tiny_world(root)


def measure_tiny_world(world, *, n_samples, max_prompts, progress, reuse) -> dict:
    return {"prompts": min(max_prompts, 4), "samples": n_samples}


EXT_WORLD = WorldKind(
    build_tiny_world,
    load_tiny_world,
    "16 parity prompts and a random tiny Llama",
    measure=measure_tiny_world,
    format=lambda m: f"measured {m['prompts']} prompts x {m['samples']}",
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The world is registered for these tests only, and the divergence removed after them:
    other tests go over every registered world or divergence."""
    register_divergence("ext_hellinger", "squared Hellinger distance x 2")(hellinger)
    register_world("ext_world", EXT_WORLD)
    yield
    WORLDS.pop("ext_world", None)
    DIVERGENCES.pop("ext_hellinger", None)


# ------------------------------------------------------------------------- the tests
def test_the_registrations_reach_every_lookup():
    assert "ext_hellinger" in DIVERGENCES
    assert get_style_fn(SOURCE)("123", None) == "digits"
    assert isinstance(get_equivalence(SOURCE), LengthEquivalence)
    with pytest.raises(ValueError, match="already registered"):
        register_profile(PROFILE)
    with pytest.raises(ValueError, match="already registered"):
        register_world("ext_world", WorldKind("a:b", "a:b"))
    from divrl.algorithms import divergence_generator

    f = divergence_generator("ext_hellinger")
    assert f(torch.zeros(1)).item() == 0.0
    assert f(torch.tensor([math.log(4.0)])).item() == pytest.approx(1.0)


def test_convert_train_eval_report_with_the_new_profile_divergence_and_world(tmp_path, capsys):
    # the converter, through the command
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "pairs.json").write_text(json.dumps([[0, 1]] * 6))
    converted = tmp_path / "converted.jsonl"
    argv = ["data", "convert", SOURCE, "--src", str(tmp_path / "src"), "--split", "test"]
    assert main([*argv, "--out", str(converted)]) == 0
    assert len(converted.read_text().splitlines()) == 6

    # the world, through the command and through a config's null paths
    cache = tmp_path / "worlds"
    assert main(["toy", "build", "--world", "ext_world", "--size", "tiny", "--cache-dir",
                 str(cache), "--measure", "--samples", "3"]) == 0  # fmt: skip
    assert "measured 4 prompts x 3" in capsys.readouterr().out
    world = build_tiny_world(cache, seed=0, size="tiny", progress=False, use_shipped=True)
    paths = {"model": str(world.model_dir), "data": str(world.splits["train"])}

    # presample + train DPH-RL with the new divergence, scored by the new verifier
    from divrl.training.config import load_config
    from divrl.training.presample import presample
    from divrl.training.trainer import Trainer

    run = tmp_path / "run"
    overrides = tiny_overrides(
        paths,
        run,
        **{
            "reference.store": tmp_path / "store",
            "reference.k": 4,
            "reference.per_step": 4,
            "algorithm.divergence": "ext_hellinger",
            "algorithm.divergence_coef": 0.5,
            "train.total_steps": 2,
            "checkpoint.save_final": True,
        },
    )
    cfg = load_config(None, overrides)
    stats = presample(cfg, progress=False)["stats"]
    assert (stats["near_perfect"], stats["prompts"]) == (8, 16)  # the parity verifier's split
    history = Trainer(cfg).train()
    assert history[0]["dph/divergence"] == pytest.approx(0.0, abs=1e-6)  # u = 1 at step 1

    # eval (styles and clusters from the profile), then the report
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(run), "--out", str(out), "--n", "3", "--limit", "3"]
    argv += ["--data", f"ext={converted}", "--max-new-tokens", "4", "--no-progress"]
    assert main(argv) == 0
    result = json.loads((out / "ext" / "results.jsonl").read_text().splitlines()[0])
    assert set(result["styles"]) <= {"digits", "other"}
    assert all(c >= -1 for c in result["clusters"])
    assert main(["report", f"ext={out}", "--out", str(tmp_path / "report")]) == 0
    assert any((tmp_path / "report").iterdir())


def test_model_toy_world_takes_a_registered_world(tmp_path, monkeypatch):
    from divrl.commands.train import with_toy_defaults
    from divrl.training.config import ConfigError, load_config

    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path))
    cfg = load_config(None, ["model.toy_world=ext_world", "model.toy_size=tiny"])
    filled = with_toy_defaults(cfg)
    assert filled.model.path == str(tmp_path / "toy" / "ext-0" / "model")
    assert filled.data.train_path == str(tmp_path / "toy" / "ext-0" / "train.jsonl")
    bad = load_config(None, ["model.toy_world=no_such_world"])
    with pytest.raises(ConfigError, match=r"model.toy_world=.no_such_world..*unknown world"):
        with_toy_defaults(bad)
