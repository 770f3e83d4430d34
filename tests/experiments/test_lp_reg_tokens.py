"""experiments/lp_reg_tokens.py: trace roles by hand, and the counts equal the trainer's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.lp_reg_tokens import ROLES, main, token_roles

PRESET = Path(__file__).parents[2] / "configs" / "toy" / "countdown" / "lp_reg.yaml"


def test_roles_of_a_hand_written_trace():
    pieces = [*"7+9=16,16*3=48", " no; ", *"9*5=45,45-3=42", " ok", "<eos>"]
    roles = token_roles(pieces, "<eos>")
    assert roles[:7] == [
        "attempt start",
        "operator +",
        "operand, step 1",
        "punctuation",
        "result",
        "result",
        "punctuation",
    ]
    assert roles[7:14] == [
        "operand, step 2",
        "operand, step 2",
        "operator *",
        "operand, step 2",
        "punctuation",
        "result",
        "result",
    ]
    assert roles[14] == "verdict"
    assert roles[15] == "attempt start"  # a new attempt after the verdict
    assert roles[22:25] == ["operand, step 2", "operand, step 2", "operator -"]
    assert roles[-2:] == ["verdict", "end"]
    # a negative result's sign is part of the result, not an operator
    assert token_roles([*"3-7=-4"], "<eos>")[4:] == ["result", "result"]
    assert set(roles) <= set(ROLES)
    assert "illegal number" not in token_roles(pieces, "<eos>", (3, 7, 9, 5))


def test_illegal_numbers_given_the_problem():
    # 7 used twice, 8 not given; 46 is not the first result 45 (its 4 could still be)
    pieces = [*"7+7=14,14*8=112", " no; ", *"9*5=45,46-3=43", " ok"]
    roles = token_roles(pieces, "<eos>", (3, 7, 9, 5))
    illegal = [i for i, r in enumerate(roles) if r == "illegal number"]
    assert [pieces[i] for i in illegal] == ["7", "8", "6"]
    assert illegal == [2, 10, 24]


@pytest.mark.slow
def test_counts_equal_what_the_trainer_logs_at_step_one(tmp_path, monkeypatch):
    from divrl.toy.countdown_world import ensure_countdown_world
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    world = ensure_countdown_world(tmp_path / "cache", size="full", progress=False)  # shipped
    overrides = [
        f"model.path={world.model_dir}",
        f"data.train_path={world.splits['train']}",
        "train.prompts_per_step=8",
        "train.micro_batch_size=16",
    ]
    out = tmp_path / "counts.json"
    args = ["--batches", "1", "--out", str(out), "--config", str(PRESET), *overrides]
    assert main(args) == 0
    counts = json.loads(out.read_text())
    batch = counts["batches"][0]
    assert batch["candidates"] > 0 and batch["selected"] >= 2  # the test needs Lp-Reg to act

    run = [*overrides, "train.seed=0", "train.total_steps=1", f"logging.output_dir={tmp_path}/run"]
    run += ["algorithm.lp_reg_scope=micro_batch", "algorithm.lp_reg_group_size=null"]
    run += ["algorithm.lp_reg_micro_batch_tokens=null"]  # the experiment counts per micro-batch
    run += ["algorithm.lp_reg_balance_batch=false"]
    run += ["logging.progress=false", "logging.tensorboard=false", "checkpoint.save_final=false"]
    metrics = Trainer(load_config(PRESET, run)).train()[-1]
    assert batch["candidates"] == metrics["lp_reg/num_negative"]  # the step's sums
    assert batch["selected"] == metrics["lp_reg/num_selected"]
    assert batch["regularized"] == metrics["lp_reg/num_regularized"]
    roles = counts["roles"]
    assert sum(r["regularized"] for r in roles.values()) == batch["regularized"]
    assert sum(r["tokens"] for r in roles.values()) == batch["tokens"]


def test_comparison_shares_by_hand():
    from experiments.lp_reg_tokens import COUNTS, comparison, subtraction_share

    def result(minus: int, plus: int, regularised_minus: int) -> dict:
        roles = {r: dict.fromkeys((*COUNTS, "prob_sum"), 0.0) for r in ROLES}
        roles["operator -"].update(tokens=minus, regularized=regularised_minus)
        roles["operator +"].update(tokens=plus, regularized=1)
        return {"roles": roles, "batches": [{}, {}]}

    a, b = result(1, 3, 3), result(0, 4, 0)
    assert subtraction_share(a["roles"]) == 0.25
    assert subtraction_share(b["roles"]) == 0.0
    lines = comparison({"base": [a], "grpo": [b]})
    minus_row = next(line for line in lines if line.startswith("| operator - |"))
    # base: 1 of 4 tokens, 3 of 4 regularised; grpo: none of 4, none of 1
    assert minus_row == "| operator - | 25.0 | 75.0 | 0.0 | 0.0 |"
    assert "Regularised per batch: base: 2.0, grpo: 0.5." in lines
    assert "Share of `-` among sampled operators (%): base: 25.0, grpo: 0.0." in lines
    # two results under one label: mean ± sample sd (25% and 0% of the tokens)
    pooled = comparison({"both": [a, b]})
    minus_row = next(line for line in pooled if line.startswith("| operator - |"))
    assert minus_row == "| operator - | 12.5 ± 17.7 | 37.5 ± 53.0 |"


def test_report_groups_files_by_label(tmp_path, capsys):
    from experiments.lp_reg_tokens import COUNTS, main

    roles = {r: dict.fromkeys((*COUNTS, "prob_sum"), 1.0) for r in ROLES}
    for name in ("s0", "s1"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"roles": roles, "batches": [{}]}))
    files = f"{tmp_path}/s0.json,{tmp_path}/s1.json"
    assert main(["--report", f"base={files}", str(tmp_path / "s0.json")]) == 0
    out = capsys.readouterr().out
    assert "**s0** (1 batches" in out  # a single file gets its own table
    assert "**base**" not in out  # a group only appears in the comparison
    assert "| role | base: tokens | base: regularised | s0: tokens | s0: regularised |" in out
    assert f"| attempt start | {100 / len(ROLES):.1f} ± 0.0 |" in out


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tmp_path), "--batches", "1"])
    assert exc.value.code == 2 and "no config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--batches", "0"])
    assert "--batches must be >= 1" in capsys.readouterr().err
    torn = tmp_path / "torn.json"
    torn.write_text('{"roles": {')
    assert main(["--report", str(torn)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{torn} is not a whole JSON file" in err
