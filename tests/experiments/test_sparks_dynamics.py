"""experiments.sparks_dynamics: the report's tables from per-run records (synthetic)."""

import argparse

from experiments.sparks_dynamics import main, report


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


def test_a_finished_run_with_other_overrides_is_refused(tmp_path):
    import json

    import pytest

    from experiments.sparks_dynamics import run_one

    record = _record("grpo_math", 0, 0.01)
    record["overrides"] = ["algorithm.loss_options.beta=4.0"]
    (tmp_path / "grpo_math_seed0.json").write_text(json.dumps(record))
    args = argparse.Namespace(out=str(tmp_path), set=["algorithm.loss_options.beta=4.0"])
    assert run_one("grpo_math", 0, args, world=None) == tmp_path / "grpo_math_seed0.json"
    with pytest.raises(SystemExit, match="use another --out"):
        run_one("grpo_math", 0, argparse.Namespace(out=str(tmp_path), set=[]), world=None)
