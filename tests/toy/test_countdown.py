"""The countdown world: verifier, search-trace generator, world build, presets (reduced size)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from divrl.evaluation.styles import solution_style
from divrl.rewards import compute_score, compute_score_detailed
from divrl.rewards.countdown_reward import (
    answer_attempt,
    canonical_expression,
    check_attempt,
    format_ground_truth,
    operator_style,
    parse_ground_truth,
)
from divrl.toy import countdown
from divrl.toy.countdown_world import (
    PRETRAINED_DIR,
    SIZES,
    ensure_countdown_world,
    make_splits,
    sft_corpus,
    shipped_key,
    world_key,
)
from divrl.toy.world import read_rows

GOLD = format_ground_truth([3, 7, 9, 5], 42)
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "toy"


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("9*5=45,45-3=42 ok", 1.0),
        ("7+9=16,16*3=48 no; 9*5=45,45-3=42 ok", 1.0),
        ("9*5=45,45-3=42 no; ", 1.0),  # reached the target, missed it in its verdict
        ("7*5=35,35+7=42 no; 9*5=45,45-3=42 ok", 0.0),  # first claim of 42 is invalid
        ("7*5=35,35+9=44 ok 9*5=45,45-3=42 ok", 0.0),  # a wrong ok is the answer
        ("7*5=35,35+9=44 no; ", 0.0),  # never reaches the target: no answer
        ("9*5=45,45-3=41 ok", 0.0),  # written result is not the target
        ("9*5=44,44-2=42 ok", 0.0),  # arithmetic slip (and 2 is not given)
        ("7*5=35,35+7=42 ok", 0.0),  # 7 used twice
        ("3-9=6,6*7=42 ok", 0.0),  # 3-9 is -6, not 6
        ("7*3=21,21*2=42 ok", 0.0),  # 2 is not a given number
        ("9*5=45,45-3=42 ok 1+1=2 ok", 1.0),  # text after the first ok is ignored
        ("42 ok", 0.0),  # malformed attempt
        ("5*9=45,3+45=48 no; 7*9=63,63-5=58 no; 7*5=35,35+9=44 ok", 0.0),  # wrong ok
    ],
)
def test_verifier_hand_checked_cases(response, score):
    assert compute_score("countdown", response, GOLD) == score


def test_verifier_reports_the_answer_and_reason():
    res = compute_score_detailed("countdown", "7+9=16,16*3=48 no; 9*5=45,45-3=42 ok", GOLD)
    assert (res.extracted, res.reason) == ("9*5=45,45-3=42", "correct")
    assert compute_score_detailed("countdown", "9*5=45 no; ", GOLD).reason == "no_answer"
    res = compute_score_detailed("countdown", "3+7=10,10*5=50 no; 9-3=6,6*7=42 no; ", GOLD)
    assert (res.extracted, res.score) == ("9-3=6,6*7=42", 1.0)
    assert parse_ground_truth(GOLD) == ([3, 7, 9, 5], 42)
    with pytest.raises(ValueError):
        parse_ground_truth("42")


def test_one_step_answers_are_rejected_and_longer_ones_checked():
    # the hack RL found at lr 3e-4: one operation that happens to hit the target
    gold = format_ground_truth([3, 7, 6, 5], 42)
    res = compute_score_detailed("countdown", "7*6=42 ok", gold)
    assert (res.score, res.reason) == (0.0, "too_short")
    assert compute_score("countdown", "6*7=42 no; ", gold) == 0.0
    assert compute_score("countdown", "7*6=42,42*1=42 ok", gold) == 0.0  # 1 is not given
    assert compute_score("countdown", "7-5=2,2*3=6,6*7=42 ok", gold) == 0.0  # 7 used twice
    # three steps on four numbers is a valid (longer) solution
    assert compute_score("countdown", "7+5=12,12*3=36,36+6=42 ok", gold) == 1.0


def test_canonical_expression_and_style():
    assert canonical_expression("3*5=15,15+7=22") == canonical_expression("5*3=15,7+15=22")
    assert canonical_expression("3*5=15,15+7=22") != canonical_expression("3+7=10,10*5=50")
    assert canonical_expression("9-5=4,7-4=3") == "7-(9-5)"
    assert canonical_expression("7+2=9,9*3=27") == "(2+7)*3"
    assert operator_style("7+2=9,9*3=27") == "+*" == operator_style("3*2=6,6+7=13")
    assert operator_style("9-5=4,7-4=3") == "--"
    assert operator_style(None) is None and operator_style("junk") is None
    assert answer_attempt("1+2=3,3*4=12 no; 2*4=8,8+1=9 ok") == "2*4=8,8+1=9"
    assert answer_attempt("1+2=3,3*4=12 no; 2*4=8,8+1=9 ok", target=12) == "1+2=3,3*4=12"
    assert answer_attempt("1+2=3,3*4=12 no; ") is None
    # `divrl eval` styles: the final attempt's operator multiset
    assert solution_style("countdown", "1+2=3,3*4=12 no; 2*4=8,8+1=9 ok", None) == "+*"


def test_every_enumerated_attempt_checks_against_its_own_value():
    p = countdown.Problem((3, 7, 9, 5), 42)
    attempts = countdown.all_attempts(p.numbers)
    assert len(attempts) > 200
    for attempt, value in attempts.items():
        assert check_attempt(attempt, list(p.numbers), value)[0], attempt
    assert {"(5*9)-3", "(9-3)*7"} <= countdown.solutions(p)
    assert all(
        compute_score("countdown", a + " ok", GOLD) == 1.0 for a, v in attempts.items() if v == 42
    )


def test_traces_search_and_are_right_exactly_when_they_say_ok():
    cfg = countdown.CountdownConfig()
    rng = random.Random(0)
    solved = []
    for _ in range(300):
        p = countdown.sample_problem(rng, cfg)
        assert cfg.target_min <= p.target <= cfg.target_max
        trace, ok = countdown.sample_trace(rng, p, cfg)
        gold = format_ground_truth(p.numbers, p.target)
        assert compute_score("countdown", trace, gold) == float(ok)
        attempts = trace.replace(" ok", "").split(" no; ")
        attempts = [a for a in attempts if a]
        assert len(attempts) == len(set(attempts))  # never the same attempt twice
        assert ok or cfg.min_attempts <= len(attempts) <= cfg.max_attempts
        assert all(check_attempt(a, list(p.numbers), p.target)[1] != "unparsable" for a in attempts)
        solved.append(ok)
    # the supervised search succeeds on a minority of prompts (room for Pass@1 to rise)
    assert 0.1 <= np.mean(solved) <= 0.35


def test_supervised_search_covers_most_prompts_in_32_tries():
    # the design property behind base Pass@32 >= 0.8, checked on the generator itself
    cfg = countdown.CountdownConfig()
    rng = random.Random(1)
    covered = []
    for _ in range(60):
        p = countdown.sample_problem(rng, cfg)
        covered.append(any(countdown.sample_trace(rng, p, cfg)[1] for _ in range(32)))
    assert np.mean(covered) >= 0.8


def test_splits_are_distinct_and_held_out_of_sft():
    cfg = SIZES["tiny"]
    rows, held_out = make_splits(cfg, seed=0)
    prompts = [r.prompt for split in ("train", "test", "cross_domain") for r in rows[split]]
    assert len(prompts) == len(set(prompts))
    for r in rows["cross_domain"]:
        _, target = parse_ground_truth(r.ground_truth)
        assert target > cfg.countdown.target_max
    corpus = sft_corpus(cfg, 0, held_out)
    sft_prompts = {p for p, _ in corpus}
    assert not sft_prompts & {r.prompt for r in rows["test"]}
    assert not sft_prompts & {r.prompt for r in rows["ood_math"]}
    assert 0.05 < np.mean([p.startswith("Math") for p, _ in corpus]) < 0.3


def test_shipped_model_matches_the_full_settings():
    # changing any setting of the full world changes its key: rebuild and re-ship
    # (divrl toy build --world countdown --retrain --ship) or the shipped copy goes unused
    assert shipped_key() == world_key(0, "full", SIZES["full"])
    assert (PRETRAINED_DIR / "model.safetensors").exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # <cache>/toy is where DIVRL_CACHE_DIR=<cache> points the trainer
    cache = tmp_path_factory.mktemp("cd") / "toy"
    return ensure_countdown_world(cache, size="tiny", progress=False)


def test_tiny_world_builds_is_cached_and_measures(tiny):
    again = ensure_countdown_world(tiny.root.parent, size="tiny", progress=False)
    assert again.root == tiny.root and tiny.manifest["world"] == "countdown"
    from divrl.toy.worlds import eval_splits, get_world, load_world

    assert get_world("countdown", tiny.root.parent, size="tiny").root == tiny.root
    assert load_world(tiny.root).splits == tiny.splits  # the kind recorded in world.json
    assert eval_splits(tiny) == ["test", "cross_domain", "ood_math"]
    assert set(tiny.splits) == {"train", "test", "cross_domain", "ood_math"}
    row = read_rows(tiny.splits["test"])[0]
    assert row["data_source"] == "countdown" and row["prompt"].endswith("\nA: ")
    from divrl.toy.countdown_measure import CountdownMeasureConfig, measure_countdown_model

    m = measure_countdown_model(
        tiny, CountdownMeasureConfig(n_samples=2, max_prompts=3, max_new_tokens=16), False
    )
    assert set(m["splits"]) == {"test", "cross_domain", "ood_math"}
    assert m["splits"]["test"]["entropy"] > 0
    assert json.loads((tiny.root / "measurements.json").read_text())["splits"]


def test_countdown_presets_are_the_toy_methods_on_the_countdown_world():
    from divrl.training.config import load_config

    names = {p.stem for p in (CONFIGS / "countdown").glob("*.yaml")}
    assert {"grpo", "dph_js", "lp_reg", "dph_f", "grpo_rkl"} <= names
    for name in names:
        cd, sql = (
            load_config(CONFIGS / "countdown" / f"{name}.yaml"),
            load_config(CONFIGS / f"{name}.yaml"),
        )
        assert cd.model.toy_world == "countdown" and sql.model.toy_world == "sql"
        assert cd.algorithm == sql.algorithm or name == "dapo"
        assert cd.train.prompts_per_step == sql.train.prompts_per_step
        assert cd.logging.output_dir.startswith("runs/toy/countdown/")


def test_lp_reg_preset_trains_on_the_tiny_countdown_world(tiny, tmp_path, monkeypatch):
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tiny.root.parent.parent))
    cfg = load_config(
        CONFIGS / "countdown" / "lp_reg.yaml",
        [
            "model.toy_size=tiny",
            f"logging.output_dir={tmp_path}",
            "logging.progress=False",
            "logging.tensorboard=False",
            "train.total_steps=1",
            "train.prompts_per_step=4",
            "rollout.max_new_tokens=24",
            "checkpoint.save_every=0",
            "checkpoint.save_final=False",
        ],
    )
    from divrl.commands.train import with_toy_defaults

    cfg = with_toy_defaults(cfg)  # model.toy_world picks the countdown world
    assert cfg.model.path == str(tiny.model_dir)
    history = Trainer(cfg).train()
    assert "lp_reg/num_selected" in history[-1]


def test_divrl_toy_build_world_countdown(tiny, capsys):
    from divrl.cli import main

    args = ["toy", "build", "--world", "countdown", "--size", "tiny"]
    assert main([*args, "--quiet", "--cache-dir", str(tiny.root.parent)]) == 0
    out = capsys.readouterr().out
    assert str(tiny.root) in out and "cross_domain" in out


@pytest.mark.slow
def test_shipped_model_searches_with_entropy_and_room(tmp_path):
    # the measured properties at a reduced size: 24 test prompts x 8 samples
    from divrl.toy.countdown_measure import CountdownMeasureConfig, measure_countdown_model

    world = ensure_countdown_world(tmp_path, size="full", progress=False)
    assert world.manifest["model_source"] == f"shipped with divrl (divrl/toy/{PRETRAINED_DIR.name})"
    cfg = CountdownMeasureConfig(n_samples=8, max_prompts=24, splits=("test",))
    stats = measure_countdown_model(world, cfg, progress=False)["splits"]["test"]
    assert 0.04 <= stats["pass@1"] <= 0.4, stats  # full size: 0.137 (256 x 32)
    assert stats["pass@8"] >= 0.35, stats  # full size: 0.590
    assert stats["entropy"] >= 0.3, stats  # full size: 0.480
    assert stats["distinct_solutions_per_solved"] >= 1.0, stats


def test_each_world_trains_from_its_own_preset_folder(tmp_path):
    """divrl demo and experiments/reproduce.py find a world's presets through the registry:
    countdown's (112-token responses) for countdown, configs/toy for sql."""
    from divrl.commands.demo import METHODS as DEMO_METHODS
    from divrl.pipeline import configs_dir
    from divrl.toy.worlds import WORLDS
    from divrl.training.config import load_config
    from experiments.reproduce import TRAINED

    assert configs_dir(world="sql") == CONFIGS == configs_dir()
    assert configs_dir(world="countdown") == CONFIGS / "countdown"
    assert configs_dir(tmp_path, world="countdown") == tmp_path  # --configs wins
    for world, kind in WORLDS.items():
        folder = configs_dir(world=world)
        no_twin = {"lp_reg_toy"} if world == "countdown" else set()  # docs/toy_world.md
        # a world that ships presets for some methods only declares them (WorldKind.methods)
        methods = set(kind.methods) if kind.methods is not None else {*DEMO_METHODS, *TRAINED}
        assert methods - no_twin <= {p.stem for p in folder.glob("*.yaml")}, world
        for method in methods - no_twin:
            cfg = load_config(folder / f"{method}.yaml")
            assert cfg.model.toy_world == world, (world, method)
            if world in ("sql", "countdown"):
                assert cfg.rollout.max_new_tokens == (112 if world == "countdown" else 80)


def test_reproduce_trains_countdown_from_its_presets(tiny, tmp_path):
    from experiments.reproduce import Experiment, parse_args

    args = parse_args(
        [
            "--world", "countdown", "--world-dir", str(tiny.root), "--methods", "grpo", "dph_js",
            "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"),
        ]
    )  # fmt: skip
    exp = Experiment(args)
    exp.setup()
    assert exp.configs == CONFIGS / "countdown" and exp.max_new_tokens == 112
    assert exp.cfgs["dph_js"].reference.keep_presampled
    assert exp.settings["world_name"] == "countdown"
    default = parse_args(["--world", "countdown"]).methods
    assert "lp_reg_toy" not in default and {"grpo", "dph_js", "dph_js_paper"} <= set(default)
    assert "lp_reg_toy" in parse_args([]).methods
