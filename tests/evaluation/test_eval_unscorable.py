"""An unscorable sample in an evaluation: counted in its own column, not hidden in Pass@k."""

import logging

import pytest

from divrl.commands.eval import print_summary_table
from divrl.evaluation.runner import EvalConfig, score_samples
from divrl.evaluation.summary import summarise


def _record(i, texts):
    return {
        "id": str(i),
        "data_source": "math",
        "prompt": "p",
        "ground_truth": "2",
        "extra_info": {},
        "samples": [{"text": t, "n_tokens": 2, "nll": 1.0, "truncated": False} for t in texts],
        "greedy": None,
    }


def test_a_timed_out_sample_is_its_own_column(caplog, capsys):
    # math-verify never finishes 9^9^9^9: the pool kills it at the 0.2 s limit
    endless = "\\boxed{9^{9^{9^{9}}}}"
    records = [
        _record(0, ["\\boxed{2}", endless, "\\boxed{3}", "\\boxed{2}"]),
        _record(1, ["\\boxed{2}", "\\boxed{5}", "\\boxed{3}", "\\boxed{4}"]),
    ]
    cfg = EvalConfig(n=4, n_boot=20, score_timeout=0.2)
    with caplog.at_level(logging.WARNING, logger="divrl.evaluation.runner"):
        results = score_samples(records, cfg, progress=False)
    assert results[0]["reasons"][1] == "timeout"
    assert "1 of 8 responses could not be scored (timeout=1)" in caplog.text
    summary = summarise(results, cfg)
    assert summary["unscorable"] == 1 and summary["unscorable_share"] == 1 / 8
    # Pass@1 counts it as not correct (2/4 and 1/4); over the scorable ones: 2/3 and 1/4
    assert summary["mean_accuracy"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert summary["mean_accuracy_scorable"] == pytest.approx((2 / 3 + 1 / 4) / 2)
    print_summary_table({"test": summary})
    lines = capsys.readouterr().out.replace("┃", "│").splitlines()
    header = next(line for line in lines if "P@1" in line).split("│")
    row = next(line for line in lines if " test " in line).split("│")
    column = [cell.strip() for cell in header].index("unscorable")
    assert row[column].strip() == "1"
