import json
import logging
import shlex
from pathlib import Path

import pytest
from train_helpers import tiny_overrides

from divrl.cli import EXIT_USER_ERROR, main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_train_print_config_applies_overrides(capsys):
    assert main(["train", str(CONFIGS / "dapo.yaml"), "rollout.n=4", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "n: 4" in out and "clip_high: 0.28" in out


def test_train_bad_override_exits_2_naming_the_key(capsys):
    assert main(["train", str(CONFIGS / "grpo.yaml"), "optim.warmup=3"]) == 2
    err = capsys.readouterr().err
    assert "optim.warmup" in err and "did you mean 'optim.warmup_steps'" in err


def test_presample_bad_config_exits_2(capsys):
    assert main(["presample", "reference.k=0"]) == 2
    assert "reference.k=0 must be > 0" in capsys.readouterr().err


@pytest.mark.slow
def test_presample_then_train_through_the_cli(tiny_world, tmp_path, capsys, caplog):
    """The real verifier (math, \\boxed{} answers): the random model scores 0 everywhere, so
    every prompt is an exploration prompt and the store is empty; DPH training says so."""
    store = tmp_path / "store"
    common = [
        *tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 1}),
        f"reference.store={store}",
        "reference.k=2",
        "reference.per_step=2",
        "algorithm.divergence=js",
        "algorithm.divergence_coef=0.2",
    ]
    caplog.set_level(logging.INFO, logger="divrl.training.presample")
    assert main(["presample", *common]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "divrl.training.presample"]
    assert "presample: 16 prompts x 2 responses" in said  # no data.limit note without a limit
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["stats"]["prompts"] == 16
    assert manifest["stats"]["near_perfect"] + manifest["stats"]["exploration"] == 16
    # every prompt's key, by which a TRL dataset of the same file without ids finds its rows
    import pyarrow.parquet as pq

    from divrl.data import load_examples
    from divrl.data.fingerprint import prompt_key

    train = next(c.split("=", 1)[1] for c in common if c.startswith("data.train_path="))
    stored = pq.read_table(store / "prompts.parquet").to_pydict()
    keys = dict(zip(stored["prompt_id"], stored["prompt_key"], strict=True))
    assert keys == {str(ex.id): prompt_key(ex.prompt) for ex in load_examples(train)}
    # presample ends with the command that trains on the store: run that command
    next_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert next_line.startswith("next: divrl train ")
    suggested = shlex.split(next_line.removeprefix("next: "))[2:]
    assert suggested == common
    assert main(["train", *suggested]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "holds no samples" in err and "reference.keep_presampled" in err
    assert "Traceback" not in err
    grpo = [c for c in common if not c.startswith("algorithm.divergence")]
    assert main(["train", *grpo]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and rows[-1]["reward/score"] == 0.0


def test_train_final_line_says_where_the_model_is(tiny_world, tmp_path, capsys):
    args = tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 1})
    saved = [a for a in args if not a.startswith("checkpoint.save_final")]
    assert main(["train", *saved, "checkpoint.save_final=true"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    model = tmp_path / "checkpoints" / "step_000001" / "model"
    assert last.endswith(f"model in {model}") and (model / "config.json").is_file()

    assert (
        main(["train", *tiny_overrides(tiny_world, tmp_path / "b", **{"train.total_steps": 1})])
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith("no model saved (set checkpoint.save_final=true or checkpoint.save_every)")


def test_progress_bar_shows_the_dph_and_lp_reg_statistics():
    from divrl.training.metrics import progress_postfix

    base = {"reward/shaped": 0.5, "reward/pass@1": 0.25, "actor/entropy": 1.0, "time/step": 2.0}
    assert set(progress_postfix(base)) == {"reward", "pass@1", "ent", "s/step"}
    lp = {
        **base,
        "lp_reg/num_selected": 12.0,
        "lp_reg/num_regularized": 5.0,
        "lp_reg/penalty": 0.003,
    }
    post = progress_postfix(lp)
    assert post["lp_reg"] == "5/12" and post["lp_pen"] == "3.00e-03"
    assert progress_postfix({**base, "dph/divergence": 0.0125})["div"] == "1.25e-02"


def test_store_mismatch_and_dropped_prompts_are_one_paragraph(tiny_world, tmp_path, capsys):
    from train_helpers import parity_reward

    from divrl.training.config import load_config
    from divrl.training.presample import presample

    dph = {
        "train.total_steps": 1,
        "reference.store": tmp_path / "store",
        "reference.k": 2,
        "reference.per_step": 2,
        "algorithm.divergence": "js",
        "algorithm.divergence_coef": 0.2,
    }
    small = load_config(None, tiny_overrides(tiny_world, tmp_path, **dph, **{"data.limit": 4}))
    presample(small, reward_fn=parity_reward, progress=False)
    assert main(["train", *tiny_overrides(tiny_world, tmp_path / "run", **dph)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()  # (after transformers' loading bars)
    start = next(i for i, x in enumerate(lines) if x.startswith("divrl train: the reference"))
    paragraph = lines[start:]  # the differences one per line, then the fix
    assert "Traceback" not in err and paragraph[0].endswith("does not match this run:")
    assert paragraph[1].startswith("  - ") and "data.limit" in "\n".join(paragraph[1:-1])
    assert "--allow-store-mismatch" in paragraph[-1]
    too_short = tiny_overrides(tiny_world, tmp_path, **{"data.max_prompt_length": 2})
    assert main(["train", *too_short]) == 2  # data.truncation=error (the default)
    assert "16 of 16 prompts in" in capsys.readouterr().err
    assert main(["train", *too_short, "data.truncation=drop"]) == 2
    assert "all 16 rows were dropped by data.max_prompt_length=2" in capsys.readouterr().err


def test_chat_template_missing_is_one_line_exit_2(tiny_world, tmp_path, capsys):
    args = tiny_overrides(tiny_world, tmp_path, **{"data.template": "chat"})
    assert main(["train", *args]) == EXIT_USER_ERROR
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("divrl train: data.template=chat: this model's tokenizer has no chat")
    assert "data.template=plain" in last
