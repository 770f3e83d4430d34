"""experiments.reproduce --check: a summary's fingerprint (its run's first steps' metrics)
and the bit-for-bit comparison of a rerun against it (experiments/reproduce_check.py)."""

from __future__ import annotations

import json
import math

from experiments import reproduce
from experiments import reproduce_check as rc


def write_metrics(path, n=5):
    rows = [
        {
            "step": i,
            "actor/entropy": 0.48038567052899817 / i,
            "reward/pass@1": 0.07421875 * i,
            "dph/loss": -0.1 * i,
            "time/step": 3.0 + i,  # wall-clock: never part of the fingerprint
            "time/rollout": 1.0,
        }
        for i in range(1, n + 1)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_fingerprint_is_every_metric_of_the_first_steps_but_the_clock(tmp_path):
    fp = rc.fingerprint(write_metrics(tmp_path / "metrics.jsonl"), steps=3)
    assert fp["steps"] == 3 and [r["step"] for r in fp["metrics"]] == [1, 2, 3]
    assert fp["metrics"][0] == {
        "step": 1,
        "actor/entropy": 0.48038567052899817,
        "reward/pass@1": 0.07421875,
        "dph/loss": -0.1,
    }


def test_a_difference_in_the_last_bit_is_found_and_named(tmp_path):
    path = write_metrics(tmp_path / "metrics.jsonl")
    want = rc.fingerprint(path, steps=3)["metrics"]
    assert rc.compare(want, rc.metric_rows(path, 3)) == []
    got = rc.metric_rows(path, 3)
    got[1]["actor/entropy"] = math.nextafter(got[1]["actor/entropy"], 1.0)  # one ulp
    del got[2]["dph/loss"]
    problems = rc.compare(want, got)
    assert len(problems) == 2
    assert problems[0].startswith(
        "step 2 actor/entropy: 0.24019283526449908 in the summary, 0.2401928352644991 now"
    )
    assert "step 3 dph/loss" in problems[1] and "not logged now" in problems[1]
    assert rc.compare(want, got[:1])[-1] == "step 3: not logged by the rerun"


def test_a_summary_without_a_fingerprint_is_checked_on_its_per_step_curve():
    summary = {
        "training": {
            "step": [1, 2, 3, 5, 8],  # downsampled after step 3
            "entropy": [0.5, 0.4, 0.3, 0.2, 0.1],
            "pass1": [0.1, 0.2, None, 0.4, 0.5],
        }
    }
    rows = rc.expected_rows(summary)
    assert rows == [
        {"step": 1, "actor/entropy": 0.5, "reward/pass@1": 0.1},
        {"step": 2, "actor/entropy": 0.4, "reward/pass@1": 0.2},
        {"step": 3, "actor/entropy": 0.3},
    ]
    assert rc.expected_rows({**summary, "fingerprint": {"steps": 1, "metrics": [{"step": 1}]}}) == [
        {"step": 1}
    ]


def test_check_fails_loudly_on_a_mismatch_and_passes_on_the_same_digits(tmp_path, capsys):
    path = write_metrics(tmp_path / "metrics.jsonl")
    summaries = [
        {"method": m, "seed": 0, "fingerprint": rc.fingerprint(path)} for m in ("grpo", "dph_js")
    ]
    said = []
    same = lambda method, seed, n: rc.metric_rows(path, n)  # noqa: E731
    assert rc.check_summaries(summaries, 3, same, said.append) == 0
    assert said[0] == "grpo seed 0: steps 1-3 equal bit for bit (9 values)"

    def drifted(method, seed, n):
        rows = rc.metric_rows(path, n)
        if method == "dph_js":
            rows[0]["actor/entropy"] += 6e-9
        return rows

    said.clear()
    assert rc.check_summaries(summaries, 3, drifted, said.append) == 1
    assert said[1].startswith("MISMATCH dph_js seed 0: 1 of 9 values differ in steps 1-3")
    assert "did NOT give the summaries' digits" in capsys.readouterr().err


def test_check_arguments():
    args = reproduce.parse_args(["--check", "--results", "x"])
    assert args.check and args.check_steps == rc.FINGERPRINT_STEPS == 3
    assert not reproduce.parse_args([]).check


def test_the_training_curve_keeps_the_series_a_reading_cites(tmp_path):
    from divrl.pipeline import training_curve

    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "dph/eta": 0.2, "dph/effective_eta": 0.0156, "dph/log_u_mean": -0.001},
        {"step": 2, "dph/eta": 0.221, "dph/eta_at_bound": 0.0, "lp_reg/mean_z": 0.8},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = training_curve(path)
    assert curve["eta"] == [0.2, 0.221] and curve["effective_eta"] == [0.0156, None]
    assert curve["log_u_mean"] == [-0.001, None] and curve["lp_reg_mean_z"] == [None, 0.8]
    assert curve["eta_at_bound"] == [None, 0.0]
    # a summary without a fingerprint is re-checked on them too
    assert rc.expected_rows({"training": curve})[1] == {
        "step": 2,
        "dph/eta": 0.221,
        "dph/eta_at_bound": 0.0,
        "lp_reg/mean_z": 0.8,
    }


def test_nothing_to_check_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "summaries").mkdir()
    assert reproduce.main(["--check", "--results", str(tmp_path), "--methods", "grpo"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no trained run of seed 0 among grpo" in err
