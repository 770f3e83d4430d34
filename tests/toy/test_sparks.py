"""The sparks world: verifier, trace generator, world build, the spark measurement, presets."""

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from divrl.evaluation.styles import solution_style
from divrl.rewards import compute_score, compute_score_detailed
from divrl.rewards.sparks_reward import final_answer, format_ground_truth, parse_ground_truth
from divrl.toy import sparks
from divrl.toy.sparks_measure import decision_prefix, spark_probabilities, spark_stats
from divrl.toy.sparks_world import (
    PRETRAINED_DIR,
    SIZES,
    ensure_sparks_world,
    make_splits,
    sft_corpus,
    shipped_key,
    world_key,
)
from divrl.toy.tokenizer import ANSWER_MARKER
from divrl.toy.world import read_rows

GOLD = format_ground_truth([3, 8, 1, 5, 9], 4)
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "toy" / "sparks"
HABIT = "3 8 1 5 : 3 8 8 8"  # the first read-back and its scratchpad (running maximum)
CHECK = " wait 3 8 1 5 9 : 3 8 8 8 9"  # the check's


@pytest.mark.parametrize(
    ("response", "score", "reason"),
    [
        (f"{HABIT} = 8", 0.0, "wrong"),  # the habit: the glance misses the 9
        (f"{HABIT} = 8{CHECK} = 9", 1.0, "correct"),  # the check's answer replaces the first
        (f"{HABIT} = 5{CHECK} = 9", 1.0, "correct"),  # (a slipped first answer too)
        (f"{HABIT} = 8{CHECK} = 8", 0.0, "wrong"),  # a check that slips
        (f"{HABIT} = 8;", 0.0, "wrong"),  # a closing character is ignored
        (f"{HABIT} = 8{CHECK} = 9#", 1.0, "correct"),
        # the new rule: every answer is a number of its own read-back
        (f"{HABIT} = 9", 0.0, "unjustified"),  # naming the skipped 9 without reading it
        (f"{HABIT} = 7", 0.0, "unjustified"),  # (any unread number)
        (f"{HABIT} = 9{CHECK} = 9", 0.0, "unjustified"),  # the first answer too
        (f"{HABIT} = 8{CHECK} = 7", 0.0, "unjustified"),  # the check's answer
        (f"{HABIT} = 8q", 0.0, "no_answer"),  # anything else breaks the shape: no answer
        (f"{HABIT} = 8 wait", 0.0, "no_answer"),  # an unfinished check has no answer
        ("3 8 1 5 = 8", 0.0, "no_answer"),  # no scratchpad
        ("9", 0.0, "no_answer"),  # no read-back
        (f"{HABIT} = 8{CHECK} = 9{CHECK} = 9", 0.0, "no_answer"),  # one check at most
        ("3 8 1 9 : 3 8 8 9 = 9", 0.0, "unfaithful"),  # the first read-back: the first four
        ("3 8 1 5 9 : 3 8 8 8 9 = 9", 0.0, "unfaithful"),  # ... no more of them
        (f"{HABIT} = 8 wait 3 8 1 9 : 3 8 8 9 = 9", 0.0, "unfaithful"),  # the check: all
        ("3 8 1 5 : 3 8 8 = 8", 0.0, "unfaithful"),  # one scratchpad entry per number
        # each scratchpad is the running maximum of its read-back
        ("3 8 1 5 : 3 3 8 8 = 8", 0.0, "bad_scratchpad"),  # a slip: the rise to 8 missed
        (f"3 8 1 5 : 1 1 1 1 = 8{CHECK} = 9", 0.0, "bad_scratchpad"),  # the first's too
        (f"{HABIT} = 8 wait 3 8 1 5 9 : 3 8 8 8 8 = 9", 0.0, "bad_scratchpad"),  # the check's
        (f"{HABIT} = 8 wait 3 8 1 5 9 : 3 8 8 8 8 = 8", 0.0, "bad_scratchpad"),
    ],
)
def test_verifier_hand_checked_cases(response, score, reason):
    res = compute_score_detailed("sparks", response, GOLD)
    assert (res.score, res.reason) == (score, reason)
    assert compute_score("sparks", response, GOLD) == score


def test_verifier_reports_the_answer_and_the_reason():
    res = compute_score_detailed("sparks", f"{HABIT} = 8{CHECK} = 9", GOLD)
    assert (res.score, res.extracted, res.reason) == (1.0, "9", "correct")
    res = compute_score_detailed("sparks", f"{HABIT} = 8", GOLD)
    assert (res.score, res.extracted, res.reason) == (0.0, "8", "wrong")
    assert compute_score_detailed("sparks", "hello", GOLD).reason == "no_answer"
    assert compute_score_detailed("sparks", f"{HABIT} = 9", GOLD).extracted == "9"
    assert parse_ground_truth(GOLD) == ([3, 8, 1, 5, 9], 4)
    with pytest.raises(ValueError, match="numbers="):
        parse_ground_truth("target=3")
    assert final_answer(f" {HABIT} = 8 ") == "8"


def test_closers_are_a_heavy_tail_below_the_min_p_filter():
    # the designed decision point: end, spark, or one of many closers, each below the
    # Lp-Reg presets' min-p threshold kappa * p_max, together a quarter of the mass
    from divrl.rewards.sparks_reward import CLOSERS
    from divrl.training.config import load_config

    cfg = sparks.SparksConfig()
    kappa = load_config(str(CONFIGS / "lp_reg.yaml")).algorithm.loss_options["kappa"]
    p_end = 1 - cfg.spark_rate - cfg.closer_rate
    assert len(set(CLOSERS)) == len(CLOSERS) >= 25
    assert cfg.closer_rate / len(CLOSERS) < 0.7 * kappa * p_end
    assert cfg.spark_rate > kappa * p_end  # the spark is kept by the filter
    assert cfg.closer_rate >= 0.2  # Z at the decision point <= 0.8


def test_style_says_whether_the_response_checks():
    assert solution_style("sparks", f"{HABIT} = 8{CHECK} = 9", "9") == "check"
    assert solution_style("sparks", f"{HABIT} = 8", "8") == "direct"


def _rises(numbers) -> int:
    best = sparks.running_max(numbers)
    return sum(b > a for a, b in itertools.pairwise(best))


def test_generator_draws_the_designed_rates():
    cfg = sparks.SparksConfig()
    rng = random.Random(0)
    n, checks, hard = 20000, 0, 0
    right: dict[bool, list[tuple[bool, bool, float]]] = {True: [], False: []}
    for _ in range(n):
        p = sparks.sample_problem(rng, cfg)
        text, spark = sparks.sample_trace(rng, p, cfg)
        checks += spark
        hard += sparks.is_hard(p, cfg)
        ok = compute_score("sparks", text, format_ground_truth(p.numbers, cfg.glance)) == 1.0
        # the designed chance of being right: no scratchpad slip at any rise of the running
        # maximum (the first read-back's and the check's), no slip of the final answer
        pads = (1 - cfg.scratch_slip) ** _rises(p.numbers[: cfg.glance])
        if spark:
            designed = pads * (1 - cfg.scratch_slip) ** _rises(p.numbers) * (1 - cfg.check_slip)
        else:
            designed = 0.0 if sparks.is_hard(p, cfg) else pads * (1 - cfg.fast_slip)
        right[spark].append((sparks.is_hard(p, cfg), ok, designed))
        assert final_answer(text) is not None, text  # every supervised trace parses
        if spark:  # the check writes every number back and a scratchpad
            assert text.split(" wait ")[1].startswith(sparks._digits(p.numbers) + " : ")
    assert abs(checks / n - cfg.spark_rate) < 0.01
    assert abs(hard / n - cfg.hard_share) < 0.015

    def acc(spark: bool, is_hard: bool) -> tuple[float, float]:
        rows = [(ok, d) for h, ok, d in right[spark] if h == is_hard]
        return float(np.mean([r[0] for r in rows])), float(np.mean([r[1] for r in rows]))

    # easy: the habit (0.68) beats the check (0.38); hard: only the check is ever right
    habit, want = acc(False, False)
    assert abs(habit - want) < 0.015 and 0.6 < habit < 0.75
    check, want = acc(True, False)
    assert abs(check - want) < 0.04 and check < habit - 0.2
    assert acc(False, True)[0] == 0.0
    check, want = acc(True, True)
    assert abs(check - want) < 0.1 and check > 0.05


def test_scratchpad_slips_at_rises_only():
    cfg = sparks.SparksConfig(scratch_slip=0.5)
    rng = random.Random(1)
    numbers = (3, 8, 1, 5, 9)
    seen = {sparks.slipped_scratchpad(rng, numbers, cfg) for _ in range(200)}
    # the rises (3 -> 8, 8 -> 9) may keep the previous maximum; nothing else moves
    assert seen == {(3, 8, 8, 8, 9), (3, 3, 8, 8, 9), (3, 8, 8, 8, 8), (3, 3, 8, 8, 8)}
    assert sparks.slipped_scratchpad(rng, numbers, sparks.SparksConfig(scratch_slip=0.0)) == (
        3,
        8,
        8,
        8,
        9,
    )


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="glance"):
        sparks.SparksConfig(glance=12)
    with pytest.raises(ValueError, match="spark_rate"):
        sparks.SparksConfig(spark_rate=1.5)
    with pytest.raises(ValueError, match="below 1"):
        sparks.SparksConfig(spark_rate=0.6, closer_rate=0.5)


def test_splits_are_disjoint_and_hard_is_hard():
    cfg = SIZES["tiny"]
    rows, held_out = make_splits(cfg, seed=0)
    prompts = {s: {r.prompt for r in rs} for s, rs in rows.items()}
    assert not prompts["train"] & prompts["test"] and not prompts["train"] & prompts["hard"]
    assert all(r.extra_info["hard"] for r in rows["hard"])
    corpus, share = sft_corpus(cfg, 0, held_out)
    assert not {p for p, _ in corpus} & (prompts["test"] | prompts["hard"])
    assert 0.0 < share < 0.2


def test_tiny_world_builds_and_scores(tmp_path):
    world = ensure_sparks_world(tmp_path, size="tiny", progress=False)
    assert set(world.splits) == {"train", "test", "hard"}
    rows = read_rows(world.splits["hard"])
    assert rows[0]["data_source"] == "sparks" and rows[0]["extra_info"]["hard"]
    assert json.loads((world.root / "world.json").read_text())["world"] == "sparks"
    again = ensure_sparks_world(tmp_path, size="tiny", progress=False)
    assert again.root == world.root


def test_shipped_model_matches_the_full_settings():
    assert shipped_key() == world_key(0, "full", SIZES["full"])
    assert (PRETRAINED_DIR / "model.safetensors").is_file()


def test_scratchpad_is_the_running_maximum():
    assert sparks.running_max((3, 8, 1, 5, 9)) == (3, 8, 8, 8, 9)
    assert sparks.read_back((3, 8, 1, 5)) == HABIT


def test_decision_prefix_is_the_first_answer():
    assert decision_prefix(f"{HABIT} = 8{CHECK} = 9") == f"{HABIT} = 8"
    assert decision_prefix(f"{HABIT} = 8;") == f"{HABIT} = 8"
    assert decision_prefix("3 8 1 5 = 8") is None
    assert decision_prefix("3 8 1") is None


def _shipped():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(PRETRAINED_DIR).eval()
    return model, AutoTokenizer.from_pretrained(PRETRAINED_DIR)


def _habit_prefixes(rng: random.Random, n: int, hard: bool | None = None):
    """(prompts, responses up to the decision point) of ``n`` problems drawn from ``rng``,
    each with the habit's right first answer."""
    cfg = sparks.SparksConfig()
    ps = [sparks.sample_problem(rng, cfg, hard=hard) for _ in range(n)]
    prompts = [sparks.prompt_text(p) + ANSWER_MARKER for p in ps]
    prefixes = [
        f"{sparks.read_back(p.numbers[: cfg.glance])} = {max(p.numbers[: cfg.glance])}" for p in ps
    ]
    return prompts, prefixes


def test_shipped_model_checks_at_the_designed_rate(tmp_path):
    # measured: the spark token's probability at the decision point, from one forward pass
    # over 64 problems' habitual first answers (no sampling), is near spark_rate on easy
    # and hard problems alike (the base model does not know when a check pays)
    model, tok = _shipped()
    rng = random.Random(1)
    probs = {}
    for hard in (False, True):
        prompts, prefixes = _habit_prefixes(rng, 64, hard)
        probs[hard] = float(np.mean(spark_probabilities(model, tok, prompts, prefixes)))
    assert 0.03 < probs[False] < 0.10 and 0.03 < probs[True] < 0.10, probs
    assert abs(probs[False] - probs[True]) < 0.02, probs


def test_shipped_model_has_a_heavy_filtered_tail_at_the_decision_point():
    # measured: at the decision point the preset's min-p filter (kappa 0.02) drops every
    # closer and keeps the spark; the kept mass Z is ~0.80 (designed 0.80), so the
    # on-policy push on a regularised spark, 1/Z - 1, is ~0.25
    from divrl.algorithms.lp_reg import minp_log_normalizer
    from divrl.rewards.sparks_reward import CLOSERS, SPARK_MARK

    model, tok = _shipped()
    prompts, prefixes = _habit_prefixes(random.Random(2), 32)
    ids = [
        tok(q)["input_ids"] + tok(x)["input_ids"] for q, x in zip(prompts, prefixes, strict=True)
    ]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids)).logits[:, -1].float()
    probs = torch.softmax(logits, -1)
    kappa = 0.02
    kept = probs >= kappa * probs.max(-1, keepdim=True).values
    closers = [tok.convert_tokens_to_ids(c) for c in CLOSERS]
    assert not kept[:, closers].any()
    assert kept[:, tok.convert_tokens_to_ids(SPARK_MARK)].all()
    z = torch.exp(minp_log_normalizer(logits, kappa))
    assert 0.65 < float(z.mean()) < 0.85, z.mean()


def test_spark_stats_reads_the_samples():
    model, tok = _shipped()
    L7, A9 = sparks.read_back((3, 8, 1, 5, 0, 2, 6)), sparks.read_back((3, 8, 1, 5, 0, 2, 6, 9, 4))
    E7 = sparks.read_back((9, 8, 1, 5, 2, 0, 3))
    results = [
        {
            "prompt": "SP: 3 8 1 5 0 2 6 9 4\nA: ",
            "extra_info": {"hard": True},
            "texts": [f"{L7} = 8", f"{L7} = 8 wait {A9} = 9", "junk", f"{L7} = 8"],
            "correct": [False, True, False, False],
        },
        {
            "prompt": "SP: 9 8 1 5 2 0 3 4 6\nA: ",
            "extra_info": {"hard": False},
            "texts": [f"{E7} = 9", f"{E7} = 9"],
            "correct": [True, True],
        },
    ]
    s = spark_stats(model, tok, results)
    assert s["hard"]["samples"] == 4 and s["hard"]["spark_freq"] == 0.25
    assert s["hard"]["spark_acc"] == 1.0 and s["hard"]["direct_acc"] == 0.0
    assert s["easy"]["spark_freq"] == 0.0 and s["easy"]["spark_acc"] is None
    # the hard group's rewards 0 1 0 0: mean 1/4, std 1/2 (Bessel), the check's advantage 1.5
    assert s["hard"]["spark_adv"] == pytest.approx(1.5, rel=1e-4)
    assert s["all"]["spark_adv"] == pytest.approx(1.5, rel=1e-4)
    assert s["easy"]["spark_adv"] is None
    assert 0.0 < s["hard"]["spark_prob"] < 0.2 and s["all"]["samples"] == 6


@pytest.mark.parametrize(
    "method",
    [
        "grpo_math",
        "lp_reg",
        "entropy_bonus",
        "high_entropy_8020",
        "kl_cov",
        "clip_cov",
        "lp_reg_toy",
    ],
)
def test_presets_load_and_train_on_policy(method):
    from divrl.toy.worlds import world_presets
    from divrl.training.config import load_config

    assert world_presets("sparks") == "toy/sparks"
    cfg = load_config(str(CONFIGS / f"{method}.yaml"))
    assert cfg.model.toy_world == "sparks" and cfg.train.mini_batch_size is None
    assert cfg.rollout.max_new_tokens >= 88  # the longest trace: 88 tokens with its eos
    if cfg.algorithm.lp_reg_scope == "authors":  # a virtual GPU's rows: one micro-batch
        longest = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
        assert cfg.algorithm.lp_reg_micro_batch_tokens >= cfg.algorithm.lp_reg_group_size * longest


def _decision_point_spark(model, tok, seed: int = 3) -> float:
    """Mean p(spark) at the decision point after 64 problems' habitual first answers."""
    prompts, prefixes = _habit_prefixes(random.Random(seed), 64)
    return float(np.mean(spark_probabilities(model, tok, prompts, prefixes)))


def test_grpo_extinguishes_the_spark_on_the_shipped_world(tmp_path):
    # the world's designed property, measured before the method runs (docs/sparks_world.md):
    # the spark's mean GRPO advantage is negative at the base, so on-policy GRPO pushes it
    # down; three seeds of the preset took p(spark) from 0.058 to 0.013-0.021 in 25 steps and
    # halved the training entropy. Here 20 steps must take it below 0.7 x the base's and the
    # entropy of the last 5 steps below 0.8 x the first 5 steps' (a wide margin: the world
    # would have to lose its design, or GRPO its sign, to fail).
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    world = ensure_sparks_world(tmp_path / "cache", size="full", progress=False)
    overrides = [
        f"model.path={world.model_dir}",
        f"data.train_path={world.splits['train']}",
        f"logging.output_dir={tmp_path / 'run'}",
        "logging.progress=false",
        "logging.tensorboard=false",
        "train.total_steps=20",
        "checkpoint.save_every=0",
        "train.seed=0",
    ]
    trainer = Trainer(load_config(CONFIGS / "grpo_math.yaml", overrides))
    model, tok = _shipped()
    before = _decision_point_spark(model, tok)
    history = trainer.train()
    trainer.model.eval()
    after = _decision_point_spark(trainer.model, tok)
    assert 0.04 < before < 0.08, before
    assert after < 0.7 * before, (before, after)
    entropy = [r["actor/entropy"] for r in history]
    assert np.mean(entropy[-5:]) < 0.8 * np.mean(entropy[:5]), entropy
