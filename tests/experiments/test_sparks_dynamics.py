"""experiments.sparks_dynamics: the report's tables from per-run records (synthetic)."""

import argparse
import json
import subprocess

import pytest

from experiments import sparks_dynamics
from experiments.records import ResultError
from experiments.sparks_dynamics import main, report, run_one, settings


def _record(method: str, seed: int, spark_hard: float) -> dict:
    def sparks(p: float) -> dict:
        return {
            "hard": {"spark_prob": p, "spark_freq": p, "spark_acc": 0.5, "samples": 400},
            "easy": {"spark_prob": p / 2, "spark_freq": p / 2, "spark_acc": 0.2},
        }

    final = {
        s: {"pass@1": 0.5, "pass@4": 0.7, "pass@16": 0.9, "sparks": sparks(spark_hard)}
        for s in ("test", "hard")
    }
    n = 30
    return {
        "method": method,
        "seed": seed,
        "steps": n,
        "curve": {
            "step": list(range(1, n + 1)),
            "entropy": [0.2 - 0.005 * i for i in range(n)],
            "lp_reg_selected": [4.0] * n if method.startswith("lp_reg") else [None] * n,
            "lp_reg_regularized": [1.0] * n if method.startswith("lp_reg") else [None] * n,
        },
        "checkpoints": {"0": {"sparks": sparks(0.06)}, "25": {"sparks": sparks(spark_hard)}},
        "final": final,
    }


def test_report_averages_seeds_and_lists_every_table():
    records = [_record("lp_reg_toy", 1, 0.04), _record("grpo_math", 0, 0.01)]
    records.append(_record("grpo_math", 1, 0.03))
    records[0]["overrides"] = ["algorithm.refill_exhausted=continue"]
    text = report(records)
    assert "- Lp-Reg, rho 0.1 (toy variant) seed 1: `algorithm.refill_exhausted=continue`" in text
    # methods in the module's order, GRPO first; two seeds averaged: (0.01 + 0.03) / 2
    assert text.index("GRPO on-policy") < text.index("rho 0.1")
    assert (
        "| GRPO on-policy = Lp-Reg without its regulariser (hard) | 0.060 / 0.060 | 0.020 / 0.020 |"
        in text
    )
    # entropy: steps 1-10 mean 0.1775, last 10 mean 0.0775 -> ratio 0.437 (sd 0 over seeds);
    # steps 23-27 around the step-25 checkpoint: 0.080
    assert "| 0.177 ± 0.000 | 0.077 ± 0.000 | 0.437 ± 0.000 | 0.080 |" in text
    assert (
        "| Lp-Reg, rho 0.1 (toy variant) | 1 | 30 | 4.00 (4) | 1.000 (1) | 30 |" in text
    )  # what Lp-Reg regularised
    # checks right / taken, pooled over seeds: 0.01 x 400 = 4 and 0.03 x 400 = 12 taken, half right
    assert "| 0.020 ± 0.014 | 8 / 16 |" in text
    # per seed: the spark at steps 0 / 25 / 50 (none) / end (25), entropy step 1 / last 10 / min
    assert (
        "| GRPO on-policy = Lp-Reg without its regulariser | 0 | 0.060 / 0.010 / - / 0.010 | "
        "0.0050 | 0.500 | 0.900 | 0.500 | 0.2000 / 0.0775 / 0.0550 | 0 |" in text
    )


def test_report_command_reads_the_records(tmp_path, capsys):
    import json

    (tmp_path / "grpo_math_seed0.json").write_text(json.dumps(_record("grpo_math", 0, 0.01)))
    out = tmp_path / "report.md"
    assert main(["report", "--out", str(tmp_path), "--report", str(out)]) == 0
    assert "### At the end" in out.read_text()


def test_long_runs_show_a_subset_of_their_checkpoints():
    from experiments.sparks_dynamics import _shown

    assert _shown([0, 25, 50]) == [0, 25, 50]
    assert _shown(list(range(0, 301, 25))) == [0, 25, 50, 100, 150, 200, 300]
    assert _shown(list(range(0, 176, 25))) == [0, 25, 50, 100, 150, 175]
    assert _shown([*range(0, 201, 25), 210]) == [0, 25, 50, 100, 150, 200, 210]


def _args(out, **changed):
    base = {"steps": None, "prompts": 128, "n": 8, "final_n": 16, "set": []}
    return argparse.Namespace(out=str(out), **{**base, **changed})


@pytest.mark.parametrize(
    "changed, named",
    [
        ({"set": ["algorithm.loss_options.beta=4.0"]}, "overrides"),
        ({"steps": 50}, "steps"),
        ({"prompts": 64}, "prompts"),
        ({"n": 4}, "n"),
        ({"final_n": 8}, "final_n"),
    ],
)
def test_a_finished_run_made_with_other_settings_is_refused(tmp_path, changed, named):
    record = _record("grpo_math", 0, 0.01)
    record["settings"] = settings(_args(tmp_path))
    path = tmp_path / "grpo_math_seed0.json"
    path.write_text(json.dumps(record))
    assert run_one("grpo_math", 0, _args(tmp_path), world=None) == path  # the same: reused
    with pytest.raises(ResultError, match=rf"{path} was made with other settings \({named}: "):
        run_one("grpo_math", 0, _args(tmp_path, **changed), world=None)
    del record["settings"]  # made before settings were recorded: refused, not guessed
    path.write_text(json.dumps(record))
    with pytest.raises(ResultError, match="records no settings"):
        run_one("grpo_math", 0, _args(tmp_path), world=None)


def test_a_torn_run_json_is_one_line_naming_it(tmp_path, capsys):
    torn = tmp_path / "grpo_math_seed0.json"
    torn.write_text(json.dumps(_record("grpo_math", 0, 0.01))[:50])
    assert main(["report", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{torn} is not a whole JSON file" in err
    with pytest.raises(ResultError, match="is not a whole JSON file"):
        run_one("grpo_math", 0, _args(tmp_path), world=None)


def test_the_report_takes_runs_measured_with_fewer_than_16_final_samples():
    record = _record("grpo_math", 0, 0.01)
    for split in record["final"].values():
        del split["pass@16"]  # --final-n 8
    text = report([record])
    assert "| 0.500 | 0.700 | - |" in text  # test pass@1, @4, no @16
    assert "| 0.500 | - | 0.500 |" in text  # per seed: hard pass@1, pass@16, test pass@1


def test_training_starts_over_after_an_early_kill_and_a_failure_is_one_line(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, stdout, **kwargs):
        calls.append(cmd)
        stdout.write("Traceback (most recent call last):\n")
        stdout.write("divrl train: --resume: the config differs from config.yaml\n")
        return subprocess.CompletedProcess(cmd, 2 if "--resume" in cmd else 0)

    monkeypatch.setattr(sparks_dynamics.subprocess, "run", fake_run)
    world = argparse.Namespace(model_dir=tmp_path / "model", splits={"train": tmp_path / "t"})
    run_dir = tmp_path / "runs" / "grpo_math_seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}\n")  # killed before its first checkpoint
    sparks_dynamics.train("grpo_math", 0, _args(tmp_path), world, run_dir)
    assert calls[-1][-1] == "--overwrite"
    (run_dir / "checkpoints" / "step_000025").mkdir(parents=True)
    log = tmp_path / "grpo_math_seed0.train.log"
    with pytest.raises(ResultError) as err:
        sparks_dynamics.train("grpo_math", 0, _args(tmp_path, set=["a.b=1"]), world, run_dir)
    assert calls[-1][-2:] == ["a.b=1", "--resume"]
    assert str(err.value) == (
        "training grpo_math seed 0 failed (exit 2): divrl train: --resume: the config "
        f"differs from config.yaml (log: {log})"
    )
